"""Exercise 06: metrics exact for any number of ranks.

Check your own script:  .venv/bin/python -m pytest -q tests/test_06_exact_metrics.py --script YOUR_SCRIPT

As in tests/test_05_ddp.py, the ranks are separate CPU processes (gloo) and a probe records the
samples each rank reads. Data: the tiny embedded dataset with --n-steps-input 10, 8 training and
4 validation samples: 3 ranks divide neither.
"""
from __future__ import annotations

import json
import re
import shutil
from collections import Counter

import pytest
import torch

from tests.checks import require, task
from tests.conftest import exit_of
from tests.ddp_helpers import (N_TRAIN, N_VALID, SMALL, assert_ok, error_lines, launch,
                               in_process, max_relative_difference, one_rank_reference,
                               parameters, probe_env, read_probe)

STEP = "06_exact_metrics"  # the cross-step matrix (tests/conftest.py) supplies `script`


@pytest.fixture(scope="module")
def one_rank_run(script, tiny_data_dir, finished_run):
    """A checkpoint from one rank, --batch-size 4, one step (what --eval-only evaluates)."""
    return one_rank_reference(finished_run, script, tiny_data_dir)


@pytest.mark.slow
def test_each_sample_counts_once_and_the_left_out_are_named(script, tiny_data_dir, tmp_path):
    """3 ranks, 8 samples: 2 per epoch are left out (and named), the other 6 are read once each;
    each epoch every validation sample once over the ranks (no padding duplicates)."""
    logs, out = tmp_path / "probe", tmp_path / "run"
    results = launch(script, 3, "--data-dir", tiny_data_dir, "--out", out, "--epochs", "2",
                     "--batch-size", "2",
                     *SMALL, env=probe_env(logs))
    assert_ok(results, f"3 ranks must train 8 samples {task('06', 2)}")
    seen = read_probe(logs)
    named = [sorted(map(int, re.findall(r"\d+", m))) for m in
             re.findall(r"epoch \d+: training samples \[([\d, ]*)\] left out", results[0][1])]
    require(len(named) == 2 and all(len(n) == N_TRAIN % 3 for n in named),
            f"rank 0 printed {len(named)} lines 'epoch N: training samples [i, j] left out' in 2 "
            f"epochs of 8 samples on 3 ranks (allowed: 2, naming 2 samples each): use drop_last "
            f"and samples_left_out {task('06', 2)}")
    per_epoch = N_TRAIN // 3
    for epoch in range(2):
        used = Counter()
        for rank in range(3):
            mine = seen[rank]["train"][epoch * per_epoch:(epoch + 1) * per_epoch]
            require(len(seen[rank]["train"]) == 2 * per_epoch,
                    f"rank {rank} read {len(seen[rank]['train'])} training samples in 2 epochs "
                    f"(allowed: {2 * per_epoch}): padding repeats samples; use drop_last=True "
                    f"{task('06', 2)}")
            used.update(mine)
        require(max(used.values()) == 1, f"epoch {epoch + 1}: a sample was read "
                f"{max(used.values())} times (allowed: once): use drop_last=True {task('06', 2)}")
        require(sorted([*used, *named[epoch]]) == list(range(N_TRAIN)),
                f"epoch {epoch + 1}: the samples named left out are not the ones no rank read "
                f"{task('06', 2)}")
    valid = Counter(i for rank in range(3) for i in seen[rank]["valid"])
    require(valid == Counter({i: 2 for i in range(N_VALID)}),
            f"over 2 epochs the 3 ranks read {sum(valid.values())} validation samples (allowed: "
            f"each of the {N_VALID} once an epoch, {2 * N_VALID}): give each rank its share of the "
            f"validation split {task('06', 1)}")
    metrics = json.loads((out / "metrics.json").read_text())
    got = (metrics.get("world_size"), metrics.get("global_batch_size"))
    require(got == (3, 6), f"metrics.json has world_size {got[0]} and global_batch_size {got[1]} "
            f"(allowed: 3 and 6) {task('05', 5)}")
    per_rank = metrics.get("samples_per_second_per_rank")
    require(isinstance(per_rank, list) and len(per_rank) == 3,
            "metrics.json needs samples_per_second_per_rank, a list of one number per rank (3): "
            f"make each epoch's row the job's with over_ranks {task('06', 2)}")


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
        results = launch(script, world, "--data-dir", tiny_data_dir, "--out", out, "--eval-only",
                         "--batch-size",
                         "3", *SMALL, env=probe_env(logs))
        assert_ok(results, f"--eval-only on {max(world, 1)} rank(s) must evaluate OUT/checkpoint.pt "
                  f"{task('06', 3)}")
        seen = read_probe(logs)
        require(not any(seen[r]["train"] for r in seen),
                f"--eval-only read training samples: it must not train {task('06', 3)}")
        training = [line for line in results[0][1].splitlines()
                    if line.startswith(("Training on", "global batch", "epoch "))]
        require(not training, f"--eval-only on {max(world, 1)} rank(s) printed {training[:1]}: it "
                f"trains nothing, so it prints no training lines {task('06', 3)}")
        read = Counter(i for r in seen for i in seen[r]["valid"])
        require(read == Counter(range(N_VALID)), f"--eval-only on {max(world, 1)} rank(s) read "
                f"{sum(read.values())} validation samples, {len(read)} different (allowed: each of "
                f"the {N_VALID} once): no padding, a share per rank {task('06', 1)}")
        require((out / "eval.json").is_file(), f"--eval-only wrote no eval.json {task('06', 3)}")
        evaluation = json.loads((out / "eval.json").read_text())
        require(evaluation.get("world_size") == max(world, 1),
                f"eval.json has world_size {evaluation.get('world_size')} (allowed: "
                f"{max(world, 1)}) {task('06', 3)}")
        require((out / "checkpoint.pt").read_bytes() == (one_rank_run / "checkpoint.pt").read_bytes(),
                f"--eval-only changed checkpoint.pt: it must only read it {task('06', 3)}")
        values[world] = [evaluation["valid_loss"], *evaluation["rollout_vrmse"],
                         *evaluation["persistence_vrmse"]]
    reference = torch.tensor(values[0], dtype=torch.float64)
    for world in (2, 3):
        got = torch.tensor(values[world], dtype=torch.float64)
        worst = ((got - reference).abs() / reference.abs()).max().item()
        require(worst <= 1e-6, f"--eval-only on {world} ranks is {worst:.1e} (relative) from 1 "
                "rank (allowed: 1e-6): add up sums and counts over the ranks, then divide "
                f"{task('06', 1)}")


@pytest.mark.slow
def test_resume_with_another_world_size(script, script_module, tiny_data_dir, tmp_path):
    """Epoch 1 on 2 ranks x 2, epoch 2 resumed on 1 rank x 4 == both epochs on 1 rank x 4 (8 samples:
    the same global batches either way). The runs on one rank are plain runs in this process."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ("--data-dir", tiny_data_dir, *SMALL)
    assert_ok(in_process(exit_of(script_module, *common, "--out", straight, "--epochs", "2",
                                 "--batch-size", "4")),
              f"2 epochs on one process must train {task('06', 4)}")
    assert_ok(launch(script, 2, *common, "--out", split, "--epochs", "1", "--batch-size", "2"),
              f"1 epoch on 2 ranks must train {task('06', 4)}")
    resumed = in_process(exit_of(script_module, *common, "--out", split, "--epochs", "2",
                                 "--batch-size", "4", "--resume"))
    assert_ok(resumed, f"--resume on 1 rank of a 2-rank checkpoint must train on {task('06', 4)}")
    require("trained with 2 rank(s), now 1" in resumed[0][1],
            "no 'trained with 2 rank(s), now 1' line on resuming: store world_size in the "
            f"checkpoint {task('06', 4)}")
    state = torch.load(split / "checkpoint.pt", weights_only=True)
    worlds = [h.get("world_size") for h in state["history"]]
    require(None not in worlds, f"the checkpoint's history rows have no world_size: make each "
            f"epoch's row the job's with over_ranks, which adds it {task('06', 2)}")
    require(worlds == [2, 1] and state["epoch"] == 2,
            f"the resumed checkpoint is at epoch {state['epoch']}, its history's world sizes "
            f"{worlds} (allowed: epoch 2, world sizes 2 then 1) {task('06', 4)}")
    worst = max_relative_difference(parameters(split / "checkpoint.pt"),
                                    parameters(straight / "checkpoint.pt"))
    require(worst <= 1e-5, f"resumed on 1 rank ends {worst:.1e} (relative) from a straight run "
            f"(allowed: 1e-5) {task('06', 4)}")


@pytest.mark.slow
def test_eval_only_without_checkpoint_is_one_line(script_module, tiny_data_dir, tmp_path):
    result = exit_of(script_module, "--data-dir", tiny_data_dir, "--out", tmp_path / "o",
                     "--eval-only", *SMALL)
    rc, err = result.returncode, result.stderr
    lines = error_lines(err)
    require(rc != 0 and "Traceback" not in err and len(lines) == 1 and "checkpoint" in err,
            f"--eval-only without OUT/checkpoint.pt exited with {rc} and {len(lines)} error lines "
            f"(allowed: non-zero, one `error:` line naming the checkpoint) {task('06', 3)}")
    require(not (tmp_path / "o").exists(),
            f"--eval-only without a checkpoint left an output folder {task('06', 3)}")


@pytest.mark.slow
def test_eval_only_with_other_settings_is_one_line(script_module, tiny_data_dir, one_rank_run,
                                                   tmp_path):
    """A checkpoint of another width: --eval-only has no --resume to drop; the line names what to
    give instead."""
    out = tmp_path / "o"
    out.mkdir()
    shutil.copy(one_rank_run / "checkpoint.pt", out / "checkpoint.pt")
    result = exit_of(script_module, "--data-dir", tiny_data_dir, "--out", out, "--eval-only",
                     *SMALL, "--width", "16")  # SMALL's is 8
    rc, err = result.returncode, result.stderr
    lines = error_lines(err)
    require(rc != 0 and "Traceback" not in err and len(lines) == 1,
            f"--eval-only of a checkpoint of another --width exited with {rc} and {len(lines)} "
            f"error lines (allowed: non-zero, one `error:` line) {task('06', 3)}")
    require("--width" in lines[0] and "--resume" not in lines[0],
            f"--eval-only of a checkpoint of another --width said {lines[0]!r}: name the settings "
            f"to give (--width, --modes), not --resume, which --eval-only does not take "
            f"{task('06', 3)}")


@pytest.mark.slow
def test_split_smaller_than_world_is_one_line(script, tiny_data_dir, tmp_path):
    # --n-steps-input 11: one window per trajectory, 2 validation samples for 3 ranks
    results = launch(script, 3, "--data-dir", tiny_data_dir, "--out", tmp_path / "o",
                     "--n-steps-input", "11",
                     "--bind", "none", timeout=180)
    for rank, (rc, _, err) in enumerate(results):
        require(rc != 0 and "Traceback" not in err, f"3 ranks for 2 validation samples: rank "
                f"{rank} exited with {rc}{', a traceback' if 'Traceback' in err else ''} (allowed: "
                f"non-zero, no traceback) {task('06', 1)}")
    lines = error_lines(results[0][2])
    require(len(lines) == 1 and "valid split" in lines[0] and "fewer than the 3 ranks" in lines[0],
            f"3 ranks for 2 validation samples: rank 0 printed {len(lines)} error lines (allowed: 1, "
            f"'... valid split ... fewer than the 3 ranks ...') {task('06', 1)}")
    require(not (tmp_path / "o").exists(), f"3 ranks for 2 samples left an output folder "
            f"{task('06', 1)}")


# This step's Slurm job is tested in tests/test_slurm.py with the other job scripts
# (DESIGN.md), where the jobs run side by side:
# test_slurm_06_two_tasks_then_one_task_evaluates.
