"""affinity/: discovery and plans on real node types (fixtures), CLI formats, bind/report here.

Expected CPU lists are written out by hand from each fixture's README (the documented layout),
not computed with the code under test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

from tests.fixtures import make_sysfs
from affinity.bind import worker_cpus
from affinity.discover import discover, format_cpulist, parse_cpulist
from affinity.plan import core_share, cpu_mask, make_plan, render
from affinity.placement import format_report
from wellfno.cli import UserError

FIXTURES = REPO / "tests" / "fixtures" / "sysfs"
DGX, MI300A, LAPTOP = FIXTURES / "dgx-a100", FIXTURES / "mi300a", FIXTURES / "laptop"

# `nvidia-smi topo -m` "CPU Affinity" column of a DGX A100, GPU0..GPU7 (fixture README).
DGX_NODE_AFFINITY = ["48-63,176-191", "48-63,176-191", "16-31,144-159", "16-31,144-159",
                     "112-127,240-255", "112-127,240-255", "80-95,208-223", "80-95,208-223"]
# The same, each NUMA node's 16 cores halved between its two GPUs (lower GPU: lower cores).
DGX_EXCLUSIVE = ["48-55,176-183", "56-63,184-191", "16-23,144-151", "24-31,152-159",
                 "112-119,240-247", "120-127,248-255", "80-87,208-215", "88-95,216-223"]
# MI300A: APU i = socket i = NUMA i, 24 cores, sibling = CPU + 96 (fixture README).
MI300A_NODE = ["0-23,96-119", "24-47,120-143", "48-71,144-167", "72-95,168-191"]


def cpus_of(plan):
    return [format_cpulist(a.cpus) for a in plan]


def run_cli(script: str, *args: str):
    return subprocess.run([sys.executable, f"affinity/{script}", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


# --- cpulist syntax ---------------------------------------------------------------------------

def test_cpulist_parse_and_format_follow_kernel_syntax():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("") == set()
    assert format_cpulist({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    for bad in ("0-x", "3-1", "1,,a", "-2"):
        with pytest.raises(ValueError):
            parse_cpulist(bad)


# --- discovery --------------------------------------------------------------------------------

def test_dgx_a100_discovery_finds_8_gpus_in_bus_order_and_not_the_bmc_or_nvswitches():
    topo = discover(DGX, allowed_cpus=set(range(256)))
    assert [g.pci for g in topo.gpus] == [a for a, _ in make_sysfs.DGX_A100_GPUS]
    assert [g.numa for g in topo.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert all(g.vendor == "NVIDIA" and g.pci_class == 0x030200 for g in topo.gpus)
    assert "0000:e2:00.0" not in {g.pci for g in topo.gpus}  # ASPEED BMC VGA
    assert len(topo.numa_cpus) == 8 and topo.smt() == 2
    assert len(set(topo.core_of.values())) == 128
    assert topo.siblings(48) == {48, 176}
    assert len(set(topo.l3_of.values())) == 32  # 4-core CCXs


def test_mi300a_discovery_one_apu_per_numa_node():
    topo = discover(MI300A, allowed_cpus=set(range(192)))
    assert [(g.vendor, g.numa) for g in topo.gpus] == [("AMD", 0), ("AMD", 1), ("AMD", 2), ("AMD", 3)]
    assert [format_cpulist(topo.numa_cpus[n]) for n in range(4)] == MI300A_NODE
    assert topo.siblings(36) == {36, 132}  # lstopo in llnl/mpibind#45: Core L#36 = PU P#36 + P#132
    assert topo.l3_of[47] == 40 and topo.l3_of[143] == 40  # L3 L#5 holds cores 40-47


def test_lumi_g_discovery_gcd_order_is_not_numa_order():
    topo = discover(FIXTURES / "lumi-g", allowed_cpus=set(range(128)))
    assert [g.pci for g in topo.gpus] == [a for a, _ in make_sysfs.LUMI_G_GCDS]
    assert [(g.vendor, g.numa) for g in topo.gpus] == [("AMD", n) for n in (3, 3, 1, 1, 0, 0, 2, 2)]
    assert len(topo.numa_cpus) == 4 and topo.smt() == 2 and topo.siblings(49) == {49, 113}
    assert len(set(topo.l3_of.values())) == 8 and topo.l3_of[55] == 48  # CCD6 = cores 48-55


def test_laptop_has_no_gpu_and_its_intel_igpu_does_not_count():
    topo = discover(LAPTOP, allowed_cpus=set(range(8)))
    assert topo.gpus == [] and list(topo.numa_cpus) == [0] and topo.smt() == 2


def test_a_bmc_vga_alone_is_no_gpu_but_an_amd_display_controller_is(tmp_path):
    spec = make_sysfs.NodeSpec(
        name="bmc", sockets=1, cores_per_socket=4, numa_per_socket=1, cores_per_l3=4, smt=1,
        pci=(make_sysfs.PciDevice("0000:03:00.0", make_sysfs.ASPEED, 0x030000, -1),
             make_sysfs.PciDevice("0000:c1:00.0", make_sysfs.AMD, 0x038000, -1)))
    topo = discover(make_sysfs.write_tree(spec, tmp_path), allowed_cpus={0, 1, 2, 3})
    assert [(g.pci, g.vendor, g.numa) for g in topo.gpus] == [("0000:c1:00.0", "AMD", 0)]


def test_allowed_cpus_that_do_not_exist_are_a_user_error():
    with pytest.raises(UserError, match="do not exist"):
        discover(LAPTOP, allowed_cpus={0, 9})


# --- plans against the documented bindings -----------------------------------------------------

def test_dgx_a100_node_mode_equals_nvidia_smi_cpu_affinity():
    assert cpus_of(make_plan(discover(DGX, set(range(256))), "node")) == DGX_NODE_AFFINITY


def test_dgx_a100_exclusive_halves_each_numa_node_between_its_two_gpus():
    plan = make_plan(discover(DGX, set(range(256))), "exclusive")
    assert cpus_of(plan) == DGX_EXCLUSIVE
    assert [a.gpu.index for a in plan] == list(range(8)) and [a.numa for a in plan] == [3, 3, 1, 1, 7, 7, 5, 5]


def test_dgx_a100_core_complex_gives_each_gpu_its_own_ccx():
    plan = make_plan(discover(DGX, set(range(256))), "core-complex")
    assert cpus_of(plan)[:2] == ["48-51,176-179", "52-55,180-183"]


def test_mi300a_node_and_exclusive_are_the_whole_apu_socket():
    topo = discover(MI300A, set(range(192)))
    assert cpus_of(make_plan(topo, "node")) == MI300A_NODE
    assert cpus_of(make_plan(topo, "exclusive")) == MI300A_NODE


def test_mi300a_core_complex_is_the_first_ccd_of_each_apu():
    plan = make_plan(discover(MI300A, set(range(192))), "core-complex")
    assert cpus_of(plan) == ["0-7,96-103", "24-31,120-127", "48-55,144-151", "72-79,168-175"]


def test_smt_off_in_bios_and_at_run_time(tmp_path):
    dgx = make_sysfs.write_tree(make_sysfs.VARIANTS["dgx-a100-smt-off-bios"], tmp_path / "a")
    topo = discover(dgx, set(range(128)))
    assert topo.smt() == 1
    assert cpus_of(make_plan(topo, "exclusive"))[:2] == ["48-55", "56-63"]
    mi = make_sysfs.write_tree(make_sysfs.VARIANTS["mi300a-smt-off-runtime"], tmp_path / "b")
    topo = discover(mi, set(range(96)))  # cpu96..191 folders exist but are offline
    assert topo.smt() == 1 and len(topo.core_of) == 96
    assert cpus_of(make_plan(topo, "exclusive")) == ["0-23", "24-47", "48-71", "72-95"]


def test_partial_allocation_plans_only_within_allowed_cpus():
    # A job that got GPUs 0,1 and the cores of NUMA node 3 without their SMT siblings
    # (srun --hint=nomultithread): exclusive still splits 8/8 physical cores.
    topo = discover(DGX, parse_cpulist("48-63"))
    assert cpus_of(make_plan(topo, "exclusive", gpus=[0, 1])) == ["48-55", "56-63"]
    # 13 allowed cores for 2 GPUs: the lower GPU gets the extra core (torch's rule).
    topo = discover(DGX, parse_cpulist("48-60,176-188"))
    assert cpus_of(make_plan(topo, "exclusive", gpus=[0, 1])) == ["48-54,176-182", "55-60,183-188"]
    # GPUs whose NUMA node has no allowed CPU cannot be planned: say how to fix it.
    with pytest.raises(UserError, match="--gpus"):
        make_plan(discover(DGX, parse_cpulist("48-63")), "exclusive")


def test_no_gpu_ranks_get_disjoint_core_sets():
    topo = discover(LAPTOP, set(range(8)))
    assert cpus_of(make_plan(topo, "exclusive", nranks=2)) == ["0-1,4-5", "2-3,6-7"]
    assert cpus_of(make_plan(topo, "exclusive", nranks=3)) == ["0-1,4-5", "2,6", "3,7"]
    assert cpus_of(make_plan(topo, "node", nranks=2)) == ["0-7", "0-7"]
    with pytest.raises(UserError, match="physical cores"):
        make_plan(topo, "exclusive", nranks=5)
    # On a GPU node, --no-gpus spreads CPU-only ranks over NUMA nodes in blocks.
    plan = make_plan(discover(MI300A, set(range(192))), "exclusive", nranks=8, use_gpus=False)
    assert [a.numa for a in plan] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert cpus_of(plan)[:2] == ["0-11,96-107", "12-23,108-119"]


# --- output formats and the CLI contract -------------------------------------------------------

def test_slurm_masks_are_exact_hex():
    assert cpu_mask({0, 1, 4, 5}) == "0x33"
    topo = discover(LAPTOP, set(range(8)))
    assert render(make_plan(topo, "exclusive", nranks=3), "slurm") == "mask_cpu:0x33,0x44,0x88"


def test_cli_slurm_dgx_node_mode():
    r = run_cli("plan.py", "--sysfs", str(DGX), "--allowed-cpus", "0-255", "--mode", "node", "--format", "slurm")
    assert r.returncode == 0, r.stderr
    masks = r.stdout.strip().removeprefix("mask_cpu:").split(",")
    # GPU0: CPUs 48-63 -> ffff after 12 zero nibbles; CPUs 176-191 -> ffff after 44 zero nibbles.
    assert masks[0] == "0xffff" + "0" * 28 + "ffff" + "0" * 12
    # GPU2: CPUs 16-31 and 144-159.
    assert masks[2] == "0xffff" + "0" * 28 + "ffff" + "0" * 4
    assert len(masks) == 8 and masks[0] == masks[1]


def test_cli_json_and_numactl_and_table():
    r = run_cli("plan.py", "--sysfs", str(MI300A), "--allowed-cpus", "0-191", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["gpu"], x["pci"], x["numa"], x["cpus"]) for x in rows] == [
        (0, "0000:02:00.0", 0, MI300A_NODE[0]), (1, "0000:42:00.0", 1, MI300A_NODE[1]),
        (2, "0000:82:00.0", 2, MI300A_NODE[2]), (3, "0000:c2:00.0", 3, MI300A_NODE[3])]
    r = run_cli("plan.py", "--sysfs", str(DGX), "--allowed-cpus", "48-63", "--gpus", "0-1", "--format", "numactl")
    assert r.stdout.splitlines() == [
        "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 numactl --physcpubind=48-55 --preferred=3 python fno.py",
        "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 numactl --physcpubind=56-63 --preferred=3 python fno.py"]
    r = run_cli("plan.py", "--sysfs", str(LAPTOP), "--allowed-cpus", "0-7", "--nranks", "2")
    assert r.returncode == 0 and "0-1,4-5" in r.stdout and "2-3,6-7" in r.stdout


@pytest.mark.parametrize("args, says", [
    (["--sysfs", "/nonexistent-sysfs"], "--sysfs"),
    (["--allowed-cpus", "0-x"], "--allowed-cpus"),
    (["--mode", "socket-ish"], "unknown --mode"),
    (["--format", "yaml"], "unknown --format"),
])
def test_cli_bad_input_is_one_line_exit_2(args, says):
    r = run_cli("plan.py", *args)
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and says in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_discover_cli_prints_table(tmp_path):
    r = run_cli("discover.py", "--sysfs", str(DGX), "--allowed-cpus", "0-255")
    assert r.returncode == 0, r.stderr
    assert "8 NUMA node(s), 128 cores, 256 CPUs (SMT2), 8 GPU(s)" in r.stdout
    assert "   3       0     16          4       32  0,1       48-63,176-191" in r.stdout


def test_draw_writes_a_png(tmp_path):
    from affinity.discover import draw
    png = draw(discover(MI300A, set(range(96))), tmp_path / "mi300a.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- bind / report ------------------------------------------------------------------------------

def test_worker_cpus_spread_over_cores_instead_of_collapsing():
    core_of = {c: c % 4 for c in range(8)}  # laptop: CPU c and c+4 are one core
    per_worker = [worker_cpus(range(8), w, 4, core_of) for w in range(4)]
    assert per_worker == [{0, 4}, {1, 5}, {2, 6}, {3, 7}]
    assert [worker_cpus(range(8), w, 2, core_of) for w in range(2)] == [{0, 1, 4, 5}, {2, 3, 6, 7}]
    assert [worker_cpus({0, 1}, w, 3) for w in range(3)] == [{0}, {1}, {0}]


def test_one_core_splitting_rule_for_ranks_and_workers():
    # 5 cores in 2 shares: the lower share gets the extra core, siblings stay together.
    core_of = {c: c % 5 for c in range(10)}
    assert [core_share(range(10), core_of, k, 2) for k in range(2)] == [{0, 1, 2, 5, 6, 7}, {3, 4, 8, 9}]
    with pytest.raises(ValueError):
        core_share({0, 1}, None, 0, 3)


def test_report_says_whether_cpus_and_gpu_share_a_numa_node():
    topo = discover(DGX, set(range(256)))
    near = format_report(host="n1", rank=0, local_rank=0, worker=None, cpus=parse_cpulist("48-55,176-183"),
                         topo=topo, gpu_index=0, gpu_pci="0000:07:00.0")
    assert near.endswith("cpus=48-55,176-183 (16) cpu_numa=3 gpu=0 pci=0000:07:00.0 gpu_numa=3 match=yes")
    far = format_report(host="n1", rank=2, local_rank=2, worker=1, cpus=parse_cpulist("0-7"),
                        topo=topo, gpu_index=2, gpu_pci="0000:47:00.0")
    assert "worker=1" in far and "cpu_numa=0" in far and far.endswith("gpu_numa=1 match=NO")


@pytest.mark.slow  # a child process with torch and two DataLoader workers: ~10 s on 2 busy cores
def test_bind_pin_workers_and_report_on_this_machine():
    """In one child process (so the test runner keeps its affinity): DataLoader workers pinned
    with worker_init_fn(allowed) land on different CPUs; then local rank 1 of 2 CPU-only ranks
    (torchrun's variables) is bound to the second half of the allowed CPUs and reports it."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs 2 allowed CPUs")
    code = (
        "import os, torch\n"
        "from affinity import bind_this_rank, worker_init_fn, report_line\n"
        "from affinity.report import _Tiny\n"
        "allowed = sorted(os.sched_getaffinity(0))\n"
        "dl = torch.utils.data.DataLoader(_Tiny(2), num_workers=2, worker_init_fn=worker_init_fn(allowed, report=True))\n"
        "list(dl)\n"
        "cpus, device = bind_this_rank(mode='exclusive')\n"
        "print('CPUS', ','.join(map(str, cpus)), device.type, sorted(os.sched_getaffinity(0)) == cpus,"
        " torch.get_num_threads())\n"
        "print(report_line(device=device))\n"
    )
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    workers = [line for line in lines if line.startswith("host=") and "worker=-" not in line]
    assert len(workers) == 2
    worker_sets = [line.split("cpus=")[1].split()[0] for line in workers]
    assert len(set(worker_sets)) == 2  # each worker on its own CPUs, not all on one core

    expected = make_plan(discover("/sys", set(allowed)), "exclusive", nranks=2, use_gpus=False)[1].cpus
    tag, cpus, device, pinned, threads = next(line for line in lines if line.startswith("CPUS")).split()
    assert set(map(int, cpus.split(","))) == set(expected) and device == "cpu" and pinned == "True"
    assert set(expected) < set(allowed)  # really a subset, not everything
    assert int(threads) == len({discover("/sys", set(allowed)).core_of[c] for c in expected})
    assert f"rank=1 local_rank=1 worker=- cpus={format_cpulist(expected)}" in r.stdout
    assert all("rank=1 local_rank=1 worker=" in line for line in workers)  # workers know their rank


def test_launcher_env_errors_are_one_line(monkeypatch):
    # RANK without WORLD_SIZE: wellfno.launch's one-line error, through the report and bind.
    from affinity import report
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for argv in ([], ["--bind"]):
        with pytest.raises(UserError, match="RANK is set but WORLD_SIZE is not") as err:
            report.main(argv)
        assert "\n" not in str(err.value)


def test_report_cli_prints_this_process(capsys, monkeypatch):
    from affinity import report
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)
    assert report.main([]) == 0
    out = capsys.readouterr().out
    assert f"rank=0 local_rank=0 worker=- cpus={format_cpulist(os.sched_getaffinity(0))}" in out
    assert "match=n/a" in out  # no GPU here


def _fake_torch(calls):
    """A CPU-only torch for bind_this_rank: what it would set is recorded, nothing applied."""
    import torch
    from types import SimpleNamespace
    cuda = SimpleNamespace(is_available=lambda: False,
                           set_device=lambda d: calls.__setitem__("device", d))
    return SimpleNamespace(cuda=cuda, device=torch.device,
                           set_num_threads=lambda n: calls.__setitem__("threads", n))


def test_bind_none_pins_nothing_and_says_nothing(monkeypatch, capsys):
    """Issue 42 (5): 'none' was planned as a mode and fell into the oversubscribed warning
    ("cannot be split among 1 local ranks"); now it leaves the CPUs and threads as they are."""
    from affinity import bind
    applied, calls = [], {}
    monkeypatch.setattr(bind, "set_affinity_all_threads", lambda *a, **k: applied.append(a))
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    cpus, device = bind.bind_this_rank("none", torch_module=_fake_torch(calls), env=env)
    assert cpus == sorted(os.sched_getaffinity(0)) and device.type == "cpu"
    assert applied == [] and calls == {}  # no CPU mask, no thread count, no GPU set
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("mode", ["bogus", "", "Exclusive"])
def test_bind_unknown_mode_is_one_line_naming_the_modes(monkeypatch, capsys, mode):
    from affinity import bind, report
    from tests.conftest import exit_of
    with pytest.raises(UserError) as err:
        bind.bind_this_rank(mode, torch_module=_fake_torch({}), env={})
    assert str(err.value) == (f"unknown bind mode {mode!r}; choose one of exclusive, node, "
                              "core-complex, none")
    assert "cannot be split" not in capsys.readouterr().err
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)
    r = exit_of(report, "--bind", "--mode", mode)
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr == f"error: {err.value}\n"


@pytest.mark.parametrize("mode, pinned", [("exclusive", True), ("none", False)])
def test_report_workers_unpinned_under_mode_none(monkeypatch, capsys, mode, pinned):
    """Exercise 03, task 4: `report.py --bind --mode none --workers 2` shows where unpinned
    workers run (solution 03's --bind none pins and so reports no worker)."""
    import torch
    from affinity import bind, report
    from affinity.placement import WorkerReport
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(bind, "set_affinity_all_threads", lambda *a, **k: None)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    loaders = []
    monkeypatch.setattr(torch.utils.data, "DataLoader",
                        lambda *a, **k: loaders.append(k["worker_init_fn"]) or [])
    assert report.main(["--bind", "--mode", mode, "--workers", "2"]) == 0
    [init] = loaders
    assert isinstance(init, bind.WorkerPinner) == pinned
    assert pinned or isinstance(init, WorkerReport)
    assert "warning" not in capsys.readouterr().err


@pytest.mark.slurm
@pytest.mark.parametrize("cpu_bind", ["cores", "none"])
def test_srun_ranks_bind_to_disjoint_cpus_on_the_test_cluster(cpu_bind):
    """Real srun: with its default core binding each task keeps the CPU srun gave it; with
    --cpu-bind=none the tasks share the step's CPUs and bind_this_rank splits them."""
    import shutil
    if shutil.which("srun") is None or subprocess.run(["sinfo"], capture_output=True).returncode != 0:
        pytest.skip("no Slurm cluster here (slurm/ci/start_cluster.sh starts one)")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    r = subprocess.run(["srun", "-n2", f"--cpu-bind={cpu_bind}", sys.executable, "affinity/report.py", "--bind"],
                       cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr
    lines = sorted(line for line in r.stdout.splitlines() if line.startswith("host="))
    assert [line.split()[1:3] for line in lines] == [["rank=0", "local_rank=0"], ["rank=1", "local_rank=1"]]
    cpus = [parse_cpulist(line.split("cpus=")[1].split()[0]) for line in lines]
    assert cpus[0] and cpus[1] and not cpus[0] & cpus[1]
