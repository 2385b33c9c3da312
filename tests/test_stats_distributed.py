"""Exercise 04: the distributed statistics equal the serial ones for any world size and launcher.

Check your own script (it must take DATASET_DIR --out FILE and run under torchrun and srun):

    STATS_SCRIPT=exercises/04_distributed_stats/my_stats.py .venv/bin/python -m pytest -q tests/test_stats_distributed.py

Launches real process groups (gloo on loopback): torchrun with 1-4 workers, two torchrun
agents as two "nodes", srun-style SLURM_* variables, and ranks that fail.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import wellfno.stats as S
from test_stats import TINY_CHUNK_MB, make_dataset, reference_stats, without_loss_weight

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "04_distributed_stats" / "stats.py"
SCRIPT = Path(os.environ.get("STATS_SCRIPT", SOLUTION)).resolve()
IS_SOLUTION = SCRIPT == SOLUTION.resolve()
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# The reference solution accepts --chunk-mb (several items per trajectory here); a participant's may not.
CHUNK_ARGS = ["--chunk-mb", str(TINY_CHUNK_MB)] if IS_SOLUTION else []
TIMEOUT = 120

# Make one rank fail while it reads field data, without touching the script under test:
# Python imports sitecustomize from PYTHONPATH at startup, in every worker.
FAULT_INJECTOR = '''
import os
_mode = os.environ.get("STATS_FAIL_MODE")
_rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID"))
if _mode and _rank == os.environ.get("STATS_FAIL_RANK"):
    import h5py
    _read = h5py.Dataset.__getitem__
    def _broken(self, index):
        if "_fields/" in self.name:
            if _mode == "die":
                os._exit(9)  # like a node lost or the OOM killer: no message, no cleanup
            raise OSError("injected read error")
        return _read(self, index)
    h5py.Dataset.__getitem__ = _broken
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


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


def srun_like(dataset, out, ntasks, *extra, env_extra=None, timeout=TIMEOUT):
    """Start ntasks processes with the variables srun sets (one node: localhost)."""
    port = free_port()
    procs = []
    for rank in range(ntasks):
        env = base_env(SLURM_PROCID=str(rank), SLURM_NTASKS=str(ntasks), SLURM_LOCALID=str(rank),
                       SLURM_JOB_NODELIST="localhost", SLURM_JOB_ID="4242", MASTER_PORT=str(port),
                       **(env_extra or {}))
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), str(dataset), "--out", str(out),
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


# Each world size once, launchers alternating (a torch import per process is the cost on 2 cores).
@pytest.mark.parametrize("launcher, world", [("python", 1), ("srun", 2), ("torchrun", 3), ("srun", 4)])
def test_world_sizes_equal_serial(dataset, serial, tmp_path, launcher, world):
    out = tmp_path / "stats.yaml"
    if launcher == "torchrun":
        r = torchrun(dataset, out, world)
        assert r.returncode == 0, r.stderr[-3000:]
    elif launcher == "srun":
        results = srun_like(dataset, out, world)
        assert [rc for rc, _, _ in results] == [0] * world, [err[-1500:] for _, _, err in results]
    else:
        r = subprocess.run([sys.executable, str(SCRIPT), str(dataset), "--out", str(out), *CHUNK_ARGS], cwd=ROOT,
                           env=base_env(), capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
    check_equal(out, serial)


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


def test_a_rank_that_fails_stops_every_rank(dataset, tmp_path):
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(FAULT_INJECTOR)
    out = tmp_path / "stats.yaml"
    started = time.monotonic()
    results = srun_like(dataset, out, 2, env_extra={"PYTHONPATH": str(tmp_path / "inject"),
                                                    "STATS_FAIL_MODE": "raise", "STATS_FAIL_RANK": "1"}, timeout=60)
    assert all(rc != 0 for rc, _, _ in results), [(rc, err[-500:]) for rc, _, err in results]
    assert "injected read error" in "".join(err for _, _, err in results)
    assert not out.exists() and time.monotonic() - started < 60


@pytest.mark.skipif(not IS_SOLUTION, reason="uses the reference solution's --timeout option")
def test_a_rank_that_dies_silently_stops_every_rank_within_the_timeout(dataset, tmp_path):
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(FAULT_INJECTOR)
    out = tmp_path / "stats.yaml"
    started = time.monotonic()
    results = srun_like(dataset, out, 2, "--timeout", "2",
                        env_extra={"PYTHONPATH": str(tmp_path / "inject"), "STATS_FAIL_MODE": "die",
                                   "STATS_FAIL_RANK": "1"}, timeout=60)
    assert results[1][0] == 9  # the injected death
    assert all(rc != 0 for rc, _, _ in results), [(rc, err[-500:]) for rc, _, err in results]
    assert not out.exists() and time.monotonic() - started < 30


@pytest.mark.skipif(not IS_SOLUTION, reason="unit test of the reference solution's node-list parser")
def test_first_host_of_slurm_node_lists():
    import importlib.util
    spec = importlib.util.spec_from_file_location("dist_stats", SOLUTION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.first_host("gpu[07-09,12],cpu1") == "gpu07"
    assert module.first_host("node001") == "node001"
    assert module.first_host("a1,b[2-3]") == "a1"
    assert module.first_host("r[1-2]-n[04-05]") == "r1-n04"
    assert module.first_host("nid[001234,001240-001250]") == "nid001234"
