"""Exercise 08 check-your-work: no host sync inside the training step.

    .venv/bin/python -m pytest -q tests/test_08_host_syncs.py --script YOUR_SCRIPT

The loss stays on the device and is read back every --log-every steps; the count of host syncs in
each profiled step comes from profiling/syncs.py, which reads CPU and GPU traces alike.
"""
import gzip
import json

import pytest
import torch

from profiling import syncs
from tests.checks import require, task
from tests.conftest import REPO, exit_of
from tests.train_helpers import RUN, run_once

STEP = "08_host_syncs"  # the cross-step matrix (tests/conftest.py) supplies `script`


@pytest.mark.slow
def test_log_every_changes_only_when_numbers_are_read(script, tiny_data_dir, finished_run):
    fix = f"the run must finish {task('08', 3)}"
    often, often_out, _ = run_once(finished_run, script, tiny_data_dir, "--max-steps", "3",
                                   "--log-every", "1", fix=fix)
    never, never_out, _ = run_once(finished_run, script, tiny_data_dir, "--max-steps", "3",
                                   "--log-every", "1000", fix=fix)
    logged = (len(often["history"][0].get("loss_log", [])), len(never["history"][0].get("loss_log",
                                                                                        [1])))
    require(logged == (3, 0), f"3 steps logged {logged[0]} loss(es) with --log-every 1 and "
            f"{logged[1]} with --log-every 1000 (allowed: 3 and 0): append to loss_log every "
            f"log_every steps {task('08', 1)}")
    require(often["train_loss"] == never["train_loss"] and often["valid_loss"] == never["valid_loss"],
            f"the losses depend on --log-every (train_loss {often['train_loss']} with 1, "
            f"{never['train_loss']} with 1000): reading numbers back must not change them "
            f"{task('08', 3)}")
    a = torch.load(often_out / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(never_out / "checkpoint.pt", weights_only=True)["model"]
    differ = sum(not torch.equal(a[k], b[k]) for k in a)
    require(differ == 0, f"{differ} of {len(a)} parameter tensors depend on --log-every (allowed: "
            f"none, bitwise) {task('08', 3)}")


def syncs_per_profiled_step(finished_run, script, data_dir, *extra):
    """Host syncs (profiling/syncs.py) in each step of a --profile window: steps 5-9 of 10.

    The run is in this process (the profiler traces the run's own operators, and nothing else
    runs here meanwhile), once per session: step 01's baseline serves every solution's check.
    A small model: the syncs per step do not depend on its size, the profiled run's time does."""
    out, _ = finished_run(script, data_dir, "--epochs", "1", "--batch-size", "1", "--profile",
                          "--max-steps", "10", "--width", "8", "--modes", "4", *extra,
                          fix=f"the profiled run must finish {task('08', 1)}")
    (trace_file,) = out.glob("trace_rank0_*.json.gz")
    trace = json.loads(gzip.decompress(trace_file.read_bytes()))
    return [row["syncs"] for row in syncs.host_syncs_per_step(trace)]


# The count reads the same on CPU and GPU traces (profiling/syncs.py): a CPU test of a GPU habit.
@pytest.mark.slow
def test_no_host_sync_inside_the_step(script, tiny_data_dir, finished_run):
    # The course's loop as exercise 01 profiles it (solutions 02-06 keep it): the loss read back
    # every step.
    baseline = syncs_per_profiled_step(finished_run, REPO / "solutions" / "01_profiling" / "fno.py",
                                       tiny_data_dir)
    assert len(baseline) == 5 and min(baseline) >= 1, \
        f"the reference (solution 01) must read the loss back every step: {baseline}"
    every_step = syncs_per_profiled_step(finished_run, script, tiny_data_dir, "--bind", "none",
                                         "--log-every", "1")
    require(every_step == [1] * 5, f"--log-every 1: host syncs per step {every_step} (allowed: "
            f"one each, the loss read-back, and no more) {task('08', 1)}")
    never = syncs_per_profiled_step(finished_run, script, tiny_data_dir, "--bind", "none",
                                    "--log-every", "1000")
    require(never == [0] * 5, f"--log-every 1000: host syncs per step {never} (allowed: 0): "
            "something in the step still waits for the device (.item(), float(), a copy to the "
            f"CPU) {task('08', 1)}")


def test_log_every_zero_is_a_one_line_error(script_module, tiny_data_dir, tmp_path):
    result = exit_of(script_module, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", *RUN,
                     "--log-every", "0")
    lines = result.stderr.strip().splitlines()
    require(result.returncode != 0 and "Traceback" not in result.stderr and len(lines) == 1
            and "--log-every" in result.stderr,
            f"--log-every 0 ended with exit code {result.returncode} and {len(lines)} line(s) on "
            f"stderr (allowed: a non-zero exit code and one `error:` line naming --log-every) "
            f"{task('08', 1)}")
    require(not (tmp_path / "out").exists(), f"--log-every 0 left an output folder: refuse it "
            f"before writing {task('08', 1)}")


# This step's Slurm job is tested in tests/test_slurm.py with the other job scripts
# (DESIGN.md), where the jobs run side by side:
# test_slurm_08_counts_the_syncs_per_step.
