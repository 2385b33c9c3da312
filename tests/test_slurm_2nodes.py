"""The multi-node jobs, run as real jobs on the two-node test cluster (slurm/ci/start_cluster.sh).

The cluster's two nodes (n1, n2: one slurmd each, own loopback address, own host name) share
this machine's cores, so these tests show placement, rendezvous and failure handling across
nodes, never speed. Each multi-node run is checked against one node or one rank:
- 04_stats_2nodes: tasks on both nodes (srun's own per-task files name node and task), srun's
  and torchrun's stats.yaml bit for bit the serial program's;
- 07_failures_2nodes through submit_all.sh --with-2nodes: the real program's report of each rank's
  node and local rank; parameters after N steps equal to one rank with the global batch;
  validation and rollout equal to one task evaluating the checkpoint;
- the GPU variant's placement with stand-in GPUs, NVIDIA and AMD variables (probe mode);
- scaling.py --launcher srun inside a two-node allocation: every point's ranks on its nodes;
- faults: a node lost mid-epoch, a rank that cannot reach the rendezvous, two jobs at once,
  a job that needs more nodes than its partition has, an unresolvable node list.
Without a cluster of two nodes these tests skip on a laptop and FAIL in CI (CI=true).

The jobs, and what each proves (the first four join the session's `batch`, tests/test_slurm.py):
- 04_stats_2nodes: srun and torchrun statistics across nodes equal the serial ones, bit for bit;
- 07_failures_2nodes (submit_all.sh --with-2nodes, 3 steps of 4 ranks x 2): placement by
  node and local rank, parameters equal to 1 rank x 8, validation and rollout equal to 1 task;
- the same job on an NVIDIA and an AMD site in probe mode: each rank's node, local rank, GPU;
- scaling.py --launcher srun (4 steps a point): each point's ranks on the nodes its table says;
- 07_failures_2nodes (30 epochs) losing its second node in epoch 2, then
  06_exact_metrics.sbatch --resume on the node left (while the lost node restarts): the fault;
- srun -N 2 with rank 1 sent to a closed port (--timeout 5): one line per rank within it;
- two jobs of two `python -m wellfno.launch` steps at once: they never meet, no port reused.
- 04_stats_2nodes and 05_ddp on 2 x 2 ranks with CONTAINER_EXEC (the stand-in runtime of
  tests/test_slurm_container.py): statistics bit for bit, DDP equal to one rank, every task
  through the runtime on its own node; the same two jobs with real podman and the course image
  (containers/), where both are installed.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.ddp_helpers import SMALL_MODEL
from tests.test_slurm import (
    REPO,
    SLURM_DIR,
    TERMINAL,
    _probes,
    _jobs_in,
    _submit_all,
    batch,  # noqa: F401
    batched,
    error_lines,
    job_env,  # noqa: F401
    job_state,
    node_states,
    sbatch,
    serial_stats,  # noqa: F401
    slurm_cluster,
    slurm_data,
    usable,
    wait,
)
from tests.test_slurm_container import (assert_no_host_venv, container_env, find_podman_image, podman_job_env,
                                         program_calls, records)

pytestmark = pytest.mark.slurm

# The data-parallel solution with exact metrics, --resume and the watchdog (one place: the course
# renames steps), and step 05's scaling benchmark.
DDP = "solutions/07_failures/fno.py"
SCALING = "solutions/05_ddp/scaling.py"
CI_ROOT = Path(os.environ.get("SLURM_CI_ROOT", "/var/tmp/wellfno-slurm"))
TRAIN = (
    "--epochs",
    "1",
    "--max-steps",
    "3",
    *SMALL_MODEL,
    "--batch-size",
    "2",
    "--seed",
    "0",
)  # 3 steps, 4 ranks x 2


@pytest.fixture(scope="session")
def two_nodes(slurm_cluster) -> list[str]:
    """The names of two usable nodes (the first two that sinfo lists), or skip / fail in CI. Asked
    again for up to 30 s while fewer are: a node between two jobs can be in a passing state."""
    deadline = time.monotonic() + 30
    states = slurm_cluster["nodes"]
    while True:
        nodes = sorted({n for n, state, *_ in states if usable(state)})
        if len(nodes) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(1)
        states = node_states()
    if len(nodes) < 2:
        msg = (
            f"the Slurm cluster has {len(nodes)} usable node(s) (sinfo: "
            f"{', '.join(' '.join(n[:2]) for n in states)}), the two-node jobs need 2; "
            f"restart it with sudo slurm/ci/start_cluster.sh (two nodes by default)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return nodes[:2]


# --------------------------------------------------------------------------- the batch
# The two-node jobs that run to their end (statistics, DDP, GPU placement, scaling) join the
# session's batch (tests/test_slurm.py, `batched`): each takes both nodes, so Slurm runs them one
# after the other once the one-node jobs are done, with no gap, and the one-rank reference they are
# checked against runs beside them. The fault tests submit their own jobs, alone.


def all_error_lines(text: str) -> list[str]:
    """The programs' `error: ...` lines, also one that follows a progress bar ending without a
    newline (not Slurm's own "srun: error: ..." lines)."""
    return re.findall(r"(?:^|[\r\n]|\])(error: [^\r\n]*)", text)


def report_lines(text: str) -> dict[int, dict]:
    """The training program's own line per rank: 'host=n2 rank=2 local_rank=0 ...' -> {2: {...}}."""
    return {
        int(m.group(2)): {"host": m.group(1), "local_rank": int(m.group(3))}
        for m in re.finditer(r"host=(\S+) rank=(\d+) local_rank=(\d+) worker=-", text)
    }


def parameters(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def worst_relative_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    worst = 0.0
    for name in a:
        wide = torch.complex128 if torch.is_complex(a[name]) else torch.float64  # spectral weights
        x, y = a[name].to(wide), b[name].to(wide)
        worst = max(worst, ((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item())
    return worst


# --------------------------------------------------------------------------- statistics
@batched("test_slurm_2nodes_stats_bit_for_bit_on_both_nodes", nodes=2, seconds=20)
def _stats(root, data):
    run_root = root / "runs"
    return sbatch("04_stats_2nodes.sbatch", env=job_env(run_root, data), run_root=run_root)


def test_slurm_2nodes_stats_bit_for_bit_on_both_nodes(
        two_nodes, batch, request, serial_stats):  # noqa: F811
    """04_stats_2nodes: 2 x 2 srun tasks, then one torchrun per node (rendezvous on the first node):
    both stats.yaml byte for byte the serial stats.py's. Where each task ran is Slurm's own record:
    srun --error=stats-%N-%t.err creates one file per task, named by its node and task id."""
    first, second = two_nodes
    serial = serial_stats
    job = wait(batch[request.node.name], timeout=600)
    job.assert_completed()
    for name in ("stats.yaml", "stats_torchrun.yaml"):
        assert (
            job.run_dir / name
        ).read_bytes() == serial.read_bytes(), f"{name} differs from the serial one"
    tasks = sorted(p.name for p in job.run_dir.glob("stats-*.err"))
    assert tasks == [
        f"stats-{first}-0.err",
        f"stats-{first}-1.err",
        f"stats-{second}-2.err",
        f"stats-{second}-3.err",
    ], tasks
    agents = sorted(p.name for p in job.run_dir.glob("torchrun-*.err"))
    assert agents == [
        f"torchrun-{first}-0.err",
        f"torchrun-{second}-1.err",
    ], "not one torchrun per node"
    log = job.out.read_text() + job.err.read_text()
    assert re.search(
        rf"^torchrun: nnodes=2 nproc_per_node=2 rendezvous={first}:\d+$", log, re.M
    ), log
    assert "4 rank(s) (torchrun, gloo)" in log and "4 rank(s) (srun, gloo)" in log, log


def start_one_rank(script, data, ref) -> subprocess.Popen:
    """The reference: `script` on one rank with the global batch (8), outside Slurm, started now
    so that it runs beside the batch's jobs instead of after them."""
    return subprocess.Popen(
        [sys.executable, script, "--data-dir", str(data), "--out", str(ref), *TRAIN[:-4],
         "--batch-size", "8", "--seed", "0", "--bind", "none"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        | {"OMP_NUM_THREADS": "1"},
    )


# --------------------------------------------------------------------------- inside a container
# The same two-node runs with CONTAINER_EXEC (slurm/site.env) set to the stand-in runtime
# (tests/container_standin/record_exec.sh; tests/test_slurm_container.py has the one-node jobs).
@batched("test_slurm_2nodes_container_stats_bit_for_bit", nodes=2, seconds=20)
def _stats_in_container(root, data):
    run_root, rec = root / "runs", root / "records"
    return sbatch("04_stats_2nodes.sbatch", env=container_env(run_root, data, rec), run_root=run_root), rec


def test_slurm_2nodes_container_stats_bit_for_bit(two_nodes, batch, request, serial_stats):  # noqa: F811
    """04_stats_2nodes with every task inside the container: srun's 2 x 2 tasks and the torchrun of
    each node went through the runtime on their own node, the start-of-job check once per node;
    both stats.yaml byte for byte the serial stats.py's."""
    job, rec = batch[request.node.name]
    wait(job, timeout=600)
    job.assert_completed()
    for name in ("stats.yaml", "stats_torchrun.yaml"):
        assert (job.run_dir / name).read_bytes() == serial_stats.read_bytes(), f"{name} differs from the serial one"
    recs = records(rec)
    checks = [r for r in recs if r["argv"][:2] == ["/bin/sh", "-c"]]
    assert sorted(r["env"]["SLURMD_NODENAME"] for r in checks) == sorted(two_nodes)
    ranks = [r for r in program_calls(recs, "stats.py") if r["argv"][0] == "python"]
    assert sorted((r["env"]["SLURMD_NODENAME"], r["env"]["SLURM_PROCID"]) for r in ranks) == [
        (two_nodes[0], "0"), (two_nodes[0], "1"), (two_nodes[1], "2"), (two_nodes[1], "3")]
    agents = [r for r in recs if r["argv"][:3] == ["env", "-u", "SLURM_PROCID"]]
    assert sorted(r["env"]["SLURMD_NODENAME"] for r in agents) == sorted(two_nodes)
    assert "4 rank(s) (torchrun, gloo)" in job.out.read_text() + job.err.read_text()
    assert_no_host_venv(recs)


@batched("test_slurm_2nodes_container_ddp_equals_one_rank", nodes=2, seconds=35)
def _ddp_in_container(root, data):
    run_root, rec = root / "runs", root / "records"
    job = sbatch("05_ddp.sbatch", *TRAIN, env=container_env(run_root, data, rec), run_root=run_root,
                 sbatch_opts=["--nodes=2", "--ntasks-per-node=2"])
    ref = root / "one_rank"
    one_rank = start_one_rank("solutions/05_ddp/fno.py", data, ref)
    return job, rec, one_rank, ref


def test_slurm_2nodes_container_ddp_equals_one_rank(two_nodes, batch, request):
    """05_ddp over 2 nodes x 2 ranks, every rank inside the container: ranks 0, 1 on the first node
    and 2, 3 on the second went through the runtime with their Slurm ranks; after 3 steps the
    parameters equal one rank with the global batch (within 1e-5, as the two-node test above)."""
    job, rec, one_rank, ref = batch[request.node.name]
    out, _ = one_rank.communicate(timeout=600)
    assert one_rank.returncode == 0, out[-4000:]
    wait(job, timeout=600)
    job.assert_completed()
    assert "Training on 4 rank(s) (srun, gloo backend, cpu)" in job.out.read_text()
    ranks = program_calls(records(rec), "solutions/05_ddp/fno.py")
    assert sorted((r["env"]["SLURMD_NODENAME"], r["env"]["SLURM_PROCID"]) for r in ranks) == [
        (two_nodes[0], "0"), (two_nodes[0], "1"), (two_nodes[1], "2"), (two_nodes[1], "3")]
    assert worst_relative_difference(parameters(job.run_dir / "checkpoint.pt"),
                                     parameters(ref / "checkpoint.pt")) <= 1e-5
    metrics = json.loads((job.run_dir / "metrics.json").read_text())
    assert metrics["world_size"] == 4 and metrics["global_batch_size"] == 8


@batched("test_slurm_2nodes_podman_stats_and_ddp_equal_outside", nodes=2, seconds=60)
def _podman_two_nodes(root, data):
    found = find_podman_image()
    if isinstance(found, str):
        return found
    stats = sbatch("04_stats_2nodes.sbatch", env=podman_job_env(root / "stats", data, *found),
                   run_root=root / "stats")
    ddp = sbatch("05_ddp.sbatch", *TRAIN, env=podman_job_env(root / "ddp", data, *found),
                 run_root=root / "ddp", sbatch_opts=["--nodes=2", "--ntasks-per-node=2"])
    ref = root / "one_rank"
    one_rank = start_one_rank("solutions/05_ddp/fno.py", data, ref)
    return stats, ddp, one_rank, ref


@pytest.mark.slow
def test_slurm_2nodes_podman_stats_and_ddp_equal_outside(two_nodes, batch, request, serial_stats):  # noqa: F811
    """With real podman and the course image (containers/; skipped without either): 04_stats_2nodes
    (srun 2 x 2 and a torchrun per node) inside it, both stats.yaml byte for byte the serial
    one outside; 05_ddp over 2 x 2 ranks inside it, its parameters equal to one rank with the
    global batch outside (within 1e-5) and the same validation loss (within 1e-5)."""
    got = batch.get(request.node.name)
    if isinstance(got, str):
        pytest.skip(got)
    stats, ddp, one_rank, ref = got
    out, _ = one_rank.communicate(timeout=600)
    assert one_rank.returncode == 0, out[-4000:]
    for job in (stats, ddp):
        wait(job, timeout=600)
        job.assert_completed()
        assert "(in the container)" in (job.run_dir / "job.txt").read_text()
    for name in ("stats.yaml", "stats_torchrun.yaml"):
        assert (stats.run_dir / name).read_bytes() == serial_stats.read_bytes(), f"{name} differs from the serial one"
    assert "Training on 4 rank(s) (srun, gloo backend, cpu)" in ddp.out.read_text()
    assert worst_relative_difference(parameters(ddp.run_dir / "checkpoint.pt"),
                                     parameters(ref / "checkpoint.pt")) <= 1e-5
    inside = json.loads((ddp.run_dir / "metrics.json").read_text())["valid_loss"]
    outside = json.loads((ref / "metrics.json").read_text())["valid_loss"]
    assert math.isclose(inside, outside, rel_tol=1e-5), (inside, outside)


# --------------------------------------------------------------------------- training
@batched("test_slurm_2nodes_ddp_equals_one_rank", nodes=2, seconds=35)
def _ddp(root, data):
    (job,) = _submit_all(
        job_env(root / "runs", data),
        "--with-2nodes", "--args", f"07_failures_2nodes={' '.join(TRAIN)}",
        "07_failures_2nodes",
    )
    ref = root / "one_rank"
    one_rank = start_one_rank(DDP, data, ref)
    return job, one_rank, ref


def test_slurm_2nodes_ddp_equals_one_rank(two_nodes, batch, request):
    """07_failures_2nodes through submit_all.sh --with-2nodes on a CPU site: ranks 0, 1 on the first
    node and 2, 3 (local ranks 0, 1) on the second, by the program's own report; after 3 steps
    the parameters of 4 ranks x 2 equal those of 1 rank x 8 (within 1e-5: the same sums in
    another order); one task evaluating the checkpoint finds the 4 ranks' validation loss and
    rollout errors."""
    first, second = two_nodes
    job, one_rank, ref = batch[request.node.name]
    out, _ = one_rank.communicate(timeout=600)
    assert one_rank.returncode == 0, out[-4000:]
    wait(job, timeout=600)
    job.assert_completed()
    log = job.out.read_text()
    ranks = report_lines(log)
    assert ranks == {
        0: {"host": first, "local_rank": 0},
        1: {"host": first, "local_rank": 1},
        2: {"host": second, "local_rank": 0},
        3: {"host": second, "local_rank": 1},
    }, log
    assert "Training on 4 rank(s) (srun, gloo backend, cpu)" in log
    assert (
        worst_relative_difference(
            parameters(job.run_dir / "checkpoint.pt"), parameters(ref / "checkpoint.pt")
        )
        <= 1e-5
    )
    metrics = json.loads((job.run_dir / "metrics.json").read_text())
    evaluation = json.loads((job.run_dir / "eval.json").read_text())
    assert (
        metrics["world_size"] == 4
        and metrics["global_batch_size"] == 8
        and evaluation["world_size"] == 1
    )
    assert math.isclose(evaluation["valid_loss"], metrics["valid_loss"], rel_tol=1e-6)
    assert len(metrics["rollout_vrmse"]) == len(evaluation["rollout_vrmse"]) > 0
    for a, b in zip(metrics["rollout_vrmse"], evaluation["rollout_vrmse"]):
        assert math.isclose(a, b, rel_tol=1e-5), (
            metrics["rollout_vrmse"],
            evaluation["rollout_vrmse"],
        )


def _driven_gpu(rec: dict, vendor: str) -> str:
    """The physical GPU a rank drives: the one it sees, or its local rank's of several
    (issue 18's rule)."""
    var = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES"}[vendor]
    visible = rec["env"].get(var, "").split(",")
    assert visible != [""], f"no {var}: {rec['env']}"
    return visible[0] if len(visible) == 1 else visible[int(rec["env"]["SLURM_LOCALID"])]


@batched("test_slurm_2nodes_gpu_job_places_ranks_per_node", nodes=2, gpus=2, seconds=2)
def _gpu_placement(tmp_path, data):
    sites = {}
    for vendor in ("nvidia", "amd"):
        root = tmp_path / vendor
        env = job_env(
            root / "runs",
            data,
            GPU_VENDOR=vendor,
            GPUS_PER_NODE="2",
            CPUS_PER_GPU="1",
            LOCAL_TMP=str(root / "local"),
            WELLFNO_PROBE=str(root / "probe"),
        )
        (job,) = _submit_all(env, "--with-2nodes", "07_failures_2nodes")
        sites[vendor] = (root, job)
    return sites


def test_slurm_2nodes_gpu_job_places_ranks_per_node(two_nodes, batch, request):
    """The GPU variant of 07_failures_2nodes through submit_all.sh --with-2nodes on a 2-GPU
    'NVIDIA' and a 2-GPU 'AMD' site (stand-in GPUs, probe mode): 2 nodes x 2 tasks; rank 2 is
    local rank 0 of the second node and drives that node's first GPU; on each node the two ranks
    drive distinct GPUs; the evaluation step is one task on one node with one GPU."""
    first, second = two_nodes
    for vendor, (root, job) in batch[request.node.name].items():
        wait(job, timeout=600)
        job.assert_completed()
        steps = _probes(root / "probe")["07_failures_2nodes"]
        train, evaluate = steps["0"], steps["1"]
        assert len(train) == 4 and len(evaluate) == 1, steps
        where = [
            (r["env"]["SLURMD_NODENAME"], r["env"]["SLURM_NODEID"], r["env"]["SLURM_LOCALID"])
            for r in train
        ]
        assert where == [
            (first, "0", "0"),
            (first, "0", "1"),
            (second, "1", "0"),
            (second, "1", "1"),
        ], where
        gpus = [_driven_gpu(r, vendor) for r in train]
        assert gpus == ["0", "1", "0", "1"], f"{vendor}: ranks drive GPUs {gpus}"
        for rec in train:
            assert rec["argv"][rec["argv"].index("--device") + 1] == "cuda", rec["argv"]
        (one,) = evaluate
        assert _driven_gpu(one, vendor) in ("0", "1") and "--eval-only" in one["argv"]


@batched("test_slurm_2nodes_scaling_places_each_point_on_its_nodes", nodes=2, seconds=50)
def _scaling(tmp_path, data):
    slurm_data = data
    out = tmp_path / "scaling"
    script = tmp_path / "scaling.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --job-name=scaling_2nodes\n#SBATCH --nodes=2\n"
        "#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=1\n"
        f"exec {sys.executable} {SCALING} --launcher srun --ranks 2 4 --modes weak --batch-size 2 "
        f"--max-steps 4 --active 1 --device cpu --data-dir {slurm_data} --out {out} "
        f"-- {' '.join(SMALL_MODEL)}\n"  # placement: any model will do
    )
    run_root = tmp_path / "runs"
    return sbatch(str(script), env=job_env(run_root, slurm_data), run_root=run_root), out


def test_slurm_2nodes_scaling_places_each_point_on_its_nodes(two_nodes, batch, request):
    """scaling.py --launcher srun inside a 2-node x 2-task allocation: the 2-rank point on one node,
    the 4-rank point on both, as its table's nodes column says, by the program's own report."""
    first, second = two_nodes
    job, out = batch[request.node.name]
    wait(job, timeout=600)
    job.assert_completed()
    rows = json.loads((out / "scaling.json").read_text())["data"]["modes"]["weak"]
    assert [(r["ranks"], r["nodes"]) for r in rows] == [(2, 1), (4, 2)], rows
    for row, expected in zip(
        rows, ({0: first, 1: first}, {0: first, 1: first, 2: second, 3: second})
    ):
        ran = report_lines((out / f"weak_{row['ranks']}ranks" / "log.txt").read_text())
        assert {rank: r["host"] for rank, r in ran.items()} == expected, ran
    assert re.search(
        r"^\s*mode\s+ranks\s+nodes\s", job.out.read_text(), re.M
    ), job.logs()  # the printed table


# --------------------------------------------------------------------------- faults
def _node_processes(node: str, jobid: str) -> tuple[int, list[int]]:
    """The slurmd of `node` (a process of the test cluster) and every process of job `jobid` there.

    Each node's slurmd runs in its own UTS namespace (slurm/ci/start_cluster.sh): the node's
    processes are the ones in that namespace."""
    pidfile = CI_ROOT / "run" / f"slurmd-{node}.pid"
    if not pidfile.is_file():
        pytest.skip(f"{pidfile} not found: not the test cluster of slurm/ci/start_cluster.sh")
    slurmd = int(pidfile.read_text())
    namespace = os.readlink(f"/proc/{slurmd}/ns/uts")
    mine = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == slurmd:
            continue
        try:
            if os.readlink(proc / "ns" / "uts") != namespace:
                continue
            environ = (proc / "environ").read_bytes().split(b"\0")
            title = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"SLURM_JOB_ID={jobid}".encode() in environ or f"[{jobid}.".encode() in title:
            mine.append(int(proc.name))
    return slurmd, mine


def _seconds_until_it_leaves_running(job, since: float, timeout: float) -> float:
    """Seconds from `since` until the job has ended for its user: its batch script is done (srun
    said "Node failure"), the lost node is DOWN, and the job is COMPLETING or ended. slurmctld
    can take seconds more to move it from COMPLETING to NODE_FAIL: in one make test on the loaded
    2-core machine the script ended at most 25 s after the kill and `scontrol` showed the job
    ended 11 s after that (the test then failed at 36 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job.state, job.exit_code = job_state(job.id)
        if job.state == "COMPLETING" or job.state in TERMINAL:
            return time.monotonic() - since
        time.sleep(0.25)
    pytest.fail(f"job {job.id} still RUNNING {timeout:.0f} s after its node was lost\n{job.logs()}")


@pytest.mark.skipif(
    os.geteuid() != 0, reason="kills and restarts a slurmd of the test cluster: needs root"
)
def test_slurm_2nodes_node_lost_mid_epoch_then_resume_on_one_node(
        two_nodes, slurm_data, tmp_path, batch):
    """The second node dies in the middle of epoch 2 (its slurmd and the job's tasks there killed):
    the job ends within 30 s (its script is done), one line names the rank and its node, the
    checkpoint of epoch 1 is whole and nothing else is written; 06_exact_metrics.sbatch --resume
    on one node continues from it."""
    first, second = two_nodes
    for other in _jobs_in(batch):  # the session's other jobs must not be on the node that dies
        if other.state not in TERMINAL:
            wait(other, timeout=900)
    run_root = tmp_path / "runs"
    env = job_env(run_root, slurm_data)
    job = sbatch(
        "07_failures_2nodes.sbatch", "--epochs", "30", "--batch-size", "2", env=env,
        run_root=run_root
    )
    checkpoint = job.run_dir / "checkpoint.pt"
    restart = None
    try:
        try:
            deadline = time.monotonic() + 240
            while not checkpoint.exists():  # epoch 1 done: the ranks are in epoch 2
                job.state, _ = job_state(job.id)
                assert job.state not in ("COMPLETED", "FAILED", "CANCELLED"), job.logs()
                assert time.monotonic() < deadline, f"no checkpoint after 240 s\n{job.logs()}"
                time.sleep(0.1)
            slurmd, tasks = _node_processes(second, job.id)
            assert tasks, f"no process of job {job.id} on {second}"
            lost = time.monotonic()
            for pid in [slurmd, *tasks]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            took = _seconds_until_it_leaves_running(job, lost, timeout=60)
        finally:
            # The node comes back (start_cluster.sh starts the missing slurmd, resumes the node)
            # while the resumed job runs on the node that is left: both at once.
            restart = subprocess.Popen([str(SLURM_DIR / "ci" / "start_cluster.sh")],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _check_lost_job(job, took, second)
        # Resubmitted as a user would once the script is done: it starts on the node that is left
        # while slurmctld still settles the lost node's share of the old job (COMPLETING: up to
        # 11 s in one make test), not after.
        resumed = sbatch(
            "06_exact_metrics.sbatch", "--out", str(job.run_dir), "--resume", "--epochs", "2",
            "--batch-size", "2", env=env, run_root=run_root,
        )
        try:
            wait(job, timeout=60)
            assert job.state in ("NODE_FAIL", "FAILED"), job.logs()
            _check_resumed(wait(resumed, timeout=400), job, first, second)
        finally:  # a failed check must not leave the resumed job in the way of the next tests
            if resumed.state not in TERMINAL:
                subprocess.run(["scancel", resumed.id], capture_output=True, timeout=30)
    finally:
        if restart is not None:
            _, err = restart.communicate(timeout=120)
            assert restart.returncode == 0, err


def _check_lost_job(job, took, second):
    """What the user finds once the lost job's script is done (before anything is resubmitted)."""
    assert took <= 30, f"the job took {took:.0f} s to end after {second} was lost\n{job.logs()}"
    failure = f"srun: error: Node failure on {second}"
    deadline = time.monotonic() + 10  # srun's last lines, printed as it ends
    while failure not in job.err.read_text() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert failure in job.err.read_text(), job.logs()
    errors = all_error_lines(job.out.read_text() + job.err.read_text())
    assert len(errors) == 1, job.logs()
    assert re.fullmatch(
        rf"error: rank [23] stopped responding .* its node {second} did; stopped all 4 ranks",
        errors[0],
    ), errors
    # the line exercise 07's README shows for a lost node is the one the job printed (the
    # seconds and the rank aside: rank 1 names rank 2, the first rank on the lost node)
    quoted = quoted_lost_node_line()
    same = [re.sub(r"rank \d+ stopped|for \d+ s\)", "", line) for line in (errors[0], quoted)]
    assert same[0] == same[1], f"exercise 07's README quotes\n  {quoted}\nthe job printed\n  {errors[0]}"
    written = {p.name for p in job.run_dir.iterdir()} - {
        "job.txt",
        "slurm.out",
        "slurm.err",
    }  # common.sh's
    assert written == {"checkpoint.pt"}, f"half-written or unexpected files: {sorted(written)}"
    state = torch.load(job.run_dir / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 1 and state["world_size"] == 4


README_07 = REPO / "exercises" / "07_failures" / "README.md"
LOST_NODE_MARK = "<!-- a lost node: tests/test_slurm_2nodes.py compares this block's error line with the job's -->"


def quoted_lost_node_line() -> str:
    """The `error:` line exercise 07's README shows for a node lost under Slurm."""
    text = README_07.read_text()
    assert LOST_NODE_MARK in text, f"{README_07} lost its lost-node block ({LOST_NODE_MARK})"
    block = text.split(LOST_NODE_MARK, 1)[1].split("```", 2)[1]
    return next(line for line in block.splitlines() if line.startswith("error: "))


def _check_resumed(resumed, job, first, second):
    resumed.assert_completed()
    log = resumed.out.read_text()
    checkpoint = job.run_dir / "checkpoint.pt"
    assert f"Resuming from {checkpoint} after epoch 1 (trained with 4 rank(s), now 2)" in log, log
    metrics = json.loads((job.run_dir / "metrics.json").read_text())
    assert [h["epoch"] for h in metrics["history"]] == [1, 2] and metrics["world_size"] == 2
    assert set(report_lines(log)) == {0, 1} and {r["host"] for r in report_lines(log).values()} <= {
        first,
        second,
    }


def test_slurm_2nodes_rank_that_cannot_reach_the_rendezvous_is_one_line(
    two_nodes, slurm_data, tmp_path
):
    """Rank 1 (on the second node) looks for the rendezvous on a closed port of the first node:
    every rank stops with one line of its own within --timeout, instead of hanging."""
    first, _ = two_nodes
    timeout = 5
    wrapper = '[ "$SLURM_PROCID" = 1 ] && export MASTER_ADDR=' + first + ' MASTER_PORT=9; exec "$@"'
    env = job_env(tmp_path / "runs", slurm_data)
    started = time.monotonic()
    r = subprocess.run(
        [
            "srun",
            "--time=3",
            "-N",
            "2",
            "-n",
            "2",
            "--kill-on-bad-exit=0",
            "bash",
            "-c",
            wrapper,
            "-",
            sys.executable,
            DDP,
            "--data-dir",
            str(slurm_data),
            "--out",
            str(tmp_path / "out"),
            "--epochs",
            "1",
            "--bind",
            "none",
            "--timeout",
            str(timeout),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    took = time.monotonic() - started
    errors = all_error_lines(r.stderr)
    assert r.returncode != 0 and len(errors) == 2, r.stderr[-3000:]
    assert sorted(e.split()[2] for e in errors) == [
        "0",
        "1",
    ], errors  # "error: rank R cannot join ..."
    assert all("cannot join the other ranks" in e for e in errors), errors
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "checkpoint.pt").exists()
    # torch import and start-up on a loaded 2-core machine take a while; the wait is --timeout
    assert took < timeout + 60, f"{took:.0f} s"


def test_slurm_2nodes_unresolvable_rendezvous_host_is_one_line(tmp_path):
    """A node list whose first host does not resolve: one line naming the host, exit 2, before any
    waiting (the real program, in the environment srun gives a rank)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "MASTER_", "RANK", "WORLD_"))
    }
    env.update(
        SLURM_JOB_ID="4242",
        SLURM_STEP_ID="0",
        SLURM_PROCID="1",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_LOCALID="0",
        SLURM_NODEID="1",
        SLURM_STEP_TASKS_PER_NODE="1(x2)",
        SLURM_STEP_NODELIST="nosuchnode[7-8]",
        SLURM_JOB_NODELIST="nosuchnode[7-8]",
    )
    r = subprocess.run(
        [sys.executable, DDP, "--out", str(tmp_path / "out"), "--bind", "none", "--timeout", "600"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert error_lines(r.stderr) == [
        line for line in r.stderr.splitlines() if line.strip()
    ], r.stderr
    (line,) = error_lines(r.stderr)
    assert "'nosuchnode7'" in line and "does not resolve" in line, line


def test_slurm_2nodes_two_jobs_at_once_do_not_meet_and_steps_take_new_ports(two_nodes, tmp_path):
    """Two 2-node jobs running at the same time on the same nodes, each with two rendezvous steps
    one after the other (python -m wellfno.launch: the rendezvous every program uses): every step's
    ranks meet only their own job's, each on both nodes, and no step reuses another's port."""
    first, second = two_nodes
    run_root = tmp_path / "runs"
    gate = tmp_path / "gate"
    gate.mkdir()
    script = tmp_path / "meet.sbatch"
    # Both jobs start their steps only once both run (a gate in a shared folder): they overlap.
    script.write_text(f"""#!/bin/bash
#SBATCH --job-name=meet
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
touch {gate}/$SLURM_JOB_ID
for _ in $(seq 600); do [ "$(ls {gate} | wc -l)" -ge 2 ] && break; sleep 0.2; done
srun {sys.executable} -m wellfno.launch --timeout 60
srun {sys.executable} -m wellfno.launch --timeout 60
""")
    env = job_env(run_root, tmp_path)
    jobs = [sbatch(str(script), env=env, run_root=run_root) for _ in range(2)]
    for job in jobs:
        wait(job, timeout=300)
        job.assert_completed()
    seen = []
    for job in jobs:
        lines = re.findall(
            r"^rendezvous (\S+):(\d+) \(srun, job (\d+)\): (.*)$", job.out.read_text(), re.M
        )
        assert len(lines) == 2, job.logs()
        for host, port, jobid, who in lines:
            assert host == first and jobid == job.id, (job.id, host, jobid)
            assert (
                who
                == f"2 ranks met on 2 node(s): {first}: ranks 0(local 0); "
                f"{second}: ranks 1(local 0)"
            ), who
            seen.append(int(port))
    assert len(set(seen)) == 4, f"two steps shared a port: {seen}"


def test_slurm_2nodes_job_needing_more_nodes_than_the_partition_is_one_line(
    two_nodes, slurm_data, tmp_path
):
    """submit_all.sh with a job that asks for more nodes than the partition has: one line saying
    what the job needs, exit 2, nothing submitted (sbatch would leave it pending forever)."""
    root = tmp_path / "copy"
    shutil.copytree(SLURM_DIR, root / "slurm")
    script = root / "slurm" / "07_failures_2nodes.sbatch"
    script.write_text(
        re.sub(r"^#SBATCH --nodes=2$", "#SBATCH --nodes=3", script.read_text(), flags=re.M)
    )
    env = job_env(tmp_path / "runs", slurm_data, WELLFNO_ROOT=str(root))
    r = subprocess.run(
        [str(root / "slurm" / "submit_all.sh"), "--with-2nodes", "07_failures_2nodes"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and not re.search(r"^\d+\s", r.stdout, re.M), r.stdout + r.stderr
    (line,) = error_lines(r.stderr)
    assert re.fullmatch(
        r"error: 07_failures_2nodes needs 3 nodes, but partition '\w+' has 2: .*", line
    ), line


def test_slurm_2nodes_submit_all_asks_for_both_nodes(tmp_path):
    """submit_all.sh --dry-run on a GPU site: the two-node script's nodes are kept (--nodes=2), with
    GPUS_PER_NODE tasks on each (--ntasks-per-node beside --ntasks, which alone would only be a
    per-node maximum next to the script's #SBATCH --ntasks-per-node)."""
    env = job_env(
        tmp_path / "runs", tmp_path / "data", GPU_VENDOR="amd", GPUS_PER_NODE="8", CPUS_PER_GPU="7"
    )
    r = subprocess.run(
        [str(SLURM_DIR / "submit_all.sh"), "--dry-run", "--with-2nodes", "05", "07"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    cmds = {
        Path(next(x for x in c.split() if x.endswith(".sbatch"))).stem: c.split()
        for c in r.stdout.splitlines()
        if c.startswith("sbatch ")
    }
    opts = {
        name: {o.split("=")[0]: o.split("=", 1)[1] for o in c if o.startswith("--") and "=" in o}
        for name, c in cmds.items()
    }
    assert {
        k: opts["07_failures_2nodes"][k]
        for k in ("--nodes", "--ntasks", "--ntasks-per-node", "--gpus-per-node")
    } == {"--nodes": "2", "--ntasks": "16", "--ntasks-per-node": "8", "--gpus-per-node": "8"}
    assert {k: opts["05_ddp"][k] for k in ("--nodes", "--ntasks", "--ntasks-per-node")} == {
        "--nodes": "1",
        "--ntasks": "8",
        "--ntasks-per-node": "8",
    }
