"""The real training programs pick their GPUs under real Slurm GPU modes (stand-in GPUs).

The test cluster (slurm/ci/start_cluster.sh) hands out stand-in GPUs for real: Slurm sets the
*_VISIBLE_DEVICES, SLURM_STEP_GPUS and SLURM_GPUS_ON_NODE it sets on a GPU node, and binds CPUs.
A test-only seam (tests/gpu_seam/sitecustomize.py, put on PYTHONPATH here and nowhere else) makes
torch report the GPUs Slurm made visible to each task, with the NVIDIA or AMD runtime's rules and
the PCI addresses of a recorded node (tests/fixtures: DGX A100, LUMI-G), runs nccl as gloo, and
stops each process at its first device work. So every program runs its own launcher, rank,
device and backend selection (wellfno.launch, wellfno.device, affinity.bind) and
check_gpu_not_shared, and each process records what it chose.

Checked, for every GPU mode slurm/README.md offers and NVIDIA and AMD variables: every rank of a
step drives a GPU of its own, one Slurm made visible to it; under --gpu-bind=closest, one whose
gres.conf Cores= hold the rank's CPUs; two ranks that Slurm leaves on one GPU stop with one line.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import pythonpath_with
from tests.fixtures import make_sysfs
from tests.test_slurm import (REPO, _submit_all, batch, batched, error_lines,  # noqa: F401
                              job_env, sbatch, slurm_cluster, slurm_data, slurm_gpus, wait)

pytestmark = pytest.mark.slurm

SEAM = REPO / "tests" / "gpu_seam"
# Node GPU i of the test cluster stands for GPU i of a recorded node (its PCI address).
RECORDED_PCI = {"nvidia": [a for a, _ in make_sysfs.DGX_A100_GPUS][:4],
                "amd": [a for a, _ in make_sysfs.LUMI_G_GCDS][:4]}
SELECTION_ERRORS = ("GPUs visible", "both drive GPU", "sees no GPU", "invalid device ordinal")


def seam_env(root: Path, well_data: Path, vendor: str, **extra: str) -> dict:
    env = job_env(root / "runs", well_data, GPU_VENDOR=vendor, CPUS_PER_GPU="1",
                  LOCAL_TMP=str(root / "local"), WELLFNO_GPU_SEAM=str(root / "seam"),
                  WELLFNO_GPU_SEAM_PCI=",".join(RECORDED_PCI[vendor]), PYTHONPATH=pythonpath_with(SEAM))
    env.update(extra)
    return env


def records(folder: Path) -> list[dict]:
    """What every process of the real programs chose (the seam's files), one dict each."""
    out = []
    for p in sorted(folder.rglob("*.json")):
        m = re.match(r"(.+)-(\d+)\.(\w+)-(\d+)-(\d+)\.json$", p.name)
        rec = json.loads(p.read_text())
        rec.update(job=m.group(1), step=m.group(3), rank=int(m.group(4)), mode=p.parent.name)
        gpus = [e["gpu"] for e in rec["events"] if "set_device" in e]
        work = rec.get("device_work") or {}
        rec["gpu"] = work.get("gpu", gpus[-1] if gpus else None)  # the node GPU it drives
        rec["host"] = rec["env"].get("SLURMD_NODENAME", "?")
        out.append(rec)
    return out


def gres_cores() -> dict[tuple[str, int], set[int]]:
    """(node, GPU index) -> the cores gres.conf says the GPU is close to (what closest binds by)."""
    text = Path("/etc/slurm/gres.conf").read_text()
    out, counts = {}, {}
    for m in re.finditer(r"^(?:NodeName=(\S+) )?Name=gpu .*?Cores=([\d,\-]+)", text, re.M):
        node = m.group(1) or "*"
        i = counts[node] = counts.get(node, -1) + 1
        cores = set()
        for part in m.group(2).split(","):
            a, _, b = part.partition("-")
            cores.update(range(int(a), int(b or a) + 1))
        out[node, i] = cores
    return out


def assert_one_gpu_per_rank(recs: list[dict], where: str) -> None:
    """Every rank of the step drives a GPU it sees, and no two ranks share one on a node."""
    by_rank = {}
    for r in recs:
        assert r["gpu"] is not None, f"{where}: rank {r['rank']} drove no GPU: {r}"
        assert r["gpu"] in r["visible"], f"{where}: rank {r['rank']} drives an unseen GPU: {r}"
        by_rank.setdefault(r["rank"], set()).add((r["host"], r["gpu"]))
    owners = {}
    for rank, gpus in sorted(by_rank.items()):
        for gpu in gpus:
            assert gpu not in owners, f"{where}: ranks {owners[gpu]} and {rank} share GPU {gpu}"
            owners[gpu] = rank


# The course's GPU job scripts (their names in one place: the course renumbers its steps); not
# 00_gpu_check, which runs the GPU test suite, nor the CPU-only statistics.
COURSE_GPU_JOBS = ("00_baseline", "01_profiling", "02_throughput", "03_affinity_report",
                   "03_affinity_train", "05_ddp", "06_exact_metrics", "08_host_syncs",
                   "09_mixed_precision", "11_compile")


# Both tests' jobs join the session's batch (tests/test_slurm.py, `batched`).
@batched("test_slurm_every_gpu_job_runs_its_own_gpu_selection", gpus=2, seconds=15)
def _course(root, data):
    env = seam_env(root / "course", data, "nvidia", GPUS_PER_NODE="2")
    return _submit_all(env, *COURSE_GPU_JOBS), env


@batched("test_slurm_gpu_modes_drive_distinct_and_closest_gpus", gpus=4, seconds=130)
def _modes(root, data):
    env = seam_env(root / "modes", data, "nvidia", GPUS_PER_NODE="4",
                   PCI_nvidia=",".join(RECORDED_PCI["nvidia"]),
                   PCI_amd=",".join(RECORDED_PCI["amd"]))
    script = root / "gpu_modes.sbatch"
    script.write_text(MODES_JOB)
    job = sbatch(str(script), env=env, run_root=root / "modes" / "runs",
                 sbatch_opts=["--nodes=1", "--ntasks=2", "--cpus-per-task=1", "--gpus-per-node=4"])
    return job, root / "modes"


def test_slurm_every_gpu_job_runs_its_own_gpu_selection(slurm_gpus, batch, request):
    """The course's GPU job scripts through submit_all.sh on a 2-GPU NVIDIA site (00_gpu_check
    aside: it runs the GPU test suite, which the seam cannot stand in for; AMD's variables: the
    modes test below, through the same launch functions): each real program selects launcher,
    rank, GPU and backend; every rank of every step drives its own GPU; the DDP step (05) runs
    nccl with every GPU of the node visible to each rank."""
    jobs, env = batch[request.node.name]
    for job in jobs:
        wait(job, timeout=400)
    recs = records(Path(env["WELLFNO_GPU_SEAM"]))
    assert sorted(j.name for j in jobs) == sorted(COURSE_GPU_JOBS)
    for job in jobs:
        log = job.out.read_text(errors="replace")
        bad = [line for line in error_lines(log) if any(e in line for e in SELECTION_ERRORS)]
        assert not bad, f"{job.name}: {bad}\n{job.logs()}"
        if job.name == "03_affinity_report":  # reports its GPU without driving it: read its report
            gpus = dict(re.findall(r"^host=\S+ rank=(\d+) \S+ worker=- .* pci=(\S+)", log, re.M))
            assert sorted(gpus) == ["0", "1"] and len(set(gpus.values())) == 2, log
            continue
        # the processes that chose a GPU (09's benchmark leaves that to the runs it starts)
        mine = [r for r in recs if r["job"] == job.name and r["gpu"] is not None]
        assert mine, f"{job.name}: no program chose a GPU\n{job.logs()}"
        for step in {r["step"] for r in mine}:
            assert_one_gpu_per_rank([r for r in mine if r["step"] == step], f"{job.name}.{step}")
    for name in ("05_ddp", "06_exact_metrics"):  # the DDP steps' training (their first srun step)
        ddp = [r for r in recs if r["job"] == name and r["step"] == "0"]
        assert sorted(r["rank"] for r in ddp) == [0, 1], ddp
    for r in [r for r in recs if r["job"] in ("05_ddp", "06_exact_metrics") and r["step"] == "0"]:  # launch_ddp: both GPUs visible to both ranks, the local rank's driven
        assert r["visible"] == [0, 1] and r["gpu"] == r["rank"], r
        assert r["backend"] == "nccl" and r["device_work"], r
    train = [r for r in recs if r["job"] == "03_affinity_train" and r.get("device_work")]
    assert sorted(r["rank"] for r in train) == [0, 1], train   # each rank got to its device work


@batched("test_slurm_ddp_steps_with_default_flags_bind_each_rank_to_its_own_gpu", gpus=4,
         seconds=120)
def _defaults(root, data):
    env = seam_env(root / "defaults", data, "nvidia", GPUS_PER_NODE="4")
    script = root / "default_flags.sbatch"
    script.write_text(DEFAULTS_JOB)
    job = sbatch(str(script), env=env, run_root=root / "defaults" / "runs",
                 sbatch_opts=["--nodes=1", "--ntasks=2", "--cpus-per-task=1", "--gpus-per-node=4"])
    return job, root / "defaults"


MODES_JOB = r"""#!/bin/bash
#SBATCH --job-name=gpu_modes
. "$WELLFNO_ROOT/slurm/common.sh"
seam="$WELLFNO_GPU_SEAM"
prog=(solutions/05_ddp/fno.py --dataset "$DATASET" --data-dir "$WELL_DATA" --device cuda --bind none
      --epochs 1 --max-steps 1 --batch-size 2 --n-steps-input 10)  # few samples to load
for vendor in nvidia amd; do
  export GPU_VENDOR=$vendor WELLFNO_GPU_SEAM_PCI="$(eval echo \$PCI_$vendor)"
  # --gpus-per-task=1 (launch_gpu, site.env's default)
  WELLFNO_GPU_SEAM=$seam/$vendor-per_task launch_gpu --cpu-bind=cores -- \
    "$PYTHON" "${prog[@]}" --out "$RUN_DIR/$vendor-1"
  # --gpus-per-node: every GPU of the node visible to each rank (launch_ddp, the DDP steps);
  # AMD's variables change nothing there (ROCR_ and CUDA_VISIBLE_DEVICES list the same 0..3)
  [ $vendor = nvidia ] && WELLFNO_GPU_SEAM=$seam/$vendor-per_node launch_ddp --cpu-bind=cores -- \
    "$PYTHON" "${prog[@]}" --out "$RUN_DIR/$vendor-2"
  # --gpu-bind=closest (site.env GPU_BIND=closest): each task sees its NUMA domain's GPUs
  WELLFNO_GPU_SEAM=$seam/$vendor-closest _wf_run "${GPU_SRUN_FLAGS[@]}" --gpu-bind=closest \
    --cpu-bind=cores -- "${GPU_WRAP[@]}" "$PYTHON" "${prog[@]}" --out "$RUN_DIR/$vendor-3"
done
export GPU_VENDOR=nvidia WELLFNO_GPU_SEAM_PCI="$PCI_nvidia"
# torchrun inside the allocation: one agent, two workers, every GPU of the job visible
WELLFNO_GPU_SEAM=$seam/nvidia-torchrun launch_torchrun -- "${prog[@]}" --out "$RUN_DIR/torchrun"
# Slurm leaves two ranks on one GPU: a 2-GPU step whose GPUs both sit by core 0, bound closest,
# gives the task on core 1 "the first device in the allocation" (slurmstepd's words).
WELLFNO_GPU_SEAM=$seam/nvidia-shared _wf_run --gpus-per-node=2 --gpu-bind=closest \
  --cpu-bind=cores -- "${GPU_WRAP[@]}" "$PYTHON" "${prog[@]}" --out "$RUN_DIR/shared" \
  || echo "shared step: exit $?"
"""


def test_slurm_gpu_modes_drive_distinct_and_closest_gpus(slurm_gpus, batch, request):
    """One 4-GPU allocation, two tasks on cores 0 and 1 (GPUs 0,1 by core 0, 2,3 by core 1):
    solution 05 under --gpus-per-task=1, --gpus-per-node and --gpu-bind=closest with NVIDIA and
    AMD variables, and under torchrun; then a step where Slurm itself puts both ranks on GPU 0,
    which stops with one line naming both ranks and the option that gives one GPU per rank."""
    if request.node.name not in batch:
        pytest.skip("needs 4 stand-in GPUs on a node")
    job, root = batch[request.node.name]
    wait(job, timeout=400)
    job.assert_completed()
    recs = [r for r in records(root / "seam") if r["argv"][0].endswith("fno.py")]
    modes = {}
    for r in recs:
        modes.setdefault(r["mode"], []).append(r)
    expected = {f"{v}-{m}" for v in ("nvidia", "amd") for m in ("per_task", "closest")}
    expected |= {"nvidia-per_node", "nvidia-torchrun", "nvidia-shared"}
    assert set(modes) == expected, sorted(modes)
    cores = gres_cores()
    for mode, got in sorted(modes.items()):
        got.sort(key=lambda r: r["rank"])
        assert [r["rank"] for r in got] == [0, 1], (mode, got)
        if mode == "nvidia-shared":
            continue
        assert_one_gpu_per_rank(got, mode)
        assert all(r["backend"] == "nccl" and r["device_work"] for r in got), (mode, got)
        for r in got:  # the PCI address the program saw is the recorded node's GPU it stands for
            vendor = mode.split("-")[0]
            assert r["device_work"]["pci"] == RECORDED_PCI[vendor][r["gpu"]], (mode, r)
        if mode.endswith("closest"):
            for r in got:
                near = cores.get((r["host"], r["gpu"])) or cores[("*", r["gpu"])]
                assert set(r["cpus"]) <= near, (mode, r["rank"], r["cpus"], r["gpu"])
    assert [len(r["visible"]) for r in modes["nvidia-per_task"]] == [1, 1]
    assert [r["visible"] for r in modes["nvidia-per_node"]] == [[0, 1, 2, 3]] * 2
    assert [r["visible"] for r in modes["nvidia-torchrun"]] == [[0, 1, 2, 3]] * 2
    assert [r["gpu"] for r in modes["amd-closest"]] == [0, 3]  # rank 0 sees 0,1; rank 1 sees 2,3

    shared = modes["nvidia-shared"]
    assert [r["gpu"] for r in shared] == [0, 0], shared
    assert not any(r.get("device_work") for r in shared), "a rank on a shared GPU went on"
    log = job.out.read_text() + (job.err.read_text() if job.err.exists() else "")
    lines = [line for line in error_lines(log) if "both drive" in line]
    gpu0, host = RECORDED_PCI["nvidia"][0], shared[0]["host"]
    assert lines == [f"error: ranks 0 and 1 both drive GPU {gpu0} on {host}: give each rank its "
                     "own GPU with srun --ntasks-per-node=N --gpus-per-node=N "
                     "(slurm/submit_all.sh does it), or --gpus-per-task=1"], log[-3000:]


# Solutions 05, 07 and 13 as a participant starts them: no --device, --backend or --bind, so each
# rank binds itself (--bind exclusive) after export_rendezvous, in every GPU mode (issue #34).
DEFAULT_FLAG_STEPS = ("05_ddp", "07_failures", "13_domain_parallel")
DEFAULTS_JOB = r"""#!/bin/bash
#SBATCH --job-name=default_flags
. "$WELLFNO_ROOT/slurm/common.sh"
seam="$WELLFNO_GPU_SEAM"
# 9 steps, more than a job's 7 rendezvous ports (wellfno/launch.py master_port_from_slurm): steps 7
# and 8 would take the next job's first two, and a job running beside this one (the suite's other
# worker) then fails with EADDRINUSE (seen in make test). Ports of their own, below the course's
# 20000-31999, a new one per step (the last one's socket may linger in TIME_WAIT).
port=19100
next_port() { export MASTER_PORT=$port; port=$((port + 1)); }
for step in """ + " ".join(DEFAULT_FLAG_STEPS) + r"""; do
  prog=(solutions/$step/fno.py --dataset "$DATASET" --data-dir "$WELL_DATA")
  # --gpus-per-task=1 (launch_gpu, site.env's default)
  next_port
  WELLFNO_GPU_SEAM=$seam/$step-per_task launch_gpu --cpu-bind=cores -- \
    "$PYTHON" "${prog[@]}" --out "$RUN_DIR/$step-1"
  # --gpus-per-node: every GPU of the node visible to each rank (launch_ddp, the DDP steps)
  next_port
  WELLFNO_GPU_SEAM=$seam/$step-per_node launch_ddp --cpu-bind=cores -- \
    "$PYTHON" "${prog[@]}" --out "$RUN_DIR/$step-2"
  # --gpu-bind=closest (site.env GPU_BIND=closest): each task sees its NUMA domain's GPUs
  next_port
  WELLFNO_GPU_SEAM=$seam/$step-closest _wf_run "${GPU_SRUN_FLAGS[@]}" --gpu-bind=closest \
    --cpu-bind=cores -- "${GPU_WRAP[@]}" "$PYTHON" "${prog[@]}" --out "$RUN_DIR/$step-3"
done
"""


def test_slurm_ddp_steps_with_default_flags_bind_each_rank_to_its_own_gpu(slurm_gpus, batch,
                                                                         request):
    """Solutions 05, 07 and 13 with their default flags, two tasks of a 4-GPU allocation under
    --gpus-per-task=1, --gpus-per-node and --gpu-bind=closest: every rank binds (--bind
    exclusive, after export_rendezvous) to the GPU it chose at start-up, its own, and reaches its
    device work. Before the launch was kept across export_rendezvous, bind took the srun tasks
    for torchrun workers and stopped under --gpus-per-task=1: "2 ranks on this node but only 1
    GPUs visible"."""
    if request.node.name not in batch:
        pytest.skip("needs 4 stand-in GPUs on a node")
    job, root = batch[request.node.name]
    wait(job, timeout=600)
    log = job.out.read_text(errors="replace") + (job.err.read_text(errors="replace")
                                                 if job.err.exists() else "")
    assert not [line for line in error_lines(log) if line.startswith("error:")], log[-3000:]
    job.assert_completed()
    recs = [r for r in records(root / "seam") if r["argv"][0].endswith("fno.py")]
    modes = {}
    for r in recs:
        modes.setdefault(r["mode"], []).append(r)
    assert set(modes) == {f"{s}-{m}" for s in DEFAULT_FLAG_STEPS
                          for m in ("per_task", "per_node", "closest")}, sorted(modes)
    cores = gres_cores()
    for mode, got in sorted(modes.items()):
        got.sort(key=lambda r: r["rank"])
        assert [r["rank"] for r in got] == [0, 1], (mode, got)
        assert "--bind" not in " ".join(got[0]["argv"]) and "--device" not in got[0]["argv"]
        assert_one_gpu_per_rank(got, mode)
        for r in got:
            assert r["backend"] == "nccl" and r["device_work"], (mode, r)
            # pick_backend's choice at start-up, then bind's: one GPU, the one it worked on
            chosen = [e["gpu"] for e in r["events"] if "set_device" in e]
            assert len(chosen) == 2 and set(chosen) == {r["gpu"]}, (mode, r["rank"], r["events"])
            if mode.endswith("closest"):
                near = cores.get((r["host"], r["gpu"])) or cores[("*", r["gpu"])]
                assert set(r["cpus"]) <= near, (mode, r["rank"], r["cpus"], r["gpu"])
        if mode.endswith("per_task"):
            assert [len(r["visible"]) for r in got] == [1, 1], (mode, got)
