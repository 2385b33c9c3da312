"""Exercise 06 check-your-work: no host syncs in the step, mixed precision, torch.compile, FLOPs and MFU.

    .venv/bin/python -m pytest -q tests/test_06_efficiency.py --script YOUR_SCRIPT

The first part checks wellfno/flops.py against FLOPs counted by hand; the second runs the script
on the tiny generated data and compares runs with each other (float32 is the reference).
"""
import gzip
import json
import math

import pytest
import torch

from profiling import syncs
from tests.conftest import REPO, run_script
from tests.test_slurm import job_env, run_job, slurm_cluster, slurm_data  # noqa: F401 (fixtures of the Slurm test)
from wellfno import flops

# -- wellfno.flops against hand counts --------------------------------------------------------------


def test_linear_layer_forward_and_backward_by_hand():
    # y = x W^T + b, x (4, 3), W (5, 3). Forward: 4*5 outputs x 3 multiply-adds x 2 = 120 FLOPs.
    # Backward: dL/dW = dy^T x (another 120); dL/dx is not needed (x is data): 240 per batch.
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 5)
    x, y = torch.randn(4, 3), torch.randn(4, 5)
    counted = flops.training_flops_per_sample(layer, x, y, torch.nn.functional.mse_loss)
    assert counted["per_sample"] == 240 / 4
    assert layer.weight.grad is None, "counting must leave the gradients as they were"


def test_complex_matrix_product_counts_four_real_ones():
    a = torch.randn(3, 4, 5, dtype=torch.cfloat)
    b = torch.randn(3, 5, 6, dtype=torch.cfloat)
    counted = flops.count_flops(lambda: torch.bmm(a, b))
    # (a+ib)(c+id) = (ac-bd) + i(ad+bc): 4 real multiplies; accumulating adds 2 more adds per term,
    # so one complex multiply-add = 8 real FLOPs vs 2 for a real one.
    assert counted["total"] == 3 * 4 * 6 * 5 * 8
    real = flops.count_flops(lambda: torch.bmm(a.real, b.real))
    assert real["total"] == 3 * 4 * 6 * 5 * 2


def test_real_fft_counts_half_of_5_n_log2_n():
    x = torch.randn(2, 3, 16, 16)
    counted = flops.count_flops(lambda: torch.fft.rfftn(x, dim=(-2, -1)))
    # 6 transforms of N = 256 points, real input: 2.5 * 256 * log2(256) = 5120 FLOPs each.
    assert counted["by_kind"]["fft"] == 6 * 5120
    assert counted["by_kind"]["matmul_conv"] == 0


def test_spectral_convolution_by_hand():
    from neuralop.layers.spectral_convolution import SpectralConv

    batch, c_in, c_out, n = 3, 8, 6, 16
    conv = SpectralConv(c_in, c_out, n_modes=(4, 4))  # keeps 4 x (4//2 + 1) = 12 complex modes
    x = torch.randn(batch, c_in, n, n)
    counted = flops.count_flops(lambda: conv(x))
    contraction = batch * c_in * c_out * 4 * 3 * 8  # complex multiply-adds over the kept modes
    fft = (batch * c_in + batch * c_out) * 2.5 * n * n * math.log2(n * n)  # rfft2 in, irfft2 out
    assert counted["by_kind"]["matmul_conv"] == contraction
    assert counted["by_kind"]["fft"] == fft


@pytest.mark.parametrize("flags, vendor, family, expected", [
    ({"sse2"}, "GenuineIntel", 6, dict(fp32=16, bf16=16, fp16=16)),            # 2 pipes x 4 lanes x 2
    ({"avx2", "fma"}, "GenuineIntel", 6, dict(fp32=32, bf16=32, fp16=32)),     # 2 x 8 x 2
    ({"avx512f", "fma"}, "GenuineIntel", 6, dict(fp32=64, bf16=64, fp16=64)),  # 2 x 16 x 2
    ({"avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16"}, "GenuineIntel", 6, dict(fp32=64, bf16=1024, fp16=128)),
    ({"avx512f", "avx2", "fma", "avx512_bf16"}, "AuthenticAMD", 25, dict(fp32=32, bf16=64, fp16=32)),  # Zen 4
])
def test_cpu_flops_per_cycle_from_flags(flags, vendor, family, expected):
    per_cycle, why = flops.cpu_flops_per_cycle(flags, vendor, family)
    assert per_cycle == expected, why


def test_this_cpu_has_an_estimated_peak():
    peak = flops.cpu_peak(cores=1)
    assert peak.estimate and "estimate" in peak.source
    if peak.flops:  # a machine without a readable clock gives no estimate, and says so
        assert 1e9 < peak.flops["fp32"] < 1e12, peak.source  # one core: between 1 GFLOP/s and 1 TFLOP/s


@pytest.mark.parametrize("name, row", [("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
                                       ("NVIDIA H100 PCIe", "H100 PCIe"), ("AMD Instinct MI250X", "MI250X (one GCD)"),
                                       ("AMD Instinct MI300A", "MI300A")])
def test_gpu_names_find_their_datasheet_row(monkeypatch, name, row):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    peak = flops.device_peak(torch.device("cuda"))
    assert peak.source == flops.GPU_PEAKS[row]["source"] and peak.flops["bf16"] == flops.GPU_PEAKS[row]["bf16"]


def test_unknown_gpu_has_no_mfu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    peak = flops.device_peak(torch.device("cuda"))
    assert flops.utilization(1e6, 100.0, peak, "bf16")["mfu"] is None and "GPU_PEAKS" in peak.source


def test_mfu_uses_the_peak_of_the_arithmetic_in_use():
    a100 = flops.Peak("A100", {k: v for k, v in flops.GPU_PEAKS["A100"].items() if k != "source"}, "datasheet")
    assert a100.for_amp("bf16") == (312e12, "bf16")
    assert a100.for_amp("none", tf32_convolutions=True) == (156e12, "tf32")  # cuDNN's default on Ampere+
    assert a100.for_amp("none", tf32_convolutions=False) == (19.5e12, "fp32")
    mi250x = flops.Peak("MI250X", {k: v for k, v in flops.GPU_PEAKS["MI250X (one GCD)"].items() if k != "source"}, "")
    assert mi250x.for_amp("none", tf32_convolutions=False) == (47.85e12, "fp32_matrix")
    result = flops.utilization(2e9, 50.0, a100, "bf16")  # 2 GFLOP per sample at 50 samples/s
    assert result["achieved_flops_per_s"] == 1e11 and result["mfu"] == pytest.approx(1e11 / 312e12)


# -- the script ---------------------------------------------------------------------------------------

RUN = ["--epochs", "1", "--batch-size", "8", "--bind", "none"]


STEP = "06_efficiency"  # the cross-step matrix (tests/conftest.py) supplies `script`


def train(script, data_dir, out, *extra, timeout=300):
    result = run_script(script, "--data-dir", data_dir, "--out", out, *RUN, *extra, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "metrics.json").read_text())


def per_step_losses(metrics):
    """The running mean training loss read back after each step (needs --log-every 1)."""
    return [loss for _, loss in metrics["history"][0]["loss_log"]]


@pytest.mark.slow
def test_log_every_changes_only_when_numbers_are_read(script, tiny_data_dir, tmp_path):
    often = train(script, tiny_data_dir, tmp_path / "often", "--max-steps", "3", "--log-every", "1")
    never = train(script, tiny_data_dir, tmp_path / "never", "--max-steps", "3", "--log-every", "1000")
    assert len(often["history"][0]["loss_log"]) == 3 and never["history"][0]["loss_log"] == []
    assert often["train_loss"] == never["train_loss"] and often["valid_loss"] == never["valid_loss"]
    a = torch.load(tmp_path / "often" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "never" / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a), "the parameters must be bitwise the same"


@pytest.mark.slow
def test_metrics_say_how_far_from_the_peak(script, tiny_data_dir, tmp_path):
    metrics = train(script, tiny_data_dir, tmp_path / "run", "--max-steps", "2", "--width", "8", "--modes", "4",
                    "--layers", "2")
    # The script's count is the one wellfno.flops gives for the same model and input size.
    from wellfno.model import NextFrameFNO

    ones = torch.ones(2)
    model = NextFrameFNO(2, 1, dict(mean=0 * ones, std=ones, mean_delta=0 * ones, std_delta=ones),
                         modes=4, width=8, layers=2)
    x = torch.zeros(8, 2, 16, 16)
    assert metrics["flops_per_sample"] == flops.training_flops_per_sample(model, x, x, model.loss)["per_sample"]
    assert metrics["achieved_flops_per_s"] == pytest.approx(metrics["flops_per_sample"] * metrics["samples_per_second"])
    assert metrics["peak_flops_per_s"] > 0 and 0 < metrics["mfu"] < 1
    assert metrics["mfu"] == pytest.approx(metrics["achieved_flops_per_s"] / metrics["peak_flops_per_s"])
    assert metrics["peak_memory_bytes"] > 0


# Tolerance for low precision: bf16 rounds each element to 8 significant bits (relative 2^-9 = 2e-3),
# fp16 to 11 (2^-12 = 2.4e-4); the convolutions accumulate in float32 and the spectral part stays
# float32. The loss is a mean over 8 x 2 x 16 x 16 = 4096 elements whose rounding errors have mean
# zero, so the loss moves far less than one element: measured on the tiny data over 5 steps,
# at most 3.6e-5 (bf16) and 3.9e-6 (fp16) relative to float32. The bounds, 1e-3 and 1e-4, are half
# of one element's rounding and 25x what was measured. The runs must also differ from float32, or
# autocast did nothing.
@pytest.mark.slow
@pytest.mark.parametrize("amp, tolerance", [("bf16", 1e-3), ("fp16", 1e-4)])
def test_mixed_precision_tracks_float32(script, tiny_data_dir, tmp_path, amp, tolerance):
    steps = ["--max-steps", "5", "--log-every", "1"]
    reference = per_step_losses(train(script, tiny_data_dir, tmp_path / "fp32", *steps))
    low = per_step_losses(train(script, tiny_data_dir, tmp_path / amp, *steps, "--amp", amp))
    assert len(low) == len(reference) == 5
    relative = [abs(a - b) / b for a, b in zip(low, reference)]
    assert max(relative) < tolerance, (reference, low)
    assert max(relative) > 0, f"--amp {amp} gave exactly the float32 losses: is autocast on?"


# torch.compile only reorders and fuses float32 arithmetic: the same losses to float32 rounding.
@pytest.mark.slow
def test_compile_tracks_float32(script, tiny_data_dir, tmp_path):
    steps = ["--max-steps", "3", "--log-every", "1"]
    reference = train(script, tiny_data_dir, tmp_path / "eager", *steps)
    compiled = train(script, tiny_data_dir, tmp_path / "compiled", *steps, "--compile", timeout=900)
    assert per_step_losses(compiled) == pytest.approx(per_step_losses(reference), rel=1e-4)
    assert compiled["compile_seconds"] > 0


@pytest.mark.parametrize("options, message", [
    (["--log-every", "0"], "--log-every"),
    pytest.param(["--width", "0"], "--width", marks=pytest.mark.slow),
    pytest.param(["--nvtx", "--device", "cpu"], "--nvtx", marks=pytest.mark.slow),  # NVTX ranges need a GPU
    pytest.param(["--nvtx", "--profile"], "one at a time", marks=pytest.mark.slow),
])
def test_impossible_values_are_one_line_errors(script, tiny_data_dir, tmp_path, options, message):
    result = run_script(script, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", *RUN, *options)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert not (tmp_path / "out").exists(), "nothing may be written"


@pytest.mark.slow
def test_modes_beyond_the_grid_is_one_line_error(script, tiny_data_dir, tmp_path):
    result = run_script(script, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", *RUN, "--modes", "17")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and "--modes" in result.stderr and "16" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_compile_without_a_compiler_is_one_line_error(script, tiny_data_dir, tmp_path):
    # No g++ or clang++ on PATH (the script is started by absolute path, so it needs none).
    result = run_script(script, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", *RUN, "--compile",
                        "--device", "cpu", env={"PATH": str(tmp_path / "empty"), "CXX": "g++"})
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and "compiler" in result.stderr
    assert "without --compile" in result.stderr
    assert not (tmp_path / "out").exists()


def syncs_per_profiled_step(script, data_dir, out, *extra):
    """Host syncs (profiling/syncs.py) in each step of a --profile window: steps 5-9 of 10."""
    result = run_script(script, "--data-dir", data_dir, "--out", out, "--epochs", "1", "--batch-size", "1",
                        "--profile", "--max-steps", "10", *extra, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (trace_file,) = out.glob("trace_rank0_*.json.gz")
    trace = json.loads(gzip.decompress(trace_file.read_bytes()))
    return [row["syncs"] for row in syncs.host_syncs_per_step(trace)]


# The count reads the same on CPU and GPU traces (profiling/syncs.py): a CPU test of a GPU habit.
@pytest.mark.slow
def test_no_host_sync_inside_the_step(script, tiny_data_dir, tmp_path):
    # The course's loop as exercise 01 profiles it (solutions 02-05 keep it): the loss read back every step.
    baseline = syncs_per_profiled_step(REPO / "solutions" / "01_profiling" / "fno.py", tiny_data_dir, tmp_path / "01")
    assert len(baseline) == 5 and min(baseline) >= 1, f"the baseline loop reads the loss back every step: {baseline}"
    every_step = syncs_per_profiled_step(script, tiny_data_dir, tmp_path / "k1", "--bind", "none", "--log-every", "1")
    assert every_step == [1] * 5, f"--log-every 1: one read-back per step, no more: {every_step}"
    never = syncs_per_profiled_step(script, tiny_data_dir, tmp_path / "k1000", "--bind", "none",
                                    "--log-every", "1000")
    assert never == [0] * 5, f"--log-every larger than the run: no host sync in any step: {never}"


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_efficiency_job_writes_its_table(slurm_cluster, slurm_data, tmp_path):  # noqa: F811
    """slurm/06_efficiency.sbatch on the local test cluster: the benchmark's rows, no vendor profiler on a CPU."""
    run_root = tmp_path / "runs"
    job = run_job("06_efficiency.sbatch", "--steps", "2", "--no-compile", "--width", "8", "--batch-size", "4",
                  env=job_env(run_root, slurm_data), run_root=run_root, timeout=900)
    job.assert_completed()
    result = json.loads((job.run_dir / "efficiency.json").read_text())
    rows = result["data"]["rows"]
    assert [r["row"] for r in rows] == ["05 as is", "+ no host syncs", "+ bf16", "+ width 8, batch 4"]
    assert all(r["samples_per_s"] > 0 and r["achieved_flops_per_s"] > 0 for r in rows)
    assert (job.run_dir / "efficiency.png").is_file()
    assert "no vendor profiler run" in job.out.read_text()
