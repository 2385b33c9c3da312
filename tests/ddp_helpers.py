"""What the DDP checks of exercises 05 and 06 share: start ranks, read the probe, compare checkpoints.

The ranks run on the CPU with gloo, started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT in the environment), each its own process, so that each rank's output and exit
status can be checked; one test goes through torchrun itself and one through srun on the local
Slurm cluster. A probe (tests/ddp_probe/sitecustomize.py) records which samples each rank reads
and which files it writes, and makes one rank fail on demand.

Data: the tiny embedded dataset with --n-steps-input 10, so that an epoch is 8 training samples
(4 trajectories x 2 windows) and 4 validation samples: 3 ranks divide neither.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import torch

from tests.checks import require, unknown_option, why_it_stopped
from tests.conftest import PYTHON, REPO, pythonpath_with

PROBE = Path(__file__).resolve().parent / "ddp_probe"
# 8 train, 4 valid samples; a small model (the checks compare ranks with one rank, not the model's
# quality): a third of the default one's compute. Options that change these go after SMALL.
# The tests' model: what they check does not depend on its size, their runs' time does (a profiled
# run of the course's model, width 32 and 12 modes, took 20 s of CPU; of this one, 7 s).
SMALL_MODEL = ("--width", "8", "--modes", "4")
SMALL = ("--n-steps-input", "10", "--bind", "none", "--seed", "3", *SMALL_MODEL)
N_TRAIN, N_VALID = 8, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe_env(log_dir: Path | None = None, fail: str | None = None) -> dict:
    env = {"PYTHONPATH": pythonpath_with(PROBE)}
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        env["WELLFNO_PROBE_LOG"] = str(log_dir)
    if fail is not None:
        env["WELLFNO_PROBE_FAIL"] = fail
    return env


def launch(script, world: int, *args, env: dict | None = None, timeout: float = 300):
    """Start `world` ranks as torchrun would (one process each); wait; return [(rc, stdout, stderr)] by rank.

    world=0 means no launcher at all: one plain process."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT")
            and not k.startswith("SLURM_")}
    base.update(env or {})
    port = str(free_port())
    procs = []
    for rank in range(max(world, 1)):
        rank_env = dict(base)
        if world:
            rank_env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                            LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([PYTHON, str(script), *map(str, args)], cwd=REPO,
                                      env=rank_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results, deadline = [], time.monotonic() + timeout
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for rank, (_, _, err) in enumerate(results):  # the previous step's script, say
        missing = unknown_option(err)
        require(missing is None, f"rank {rank} of {Path(script).name} stopped: {missing}")
    return results


def assert_ok(results, fix: str | None = None):
    """Every rank exited 0; else the failing rank's last lines (its own error, not a dump).

    With `fix` (what to do, ending in its task: tests/checks.py), a check-your-work failure is one
    sentence: the rank, its exit status, its error line, and `fix`.
    """
    for rank, (rc, out, err) in enumerate(results):
        if fix is not None:
            require(rc == 0, f"rank {rank} ended with exit code {rc}: "
                    f"{why_it_stopped(err or out, fix)}")
        assert rc == 0, f"rank {rank} exited with {rc}: " + "\n".join((out + err).strip().splitlines()[-15:])


def parameters(checkpoint: Path) -> dict:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]


def max_relative_difference(a: dict, b: dict) -> float:
    """max over tensors of max|a - b| / max|b| (per tensor, so that entries near 0 do not blow it up)."""
    assert a.keys() == b.keys()
    worst = 0.0
    for name in a:
        if not torch.is_floating_point(a[name]) and not torch.is_complex(a[name]):
            assert torch.equal(a[name], b[name]), name
            continue
        # FNO's spectral weights
        wide = torch.complex128 if torch.is_complex(a[name]) else torch.float64
        x, y = a[name].to(wide), b[name].to(wide)
        worst = max(worst, ((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item())
    return worst


def read_probe(log_dir: Path) -> dict:
    """{rank: {"train": [...], "valid": [...], "rollout": [...], "write": [...]}} from the probe's logs."""
    seen = defaultdict(lambda: defaultdict(list))
    for path in log_dir.glob("*.log"):
        rank = int(path.name.split(".")[0])
        for line in path.read_text().splitlines():
            kind, _, value = line.partition(" ")
            seen[rank][kind].append(int(value) if kind != "write" else value)
    return seen


def error_lines(text: str) -> list[str]:
    """The `error: ...` lines (one may follow a progress bar that ended without a newline)."""
    return re.findall(r"(?:^|[\r\n]|\]|\s)(error: [^\r\n]*)", text)


ONE_RANK_STEP = ("--epochs", "1", "--max-steps", "1", "--batch-size", "4", *SMALL)


def one_rank_reference(finished_run, script, data_dir) -> Path:
    """The output folder of one rank, --batch-size 4, one step: the reference that exercises 05, 06
    and 13 compare their ranks with and evaluate. One plain run in the test process
    (conftest.py's finished_run: no launcher, nothing about the process is checked on it), shared
    by the three modules on one solution (make test-matrix: on each later one)."""
    return finished_run(script, data_dir, *ONE_RANK_STEP)[0]


def in_process(completed) -> list:
    """[(rc, stdout, stderr)] as `launch(script, 0, ...)` gives them, from conftest.py's exit_of."""
    return [(completed.returncode, completed.stdout, completed.stderr)]
