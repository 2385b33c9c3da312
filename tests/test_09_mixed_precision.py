"""Exercise 09 check-your-work: mixed precision (bf16, fp16) for the FNO, tracking float32.

    .venv/bin/python -m pytest -q tests/test_09_mixed_precision.py --script YOUR_SCRIPT

Runs the script on the tiny generated data and compares low-precision runs with float32.
"""
import math
from pathlib import Path

import pytest
import torch

from tests.checks import last_error_line, require, require_run, task
from tests.conftest import REPO, exit_of, pythonpath_with
from tests.fixtures.cpuinfo import RECORDED
from tests.train_helpers import RUN, per_step_losses, run_once, train
from wellfno.amp import CPU_BF16_UNITS, cpu_bf16_units, cpu_flags, cpuinfo_flags

STEP = "09_mixed_precision"  # the cross-step matrix (tests/conftest.py) supplies `script`
STEPS = ["--max-steps", "5", "--log-every", "1"]
CPU_SEAM = REPO / "tests" / "cpu_seam"  # torch.cpu.get_capabilities() as on a recorded CPU


def as_cpu(name: str) -> dict:
    """The environment that runs a script as on the recorded CPU `name` for wellfno.amp's bf16
    check (tests/cpu_seam/sitecustomize.py; tests/fixtures/cpuinfo.py)."""
    return {"PYTHONPATH": pythonpath_with(CPU_SEAM), "WELLFNO_CPU_SEAM_FLAGS": " ".join(
        sorted(cpuinfo_flags(RECORDED[name][1])))}


def this_cpu_has_bf16_units() -> bool:
    return bool(cpu_bf16_units(cpu_flags() or ()))


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
def test_mixed_precision_tracks_float32(script, tiny_data_dir, finished_run, tmp_path, amp,
                                       tolerance):
    """On a CPU without bf16 units the script refuses --amp bf16 (the next tests); there the bf16
    run goes as on a recorded CPU with them (its bf16 check passes), because emulated bf16 rounds
    as native bf16 does: the losses are what this test checks, not the speed. The float32
    reference is one in-process run for both precisions (and the peak-memory check); so is each
    low-precision run, but for the one that needs the recorded CPU's environment (a process)."""
    reference = per_step_losses(run_once(finished_run, script, tiny_data_dir, *STEPS)[0])
    fix = f"add --amp with autocast {task('09', 1)}" if amp == "bf16" else \
        f"scale the loss and step the optimizer through GradScaler {task('09', 1)}"
    if amp == "bf16" and not this_cpu_has_bf16_units():
        low = per_step_losses(train(script, tiny_data_dir, tmp_path / amp, *STEPS, "--amp", amp,
                                    fix=fix, env=as_cpu("intel_xeon_amx")))
    else:
        low = per_step_losses(run_once(finished_run, script, tiny_data_dir, *STEPS, "--amp",
                                       amp)[0])
    require(len(low) == len(reference) == 5, f"5 steps logged {len(reference)} float32 and "
            f"{len(low)} {amp} losses (allowed: 5 each) {task('09', 1)}")
    relative = [abs(a - b) / b for a, b in zip(low, reference)]
    require(max(relative) < tolerance, f"--amp {amp}: the loss is {max(relative):.1e} (relative) "
            f"from float32 (allowed: {tolerance:.0e}): keep the spectral convolutions float32 "
            f"{task('09', 2)}")
    require(max(relative) > 0, f"--amp {amp} gave exactly the float32 losses: autocast the forward "
            f"pass on the device it runs on, torch.autocast(device.type, dtype=...) "
            f"{task('09', 1)}")


# What reaches the FFTs is what task 2 is about, and on a CPU the losses cannot show it: CPU
# autocast casts an FFT's input to float32 below torch.fft's functions, where a GPU's hands it on
# as it came (bf16: refused, pytorch/pytorch#117844). So the check records the dtype that
# torch.fft.rfftn, neuralop's and the course's forward transform, is called with: the dtype a GPU's
# FFT would get. fp16, which a CPU without bf16 units autocasts as well; one step, a small model.
@pytest.mark.slow
def test_the_ffts_get_float32_under_autocast(script_module, tiny_data_dir, tmp_path, monkeypatch):
    handed, rfftn = [], torch.fft.rfftn

    def recording(x, *args, **kwargs):
        handed.append(x.dtype)
        return rfftn(x, *args, **kwargs)

    monkeypatch.setattr(torch.fft, "rfftn", recording)
    result = exit_of(script_module, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", *RUN,
                     "--max-steps", "1", "--amp", "fp16", "--width", "8", "--modes", "4")
    require_run(result, "--amp fp16 --max-steps 1", f"add --amp with autocast {task('09', 1)}")
    low = sorted({str(dtype).removeprefix("torch.") for dtype in handed} - {"float32"})
    require(handed and not low, f"under --amp fp16 the FFTs were handed "
            f"{' and '.join(low) or 'nothing'} (allowed: float32 alone): register a forward "
            f"pre-hook on every model.fno.fno_blocks.convs that casts the input to float32 "
            f"{task('09', 2)}")


# GradScaler's state, its scale and the steps since it last grew it, goes with the checkpoint: a
# resumed fp16 run goes on with the scale it had. The 5 --amp fp16 steps of
# test_mixed_precision_tracks_float32 (the same run), then their checkpoint with the scale set to
# 1000 resumed for 2 steps: 1000 is no power of 2, so a scale loaded from it stays 1000 x 2^k
# (halved on an overflow), and torch's 65536 never is.
@pytest.mark.slow
def test_the_grad_scaler_steps_and_resumes(script, script_module, tiny_data_dir, finished_run,
                                           tmp_path):
    _, out, _ = run_once(finished_run, script, tiny_data_dir, *STEPS, "--amp", "fp16")
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    scaler = state.get("scaler") or {}
    require("scale" in scaler, "the checkpoint of an --amp fp16 run holds no GradScaler state "
            "(a disabled scaler's is empty): create it enabled for fp16 and save "
            f"scaler.state_dict() with the checkpoint {task('09', 1)}")
    require(scaler.get("_growth_tracker", 0) > 0 or scaler["scale"] != 2.0 ** 16,
            "after 5 --amp fp16 steps the checkpoint's GradScaler is as created (scale 65536, no "
            "step counted): scaler.scale(loss).backward(), scaler.step(optimizer), "
            f"scaler.update() {task('09', 1)}")
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    torch.save({**state, "scaler": {**scaler, "scale": 1000.0}}, resumed / "checkpoint.pt")
    result = exit_of(script_module, "--data-dir", tiny_data_dir, "--out", resumed, *RUN, "--amp",
                     "fp16", "--resume", "--epochs", "2", "--max-steps", "7")
    require_run(result, "--amp fp16 --resume", f"load the GradScaler's state with the rest "
                f"{task('09', 1)}")
    scale = (torch.load(resumed / "checkpoint.pt", weights_only=True).get("scaler") or {}).get(
        "scale")
    require(scale and math.log2(scale / 1000).is_integer(), f"the resumed --amp fp16 run's "
            f"GradScaler scale is {scale} (allowed: the checkpoint's 1000, or halved from it on an "
            f"overflow): on --resume, scaler.load_state_dict(state['scaler']) {task('09', 1)}")

# -- bf16 on a CPU: only with bf16 units (else emulated, slower than float32) ----------------------

@pytest.mark.parametrize("name", sorted(RECORDED))
def test_cpu_bf16_units_from_recorded_cpuinfo(name):
    source, text, has_units = RECORDED[name]
    assert bool(cpu_bf16_units(cpuinfo_flags(text))) == has_units, source


def test_this_cpu_bf16_units_as_proc_cpuinfo_says(monkeypatch):
    """torch's capability query and the kernel's /proc/cpuinfo agree on this CPU's bf16 units;
    without the query (older torch), /proc/cpuinfo is read."""
    proc = Path("/proc/cpuinfo")
    if not proc.is_file():
        pytest.skip("no /proc/cpuinfo (not Linux)")
    kernel = cpuinfo_flags(proc.read_text())
    assert cpu_bf16_units(cpu_flags()) == cpu_bf16_units(kernel)
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    assert cpu_flags() == kernel


def _assert_bf16_refused(result, out):
    line = last_error_line(result.stderr)
    one_line = len(result.stderr.strip().splitlines()) == 1
    require(result.returncode == 2 and one_line and "no bfloat16 units" in line
            and "--amp none" in line,
            f"--amp bf16 on a CPU without bf16 units must stop with one error line naming --amp none "
            f"and exit 2, got exit {result.returncode}: {line}; call check_amp(args.amp, device) "
            f"first {task('09', 1)}")
    require(not out.exists(), f"--amp bf16 was refused but {out.name}/ was written: check --amp "
                              f"before creating the output folder {task('09', 1)}")


@pytest.mark.parametrize("cpu", ["amd_epyc_7763", "intel_xeon_8259cl"])
def test_bf16_on_a_cpu_without_bf16_units_is_one_line_error(script_module, tiny_data_dir, tmp_path,
                                                            monkeypatch, cpu):
    """The real script, as on an AVX2-only EPYC and on an AVX-512 Xeon without AVX512_BF16: in
    this process (exit_of), torch.cpu.get_capabilities() naming the recorded CPU's bf16 units as
    tests/cpu_seam does in a process of its own."""
    # torch 2.5 has no get_capabilities (wellfno.amp then reads /proc/cpuinfo): added here
    flags = cpuinfo_flags(RECORDED[cpu][1])
    real = getattr(torch.cpu, "get_capabilities", dict)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {
        **real(), **{name: name in flags for name in CPU_BF16_UNITS}}, raising=False)
    out = tmp_path / "out"
    result = exit_of(script_module, "--data-dir", tiny_data_dir, "--out", out, *RUN, "--amp",
                     "bf16", "--device", "cpu")
    _assert_bf16_refused(result, out)


def test_bf16_refused_here_if_this_cpu_has_no_bf16_units(script_module, tiny_data_dir, tmp_path):
    if this_cpu_has_bf16_units():
        pytest.skip(f"this CPU has {', '.join(cpu_bf16_units(cpu_flags()))}: bf16 runs here")
    out = tmp_path / "out"
    result = exit_of(script_module, "--data-dir", tiny_data_dir, "--out", out, *RUN, "--amp",
                     "bf16", "--device", "cpu")
    _assert_bf16_refused(result, out)


@pytest.mark.slow
def test_metrics_record_the_peak_memory(script, tiny_data_dir, finished_run):
    metrics = run_once(finished_run, script, tiny_data_dir, *STEPS)[0]  # the float32 reference
    peak = metrics.get("peak_memory_bytes")
    require(isinstance(peak, (int, float)) and peak > 0 and metrics.get("peak_memory_of"),
            f"metrics.json has peak_memory_bytes {peak} and peak_memory_of "
            f"{metrics.get('peak_memory_of')!r} (allowed: a positive byte count, and what it "
            f"measured) {task('09', 4)}")


# This step's Slurm job is tested in tests/test_slurm.py with the other job scripts
# (DESIGN.md), where the jobs run side by side:
# test_slurm_09_runs_each_precision.
