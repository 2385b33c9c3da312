"""Mixed precision for the FNO (exercise 09): can this device do it, and the FNO's FFT workaround.

`check_amp` refuses a precision the device cannot run as such: bf16 on a GPU or a CPU without
bfloat16 units is emulated, and runs slower than float32. `spectral_convs_in_float32` is taught in
solution 09 (`solutions/09_mixed_precision/fno.py`); later solutions import it from here
(solution 11 on), and `autocast_and_scaler` is its block that
sets up GradScaler and autocast (solution 10 on) (tests/test_drift.py: the same syntax trees as
solution 09's).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

import torch

from wellfno.cli import UserError

# A CPU's bfloat16 arithmetic units, by the names /proc/cpuinfo (x86 `flags`, Arm `Features`) and
# torch.cpu.get_capabilities() give them: x86 AVX512_BF16 (bf16 dot products: Intel Cooper Lake
# and Sapphire Rapids on, AMD Zen 4 on) and AMX-BF16 (tiles: Intel Sapphire Rapids on); Arm
# FEAT_BF16 (BFDOT, BFMMLA: Neoverse V1, N2, Apple M2 on) and its SVE form. Without one, oneDNN
# still runs bf16 (AVX-512 alone makes torch.ops.mkldnn._is_mkldnn_bf16_supported() true) by
# converting to float32 and back around float32 arithmetic: emulated, slower than float32.
CPU_BF16_UNITS = {"avx512_bf16": "AVX512_BF16", "amx_bf16": "AMX-BF16", "bf16": "Arm BF16",
                  "svebf16": "SVE BF16", "sve_bf16": "SVE BF16"}


def autocast_available(device_type: str) -> bool:
    """torch.amp.is_autocast_available, which torch has only from 2.4 (before: cuda and cpu)."""
    check = getattr(torch.amp, "is_autocast_available", None)
    return check(device_type) if check is not None else device_type in ("cuda", "cpu")


def cpuinfo_flags(text: str) -> set[str]:
    """The first processor's instruction-set flags in a /proc/cpuinfo text: x86 `flags`, Arm
    `Features` (empty where it has neither)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_flags() -> set[str] | None:
    """This CPU's instruction-set flags, or None where nothing says.

    torch.cpu.get_capabilities() (newer torch; pytorch/cpuinfo, so macOS and Windows too:
    https://docs.pytorch.org/docs/main/generated/torch.cpu.get_capabilities.html), else Linux's
    /proc/cpuinfo.
    """
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    if capabilities is not None:
        try:
            return {name for name, value in capabilities().items() if value is True}
        except RuntimeError:  # cpuinfo could not read this CPU: the kernel may still say
            pass
    try:
        return cpuinfo_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return None


def cpu_bf16_units(flags: Iterable[str]) -> list[str]:
    """The bfloat16 arithmetic units among a CPU's `flags` (CPU_BF16_UNITS), by name."""
    return sorted({CPU_BF16_UNITS[f] for f in set(flags) & CPU_BF16_UNITS.keys()})


def check_amp(amp: str, device: torch.device) -> None:
    """One `error:` line when `--amp amp` cannot run on `device` as that precision."""
    if amp == "bf16" and device.type == "cuda":
        try:  # emulated bf16 (e.g. on a V100) runs slower than float32: only the real thing counts
            native = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch before 2.4 has no such flag
            native = torch.cuda.is_bf16_supported()
        if not native:
            raise UserError(f"--amp bf16: {torch.cuda.get_device_name(device)} has no bfloat16 "
                            "units: "
                            f"use --amp fp16")
    if amp == "bf16" and device.type == "cpu":
        flags = cpu_flags()  # None: nothing tells (no torch query, no /proc/cpuinfo): let it run
        if flags is not None and not cpu_bf16_units(flags):
            raise UserError("--amp bf16: this CPU has no bfloat16 units (AVX512_BF16, AMX-BF16 or "
                            "Arm BF16), so bf16 would be emulated, slower than float32: use "
                            "--amp none")
    if amp != "none" and not autocast_available(device.type):
        raise UserError(f"--amp {amp}: torch has no autocast for {device.type}: use --amp none")


def spectral_convs_in_float32(fno):
    """Feed every SpectralConv float32, so its FFTs and complex weights stay float32 under autocast.

    Autocast puts the 1x1 convolutions (most of the FLOPs) in bf16/fp16, and their output goes into
    the FFT. CPU autocast casts FFTs to float32 itself; CUDA and ROCm autocast do not, and there
    torch.fft refuses bfloat16 (pytorch/pytorch#117844) and does float16 only for powers of 2.
    """
    def to_float32(module, args):
        return (args[0].float(), *args[1:])
    for conv in fno.fno_blocks.convs:
        conv.register_forward_pre_hook(to_float32)



def autocast_and_scaler(amp, device):
    """Solution 09's GradScaler (fp16 only) and autocast context for `--amp` (a no-op for none)."""
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")  # fp16's small range
    amp_dtype = dict(bf16=torch.bfloat16, fp16=torch.float16).get(amp)
    autocast = (lambda: torch.autocast(device.type, dtype=amp_dtype)) if amp_dtype else \
        contextlib.nullcontext
    return scaler, autocast
