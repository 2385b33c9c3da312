"""Exercise 05: data-parallel training (DistributedDataParallel).

Check your own script:  .venv/bin/python -m pytest -q tests/test_05_ddp.py --script YOUR_SCRIPT

The ranks run on the CPU with gloo, each its own process, started as torchrun starts them
(tests/ddp_helpers.py); one test goes through torchrun itself and one through srun on the local
Slurm cluster. Data: the tiny embedded dataset with --n-steps-input 10, so that an epoch is 8
training samples (4 trajectories x 2 windows): 2 ranks divide them.
"""
from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.checks import last_error_line, require, task
from tests.conftest import PYTHON, REPO
from tests.conftest import exit_of
from tests.ddp_helpers import (N_TRAIN, SMALL, SMALL_MODEL, assert_ok, error_lines, free_port, launch,
                               max_relative_difference, one_rank_reference,
                               parameters, probe_env, read_probe)

# the cross-step matrix (tests/conftest.py) supplies `script`: 05 and every later solution
STEP = "05_ddp"


@pytest.fixture(scope="module")
def one_rank_run(script, tiny_data_dir, finished_run):
    """A checkpoint from one rank, --batch-size 4, one step (the reference of the equivalence test)."""
    return one_rank_reference(finished_run, script, tiny_data_dir)


@pytest.mark.slow
def test_two_ranks_of_b_equal_one_rank_of_2b(script, tiny_data_dir, one_rank_run, tmp_path):
    """After one step, 2 ranks x --batch-size 2 hold the parameters of 1 rank x --batch-size 4.

    Not bitwise: one rank averages the 4 per-sample gradients in one sum; two ranks average 2 each,
    then all-reduce the two means and divide - the same numbers added in another order, and float
    addition is not associative (differences of a few float32 ulps, ~1e-7 relative)."""
    assert_ok(launch(script, 2, "--data-dir", tiny_data_dir, "--out", tmp_path, "--epochs", "1",
                     "--max-steps", "1", "--batch-size", "2", *SMALL),
              f"start a process group when launched with 2 ranks {task('05', 1)}")
    require((tmp_path / "checkpoint.pt").is_file(),
            f"2 ranks wrote no checkpoint.pt: rank 0 writes it {task('05', 4)}")
    one, two = parameters(one_rank_run / "checkpoint.pt"), parameters(tmp_path / "checkpoint.pt")
    steps = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"]
    require(steps == 1, f"2 ranks with --max-steps 1 saved step {steps} (allowed: 1): stop after "
            f"--max-steps steps of the job, not of a rank {task('05', 2)}")
    worst = max_relative_difference(two, one)
    require(worst <= 1e-5, f"2 ranks x 2 samples end the step {worst:.1e} (relative) away from 1 "
            "rank x 4 (allowed: 1e-5): the gradients are not averaged over the ranks; wrap the "
            f"model in DistributedDataParallel {task('05', 3)}")


@pytest.mark.slow
def test_each_rank_trains_its_own_share_and_rank0_writes_alone(script, tiny_data_dir, tmp_path):
    """2 ranks, 8 samples, 2 epochs: each rank reads 4 a epoch, the two shares disjoint, a new shuffle
    each epoch; rank 0 alone writes files and prints the epoch lines."""
    logs, out = tmp_path / "probe", tmp_path / "run"
    results = launch(script, 2, "--data-dir", tiny_data_dir, "--out", out, "--epochs", "2",
                     "--batch-size", "2",
                     *SMALL, env=probe_env(logs))
    assert_ok(results, f"start a process group when launched with 2 ranks {task('05', 1)}")
    seen = read_probe(logs)
    half = N_TRAIN // 2
    for epoch in range(2):
        shares = [seen[rank]["train"][epoch * half:(epoch + 1) * half] for rank in range(2)]
        used = Counter(shares[0] + shares[1])
        require(sorted(used) == list(range(N_TRAIN)) and max(used.values()) == 1,
                f"epoch {epoch + 1}: the 2 ranks read {len(used)} different samples of "
                f"{N_TRAIN}, {sum(used.values()) - len(used)} twice (allowed: each once): give "
                f"each rank its own share with a DistributedSampler {task('05', 2)}")
    require(seen[0]["train"][:half] != seen[0]["train"][half:],
            "epoch 2 repeats epoch 1's order on rank 0: call train_sampler.set_epoch(epoch) "
            f"{task('05', 2)}")
    outside = sorted(Path(w).name for w in seen[1]["write"] if w.startswith(str(out)))
    require(not outside, f"rank 1 wrote {', '.join(outside)}: rank 0 alone writes {task('05', 4)}")
    written = {Path(w).name for w in seen[0]["write"] if w.startswith(str(out))}
    missing = sorted({"checkpoint.pt", "metrics.json", "rollout.png"} - written)
    require(not missing, f"rank 0 did not write {', '.join(missing)} {task('05', 4)}")
    require("epoch 1/2" not in results[1][1] and "Wrote" not in results[1][1],
            f"rank 1 printed the job's lines: only rank 0 speaks {task('05', 4)}")
    metrics = json.loads((out / "metrics.json").read_text())
    got = (metrics.get("world_size"), metrics.get("global_batch_size"))
    require(got == (2, 4), f"metrics.json has world_size {got[0]} and global_batch_size {got[1]} "
            f"(allowed: 2 and 4 = 2 ranks x --batch-size 2) {task('05', 5)}")


@pytest.mark.slow
def test_torchrun_two_ranks(script, tiny_data_dir, tmp_path):
    result = subprocess.run([PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--master-port", str(free_port()), str(script), "--data-dir",
                             str(tiny_data_dir),
                             "--out", str(tmp_path), "--epochs", "1", "--batch-size", "2", *SMALL],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    require(result.returncode == 0, f"torchrun with 2 ranks exited with {result.returncode}: "
            f"{last_error_line(result.stderr)} {task('05', 1)}")
    require("Training on 2 rank(s) (torchrun, gloo backend, cpu)" in result.stdout,
            f"no 'Training on 2 rank(s) (torchrun, gloo backend, cpu)' line {task('05', 1)}")
    require("global batch 4 = 2 rank(s) x --batch-size 2" in result.stdout,
            f"no 'global batch 4 = 2 rank(s) x --batch-size 2' line {task('05', 5)}")
    epoch_lines = result.stdout.count("epoch 1/1")
    require(epoch_lines == 1, f"torchrun's 2 ranks printed {epoch_lines} 'epoch 1/1' lines "
            f"(allowed: 1, rank 0's) {task('05', 4)}")
    world = json.loads((tmp_path / "metrics.json").read_text()).get("world_size")
    require(world == 2, f"metrics.json has world_size {world} (allowed: 2) {task('05', 5)}")


def test_incomplete_launcher_environment_is_one_line(script_module, tiny_data_dir, tmp_path,
                                                     monkeypatch):
    # in this process (conftest.py's exit_of): the script reads the launcher's variables from
    # os.environ, as a process started with them would; the tiny data and one step, so that a
    # script that does not refuse ends in seconds, and fails here
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "1")
    result = exit_of(script_module, "--out", tmp_path / "o", "--data-dir", tiny_data_dir,
                     "--epochs", "1", "--max-steps", "1", "--bind", "none")
    lines = error_lines(result.stderr)
    require(result.returncode != 0 and "Traceback" not in result.stderr and len(lines) == 1
            and "WORLD_SIZE" in result.stderr,
            f"RANK without WORLD_SIZE exited with {result.returncode} and {len(lines)} error lines "
            "(allowed: non-zero, one `error:` line naming WORLD_SIZE, no traceback): read the "
            f"ranks with launch_environment() {task('05', 1)}")
    require(not (tmp_path / "o").exists(),
            f"RANK without WORLD_SIZE left an output folder: refuse before writing {task('05', 1)}")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_nccl_without_gpu_is_one_line(script_module, tiny_data_dir, tmp_path):
    result = exit_of(script_module, "--data-dir", tiny_data_dir, "--out", tmp_path / "o",
                     "--backend", "nccl")
    rc, err = result.returncode, result.stderr
    lines = error_lines(err)
    require(rc != 0 and "Traceback" not in err and len(lines) == 1 and "nccl" in err
            and "unrecognized arguments" not in err,
            f"--backend nccl without a GPU exited with {rc} and {len(lines)} error lines (allowed: "
            f"non-zero, one `error:` line naming nccl): pick it with pick_backend {task('05', 1)}")
    require(not (tmp_path / "o").exists(),
            f"--backend nccl without a GPU left an output folder {task('05', 1)}")


# --------------------------------------------------------------------------- scaling benchmark
@pytest.mark.slow
def test_scaling_benchmark_writes_json_and_figure(tiny_data_dir, tmp_path):
    """solutions/05_ddp/scaling.py on 1 and 2 CPU ranks (weak scaling): numbers that hang together."""
    out = tmp_path / "scaling"
    result = subprocess.run([PYTHON, str(REPO / "solutions/05_ddp/scaling.py"), "--ranks", "1", "2",
                             "--modes",
                             "weak", "--batch-size", "2", "--max-steps", "6", "--active", "2",
                             "--data-dir",
                             str(tiny_data_dir), "--out", str(out), "--", "--bind", "none",
                             *SMALL_MODEL],
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
    # one rank has no collective; two all-reduce
    assert one["comm_share"] == 0.0 < two["comm_share"] < 1.0
    assert 0.0 <= two["exposed_comm_share"] <= two["comm_share"]
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (out / "weak_2ranks").glob("trace_rank*.json.gz")) == [
        "trace_rank0_steps4-5.json.gz", "trace_rank1_steps4-5.json.gz"]


# --------------------------------------------------------------------------- Slurm
# This step's Slurm job is tested in tests/test_slurm.py with the other job scripts
# (DESIGN.md), where the jobs run side by side:
# test_slurm_05_ddp_two_tasks.
