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
