"""Day-0 check of a GPU node: will the course work here? (slurm/00_gpu_check.sbatch runs it.)

    srun ... python -m coursetools.gpucheck task --out DIR      # every task: versions, visible devices,
                                                           # placement, matmul + FFT vs CPU float64
    python -m coursetools.gpucheck node --out DIR [--pytest]   # one process with the node's GPUs:
                                                           # utilization during training steps;
                                                           # the course's steps on the GPU (DDP's
                                                           # complex gradients over NCCL/RCCL and
                                                           # its transport, 06 with bf16 and
                                                           # compile, peak memory); `pytest -m gpu`
    python -m coursetools.gpucheck report DIR [--expect-gpu]   # DIR/gpu_check.json + gpu_check.txt;
                                                           # exit 1 when a check failed

The report's first line: PASS when every question was asked and answered right; FAIL when a
check failed; INCOMPLETE when nothing failed but some questions were not asked (on one GPU: DDP
over NCCL/RCCL, its transport, the 2-GPU tests; or a check ran out of its time: `pytest -m gpu`
past its budget, DDP's or step 06's runs past theirs), each listed on a `NOT ANSWERED (why): ...`
line: a timeout is a question not answered, never a failure. On a node without a GPU every part
still runs, on the CPU, and the report says "no GPU: N/A"; with --expect-gpu (a GPU site,
GPU_VENDOR in slurm/site.env) that is a failure.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from wellfno.cli import UserError, atomic_write_json, atomic_write_text, run_main
from wellfno.launch import launch_environment

VISIBLE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
                "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
# float32 against float64: a 256-term dot product or FFT is good to ~1e-6 relative; TF32
# matmuls (if a site turned them on) to ~1e-3. Anything worse is a broken device or library.
MATMUL_TOL = 2e-3
FFT_TOL = 1e-4
NO_GPU = "no GPU: N/A"
# Nothing failed, but not every question was asked (not_answered): never reported as PASS.
INCOMPLETE = "INCOMPLETE"


# --------------------------------------------------------------------------- versions
def _run(cmd: list[str], timeout: float = 10) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


def driver_version() -> str:
    """The kernel driver: nvidia-smi on NVIDIA, the amdgpu module on AMD; 'not available' else."""
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if out:
        return f"NVIDIA {out.splitlines()[0].strip()}"
    amd = Path("/sys/module/amdgpu/version")
    if amd.is_file():
        return f"amdgpu {amd.read_text().strip()}"
    out = _run(["rocm-smi", "--showdriverversion"])
    if out:
        m = re.search(r"[Dd]river version:\s*(\S+)", out)
        if m:
            return f"amdgpu {m.group(1)}"
    return "not available"


def versions(torch) -> dict:
    v = {"python": sys.version.split()[0], "torch": torch.__version__,
         "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None), "driver": driver_version()}
    try:
        v["cudnn_or_miopen"] = torch.backends.cudnn.version() if torch.cuda.is_available() else None
    except Exception as e:  # noqa: BLE001 - a report, not a crash
        v["cudnn_or_miopen"] = f"error: {e}"
    try:
        nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
        v["nccl_or_rccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    except Exception as e:  # noqa: BLE001
        v["nccl_or_rccl"] = f"error: {e}"
    return v


# --------------------------------------------------------------------------- numerics
def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300))


def numerics_check(torch, device, n: int = 256, seed: int = 0) -> dict:
    """A float32 matmul and a 2-D real FFT on `device`, against numpy in float64."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    field = rng.standard_normal((4, 64, 64))
    ta = torch.from_numpy(a.astype(np.float32)).to(device)
    tb = torch.from_numpy(b.astype(np.float32)).to(device)
    got_mm = (ta @ tb).double().cpu().numpy()       # .cpu() waits for the device: no timing here
    got_fft = torch.fft.rfft2(torch.from_numpy(field.astype(np.float32)).to(device)).cpu().numpy()
    mm = rel_error(got_mm, a @ b)
    fft = rel_error(got_fft.astype(np.complex128), np.fft.rfft2(field))
    return {"device": str(device), "matmul_rel_error": mm, "matmul_ok": mm <= MATMUL_TOL,
            "fft_rel_error": fft, "fft_ok": fft <= FFT_TOL}


# --------------------------------------------------------------------------- task
def _report_fields(line: str) -> dict:
    return dict(re.findall(r"(\w+)=(\S+)", line))


def task_record(torch) -> dict:
    """What this task was handed, and whether its GPUs compute correctly."""
    from affinity.report import report_line

    launch = launch_environment()  # srun's task, torchrun's worker, or rank 0 of 1
    rec = {"host": socket.gethostname(), "rank": launch.rank, "local_rank": launch.local_rank,
           "versions": versions(torch), "visible": {k: os.environ.get(k) for k in VISIBLE_VARS},
           "cpus": sorted(os.sched_getaffinity(0)), "gpus": []}
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for i in range(count):
        dev = torch.device("cuda", i)
        gpu = {"index": i, "name": torch.cuda.get_device_name(i)}
        try:
            gpu["placement"] = report_line(device=dev)
            gpu.update({k: v for k, v in _report_fields(gpu["placement"]).items()
                        if k in ("pci", "gpu_numa", "cpu_numa", "match")})
        except Exception as e:  # noqa: BLE001 - e.g. an old torch without pci_domain_id
            gpu["placement"] = f"unknown ({type(e).__name__}: {e})"
        gpu.update(numerics_check(torch, dev))
        rec["gpus"].append(gpu)
    if not count:
        rec["placement"] = report_line()
        rec["cpu_check"] = numerics_check(torch, torch.device("cpu"))
    return rec


# --------------------------------------------------------------------------- utilization
class UtilizationSampler:
    """GPU busy % of one device, sampled in a thread: torch.cuda.utilization (NVML on NVIDIA,
    amdsmi on ROCm), else nvidia-smi or rocm-smi by PCI address; 'not available' otherwise."""

    def __init__(self, torch, index: int, pci: str | None, interval: float = 0.1):
        self.torch, self.index, self.pci, self.interval = torch, index, pci, interval
        self.values: list[float] = []
        self.method: str | None = None
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _methods(self):
        yield "torch.cuda.utilization", lambda: float(self.torch.cuda.utilization(self.index))
        if self.pci and shutil.which("nvidia-smi"):
            yield "nvidia-smi", lambda: float(_run(["nvidia-smi", "--query-gpu=utilization.gpu",
                                                    "--format=csv,noheader,nounits", "-i", self.pci]))
        if self.pci and shutil.which("rocm-smi"):
            def rocm():
                cards = json.loads(_run(["rocm-smi", "--showuse", "--showbus", "--json"]))
                for card in cards.values():
                    if str(card.get("PCI Bus", "")).lower() == self.pci.lower():
                        return float(card["GPU use (%)"])
                raise RuntimeError(f"rocm-smi lists no GPU at {self.pci}")
            yield "rocm-smi", rocm

    def pick(self) -> bool:
        for name, fn in self._methods():
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - try the next source
                self.errors.append(f"{name}: {type(e).__name__}: {e}")
                continue
            self.method, self._sample = name, fn
            return True
        return False

    def _loop(self):
        while not self._stop.is_set():
            try:
                self.values.append(self._sample())
            except Exception:  # noqa: BLE001 - a missed sample is not a failure
                pass
            self._stop.wait(self.interval)

    def __enter__(self):
        if self.pick():
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def summary(self) -> dict:
        if self.method is None:
            return {"available": False, "text": "not available", "tried": self.errors}
        if not self.values:
            return {"available": False, "text": f"not available ({self.method} gave no sample)"}
        v = np.asarray(self.values)
        return {"available": True, "method": self.method, "samples": len(v), "mean_percent": float(v.mean()),
                "median_percent": float(np.median(v)), "max_percent": float(v.max())}


def train_steps(torch, device, steps: int, batch: int, grid: int, warmup: int = 5) -> dict:
    """`steps` training steps of the course's model (fno.py's NextFrameFNO) on random data
    already on the device: the compute-only rate. Warm-up steps (FFT plans, kernels) excluded."""
    from wellfno.model import NextFrameFNO

    torch.manual_seed(0)
    n_fields = 2
    ones = torch.ones(n_fields)
    stats = {"mean": 0 * ones, "std": ones, "mean_delta": 0 * ones, "std_delta": 0.1 * ones}
    model = NextFrameFNO(n_fields, 1, stats).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(batch, n_fields, grid, grid, device=device)
    y = torch.randn(batch, n_fields, grid, grid, device=device)
    times = []
    for step in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model.loss(model(x), y)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step is done on the device, not just queued
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    t = np.asarray(times)
    return {"device": str(device), "steps": steps, "warmup_steps": warmup, "batch": batch, "grid": grid,
            "median_step_ms": float(np.median(t) * 1e3), "samples_per_second": float(batch / np.median(t)),
            "final_loss": float(loss.detach().cpu())}


# A gpu test's skip reason that names the GPUs it needs (tests/test_gpu.py: "needs 2 visible GPUs
# (...)", tests/test_domain.py: "needs 2 GPUs"): a question a node with fewer cannot answer.
NEEDS_GPUS = re.compile(r"\bneeds (\d+) (?:visible )?GPUs\b")
# pytest -v's line per test: "tests/test_gpu.py::test_x[a] SKIPPED (reason)   [ 40%]"
_OUTCOME = re.compile(r"^(\S+::\S.*?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)"
                      r"(?: \((.*)\))?(?:\s+\[\s*\d+%\])?$")
# -rs's summary of skips, where -v gives no reason: "SKIPPED [2] tests/test_gpu.py:148: needs ..."
_SKIPPED = re.compile(r"^SKIPPED \[(\d+)\] (\S+): (.*)$")


def run_pytest_gpu(repo: Path, timeout: float = 600, deselect: tuple[str, ...] = ()) -> dict:
    """`pytest -m gpu` in `timeout` s (its own budget): the outcome, the tests skipped for want
    of GPUs (`not_answered`), and on a timeout what it answered until then: `timed_out`, not a
    failure (the report lists the rest as not answered); a test that failed before still fails."""
    skip = ["-k", " and ".join(f"not {name}" for name in deselect)] if deselect else []
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-rs", "-p", "no:cacheprovider",
           *skip, "tests"]
    # A session of its own: a timeout ends every process of the run (a test's torchrun and its
    # ranks, holding the GPUs and the output pipe), not pytest alone.
    # COLUMNS: -v cuts a skip's reason to the terminal's width, and the reason is what we read
    proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, "COLUMNS": "1000"})
    timed_out = False
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()  # what it printed until then (communicate keeps it)
    outcomes = {}
    for line in text.splitlines():
        m = _OUTCOME.match(line.strip())
        if m:
            outcomes[m.group(1)] = (m.group(2), m.group(3) or "")
    not_answered = [{"test": test, "why": f"needs {NEEDS_GPUS.search(why).group(1)} GPUs"}
                    for test, (outcome, why) in outcomes.items()
                    if outcome == "SKIPPED" and NEEDS_GPUS.search(why)]
    if not any(why for _, why in outcomes.values()):  # a pytest whose -v names no skip reason
        for line in text.splitlines():
            m = _SKIPPED.match(line.strip())
            if m and NEEDS_GPUS.search(m.group(3)):
                not_answered.append({"test": f"{m.group(2)} ({m.group(1)} test(s))",
                                     "why": f"needs {NEEDS_GPUS.search(m.group(3)).group(1)} GPUs"})
    failed = sorted(test for test, (outcome, _) in outcomes.items()
                    if outcome in ("FAILED", "ERROR"))
    tail = text.strip().splitlines()
    record = {"ran": True, "command": " ".join(cmd[1:]), "timeout": timeout,
              "not_answered": not_answered, "failed": failed, "output_tail": "\n".join(tail[-30:])}
    if timed_out:
        counts: dict[str, int] = {}
        for outcome, _ in outcomes.values():
            counts[outcome.lower()] = counts.get(outcome.lower(), 0) + 1
        done = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no test finished"
        return {**record, "returncode": None, "timed_out": True, "ok": not failed,
                "counts": counts, "summary": f"timed out after {timeout:.0f} s ({done} by then)"}
    summary = tail[-1].strip("= ") if tail else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}
    # 0 = all passed; 5 = nothing collected/selected and anything else: a failure.
    return {**record, "returncode": proc.returncode, "timed_out": False,
            "ok": proc.returncode == 0, "summary": summary, "counts": counts}


# --------------------------------------------------------------------------- the course's steps
# The solution each GPU check runs, by what it checks: when a step is renamed or split, its line
# here is the one to change.
STEP_SCRIPTS = {
    "mixed_precision": "solutions/09_mixed_precision/fno.py",
    "compile": "solutions/11_compile/fno.py",
    "peak_memory": "solutions/11_compile/fno.py",
}
# The loss with --amp bf16 / --compile against float32, as tests/test_09_mixed_precision.py bounds it
# on the CPU (where its comment says why): bf16 1e-3, compile 1e-4 relative, every step.
LOSS_TOLERANCE = {"bf16": 1e-3, "compile": 1e-4}
RUNS_06 = {"float32": [], "bf16": ["--amp", "bf16"], "compile": ["--compile"]}
# Every run, float32 too, with TF32 off, as tests/test_gpu.py's comparisons run: NVIDIA's libraries
# read NVIDIA_TF32_OVERRIDE=0; cuDNN's float32 convolutions (the FNO's 1x1 ones) are TF32 by
# default from Ampere on, about 1e-3 off float32, ten times LOSS_TOLERANCE["compile"].
NO_TF32 = {"NVIDIA_TF32_OVERRIDE": "0"}
_06_KEY = {"float32": "mixed_precision", "bf16": "mixed_precision", "compile": "compile"}
RUN_06 = [
    "--epochs",
    "1",
    "--batch-size",
    "8",
    "--max-steps",
    "5",
    "--log-every",
    "1",
    "--bind",
    "none",
    "--device",
    "cuda",
]
# tests/test_gpu.py's tests of what the node step already ran itself: `pytest -m gpu` leaves them
# out there, so that the job runs each check once (tests/test_gpucheck.py checks the names exist).
COVERED_BY_NODE_STEP = (
    "test_gpu_complex_gradients_two_ranks_equal_one_rank",
    "test_gpu_nccl_transport_is_reported",
    "test_gpu_06_low_precision_and_compile_track_float32",
)

# NCCL's and RCCL's INFO line for each connection of a channel between two ranks, e.g.
#   node:919:1150 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read
#   node:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3
#     (https://github.com/NVIDIA/nccl/issues/952)
#   machine-1:16194:18583 [3] NCCL INFO Channel 00 : 11[3e000] -> 9[1b000] via P2P/direct pointer
#     (https://github.com/NVIDIA/nccl/issues/429)
#   ubuntu:39964:40050 [6] NCCL INFO Channel 09 : 6[6] -> 7[7] via SHM/direct/direct
#     (https://github.com/NVIDIA/nccl-tests/issues/166)
#   g1072:1263988:1264006 [3] NCCL INFO Channel 00/0 : 7[ce000] -> 5[c6000] via P2P/IPC comm
#     0xfb16e30 nRanks 08   (one line)
#     (RCCL: https://github.com/ROCm/rccl/issues/1026)
_CHANNEL = re.compile(
    r"NCCL INFO Channel \d+(?:/\d+)? : (\d+)\[[0-9a-fA-Fx]+\] -> (\d+)\[[0-9a-fA-Fx]+\]"
    r"(?: \[(?:send|receive)\])? via (P2P/direct pointer|\S+)"
)
TRANSPORT_KINDS = {
    "P2P": "P2P (GPU to GPU: NVLink/xGMI or PCIe)",
    "SHM": "SHM (through host memory)",
    "NET": "NET (through the network stack)",
}


def nccl_transports(text: str) -> dict:
    """Which transports NCCL/RCCL connected the ranks' channels with, from NCCL_DEBUG=INFO output:
    {"kinds": {"P2P": n, ...}, "transports": {"P2P/IPC/read": n, ...}}, by connection."""
    kinds, transports = {}, {}
    for m in _CHANNEL.finditer(text):
        via = m.group(3)
        kind = via.split("/")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
        transports[via] = transports.get(via, 0) + 1
    return {"kinds": kinds, "transports": transports}


def transport_line(found: dict | None) -> str:
    if found and (found.get("needs_gpus") or found.get("timed_out")):
        return f"NCCL/RCCL transport between this node's GPUs: NOT ANSWERED ({found['why']})"
    if not found or not found.get("ran"):
        why = (found or {}).get("why", "not run")
        return f"NCCL/RCCL transport between this node's GPUs: not seen ({why})"
    kinds = found["kinds"]
    if not kinds:
        return ("NCCL/RCCL transport between this node's GPUs: no channel line in the "
                "NCCL_DEBUG=INFO output")
    parts = [f"{TRANSPORT_KINDS.get(k, k)}: {n} connection(s)" for k, n in sorted(kinds.items())]
    detail = ", ".join(sorted(found["transports"]))
    advice = (
        "; NET between GPUs of one node: they cannot reach each other directly (per-task GPU "
        "binding? see slurm/README.md)"
        if "NET" in kinds
        else ""
    )
    return f"NCCL/RCCL transport between this node's GPUs: {'; '.join(parts)} ({detail}){advice}"


def _budget_left(deadline: float, cap: float) -> float:
    return max(1.0, min(cap, deadline - time.monotonic()))


def run_complex_ddp(torch, out: Path, timeout: float, backend: str = "nccl") -> dict:
    """wellfno.complex_ddp_check's check on 2 of the node's GPUs (torchrun --standalone,
    nccl/RCCL), with NCCL_DEBUG=INFO: whether plain DDP averages complex gradients right, and the
    transport."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        if count == 0:
            return {"complex_ddp": {"ran": False, "why": NO_GPU},
                    "transport": {"ran": False, "why": NO_GPU}}
        # a question this node cannot answer: the report says so, and never PASS for it
        why = {"ran": False, "why": f"needs 2 GPUs, torch sees {count}", "needs_gpus": 2}
        return {"complex_ddp": dict(why), "transport": dict(why)}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))
    }
    env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,P2P,SHM,NET")  # the channels' transports
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "wellfno.complex_ddp_check",
        "--out",
        str(out),
        "--backend",
        backend,
    ]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        # not answered in its time: the report's NOT ANSWERED (timed out), never a failure
        why = {"ran": True, "backend": backend, "timed_out": True,
               "why": f"timed out after {timeout:.0f} s"}
        return {"complex_ddp": dict(why), "transport": dict(why)}
    text = r.stdout + r.stderr
    result_file = out / "complex_ddp.json"
    if r.returncode == 0 and result_file.is_file():
        check = json.loads(result_file.read_text())
        check.pop("differences", None)  # per-parameter numbers stay in complex_ddp.json
    else:
        tail = [line for line in text.splitlines() if line.strip()][-3:]
        check = {
            "ran": True,
            "backend": backend,
            "why": f"exit {r.returncode}: " + " | ".join(tail),
        }
    return {"complex_ddp": check, "transport": {"ran": True, **nccl_transports(text)}}


def _losses(metrics: dict) -> list[float]:
    return [loss for _, loss in metrics["history"][0]["loss_log"]]


def run_06_on_gpu(torch, out: Path, repo: Path, timeout: float) -> dict:
    """Step 06 on the GPU, float32, --amp bf16 and --compile, a few steps on the tiny embedded
    data: the losses against float32 (LOSS_TOLERANCE) and each run's peak device memory."""
    if not torch.cuda.is_available():
        return {"ran": False, "why": NO_GPU}
    from wellfno.grayscott import generate

    data = out / "data"
    if not (data / "datasets").is_dir():
        generate(data, "tiny", seed=0, quiet=True)
    deadline = time.monotonic() + timeout
    runs = {}
    for name, extra in RUNS_06.items():
        script = STEP_SCRIPTS[_06_KEY[name]]
        run_out = out / name
        cmd = [
            sys.executable,
            str(repo / script),
            "--data-dir",
            str(data),
            "--out",
            str(run_out),
            *RUN_06,
            *extra,
        ]
        allowed = _budget_left(deadline, timeout)
        try:
            r = subprocess.run(
                cmd,
                cwd=repo,
                capture_output=True,
                text=True,
                timeout=allowed,
                env={**os.environ, **NO_TF32},
            )
        except subprocess.TimeoutExpired:
            # a question not answered in its time, not a wrong answer (the report's NOT ANSWERED)
            runs[name] = {"ok": False, "timed_out": True, "why": f"timed out after {allowed:.0f} s"}
            continue
        if r.returncode != 0:
            error = [line for line in r.stderr.splitlines() if line.startswith("error:")]
            runs[name] = {
                "ok": False,
                "why": (error or r.stderr.strip().splitlines()[-1:] or ["?"])[-1],
                "not_supported": "has no bfloat16 units" in r.stderr,
            }
            continue
        metrics = json.loads((run_out / "metrics.json").read_text())
        runs[name] = {
            "ok": True,
            "script": script,
            "losses": _losses(metrics),
            "peak_memory_bytes": metrics["peak_memory_bytes"],
            "samples_per_second": metrics["samples_per_second"],
        }
    reference = runs["float32"]
    for name, run in runs.items():
        if name == "float32":
            continue
        if run["ok"] and reference.get("timed_out"):
            # nothing to compare with: not answered (a float32 run that failed is a problem itself)
            run.update(ok=False, timed_out=True, why=f"its float32 reference {reference['why']}")
        if run["ok"] and reference["ok"]:
            off = max(abs(a - b) / abs(b) for a, b in zip(run["losses"], reference["losses"]))
            run.update(
                max_relative_loss_difference=off,
                tolerance=LOSS_TOLERANCE[name],
                ok=off < LOSS_TOLERANCE[name] and len(run["losses"]) == len(reference["losses"]),
            )
    return {"ran": True, "runs": runs}


# The node step's answers, in the order it gives them (each a key of node.json): the file is
# written again after each one (atomically: a temporary file, then os.replace), so a node step
# cut off by its time (day0.sh's `timeout -k`, a job's end) keeps what it answered, and the report
# lists the rest as NOT ANSWERED (CUT_OFF), never as a failure.
NODE_PARTS = {
    "training": "training steps of the course's model on the GPU (samples/s, utilization)",
    "complex_ddp": "complex gradients under DDP over NCCL/RCCL",
    "transport": "NCCL/RCCL transport between this node's GPUs",
    "step_06": "step 06 on the GPU (--amp bf16, --compile, peak memory)",
    "pytest_gpu": "pytest -m gpu",
}
CUT_OFF = "not asked: the node step ended before it (out of its time, or killed)"


def missing_parts(node: dict) -> list[str]:
    """The NODE_PARTS a node step cut off did not answer (its node.json's `unfinished`)."""
    return list(node.get("unfinished", []))


def node_record(torch, steps: int, batch: int, grid: int, pytest: bool, repo: Path,
                budget: float = 540, out: Path | None = None, pytest_budget: float = 600,
                save=None) -> dict:
    """The node step: `budget` s for training, DDP and step 06; `pytest -m gpu` then has
    `pytest_budget` s of its own, whatever the others took. `save(record)` after each answer
    (NODE_PARTS), and once before the first."""
    def answered(rec):  # node.json as it stands: what is still to come listed as unfinished
        if save:
            save({**rec, "unfinished": [part for part in NODE_PARTS if part not in rec]})

    gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    pci = None
    if gpu:
        try:
            from affinity.discover import visible_gpu_pci
            pci = visible_gpu_pci(torch)[0]
        except Exception:  # noqa: BLE001 - old torch: no PCI address, nvidia-smi/rocm-smi unusable
            pci = None
    deadline = time.monotonic() + budget  # training, DDP and step 06 together
    rec = {"host": socket.gethostname(), "gpus_visible": torch.cuda.device_count() if gpu else 0}
    answered(rec)  # a node step cut off before its first answer: this node.json, no earlier one
    if gpu:
        with UtilizationSampler(torch, 0, pci) as sampler:
            training = train_steps(torch, device, steps, batch, grid)
        rec.update(training=training, utilization=sampler.summary())
    else:
        rec["training"] = train_steps(torch, device, steps, batch, grid)
        rec["utilization"] = {"available": False, "text": f"not available ({NO_GPU})"}
    answered(rec)
    work = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="gpucheck-"))
    rec.update(run_complex_ddp(torch, work / "complex_ddp", _budget_left(deadline, 180)))
    answered(rec)
    rec["step_06"] = run_06_on_gpu(torch, work / "step_06", repo, _budget_left(deadline, 300))
    answered(rec)
    if pytest and gpu:
        rec["pytest_gpu"] = run_pytest_gpu(repo, timeout=pytest_budget,
                                           deselect=COVERED_BY_NODE_STEP)
    elif pytest:
        rec["pytest_gpu"] = {"ran": False, "ok": True, "summary": f"not run: {NO_GPU} (every gpu test would skip)"}
    else:
        rec["pytest_gpu"] = {"ran": False, "ok": True, "summary": "not run (--pytest not given)"}
    if save:
        save(rec)  # every part answered: no `unfinished`
    return rec


# --------------------------------------------------------------------------- report
def build_report(tasks: list[dict], node: dict | None, expect_gpu: bool) -> dict:
    problems, warnings = [], []
    if not tasks:
        problems.append("no task results (did the srun step run?)")
    for t in tasks:
        checks = t["gpus"] or ([t["cpu_check"]] if "cpu_check" in t else [])
        for c in checks:
            if not c["matmul_ok"]:
                problems.append(f"rank {t['rank']} {c['device']}: matmul relative error {c['matmul_rel_error']:.2e} > {MATMUL_TOL}")
            if not c["fft_ok"]:
                problems.append(f"rank {t['rank']} {c['device']}: FFT relative error {c['fft_rel_error']:.2e} > {FFT_TOL}")
        if expect_gpu and not t["gpus"]:
            problems.append(f"rank {t['rank']} on {t['host']}: torch sees no GPU (torch {t['versions']['torch']}, "
                            f"cuda={t['versions']['cuda']}, hip={t['versions']['hip']}); load the site's GPU build of torch")
        if expect_gpu and len(t["gpus"]) > 1:
            problems.append(f"rank {t['rank']}: sees {len(t['gpus'])} GPUs, expected one per task")
        for g in t["gpus"]:
            # Slower, not wrong: LUMI's docs, "Correct CPU and GPU binding is important to get the
            # best performance" (docs.lumi-supercomputer.eu, distribution-binding, GPU Binding),
            # and affinity/bind.py warns and carries on. A warning, listed, never FAIL.
            if g.get("match") == "NO":
                warnings.append(f"rank {t['rank']}: its CPUs are not on GPU {g['index']}'s NUMA node "
                                f"({g['placement']}): it runs, slower; ask Slurm for CPUs next to the "
                                "GPUs (--gpu-bind=closest, or the site's --cpu-bind masks)")
    seen = [g.get("pci") for t in tasks for g in t["gpus"] if g.get("pci")]
    if len(seen) != len(set(seen)):
        problems.append(f"two tasks share a GPU: {sorted(seen)}")
    if node is None:
        problems.append("no node results (the training/pytest step did not run)")
    else:
        problems += course_problems(node)
        if not node.get("pytest_gpu", {"ok": True})["ok"]:
            failed = node["pytest_gpu"].get("failed") or []
            problems.append(f"pytest -m gpu failed: {node['pytest_gpu']['summary']}"
                            + (f" ({', '.join(failed)})" if failed else ""))
    any_gpu = any(t["gpus"] for t in tasks)
    # without a GPU only a cut-off node step's parts (the GPU questions are N/A there)
    unanswered = [q for q in not_answered(node) if any_gpu or q["why"] == CUT_OFF]
    if problems:
        status = "FAIL"
    elif not any_gpu:
        status = NO_GPU
    else:
        status = INCOMPLETE if unanswered else "PASS"
    return {"status": status, "problems": problems, "not_answered": unanswered, "warnings": warnings,
            "expect_gpu": expect_gpu, "tasks": tasks, "node": node}


def not_answered(node: dict | None) -> list[dict]:
    """The questions the node step could not ask: [{"question": ..., "why": ...}]."""
    if not node:
        return []
    out = []
    for key, question in (("complex_ddp", "complex gradients under DDP over NCCL/RCCL"),
                          ("transport", "NCCL/RCCL transport between this node's GPUs")):
        check = node.get(key) or {}
        if check.get("needs_gpus"):
            out.append({"question": question, "why": f"needs {check['needs_gpus']} GPUs"})
        elif check.get("timed_out"):
            out.append({"question": question, "why": check["why"]})
    for name, run in ((node.get("step_06") or {}).get("runs") or {}).items():
        if run.get("timed_out"):
            out.append({"question": f"{STEP_SCRIPTS[_06_KEY[name]]} on the GPU ({name})",
                        "why": run["why"]})
    tests = node.get("pytest_gpu") or {}
    out += [{"question": f"pytest -m gpu: {t['test']}", "why": t["why"]}
            for t in tests.get("not_answered", [])]
    if tests.get("timed_out"):
        out.append({"question": "pytest -m gpu: every test after the last one it reported",
                    "why": f"timed out after {tests['timeout']:.0f} s: give it more with "
                           f"--pytest-budget"})
    out += [{"question": NODE_PARTS[part], "why": CUT_OFF} for part in missing_parts(node)]
    return out


def complex_ddp_line(node: dict) -> str:
    from wellfno.complex_ddp_check import verdict_line

    check = node.get("complex_ddp") or {"ran": False, "why": "not run"}
    if check.get("needs_gpus") or check.get("timed_out"):
        return f"complex gradients under DDP: NOT ANSWERED ({check['why']})"
    return verdict_line(check)


def course_problems(node: dict) -> list[str]:
    """What the course's GPU steps found wrong (a node.json without them: nothing)."""
    problems = []
    check = node.get("complex_ddp") or {}
    # plain DDP of complex weights is information (why exercise 05 keeps them real); the course's
    # real weights averaged wrong, or a check that did not finish, is a problem
    # (a check that timed out: NOT ANSWERED, by not_answered, and no problem)
    if (check.get("ran") and not check.get("timed_out")
            and not check.get("summary", {}).get("real_weights", {}).get("ok")):
        problems.append(complex_ddp_line(node))
    for name, run in (node.get("step_06") or {}).get("runs", {}).items():
        if run.get("not_supported") or run.get("timed_out"):
            continue  # e.g. bf16 on a GPU without bfloat16 units: the script refuses, as it should
        if not run["ok"]:
            where = STEP_SCRIPTS[_06_KEY[name]]
            detail = run.get("why") or (
                f"loss off float32 by {run['max_relative_loss_difference']:.1e} "
                f"relative > {run['tolerance']:g}"
            )
            problems.append(f"{where} on the GPU ({name}): {detail}")
    return problems


def step_06_lines(step: dict | None) -> list[str]:
    if not step or not step.get("ran"):
        return [
            f"06 on the GPU (bf16, compile, peak memory): not run "
            f"({(step or {}).get('why', 'not run')})"
        ]
    runs = step["runs"]
    lines = []
    for name, r in runs.items():
        if name == "float32":
            continue
        if "max_relative_loss_difference" in r:
            lines.append(
                f"06 --{'amp bf16' if name == 'bf16' else 'compile'}: loss within "
                f"{r['max_relative_loss_difference']:.1e} of float32 over {len(r['losses'])} steps "
                f"(tolerance {r['tolerance']:g}): {'ok' if r['ok'] else 'FAILED'}"
            )
        else:
            why = r.get("why", "not run")
            lines.append(
                f"06 --{'amp bf16' if name == 'bf16' else 'compile'}: "
                + (f"NOT ANSWERED ({why})" if r.get("timed_out") else why)
            )
    memory = [
        f"{name} {r['peak_memory_bytes'] / 2**20:.0f} MiB"
        for name, r in runs.items()
        if r.get("peak_memory_bytes") is not None
    ]
    if memory:
        lines.append("06 peak device memory (training only, batch 8): " + ", ".join(memory))
    return lines


def report_text(rep: dict) -> str:
    from benchtools.machine import cpu_model

    unanswered = rep.get("not_answered", [])
    status = rep["status"]
    if status == INCOMPLETE:  # the first word an instructor reads must not be PASS
        whys = "; ".join(sorted({q["why"] for q in unanswered}))
        status = (f"{INCOMPLETE}: {len(unanswered)} question(s) NOT ANSWERED ({whys}), listed at "
                  f"the end; every check this node could run passed")
    if rep.get("warnings"):  # the first line says there is more to read
        status += f" with {len(rep['warnings'])} WARNING(s), listed at the end"
    lines = [f"GPU check: {status}   (CPU: {cpu_model()})"]
    lines += version_lines(rep["tasks"])
    for t in rep["tasks"]:
        vis = " ".join(f"{k}={v}" for k, v in t["visible"].items() if v is not None) or "(no visible-device variable)"
        lines.append(f"rank {t['rank']} on {t['host']}: {vis}")
        for g in t["gpus"]:
            lines.append(f"  GPU {g['index']} {g['name']}: {g['placement']}")
            lines.append(f"    matmul rel. error {g['matmul_rel_error']:.1e} ({'ok' if g['matmul_ok'] else 'FAILED'}), "
                         f"FFT rel. error {g['fft_rel_error']:.1e} ({'ok' if g['fft_ok'] else 'FAILED'})")
        if not t["gpus"]:
            c = t.get("cpu_check", {})
            lines.append(f"  {NO_GPU}; {t.get('placement', '')}")
            if c:
                lines.append(f"    on the CPU: matmul rel. error {c['matmul_rel_error']:.1e}, FFT rel. error {c['fft_rel_error']:.1e}")
    node = rep["node"]
    # a part a node step cut off did not reach: no line of its own, listed NOT ANSWERED below
    cut = set(missing_parts(node)) if node else set(NODE_PARTS)
    if "training" not in cut:
        tr, ut = node["training"], node["utilization"]
        lines.append(f"training ({tr['device']}, {tr['steps']} steps after {tr['warmup_steps']} warm-up, batch {tr['batch']}, "
                     f"{tr['grid']}x{tr['grid']}): median step {tr['median_step_ms']:.2f} ms, "
                     f"{tr['samples_per_second']:.0f} samples/s (compute only, data already on the device)")
        if ut.get("available"):
            lines.append(f"GPU utilization during those steps ({ut['method']}, {ut['samples']} samples): "
                         f"mean {ut['mean_percent']:.0f}%, median {ut['median_percent']:.0f}%, max {ut['max_percent']:.0f}%")
        else:
            lines.append(f"GPU utilization: {ut['text']}")
    if "complex_ddp" not in cut:
        lines.append(complex_ddp_line(node))
    if "transport" not in cut:
        lines.append(transport_line(node.get("transport")))
    if "step_06" not in cut:
        lines += step_06_lines(node.get("step_06"))
    if "pytest_gpu" not in cut:
        tests = node["pytest_gpu"]
        skipped = len(tests.get("not_answered", []))
        lines.append(f"pytest -m gpu: {tests['summary']}"
                     + (f"; {skipped} of the skipped NOT ANSWERED (need more GPUs), listed at "
                        "the end" if skipped else ""))
    for q in unanswered:
        lines.append(f"NOT ANSWERED ({q['why']}): {q['question']}")
    for p in rep["problems"]:
        lines.append(f"PROBLEM: {p}")
    for w in rep.get("warnings", []):
        lines.append(f"WARNING: {w}")
    return "\n".join(lines) + "\n"


def version_lines(tasks: list[dict]) -> list[str]:
    """The report's lines on the software: what the first task runs (every task runs the same)."""
    if not tasks:
        return []
    v = tasks[0]["versions"]
    lines = [f"versions: python {v['python']}, torch {v['torch']}, CUDA {v['cuda']}, "
             f"HIP {v['hip']}, driver {v['driver']}, cuDNN/MIOpen {v['cudnn_or_miopen']}, "
             f"NCCL/RCCL {v['nccl_or_rccl']}"]
    # whether the course supports this torch (wellfno.toolchain: the environment check's line)
    from wellfno.toolchain import torch_lines

    lines += torch_lines(v["torch"], None, None, 1, "")[1:2]
    return lines


def load_results(folder: Path) -> tuple[list[dict], dict | None]:
    tasks = [json.loads(p.read_text()) for p in sorted(folder.glob("task-*.json"))]
    tasks.sort(key=lambda t: t["rank"])
    node_file = folder / "node.json"
    return tasks, (json.loads(node_file.read_text()) if node_file.is_file() else None)


# --------------------------------------------------------------------------- CLI
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("task", help="this task: versions, visible devices, placement, matmul + FFT")
    t.add_argument("--out", required=True)
    n = sub.add_parser("node", help="utilization during training steps; pytest -m gpu")
    n.add_argument("--out", required=True)
    n.add_argument("--steps", type=int, default=30)
    n.add_argument("--batch-size", type=int, default=16, help="batch size (16: fno.py's default)")
    n.add_argument("--grid", type=int, default=32, help="grid size (32: the demo dataset)")
    n.add_argument("--pytest", action="store_true", help="also run `pytest -m gpu` (where torch sees a GPU)")
    n.add_argument("--budget", type=float, default=540,
                   help="seconds for the training steps, DDP and step 06 together")
    n.add_argument("--pytest-budget", type=float, default=600,
                   help="seconds for `pytest -m gpu`, its own (a timeout is reported as one)")
    r = sub.add_parser("report", help="merge into gpu_check.json + gpu_check.txt")
    r.add_argument("folder")
    r.add_argument("--expect-gpu", action="store_true", help="a GPU site: no GPU is a failure")
    args = ap.parse_args(argv)

    if args.cmd in ("task", "node"):
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise UserError(f"--out {out} is a file; give a folder")
        if args.cmd == "node":
            for name in ("steps", "batch_size", "grid", "budget", "pytest_budget"):
                if getattr(args, name) < 1:
                    raise UserError(f"--{name.replace('_', '-')} must be at least 1")
        out.mkdir(parents=True, exist_ok=True)
        import torch
        if args.cmd == "task":
            rec = task_record(torch)
            atomic_write_json(out / f"task-{rec['rank']}.json", rec)
            print(f"gpucheck task: rank {rec['rank']} sees {len(rec['gpus'])} GPU(s)" +
                  "".join(f"; GPU {g['index']} matmul {'ok' if g['matmul_ok'] else 'FAILED'}, "
                          f"FFT {'ok' if g['fft_ok'] else 'FAILED'}" for g in rec["gpus"]), flush=True)
        else:
            node_record(torch, args.steps, args.batch_size, args.grid, args.pytest,
                        Path(__file__).resolve().parents[1], budget=args.budget,
                        out=out / "node", pytest_budget=args.pytest_budget,
                        save=lambda rec: atomic_write_json(out / "node.json", rec))
        return 0

    folder = Path(args.folder)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder with gpucheck results; run the task and node steps first")
    tasks, node = load_results(folder)
    rep = build_report(tasks, node, args.expect_gpu)
    text = report_text(rep)
    atomic_write_json(folder / "gpu_check.json", rep)
    atomic_write_text(folder / "gpu_check.txt", text)
    print(text, end="")
    return 1 if rep["status"] == "FAIL" else 0


if __name__ == "__main__":
    run_main(main)
