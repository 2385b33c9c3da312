"""How `make test` runs the suite on two workers (pytest-xdist, `-n 2 --dist loadgroup`).

A nested pytest, with this suite's conftest as a plugin, on made-up tests (no cluster, no torch):
every `slurm` test runs on one worker, first, one after the other in file order (the local
cluster's jobs and tests/test_slurm*.py's module-scoped job batches expect that); every other
test of a file on one worker (its module-scoped fixtures made once); and `time by kind` is
printed once, by the controller, with each kind's count; without xdist it is printed too.
"""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

PROBE = '''
import os
import pytest

def note(name):
    with open(os.environ["PROBE_LOG"], "a") as log:
        log.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {name}\\n")

@pytest.mark.slurm
@pytest.mark.parametrize("n", range(4))
def test_job(n):
    note(f"{__name__}.job{n}")

@pytest.mark.parametrize("n", range(6))
def test_other(n):
    note(f"{__name__}.other{n}")
'''


def run_probe(tmp_path, *options) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    for name in ("test_a_probe.py", "test_b_probe.py"):
        (tmp_path / name).write_text(PROBE)
    log = tmp_path / "order.log"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PROBE_LOG=str(log), PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p",
                             "no:cacheprovider", "--rootdir", str(tmp_path), "-c", os.devnull,
                             *options, str(tmp_path)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result, [line.split() for line in log.read_text().splitlines()]


def test_slurm_tests_run_on_one_worker_in_file_order(tmp_path):
    result, ran = run_probe(tmp_path, "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder")
    jobs = [(worker, name) for worker, name in ran if ".job" in name]
    assert {worker for worker, _ in ran} <= {"gw0", "gw1"}
    assert len({worker for worker, _ in jobs}) == 1, f"slurm tests on several workers: {jobs}"
    assert [name for _, name in jobs] == [f"test_{f}_probe.job{n}" for f in "ab" for n in range(4)]
    assert [name for worker, name in ran if worker == jobs[0][0]][0] == "test_a_probe.job0"
    for module in ("test_a_probe", "test_b_probe"):
        workers = {worker for worker, name in ran if name.startswith(f"{module}.other")}
        assert len(workers) == 1, f"{module}'s tests ran on {sorted(workers)}"
    assert len(ran) == 20
    summary = [line for line in result.stdout.splitlines() if line.startswith("time by kind")]
    assert len(summary) == 1 and "other tests: 12 in" in summary[0] \
        and "slurm tests: 8 in" in summary[0] and "summed over 2 xdist workers" in summary[0], \
        result.stdout[-2000:]


def test_without_xdist_the_suite_runs_in_one_process(tmp_path):
    result, ran = run_probe(tmp_path, "-p", "no:xdist")
    assert {worker for worker, _ in ran} == {"main"} and len(ran) == 20
    assert "time by kind: other tests: 12 in" in result.stdout, result.stdout[-2000:]
    assert "xdist workers" not in result.stdout
