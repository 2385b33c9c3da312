"""Solution 03: fno.py binds its rank and its DataLoader workers and reports where they run.

Check your own script:  .venv/bin/python -m pytest -q tests/test_03_affinity_solution.py --script fno.py

Without --script it checks solution 03 and every later solution (tests/conftest.py: STEPS).
"""
import os
import re

import pytest

from tests.conftest import call_main, run_script

ALLOWED = sorted(os.sched_getaffinity(0))
STEP = "03_affinity"
needs_two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 CPUs to give two ranks different cores")


def cpus_in(line):
    """CPU set of a report line: 'cpus=0-1 (2)' -> {0, 1}."""
    text = re.search(r"cpus=([\d,\-]+)", line).group(1)
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def run_ranks(script, data_dir, out, world=2):
    """Start `world` ranks of one launch together, as torchrun would describe them (a later step's ranks
    meet through MASTER_ADDR/PORT; solution 03's train alone); return each rank's report lines."""
    import socket
    import subprocess

    from tests.conftest import PYTHON, REPO

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for rank in range(world):
        # no GPU: disjoint cores per rank
        env = {**os.environ, "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world), "RANK": str(rank),
               "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([PYTHON, str(script), "--data-dir", str(data_dir), "--out", str(out),
                                       "--epochs", "1", "--max-steps", "1", "--batch-size", "8", "--bind", "exclusive"],
                                      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    lines = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-2000:]
        lines.append([line for line in stdout.splitlines() if line.startswith("host=")])
    return lines


@pytest.mark.slow  # two ranks, each a whole training run
@needs_two_cpus
def test_each_rank_is_bound_to_its_own_cores(script, tiny_data_dir, tmp_path):
    rank_cpus = []
    for lines in run_ranks(script, tiny_data_dir, tmp_path / "run"):
        rank_line = next(line for line in lines if "worker=-" in line)
        rank_cpus.append(cpus_in(rank_line))
    assert rank_cpus[0] and rank_cpus[1] and not rank_cpus[0] & rank_cpus[1], rank_cpus
    assert rank_cpus[0] | rank_cpus[1] <= set(ALLOWED)


@pytest.mark.slow  # a whole run with two workers in a child process
@needs_two_cpus
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


def test_an_unknown_binding_mode_is_refused(script_module, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        call_main(script_module, "--out", tmp_path / "out", "--bind", "everywhere")
    assert exit_info.value.code == 2 and "--bind" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
