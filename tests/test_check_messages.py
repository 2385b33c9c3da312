"""Each check-your-work failure says what is wrong and names the task that fixes it (issue 20, 6).

A participant who runs exercise NN's check on the script of the step before (nothing of the
exercise done yet) must read, for every failing check, one sentence ending in
`(exercise NN, task N)` (tests/checks.py), and no dump of tensors, arrays, dicts or a traceback.
Runs each check as the README gives it, with `--script` = the unchanged previous step, on the
quick checks only (`-m "not slow"`, so each run takes seconds), or, where a check-your-work file
has no quick check that the previous step fails, a few cheap slow ones picked by name. Adding an
exercise: one line in CASES (its check, the previous step's script, its number, which checks).
"""
from __future__ import annotations

import os
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
    ("tests/test_08_host_syncs.py", "solutions/06_exact_metrics/fno.py", "07", None),
    ("tests/test_09_mixed_precision.py", "solutions/08_host_syncs/fno.py", "08", "peak_memory"),
    ("tests/test_11_compile.py", "solutions/09_mixed_precision/fno.py", "09", None),
    ("tests/test_12_checkpointing.py", "solutions/11_compile/fno.py", "10",
     "checkpointed_run_trains"),
    ("tests/test_13_domain_parallel.py", "solutions/12_checkpointing/fno.py", "11", None),
]
# What a dump looks like: a tensor or array repr, a dict or list of values, pytest's introspection.
DUMPS = re.compile(r"tensor\(|array\(|Traceback|^E\s+assert |^E\s+where |\{'|^>\s", re.M)
SUMMARY = re.compile(r"^(FAILED|ERROR) (?P<test>\S+)(?: - (?P<message>.*))?$", re.M)


@pytest.mark.slow  # a pytest run per exercise, each importing torch and running the previous step
@pytest.mark.parametrize("check, previous, exercise, chosen", CASES,
                         ids=[case[2] for case in CASES])
def test_failures_on_the_previous_step_name_their_task(check, previous, exercise, chosen):
    env = {k: v for k, v in os.environ.items() if k != "STATS_SCRIPT"}
    which = ["-m", "not slow and not gpu"] if chosen is None else \
        ["-m", "not gpu and not slurm", "-k", chosen]
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
                             *which, "--show-capture=no", check, "--script", previous],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = result.stdout
    assert result.returncode == 1, (f"{check} on {previous}: expected failures, got exit "
                                    f"{result.returncode}:\n{out[-2000:]}")
    failed = SUMMARY.findall(out)
    assert failed, f"no FAILED/ERROR lines in:\n{out[-2000:]}"
    # each failure's own section: the text between its header line and the next one
    sections = re.split(r"^_+ .+ _+$", out.split("short test summary info")[0], flags=re.M)[1:]
    assert len(sections) == len(failed), \
        f"{len(failed)} failures but {len(sections)} sections:\n{out[-2000:]}"
    for section in sections:
        lines = section.strip().splitlines()
        sentence = "\n".join(line for line in lines if not line.startswith("="))
        where = f"{check} on {previous}"
        assert TASK.search(sentence), f"{where}: a failure names no task:\n{sentence[:1500]}"
        assert f"(exercise {exercise}, task" in sentence, sentence[:1500]
        assert not DUMPS.search(sentence), f"{where}: a failure dumps values:\n{sentence[:1500]}"
