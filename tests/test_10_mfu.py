"""Exercise 10 check-your-work: FLOPs per sample, FLOP/s and MFU against the device's peak.

    .venv/bin/python -m pytest -q tests/test_10_mfu.py --script YOUR_SCRIPT

The first part checks wellfno/flops.py against FLOPs counted by hand; the second runs the script
on the tiny generated data and checks metrics.json's figures against wellfno.flops.
"""
import json
import math

import pytest
import torch

from tests.checks import require, require_refused, task
from tests.conftest import REPO, call_main, exit_of
from tests.train_helpers import RUN, run_once
from wellfno import flops

# -- wellfno.flops against hand counts ---------------------------------------------------


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


def test_mi300x_peaks_are_the_rocm_datasheet_s():
    """ROCm's MI300X table (docs/conceptual/gpu-arch/mi300.md, ROCm/ROCm): vector FP32 163.4,
    matrix FP32 163.4, TF32 653.7, FP16 and BF16 1307.4 TFLOP/s, dense (FP64 vector is 81.7)."""
    row = flops.GPU_PEAKS["MI300X"]
    assert {k: v / 1e12 for k, v in row.items() if k != "source"} == dict(
        fp32=163.4, fp32_matrix=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4)


# Device names as torch.cuda.get_device_name() gives them. NVIDIA: nvidia-smi's names ("NVIDIA RTX
# A1000" is the workstation card, https://www.nvidia.com/en-us/design-visualization/rtx-a1000/, and
# "... Laptop GPU" its mobile one). AMD: ROCm's marketing names, "AMD Instinct MI250X/MI250" as
# torch's collect_env prints it on gfx90a nodes and as ray's AMD product table lists PCI id 0x740c
# (https://github.com/ray-project/ray/blob/master/python/ray/_private/accelerators/amd_gpu.py).
@pytest.mark.parametrize(
    "name, row",
    [
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA RTX A1000", None),
        ("NVIDIA RTX A1000 Laptop GPU", None),
        ("NVIDIA RTX A1000 6GB Laptop GPU", None),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("AMD Instinct MI250X/MI250", "MI250X (one GCD)"),
        ("AMD Instinct MI250", None),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI300X VF", "MI300X"),  # a virtual function (SR-IOV), as clouds show it
        ("AMD Instinct MI325X", None),
    ],
)
def test_gpu_names_match_whole_model_numbers(monkeypatch, name, row):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    peak = flops.device_peak(torch.device("cuda"))
    if row is None:
        assert peak.flops == {} and "GPU_PEAKS" in peak.source, f"{name} taken for {peak.name}"
    else:
        assert peak.name == f"{name} ({row})" and peak.source == flops.GPU_PEAKS[row]["source"]


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

STEP = "10_mfu"  # the cross-step matrix (tests/conftest.py) supplies `script`


def hand_count(layers: int) -> float:
    """wellfno.flops's FLOPs per training sample of the tiny data's model (width 8, modes 4)."""
    from wellfno.model import NextFrameFNO

    ones = torch.ones(2)
    model = NextFrameFNO(2, 1, dict(mean=0 * ones, std=ones, mean_delta=0 * ones, std_delta=ones),
                         modes=4, width=8, layers=layers)
    x = torch.zeros(8, 2, 16, 16)
    return flops.training_flops_per_sample(model, x, x, model.loss)["per_sample"]


# --amp fp16 (which every CPU autocasts): MFU is against the peak of the precision in use, fp16's,
# whose name utilization writes as peak_precision (on most CPUs fp16's number is fp32's).
@pytest.mark.slow
def test_metrics_say_how_far_from_the_peak(script, tiny_data_dir, finished_run):
    metrics = run_once(finished_run, script, tiny_data_dir, "--max-steps", "2", "--width", "8",
                       "--modes", "4", "--layers", "2", "--amp", "fp16")[0]
    # The script's count is the one wellfno.flops gives for the same model and input size.
    counted = hand_count(layers=2)
    got = {key: metrics.get(key) for key in ("flops_per_sample", "achieved_flops_per_s",
                                             "peak_flops_per_s", "mfu", "samples_per_second")}
    missing = [key for key, value in got.items() if not isinstance(value, (int, float))]
    require(not missing, f"metrics.json has no number {', '.join(missing)} {task('10', 1)}")
    require(got["flops_per_sample"] != hand_count(layers=4), "--layers 2 trained the default "
            f"4-layer model: pass layers=args.layers to NextFrameFNO.for_dataset {task('10', 3)}")
    require(got["flops_per_sample"] == counted, f"metrics.json's flops_per_sample is "
            f"{got['flops_per_sample']:.4g} (allowed: {counted:.4g}, training_flops_per_sample of "
            f"a zero batch of the training shape: one forward and backward pass, "
            f"loss_fn(model(x), y).backward() under FlopCounterMode) {task('10', 1)}")
    require(metrics.get("peak_precision") == "fp16", f"with --amp fp16 the MFU is against the "
            f"{metrics.get('peak_precision')} peak (allowed: fp16's, the precision in use): pass "
            f"args.amp to flops.utilization {task('10', 1)}")
    achieved = got["flops_per_sample"] * got["samples_per_second"]
    require(got["achieved_flops_per_s"] == pytest.approx(achieved),
            f"achieved_flops_per_s is {got['achieved_flops_per_s']:.4g} (allowed: "
            f"flops_per_sample x samples_per_second = {achieved:.4g}) {task('10', 1)}")
    require(got["peak_flops_per_s"] > 0 and 0 < got["mfu"] < 1
            and got["mfu"] == pytest.approx(got["achieved_flops_per_s"] / got["peak_flops_per_s"]),
            f"mfu is {got['mfu']:.3g} with peak_flops_per_s {got['peak_flops_per_s']:.4g} "
            "(allowed: achieved over a positive peak, between 0 and 1) from flops.utilization "
            f"{task('10', 1)}")
    require(metrics.get("peak_memory_bytes", 0) > 0,
            f"metrics.json lost exercise 09's peak_memory_bytes {task('09', 4)}")


@pytest.mark.parametrize("options, message", [
    (["--layers", "0"], "--layers"),
    pytest.param(["--width", "0"], "--width", marks=pytest.mark.slow),
    # NVTX ranges need a GPU
    pytest.param(["--nvtx", "--device", "cpu"], "--nvtx", marks=pytest.mark.slow),
    pytest.param(["--nvtx", "--profile"], "one at a time", marks=pytest.mark.slow),
])
def test_impossible_values_are_one_line_errors(script_module, tiny_data_dir, tmp_path, options,
                                               message):
    result = exit_of(script_module, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", *RUN,
                     *options)
    number = 2 if "--nvtx" in options else 3
    require_refused(result, " ".join(options), f"refuse it with a UserError {task('10', number)}",
                    naming=[message], out=tmp_path / "out")


@pytest.mark.slow
def test_modes_beyond_the_grid_is_one_line_error(script_module, tiny_data_dir, tmp_path):
    result = exit_of(script_module, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", *RUN,
                     "--modes", "17")
    require_refused(result, "--modes 17 on a 16 x 16 grid", "check --modes against the grid "
                    f"{task('10', 3)}", naming=["--modes", "16"], out=tmp_path / "out")



# -- drift from 05 fixed in 06 (issue 18, "Why" 4 and 5) ------------------------------------------


def test_docstring_shows_only_this_script(script):
    """The usage block (`--help`'s epilog) names this solution's files, not another step's."""
    import ast
    import re

    if REPO / "solutions" not in script.parents:
        pytest.skip("a participant's own script may document itself as it likes")
    doc = ast.get_docstring(ast.parse(script.read_text()))
    named = set(re.findall(r"solutions/[\w.]+/\w+\.py", doc))
    own = script.parent.relative_to(REPO).as_posix()
    assert named and all(path.startswith(own + "/") for path in named), sorted(named)


def test_amp_check_needs_no_torch_2_4_api(script_module, monkeypatch):
    """torch.amp.is_autocast_available came with torch 2.4; the course supports torch 2.3, whose
    torch.amp lacks it: checking --amp must work without it, and still refuse a device type that
    has no autocast there."""
    monkeypatch.delattr(torch.amp, "is_autocast_available", raising=False)  # as in torch 2.3
    check_amp = getattr(script_module, "check_amp", None)
    require(check_amp, f"your script has no check_amp: import it from wellfno.amp {task('09', 1)}")
    check_amp("fp16", torch.device("cpu"))  # (bf16 needs bf16 units: test_08's)
    check_amp("none", torch.device("cpu"))
    try:
        check_amp("bf16", torch.device("meta"))
        refused = ""
    except script_module.UserError as err:
        refused = str(err)
    require("--amp bf16: torch has no autocast for meta" in refused,
            "check_amp('bf16', meta) did not refuse a device type without autocast: use "
            f"wellfno.amp's check_amp {task('09', 1)}")


def test_profile_table_key_from_traces(script_module, tiny_data_dir, tmp_path, monkeypatch):
    """The profile table's sort key comes from profiling.traces.key_averages_sort_key (torch 2.3
    names it self_cuda_time_total; a hard-coded self_device_time_total crashes there after
    training), asked after training. The peak-memory reset after the float32 FLOP count is a GPU
    branch (a CPU's max RSS has no reset): its effect is tests/test_gpu.py's peak-memory test."""
    from profiling import traces

    events = []
    key, train = traces.key_averages_sort_key, script_module.train_one_epoch
    monkeypatch.setattr(
        script_module, "train_one_epoch", lambda *a, **k: events.append("train") or train(*a, **k)
    )
    monkeypatch.setattr(
        traces, "key_averages_sort_key", lambda device: events.append(("key", device.type)) or key(device)
    )
    call_main(script_module, "--data-dir", tiny_data_dir, "--out", tmp_path / "prof", "--epochs",
              "1", "--batch-size", "1", "--bind", "none", "--profile", "--max-steps", "7",
              "--width", "8", "--modes", "4")  # a small model: a third of the profiled run's time
    require(events == ["train", ("key", "cpu")], "the profile table's sort key must come from "
            "profiling.traces.key_averages_sort_key, asked after training (torch 2.3 names it "
            f"otherwise) {task('01', 5)}")


@pytest.mark.slow
def test_two_ranks_one_memory_line_and_both_devices_peak(script, tiny_data_dir, tmp_path):
    """The job speaks with one voice: rank 0 prints the memory estimate, as in solution 05. Its
    samples/s are the job's, so MFU is against the peak of both ranks' devices."""
    from tests.ddp_helpers import SMALL, assert_ok, launch

    results = launch(
        script,
        2,
        "--data-dir",
        tiny_data_dir,
        "--out",
        tmp_path,
        "--epochs",
        "1",
        "--max-steps",
        "1",
        "--batch-size",
        "2",
        *SMALL,
    )
    assert_ok(results, f"2 ranks must train {task('05', 1)}")
    said = [out.count("a training step needs about") for _, out, _ in results]
    require(said == [1, 0], f"ranks 0 and 1 printed the memory line {said[0]} and {said[1]} times "
            f"(allowed: 1 and 0): the job speaks with rank 0's voice {task('05', 4)}")
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    one, job = metrics.get("peak_flops_per_device"), metrics.get("peak_flops_per_s")
    if one:  # else no peak (a CPU without a readable clock), or not utilization's entries
        require(job == pytest.approx(2 * one), f"with 2 ranks peak_flops_per_s is "
                f"{(job or 0) / one:.3g} x one device's (allowed: 2 x, as the job's samples/s are "
                f"both ranks'): flops.utilization(..., devices=env.world_size) {task('10', 1)}")


