"""Each check-your-work failure says what is wrong and names the task that fixes it (issue 20, 6).

A participant who runs exercise NN's check on the script of the step before (nothing of the
exercise done yet) must read, for every failing check, one sentence ending in
`(exercise NN, task N)` (tests/checks.py), and no dump of tensors, arrays, dicts or a traceback.
Runs each check with the README's arguments (all 14 in one pytest process, below), with
`--script` = the unchanged previous step, on the
quick checks only (`-m "not slow"`, so each run takes seconds), or, where a check-your-work file
has no quick check that the previous step fails, a few cheap slow ones picked by name. Adding an
exercise: one line in CASES (its check, the previous step's script, its number, which checks).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.checks import TASK
from tests.conftest import REPO

# (check-your-work test file, the unchanged previous step's script, the exercise of its tasks,
#  the checks to run: None for the quick ones, else a -k expression picking a few cheap slow ones
#  where the file has no quick check that the previous step fails)
CASES = [
    ("tests/test_01_profiling.py", "fno.py", "01", None),
    ("tests/test_02_data_pipeline.py", "solutions/01_profiling/fno.py", "02", None),
    ("tests/test_03_affinity_solution.py", "solutions/02_data_pipeline/fno.py", "03", None),
    ("tests/test_stats_distributed.py", "exercises/04_distributed_stats/stats_parallel.py", "04",
     None),
    ("tests/test_05_ddp.py", "solutions/03_affinity/fno.py", "05",
     "incomplete_launcher or nccl_without_gpu"),
    ("tests/test_06_exact_metrics.py", "solutions/05_ddp/fno.py", "06",
     "eval_only_without_checkpoint or split_smaller"),
    # with the two-rank check a rank's death fails (it passed the step-06 script before issue 35)
    ("tests/test_07_failures.py", "solutions/06_exact_metrics/fno.py", "07",
     "timeout_must_be or (failing_rank and die)"),
    # with the checks of the runs the quick check shares (the issue-35 case: argparse's exit 2)
    ("tests/test_08_host_syncs.py", "solutions/07_failures/fno.py", "08",
     "log_every_changes or log_every_zero"),
    ("tests/test_09_mixed_precision.py", "solutions/08_host_syncs/fno.py", "09", "peak_memory"),
    ("tests/test_10_mfu.py", "solutions/09_mixed_precision/fno.py", "10", None),
    ("tests/test_11_compile.py", "solutions/10_mfu/fno.py", "11", None),
    ("tests/test_12_checkpointing.py", "solutions/11_compile/fno.py", "12",
     "checkpointed_run_trains"),
    ("tests/test_13_domain_parallel.py", "solutions/12_checkpointing/fno.py", "13", None),
    ("tests/test_14_long_rollouts.py", "solutions/13_domain_parallel/fno.py", "14", None),
]
# Checks that must fail on the previous step's script (a check that passes there checks nothing).
MUST_FAIL = {"07": ["test_a_failing_rank_ends_every_rank_within_seconds[script-die]"],
             "08": ["test_log_every_changes_only_when_numbers_are_read[script]"],
             "13": ["test_your_spectral_convolution_equals_spectral_conv_on_one_rank[script]"]}
# What a dump looks like: a tensor or array repr, a dict or list of values, pytest's introspection,
# a traceback or an exception raised while handling another, argparse's usage.
DUMPS = re.compile(r"tensor\(|array\(|Traceback|^E\s+assert |^E\s+where |\{'|^>\s"
                   r"|During handling of the above exception|^usage: ", re.M)
SUMMARY = re.compile(r"^(FAILED|ERROR) (?P<test>\S+)(?: - (?P<message>.*))?$", re.M)


# The 14 runs in one process, one pytest.main after another: a pytest process per exercise would
# import torch, neuralop and the conftest 14 times (about 3.5 s of CPU each on the 2-core CI VM).
# Each case has its own check file, so no test module is imported twice (exercise 04's picks its
# script at import from STATS_SCRIPT, which conftest.pytest_configure sets from each run's
# --script). Each run's report is what a participant's terminal shows (pytest writes it to
# sys.stdout, here a buffer per run).
RUN_EACH = """
import contextlib, io, json, sys
import pytest
reports = []
for args in json.loads(sys.argv[1]):
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        status = pytest.main(args)
    reports.append([int(status), report.getvalue()])
print("\\nREPORTS", json.dumps(reports))  # on a line of its own, after whatever a run printed
"""


def pytest_args(check, previous, chosen) -> list[str]:
    which = ["-m", "not slow and not gpu"] if chosen is None else \
        ["-m", "not gpu and not slurm", "-k", chosen]
    return ["-q", "-p", "no:cacheprovider", "-rfE", *which, "--show-capture=no", check,
            "--script", previous]


@pytest.fixture(scope="module")
def reports() -> dict:
    """exercise -> (pytest's exit status, its report) of each case's check on the previous step."""
    cases = [pytest_args(check, previous, chosen) for check, previous, _, chosen in CASES]
    result = subprocess.run([sys.executable, "-c", RUN_EACH, json.dumps(cases)], cwd=REPO,
                            capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, f"the checks' runner failed:\n{result.stderr[-3000:]}"
    runs = json.loads(result.stdout.rsplit("\nREPORTS ", 1)[-1])
    return {case[2]: tuple(run) for case, run in zip(CASES, runs)}


@pytest.mark.slow  # a pytest run per exercise, each running the previous step
@pytest.mark.parametrize("check, previous, exercise, chosen", CASES,
                         ids=[case[2] for case in CASES])
def test_failures_on_the_previous_step_name_their_task(reports, check, previous, exercise, chosen):
    status, out = reports[exercise]
    assert status == 1, (f"{check} on {previous}: expected failures, got exit "
                         f"{status}:\n{out[-2000:]}")
    failed = SUMMARY.findall(out)
    assert failed, f"no FAILED/ERROR lines in:\n{out[-2000:]}"
    for test in MUST_FAIL.get(exercise, []):
        assert any(found[1].endswith("::" + test) for found in failed), \
            f"{check}'s {test} passes on {previous}, which has nothing of exercise {exercise}"
    # each failure's own section: the text between its header line and the next one
    sections = re.split(r"^_+ .+ _+$", out.split("short test summary info")[0], flags=re.M)[1:]
    assert len(sections) == len(failed), \
        f"{len(failed)} failures but {len(sections)} sections:\n{out[-2000:]}"
    for section in sections:
        lines = section.strip().splitlines()
        sentence = "\n".join(line for line in lines if not line.startswith("="))
        where = f"{check} on {previous}"
        assert TASK.search(sentence), f"{where}: a failure names no task:\n{sentence[:1500]}"
        said = [line for line in sentence.splitlines()  # conftest's summary ends the last one
                if line.strip() and not line.startswith("time by kind:")]
        assert len(said) == 1, f"{where}: a failure is not one sentence:\n{sentence[:1500]}"
        assert f"(exercise {exercise}, task" in sentence, sentence[:1500]
        assert not DUMPS.search(sentence), f"{where}: a failure dumps values:\n{sentence[:1500]}"
