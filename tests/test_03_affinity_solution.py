"""Solution 03: fno.py binds its rank and its DataLoader workers and reports where they run.

Check your own script:  .venv/bin/python -m pytest -q tests/test_03_affinity_solution.py --script fno.py

Without --script it checks solution 03 and every later solution (tests/conftest.py: STEPS).
Each failure is one sentence naming the task of exercises/03_affinity/README.md that fixes it
(tests/checks.py).
"""
import os
import re

import pytest

from tests.checks import last_error_line, require, require_run, task
from tests.conftest import call_main, run_script
from wellfno.cli import UserError

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
    for rank, proc in enumerate(procs):
        stdout, stderr = proc.communicate(timeout=300)
        require(proc.returncode == 0, f"rank {rank} of 2 with --bind exclusive exited {proc.returncode}: "
                f"{last_error_line(stderr)}; add --bind and bind_this_rank {task('03', 3)}")
        lines.append([line for line in stdout.splitlines() if line.startswith("host=")])
    return lines


def rank_line(lines, who: str) -> str:
    found = [line for line in lines if "worker=-" in line]
    require(found, f"{who} printed no report line (host=... worker=- cpus=...): print report_line(device=device) "
            f"once per rank {task('03', 3)}")
    return found[0]


@pytest.mark.slow  # two ranks, each a whole training run
@needs_two_cpus
def test_each_rank_is_bound_to_its_own_cores(script, tiny_data_dir, tmp_path):
    rank_cpus = []
    for rank, lines in enumerate(run_ranks(script, tiny_data_dir, tmp_path / "run")):
        rank_cpus.append(cpus_in(rank_line(lines, f"rank {rank}")))
    shared = rank_cpus[0] & rank_cpus[1]
    require(rank_cpus[0] and rank_cpus[1] and not shared,
            f"two ranks with --bind exclusive share {len(shared)} CPUs (allowed: none): call bind_this_rank "
            f"before anything else {task('03', 3)}")
    outside = (rank_cpus[0] | rank_cpus[1]) - set(ALLOWED)
    require(not outside, f"the ranks run on {len(outside)} CPUs this process may not use (allowed: none): never "
            f"widen the launcher's CPUs {task('03', 3)}")


@pytest.mark.slow  # a whole run with two workers in a child process
@needs_two_cpus
def test_workers_are_spread_over_the_rank_cores(script, tiny_data_dir, tmp_path):
    result = run_script(script, "--data-dir", tiny_data_dir, "--out", tmp_path / "w", "--epochs", "1",
                        "--max-steps", "1", "--batch-size", "8", "--num-workers", "2", "--report-workers")
    require_run(result, "a run with --num-workers 2 --report-workers", f"add --report-workers {task('03', 3)}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("host=")]
    rank_cpus = cpus_in(rank_line(lines, "the rank"))
    workers = {}
    for line in lines:
        match = re.search(r"worker=(\d+)", line)
        if match:
            workers[int(match.group(1))] = cpus_in(line)
    require(set(workers) == {0, 1}, f"{len(workers)} of 2 workers printed a report line (allowed: 2): "
            f"worker_init_fn(cpus, report=True) with --report-workers {task('03', 3)}")
    shared = workers[0] & workers[1]
    require(workers[0] and workers[1] and not shared,
            f"the two workers share {len(shared)} CPUs (allowed: none): give both DataLoaders "
            f"worker_init_fn=worker_init_fn(cpus) {task('03', 3)}")
    require(workers[0] | workers[1] <= rank_cpus, f"a worker runs outside its rank's CPUs: use the cpus "
            f"bind_this_rank returned {task('03', 3)}")


def test_an_unknown_binding_mode_is_refused(script_module, tmp_path, capsys):
    later = None  # a UserError of the script's own, after argparse let the mode through
    try:
        call_main(script_module, "--out", tmp_path / "out", "--bind", "everywhere")
    except SystemExit as exit_info:
        code = exit_info.code
    except UserError as err:
        code, later = 1, str(err).splitlines()[0]
    else:
        code = 0
    said = capsys.readouterr().err
    require(later is None, f"--bind everywhere got past argparse and stopped later ({later}): add "
            f"--bind with the choices exclusive, node, core-complex, none {task('03', 3)}")
    # "invalid choice" is argparse refusing a value of a known option; a script without --bind says
    # "unrecognized arguments" instead
    require(code == 2 and "--bind" in said and "invalid choice" in said,
            f"--bind everywhere: {last_error_line(said)} (allowed: argparse's `invalid choice`): add --bind "
            f"with the choices exclusive, node, core-complex, none {task('03', 3)}")
    require(not (tmp_path / "out").exists(), f"--bind everywhere left an output folder {task('03', 3)}")
