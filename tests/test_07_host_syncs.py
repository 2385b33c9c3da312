"""Exercise 07 check-your-work: no host sync inside the training step.

    .venv/bin/python -m pytest -q tests/test_07_host_syncs.py --script YOUR_SCRIPT

The loss stays on the device and is read back every --log-every steps; the count of host syncs in
each profiled step comes from profiling/syncs.py, which reads CPU and GPU traces alike.
"""
import gzip
import json

import pytest
import torch

from profiling import syncs
from tests.conftest import REPO, exit_of
from tests.train_helpers import RUN, run_once

STEP = "07_host_syncs"  # the cross-step matrix (tests/conftest.py) supplies `script`


@pytest.mark.slow
def test_log_every_changes_only_when_numbers_are_read(script, tiny_data_dir, finished_run):
    often, often_out, _ = run_once(finished_run, script, tiny_data_dir, "--max-steps", "3",
                                   "--log-every", "1")
    never, never_out, _ = run_once(finished_run, script, tiny_data_dir, "--max-steps", "3",
                                   "--log-every", "1000")
    logged = (len(often["history"][0].get("loss_log", [])), len(never["history"][0].get("loss_log",
                                                                                        [1])))
    assert logged == (3,
                      0), (f"3 steps logged {logged[0]} loss(es) with --log-every 1 and "
                           f"{logged[1]} with "
                              "--log-every 1000, expected 3 and 0 (task 1: loss_log every "
                              "log_every steps)")
    assert often["train_loss"] == never["train_loss"] and often["valid_loss"] == never["valid_loss"], \
        "the losses depend on --log-every: reading numbers back must not change them (task 1)"
    a = torch.load(often_out / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(never_out / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a), \
        "the parameters depend on --log-every: they must be bitwise the same (task 1)"


def syncs_per_profiled_step(finished_run, script, data_dir, *extra):
    """Host syncs (profiling/syncs.py) in each step of a --profile window: steps 5-9 of 10.

    The run is in this process (the profiler traces the run's own operators, and nothing else
    runs here meanwhile), once per session: step 01's baseline serves every solution's check.
    A small model: the syncs per step do not depend on its size, the profiled run's time does."""
    out, _ = finished_run(script, data_dir, "--epochs", "1", "--batch-size", "1", "--profile",
                          "--max-steps", "10", "--width", "8", "--modes", "4", *extra)
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
    assert len(baseline) == 5 and min(baseline) >= 1, f"the baseline loop reads the loss back every step: {baseline}"
    every_step = syncs_per_profiled_step(finished_run, script, tiny_data_dir, "--bind", "none",
                                         "--log-every", "1")
    assert every_step == [1] * 5, (f"--log-every 1: host syncs per step {every_step}, expected one "
                                   "each "
                                   f"(the loss read-back) and no more (tasks 1-2)")
    never = syncs_per_profiled_step(finished_run, script, tiny_data_dir, "--bind", "none",
                                    "--log-every", "1000")
    assert never == [0] * 5, (f"--log-every 1000: host syncs per step {never}, expected 0: "
                              "something in the "
                              "step still waits for the device (.item(), float(), a copy to the "
                              "CPU; task 2)")


def test_log_every_zero_is_a_one_line_error(script_module, tiny_data_dir, tmp_path):
    result = exit_of(script_module, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", *RUN,
                     "--log-every", "0")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and "--log-every" in result.stderr, \
        "--log-every 0 must be one error line (task 1)"
    assert not (tmp_path / "out").exists(), "nothing may be written"


# This step's Slurm job is tested in tests/test_slurm.py with the other job scripts
# (DESIGN.md), where the jobs run side by side:
# test_slurm_07_counts_the_syncs_per_step.
