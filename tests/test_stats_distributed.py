"""Exercise 04: the distributed statistics equal the serial ones for any world size and launcher.

Check your own script (it must take DATASET_DIR --out FILE and run under torchrun and srun):

    .venv/bin/python -m pytest -q tests/test_stats_distributed.py --script exercises/04_distributed_stats/stats_parallel.py

(`STATS_SCRIPT=path` in the environment does the same.) Launches real process groups (gloo on
loopback): torchrun and srun-style SLURM_* variables with 1-4 ranks, two torchrun agents as two
"nodes", and ranks that fail. Every multi-rank run also logs how much each rank read, to check
that the work was split, not repeated.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
import yaml

import wellfno.stats as S
from tests.test_stats import TINY_CHUNK_MB, make_dataset, reference_stats, without_loss_weight

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "04_distributed_stats" / "stats.py"
SCRIPT = Path(os.environ.get("STATS_SCRIPT", SOLUTION)).resolve()
IS_SOLUTION = SCRIPT == SOLUTION.resolve()
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# The reference solution accepts --chunk-mb (several items per trajectory here); a participant's may not.
CHUNK_ARGS = ["--chunk-mb", str(TINY_CHUNK_MB)] if IS_SOLUTION else []
TIMEOUT = 120
# Every test here starts real processes (one torch import each: 10-40 s on a busy 2-core machine).
pytestmark = pytest.mark.slow

STARTER = ROOT / "exercises" / "04_distributed_stats" / "stats_parallel.py"

# Watch the script under test without touching it: Python imports sitecustomize from
# PYTHONPATH at startup, in every rank. It can make one rank's field reads fail or kill the
# rank (STATS_FAIL_MODE=raise|die, STATS_FAIL_RANK), log how many values each rank read
# (STATS_READ_LOG=dir), and make torch claim GPUs (STATS_FAKE_GPUS=n: `--backend auto` must
# still choose gloo, since the statistics are CPU work).
SITECUSTOMIZE = '''
import os
_rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID"))
_mode = os.environ.get("STATS_FAIL_MODE")
_log = os.environ.get("STATS_READ_LOG")
if os.environ.get("STATS_FAKE_GPUS"):
    import torch
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: int(os.environ["STATS_FAKE_GPUS"])
if _log or (_mode and _rank == os.environ.get("STATS_FAIL_RANK")):
    import atexit, h5py
    _read = h5py.Dataset.__getitem__
    _values = [0]
    def _watched(self, index):
        if "_fields/" in self.name and _mode and _rank == os.environ.get("STATS_FAIL_RANK"):
            if _mode == "die":
                os._exit(9)  # like a node lost or the OOM killer: no message, no cleanup
            raise OSError("injected read error")
        out = _read(self, index)
        if "_fields/" in self.name:
            _values[0] += getattr(out, "size", 1)
        return out
    h5py.Dataset.__getitem__ = _watched
    if _log:
        def _write_log():
            with open(os.path.join(_log, f"rank{_rank}.txt"), "w") as f:
                f.write(str(_values[0]))
        atexit.register(_write_log)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC",
                                "STATS_FAIL", "STATS_READ", "STATS_FAKE"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="ERROR", **extra)
    return env


@pytest.fixture(scope="module")
def inject_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("inject")
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return folder


def count_values(dataset: Path) -> int:
    """Numbers in the train split's fields (what one pass over the data reads)."""
    sizes = []
    for path in (dataset / "data" / "train").glob("*.hdf5"):
        with h5py.File(path) as f:
            f.visititems(lambda name, obj: sizes.append(obj.size)
                         if isinstance(obj, h5py.Dataset) and "_fields/" in name else None)
    return sum(sizes)


def read_per_rank(log_dir: Path, world: int) -> list[int]:
    files = [log_dir / f"rank{r}.txt" for r in range(world)]
    assert all(f.is_file() for f in files), f"no read log from some rank in {log_dir}"
    return [int(f.read_text()) for f in files]


def check_split(log_dir: Path, world: int, dataset: Path) -> None:
    """The work was split: together the ranks read the split about once, not world times."""
    reads, total = read_per_rank(log_dir, world), count_values(dataset)
    # one frame of overlap per work item is re-read (the delta into the item's first frame)
    assert sum(reads) <= 1.5 * total, (f"the {world} ranks read {sum(reads)} values of a split of {total}: "
                                       f"every rank reads everything; give each rank only its share (TODO 1)")
    assert max(reads) <= 0.75 * total, f"one rank read {max(reads)} of {total} values: the work is not split"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("dist_ds"))


@pytest.fixture(scope="module")
def serial(dataset, tmp_path_factory) -> tuple[dict, bytes]:
    out = tmp_path_factory.mktemp("serial") / "stats.yaml"
    r = subprocess.run([sys.executable, "stats.py", dataset, "--out", out, *CHUNK_ARGS], cwd=ROOT,
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    stats = yaml.safe_load(out.read_text())
    # the serial result is itself right (independent float64 numpy reference)
    assert S.max_relative_difference(without_loss_weight(stats), reference_stats(dataset)) <= 1e-10
    return stats, out.read_bytes()


def check_equal(out: Path, serial) -> None:
    stats, raw = serial
    got = yaml.safe_load(out.read_text())
    assert S.max_relative_difference(got, stats) <= 1e-12
    if IS_SOLUTION:  # the fixed merge tree makes the reference solution bitwise equal to serial
        assert out.read_bytes() == raw


def torchrun(dataset, out, nproc, *extra, env=None):
    cmd = [*TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", str(SCRIPT), str(dataset), "--out", str(out),
           *CHUNK_ARGS, *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env or base_env(), capture_output=True, text=True, timeout=TIMEOUT)


def srun_like(dataset, out, ntasks, *extra, env_extra=None, timeout=TIMEOUT, script=None):
    """Start ntasks processes with the variables srun sets for one step on one node (localhost)."""
    port = free_port()
    procs = []
    for rank in range(ntasks):
        env = base_env(SLURM_PROCID=str(rank), SLURM_NTASKS=str(ntasks), SLURM_STEP_NUM_TASKS=str(ntasks),
                       SLURM_LOCALID=str(rank), SLURM_NODEID="0", SLURM_STEP_TASKS_PER_NODE=str(ntasks),
                       SLURM_JOB_NODELIST="localhost", SLURM_STEP_NODELIST="localhost", SLURM_JOB_ID="4242",
                       SLURM_STEP_ID="0", MASTER_PORT=str(port), **(env_extra or {}))
        procs.append(subprocess.Popen([sys.executable, str(script or SCRIPT), str(dataset), "--out", str(out),
                                       *CHUNK_ARGS, *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"a rank hung for more than {timeout} s")
        results.append((p.returncode, stdout, stderr))
    return results


def injected(inject_dir: Path, **variables) -> dict:
    """Environment that loads the sitecustomize above, ahead of whatever PYTHONPATH was."""
    path = os.pathsep.join(filter(None, [str(inject_dir), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, **variables}


# Each world size once, launchers alternating (a torch import per process is the cost on 2 cores).
# The srun run with 2 ranks also pretends that the node has 4 GPUs: `--backend auto` must still mean gloo.
@pytest.mark.parametrize("launcher, world", [("python", 1), ("srun", 2), ("torchrun", 3), ("srun", 4)])
def test_world_sizes_equal_serial(dataset, serial, tmp_path, inject_dir, launcher, world):
    out, log = tmp_path / "stats.yaml", tmp_path / "reads"
    log.mkdir()
    variables = injected(inject_dir, STATS_READ_LOG=str(log), **({"STATS_FAKE_GPUS": "4"} if world == 2 else {}))
    if launcher == "torchrun":
        r = torchrun(dataset, out, world, env=base_env(**variables))
        assert r.returncode == 0, r.stderr[-3000:]
    elif launcher == "srun":
        results = srun_like(dataset, out, world, env_extra=variables)
        assert [rc for rc, _, _ in results] == [0] * world, [err[-1500:] for _, _, err in results]
    else:
        r = subprocess.run([sys.executable, str(SCRIPT), str(dataset), "--out", str(out), *CHUNK_ARGS], cwd=ROOT,
                           env=base_env(), capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
    check_equal(out, serial)
    if world > 1:
        check_split(log, world, dataset)


def test_two_torchrun_agents_as_two_nodes(dataset, serial, tmp_path):
    port = free_port()
    out = tmp_path / "stats.yaml"
    agents = [subprocess.Popen([*TORCHRUN, "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1",
                                "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=stats2",
                                str(SCRIPT), str(dataset), "--out", str(out), *CHUNK_ARGS],
                               cwd=ROOT, env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for node in (0, 1)]
    outputs = [a.communicate(timeout=TIMEOUT) for a in agents]
    assert all(a.returncode == 0 for a in agents), "\n".join(err[-2000:] for _, err in outputs)
    check_equal(out, serial)


def test_missing_dataset_fails_on_every_rank_without_output(tmp_path):
    out = tmp_path / "out" / "stats.yaml"
    results = srun_like(tmp_path / "nowhere", out, 2)
    assert all(rc != 0 for rc, _, _ in results)
    assert "nowhere" in "".join(err for _, _, err in results) and not out.exists()
    assert "Traceback" not in "".join(err for _, _, err in results)


def one_line_naming(results, rank: int, world: int) -> str:
    lines = [line for _, _, err in results for line in err.splitlines() if line.endswith(f"stopped all {world} ranks")]
    assert len(lines) == 1, "expected one line that names the failed rank:\n" + "".join(e for _, _, e in results)
    assert lines[0].startswith(f"error: rank {rank} "), lines[0]
    return lines[0]


@pytest.mark.parametrize("mode", ["raise", "die"])
def test_a_rank_that_fails_or_dies_stops_every_rank(dataset, tmp_path, inject_dir, mode):
    """Rank 1's reads fail (or it dies without a word): every rank ends soon, one line names rank 1."""
    out = tmp_path / "stats.yaml"
    started = time.monotonic()
    results = srun_like(dataset, out, 2, env_extra=injected(inject_dir, STATS_FAIL_MODE=mode, STATS_FAIL_RANK="1"),
                        timeout=90)
    elapsed = time.monotonic() - started
    assert results[0][0] == 1, results[0][2][-1500:]
    line = one_line_naming(results, 1, 2)
    if mode == "raise":
        assert results[1][0] != 0 and "injected read error" in line
    else:
        assert results[1][0] == 9 and "stopped responding" in line  # the injected death
    assert not out.exists() and not list(out.parent.glob(".stats.yaml.*"))
    # process start-up (torch import) on a busy 2-core machine, plus the 10 s of silence that means death
    assert elapsed < 60


@pytest.mark.skipif(not IS_SOLUTION, reason="checks the exercise's own files")
def test_check_your_work_fails_the_starter_and_passes_a_finished_copy(tmp_path):
    """The check-your-work command on the untouched starter fails; on a participant's finished file it passes."""
    finished = tmp_path / "my_stats.py"
    shutil.copy(SOLUTION, finished)  # a participant's own file, somewhere else, without --chunk-mb in the test

    def check(script):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/test_stats_distributed.py", "--script", str(script),
                               "-k", "world_sizes_equal_serial and torchrun"],
                              cwd=ROOT, env={k: v for k, v in base_env().items() if k != "STATS_SCRIPT"},
                              capture_output=True, text=True, timeout=600)

    r = check(STARTER)
    assert r.returncode == 1 and "every rank reads everything" in r.stdout, r.stdout[-3000:]
    r = check(finished)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:]
