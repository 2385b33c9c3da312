"""Exercise 05: data-parallel training (DistributedDataParallel) - exact, for any number of ranks.

Check your own script:  .venv/bin/python -m pytest -q tests/test_05_ddp.py --script YOUR_SCRIPT

The ranks run on the CPU with gloo, started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT in the environment), each its own process, so that each rank's output and exit
status can be checked; one test goes through torchrun itself and one through srun on the local
Slurm cluster. A probe (tests/ddp_probe/sitecustomize.py) records which samples each rank reads
and which files it writes, and makes one rank fail on demand.

Data: the tiny embedded dataset with --n-steps-input 10, so that an epoch is 8 training samples
(4 trajectories x 2 windows) and 4 validation samples: 3 ranks divide neither.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from tests.conftest import PYTHON, REPO
from tests.test_slurm import job_env, run_job, slurm_cluster, slurm_data  # noqa: F401 - fixtures of the Slurm tests

PROBE = Path(__file__).resolve().parent / "ddp_probe"
SMALL = ("--n-steps-input", "10", "--bind", "none", "--seed", "3")  # 8 train, 4 valid samples
N_TRAIN, N_VALID = 8, 4


STEP = "05_ddp"  # the cross-step matrix (tests/conftest.py) supplies `script`: 05 and every later solution


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe_env(log_dir: Path | None = None, fail: str | None = None) -> dict:
    env = {"PYTHONPATH": os.pathsep.join([str(PROBE), os.environ.get("PYTHONPATH", "")])}
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
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
            and not k.startswith("SLURM_")}
    base.update(env or {})
    port = str(free_port())
    procs = []
    for rank in range(max(world, 1)):
        rank_env = dict(base)
        if world:
            rank_env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                            LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([PYTHON, str(script), *map(str, args)], cwd=REPO, env=rank_env,
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
    return results


def assert_ok(results):
    for rank, (rc, out, err) in enumerate(results):
        assert rc == 0, f"rank {rank} exit {rc}\n{out[-3000:]}\n{err[-3000:]}"


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
        wide = torch.complex128 if torch.is_complex(a[name]) else torch.float64  # FNO's spectral weights
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


@pytest.fixture(scope="module")
def one_rank_run(script, tiny_data_dir, tmp_path_factory):
    """A checkpoint from one rank, --batch-size 4, one step (the reference of the equivalence test)."""
    out = tmp_path_factory.mktemp("ddp_one_rank")
    results = launch(script, 0, "--data-dir", tiny_data_dir, "--out", out, "--epochs", "1", "--max-steps", "1",
                     "--batch-size", "4", *SMALL)
    assert_ok(results)
    return out


# --------------------------------------------------------------------------- acceptance
@pytest.mark.slow
def test_two_ranks_of_b_equal_one_rank_of_2b(script, tiny_data_dir, one_rank_run, tmp_path):
    """After one step, 2 ranks x --batch-size 2 hold the parameters of 1 rank x --batch-size 4.

    Not bitwise: one rank averages the 4 per-sample gradients in one sum; two ranks average 2 each,
    then all-reduce the two means and divide - the same numbers added in another order, and float
    addition is not associative (differences of a few float32 ulps, ~1e-7 relative)."""
    assert_ok(launch(script, 2, "--data-dir", tiny_data_dir, "--out", tmp_path, "--epochs", "1",
                     "--max-steps", "1", "--batch-size", "2", *SMALL))
    one, two = parameters(one_rank_run / "checkpoint.pt"), parameters(tmp_path / "checkpoint.pt")
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 1
    assert max_relative_difference(two, one) <= 1e-5


@pytest.mark.slow
def test_each_training_sample_once_per_epoch_and_rank0_writes_alone(script, tiny_data_dir, tmp_path):
    """3 ranks, 8 samples: 2 per epoch are left out (and named), the other 6 are read once each."""
    logs = tmp_path / "probe"
    out = tmp_path / "run"
    results = launch(script, 3, "--data-dir", tiny_data_dir, "--out", out, "--epochs", "2", "--batch-size", "2",
                     *SMALL, env=probe_env(logs))
    assert_ok(results)
    seen = read_probe(logs)
    named = [sorted(map(int, re.findall(r"\d+", m))) for m in
             re.findall(r"epoch \d+: training samples \[([\d, ]*)\] left out", results[0][1])]
    assert len(named) == 2 and all(len(n) == N_TRAIN % 3 for n in named), results[0][1]
    per_epoch = N_TRAIN // 3
    for epoch in range(2):
        used = Counter()
        for rank in range(3):
            mine = seen[rank]["train"][epoch * per_epoch:(epoch + 1) * per_epoch]
            assert len(mine) == per_epoch and len(seen[rank]["train"]) == 2 * per_epoch
            used.update(mine)
        assert max(used.values()) == 1, f"epoch {epoch + 1}: a sample was used twice: {used}"
        assert sorted([*used, *named[epoch]]) == list(range(N_TRAIN)), (used, named[epoch])
    assert named[0] != named[1] or seen[0]["train"][:per_epoch] != seen[0]["train"][per_epoch:], \
        "the second epoch repeats the first shuffle (set_epoch?)"
    # validation, each epoch: every sample exactly once over the ranks (no padding duplicates)
    valid = Counter(i for rank in range(3) for i in seen[rank]["valid"])
    assert valid == Counter({i: 2 for i in range(N_VALID)}), valid
    # rank 0 alone writes files in OUT and prints the job's lines
    outside = [w for rank in (1, 2) for w in seen[rank]["write"] if w.startswith(str(out))]
    assert not outside, f"ranks 1-2 wrote {outside}"
    assert {Path(w).name for w in seen[0]["write"] if w.startswith(str(out))} >= \
        {"checkpoint.pt", "metrics.json", "rollout.png"}
    for rank in (1, 2):
        assert "epoch" not in results[rank][1] and "Wrote" not in results[rank][1], results[rank][1]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 3 and metrics["global_batch_size"] == 6
    assert len(metrics["samples_per_second_per_rank"]) == 3


@pytest.mark.slow
def test_eval_only_equal_for_1_2_3_ranks(script, tiny_data_dir, one_rank_run, tmp_path):
    """--eval-only on one checkpoint: valid_loss and rollout VRMSE agree to 1e-6 with 1, 2 and 3 ranks
    (4 validation samples: 3 ranks do not divide them; exercise 04's padding pitfall)."""
    values = {}
    for world in (0, 2, 3):
        out = tmp_path / f"w{world}"
        out.mkdir()
        shutil.copy(one_rank_run / "checkpoint.pt", out / "checkpoint.pt")
        logs = tmp_path / f"probe{world}"
        results = launch(script, world, "--data-dir", tiny_data_dir, "--out", out, "--eval-only", "--batch-size",
                         "3", *SMALL, env=probe_env(logs))
        assert_ok(results)
        seen = read_probe(logs)
        assert not any(seen[r]["train"] for r in seen), "--eval-only must not train"
        assert Counter(i for r in seen for i in seen[r]["valid"]) == Counter(range(N_VALID))
        evaluation = json.loads((out / "eval.json").read_text())
        assert evaluation["world_size"] == max(world, 1)
        assert (out / "checkpoint.pt").read_bytes() == (one_rank_run / "checkpoint.pt").read_bytes()
        values[world] = [evaluation["valid_loss"], *evaluation["rollout_vrmse"], *evaluation["persistence_vrmse"]]
    reference = torch.tensor(values[0], dtype=torch.float64)
    for world in (2, 3):
        got = torch.tensor(values[world], dtype=torch.float64)
        assert ((got - reference).abs() / reference.abs()).max().item() <= 1e-6, (world, values)


@pytest.mark.slow
def test_resume_with_another_world_size(script, tiny_data_dir, tmp_path):
    """Epoch 1 on 2 ranks x 2, epoch 2 resumed on 1 rank x 4 == both epochs on 1 rank x 4 (8 samples:
    the same global batches either way)."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ("--data-dir", tiny_data_dir, *SMALL)
    assert_ok(launch(script, 0, *common, "--out", straight, "--epochs", "2", "--batch-size", "4"))
    assert_ok(launch(script, 2, *common, "--out", split, "--epochs", "1", "--batch-size", "2"))
    resumed = launch(script, 0, *common, "--out", split, "--epochs", "2", "--batch-size", "4", "--resume")
    assert_ok(resumed)
    assert "trained with 2 rank(s), now 1" in resumed[0][1]
    state = torch.load(split / "checkpoint.pt", weights_only=True)
    assert [h["world_size"] for h in state["history"]] == [2, 1] and state["epoch"] == 2
    assert max_relative_difference(parameters(split / "checkpoint.pt"), parameters(straight / "checkpoint.pt")) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("how", ["raise", "die"])
def test_a_failing_rank_ends_every_rank_within_seconds(script, tiny_data_dir, tmp_path, how):
    """Rank 1 fails at its 2nd training sample; with --timeout 600 rank 0 must still end within seconds."""
    out = tmp_path / "run"
    started = time.monotonic()
    results = launch(script, 2, "--data-dir", tiny_data_dir, "--out", out, "--epochs", "3", "--batch-size", "1",
                     "--timeout", "600", *SMALL, env=probe_env(fail=f"1:2:{how}"), timeout=240)
    elapsed = time.monotonic() - started
    assert elapsed < 120, f"the job took {elapsed:.0f} s"
    assert all(rc != 0 for rc, _, _ in results), [rc for rc, _, _ in results]
    assert not (out / "checkpoint.pt").exists() and not (out / "metrics.json").exists()
    lines = error_lines(results[0][2])
    assert len(lines) == 1, results[0][2][-3000:]
    if how == "raise":
        assert "rank 1" in lines[0] and "injected failure" in lines[0], lines


# --------------------------------------------------------------------------- launchers
@pytest.mark.slow
def test_torchrun_two_ranks(script, tiny_data_dir, tmp_path):
    result = subprocess.run([PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--master-port", str(free_port()), str(script), "--data-dir", str(tiny_data_dir),
                             "--out", str(tmp_path), "--epochs", "1", "--batch-size", "2", *SMALL],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Training on 2 rank(s) (torchrun, gloo backend, cpu)" in result.stdout
    assert "global batch 4 = 2 rank(s) x --batch-size 2" in result.stdout
    assert result.stdout.count("epoch 1/1") == 1, "one rank speaks for the job"
    assert json.loads((tmp_path / "metrics.json").read_text())["world_size"] == 2


# --------------------------------------------------------------------------- bad input
def test_incomplete_launcher_environment_is_one_line(script, tmp_path):
    result = subprocess.run([PYTHON, str(script), "--out", str(tmp_path / "o")], cwd=REPO, capture_output=True,
                            text=True, timeout=120,
                            env={**{k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}, "RANK": "1"})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert len(error_lines(result.stderr)) == 1 and "WORLD_SIZE" in result.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_nccl_without_gpu_is_one_line(script, tiny_data_dir, tmp_path):
    results = launch(script, 0, "--data-dir", tiny_data_dir, "--out", tmp_path / "o", "--backend", "nccl")
    rc, _, err = results[0]
    assert rc != 0 and "Traceback" not in err and len(error_lines(err)) == 1 and "nccl" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_eval_only_without_checkpoint_is_one_line(script, tiny_data_dir, tmp_path):
    rc, _, err = launch(script, 0, "--data-dir", tiny_data_dir, "--out", tmp_path / "o", "--eval-only", *SMALL)[0]
    assert rc != 0 and "Traceback" not in err and len(error_lines(err)) == 1 and "checkpoint" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_split_smaller_than_world_is_one_line(script, tiny_data_dir, tmp_path):
    # --n-steps-input 11: one window per trajectory, 2 validation samples for 3 ranks
    results = launch(script, 3, "--data-dir", tiny_data_dir, "--out", tmp_path / "o", "--n-steps-input", "11",
                     "--bind", "none", timeout=180)
    for rc, _, err in results:
        assert rc != 0 and "Traceback" not in err, err[-2000:]
    lines = error_lines(results[0][2])
    assert len(lines) == 1 and "valid split" in lines[0] and "fewer than the 3 ranks" in lines[0], lines
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- scaling benchmark
@pytest.mark.slow
def test_scaling_benchmark_writes_json_and_figure(tiny_data_dir, tmp_path):
    """solutions/05_ddp/scaling.py on 1 and 2 CPU ranks (weak scaling): numbers that hang together."""
    out = tmp_path / "scaling"
    result = subprocess.run([PYTHON, str(REPO / "solutions/05_ddp/scaling.py"), "--ranks", "1", "2", "--modes",
                             "weak", "--batch-size", "2", "--max-steps", "6", "--active", "2", "--data-dir",
                             str(tiny_data_dir), "--out", str(out), "--", "--bind", "none"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    written = json.loads((out / "scaling.json").read_text())
    assert written["command"].startswith("python solutions/05_ddp/scaling.py --ranks 1 2") and written["machine"]["cpu"]
    scaling = written["data"]
    one, two = scaling["modes"]["weak"]
    assert (one["ranks"], one["global_batch"], two["ranks"], two["global_batch"]) == (1, 2, 2, 4)
    assert one["efficiency"] == 1.0
    for row in (one, two):
        assert row["samples_per_second"] == pytest.approx(row["global_batch"] / row["step_ms"] * 1e3)
        assert row["traced_steps"] == [4, 5]  # steps 0-1 untraced, 2-3 warm-up, 4-5 recorded
    assert two["efficiency"] == pytest.approx(two["samples_per_second"] / (2 * one["samples_per_second"]))
    assert one["comm_share"] == 0.0 < two["comm_share"] < 1.0  # one rank has no collective; two all-reduce
    assert 0.0 <= two["exposed_comm_share"] <= two["comm_share"]
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (out / "weak_2ranks").glob("trace_rank*.json.gz")) == [
        "trace_rank0_steps4-5.json.gz", "trace_rank1_steps4-5.json.gz"]


# --------------------------------------------------------------------------- Slurm
@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_05_ddp_two_tasks_then_one_task_evaluates(slurm_cluster, slurm_data, tmp_path):
    """slurm/05_ddp.sbatch on the local cluster: srun starts 2 ranks (rendezvous from the
    allocation), then 1 task evaluates the checkpoint: the same validation loss."""
    job = run_job("05_ddp.sbatch", "--epochs", "1", "--batch-size", "2", "--n-steps-input", "10", "--seed", "3",
                  env=job_env(tmp_path / "runs", slurm_data), run_root=tmp_path / "runs", timeout=600)
    job.assert_completed()
    metrics = json.loads((job.run_dir / "metrics.json").read_text())
    evaluation = json.loads((job.run_dir / "eval.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_batch_size"] == 4 and evaluation["world_size"] == 1
    assert abs(evaluation["valid_loss"] - metrics["valid_loss"]) <= 1e-6 * abs(metrics["valid_loss"])
    log = job.logs()
    assert "Training on 2 rank(s) (srun, gloo backend, cpu)" in log, log
