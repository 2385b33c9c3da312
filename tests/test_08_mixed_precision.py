"""Exercise 08 check-your-work: mixed precision (bf16, fp16) for the FNO, tracking float32.

    .venv/bin/python -m pytest -q tests/test_08_mixed_precision.py --script YOUR_SCRIPT

Runs the script on the tiny generated data and compares low-precision runs with float32.
"""
import pytest

from tests.test_slurm import job_env, run_job, slurm_cluster, slurm_data  # noqa: F401 - Slurm fixtures
from tests.train_helpers import per_step_losses, run_once

STEP = "08_mixed_precision"  # the cross-step matrix (tests/conftest.py) supplies `script`
STEPS = ["--max-steps", "5", "--log-every", "1"]


# Tolerance for low precision: bf16 rounds each element to 8 significant bits (relative 2^-9 =
# 2e-3),
# fp16 to 11 (2^-12 = 2.4e-4); the convolutions accumulate in float32 and the spectral part stays
# float32. The loss is a mean over 8 x 2 x 16 x 16 = 4096 elements whose rounding errors have mean
# zero, so the loss moves far less than one element: measured on the tiny data over 5 steps,
# at most 3.6e-5 (bf16) and 3.9e-6 (fp16) relative to float32. The bounds, 1e-3 and 1e-4, are half
# of one element's rounding and 25x what was measured. The runs must also differ from float32, or
# autocast did nothing.
@pytest.mark.slow
@pytest.mark.parametrize("amp, tolerance", [("bf16", 1e-3), ("fp16", 1e-4)])
def test_mixed_precision_tracks_float32(script, tiny_data_dir, finished_run, amp, tolerance):
    # the float32 reference: one run for both precisions (and the peak-memory check)
    reference = per_step_losses(run_once(finished_run, script, tiny_data_dir, *STEPS)[0])
    low = per_step_losses(run_once(finished_run, script, tiny_data_dir, *STEPS, "--amp", amp)[0])
    assert len(low) == len(reference) == 5
    relative = [abs(a - b) / b for a, b in zip(low, reference)]
    assert max(relative) < tolerance, (f"--amp {amp}: the loss is {max(relative):.1e} (relative) "
                                       "from float32, "
                                       f"allowed {tolerance:.0e}: keep the spectral convolutions "
                                       "float32 (task 2)")
    assert max(relative) > 0, f"--amp {amp} gave exactly the float32 losses: autocast the forward pass (task 1)"

@pytest.mark.slow
def test_metrics_record_the_peak_memory(script, tiny_data_dir, finished_run):
    metrics = run_once(finished_run, script, tiny_data_dir, *STEPS)[0]  # the float32 reference
    assert metrics["peak_memory_bytes"] > 0 and metrics["peak_memory_of"], \
        "metrics.json needs peak_memory_bytes and peak_memory_of (task 4)"


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_08_runs_each_precision(slurm_cluster, slurm_data, tmp_path):  # noqa: F811
    """slurm/08_mixed_precision.sbatch on the local test cluster: float32, bf16 and fp16 side by side."""
    run_root = tmp_path / "runs"
    job = run_job("08_mixed_precision.sbatch", "--max-steps", "2", "--batch-size", "2",
                  env=job_env(run_root, slurm_data), run_root=run_root, timeout=900)
    job.assert_completed()
    for amp in ("none", "bf16", "fp16"):
        assert (job.run_dir / f"amp_{amp}" / "metrics.json").is_file(), f"no metrics.json for --amp {amp}"
    assert job.out.read_text().count("peak memory") == 3
