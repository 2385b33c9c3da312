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


# The option each task adds. A check that runs a script with an option it does not know yet (the
# previous step's script, a task not done) says which task adds it, in one sentence, instead of
# argparse's usage and `unrecognized arguments` (tests/test_check_messages.py).
OPTION_TASKS = {
    "--profile": ("01", 2), "--profile-memory": ("01", 2), "--with-stack": ("01", 2),
    "--profile-warmup": ("01", 3), "--profile-active": ("01", 3),
    "--num-workers": ("02", 2), "--prefetch-factor": ("02", 2), "--persistent-workers": ("02", 2),
    "--pin-memory": ("02", 2), "--fast-reader": ("02", "O1"),
    "--bind": ("03", 3), "--report-workers": ("03", 3),
    "--backend": ("05", 1), "--eval-only": ("06", 3), "--timeout": ("07", 1),
    "--log-every": ("08", 1), "--amp": ("09", 1), "--nvtx": ("10", 2), "--layers": ("10", 3),
    "--compile": ("11", 1), "--checkpoint-blocks": ("12", 1), "--domain-size": ("13", 1),
    "--rollout-steps": ("14", 2), "--pushforward": ("14", 4), "--input-noise": ("14", 4),
}
UNRECOGNIZED = re.compile(r"unrecognized arguments: (?P<words>[^\r\n]*)")


def unknown_option(text: str) -> str | None:
    """For argparse's `unrecognized arguments: ...` in `text` naming an option a task adds: the
    sentence that names the option and its task; else None."""
    refused = UNRECOGNIZED.search(text)
    words = refused.group("words").split() if refused else []
    options = [word.split("=")[0] for word in words if word.split("=")[0] in OPTION_TASKS]
    if not options:
        return None
    return (f"the script has no {' or '.join(dict.fromkeys(options))} option yet (argparse: "
            f"unrecognized arguments): add {options[0]} {task(*OPTION_TASKS[options[0]])}")


def require(ok, sentence: str) -> None:
    """Fail with `sentence` alone (no traceback, no values dumped) unless `ok`."""
    if not ok:
        pytest.fail(sentence, pytrace=False)


def last_error_line(text: str) -> str:
    """The line of a script's stderr that says what went wrong (an `error:` line, else the last)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:") or "Error" in line.split(":")[0]]
    return (errors or lines or ["(no output)"])[-1][:300]


def why_it_stopped(stderr: str, fix: str) -> str:
    """What a run that stopped said, and what to do: the task of an option it does not know yet
    (argparse), else its error line and `fix`."""
    return unknown_option(stderr) or f"{last_error_line(stderr)}; {fix}"


def require_run(result, what: str, fix: str) -> None:
    """A child process (subprocess.CompletedProcess) must have exited 0."""
    require(result.returncode == 0,
            f"{what} exited with exit code {result.returncode}: "
            f"{why_it_stopped(result.stderr, fix)}")


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
        pytest.fail(f"{what} stopped: {why_it_stopped(refused, fix)}", pytrace=False)
    sys.stderr.write(stderr.getvalue())
    return result


def require_refused(result, shown: str, fix: str, naming=(), out=None) -> None:
    """`shown` (a run, subprocess.CompletedProcess) was refused in one `error:` line naming
    `naming`, exit non-zero, no traceback, and left no folder `out`."""
    missing = unknown_option(result.stderr)
    require(missing is None, f"{shown} stopped: {missing}")
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    traceback = ", a traceback" if "Traceback" in result.stderr else ""
    ok = (result.returncode != 0 and not traceback and len(lines) == 1
          and all(word in result.stderr for word in naming))
    named = f" naming {' and '.join(naming)}" if naming else ""
    last = f", the last: '{lines[-1][:100]}'" if lines else ""
    require(ok, f"{shown} ended with exit code {result.returncode} and {len(lines)} line(s) on "
            f"stderr{traceback}{last} (allowed: a non-zero exit code and one `error:` "
            f"line{named}): {fix}")
    if out is not None:
        require(not out.exists(), f"{shown} left an output folder: refuse before writing; {fix}")
