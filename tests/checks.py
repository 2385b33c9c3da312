"""Check-your-work failures that teach: one sentence saying what is wrong and which task fixes it.

A participant runs `pytest tests/test_NN_*.py --script THEIR_FILE`. When a check fails, pytest
would print the assertion's expression with every tensor, list and dict in it; `require` prints
only the sentence (`pytest.fail(..., pytrace=False)`). Every sentence ends with the task that
fixes it, `(exercise NN, task N)`, and gives the measured figure beside the allowed one where
there is one: tests/test_check_messages.py runs the checks on the step before and asserts that.
"""
from __future__ import annotations

import contextlib
import io
import re
import sys

import pytest

TASK = re.compile(r"\(exercise \d\d, task O?\d+\)")


def task(exercise: str, number) -> str:
    """'(exercise 01, task 2)': the end of every check-your-work sentence (optional tasks: 'O1')."""
    return f"(exercise {exercise}, task {number})"


def require(ok, sentence: str) -> None:
    """Fail with `sentence` alone (no traceback, no values dumped) unless `ok`."""
    if not ok:
        pytest.fail(sentence, pytrace=False)


def last_error_line(text: str) -> str:
    """The line of a script's stderr that says what went wrong (an `error:` line, else the last)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:") or "Error" in line.split(":")[0]]
    return (errors or lines or ["(no output)"])[-1][:300]


def require_run(result, what: str, fix: str) -> None:
    """A child process (subprocess.CompletedProcess) must have exited 0."""
    require(result.returncode == 0,
            f"{what} exited with {result.returncode}: {last_error_line(result.stderr)}; {fix}")


def run_main_or_fail(call, what: str, fix: str):
    """Run `call()` (a script's main in this process); an argparse exit becomes one sentence.

    What the script wrote to stderr is passed on (pytest shows it as captured output).
    """
    stderr, refused = io.StringIO(), None
    try:
        with contextlib.redirect_stderr(stderr):
            result = call()
    except SystemExit as exit_info:
        if exit_info.code in (0, None):
            raise
        refused = last_error_line(stderr.getvalue())
    if refused is not None:  # outside the except: no "during handling of the above exception"
        pytest.fail(f"{what} stopped: {refused}; {fix}", pytrace=False)
    sys.stderr.write(stderr.getvalue())
    return result


def require_refused(result, shown: str, fix: str, naming=(), out=None) -> None:
    """`shown` (a run, subprocess.CompletedProcess) was refused in one `error:` line naming
    `naming`, exit non-zero, no traceback, and left no folder `out`."""
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    traceback = ", a traceback" if "Traceback" in result.stderr else ""
    ok = (result.returncode != 0 and not traceback and len(lines) == 1
          and all(word in result.stderr for word in naming))
    named = f" naming {' and '.join(naming)}" if naming else ""
    last = f", the last: '{lines[-1][:100]}'" if lines else ""
    require(ok, f"{shown} exited with {result.returncode} and {len(lines)} line(s) on stderr"
            f"{traceback}{last} (allowed: non-zero, one `error:` line{named}): {fix}")
    if out is not None:
        require(not out.exists(), f"{shown} left an output folder: refuse before writing; {fix}")
