"""`pytest -m gpu`: the course on the GPU this process sees. Skipped where torch sees none.

Run on a GPU node (`make test` there, or `python -m pytest -m gpu tests`); the day-0 job
slurm/00_gpu_check.sbatch runs them too. ROCm builds of torch report AMD GPUs as `cuda`.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import yaml

from tests.conftest import REPO, run_script
from wellfno.grayscott import EMBEDDED as DATASET

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU")]

TRAIN = ["--epochs", "1", "--max-steps", "3", "--batch-size", "4", "--device", "cuda"]
# The checks of one run against another run their scripts with TF32 off: NVIDIA's libraries read
# NVIDIA_TF32_OVERRIDE=0 (cuDNN's float32 convolutions are TF32 by default from Ampere on, about
# 1e-3, beyond the checks' float32 tolerance); in-process checks call wellfno.device.exact_float32.
NO_TF32 = {"NVIDIA_TF32_OVERRIDE": "0"}


@pytest.mark.parametrize("script,extra", [
    ("fno.py", []),
    ("solutions/01_profiling/fno.py", []),
    ("solutions/02_data_pipeline/fno.py", ["--num-workers", "1", "--pin-memory", "--fast-reader"]),
    ("solutions/03_affinity/fno.py", ["--num-workers", "1"]),
])
def test_gpu_solutions_train_a_few_steps(tiny_data_dir, tmp_path, script, extra):
    out = tmp_path / "run"
    r = run_script(script, "--data-dir", tiny_data_dir, "--out", out, *TRAIN, *extra, timeout=600)
    assert r.returncode == 0, f"{script} on the GPU failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics, "metrics.json is empty"
    losses = [v for v in _numbers(metrics)]
    assert losses and all(math.isfinite(v) for v in losses), "a loss or metric is not finite"


def _numbers(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _numbers(v)
    elif isinstance(x, list):
        for v in x:
            yield from _numbers(v)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield float(x)


def test_gpu_trace_has_kernels_and_counts_each_step_once(tiny_data_dir, tmp_path):
    """On GPU traces ProfilerStep#N and the labels appear on the host and mirrored on the GPU
    lane (gpu_user_annotation); the summary must count every step once and see the kernels."""
    from profiling import summarize, traces

    out = tmp_path / "prof"
    r = run_script("solutions/01_profiling/fno.py", "--data-dir", tiny_data_dir, "--out", out, "--profile",
                   "--max-steps", "8", "--batch-size", "4", "--device", "cuda", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (path,) = sorted(out.glob("trace_rank0_steps*.json.gz"))
    trace = traces.load(path)
    rows = summarize.step_breakdown(trace)
    steps = [row["step"] for row in rows]
    assert len(steps) == 5 and len(set(steps)) == 5, f"steps counted more than once: {steps}"
    device = traces.device_events(trace)
    assert any(e.get("cat") == "kernel" for e in device), "no GPU kernel in the trace"
    assert not any(e.get("cat") in ("user_annotation", "gpu_user_annotation") for e in device), \
        "annotations drawn as device work"
    busy = summarize.gpu_busy(trace)
    assert busy is not None and len(busy) == 5 and all(0 < b["busy"] <= 1 for b in busy), busy


def test_gpu_batches_are_pinned_and_copied_without_blocking(tiny_data_dir):
    """DataLoader(pin_memory=True) batches are page-locked, and the copy to the GPU starts from
    page-locked memory (a pageable source makes the copy synchronous and wastes the pinning)."""
    from torch.profiler import ProfilerActivity, profile

    from wellfno import data

    splits = data.well_datasets(data.resolve_dataset(tiny_data_dir, DATASET), splits=("train",))
    loader = torch.utils.data.DataLoader(splits["train"], batch_size=4, pin_memory=True)
    batch = next(iter(loader))
    assert all(v.is_pinned() for v in batch.values() if isinstance(v, torch.Tensor)), "DataLoader did not pin"
    device = torch.device("cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        x, y = data.batch_to_model(batch, device, non_blocking=True)
        torch.cuda.synchronize()
    assert x.is_cuda and y.is_cuda
    copies = [e.name for e in prof.events() if "memcpy" in e.name.lower() and "htod" in e.name.lower()]
    if torch.version.hip:
        pytest.skip("ROCm's copy events do not name the source memory; checked on NVIDIA only")
    assert copies, "no host-to-device copy recorded"
    assert all("Pinned" in name for name in copies), f"copies from pageable memory: {copies}"


def _same_numbers(a, b, where="stats"):
    if isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys differ"
        for k in a:
            _same_numbers(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            _same_numbers(x, y, f"{where}[{i}]")
    elif isinstance(a, (int, float)) and not isinstance(a, bool):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), f"{where}: {a} != {b}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 visible GPUs")
def test_gpu_nccl_statistics_with_two_ranks_equal_serial(tiny_dataset_dir, tmp_path):
    """The statistics over NCCL (RCCL on AMD), 2 ranks on 2 GPUs, equal the serial program."""
    serial, dist = tmp_path / "serial.yaml", tmp_path / "nccl.yaml"
    r = run_script("stats.py", tiny_dataset_dir, "--out", serial, timeout=300)
    assert r.returncode == 0, r.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "solutions/04_distributed_stats/stats.py", str(tiny_dataset_dir), "--backend", "nccl",
                        "--out", str(dist)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    _same_numbers(yaml.safe_load(dist.read_text()), yaml.safe_load(serial.read_text()))


# --------------------------------------------------------------------------- 05 and 06 on the GPU
# The day-0 job (coursetools.gpucheck node) runs the programs behind the first tests itself and leaves
# them out of its `pytest -m gpu` (gpucheck.COVERED_BY_NODE_STEP); here they run on their own.
TWO_GPUS = pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="needs 2 visible GPUs (DDP over nccl/RCCL: 2 ranks x b vs 1 rank x 2b)",
)


@pytest.fixture(scope="module")
def nccl_check(tmp_path_factory):
    """wellfno.complex_ddp_check over nccl/RCCL on 2 GPUs with NCCL_DEBUG=INFO, as the day-0 job
    runs it."""
    from coursetools import gpucheck

    out = tmp_path_factory.mktemp("complex_ddp")
    return out, gpucheck.run_complex_ddp(torch, out, timeout=300)


@TWO_GPUS
def test_gpu_complex_gradients_two_ranks_equal_one_rank(nccl_check):
    """One step of the real FNO over nccl/RCCL, 2 ranks x 4 vs 1 rank x 8, TF32 off
    (wellfno.complex_ddp_check calls exact_float32): every parameter's gradient and value after
    the step, real and imaginary parts, within 1e-5
    (pytorch/pytorch#158753:
    DDP may lose the imaginary part), of the course's model, whose complex weights are real
    parameters (wellfno.model.spectral_weights_as_real). Plain DDP of complex weights is measured
    too, as information (the day-0 report's line): on torch before pytorch/pytorch#166863 it is
    wrong over NCCL, which is why the course keeps the weights real."""
    from tests.test_ddp_complex import assert_close_parts

    out, rec = nccl_check
    assert (out / "reference.pt").is_file(), f"the check did not run: {rec['complex_ddp']}"
    reference = torch.load(out / "reference.pt", weights_only=True)
    assert any(g.is_complex() and g.imag.abs().max() > 0 for g in reference["grad"].values())
    for rank in (0, 1):
        held = torch.load(out / f"rank{rank}.pt", weights_only=True)["real_weights"]
        for what in ("grad", "param"):
            assert_close_parts(
                held[what], reference[what], f"rank {rank}, real weights, DDP over nccl, {what}"
            )


@TWO_GPUS
def test_gpu_nccl_transport_is_reported(nccl_check):
    """Which transport NCCL/RCCL connected the two GPUs with, read from its INFO lines."""
    from coursetools import gpucheck

    _, rec = nccl_check
    found = rec["transport"]
    assert found["kinds"], "no 'NCCL INFO Channel ... via ...' line in the NCCL_DEBUG=INFO output"
    assert set(found["kinds"]) <= {"P2P", "SHM", "NET"}, found
    assert gpucheck.transport_line(found).startswith(
        "NCCL/RCCL transport between this node's GPUs: "
    )


@TWO_GPUS
def test_gpu_05_two_ranks_over_nccl_equal_one_rank(tiny_data_dir, tmp_path):
    """Solution 05 itself over nccl/RCCL: 2 ranks x --batch-size 2 hold, after one step, the
    parameters of 1 rank x 4 on one GPU (real and imaginary parts; tests/test_05_ddp.py on gloo).
    Both runs with TF32 off (NO_TF32)."""
    from tests.conftest import STEPS
    from tests.test_ddp_complex import assert_close_parts

    script = STEPS["05_ddp"]
    common = [
        "--data-dir",
        str(tiny_data_dir),
        "--epochs",
        "1",
        "--max-steps",
        "1",
        "--n-steps-input",
        "10",
        "--bind",
        "none",
        "--seed",
        "3",
        "--device",
        "cuda",
    ]
    r = run_script(script, *common, "--out", tmp_path / "one", "--batch-size", "4", env=NO_TF32,
                   timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_"))
    } | NO_TF32
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            script,
            *common,
            "--out",
            str(tmp_path / "two"),
            "--batch-size",
            "2",
            "--backend",
            "nccl",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert "nccl backend, cuda" in r.stdout
    one, two = (
        torch.load(tmp_path / d / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]
        for d in ("one", "two")
    )
    floating = {k: v for k, v in one.items() if v.is_floating_point() or v.is_complex()}
    assert_close_parts(
        {k: two[k] for k in floating}, floating, "05 over nccl, 2 ranks x 2 vs 1 rank x 4"
    )


@pytest.fixture(scope="module")
def step_06_runs(tmp_path_factory):
    """Solution 06 on the GPU: float32, --amp bf16, --compile (the day-0 job's runs)."""
    from coursetools import gpucheck

    return gpucheck.run_06_on_gpu(torch, tmp_path_factory.mktemp("step_06"), REPO, timeout=540)[
        "runs"
    ]


@pytest.mark.parametrize("name", ["bf16", "compile"])
def test_gpu_06_low_precision_and_compile_track_float32(step_06_runs, name):
    """The losses of 5 steps track float32's within the CPU tests' tolerance
    (tests/test_09_mixed_precision.py:
    bf16 1e-3, compile 1e-4 relative); bf16 must also differ, or autocast did nothing."""
    from coursetools.gpucheck import LOSS_TOLERANCE

    reference, run = step_06_runs["float32"], step_06_runs[name]
    if run.get("not_supported"):
        pytest.skip(run["why"])
    assert reference["ok"] and "losses" in run, run.get("why")
    assert len(run["losses"]) == len(reference["losses"]) == 5
    off = max(abs(a - b) / abs(b) for a, b in zip(run["losses"], reference["losses"]))
    assert off < LOSS_TOLERANCE[name], (reference["losses"], run["losses"])
    if name == "bf16":
        assert off > 0, "--amp bf16 gave exactly the float32 losses: is autocast on?"


def test_gpu_06_peak_memory_is_training_not_the_flop_count(tiny_data_dir, tmp_path):
    """06 counts FLOPs with one float32 pass at --batch-size before training; the peak memory it
    reports must be training's (so that it shows what bf16 saves), not that pass's. The tiny data
    has fewer training samples than 64: --batch-size 64 and 256 train the same one batch of all
    of them, and only the FLOP pass grows 4x; their peaks must agree."""
    from coursetools.gpucheck import STEP_SCRIPTS

    peaks = {}
    for batch in (64, 256):
        out = tmp_path / f"b{batch}"
        r = run_script(
            STEP_SCRIPTS["peak_memory"],
            "--data-dir",
            tiny_data_dir,
            "--out",
            out,
            "--epochs",
            "1",
            "--max-steps",
            "1",
            "--batch-size",
            str(batch),
            "--bind",
            "none",
            "--device",
            "cuda",
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["history"][0]["steps"] == 1 and metrics["peak_memory_of"] == "device"
        peaks[batch] = metrics["peak_memory_bytes"]
    assert peaks[256] <= 1.2 * peaks[64], f"the peak grows with the FLOP-count pass: {peaks}"
