"""Discover a node's topology from sysfs: NUMA nodes, cores, SMT siblings, L3 groups, GPUs.

    python affinity/discover.py                       # this machine
    python affinity/discover.py --png node.png        # also draw it (and lstopo.png if lstopo exists)
    python affinity/discover.py --sysfs tests/fixtures/sysfs/dgx-a100

Only these files are read (so a fake tree for tests needs only these):
  devices/system/node/node*/cpulist
  devices/system/cpu/online                                   (optional)
  devices/system/cpu/cpu*/topology/{thread_siblings_list,core_id,physical_package_id}
  devices/system/cpu/cpu*/cache/index3/{shared_cpu_list,level} (optional)
  bus/pci/devices/*/{vendor,class,numa_node,local_cpulist}
and, only to find which GPU a torch device is when torch does not say (visible_gpu_pci):
  class/kfd/kfd/topology/nodes/*/properties                   (AMD: unique_id, domain, location_id)
  /proc/driver/nvidia/gpus/*/information                      (NVIDIA: "GPU UUID:")
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


from wellfno.cli import UserError, run_main

# PCI vendors that make compute GPUs: NVIDIA, AMD/ATI. Intel (0x8086) is left out on
# purpose: on HPC nodes its display functions are integrated graphics, never a rank's GPU.
GPU_VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD"}
# PCI base class/subclass (upper 16 bits of the 24-bit class): VGA, 3D controller,
# display controller (MI200/MI300 report this), processing accelerator.
GPU_CLASSES = {0x0300, 0x0302, 0x0380, 0x1200}


def parse_cpulist(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0,1,2,3,8,10,11}; the kernel's cpulist syntax. Empty -> empty set."""
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return cpus
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"bad CPU list item {part!r} in {text!r} (expected e.g. 0-3,8)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"bad CPU range {part!r} in {text!r} (end before start)")
        cpus.update(range(lo, hi + 1))
    return cpus


def format_cpulist(cpus) -> str:
    """{0,1,2,3,8} -> '0-3,8' (the inverse of parse_cpulist)."""
    out: list[str] = []
    cpus = sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


@dataclass(frozen=True)
class Gpu:
    index: int          # position in PCI bus order (what nvidia-smi / rocm-smi number)
    pci: str            # sysfs address, e.g. 0000:07:00.0
    vendor: str         # NVIDIA or AMD
    pci_class: int      # 24-bit class code, e.g. 0x030200
    numa: int           # NUMA node the device hangs off
    local_cpus: frozenset[int]


@dataclass
class Topology:
    numa_cpus: dict[int, set[int]]                 # NUMA node -> its (online) CPUs
    core_of: dict[int, int]                        # CPU -> lowest CPU of its physical core
    package_of: dict[int, int]                     # CPU -> socket (physical_package_id)
    core_id_of: dict[int, int]                     # CPU -> core_id as the kernel reports it
    l3_of: dict[int, int]                          # CPU -> lowest CPU sharing its L3
    gpus: list[Gpu]
    allowed: set[int]                              # CPUs this process (or the given list) may use
    root: str = "/sys"
    warnings: list[str] = field(default_factory=list)

    @property
    def cpus(self) -> set[int]:
        return set(self.core_of)

    def numa_of(self, cpu: int) -> int:
        for node, cpus in self.numa_cpus.items():
            if cpu in cpus:
                return node
        raise KeyError(cpu)

    def numa_nodes_of(self, cpus) -> list[int]:
        return sorted({self.numa_of(c) for c in cpus if c in self.core_of})

    def siblings(self, cpu: int) -> set[int]:
        core = self.core_of[cpu]
        return {c for c, k in self.core_of.items() if k == core}

    def smt(self) -> int:
        """Hardware threads per core (max over cores)."""
        counts: dict[int, int] = {}
        for core in self.core_of.values():
            counts[core] = counts.get(core, 0) + 1
        return max(counts.values(), default=1)

    def gpus_on(self, numa: int) -> list[Gpu]:
        return [g for g in self.gpus if g.numa == numa]


def _read(path: Path) -> str:
    with open(path) as f:
        return f.read().strip()


def _read_int(path: Path, default: int | None = None) -> int | None:
    try:
        return int(_read(path), 0)
    except (FileNotFoundError, ValueError):
        return default


def _cpu_number(path: Path) -> int:
    return int(path.name[3:])


def discover(sysfs: str | os.PathLike = "/sys", allowed_cpus: set[int] | None = None) -> Topology:
    """Read the topology under `sysfs` (the real /sys or a fake tree).

    `allowed_cpus` defaults to this process's affinity (os.sched_getaffinity); pass the
    cpulist of another allocation to plan for it from a login node.
    """
    root = Path(sysfs)
    cpu_dir = root / "devices/system/cpu"
    if not cpu_dir.is_dir():
        raise UserError(f"{cpu_dir} not found: --sysfs must point at a sysfs root such as /sys "
                        "(or a fixture under tests/fixtures/sysfs/<node>)")
    warnings: list[str] = []

    core_of: dict[int, int] = {}
    package_of: dict[int, int] = {}
    core_id_of: dict[int, int] = {}
    l3_of: dict[int, int] = {}
    online = None
    if (cpu_dir / "online").exists():
        online = parse_cpulist(_read(cpu_dir / "online"))
    cpu_paths = sorted((p for p in cpu_dir.glob("cpu[0-9]*") if p.name[3:].isdigit()), key=_cpu_number)
    for p in cpu_paths:
        cpu = _cpu_number(p)
        topo = p / "topology"
        # An offline CPU (e.g. SMT switched off at run time) keeps its cpuN folder but has no
        # topology: it is no CPU anybody can run on.
        if not (topo / "thread_siblings_list").exists() or (online is not None and cpu not in online):
            continue
        siblings = parse_cpulist(_read(topo / "thread_siblings_list"))
        if online is not None:
            siblings &= online
        core_of[cpu] = min(siblings | {cpu})
        package_of[cpu] = _read_int(topo / "physical_package_id", 0)
        core_id_of[cpu] = _read_int(topo / "core_id", cpu)
        l3_list = p / "cache/index3/shared_cpu_list"
        level = _read_int(p / "cache/index3/level", 3)
        if l3_list.exists() and level == 3:
            l3_of[cpu] = min(parse_cpulist(_read(l3_list)) | {cpu})
    if not core_of:
        raise UserError(f"no CPUs with topology under {cpu_dir}: is --sysfs a sysfs root?")
    for cpu in core_of:
        if cpu not in l3_of:
            # No L3 information (some VMs, ARM parts): the socket is the best group we know.
            l3_of[cpu] = min(c for c in core_of if package_of[c] == package_of[cpu])

    numa_cpus: dict[int, set[int]] = {}
    node_paths = sorted((p for p in (root / "devices/system/node").glob("node[0-9]*")),
                        key=lambda p: int(p.name[4:]))
    for p in node_paths:
        cpus = parse_cpulist(_read(p / "cpulist")) & set(core_of)
        if cpus:  # memory-only nodes (CXL, HBM in flat mode) host no rank
            numa_cpus[int(p.name[4:])] = cpus
    if not numa_cpus:
        # Kernel built without NUMA: one node holds everything.
        numa_cpus = {0: set(core_of)}

    gpus = _discover_gpus(root, numa_cpus, warnings)

    if allowed_cpus is None:
        allowed_cpus = set(os.sched_getaffinity(0))
    unknown = set(allowed_cpus) - set(core_of)
    if unknown:
        raise UserError(f"allowed CPUs {format_cpulist(unknown)} do not exist (or are offline) "
                        f"under {root}; this node has CPUs {format_cpulist(core_of)}")
    return Topology(numa_cpus=numa_cpus, core_of=core_of, package_of=package_of,
                    core_id_of=core_id_of, l3_of=l3_of, gpus=gpus,
                    allowed=set(allowed_cpus), root=str(root), warnings=warnings)


def pci_address(domain: int, bus: int, device: int, function: int = 0) -> str:
    """sysfs spelling of a PCI address: (0, 0x07, 0, 0) -> '0000:07:00.0'."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def visible_gpu_pci(torch_module=None, sysfs: str | os.PathLike = "/sys",
                    proc: str | os.PathLike = "/proc") -> list[str | None]:
    """PCI address of every GPU this process sees, in torch device-index order (None: unknown).

    The visible-device variables (CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES)
    and a Slurm cgroup are already applied by the runtime, so entry i is torch.device('cuda', i)
    whatever the restriction; the address says which of the node's GPUs (sysfs) it is."""
    if torch_module is None:
        import torch as torch_module
    if not torch_module.cuda.is_available():
        return []
    return [device_pci(torch_module.cuda.get_device_properties(i), sysfs, proc)
            for i in range(torch_module.cuda.device_count())]


def device_pci(props, sysfs: str | os.PathLike = "/sys", proc: str | os.PathLike = "/proc") -> str | None:
    """PCI address of one torch device from its properties, by the first source that knows:

    1. pci_domain_id / pci_bus_id / pci_device_id: recent torch builds (what torch.numa reads).
    2. uuid (older builds have it, not the PCI ids), matched against the driver's own table:
       NVIDIA: /proc/driver/nvidia/gpus/<pci>/information lists "GPU UUID: GPU-<uuid>";
       AMD: the KFD topology node whose unique_id the uuid encodes (HIP fills the uuid with the
       ASCII hex digits of that unique_id, as rocminfo's "Uuid: GPU-<hex>" shows) gives the PCI
       address as its domain and location_id (bus << 8 | device << 3 | function).
    No subprocess (nvidia-smi, rocm-smi): those list every GPU of the node whatever the visible
    devices, and the tables above are what they read anyway."""
    ids = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if all(isinstance(v, int) for v in ids):
        return pci_address(*ids)
    uuid = str(getattr(props, "uuid", "") or "").strip().lower().removeprefix("gpu-")
    if not uuid:
        return None
    return _pci_from_nvidia_uuid(uuid, Path(proc)) or _pci_from_kfd_uuid(uuid, Path(sysfs))


def _pci_from_nvidia_uuid(uuid: str, proc: Path) -> str | None:
    gpus = proc / "driver/nvidia/gpus"
    if not gpus.is_dir():
        return None
    for dev in sorted(gpus.iterdir()):
        try:
            text = (dev / "information").read_text()
        except OSError:
            continue
        m = re.search(r"GPU UUID:\s*(?:GPU-)?([0-9a-fA-F-]+)", text)
        if m and m.group(1).lower() == uuid:
            return dev.name.lower()
    return None


def _uuid_as_unique_id(uuid: str) -> int | None:
    """HIP's uuid bytes are the ASCII hex digits of the KFD unique_id; torch prints the bytes in
    hex: '61616262-...' -> b'aabb...' -> 0xaabb.... A plain hex uuid is accepted as well."""
    digits = uuid.replace("-", "")
    try:
        text = bytes.fromhex(digits).decode("ascii")
        return int(text, 16)
    except (ValueError, UnicodeDecodeError):
        pass
    try:
        return int(digits, 16)
    except ValueError:
        return None


def _pci_from_kfd_uuid(uuid: str, sysfs: Path) -> str | None:
    unique_id = _uuid_as_unique_id(uuid)
    nodes = sysfs / "class/kfd/kfd/topology/nodes"
    if unique_id is None or not nodes.is_dir():
        return None
    for node in nodes.iterdir():
        try:
            fields = dict(line.split()[:2] for line in (node / "properties").read_text().splitlines()
                          if len(line.split()) >= 2)
            if int(fields.get("unique_id", "-1")) != unique_id:
                continue
            location = int(fields["location_id"])
            return pci_address(int(fields.get("domain", "0")), location >> 8, (location >> 3) & 0x1F, location & 0x7)
        except (OSError, KeyError, ValueError):
            continue
    return None


def _pci_sort_key(address: str):
    # 0000:07:00.0 -> (0, 7, 0, 0): numeric PCI bus order, the order nvidia-smi and rocm-smi use.
    dom, bus, devfn = address.split(":")
    dev, fn = devfn.split(".")
    return int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)


def _discover_gpus(root: Path, numa_cpus: dict[int, set[int]], warnings: list[str]) -> list[Gpu]:
    pci_dir = root / "bus/pci/devices"
    if not pci_dir.is_dir():
        return []
    found = []
    for dev in sorted(pci_dir.iterdir(), key=lambda p: _pci_sort_key(p.name)):
        vendor = _read_int(dev / "vendor")
        pci_class = _read_int(dev / "class")
        if vendor not in GPU_VENDORS or pci_class is None or (pci_class >> 8) not in GPU_CLASSES:
            continue
        local = parse_cpulist(_read(dev / "local_cpulist")) if (dev / "local_cpulist").exists() else set()
        numa = _read_int(dev / "numa_node", -1)
        if numa is None or numa < 0:
            # -1 = firmware gave no proximity. torch.numa uses node 0 then; we first try the
            # node whose CPUs are the device's local CPUs, which is right on more machines.
            owners = [n for n, cpus in numa_cpus.items() if local and cpus <= local]
            numa = owners[0] if len(owners) == 1 else min(numa_cpus)
            if len(numa_cpus) > 1:
                warnings.append(f"GPU {dev.name} reports numa_node -1; assuming NUMA node {numa}")
        found.append((dev.name, GPU_VENDORS[vendor], pci_class, numa, frozenset(local)))
    return [Gpu(i, *fields) for i, fields in enumerate(found)]


def describe(topo: Topology) -> str:
    """Readable summary: one line per NUMA node, one per GPU, the allowed CPUs."""
    lines = []
    sockets = sorted(set(topo.package_of.values()))
    cores = set(topo.core_of.values())
    lines.append(f"sysfs {topo.root}: {len(sockets)} socket(s), {len(topo.numa_cpus)} NUMA node(s), "
                 f"{len(cores)} cores, {len(topo.core_of)} CPUs (SMT{topo.smt()}), {len(topo.gpus)} GPU(s)")
    lines.append(f"allowed CPUs: {format_cpulist(topo.allowed)} ({len(topo.allowed)} of {len(topo.core_of)})")
    lines.append("")
    lines.append(f"{'NUMA':>4}  {'socket':>6}  {'cores':>5}  {'L3 groups':>9}  {'allowed':>7}  {'GPUs':<8}  CPUs")
    for node, cpus in sorted(topo.numa_cpus.items()):
        node_sockets = format_cpulist({topo.package_of[c] for c in cpus})
        node_cores = {topo.core_of[c] for c in cpus}
        l3 = {topo.l3_of[c] for c in cpus}
        gpus = ",".join(str(g.index) for g in topo.gpus_on(node)) or "-"
        lines.append(f"{node:>4}  {node_sockets:>6}  {len(node_cores):>5}  {len(l3):>9}  "
                     f"{len(cpus & topo.allowed):>7}  {gpus:<8}  {format_cpulist(cpus)}")
    if topo.gpus:
        lines.append("")
        lines.append(f"{'GPU':>3}  {'PCI':<12}  {'vendor':<6}  {'class':<8}  {'NUMA':>4}  local CPUs")
        for g in topo.gpus:
            lines.append(f"{g.index:>3}  {g.pci:<12}  {g.vendor:<6}  {g.pci_class:#08x}  {g.numa:>4}  "
                         f"{format_cpulist(g.local_cpus) or '-'}")
    l3_sizes = sorted({len([c for c in topo.core_of if topo.l3_of[c] == k]) for k in set(topo.l3_of.values())})
    lines.append("")
    lines.append(f"L3 groups: {len(set(topo.l3_of.values()))} (CPUs per group: {', '.join(map(str, l3_sizes))})")
    lines.extend(f"warning: {w}" for w in topo.warnings)
    return "\n".join(lines)


def draw(topo: Topology, path: str | os.PathLike) -> Path:
    """Draw NUMA nodes as boxes of cores (coloured by L3 group, allowed ones filled) and GPUs under
    their NUMA node. Pure matplotlib, so it works on a fixture tree too."""
    from matplotlib.patches import Rectangle

    from wellfno.plots import pyplot, save_png

    plt = pyplot()  # the Agg backend: no display on nodes

    nodes = sorted(topo.numa_cpus)
    per_row = 16
    cell = 1.0
    widths, heights = [], []
    layout = {}
    for node in nodes:
        cores = sorted({topo.core_of[c] for c in topo.numa_cpus[node]})
        rows = (len(cores) + per_row - 1) // per_row
        layout[node] = cores
        widths.append(min(len(cores), per_row) * cell + 1)
        heights.append(rows * cell + 2.5)
    cols = min(len(nodes), 4)
    box_w, box_h = max(widths), max(heights)
    grid_rows = (len(nodes) + cols - 1) // cols
    fig, ax = plt.subplots(figsize=(max(6, cols * box_w * 0.45), max(3, grid_rows * box_h * 0.45)))
    cmap = plt.get_cmap("tab20")
    l3_ids = sorted(set(topo.l3_of.values()))
    for k, node in enumerate(nodes):
        x0 = (k % cols) * (box_w + 0.5)
        y0 = -(k // cols) * (box_h + 0.5)
        ax.add_patch(Rectangle((x0, y0 - box_h), box_w, box_h, fill=False, lw=1.5))
        ax.text(x0 + 0.2, y0 - 0.5, f"NUMA {node}", fontsize=9, weight="bold")
        for i, core in enumerate(layout[node]):
            cx = x0 + 0.5 + (i % per_row) * cell
            cy = y0 - 1.5 - (i // per_row) * cell
            threads = sorted(topo.siblings(core))
            allowed = any(t in topo.allowed for t in threads)
            colour = cmap(l3_ids.index(topo.l3_of[core]) % 20)
            ax.add_patch(Rectangle((cx, cy - 0.8), 0.85, 0.8, facecolor=colour if allowed else "white",
                                   edgecolor=colour, lw=1.2))
            ax.text(cx + 0.42, cy - 0.4, "\n".join(map(str, threads)), fontsize=4, ha="center", va="center")
        gpus = topo.gpus_on(node)
        if gpus:
            label = "  ".join(f"GPU{g.index} {g.pci[5:]}" for g in gpus)
            ax.text(x0 + 0.2, y0 - box_h + 0.3, label, fontsize=7, color="darkgreen", weight="bold")
    ax.set_xlim(-0.5, cols * (box_w + 0.5))
    ax.set_ylim(-grid_rows * (box_h + 0.5), 0.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"{topo.root}: cores by L3 group (filled = allowed; numbers = SMT threads)", fontsize=9)
    return save_png(fig, path, dpi=150, bbox_inches="tight")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sysfs", default="/sys", help="sysfs root (default /sys)")
    ap.add_argument("--allowed-cpus", default=None,
                    help="CPU list like 0-3,8 (default: this process's affinity)")
    ap.add_argument("--png", default=None, help="also draw the node into this PNG file")
    args = ap.parse_args(argv)
    allowed = parse_allowed_arg(args.allowed_cpus)
    topo = discover(args.sysfs, allowed)
    print(describe(topo))
    if args.png:
        print(f"drew {draw(topo, args.png)}")
        if shutil.which("lstopo") and Path(args.sysfs).resolve() == Path("/sys"):
            # hwloc-nox builds of lstopo have no PNG (cairo) output; SVG is always built in.
            for fmt in ("png", "svg"):
                out = Path(args.png).with_name(f"{Path(args.png).stem}-lstopo.{fmt}")
                done = subprocess.run(["lstopo", "--force", "--of", fmt, str(out)], capture_output=True)
                if done.returncode == 0:
                    print(f"drew {out} with lstopo")
                    break
            else:
                print("lstopo is installed but could draw neither PNG nor SVG", file=sys.stderr)
    return 0


def parse_allowed_arg(text: str | None) -> set[int] | None:
    """--allowed-cpus value -> set, or None for 'this process's affinity'; bad input is a UserError."""
    if text is None:
        return None
    try:
        cpus = parse_cpulist(text)
    except ValueError as err:
        raise UserError(f"--allowed-cpus: {err}") from None
    if not cpus:
        raise UserError("--allowed-cpus is empty; give a CPU list like 0-15,64-79")
    return cpus


if __name__ == "__main__":
    run_main(main)
