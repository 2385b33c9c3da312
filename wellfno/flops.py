"""How far from the limit: FLOPs per training sample, achieved FLOP/s, model-FLOPs utilization (MFU).

    python -m wellfno.flops                      # peak table, and the FLOPs of the default model
    python -m wellfno.flops --width 64 --size 128

FLOPs are counted, not guessed: `torch.utils.flop_counter.FlopCounterMode` watches one forward
and backward pass of the real model on the real input size and adds up each operator's FLOPs
(a multiply-add is 2). Two corrections to its defaults, because an FNO is not a transformer:

* complex matrix products (the spectral weights) are counted as complex: one complex
  multiply-add is 4 real multiplies and 4 real adds, 4x what the real formula counts;
* FFTs, which FlopCounterMode does not count, get the usual estimate of 5 N log2 N FLOPs per
  complex transform of N points and half that for a real one (FFTW's convention:
  https://www.fftw.org/speed/method.html). They are reported apart (`by_kind`).

MFU = achieved FLOP/s / peak FLOP/s. The peak is the device's dense (no sparsity) peak for the
arithmetic the run's matrix products use: BF16 with `--amp bf16`, FP16 with `--amp fp16`, and
with `--amp none` the highest FP32-input peak the device offers (TF32 tensor cores on NVIDIA,
which cuDNN uses for convolutions by default, torch.backends.cudnn.allow_tf32; AMD's FP32
matrix cores). So MFU can never exceed 1 by picking a too-small peak.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from wellfno.cli import UserError, run_main

aten = torch.ops.aten

# Dense (no sparsity) peak FLOP/s from the vendors' datasheets. NVIDIA prints tensor-core peaks
# "with sparsity": the dense peak is half of that. ROCm shows each GCD of an MI250X as its own
# GPU, so its row is one GCD: half of the module's figures.
GPU_PEAKS = {
    "A100": dict(fp32=19.5e12, tf32=156e12, bf16=312e12, fp16=312e12,
                 source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    "H100 SXM": dict(fp32=67e12, tf32=494.5e12, bf16=989.5e12, fp16=989.5e12,
                     source="https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"),
    "H100 PCIe": dict(fp32=51e12, tf32=378e12, bf16=756.5e12, fp16=756.5e12,
                      source="https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"),
    "H100 NVL": dict(fp32=60e12, tf32=417.5e12, bf16=835.5e12, fp16=835.5e12,
                     source="https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"),
    "H200": dict(fp32=67e12, tf32=494.5e12, bf16=989.5e12, fp16=989.5e12,
                 source="https://www.nvidia.com/en-us/data-center/h200/"),
    "H200 NVL": dict(fp32=60e12, tf32=417.5e12, bf16=835.5e12, fp16=835.5e12,
                     source="https://www.nvidia.com/en-us/data-center/h200/"),
    "MI250X (one GCD)": dict(fp32=23.95e12, fp32_matrix=47.85e12, bf16=191.5e12, fp16=191.5e12,
                             source="https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html "
                                    "(per module: 47.9 / 95.7 / 383 TFLOP/s; two GCDs per module)"),
    # ROCm shows an MI300X as one GPU in its default (SPX) partition mode: the row is the whole
    # module's; in CPX mode each of its 8 XCDs is a GPU of its own, an eighth of these.
    "MI300X": dict(fp32=163.4e12, fp32_matrix=163.4e12, tf32=653.7e12, bf16=1307.4e12,
                   fp16=1307.4e12,
                   source="https://rocm.docs.amd.com/en/latest/conceptual/gpu-arch/mi300.html "
                          "(Peak-performance capabilities of the MI300X; dense)"),
    "MI300A": dict(fp32=122.6e12, fp32_matrix=122.6e12, tf32=490.3e12, bf16=980.6e12, fp16=980.6e12,
                   source="https://www.amd.com/en/products/accelerators/instinct/mi300/mi300a.html"),
}
# How torch.cuda.get_device_name() spells them, matched as whole words ("A100" is not "RTX A1000"),
# first match wins. ROCm names one MI250 PCI id (0x740c) "AMD Instinct MI250X/MI250" (torch's
# collect_env on such nodes; ray's amd_gpu.py product table): it may be either, and the MI250X's
# peak, the larger, is taken, so that MFU is never overstated. A plain MI250 (lower peaks) has no
# row: no MFU rather than one against the wrong peak.
_NAME_KEYS = (("MI300X", "MI300X"), ("MI300A", "MI300A"), ("MI250X", "MI250X (one GCD)"),
              ("H200 NVL", "H200 NVL"),
              ("H200", "H200"), ("H100 NVL", "H100 NVL"), ("H100 PCIe", "H100 PCIe"),
              ("H100", "H100 SXM"), ("A100", "A100"))
AMD_ZEN4_FAMILY = 25  # Zen 3/4 (family 19h): a 512-bit AVX-512 op runs as two 256-bit halves
AMX_BF16_FLOPS_PER_CYCLE = 1024  # per core; Intel 64 and IA-32 Architectures Optimization Reference Manual, AMX


@dataclass
class Peak:
    name: str
    flops: dict[str, float]  # precision -> FLOP/s (dense)
    source: str
    estimate: bool = False
    notes: list[str] = field(default_factory=list)

    def for_amp(self, amp: str, tf32_convolutions: bool | None = None) -> tuple[float | None, str]:
        """(peak FLOP/s, which one) that MFU uses for a run with --amp `amp`."""
        if amp in ("bf16", "fp16"):
            return self.flops.get(amp), amp
        if tf32_convolutions is None:
            tf32_convolutions = torch.backends.cudnn.allow_tf32
        candidates = {k: v for k, v in self.flops.items() if k in ("fp32", "fp32_matrix")
                      or (k == "tf32" and tf32_convolutions)}
        if not candidates:
            return None, "fp32"
        key = max(candidates, key=candidates.get)
        return candidates[key], key


def _cpuinfo() -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo ({} where there is none: macOS, Windows)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    info = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def cpu_model() -> str:
    """The CPU's model name as `lscpu` shows it ("AMD EPYC 7742 64-Core Processor")."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown CPU"


def _max_clock_hz(info: dict[str, str]) -> tuple[float | None, str]:
    try:  # the highest clock the kernel reports (turbo included), if cpufreq is there
        khz = int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text())
        return khz * 1e3, "cpufreq cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    if "cpu MHz" in info:  # the current clock (in a VM: often the nominal one)
        return float(info["cpu MHz"]) * 1e6, "/proc/cpuinfo cpu MHz"
    return None, "no clock found"


def cpu_flops_per_cycle(flags: set[str], vendor: str = "", family: int | None = None,
                        machine: str = "x86_64") -> tuple[dict[str, int], str]:
    """FP32/BF16/FP16 FLOPs per cycle per core from the instruction-set flags (an estimate).

    Assumes 2 FMA pipes per core (Intel since Haswell, AMD since Zen 2; some Xeon Silver/Bronze
    have 1) and 2 FLOPs per FMA lane: FP32 = 2 pipes x (vector bits / 32) x 2.
    """
    if machine not in ("x86_64", "AMD64", "i686"):
        bits, why = 128, f"{machine}: 128-bit vectors assumed"
    elif "avx512f" in flags and not (vendor == "AuthenticAMD" and family == AMD_ZEN4_FAMILY):
        bits, why = 512, "AVX-512"
    elif "fma" in flags or "avx2" in flags:
        bits, why = 256, "AVX2/FMA" + (" (AVX-512 runs as 2x256 bits on Zen 4)" if "avx512f" in flags else "")
    else:
        bits, why = 128, "SSE"
    fp32 = 2 * (bits // 32) * 2
    out = dict(fp32=fp32, bf16=fp32, fp16=fp32)
    if "amx_bf16" in flags:
        out["bf16"], why = AMX_BF16_FLOPS_PER_CYCLE, why + ", AMX BF16"
    elif "avx512_bf16" in flags:
        out["bf16"], why = 2 * fp32, why + ", AVX512_BF16 dot products (2 per FP32 lane)"
    if "amx_fp16" in flags:
        out["fp16"] = AMX_BF16_FLOPS_PER_CYCLE
    elif "avx512_fp16" in flags:
        out["fp16"] = 2 * fp32
    return out, why


def cpu_peak(cores: int | None = None) -> Peak:
    """Estimated peak of `cores` cores of this CPU (default: the threads torch computes with)."""
    info = _cpuinfo()
    cores = cores or torch.get_num_threads()
    cores = min(cores, len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else cores
    flags = set(info.get("flags", info.get("Features", "")).split())
    family = int(info["cpu family"]) if info.get("cpu family", "").isdigit() else None
    per_cycle, why = cpu_flops_per_cycle(flags, info.get("vendor_id", ""), family, platform.machine())
    clock, clock_source = _max_clock_hz(info)
    name = f"{cpu_model()}, {cores} core{'s' * (cores != 1)}"
    source = (f"estimate: {cores} core(s) x {clock / 1e9:.2f} GHz ({clock_source}) x FLOPs/cycle/core "
              f"{per_cycle} ({why}; 2 FMA pipes assumed; flags from /proc/cpuinfo)") if clock else \
        f"no estimate: {clock_source}"
    flops = {k: cores * clock * v for k, v in per_cycle.items()} if clock else {}
    return Peak(name, flops, source, estimate=True)


def gpu_row(name: str) -> str | None:
    """The GPU_PEAKS row of a device name, or None: each key must appear as whole words (not
    inside a longer model number: RTX A1000, GH200 and MI250 are not A100, H200 and MI250X)."""
    for key, row in _NAME_KEYS:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name, re.IGNORECASE):
            return row
    return None


def device_peak(device: torch.device) -> Peak:
    """The peak of `device`: the table for known GPUs, an estimate for a CPU, empty otherwise."""
    if device.type == "cpu":
        return cpu_peak()
    gpu = torch.cuda.get_device_name(device)
    row = gpu_row(gpu)
    if row:
        peaks = dict(GPU_PEAKS[row])
        flops = {k: v for k, v in peaks.items() if k != "source"}
        return Peak(f"{gpu} ({row})", flops, peaks["source"])
    return Peak(gpu, {}, "not in wellfno/flops.py GPU_PEAKS: add its datasheet's dense peaks to get an MFU")


# -- counting -------------------------------------------------------------------------------------

def _complex_aware(counted):
    """A FlopCounterMode formula that counts a complex product as 4 real ones."""
    def count(*args, out_val=None, **kwargs):
        factor = 4 if any(isinstance(a, torch.Tensor) and a.is_complex() for a in args) else 1
        return factor * counted(*args, out_val=out_val, **kwargs)
    count._get_raw = True  # FlopCounterMode hands it the tensors, not only their shapes
    return count


def fft_flops(points: int, transforms: int, real: bool) -> int:
    """5 N log2 N per complex transform of N points, half for a real one (FFTW's convention)."""
    if points <= 1:
        return 0
    per = 5 * points * math.log2(points)
    return int(round(transforms * (per / 2 if real else per)))


def _fft_formula(kind: str):
    def count(x, dim, *args, out_val=None, **kwargs):
        full = out_val if kind == "c2r" else x  # the transform's length is the real signal's
        points = math.prod(full.shape[d] for d in dim)
        return fft_flops(points, full.numel() // max(points, 1), real=kind != "c2c")
    count._get_raw = True
    return count


FLOP_FORMULAS = {
    **{op: _complex_aware(flop_registry[op]) for op in (aten.mm, aten.addmm, aten.bmm, aten.baddbmm)},
    aten._fft_r2c: _fft_formula("r2c"), aten._fft_c2r: _fft_formula("c2r"), aten._fft_c2c: _fft_formula("c2c"),
}
FFT_OPS = {aten._fft_r2c, aten._fft_c2r, aten._fft_c2c}


def count_flops(step) -> dict:
    """Run `step()` under FlopCounterMode; {'total': FLOPs, 'by_op': {op: FLOPs}, 'by_kind': ...}."""
    with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as counter:
        step()
    by_op = {str(op).split(".")[-1]: int(n) for op, n in counter.get_flop_counts()["Global"].items()}
    fft = sum(int(n) for op, n in counter.get_flop_counts()["Global"].items() if op in FFT_OPS)
    total = int(counter.get_total_flops())
    return dict(total=total, by_op=by_op, by_kind=dict(matmul_conv=total - fft, fft=fft))


def training_flops_per_sample(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn) -> dict:
    """FLOPs of one forward + backward pass on the batch (x, y), per sample.

    The model's gradients are left as they were (the count runs a real backward pass); the
    optimizer step is not counted (a few FLOPs per parameter, nothing next to the convolutions).
    """
    saved = [p.grad for p in model.parameters()]
    for p in model.parameters():
        p.grad = None

    def step():
        loss_fn(model(x), y).backward()

    try:
        counted = count_flops(step)
    finally:
        for p, g in zip(model.parameters(), saved):
            p.grad = g
    n = len(x)
    return dict(per_sample=counted["total"] / n, batch_size=n, by_op={k: v / n for k, v in counted["by_op"].items()},
                by_kind={k: v / n for k, v in counted["by_kind"].items()})


def utilization(flops_per_sample: float, samples_per_s: float, peak: Peak, amp: str, devices: int = 1) -> dict:
    """metrics.json's efficiency entries: achieved FLOP/s, the peak used and MFU (None without a peak).

    `samples_per_s` is the whole job's (all ranks); so is the peak: `devices` times one device's.
    """
    achieved = flops_per_sample * samples_per_s
    peak_flops, precision = peak.for_amp(amp)
    total_peak = peak_flops * devices if peak_flops else None
    return dict(flops_per_sample=flops_per_sample, achieved_flops_per_s=achieved, peak_flops_per_s=total_peak,
                peak_flops_per_device=peak_flops, devices=devices, peak_precision=precision, peak_device=peak.name,
                peak_source=peak.source, peak_is_estimate=peak.estimate,
                mfu=achieved / total_peak if total_peak else None)


def utilization_line(efficiency: dict) -> str:
    """Solution 10's line for `utilization`'s entries: achieved GFLOP/s, MFU of the devices' peak."""
    mfu = efficiency["mfu"]
    return (f"{efficiency['achieved_flops_per_s'] / 1e9:.2f} GFLOP/s achieved; MFU "
            f"{'unknown' if mfu is None else f'{100 * mfu:.2f}%'} of {efficiency['devices']} x "
            f"{efficiency['peak_device']} ({efficiency['peak_precision']} peak"
            f"{', an estimate' if efficiency['peak_is_estimate'] else ''})")


def peak_table(cpu: Peak | None = None, include_cpu: bool = True) -> str:
    """Markdown table: dense TFLOP/s per precision for this CPU (an estimate) and the GPUs of GPU_PEAKS."""
    columns = ("fp32", "fp32_matrix", "tf32", "bf16", "fp16")
    lines = ["| device | " + " | ".join(columns) + " | source |", "|---" * (len(columns) + 2) + "|"]
    rows = []
    if include_cpu:
        cpu = cpu or cpu_peak()
        rows.append((cpu.name + " (estimate)", cpu.flops, cpu.source))
    rows += [(name, row, row["source"]) for name, row in GPU_PEAKS.items()]
    for name, flops, source in rows:
        cells = [f"{flops[c] / 1e12:.4g}" if c in flops else "-" for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {source} |")
    return "\n".join(lines)


def efficiency_markdown(rows: list[dict]) -> str:
    """The table of solutions/11_compile/benchmark.py: one row per idea, each against the row
    it builds on (its speed-up is that idea's own); a skipped row's reason goes under the table."""
    lines = ["| row | samples/s | against | speed-up | GFLOP/s | MFU | peak used | "
             "peak memory (MiB) | compile (s) |",
             "|---|---:|---|---:|---:|---:|---|---:|---:|"]
    notes = []

    def cell(value, fmt):
        return "-" if value is None else fmt.format(value)

    for r in rows:
        against = r["against"] or "-"
        if r["skipped"]:
            lines.append(f"| {r['row']} | skipped | {against} | - | - | - | - | - | - |")
            notes.append(f"{r['row']}: skipped: {r['skipped']}.")
            continue
        speedup = cell(r["speedup"], "{:.2f}×")
        if r["speedup"] is not None and r["speedup_of"] != "samples/s":
            speedup += f" ({r['speedup_of']})"
        memory = None if r["peak_memory_bytes"] is None else r["peak_memory_bytes"] / 2**20
        lines.append(f"| {r['row']} | {r['samples_per_s']:.1f} | {against} | {speedup} | "
                     f"{r['achieved_flops_per_s'] / 1e9:.2f} | "
                     f"{cell(None if r['mfu'] is None else 100 * r['mfu'], '{:.2f}%')} | "
                     f"{r['peak_precision']} | {cell(memory, '{:.0f}')} | "
                     f"{cell(r['compile_seconds'], '{:.0f}')} |")
    return "\n".join(lines + ([""] + notes if notes else []))


def efficiency_summary(data: dict) -> str:
    """One sentence of the ladder (the course README's results row): each idea's own speed-up."""
    rows = data["rows"]
    parts = [f"{rows[0]['row']}: {rows[0]['samples_per_s']:.1f} samples/s"]
    for r in rows[1:]:
        if r["skipped"]:
            parts.append(f"{r['row']}: skipped, {r['skipped'].split(', so ')[0]}")
        elif r["speedup_of"] == "samples/s":
            text = f"{r['row']} **{r['speedup']:.2f}×** vs {r['against'][:2]}"
            if r["compile_seconds"]:
                text += f" ({r['compile_seconds']:.0f} s compiling, timed apart)"
            parts.append(text)
        else:
            mfu = ("MFU unknown" if r["mfu"] is None else
                   f"MFU **{100 * r['mfu']:.1f} %** of the {r['peak_precision']} peak "
                   f"({data['peak_device']}"
                   f"{', an estimate' if data['peak_source'].startswith('estimate') else ''})")
            parts.append(f"{r['row'][3:]}: {r['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s "
                         f"({r['speedup']:.2f}× the FLOP/s of {r['against']}), {mfu}")
    return "; ".join(parts)


def gpu_peak_table(root: Path) -> str:
    """README renderer: the GPU rows of the peak table (datasheet values, the same on every machine)."""
    return peak_table(include_cpu=False)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--width", type=int, default=32, help="FNO hidden channels")
    p.add_argument("--modes", type=int, default=12, help="Fourier modes per dimension")
    p.add_argument("--layers", type=int, default=4, help="FNO blocks")
    p.add_argument("--size", type=int, default=32, help="grid points per side")
    p.add_argument("--fields", type=int, default=2, help="fields per frame (Gray-Scott: 2)")
    args = p.parse_args(argv)
    if min(args.width, args.modes, args.layers, args.size, args.fields) < 1:
        raise UserError("--width, --modes, --layers, --size and --fields must be at least 1")
    from wellfno.model import NextFrameFNO

    ones = torch.ones(args.fields)
    model = NextFrameFNO(args.fields, 1, dict(mean=0 * ones, std=ones, mean_delta=0 * ones, std_delta=ones),
                         modes=args.modes, width=args.width, layers=args.layers)
    x = torch.randn(2, args.fields, args.size, args.size)
    counted = training_flops_per_sample(model, x, x, model.loss)
    print(f"FNO width {args.width}, modes {args.modes}, layers {args.layers}, {args.size}x{args.size}: "
          f"{counted['per_sample'] / 1e6:.1f} MFLOP per training sample (forward + backward), of which "
          f"FFT {counted['by_kind']['fft'] / 1e6:.1f}")
    print("\nPeak TFLOP/s (dense):\n" + peak_table())


if __name__ == "__main__":
    run_main(main)
