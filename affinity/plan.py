"""Plan which CPUs each GPU / local rank gets.

    python affinity/plan.py                                   # this machine, mode exclusive, table
    python affinity/plan.py --sysfs ROOT --allowed-cpus LIST --mode MODE --format table|json|slurm|numactl
    srun --cpu-bind=$(python affinity/plan.py --format slurm) ...

Modes (the same names and rules as `torchrun --numa-binding`, torch/numa/binding.py):
  exclusive     split the allowed physical cores of the GPU's NUMA node evenly among the GPUs
                on that node, in GPU order (lower GPUs get the remainder), with their allowed
                SMT siblings. No two ranks share a core.
  node          all allowed CPUs of the GPU's NUMA node (ranks on the same node share them).
  core-complex  one L3 group (core complex) of the GPU's NUMA node per GPU: groups with more
                allowed CPUs first, then by lowest CPU; GPU k on a node gets group k mod #groups.
Without GPUs (or with --no-gpus) ranks are spread over the NUMA nodes in blocks and get the
same per-node rule, so `exclusive` gives disjoint core sets per local rank.

Which CPUs a rank gets (plan_this_rank), for every way Slurm hands out GPUs:
- The rank's GPU is a physical GPU of the node: the PCI address of the torch device it drives
  (affinity.discover.visible_gpu_pci), looked up in the node's GPU list from sysfs.
- The ranks whose GPUs share a NUMA node split that node's allowed cores (no overlap):
    all GPUs visible to every rank (--gpus-per-node, torchrun): the GPUs the node's local ranks drive;
    one GPU per rank (--gpus-per-task=1): a rank cannot see the others' GPUs, so every GPU of its
    NUMA node counts as taken (the others may be driven by this job's other ranks);
    srun bound each task to its own CPUs already (srun's default --cpu-bind; SLURM_CPU_BIND_TYPE is
    not 'none'), e.g. with --gpu-bind=closest: the rank keeps its CPUs on its GPU's NUMA node.
- The job's CPUs are not on the GPU's NUMA node: no error (that would end the job, and Slurm's
  afterok would cancel the next ones); the rank keeps CPUs of its own (a CPU-only share of the
  allowed CPUs), prints a one-line warning, and its report says match=NO.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Mapping


from affinity.discover import Gpu, Topology, discover, format_cpulist, parse_allowed_arg, parse_cpulist
from wellfno.cli import UserError, run_main
from wellfno.launch import LaunchEnv

MODES = ("exclusive", "node", "core-complex")
FORMATS = ("table", "json", "slurm", "numactl")


@dataclass(frozen=True)
class Assignment:
    rank: int              # local rank
    gpu: Gpu | None        # its GPU, None on a CPU-only plan
    numa: int              # the NUMA node it is placed on
    cpus: frozenset[int]   # logical CPUs (SMT threads) it may run on


def physical_cores(cpus, core_of: dict[int, int] | None) -> list[set[int]]:
    """`cpus` grouped by physical core (with the SMT siblings among them), in core order.
    A core is named by its lowest logical CPU, as torch does; no SMT map: every CPU is a core."""
    core_of = core_of or {}
    cores: dict[int, set[int]] = {}
    for cpu in cpus:
        cores.setdefault(core_of.get(cpu, cpu), set()).add(cpu)
    return [cores[k] for k in sorted(cores)]


def core_share(cpus, core_of: dict[int, int] | None, position: int, count: int) -> set[int]:
    """The `position`-th of `count` contiguous blocks of the physical cores of `cpus`, each core
    with its siblings; lower positions get the remainder (torch's rule). This is the one place
    where cores are split: among the ranks of a NUMA node (plans) and the workers of a rank.
    Raises ValueError when there are fewer cores than `count`."""
    cores = physical_cores(cpus, core_of)
    per, extra = divmod(len(cores), count)
    if per < 1:
        raise ValueError(f"{len(cores)} physical cores for {count} shares")
    start = position * per + min(position, extra)
    end = start + per + (1 if position < extra else 0)
    return set().union(*cores[start:end])


def _slot_cpus(topo: Topology, numa: int, position: int, peers: int, mode: str) -> set[int]:
    """CPUs for the `position`-th of `peers` ranks placed on NUMA node `numa`."""
    allowed = topo.numa_cpus[numa] & topo.allowed
    if not allowed:
        raise UserError(f"no allowed CPU on NUMA node {numa}; allow some of its CPUs "
                        f"({format_cpulist(topo.numa_cpus[numa])}) or leave its GPUs out with --gpus")
    if mode == "node":
        return allowed
    if mode == "exclusive":
        try:
            return core_share(allowed, topo.core_of, position, peers)
        except ValueError:
            raise UserError(f"NUMA node {numa} has {len(physical_cores(allowed, topo.core_of))} allowed physical "
                            f"cores for {peers} ranks; use --mode node (shared cores) or allow more CPUs") from None
    if mode == "core-complex":
        groups: dict[int, set[int]] = {}
        for cpu in allowed:
            groups.setdefault(topo.l3_of[cpu], set()).add(cpu)
        ordered = [cpus for _, cpus in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
        return ordered[position % len(ordered)]
    raise UserError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")


def gpu_cpus(topo: Topology, mode: str, gpu: Gpu, sharing: list[Gpu]) -> set[int]:
    """CPUs of the rank that drives `gpu`, when the ranks driving `sharing` (this GPU among them)
    split the allowed CPUs of their NUMA nodes: GPUs on one node get disjoint cores in GPU order."""
    peers = sorted({g.index: g for g in sharing if g.numa == gpu.numa}.values(), key=lambda g: g.index)
    if gpu not in peers:
        peers = sorted(peers + [gpu], key=lambda g: g.index)
    return _slot_cpus(topo, gpu.numa, peers.index(gpu), len(peers), mode)


def device_index_for(local_rank: int, local_world_size: int | None, visible: int,
                     step_gpus: int | None = None, launcher: str = "srun") -> int:
    """torch device index of the GPU a local rank drives among the `visible` ones: wellfno.device's
    rule (one visible: it; one per rank: the local rank's; --gpu-bind=closest: local rank mod k)."""
    from wellfno.device import gpu_index_for  # imports torch: only where a GPU is involved

    return gpu_index_for(local_rank, local_world_size, visible, step_gpus, launcher)


def make_plan(topo: Topology, mode: str = "exclusive", nranks: int | None = None,
              gpus: list[int] | None = None, use_gpus: bool = True) -> list[Assignment]:
    """One Assignment per local rank. With GPUs, local rank r drives the r-th selected GPU
    (`gpus`: indices in PCI order, default all), like torchrun's local rank -> cuda:r."""
    if mode not in MODES:
        raise UserError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    selected = [g for g in topo.gpus if gpus is None or g.index in gpus] if use_gpus else []
    if gpus is not None and use_gpus:
        missing = sorted(set(gpus) - {g.index for g in topo.gpus})
        if missing:
            raise UserError(f"--gpus {missing} not found; this node has GPUs 0-{len(topo.gpus) - 1}"
                            if topo.gpus else f"--gpus {missing} given but no GPU found under {topo.root}")
    if selected:
        nranks = len(selected) if nranks is None else nranks
        if not 1 <= nranks <= len(selected):
            raise UserError(f"--nranks {nranks} with {len(selected)} GPUs; one rank per GPU "
                            "(use --no-gpus to plan CPU-only ranks)")
        plan = []
        for rank, gpu in enumerate(selected[:nranks]):
            # Peers are all selected GPUs on this NUMA node, not only the first nranks: a rank's
            # CPUs must not depend on how many ranks the other GPUs will get (torch counts all).
            plan.append(Assignment(rank, gpu, gpu.numa, frozenset(gpu_cpus(topo, mode, gpu, selected))))
        return plan

    nranks = 1 if nranks is None else nranks
    nodes = [n for n in sorted(topo.numa_cpus) if topo.numa_cpus[n] & topo.allowed]
    if nranks < 1:
        raise UserError(f"--nranks must be at least 1, got {nranks}")
    # Ranks go to NUMA nodes in blocks (lower nodes get the remainder), so rank r and r+1 share a
    # node when they can: neighbours in a ring all-reduce then talk through the same memory.
    per, extra = divmod(nranks, len(nodes))
    plan = []
    rank = 0
    for k, node in enumerate(nodes):
        count = per + (1 if k < extra else 0)
        for position in range(count):
            plan.append(Assignment(rank, None, node, frozenset(_slot_cpus(topo, node, position, count, mode))))
            rank += 1
    return plan


@dataclass(frozen=True)
class RankBinding:
    cpus: frozenset[int]          # where the rank will run
    device_index: int | None      # torch cuda index it drives; None on the CPU
    gpu: Gpu | None               # that GPU in the node's list; None: CPU, or its PCI address unknown
    warning: str | None = None    # one line, when the rank could not be placed next to its GPU


def cpus_bound_by_launcher(launch: LaunchEnv, env: Mapping[str, str] | None = None) -> bool:
    """True when srun pinned this task to CPUs of its own. srun exports the binding it applied:
    SLURM_CPU_BIND_TYPE='mask_cpu:' for its default (cores) binding, 'none' for --cpu-bind=none
    (checked on the CI cluster: `srun -n2 env | grep CPU_BIND`). Under torchrun every worker
    inherits the same mask, so it is never a per-rank binding."""
    env = os.environ if env is None else env
    bind_type = env.get("SLURM_CPU_BIND_TYPE", "").strip().lower()
    return launch.launcher == "srun" and bind_type not in ("", "none")


def _cpu_share(topo: Topology, mode: str, launch: LaunchEnv, bound: bool) -> tuple[set[int], str | None]:
    """A CPU-only rank's CPUs: its disjoint share of the allowed CPUs, or all of them when the
    launcher already gave it its own (or there are fewer cores than ranks)."""
    allowed = set(topo.allowed)
    if bound:
        return allowed, None
    nranks = max(launch.local_world_size or 1, launch.local_rank + 1)
    try:
        return set(make_plan(topo, mode, nranks=nranks, use_gpus=False)[launch.local_rank].cpus), None
    except UserError:
        # Fewer cores than local ranks: an oversubscribed node. Keep them rather than fail.
        return allowed, (f"{len(allowed)} allowed CPU(s) cannot be split among {nranks} local ranks; "
                         f"keeping {format_cpulist(allowed)}")


def plan_this_rank(topo: Topology, mode: str, launch: LaunchEnv, visible_pci: list[str | None],
                   bound_by_launcher: bool = False) -> RankBinding:
    """Where this rank should run (pure: the rules in the module docstring, "Which CPUs a rank gets").

    `visible_pci`: PCI address of each GPU torch sees (index order; empty on the CPU)."""
    n = len(visible_pci)
    if n == 0:
        cpus, warning = _cpu_share(topo, mode, launch, bound_by_launcher)
        return RankBinding(frozenset(cpus), None, None, warning)
    index = device_index_for(launch.local_rank, launch.local_world_size, n, launch.step_gpus, launch.launcher)
    by_pci = {g.pci: g for g in topo.gpus}
    gpu = by_pci.get(visible_pci[index] or "")
    if gpu is None:
        # A container or VM can hide the PCI tree; keep the allowed CPUs rather than guess.
        return RankBinding(frozenset(topo.allowed), index, None,
                           f"GPU {index} (PCI {visible_pci[index] or 'unknown'}) not found under {topo.root}/bus/pci; "
                           f"CPUs left at {format_cpulist(topo.allowed)}")
    if bound_by_launcher:
        sharing = [gpu]
    elif n > 1:
        ranks = range(launch.local_world_size or n)
        driven = sorted({device_index_for(r, launch.local_world_size, n, launch.step_gpus, launch.launcher) for r in ranks} | {index})
        sharing = [by_pci[visible_pci[i]] for i in driven if visible_pci[i] in by_pci]
    elif launch.local_world_size == 1:
        sharing = [gpu]
    else:
        sharing = topo.gpus_on(gpu.numa)
    try:
        return RankBinding(frozenset(gpu_cpus(topo, mode, gpu, sharing)), index, gpu)
    except UserError as err:
        cpus, _ = _cpu_share(topo, mode, launch, bound_by_launcher)
        return RankBinding(frozenset(cpus), index, gpu,
                           f"GPU {gpu.index} ({gpu.pci}) is on NUMA node {gpu.numa}, but this rank cannot run there "
                           f"({err}); using CPUs {format_cpulist(cpus)} (match=NO): ask Slurm for CPUs next to "
                           "the GPUs (--cpus-per-gpu, --gpu-bind=closest)")


def cpu_mask(cpus) -> str:
    """{0,1,4,5} -> '0x33': the hex mask srun --cpu-bind=mask_cpu: takes."""
    return hex(sum(1 << c for c in cpus))


def render(plan: list[Assignment], fmt: str, command: str = "python fno.py") -> str:
    if fmt == "slurm":
        return "mask_cpu:" + ",".join(cpu_mask(a.cpus) for a in plan)
    if fmt == "json":
        return json.dumps([{"rank": a.rank,
                            "gpu": a.gpu.index if a.gpu else None,
                            "pci": a.gpu.pci if a.gpu else None,
                            "numa": a.numa,
                            "cpus": format_cpulist(a.cpus)} for a in plan], indent=2)
    if fmt == "numactl":
        # --preferred, not --membind: a rank that outgrows its node's memory should slow down,
        # not be killed.
        # The variables torchrun would set, so wellfno.launch (and bind_this_rank) sees rank r of n.
        n = len(plan)
        return "\n".join(f"RANK={a.rank} WORLD_SIZE={n} LOCAL_RANK={a.rank} LOCAL_WORLD_SIZE={n} "
                         f"numactl --physcpubind={format_cpulist(a.cpus)} --preferred={a.numa} {command}" for a in plan)
    if fmt == "table":
        lines = [f"{'rank':>4}  {'GPU':>3}  {'PCI':<12}  {'NUMA':>4}  {'CPUs':>4}  CPU list"]
        for a in plan:
            gpu = str(a.gpu.index) if a.gpu else "-"
            pci = a.gpu.pci if a.gpu else "-"
            lines.append(f"{a.rank:>4}  {gpu:>3}  {pci:<12}  {a.numa:>4}  {len(a.cpus):>4}  {format_cpulist(a.cpus)}")
        return "\n".join(lines)
    raise UserError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--sysfs", default="/sys", help="sysfs root (default /sys)")
    ap.add_argument("--allowed-cpus", default=None, help="CPU list like 0-3,8 (default: this process's affinity)")
    ap.add_argument("--mode", default="exclusive", help=f"one of {', '.join(MODES)} (default exclusive)")
    ap.add_argument("--format", default="table", help=f"one of {', '.join(FORMATS)} (default table)")
    ap.add_argument("--nranks", type=int, default=None,
                    help="local ranks (default: one per GPU; 1 on a node without GPUs)")
    ap.add_argument("--gpus", default=None, help="only these GPUs (indices in PCI order, e.g. 0-3)")
    ap.add_argument("--no-gpus", action="store_true", help="plan CPU-only ranks even if GPUs exist")
    ap.add_argument("--command", default="python fno.py", help="command for --format numactl")
    args = ap.parse_args(argv)
    # Check the cheap arguments before reading sysfs, so a typo is reported first.
    if args.mode not in MODES:
        raise UserError(f"unknown --mode {args.mode!r}; choose one of {', '.join(MODES)}")
    if args.format not in FORMATS:
        raise UserError(f"unknown --format {args.format!r}; choose one of {', '.join(FORMATS)}")
    gpus = None
    if args.gpus is not None:
        try:
            gpus = sorted(parse_cpulist(args.gpus))
        except ValueError as err:
            raise UserError(f"--gpus: {err}") from None
    topo = discover(args.sysfs, parse_allowed_arg(args.allowed_cpus))
    plan = make_plan(topo, args.mode, args.nranks, gpus, use_gpus=not args.no_gpus)
    print(render(plan, args.format, args.command))
    for w in topo.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
