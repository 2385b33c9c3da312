"""Solution 03: fno.py binds its rank and its DataLoader workers and reports where they run.

Check your own script:  .venv/bin/python -m pytest -q tests/test_03_affinity_solution.py --script fno.py
"""
import os
import re

import pytest

from tests.conftest import run_script, script_under_test

ALLOWED = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 CPUs to give two ranks different cores")


@pytest.fixture
def script(request):
    return script_under_test(request, "solutions/03_affinity/fno.py")


def cpus_in(line):
    """CPU set of a report line: 'cpus=0-1 (2)' -> {0, 1}."""
    text = re.search(r"cpus=([\d,\-]+)", line).group(1)
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def run_rank(script, data_dir, out, local_rank, *extra):
    # Two ranks on this node, as torchrun would describe them; no GPU: disjoint cores per rank.
    env = {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": "2", "RANK": str(local_rank), "WORLD_SIZE": "2"}
    result = run_script(script, "--data-dir", data_dir, "--out", out, "--epochs", "1", "--max-steps", "1",
                        "--batch-size", "8", "--bind", "exclusive", *extra, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    return [line for line in result.stdout.splitlines() if line.startswith("host=")]


def test_each_rank_is_bound_to_its_own_cores(script, tiny_data_dir, tmp_path):
    rank_cpus = []
    for local_rank in (0, 1):
        lines = run_rank(script, tiny_data_dir, tmp_path / f"r{local_rank}", local_rank)
        rank_line = next(line for line in lines if "worker=-" in line)
        rank_cpus.append(cpus_in(rank_line))
    assert rank_cpus[0] and rank_cpus[1] and not rank_cpus[0] & rank_cpus[1], rank_cpus
    assert rank_cpus[0] | rank_cpus[1] <= set(ALLOWED)


def test_workers_are_spread_over_the_rank_cores(script, tiny_data_dir, tmp_path):
    result = run_script(script, "--data-dir", tiny_data_dir, "--out", tmp_path / "w", "--epochs", "1",
                        "--max-steps", "1", "--batch-size", "8", "--num-workers", "2", "--report-workers")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("host=")]
    rank_cpus = cpus_in(next(line for line in lines if "worker=-" in line))
    workers = {}
    for line in lines:
        match = re.search(r"worker=(\d+)", line)
        if match:
            workers[int(match.group(1))] = cpus_in(line)
    assert set(workers) == {0, 1}, lines
    assert workers[0] and workers[1] and not workers[0] & workers[1], "two workers must not share a core"
    assert workers[0] | workers[1] <= rank_cpus
