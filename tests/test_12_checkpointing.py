"""Exercise 12 check-your-work: activation checkpointing changes memory, not the numbers.

    .venv/bin/python -m pytest -q tests/test_12_checkpointing.py --script YOUR_SCRIPT

The first part checks wellfno.checkpointing on a model (gradients bitwise those without it; the
blocks really run twice); the second runs the script on the tiny generated data with and without
--checkpoint-blocks. Peak memory with and without is measured by benchmarks/checkpointing.py and
checked against wellfno.memory's estimate in tests/test_memory.py (not a timed test here).
"""

import copy
import json

import pytest
import torch

from tests.checks import require, task
from wellfno.checkpointing import checkpoint_blocks
from wellfno.model import NextFrameFNO

STEP = "12_checkpointing"  # the cross-step matrix (tests/conftest.py) supplies `script`
RUN = [
    "--epochs",
    "1",
    "--batch-size",
    "4",
    "--bind",
    "none",
    "--max-steps",
    "2",
    "--log-every",
    "1",
]


def small_model(grid=(12, 10)):
    torch.manual_seed(0)
    stats = {k: torch.rand(3) + 0.5 for k in ("mean", "std", "mean_delta", "std_delta")}
    return NextFrameFNO(
        3, 2, stats, n_spatial_dims=len(grid), resolution=grid, modes=6, width=8, layers=3
    )


@pytest.mark.parametrize("grid", [(12, 10), (6, 8, 4)])
def test_checkpointed_gradients_equal_plain_ones(grid):
    plain = small_model(grid)
    checkpointed = checkpoint_blocks_copy(plain)
    assert plain.state_dict().keys() == checkpointed.state_dict().keys()
    x, y = torch.randn(2, plain.in_channels, *grid), torch.randn(2, 3, *grid)
    grads = []
    for model in (plain, checkpointed):
        loss = model.loss(model(x), y)
        loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        assert torch.equal(grads[1][name], g), name  # the recomputation repeats the same operations


def checkpoint_blocks_copy(model):
    twin = copy.deepcopy(model)
    checkpoint_blocks(twin.fno)
    return twin


def test_blocks_run_again_in_the_backward_and_keep_less():
    """Each block's forward runs twice (forward, then recomputed in the backward), and autograd
    keeps fewer tensors between the forward and the backward (counted with saved-tensor hooks)."""
    plain = small_model()
    checkpointed = checkpoint_blocks_copy(plain)
    x, y = torch.randn(2, plain.in_channels, 12, 10), torch.randn(2, 3, 12, 10)
    calls, saved = {}, {}
    for name, model in (("plain", plain), ("checkpointed", checkpointed)):
        calls[name] = 0

        def count(module, args, name=name):
            calls[name] += 1

        hook = model.fno.fno_blocks.convs[0].register_forward_pre_hook(count)
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: kept.append(t.numel()) or t, lambda t: t
        ):
            loss = model.loss(model(x), y)
        saved[name] = sum(kept)
        loss.backward()
        hook.remove()
    assert calls == {"plain": 1, "checkpointed": 2}
    assert saved["checkpointed"] < 0.6 * saved["plain"], saved


def train(finished_run, script, data_dir, *extra):
    """(stdout, metrics.json, output folder) of one in-process run (conftest.py's finished_run)."""
    out, stdout = finished_run(script, data_dir, *RUN, *extra,
                               fix=f"add --checkpoint-blocks {task('10', 1)}")
    return stdout, json.loads((out / "metrics.json").read_text()), out


@pytest.mark.slow
def test_checkpointed_run_trains_the_same_model(script, tiny_data_dir, finished_run):
    _, plain, plain_out = train(finished_run, script, tiny_data_dir)
    stdout, checkpointed, ckpt_out = train(finished_run, script, tiny_data_dir,
                                           "--checkpoint-blocks")
    require("blocks checkpointed" in stdout, "the memory line of a --checkpoint-blocks run "
            "does not say 'blocks checkpointed': pass checkpointed=args.checkpoint_blocks to "
            f"memory.check_step_fits {task('10', 1)}")
    losses = [run["history"][0].get("loss_log") for run in (plain, checkpointed)]
    require(losses[0] == losses[1], "--checkpoint-blocks changed the per-step losses (allowed: "
            f"bitwise the same): checkpoint the blocks' original forward {task('10', 1)}")
    a = torch.load(plain_out / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(ckpt_out / "checkpoint.pt", weights_only=True)["model"]
    differ = sum(k not in b or not torch.equal(a[k], b[k]) for k in a) + len(b.keys() - a.keys())
    require(differ == 0, f"{differ} of {len(a)} parameter tensors differ with --checkpoint-blocks "
            f"(allowed: none; the same state_dict keys) {task('10', 1)}")
    flag = checkpointed["config"].get("checkpoint_blocks")
    require(flag is True, f"metrics.json's config has checkpoint_blocks {flag} (allowed: true) "
            f"{task('10', 1)}")
