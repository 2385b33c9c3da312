"""Exercise 07: failures that end every rank: the watchdog and --timeout.

Check your own script:  .venv/bin/python -m pytest -q tests/test_07_failures.py --script YOUR_SCRIPT

As in tests/test_05_ddp.py, the ranks are separate CPU processes (gloo), started without torchrun
(tests/ddp_helpers.py `launch`): torchrun would stop the other ranks itself, and the lesson is what
the script does on its own. A probe makes rank 1 raise or die at its 2nd training sample.
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.checks import require, task, unknown_option
from tests.conftest import PYTHON, REPO, exit_of
from tests.ddp_helpers import SMALL, error_lines, free_port, launch, probe_env

STEP = "07_failures"  # the cross-step matrix (tests/conftest.py) supplies `script`
# rank 1 alone, with --timeout 5: the timeout and a busy machine's start-up (imports, data)
JOIN_ALLOWED = 90


@pytest.mark.slow
@pytest.mark.parametrize("how", ["raise", "die"])
def test_a_failing_rank_ends_every_rank_within_seconds(script, tiny_data_dir, tmp_path, how):
    """Rank 1 fails at its 2nd training sample; with --timeout 600 rank 0 must still end within seconds."""
    out = tmp_path / "run"
    started = time.monotonic()
    results = launch(script, 2, "--data-dir", tiny_data_dir, "--out", out, "--epochs", "3",
                     "--batch-size", "1",
                     "--timeout", "600", *SMALL, env=probe_env(fail=f"1:2:{how}"), timeout=240)
    elapsed = time.monotonic() - started
    require(elapsed < 120, f"rank 1 failed ({how}) and the job took {elapsed:.0f} s (allowed: "
            f"120): wrap train in the Watchdog {task('07', 2)}")
    codes = [rc for rc, _, _ in results]
    require(all(rc != 0 for rc in codes), f"rank 1 failed ({how}) and the ranks' exit codes were "
            f"{codes} (allowed: non-zero on every rank) {task('07', 2)}")
    require(not (out / "checkpoint.pt").exists() and not (out / "metrics.json").exists(),
            f"a failed job left checkpoint.pt or metrics.json: nothing half-written {task('07', 2)}")
    lines = error_lines(results[0][2])
    require(len(lines) == 1, f"rank 0 printed {len(lines)} `error:` lines (allowed: exactly one, "
            f"naming rank 1) {task('07', 2)}")
    # A rank that dies says nothing itself: the line must come from the watchdog, which names it
    # (a step-06 script's rank 0 prints gloo's error, naming no rank).
    require("rank 1" in lines[0], f"rank 0's `error:` line does not name rank 1, which failed "
            f"({how}): {lines[0][:200]} {task('07', 2)}")
    if how == "raise":
        require("injected failure" in lines[0],
                f"rank 0's error line does not give rank 1's error: {lines[0][:200]} "
                f"{task('07', 2)}")


def test_timeout_must_be_a_positive_number(script_module, tmp_path):
    result = exit_of(script_module, "--out", tmp_path / "o", "--timeout", "0")
    lines = error_lines(result.stderr)
    require(result.returncode == 2 and len(lines) == 1 and "positive" in lines[0],
            f"--timeout 0 ended with exit code {result.returncode} and {len(lines)} `error:` "
            f"line(s){': ' + repr(lines[0][:120]) if lines else ''} (allowed: exit code 2 and "
            f"exactly one `error:` line saying --timeout must be positive) {task('07', 1)}")


@pytest.mark.slow
def test_a_rank_that_cannot_join_is_one_line_within_the_timeout(script, tiny_data_dir, tmp_path):
    """Rank 1 of 2 started alone, its rendezvous a port nobody listens on: one `error:` line
    naming the rank within --timeout 5 (plus start-up), not a traceback or a hang."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    started = time.monotonic()
    try:  # a script that does not pass --timeout waits init_process_group's default, 30 min
        result = subprocess.run([PYTHON, str(script), "--data-dir", str(tiny_data_dir), "--out",
                                 str(tmp_path / "o"), "--bind", "none", "--timeout", "5", *SMALL],
                                cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=JOIN_ALLOWED)
    except subprocess.TimeoutExpired:
        result = None
    require(result is not None, f"rank 1 alone was still waiting for rank 0 after "
            f"{JOIN_ALLOWED} s with --timeout 5 (stopped there): pass "
            f"timeout=datetime.timedelta(seconds=args.timeout) to init_process_group "
            f"{task('07', 1)}")
    took, lines = time.monotonic() - started, error_lines(result.stderr)
    missing = unknown_option(result.stderr)
    require(missing is None, f"rank 1 of {script.name} stopped: {missing}")
    require(result.returncode != 0 and took < JOIN_ALLOWED, f"rank 1 alone ended with exit code "
            f"{result.returncode} after {took:.0f} s (allowed: a non-zero exit code within "
            f"--timeout 5 and start-up, {JOIN_ALLOWED} s): pass --timeout to init_process_group "
            f"{task('07', 1)}")
    said = (f"{len(lines)} `error:` lines" if len(lines) != 1
            else f"the `error:` line {lines[0][:120]!r}")
    traceback = " and a traceback" if "Traceback" in result.stderr else ""
    require(len(lines) == 1 and "rank 1" in lines[0] and not traceback,
            f"rank 1 alone printed {said}{traceback} (allowed: exactly one `error:` line, "
            f"containing 'rank 1', and no traceback): catch the failed rendezvous "
            f"{task('07', 1)}")
