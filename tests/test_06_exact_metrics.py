"""Exercise 06: metrics exact for any number of ranks, and failures that end every rank.

Check your own script:  .venv/bin/python -m pytest -q tests/test_06_exact_metrics.py --script YOUR_SCRIPT

As in tests/test_05_ddp.py, the ranks are separate CPU processes (gloo) and a probe records the
samples each rank reads. Data: the tiny embedded dataset with --n-steps-input 10, 8 training and
4 validation samples: 3 ranks divide neither.
"""
from __future__ import annotations

import json
import re
import shutil
import time
from collections import Counter

import pytest
import torch

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
    assert_ok(results)
    seen = read_probe(logs)
    named = [sorted(map(int, re.findall(r"\d+", m))) for m in
             re.findall(r"epoch \d+: training samples \[([\d, ]*)\] left out", results[0][1])]
    assert len(named) == 2 and all(len(n) == N_TRAIN % 3 for n in named), (
        f"rank 0 named {len(named)} epochs' left-out samples, expected 2 lines 'epoch N: training "
        "samples "
        f"[i, j] left out' (task 2: drop_last and samples_left_out)")
    per_epoch = N_TRAIN // 3
    for epoch in range(2):
        used = Counter()
        for rank in range(3):
            mine = seen[rank]["train"][epoch * per_epoch:(epoch + 1) * per_epoch]
            assert len(seen[rank]["train"]) == 2 * per_epoch, (
                f"rank {rank} read {len(seen[rank]['train'])} training samples in 2 epochs, "
                "expected "
                f"{2 * per_epoch}: padding repeats samples (task 2: drop_last=True)")
            used.update(mine)
        assert max(used.values()) == 1, f"epoch {epoch + 1}: a sample was read twice (task 2: drop_last=True)"
        assert sorted([*used, *named[epoch]]) == list(range(N_TRAIN)), \
            f"epoch {epoch + 1}: the samples named left out are not the ones no rank read (task 2)"
    valid = Counter(i for rank in range(3) for i in seen[rank]["valid"])
    assert valid == Counter({i: 2 for i in range(N_VALID)}), (
        f"over 2 epochs the ranks read validation samples {dict(valid)}, expected each of the "
        f"{N_VALID} twice "
        f"(once an epoch): shard validation over the ranks (task 1)")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 3 and metrics["global_batch_size"] == 6
    assert len(metrics["samples_per_second_per_rank"]) == 3, \
        "metrics.json needs samples_per_second_per_rank, one number per rank (task 2: over_ranks)"


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
        assert_ok(results)
        seen = read_probe(logs)
        assert not any(seen[r]["train"] for r in seen), "--eval-only read training samples: it must not train (task 3)"
        read = Counter(i for r in seen for i in seen[r]["valid"])
        assert read == Counter(range(N_VALID)), \
            f"--eval-only on {max(world, 1)} rank(s) read validation samples {dict(read)}, not each once (task 1)"
        evaluation = json.loads((out / "eval.json").read_text())
        assert evaluation["world_size"] == max(world, 1)
        assert (out / "checkpoint.pt").read_bytes() == (one_rank_run / "checkpoint.pt").read_bytes(), \
            "--eval-only changed checkpoint.pt (task 3)"
        values[world] = [evaluation["valid_loss"], *evaluation["rollout_vrmse"],
                         *evaluation["persistence_vrmse"]]
    reference = torch.tensor(values[0], dtype=torch.float64)
    for world in (2, 3):
        got = torch.tensor(values[world], dtype=torch.float64)
        worst = ((got - reference).abs() / reference.abs()).max().item()
        assert worst <= 1e-6, (f"--eval-only on {world} ranks is {worst:.1e} (relative) from 1 "
                               "rank, allowed "
                               f"1e-6: add up sums and counts over the ranks, then divide (task 1)")


@pytest.mark.slow
def test_resume_with_another_world_size(script, script_module, tiny_data_dir, tmp_path):
    """Epoch 1 on 2 ranks x 2, epoch 2 resumed on 1 rank x 4 == both epochs on 1 rank x 4 (8 samples:
    the same global batches either way). The runs on one rank are plain runs in this process."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ("--data-dir", tiny_data_dir, *SMALL)
    assert_ok(in_process(exit_of(script_module, *common, "--out", straight, "--epochs", "2",
                                 "--batch-size", "4")))
    assert_ok(launch(script, 2, *common, "--out", split, "--epochs", "1", "--batch-size", "2"))
    resumed = in_process(exit_of(script_module, *common, "--out", split, "--epochs", "2",
                                 "--batch-size", "4", "--resume"))
    assert_ok(resumed)
    assert "trained with 2 rank(s), now 1" in resumed[0][1], \
        "no 'trained with 2 rank(s), now 1' line on resuming (task 4: world_size in the checkpoint)"
    state = torch.load(split / "checkpoint.pt", weights_only=True)
    assert [h["world_size"] for h in state["history"]] == [2, 1] and state["epoch"] == 2
    worst = max_relative_difference(parameters(split / "checkpoint.pt"),
                                    parameters(straight / "checkpoint.pt"))
    assert worst <= 1e-5, f"resumed on 1 rank ends {worst:.1e} from a straight run, allowed 1e-5 (task 4)"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["raise", "die"])
def test_a_failing_rank_ends_every_rank_within_seconds(script, tiny_data_dir, tmp_path, how):
    """Rank 1 fails at its 2nd training sample; with --timeout 600 rank 0 must still end within seconds."""
    out = tmp_path / "run"
    started = time.monotonic()
    results = launch(script, 2, "--data-dir", tiny_data_dir, "--out", out, "--epochs", "3",
                     "--batch-size", "1",
                     "--timeout", "600", *SMALL, env=probe_env(fail=f"1:2:{how}"), timeout=240)
    elapsed = time.monotonic() - started
    assert elapsed < 120, f"rank 1 failed and the job took {elapsed:.0f} s, allowed 120: add the Watchdog (task 5)"
    assert all(rc != 0 for rc, _, _ in results), [rc for rc, _, _ in results]
    assert not (out / "checkpoint.pt").exists() and not (out / "metrics.json").exists()
    lines = error_lines(results[0][2])
    assert len(lines) == 1, f"rank 0 printed {len(lines)} error lines, expected 1 naming rank 1 (task 5)"
    if how == "raise":
        assert "rank 1" in lines[0] and "injected failure" in lines[0], lines


@pytest.mark.slow
def test_eval_only_without_checkpoint_is_one_line(script_module, tiny_data_dir, tmp_path):
    result = exit_of(script_module, "--data-dir", tiny_data_dir, "--out", tmp_path / "o",
                     "--eval-only", *SMALL)
    rc, err = result.returncode, result.stderr
    assert rc != 0 and "Traceback" not in err and len(error_lines(err)) == 1 and "checkpoint" in err, \
        "--eval-only without OUT/checkpoint.pt must be one error line (task 3)"
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_split_smaller_than_world_is_one_line(script, tiny_data_dir, tmp_path):
    # --n-steps-input 11: one window per trajectory, 2 validation samples for 3 ranks
    results = launch(script, 3, "--data-dir", tiny_data_dir, "--out", tmp_path / "o",
                     "--n-steps-input", "11",
                     "--bind", "none", timeout=180)
    for rc, _, err in results:
        assert rc != 0 and "Traceback" not in err, err[-2000:]
    lines = error_lines(results[0][2])
    assert len(lines) == 1 and "valid split" in lines[0] and "fewer than the 3 ranks" in lines[0], \
        f"3 ranks for 2 validation samples must be one error line (task 5), got {lines}"
    assert not (tmp_path / "o").exists()


# This step's Slurm job is tested in tests/test_slurm.py with the other job scripts
# (DESIGN.md), where the jobs run side by side:
# test_slurm_06_two_tasks_then_one_task_evaluates.
