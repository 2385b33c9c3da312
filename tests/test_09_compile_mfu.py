"""Exercise 09 check-your-work: torch.compile, FLOPs per sample and MFU.

    .venv/bin/python -m pytest -q tests/test_09_compile_mfu.py --script YOUR_SCRIPT

The first part checks wellfno/flops.py against FLOPs counted by hand; the second runs the script
on the tiny generated data and compares runs with each other (float32 is the reference).
"""
import json
import math

import pytest
import torch

from tests.conftest import run_script
from tests.train_helpers import RUN, per_step_losses, train
# noqa: F401 (fixtures of the Slurm test)
from tests.test_slurm import job_env, run_job, slurm_cluster, slurm_data
from wellfno import flops

# -- wellfno.flops against hand counts
# --------------------------------------------------------------


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
    # 2 pipes x 4 lanes x 2
    ({"sse2"}, "GenuineIntel", 6, dict(fp32=16, bf16=16, fp16=16)),
    ({"avx2", "fma"}, "GenuineIntel", 6, dict(fp32=32, bf16=32, fp16=32)),     # 2 x 8 x 2
    ({"avx512f", "fma"}, "GenuineIntel", 6, dict(fp32=64, bf16=64, fp16=64)),  # 2 x 16 x 2
    ({"avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16"}, "GenuineIntel", 6, dict(fp32=64,
                                                                                    bf16=1024,
                                                                                    fp16=128)),
    ({"avx512f", "avx2", "fma", "avx512_bf16"}, "AuthenticAMD", 25, dict(fp32=32, bf16=64,
                                                                         fp16=32)),  # Zen 4
])
def test_cpu_flops_per_cycle_from_flags(flags, vendor, family, expected):
    per_cycle, why = flops.cpu_flops_per_cycle(flags, vendor, family)
    assert per_cycle == expected, why


def test_this_cpu_has_an_estimated_peak():
    peak = flops.cpu_peak(cores=1)
    assert peak.estimate and "estimate" in peak.source
    if peak.flops:  # a machine without a readable clock gives no estimate, and says so
        # one core: between 1 GFLOP/s and 1 TFLOP/s
        assert 1e9 < peak.flops["fp32"] < 1e12, peak.source


@pytest.mark.parametrize("name, row", [("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA H100 80GB HBM3",
                                                                           "H100 SXM"),
                                       ("NVIDIA H100 PCIe", "H100 PCIe"), ("AMD Instinct MI250X",
                                                                           "MI250X (one GCD)"),
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
    a100 = flops.Peak("A100", {k: v for k, v in flops.GPU_PEAKS["A100"].items() if k != "source"},
                      "datasheet")
    assert a100.for_amp("bf16") == (312e12, "bf16")
    # cuDNN's default on Ampere+
    assert a100.for_amp("none", tf32_convolutions=True) == (156e12, "tf32")
    assert a100.for_amp("none", tf32_convolutions=False) == (19.5e12, "fp32")
    mi250x = flops.Peak("MI250X", {k: v for k,
                                   v in flops.GPU_PEAKS["MI250X (one GCD)"].items() if k != "source"}, "")
    assert mi250x.for_amp("none", tf32_convolutions=False) == (47.85e12, "fp32_matrix")
    result = flops.utilization(2e9, 50.0, a100, "bf16")  # 2 GFLOP per sample at 50 samples/s
    assert result["achieved_flops_per_s"] == 1e11 and result["mfu"] == pytest.approx(1e11 / 312e12)


# -- the script
# ---------------------------------------------------------------------------------------

STEP = "09_compile_mfu"  # the cross-step matrix (tests/conftest.py) supplies `script`


@pytest.mark.slow
def test_metrics_say_how_far_from_the_peak(script, tiny_data_dir, tmp_path):
    metrics = train(script, tiny_data_dir, tmp_path / "run", "--max-steps", "2", "--width", "8",
                    "--modes", "4",
                    "--layers", "2")
    # The script's count is the one wellfno.flops gives for the same model and input size.
    from wellfno.model import NextFrameFNO

    ones = torch.ones(2)
    model = NextFrameFNO(2, 1, dict(mean=0 * ones, std=ones, mean_delta=0 * ones, std_delta=ones),
                         modes=4, width=8, layers=2)
    x = torch.zeros(8, 2, 16, 16)
    assert metrics["flops_per_sample"] == flops.training_flops_per_sample(model, x, x,
                                                                          model.loss)["per_sample"]
    assert metrics["achieved_flops_per_s"] == pytest.approx(metrics["flops_per_sample"] * metrics["samples_per_second"])
    assert metrics["peak_flops_per_s"] > 0 and 0 < metrics["mfu"] < 1
    assert metrics["mfu"] == pytest.approx(metrics["achieved_flops_per_s"] / metrics["peak_flops_per_s"])
    assert metrics["peak_memory_bytes"] > 0  # solution 08's


# torch.compile only reorders and fuses float32 arithmetic: the same losses to float32 rounding.
@pytest.mark.slow
def test_compile_tracks_float32(script, tiny_data_dir, tmp_path):
    steps = ["--max-steps", "3", "--log-every", "1"]
    reference = train(script, tiny_data_dir, tmp_path / "eager", *steps)
    compiled = train(script, tiny_data_dir, tmp_path / "compiled", *steps, "--compile", timeout=900)
    assert per_step_losses(compiled) == pytest.approx(per_step_losses(reference), rel=1e-4)
    assert compiled["compile_seconds"] > 0


@pytest.mark.parametrize("options, message", [
    (["--layers", "0"], "--layers"),
    pytest.param(["--width", "0"], "--width", marks=pytest.mark.slow),
    # NVTX ranges need a GPU
    pytest.param(["--nvtx", "--device", "cpu"], "--nvtx", marks=pytest.mark.slow),
    pytest.param(["--nvtx", "--profile"], "one at a time", marks=pytest.mark.slow),
])
def test_impossible_values_are_one_line_errors(script, tiny_data_dir, tmp_path, options, message):
    result = run_script(script, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", *RUN,
                        *options)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert not (tmp_path / "out").exists(), "nothing may be written"


@pytest.mark.slow
def test_modes_beyond_the_grid_is_one_line_error(script, tiny_data_dir, tmp_path):
    result = run_script(script, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", *RUN,
                        "--modes", "17")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and "--modes" in result.stderr and "16" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_compile_without_a_compiler_is_one_line_error(script, tiny_data_dir, tmp_path):
    # No g++ or clang++ on PATH (the script is started by absolute path, so it needs none).
    result = run_script(script, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", *RUN,
                        "--compile",
                        "--device", "cpu", env={"PATH": str(tmp_path / "empty"), "CXX": "g++"})
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and "compiler" in result.stderr
    assert "without --compile" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_efficiency_job_writes_its_table(slurm_cluster, slurm_data, tmp_path):  # noqa: F811
    """slurm/09_compile_mfu.sbatch on the local test cluster: the benchmark's rows, no vendor profiler on a CPU."""
    run_root = tmp_path / "runs"
    job = run_job("09_compile_mfu.sbatch", "--steps", "2", "--no-compile", "--width", "8",
                  "--batch-size", "4",
                  env=job_env(run_root, slurm_data), run_root=run_root, timeout=900)
    job.assert_completed()
    result = json.loads((job.run_dir / "efficiency.json").read_text())
    rows = result["data"]["rows"]
    assert [r["row"] for r in rows] == ["06 as is", "+ no host syncs", "+ bf16",
                                        "+ width 8, batch 4"]
    assert all(r["samples_per_s"] > 0 and r["achieved_flops_per_s"] > 0 for r in rows)
    assert (job.run_dir / "efficiency.png").is_file()
    assert "no vendor profiler run" in job.out.read_text()
