"""coursetools.gpucheck, the day-0 check's logic, on the CPU (the Slurm job is in test_slurm.py)."""
from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest
import torch

from tests.conftest import run_script
from coursetools import gpucheck


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


def test_a_rank_away_from_its_gpu_is_a_warning_not_a_failure():
    """match=NO (Slurm's default task order on LUMI-G puts task i on CCD i, GCD i on another NUMA
    node): slower, not wrong, as LUMI's docs put it and as affinity/bind.py treats it (a warning,
    the run goes on). The report passes, says so on its first line and lists the rank."""
    rep = gpucheck.build_report([_task(0, [_gpu(0)]), _task(1, [_gpu(1, "0000:0b:00.0", match="NO")])],
                                NODE, True)
    assert rep["status"] == "PASS" and rep["problems"] == []
    (warning,) = rep["warnings"]
    assert warning.startswith("rank 1: its CPUs are not on GPU 1's NUMA node")
    text = gpucheck.report_text(rep)
    assert text.startswith("GPU check: PASS with 1 WARNING(s), listed at the end")
    assert f"WARNING: {warning}" in text
    assert gpucheck.report_text(gpucheck.build_report([_task(0, [_gpu(0)])], NODE, True)).startswith(
        "GPU check: PASS   (CPU:")  # no warning: the first line as before


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
        r = run_script("-m", "coursetools.gpucheck", *args, timeout=120)
        assert r.returncode == 0, r.stderr
    r = run_script("-m", "coursetools.gpucheck", "report", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("GPU check: no GPU: N/A")
    rep = json.loads((out / "gpu_check.json").read_text())
    assert rep["status"] == "no GPU: N/A" and rep["tasks"][0]["rank"] == 0
    assert (out / "gpu_check.txt").read_text() == r.stdout
    r = run_script("-m", "coursetools.gpucheck", "report", out, "--expect-gpu")
    assert r.returncode == 1 and "PROBLEM: rank 0" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["report", "{tmp}/missing"], "is not a folder with gpucheck results"),
    (["task", "--out", "{tmp}/file"], "is a file; give a folder"),
    (["node", "--out", "{tmp}/n", "--steps", "0"], "--steps must be at least 1"),
    (["node", "--out", "{tmp}/n", "--pytest-budget", "0"], "--pytest-budget must be at least 1"),
])
def test_cli_bad_input_one_line(tmp_path, args, needle):
    (tmp_path / "file").write_text("x")
    r = run_script("-m", "coursetools.gpucheck", *[a.format(tmp=tmp_path) for a in args])
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()] and needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


# --------------------------------------------------------------------------- the course's steps
# NCCL_DEBUG=INFO lines as NCCL and RCCL print them, copied from public logs.
NCCL_LINES = """\
<cluster_name>:919:1150 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read
<cluster_name>:919:1150 [0] NCCL INFO Channel 02/0 : 8[0] -> 15[7] via P2P/IPC/read
<cluster_name>:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3
"""  # https://github.com/NVIDIA/nccl/issues/952
NCCL_OLD_LINES = """\
machine-1:16194:18583 [3] NCCL INFO Channel 00 : 11[3e000] -> 9[1b000] via P2P/direct pointer
machine-1:16194:18586 [6] NCCL INFO Channel 03 : 7[b2000] -> 14[b1000] [receive] via NET/IB/0/GDRDMA
"""  # https://github.com/NVIDIA/nccl/issues/429
NCCL_SHM_LINES = """\
ubuntu:39964:40050 [6] NCCL INFO Channel 09 : 6[6] -> 7[7] via SHM/direct/direct
ubuntu:9621:9688 [3] NCCL INFO Channel 05 : 11[3] -> 12[4] via SHM/direct/direct
ubuntu:9621:9692 [7] NCCL INFO Channel 14/0 : 15[7] -> 0[0] [send] via NET/Socket/0
"""  # https://github.com/NVIDIA/nccl-tests/issues/166
RCCL_LINES = """\
g1072:1263985:1264007 [0] NCCL INFO Channel 02/0 : 1[c6000] -> 4[c1000] [receive] via NET/Socket/1 comm 0x95cdeb0 nRanks 08
g1072:1263988:1264006 [3] NCCL INFO Channel 00/0 : 7[ce000] -> 5[c6000] via P2P/IPC comm 0xfb16e30 nRanks 08
g1072:1263986:1264008 [1] NCCL INFO Connected all rings comm 0xa5bff40 nRanks 08 busId c6000
"""  # https://github.com/ROCm/rccl/issues/1026


@pytest.mark.parametrize(
    "text,kinds,transports",
    [
        (NCCL_LINES, {"P2P": 2, "NET": 1}, {"P2P/IPC/read": 2, "NET/Socket/3": 1}),
        (NCCL_OLD_LINES, {"P2P": 1, "NET": 1}, {"P2P/direct pointer": 1, "NET/IB/0/GDRDMA": 1}),
        (NCCL_SHM_LINES, {"SHM": 2, "NET": 1}, {"SHM/direct/direct": 2, "NET/Socket/0": 1}),
        (RCCL_LINES, {"P2P": 1, "NET": 1}, {"P2P/IPC": 1, "NET/Socket/1": 1}),
        (
            "NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\nNCCL INFO cudaDriverVersion 12040\n",
            {},
            {},
        ),
    ],
)
def test_nccl_transports_from_recorded_info_lines(text, kinds, transports):
    found = gpucheck.nccl_transports(text)
    assert found == {"kinds": kinds, "transports": transports}


def test_transport_line_names_each_kind_and_warns_of_net_between_gpus():
    line = gpucheck.transport_line({"ran": True, **gpucheck.nccl_transports(RCCL_LINES)})
    assert (
        "P2P (GPU to GPU" in line
        and "NET (through the network stack): 1" in line
        and "P2P/IPC" in line
    )
    assert "cannot reach each other directly" in line
    p2p_only = gpucheck.transport_line(
        {"ran": True, **gpucheck.nccl_transports(NCCL_LINES.splitlines()[0])}
    )
    assert "P2P" in p2p_only and "NET" not in p2p_only
    assert gpucheck.transport_line(
        {"ran": False, "why": "needs 2 GPUs, torch sees 1", "needs_gpus": 2}
    ).endswith("NOT ANSWERED (needs 2 GPUs, torch sees 1)")


def _complex(plain_ok=True, real_ok=True):
    entry = lambda ok: {
        "ok": ok,
        "grad": {
            "parameter": "fno.fno_blocks.convs.0.weight.tensor",
            "part": "imag",
            "relative_difference": 1e-7 if ok else 1.0,
        },
        "param": {"parameter": "p", "part": "real", "relative_difference": 1e-7},
    }
    return {
        "ran": True,
        "backend": "nccl",
        "library": "NCCL 2.21.5",
        "world_size": 2,
        "batch": 4,
        "tolerance": 1e-5,
        "summary": {"plain": entry(plain_ok), "real_weights": entry(real_ok)},
    }


def _step_06(bf16_off=1e-5, compile_off=1e-6, bf16_missing=False):
    run = lambda off, tol: {
        "ok": off < tol,
        "losses": [1.0] * 5,
        "peak_memory_bytes": 3 * 2**20,
        "max_relative_loss_difference": off,
        "tolerance": tol,
    }
    bf16 = (
        {
            "ok": False,
            "why": "error: --amp bf16: Tesla V100 has no bfloat16 units: use --amp fp16",
            "not_supported": True,
        }
        if bf16_missing
        else run(bf16_off, 1e-3)
    )
    return {
        "ran": True,
        "runs": {
            "float32": {"ok": True, "losses": [1.0] * 5, "peak_memory_bytes": 4 * 2**20},
            "bf16": bf16,
            "compile": run(compile_off, 1e-4),
        },
    }


@pytest.mark.parametrize(
    "extra,status,needle",
    [
        ({"complex_ddp": _complex(), "step_06": _step_06()}, "PASS", None),
        # plain DDP of complex weights wrong on the node: information (the course's are real)
        ({"complex_ddp": _complex(plain_ok=False), "step_06": _step_06()}, "PASS", None),
        ({"complex_ddp": _complex(False, False)}, "FAIL",
         "the course's real weights are NOT averaged right"),
        (
            {"complex_ddp": {"ran": True, "backend": "nccl", "why": "exit 1: NCCL error"}},
            "FAIL",
            "did not finish",
        ),
        ({"complex_ddp": {"ran": False, "why": "needs 2 GPUs, torch sees 1", "needs_gpus": 2}},
         "INCOMPLETE", None),
        (
            {"step_06": _step_06(bf16_off=5e-3)},
            "FAIL",
            "(bf16): loss off float32 by 5.0e-03 relative > 0.001",
        ),
        ({"step_06": _step_06(bf16_missing=True)}, "PASS", None),
    ],
)
def test_report_of_the_course_steps_on_the_gpu(extra, status, needle):
    rep = gpucheck.build_report([_task(0, [_gpu(0)])], {**NODE, **extra}, True)
    assert rep["status"] == status, rep["problems"]
    if needle:
        assert any(needle in p for p in rep["problems"]), rep["problems"]
    text = gpucheck.report_text(rep)
    assert sum(line.startswith("complex gradients under DDP:") for line in text.splitlines()) == 1
    if "step_06" in extra and not extra["step_06"]["runs"]["bf16"].get("not_supported"):
        assert (
            "06 peak device memory (training only, batch 8): "
            "float32 4 MiB, bf16 3 MiB, compile 3 MiB"
            in text
        )
        assert (
            "06 --compile: loss within 1.0e-06 of float32 over 5 steps (tolerance 0.0001): ok"
            in text
        )


def test_node_record_on_a_cpu_node_says_not_applicable(tmp_path):
    rec = gpucheck.node_record(torch, 1, 1, 8, True, tmp_path, budget=60, out=tmp_path / "node")
    assert rec["complex_ddp"] == {"ran": False, "why": gpucheck.NO_GPU}
    assert rec["step_06"] == {"ran": False, "why": gpucheck.NO_GPU}
    rep = gpucheck.build_report([_task(0)], rec, False)
    assert rep["status"] == gpucheck.NO_GPU and not rep["problems"]
    text = gpucheck.report_text(rep)
    assert "complex gradients under DDP: not checked (no GPU: N/A)" in text
    assert "06 on the GPU (bf16, compile, peak memory): not run (no GPU: N/A)" in text
    assert not (tmp_path / "node").exists(), "nothing written on a CPU node"


# The node step as day0.sh and the Slurm job run it (`python -m coursetools.gpucheck node`), its
# step 06 standing in for one of minutes on a GPU (its runs are what a node step's time runs out in)
SLOW_STEP_06 = """\
import sys, time
from coursetools import gpucheck

def step_06_of_minutes(*args, **kwargs):
    time.sleep(600)

gpucheck.run_06_on_gpu = step_06_of_minutes
gpucheck.main(sys.argv[1:])
"""


def test_a_node_step_killed_mid_way_keeps_what_it_answered(tmp_path):
    """SIGKILL (timeout -k's, a job's end) after the training steps and DDP answered, during step
    06: node.json holds those answers, whole, and says what was still to come; the report gives
    the answers and lists the rest as NOT ANSWERED (cut off), not "no node results"."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    out = tmp_path / "check"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_STEP_06, "node", "--out", str(out),
                             "--steps", "1", "--batch-size", "1", "--grid", "8", "--pytest"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    node_file, node = out / "node.json", {}
    try:
        deadline = time.monotonic() + 60
        while "complex_ddp" not in node:  # the answers before step 06
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"node.json never held the answers before step 06 ({node}): "
                            f"{proc.communicate()[0][-2000:]}")
            time.sleep(0.05)
            node = json.loads(node_file.read_text()) if node_file.is_file() else {}
        time.sleep(0.5)  # well into step 06
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert sorted(p.name for p in out.iterdir()) == ["node.json"]  # whole: no temporary left
    node = json.loads(node_file.read_text())
    assert node["training"]["steps"] == 1 and node["training"]["samples_per_second"] > 0
    assert node["complex_ddp"] == {"ran": False, "why": gpucheck.NO_GPU}
    assert gpucheck.missing_parts(node) == ["step_06", "pytest_gpu"] and "step_06" not in node
    # as on a GPU node (the report's GPU questions: a CPU's are N/A)
    rep = gpucheck.build_report([_task(0, [_gpu(0)])], node, True)
    assert rep["status"] == gpucheck.INCOMPLETE and not rep["problems"], rep
    assert rep["not_answered"] == [{"question": gpucheck.NODE_PARTS[part], "why": gpucheck.CUT_OFF}
                                   for part in ("step_06", "pytest_gpu")]
    lines = gpucheck.report_text(rep).splitlines()
    assert any(line.startswith("training (cpu, 1 steps") for line in lines), lines
    assert f"NOT ANSWERED ({gpucheck.CUT_OFF}): pytest -m gpu" in lines
    assert not any(line.startswith(("06 ", "pytest -m gpu: ")) for line in lines), lines
    # the whole node step, not cut off: nothing unfinished
    rec = gpucheck.node_record(torch, 1, 1, 8, False, tmp_path, budget=60,
                               save=lambda r: gpucheck.atomic_write_json(node_file, r))
    assert json.loads(node_file.read_text()) == json.loads(json.dumps(rec))
    assert "unfinished" not in rec and gpucheck.missing_parts(rec) == []


def test_the_tests_the_node_step_runs_itself_exist():
    """pytest -m gpu in the day-0 job leaves out what the node step ran: the names must be real."""
    import ast

    from tests.conftest import REPO

    tree = ast.parse((REPO / "tests" / "test_gpu.py").read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert set(gpucheck.COVERED_BY_NODE_STEP) <= names, set(gpucheck.COVERED_BY_NODE_STEP) - names
    for script in gpucheck.STEP_SCRIPTS.values():
        assert (REPO / script).is_file(), script


def _two_gpus_seen():
    """A torch that says 2 GPUs: the node step's plumbing, run on the CPU (over gloo)."""
    return types.SimpleNamespace(
        cuda=types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 2)
    )


@pytest.mark.slow
def test_complex_ddp_step_runs_the_real_check(tmp_path):
    """The node step's torchrun of wellfno.complex_ddp_check, over gloo here: its result and its
    one line."""
    rec = gpucheck.run_complex_ddp(_two_gpus_seen(), tmp_path / "c", timeout=240, backend="gloo")
    check = rec["complex_ddp"]
    assert check["ran"] and check["summary"]["real_weights"]["ok"], check
    assert gpucheck.complex_ddp_line(rec).startswith(
        "complex gradients under DDP: the course's real weights (solution 05 on) are averaged right"
    )
    assert rec["transport"] == {
        "ran": True,
        "kinds": {},
        "transports": {},
    }  # gloo prints no NCCL line
    assert (tmp_path / "c" / "rank1.pt").is_file()


@pytest.mark.slow
def test_step_06_runs_compare_losses_and_memory(tmp_path, monkeypatch):
    """The node step's runs of solution 06 (float32 and bf16; compile is the GPU's) on the CPU."""
    from tests.conftest import REPO

    monkeypatch.setattr(gpucheck, "RUN_06", [a if a != "cuda" else "cpu" for a in gpucheck.RUN_06])
    monkeypatch.setattr(gpucheck, "RUNS_06", {"float32": [], "bf16": ["--amp", "bf16"]})
    from tests.test_09_mixed_precision import as_cpu, this_cpu_has_bf16_units

    if not this_cpu_has_bf16_units():  # bf16's losses as on a CPU with bf16 units (test_08's why)
        for name, value in as_cpu("intel_xeon_amx").items():
            monkeypatch.setenv(name, value)
    step = gpucheck.run_06_on_gpu(_two_gpus_seen(), tmp_path, REPO, timeout=300)
    runs = step["runs"]
    assert runs["float32"]["ok"] and len(runs["float32"]["losses"]) == 5, runs
    assert runs["bf16"]["ok"] and 0 < runs["bf16"]["max_relative_loss_difference"] < 1e-3, runs
    assert all(r["peak_memory_bytes"] > 0 for r in runs.values())


# --------------------------------------------------------------------------- one GPU: not answered
# A stand-in of `pytest -m gpu` (run for real, in its own folder): a test any GPU answers, and
# the repository's two kinds of 2-GPU skips (tests/test_gpu.py's skipif, tests/test_domain.py's
# pytest.skip), as they read on a one-GPU node.
STAND_IN_GPU_TESTS = """\
import pytest

@pytest.mark.gpu
def test_one_gpu():
    pass

@pytest.mark.gpu
@pytest.mark.skipif(True, reason="needs 2 visible GPUs (DDP over nccl/RCCL: 2 ranks x b vs 1 rank x 2b)")
@pytest.mark.parametrize("variant", ["plain", "real_weights"])
def test_two_gpus(variant):
    pass

@pytest.mark.gpu
def test_two_gpus_equal_serial():
    pytest.skip("needs 2 GPUs")

@pytest.mark.gpu
def test_rocm_only():
    pytest.skip("ROCm's copy events do not name the source memory; checked on NVIDIA only")
"""


def stand_in_suite(folder, tests=STAND_IN_GPU_TESTS):
    (folder / "tests").mkdir(parents=True)
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n  gpu: needs a GPU\n")
    (folder / "tests" / "test_stand_in.py").write_text(tests)
    return folder


def test_a_one_gpu_node_reports_the_questions_it_did_not_answer(tmp_path, monkeypatch):
    """The node step on a stand-in one-GPU node (torch says 1 GPU; the training steps run on the
    CPU, step 06 stands in as passed, `pytest -m gpu` runs a stand-in suite): the two-GPU
    questions each say NOT ANSWERED (needs 2 GPUs), in their own line and at the end, and the
    report is INCOMPLETE, never PASS; pytest ran on its own budget."""
    one_gpu = types.SimpleNamespace(
        device=torch.device,
        cuda=types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1))
    real_train_steps, real_pytest = gpucheck.train_steps, gpucheck.run_pytest_gpu
    monkeypatch.setattr(gpucheck, "train_steps", lambda _torch, device, *a, **k:
                        real_train_steps(torch, torch.device("cpu"), *a, **k))
    monkeypatch.setattr(gpucheck, "run_06_on_gpu", lambda *a, **k: _step_06())
    suite = stand_in_suite(tmp_path / "suite")
    monkeypatch.setattr(gpucheck, "run_pytest_gpu", lambda repo, timeout, deselect:
                        real_pytest(suite, timeout, deselect))
    rec = gpucheck.node_record(one_gpu, 1, 1, 8, True, tmp_path, budget=1, out=tmp_path / "node",
                               pytest_budget=240)
    assert rec["pytest_gpu"]["timeout"] == 240  # its own, not what the other checks left (1 s)
    assert rec["pytest_gpu"]["ok"] and rec["pytest_gpu"]["counts"]["skipped"] == 4, rec["pytest_gpu"]

    rep = gpucheck.build_report([_task(0, [_gpu(0)])], rec, True)
    assert rep["status"] == "INCOMPLETE" and not rep["problems"], rep
    assert [(q["why"], q["question"]) for q in rep["not_answered"]] == [
        ("needs 2 GPUs", "complex gradients under DDP over NCCL/RCCL"),
        ("needs 2 GPUs", "NCCL/RCCL transport between this node's GPUs"),
        ("needs 2 GPUs", "pytest -m gpu: tests/test_stand_in.py::test_two_gpus[plain]"),
        ("needs 2 GPUs", "pytest -m gpu: tests/test_stand_in.py::test_two_gpus[real_weights]"),
        ("needs 2 GPUs", "pytest -m gpu: tests/test_stand_in.py::test_two_gpus_equal_serial"),
    ]
    lines = gpucheck.report_text(rep).splitlines()
    assert lines[0].startswith("GPU check: INCOMPLETE: 5 question(s) NOT ANSWERED (needs 2 GPUs)")
    assert not any("PASS" in line for line in lines), lines
    assert "complex gradients under DDP: NOT ANSWERED (needs 2 GPUs, torch sees 1)" in lines
    assert ("NCCL/RCCL transport between this node's GPUs: NOT ANSWERED (needs 2 GPUs, torch "
            "sees 1)") in lines
    assert [line for line in lines if line.startswith("NOT ANSWERED")] == [
        f"NOT ANSWERED ({q['why']}): {q['question']}" for q in rep["not_answered"]]
    # the same node with a second GPU and every question answered: PASS
    answered = {**rec, "complex_ddp": {"ran": False, "why": "stand-in"},
                "transport": {"ran": False, "why": "stand-in"},
                "pytest_gpu": {**rec["pytest_gpu"], "not_answered": []}}
    assert gpucheck.build_report([_task(0, [_gpu(0)])], answered, True)["status"] == "PASS"


SLOW_GPU_TESTS = """\
import subprocess, sys, time
import pytest

@pytest.mark.gpu
def test_quick():
    pass

@pytest.mark.gpu
def test_hangs(tmp_path_factory):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open("child.pid", "w") as f:
        f.write(str(child.pid))
    time.sleep(120)
"""


def test_pytest_out_of_time_is_a_timeout_not_a_failure(tmp_path):
    """`pytest -m gpu` past its budget: what it answered stands, the rest is NOT ANSWERED (timed
    out), the report is INCOMPLETE, not FAIL; the whole run ends, the processes its tests
    started included (they would hold the GPUs and the output pipe)."""
    import os
    import time

    suite = stand_in_suite(tmp_path, SLOW_GPU_TESTS)
    start = time.monotonic()
    res = gpucheck.run_pytest_gpu(suite, timeout=15)
    assert time.monotonic() - start < 60
    assert res["timed_out"] and res["ok"] and res["returncode"] is None, res
    assert res["summary"] == "timed out after 15 s (1 passed by then)", res["summary"]
    child = int((suite / "child.pid").read_text())
    for _ in range(50):  # killed with its group; gone once its parent (init) reaped it
        if not os.path.exists(f"/proc/{child}") or "zombie" in _state(child):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the test's child {child} outlived the timeout")
    rep = gpucheck.build_report([_task(0, [_gpu(0)])], {**NODE, "pytest_gpu": res}, True)
    assert rep["status"] == "INCOMPLETE" and not rep["problems"], rep
    assert rep["not_answered"] == [{"question": "pytest -m gpu: every test after the last one it "
                                                "reported",
                                    "why": "timed out after 15 s: give it more with "
                                           "--pytest-budget"}]
    text = gpucheck.report_text(rep)
    assert "pytest -m gpu: timed out after 15 s (1 passed by then)" in text and "FAIL" not in text


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((line for line in f if line.startswith("State:")), "").lower()
    except OSError:
        return "zombie"  # gone


def test_every_two_gpu_skip_of_the_gpu_tests_is_read_as_not_answered():
    """The reasons the repository's GPU tests give when too few GPUs are visible are the ones
    run_pytest_gpu lists as NOT ANSWERED (a reworded reason would pass for a plain skip)."""
    import re

    from tests.conftest import REPO

    found = 0
    for path in sorted((REPO / "tests").glob("test_*.py")):
        text = path.read_text()
        for m in re.finditer(r"device_count\(\) < (\d+)", text):
            reason = re.search(r"""(?:reason=|pytest\.skip\()\s*["']([^"']*)""", text[m.end():])
            assert reason, f"{path.name}: no skip reason after {m.group(0)}"
            needs = gpucheck.NEEDS_GPUS.search(reason.group(1))
            assert needs and needs.group(1) == m.group(1), (path.name, reason.group(1))
            found += 1
    assert found >= 3  # tests/test_gpu.py's two, tests/test_domain.py's one



# --------------------------------------------------------------------------- out of time, TF32 off
def test_step_06_runs_with_tf32_off_and_a_timeout_is_not_answered(tmp_path, monkeypatch):
    """Step 06's runs on the GPU (the subprocess stood in): every run, float32 too, has
    NVIDIA_TF32_OVERRIDE=0 (cuDNN's TF32 1x1 convolutions are ~1e-3 off float32, compared at 1e-4);
    a run past its time is NOT ANSWERED (timed out ...) in the report, never FAIL."""
    import subprocess

    import wellfno.grayscott

    monkeypatch.setattr(wellfno.grayscott, "generate", lambda *a, **k: None)
    envs = {}

    def fake_run(cmd, timeout, env, **kwargs):
        name = "compile" if "--compile" in cmd else "bf16" if "--amp" in cmd else "float32"
        envs[name] = env
        if name == "compile":
            raise subprocess.TimeoutExpired(cmd, timeout)
        out = tmp_path / name
        out.mkdir()
        losses = [[i, 1.0 + (1e-5 if name == "bf16" else 0)] for i in range(5)]
        (out / "metrics.json").write_text(json.dumps(
            {"history": [{"loss_log": losses}], "peak_memory_bytes": 2**20,
             "samples_per_second": 1.0}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(gpucheck.subprocess, "run", fake_run)
    step = gpucheck.run_06_on_gpu(_two_gpus_seen(), tmp_path, tmp_path, timeout=30)
    assert {name: env.get("NVIDIA_TF32_OVERRIDE") for name, env in envs.items()} == {
        "float32": "0", "bf16": "0", "compile": "0"}
    runs = step["runs"]
    assert runs["bf16"]["ok"] and runs["compile"]["timed_out"], runs
    rep = gpucheck.build_report([_task(0, [_gpu(0)])], {**NODE, "step_06": step}, True)
    assert rep["status"] == "INCOMPLETE" and not rep["problems"], rep["problems"]
    assert rep["not_answered"] == [{"question": "solutions/11_compile/fno.py on the GPU (compile)",
                                    "why": "timed out after 30 s"}]
    text = gpucheck.report_text(rep)
    assert "06 --compile: NOT ANSWERED (timed out after 30 s)" in text and "FAIL" not in text


def test_a_float32_reference_out_of_time_leaves_the_others_not_answered():
    runs = {"float32": {"ok": False, "timed_out": True, "why": "timed out after 9 s"},
            "bf16": {"ok": False, "timed_out": True,
                     "why": "its float32 reference timed out after 9 s"}}
    rep = gpucheck.build_report([_task(0, [_gpu(0)])],
                                {**NODE, "step_06": {"ran": True, "runs": runs}}, True)
    assert rep["status"] == "INCOMPLETE" and not rep["problems"], rep["problems"]
    assert [q["why"] for q in rep["not_answered"]] == [
        "timed out after 9 s", "its float32 reference timed out after 9 s"]


def test_complex_ddp_out_of_time_is_not_answered(tmp_path, monkeypatch):
    import subprocess

    def fake_run(cmd, timeout, **kwargs):
        raise subprocess.TimeoutExpired(cmd, timeout)

    monkeypatch.setattr(gpucheck.subprocess, "run", fake_run)
    rec = gpucheck.run_complex_ddp(_two_gpus_seen(), tmp_path / "c", timeout=7)
    rep = gpucheck.build_report([_task(0, [_gpu(0)])], {**NODE, **rec}, True)
    assert rep["status"] == "INCOMPLETE" and not rep["problems"], rep["problems"]
    text = gpucheck.report_text(rep)
    assert "complex gradients under DDP: NOT ANSWERED (timed out after 7 s)" in text
    assert "NCCL/RCCL transport between this node's GPUs: NOT ANSWERED (timed out after 7 s)" in text
