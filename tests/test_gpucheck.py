"""wellfno.gpucheck, the day-0 check's logic, on the CPU (the Slurm job is in test_slurm.py)."""
from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest
import torch

from tests.conftest import run_script
from wellfno import gpucheck


def test_rel_error_by_hand():
    assert gpucheck.rel_error(np.array([3.0, 4.0]), np.array([3.0, 4.0])) == 0.0
    # |(0, -0.5)| / |(3, 4.5)|
    assert math.isclose(gpucheck.rel_error(np.array([3.0, 4.0]), np.array([3.0, 4.5])), 0.5 / math.hypot(3, 4.5))


def test_numerics_check_passes_on_cpu_and_catches_a_wrong_fft(monkeypatch):
    good = gpucheck.numerics_check(torch, torch.device("cpu"))
    assert good["matmul_ok"] and good["fft_ok"]
    assert good["matmul_rel_error"] < 1e-5 and good["fft_rel_error"] < 1e-5   # float32 vs float64
    real_rfft2 = torch.fft.rfft2
    monkeypatch.setattr(torch.fft, "rfft2", lambda x: real_rfft2(x) * 1.01)  # a 1% wrong library
    bad = gpucheck.numerics_check(torch, torch.device("cpu"))
    assert bad["matmul_ok"] and not bad["fft_ok"] and math.isclose(bad["fft_rel_error"], 0.01, rel_tol=1e-3)


def _task(rank, gpus=(), host="n1"):
    return {"host": host, "rank": rank, "local_rank": rank, "cpus": [rank],
            "versions": {"python": "3", "torch": "2.x", "cuda": "12", "hip": None, "driver": "d",
                         "cudnn_or_miopen": 1, "nccl_or_rccl": "2"},
            "visible": {"CUDA_VISIBLE_DEVICES": str(rank)}, "gpus": list(gpus)}


def _gpu(index=0, pci="0000:07:00.0", match="yes", mm=1e-7, fft=1e-7):
    return {"index": index, "name": "G", "placement": f"pci={pci} match={match}", "pci": pci, "match": match,
            "device": f"cuda:{index}", "matmul_rel_error": mm, "matmul_ok": mm <= gpucheck.MATMUL_TOL,
            "fft_rel_error": fft, "fft_ok": fft <= gpucheck.FFT_TOL}


NODE = {"training": {"device": "cuda:0", "steps": 30, "warmup_steps": 5, "batch": 16, "grid": 64,
                     "median_step_ms": 2.0, "samples_per_second": 8000.0},
        "utilization": {"available": True, "method": "nvidia-smi", "samples": 9, "mean_percent": 80.0,
                        "median_percent": 85.0, "max_percent": 99.0},
        "pytest_gpu": {"ran": True, "ok": True, "summary": "7 passed"}}


@pytest.mark.parametrize("tasks,node,expect,status,needle", [
    ([_task(0, [_gpu(0)]), _task(1, [_gpu(0, "0000:0b:00.0")])], NODE, True, "PASS", None),
    ([_task(0, [_gpu(0)]), _task(1, [_gpu(0)])], NODE, True, "FAIL", "two tasks share a GPU"),
    ([_task(0, [_gpu(0, match="NO")])], NODE, True, "FAIL", "not on GPU 0's NUMA node"),
    ([_task(0, [_gpu(0, mm=0.1)])], NODE, True, "FAIL", "matmul relative error 1.00e-01"),
    ([_task(0, [_gpu(0), _gpu(1, "0000:0b:00.0")])], NODE, True, "FAIL", "sees 2 GPUs, expected one per task"),
    ([_task(0)], {**NODE, "pytest_gpu": {"ok": True, "summary": "not run"}}, False, "no GPU: N/A", None),
    ([_task(0)], NODE, True, "FAIL", "torch sees no GPU"),
    ([_task(0, [_gpu(0)])], {**NODE, "pytest_gpu": {"ok": False, "summary": "1 failed, 6 passed"}}, True, "FAIL",
     "pytest -m gpu failed: 1 failed"),
    ([_task(0, [_gpu(0)])], None, True, "FAIL", "no node results"),
])
def test_report_status(tasks, node, expect, status, needle):
    rep = gpucheck.build_report(tasks, node, expect)
    assert rep["status"] == status
    if needle:
        assert any(needle in p for p in rep["problems"]), rep["problems"]
    text = gpucheck.report_text(rep)
    assert text.startswith(f"GPU check: {status}")
    if node and node["utilization"].get("available"):
        assert "mean 80%, median 85%, max 99%" in text


def test_utilization_sampler_uses_the_first_source_that_answers():
    values = iter([10.0, 30.0, 50.0] + [50.0] * 1000)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(utilization=lambda i: next(values)))
    with gpucheck.UtilizationSampler(fake, 0, None, interval=0.01) as s:
        import time
        time.sleep(0.1)
    summary = s.summary()
    assert summary["available"] and summary["method"] == "torch.cuda.utilization"
    assert summary["samples"] >= 3 and summary["max_percent"] == 50.0

    def broken(i):
        raise RuntimeError("pynvml does not seem to be installed")
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(utilization=broken))
    with gpucheck.UtilizationSampler(fake, 0, None) as s:
        pass
    summary = s.summary()
    assert not summary["available"] and summary["text"] == "not available"
    assert "pynvml does not seem to be installed" in summary["tried"][0]


def test_run_pytest_gpu_reads_the_outcome(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  gpu: needs a GPU\n")
    (tmp_path / "tests" / "test_x.py").write_text(
        "import pytest\n@pytest.mark.gpu\ndef test_a():\n    assert False\n"
        "@pytest.mark.gpu\ndef test_b():\n    pass\ndef test_c():\n    pass\n")
    res = gpucheck.run_pytest_gpu(tmp_path, timeout=120)
    assert not res["ok"] and res["returncode"] == 1
    assert res["counts"] == {"failed": 1, "passed": 1, "deselected": 1}, res["summary"]


@pytest.mark.slow
def test_cli_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "check"
    for args in (["task", "--out", out], ["node", "--out", out, "--steps", "1", "--batch-size", "1", "--grid", "8",
                                          "--pytest"]):
        r = run_script("-m", "wellfno.gpucheck", *args, timeout=120)
        assert r.returncode == 0, r.stderr
    r = run_script("-m", "wellfno.gpucheck", "report", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("GPU check: no GPU: N/A")
    rep = json.loads((out / "gpu_check.json").read_text())
    assert rep["status"] == "no GPU: N/A" and rep["tasks"][0]["rank"] == 0
    assert (out / "gpu_check.txt").read_text() == r.stdout
    r = run_script("-m", "wellfno.gpucheck", "report", out, "--expect-gpu")
    assert r.returncode == 1 and "PROBLEM: rank 0" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["report", "{tmp}/missing"], "is not a folder with gpucheck results"),
    (["task", "--out", "{tmp}/file"], "is a file; give a folder"),
    (["node", "--out", "{tmp}/n", "--steps", "0"], "--steps must be at least 1"),
])
def test_cli_bad_input_one_line(tmp_path, args, needle):
    (tmp_path / "file").write_text("x")
    r = run_script("-m", "wellfno.gpucheck", *[a.format(tmp=tmp_path) for a in args])
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()] and needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
