"""affinity/ on GPU nodes without a GPU: torch's device queries stubbed to the GPUs of recorded nodes.

For the DGX A100, MI300A and LUMI-G fixtures, every local rank of a full node is bound under each
way Slurm (or torchrun) hands out GPUs, and every rank's two DataLoader workers are pinned:
  per_task   srun --gpus-per-task=1 --cpu-bind=none   task L sees one GPU (the L-th), shares the step's CPUs
  all        srun --gpus-per-node=N --cpu-bind=none   every task sees all GPUs
  closest    srun --gpus-per-node=N --gpu-bind=closest, tasks bound to their CPUs by Slurm: each task
             sees the GPUs of its NUMA node (srun man page: "each task may be bound to more than one
             GPU (i.e. all GPUs in that NUMA environment)")
  torchrun   torchrun --nproc-per-node=N                every worker sees all GPUs
Expected CPU lists are written out by hand from the fixture READMEs, not computed by the code.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from affinity import bind, placement
from affinity.discover import device_pci, discover, format_cpulist, parse_cpulist, visible_gpu_pci
from tests.fixtures import make_sysfs
from wellfno.cli import UserError

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "sysfs"

DGX_PCI = [a for a, _ in make_sysfs.DGX_A100_GPUS]
MI300A_PCI = ["0000:02:00.0", "0000:42:00.0", "0000:82:00.0", "0000:c2:00.0"]
LUMI_PCI = [a for a, _ in make_sysfs.LUMI_G_GCDS]

# --- expected placements, from the fixture READMEs -----------------------------------------------
# DGX A100 (README): GPU0,1 on NUMA 3 = 48-63,176-191; GPU2,3 on 1 = 16-31,144-159; GPU4,5 on 7 =
# 112-127,240-255; GPU6,7 on 5 = 80-95,208-223; each node's 16 cores halved, lower GPU lower cores.
DGX_RANK = ["48-55,176-183", "56-63,184-191", "16-23,144-151", "24-31,152-159",
            "112-119,240-247", "120-127,248-255", "80-87,208-215", "88-95,216-223"]
# MI300A (README): APU i = NUMA i = cores 24i..24i+23 with siblings +96.
MI300A_RANK = ["0-23,96-119", "24-47,120-143", "48-71,144-167", "72-95,168-191"]
# LUMI-G (README): 56 usable cores, CCD k = cores 8k+1..8k+7 (+64); GCD -> CCD 6,7,2,3,0,1,4,5.
LUMI_USABLE = "1-7,9-15,17-23,25-31,33-39,41-47,49-55,57-63,65-71,73-79,81-87,89-95,97-103,105-111,113-119,121-127"
LUMI_CCD = ["1-7,65-71", "9-15,73-79", "17-23,81-87", "25-31,89-95",
            "33-39,97-103", "41-47,105-111", "49-55,113-119", "57-63,121-127"]
LUMI_GCD_CCD = [6, 7, 2, 3, 0, 1, 4, 5]
LUMI_RANK = [LUMI_CCD[ccd] for ccd in LUMI_GCD_CCD]
# Two DataLoader workers per rank: the rank's cores in two blocks, the lower worker gets the odd one.
WORKERS = {
    "48-55,176-183": ["48-51,176-179", "52-55,180-183"], "56-63,184-191": ["56-59,184-187", "60-63,188-191"],
    "16-23,144-151": ["16-19,144-147", "20-23,148-151"], "24-31,152-159": ["24-27,152-155", "28-31,156-159"],
    "112-119,240-247": ["112-115,240-243", "116-119,244-247"],
    "120-127,248-255": ["120-123,248-251", "124-127,252-255"],
    "80-87,208-215": ["80-83,208-211", "84-87,212-215"], "88-95,216-223": ["88-91,216-219", "92-95,220-223"],
    "0-23,96-119": ["0-11,96-107", "12-23,108-119"], "24-47,120-143": ["24-35,120-131", "36-47,132-143"],
    "48-71,144-167": ["48-59,144-155", "60-71,156-167"], "72-95,168-191": ["72-83,168-179", "84-95,180-191"],
    "1-7,65-71": ["1-4,65-68", "5-7,69-71"], "9-15,73-79": ["9-12,73-76", "13-15,77-79"],
    "17-23,81-87": ["17-20,81-84", "21-23,85-87"], "25-31,89-95": ["25-28,89-92", "29-31,93-95"],
    "33-39,97-103": ["33-36,97-100", "37-39,101-103"], "41-47,105-111": ["41-44,105-108", "45-47,109-111"],
    "49-55,113-119": ["49-52,113-116", "53-55,117-119"], "57-63,121-127": ["57-60,121-124", "61-63,125-127"],
}

# Each fixture: all CPUs a full-node job may use, the GPUs in bus order, the expected CPUs of the
# rank that drives GPU g, and (closest) the CPUs Slurm bound task L to and the GPUs that task sees.
NODES = {
    "dgx-a100": dict(
        allowed="0-255", pcis=DGX_PCI, gpu_cpus=DGX_RANK,
        # srun --cpu-bind=$(python affinity/plan.py --format slurm) --gpu-bind=closest: task L on
        # DGX_RANK[L], which is on the NUMA node of GPUs 2(L//2) and 2(L//2)+1.
        closest=[(DGX_RANK[t], [2 * (t // 2), 2 * (t // 2) + 1]) for t in range(8)],
        closest_gpu=list(range(8))),
    "mi300a": dict(
        allowed="0-191", pcis=MI300A_PCI, gpu_cpus=MI300A_RANK,
        closest=[(MI300A_RANK[t], [t]) for t in range(4)],  # -c 48: task L fills APU L
        closest_gpu=list(range(4))),
    "lumi-g": dict(
        allowed=LUMI_USABLE, pcis=LUMI_PCI, gpu_cpus=LUMI_RANK,
        # -c 14 (7 cores, 2 threads): task L on CCD L, whose NUMA node L//2 holds GCDs 4,5 | 2,3 | 6,7 | 0,1.
        closest=[(LUMI_CCD[t], [[4, 5], [2, 3], [6, 7], [0, 1]][t // 2]) for t in range(8)],
        closest_gpu=[4, 5, 2, 3, 6, 7, 0, 1]),  # Frontier user guide: task 0 (HWT 001) GPU 4, task 6 GPU 0
}


# --- stubs --------------------------------------------------------------------------------------

def props_for(pci: str, style: str = "new", uuid: str | None = None):
    """Device properties as torch reports them: 'new' builds have PCI ids, 'old' ones only a uuid."""
    domain, bus, devfn = pci.split(":")
    if style == "new":
        return SimpleNamespace(name="GPU", uuid=uuid or "", pci_domain_id=int(domain, 16),
                               pci_bus_id=int(bus, 16), pci_device_id=int(devfn.split(".")[0], 16))
    return SimpleNamespace(name="GPU", uuid=uuid or "")


def fake_torch(props: list):
    calls = {}
    cuda = SimpleNamespace(is_available=lambda: bool(props), device_count=lambda: len(props),
                           get_device_properties=lambda i: props[i], current_device=lambda: 0,
                           set_device=lambda d: calls.__setitem__("device", d))
    return SimpleNamespace(cuda=cuda, device=torch.device,
                           set_num_threads=lambda n: calls.__setitem__("threads", n)), calls


def srun_env(task: int, ntasks: int, cpu_bind: str, task_gpus: list[int] | None = None) -> dict:
    """A task's Slurm variables as Slurm 22.05 sets them (measured: tests/test_launch.py MEASURED):
    SLURM_STEP_GPUS lists the GPUs of the TASK (its own one under --gpus-per-task=1, its NUMA
    domain's under --gpu-bind=closest, all under --gpus-per-node); SLURM_GPUS_ON_NODE counts the
    node's. A full node here: one task per GPU."""
    task_gpus = [task] if task_gpus is None else task_gpus
    return {"SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task),
            "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": str(ntasks), "SLURM_CPU_BIND_TYPE": cpu_bind,
            "SLURM_STEP_GPUS": ",".join(map(str, task_gpus)), "SLURM_GPUS_ON_NODE": str(ntasks)}


def torchrun_env(rank: int, nranks: int) -> dict:
    return {"RANK": str(rank), "WORLD_SIZE": str(nranks), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(nranks)}


def bind_rank(monkeypatch, sysfs, allowed: str, props: list, env: dict, mode: str = "exclusive"):
    """bind_this_rank for one rank: its allowed CPUs and its visible devices stubbed; what it applies recorded."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: parse_cpulist(allowed))
    applied = {}
    monkeypatch.setattr(bind, "set_affinity_all_threads", lambda cpus, include_pinned=False: applied.update(cpus=set(cpus)))
    torch_module, calls = fake_torch(props)
    cpus, device = bind.bind_this_rank(mode, sysfs=str(sysfs), torch_module=torch_module, env=env)
    assert set(cpus) == applied["cpus"] and calls.get("device") == (device if device.type == "cuda" else None)
    return format_cpulist(cpus), device, calls


def scenario(node: str, how: str, task: int):
    """(allowed CPUs, visible GPU PCI addresses, env) of local rank `task` on a full node."""
    spec = NODES[node]
    n = len(spec["pcis"])
    if how == "per_task":
        return spec["allowed"], [spec["pcis"][task]], srun_env(task, n, "none")
    if how == "all":
        return spec["allowed"], list(spec["pcis"]), srun_env(task, n, "none", list(range(n)))
    if how == "torchrun":
        return spec["allowed"], list(spec["pcis"]), torchrun_env(task, n)
    cpus, gpus = spec["closest"][task]
    return cpus, [spec["pcis"][g] for g in gpus], srun_env(task, n, "mask_cpu:", gpus)


@pytest.mark.parametrize("how", ["per_task", "all", "closest", "torchrun"])
@pytest.mark.parametrize("node", list(NODES))
def test_every_rank_and_worker_of_a_full_node(monkeypatch, node, how):
    spec = NODES[node]
    topo = discover(FIXTURES / node, parse_cpulist(spec["allowed"]))
    seen_gpus, seen_cpus = [], []
    for task in range(len(spec["pcis"])):
        allowed, visible, env = scenario(node, how, task)
        cpus, device, calls = bind_rank(monkeypatch, FIXTURES / node, allowed, [props_for(p) for p in visible], env)
        gpu = spec["closest_gpu"][task] if how == "closest" else task
        expected_index = visible.index(spec["pcis"][gpu])
        assert device == torch.device("cuda", expected_index), (task, device)
        assert cpus == spec["gpu_cpus"][gpu], (task, cpus)
        cores = len({topo.core_of[c] for c in parse_cpulist(cpus)})
        assert calls["threads"] == cores  # one intra-op thread per physical core
        workers = [format_cpulist(bind.worker_cpus(parse_cpulist(cpus), w, 2, topo.core_of)) for w in range(2)]
        assert workers == WORKERS[cpus], (task, workers)
        seen_gpus.append(gpu)
        seen_cpus.append(parse_cpulist(cpus))
    assert sorted(seen_gpus) == list(range(len(spec["pcis"])))  # every GPU driven once
    for i, a in enumerate(seen_cpus):  # no two ranks share a CPU
        assert all(not a & b for b in seen_cpus[i + 1:])


def test_one_gpu_per_task_ranks_on_one_numa_node_do_not_overlap(monkeypatch):
    """Issue #10 item 1: ranks on GPUs 0 and 1 of the DGX used to both get 48-63,176-191."""
    got = [bind_rank(monkeypatch, FIXTURES / "dgx-a100", "48-63,176-191", [props_for(DGX_PCI[t])],
                     srun_env(t, 2, "none"))[0] for t in range(2)]
    assert got == ["48-55,176-183", "56-63,184-191"]


def test_the_worker_pinner_applies_the_worker_share(monkeypatch):
    topo = discover(FIXTURES / "lumi-g", parse_cpulist(LUMI_USABLE))
    applied = []
    monkeypatch.setattr(bind, "set_affinity_all_threads", lambda cpus, include_pinned=False: applied.append(set(cpus)))
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: SimpleNamespace(num_workers=2))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    seen = []
    pinner = bind.WorkerPinner(parse_cpulist("49-55,113-119"), core_of=topo.core_of, then=seen.append)
    for w in range(2):
        pinner(w)
    assert [format_cpulist(c) for c in applied] == ["49-52,113-116", "53-55,117-119"] and seen == [0, 1]


def test_cpus_off_the_gpus_numa_node_warn_instead_of_failing(monkeypatch, capsys):
    """A job whose 2 CPUs are on NUMA node 0 with GPUs 0,1 on node 3: each rank gets a CPU of its
    own, a one-line warning, and its report says match=NO (the job goes on; afterok holds)."""
    topo = discover(FIXTURES / "dgx-a100", parse_cpulist("0-255"))
    for task, expected in ((0, "0"), (1, "1")):  # --cpu-bind=none: the 2 CPUs are shared, so split
        cpus, device, _ = bind_rank(monkeypatch, FIXTURES / "dgx-a100", "0-1", [props_for(DGX_PCI[task])],
                                    srun_env(task, 2, "none"))
        assert (cpus, device) == (expected, torch.device("cuda", 0))
        warning = capsys.readouterr().err.strip().splitlines()
        assert len(warning) == 1 and "NUMA node 3" in warning[0] and "match=NO" in warning[0]
        line = placement.format_report(host="n", rank=task, local_rank=task, worker=None, cpus=parse_cpulist(cpus),
                                       topo=topo, gpu_index=0, gpu_pci=DGX_PCI[task])
        assert line.endswith(f"gpu=0 pci={DGX_PCI[task]} gpu_numa=3 match=NO")
    # srun bound each task to a core of its own (default --cpu-bind): kept as it is.
    cpus, _, _ = bind_rank(monkeypatch, FIXTURES / "dgx-a100", "1,129", [props_for(DGX_PCI[1])],
                           srun_env(1, 2, "mask_cpu:"))
    assert cpus == "1,129" and "NUMA node 3" in capsys.readouterr().err


def test_a_single_process_on_a_gpu_node_takes_its_gpus_whole_numa_node(monkeypatch):
    # Nobody else drives GPU 1, so GPU 0's rank gets all of NUMA node 3 (node mode's CPU list).
    cpus, device, _ = bind_rank(monkeypatch, FIXTURES / "dgx-a100", "0-255", [props_for(p) for p in DGX_PCI], {})
    assert (cpus, device) == ("48-63,176-191", torch.device("cuda", 0))


def test_more_ranks_than_visible_gpus_without_a_slurm_binding_is_a_user_error(monkeypatch):
    with pytest.raises(UserError, match="only 2 GPUs visible"):
        bind_rank(monkeypatch, FIXTURES / "dgx-a100", "0-255", [props_for(p) for p in DGX_PCI[:2]], torchrun_env(3, 4))


# --- which physical GPU is a torch device: new and old property sets -----------------------------

def test_pci_address_from_recent_torch_properties():
    assert device_pci(props_for("0000:c1:00.0")) == "0000:c1:00.0"
    torch_module, _ = fake_torch([props_for(p) for p in DGX_PCI[2:4]])
    assert visible_gpu_pci(torch_module) == ["0000:47:00.0", "0000:4e:00.0"]


def test_pci_address_from_the_uuid_on_nvidia(tmp_path):
    # Older torch: no pci_*_id, but a uuid; the driver lists it per PCI address under /proc.
    for pci, uuid in (("0000:07:00.0", "6d1a7b0e-0c7d-5e0a-9b1c-000000000007"),
                      ("0000:0f:00.0", "6d1a7b0e-0c7d-5e0a-9b1c-00000000000f")):
        (tmp_path / "driver/nvidia/gpus" / pci).mkdir(parents=True)
        (tmp_path / "driver/nvidia/gpus" / pci / "information").write_text(
            f"Model: \t\t NVIDIA A100-SXM4-40GB\nIRQ:   \t\t 123\nGPU UUID: \t GPU-{uuid}\nBus Location: \t {pci}\n")
    old = props_for("0000:0f:00.0", "old", uuid="6d1a7b0e-0c7d-5e0a-9b1c-00000000000f")
    assert device_pci(old, sysfs=tmp_path / "nosys", proc=tmp_path) == "0000:0f:00.0"
    assert device_pci(props_for("0000:0f:00.0", "old", uuid="ffffffff-0000-0000-0000-000000000000"),
                      proc=tmp_path) is None


def kfd_tree(root: Path, gcds: list[tuple[str, int]]) -> None:
    """KFD topology nodes as amdgpu writes them: node 0 is the CPU, then one node per GCD."""
    nodes = root / "class/kfd/kfd/topology/nodes"
    (nodes / "0").mkdir(parents=True)
    (nodes / "0/properties").write_text("cpu_cores_count 64\nsimd_count 0\nlocation_id 0\ndomain 0\nunique_id 0\n")
    for k, (pci, unique_id) in enumerate(gcds, start=1):
        domain, bus, devfn = pci.split(":")
        dev, fn = devfn.split(".")
        (nodes / str(k)).mkdir()
        (nodes / str(k) / "properties").write_text(
            f"cpu_cores_count 0\nsimd_count 440\nlocation_id {int(bus, 16) << 8 | int(dev, 16) << 3 | int(fn)}\n"
            f"domain {int(domain, 16)}\nunique_id {unique_id}\n")


def hip_uuid(unique_id: int) -> str:
    """What torch prints for a HIP device: the uuid bytes are the ASCII hex digits of unique_id."""
    raw = f"{unique_id:016x}".encode().hex()
    return f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"


def test_old_torch_on_lumi_binds_through_the_kfd_topology(monkeypatch, tmp_path):
    """Old property set end to end: one GCD per task (GCD 6 and 7), found from the uuid alone."""
    sysfs = make_sysfs.write_tree(make_sysfs.NODES["lumi-g"], tmp_path / "lumi-g")
    ids = [0x3a5b1c0000000000 + k for k in range(8)]
    kfd_tree(sysfs, list(zip(LUMI_PCI, ids)))
    assert hip_uuid(ids[6]).startswith("33613562-")  # '3a5b' in ASCII hex
    assert device_pci(props_for(LUMI_PCI[6], "old", uuid=hip_uuid(ids[6])), sysfs=sysfs) == "0000:d9:00.0"
    assert device_pci(props_for(LUMI_PCI[2], "old", uuid=f"GPU-{ids[2]:016x}"), sysfs=sysfs) == "0000:c9:00.0"
    got = [bind_rank(monkeypatch, sysfs, LUMI_USABLE, [props_for(LUMI_PCI[g], "old", uuid=hip_uuid(ids[g]))],
                     srun_env(t, 8, "none")) for t, g in ((6, 6), (7, 7))]
    assert [cpus for cpus, _, _ in got] == [LUMI_RANK[6], LUMI_RANK[7]]


def test_unknown_pci_address_keeps_the_allowed_cpus(monkeypatch, capsys):
    cpus, device, _ = bind_rank(monkeypatch, FIXTURES / "mi300a", "0-191", [props_for(MI300A_PCI[0], "old")],
                                srun_env(0, 4, "none"))
    assert (cpus, device) == ("0-191", torch.device("cuda", 0))
    assert "PCI unknown" in capsys.readouterr().err


# --- the report: a rank driving a GPU says which, without --bind ---------------------------------

@pytest.mark.parametrize("node, task, how, gpu, numa", [
    ("dgx-a100", 2, "all", 2, 1), ("lumi-g", 0, "closest", 4, 0), ("mi300a", 3, "per_task", 3, 3)])
def test_report_names_the_gpu_of_the_rank(monkeypatch, node, task, how, gpu, numa):
    allowed, visible, env = scenario(node, how, task)
    torch_module, _ = fake_torch([props_for(p) for p in visible])
    index, pci = placement.rank_gpu(None, torch_module, str(FIXTURES / node), env)
    assert pci == NODES[node]["pcis"][gpu] and index == visible.index(pci)
    topo = discover(FIXTURES / node, parse_cpulist(NODES[node]["allowed"]))
    line = placement.format_report(host="n", rank=task, local_rank=task, worker=None,
                                   cpus=parse_cpulist(NODES[node]["gpu_cpus"][gpu]), topo=topo,
                                   gpu_index=index, gpu_pci=pci)
    assert line.endswith(f"gpu={index} pci={pci} gpu_numa={numa} match=yes")
    # A rank on the CPU (device cpu) reports no GPU even where torch sees some.
    assert placement.rank_gpu(torch.device("cpu"), torch_module, str(FIXTURES / node), env) == (None, None)


def test_worker_report_hook_prints_the_ranks_gpu(monkeypatch, capsys):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: parse_cpulist("52-55,180-183"))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    hook = placement.WorkerReport(sysfs=str(FIXTURES / "dgx-a100"), gpu=(1, DGX_PCI[1]))
    hook(1)
    out = capsys.readouterr().out
    assert "rank=1 local_rank=1 worker=1 cpus=52-55,180-183 (8) cpu_numa=3" in out
    assert out.rstrip().endswith(f"gpu=1 pci={DGX_PCI[1]} gpu_numa=3 match=yes")


# --- benchmark: moving the whole process between conditions --------------------------------------

def test_benchmark_moves_threads_started_under_another_mask():
    """A thread born while the process ran on one CPU (autograd's device thread in the benchmark's
    warm-up) keeps that mask under os.sched_setaffinity(0, ...); all_threads_on moves it too."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 allowed CPUs")
    code = """
import os, threading
from affinity.benchmark import all_threads_on
a, b = sorted(os.sched_getaffinity(0))[:2]
os.sched_setaffinity(0, {a})
ready, go, done, seen = threading.Event(), threading.Event(), threading.Event(), []
def thread():
    ready.set()
    while not done.is_set():
        go.wait(); go.clear(); seen.append(os.sched_getaffinity(0)); ready.set()
t = threading.Thread(target=thread, daemon=True); t.start(); ready.wait()
def look():
    ready.clear(); go.set(); ready.wait(); return seen[-1]
os.sched_setaffinity(0, {a, b}); old_way = look(); os.sched_setaffinity(0, {a})
with all_threads_on({a, b}):
    inside = look()
after = look()
print(old_way == {a}, inside == {a, b}, after == {a}, os.sched_getaffinity(0) == {a})
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "True", "True"]


# --- the solutions' order: launch, device, rendezvous, then bind (issue #34 point 2) --------------
# Solutions 05 on: env = launch_environment(); pick_backend(...) picks the rank's GPU;
# env.export_rendezvous() writes RANK, WORLD_SIZE, LOCAL_RANK; then bind_this_rank(args.bind)
# (affinity.training.bind) with nothing but the process's environment.

def slurm_task_env(how: str, task: int, ntasks: int, visible: list[int], cpu_bind: str,
                   node_gpus: int) -> dict:
    """Every variable srun (Slurm 22.05) sets that the launch reads, for task `task` of a one-node
    step of `ntasks` tasks started with --ntasks-per-node (tests/test_launch.py MEASURED: the task's
    SLURM_STEP_GPUS and CUDA_VISIBLE_DEVICES are its own GPU under --gpus-per-task=1, its NUMA
    domain's under --gpu-bind=closest, all under --gpus-per-node; SLURM_GPUS_ON_NODE and
    SLURM_JOB_GPUS are the job's)."""
    gpus = ",".join(map(str, visible))
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "localhost",
           "SLURM_STEP_NODELIST": "localhost", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
           "SLURM_NTASKS": str(ntasks), "SLURM_STEP_NUM_TASKS": str(ntasks),
           "SLURM_NTASKS_PER_NODE": str(ntasks), "SLURM_TASKS_PER_NODE": str(ntasks),
           "SLURM_STEP_TASKS_PER_NODE": str(ntasks), "SLURM_PROCID": str(task),
           "SLURM_LOCALID": str(task), "SLURM_CPU_BIND_TYPE": cpu_bind,
           "SLURM_JOB_GPUS": ",".join(map(str, range(node_gpus))), "SLURM_STEP_GPUS": gpus,
           "SLURM_GPUS_ON_NODE": str(node_gpus), "CUDA_VISIBLE_DEVICES": gpus}
    if how == "per_task":
        env["SLURM_GPUS_PER_TASK"] = "1"
    return env


TORCHRUN_AND_RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                           "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.parametrize("how", ["per_task", "all", "closest"])
@pytest.mark.parametrize("node", ["dgx-a100", "lumi-g"])
def test_bind_after_the_rendezvous_keeps_the_gpu_the_launcher_gave(monkeypatch, node, how):
    """Each task of a full node, through the real functions in the solutions' order: bind drives
    the GPU pick_backend chose, with the CPUs next to it. Before the launch was kept across
    export_rendezvous, bind read RANK/LOCAL_RANK back, took the task for a torchrun worker (every
    GPU visible to each) and stopped with "8 ranks on this node but only 1 GPUs visible" under
    --gpus-per-task=1 (2 under --gpu-bind=closest)."""
    from wellfno import launch as launch_module
    from wellfno.device import pick_backend, pick_device

    spec = NODES[node]
    monkeypatch.setattr(launch_module, "_exported", None, raising=False)  # no earlier test's launch
    driven = []
    for task in range(len(spec["pcis"])):
        allowed, pcis, _ = scenario(node, how, task)
        visible = [spec["pcis"].index(p) for p in pcis]  # node GPU numbers the task sees
        cpu_bind = "mask_cpu:" if how == "closest" else "none"
        for name in TORCHRUN_AND_RENDEZVOUS:
            monkeypatch.setenv(name, "")  # recorded, so that teardown removes what export wrote
            monkeypatch.delenv(name)
        for name, value in slurm_task_env(how, task, len(spec["pcis"]), visible, cpu_bind,
                                          len(spec["pcis"])).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda n=len(pcis): n)
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)

        env = launch_module.launch_environment()
        device = pick_device("auto")
        backend, device = pick_backend("auto", env.local_rank, env.local_world_size,
                                       device.type == "cuda", env.step_gpus, env.launcher)
        env.export_rendezvous()
        assert os.environ["RANK"] == str(task) and os.environ["LOCAL_RANK"] == str(task)
        cpus, rank_device, calls = bind_rank(monkeypatch, FIXTURES / node, allowed,
                                             [props_for(p) for p in pcis], os.environ)

        assert backend == "nccl" and rank_device == device, (task, rank_device, device)
        gpu = spec["closest_gpu"][task] if how == "closest" else task
        assert pcis[device.index] == spec["pcis"][gpu], (task, device)
        assert cpus == spec["gpu_cpus"][gpu], (task, cpus)
        driven.append(gpu)
    assert sorted(driven) == list(range(len(spec["pcis"])))  # every GPU driven once


def test_bind_takes_a_launch_decided_by_the_caller(monkeypatch):
    """bind_this_rank(launch=...): the caller's decision, whatever the environment says now (here
    nothing: read, it would be a lone process owning GPU 3's whole NUMA node)."""
    from wellfno.launch import LaunchEnv

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: parse_cpulist("0-255"))
    monkeypatch.setattr(bind, "set_affinity_all_threads", lambda cpus, include_pinned=False: None)
    fake, _ = fake_torch([props_for(DGX_PCI[3])])
    task_3 = LaunchEnv(3, 8, 3, 8, "srun", 0, 8)  # --gpus-per-task=1, 8 tasks on the node
    for launch, expected in ((task_3, DGX_RANK[3]), (None, "16-31,144-159")):
        cpus, device = bind.bind_this_rank("exclusive", sysfs=str(FIXTURES / "dgx-a100"),
                                           torch_module=fake, env={}, launch=launch)
        assert (format_cpulist(cpus), device) == (expected, torch.device("cuda", 0)), launch
