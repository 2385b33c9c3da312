"""Step 14's --pushforward draws no read-back inside the training step (issue 40, part 3, item 7).

It drew each step's N with int(torch.randint(..., generator=cpu)): an `aten::_local_scalar_dense`
per step that profiling/syncs.py counted as a host sync (on a CPU trace it cannot tell a CPU
tensor's read-back from a device's). wellfno.unrolled now draws an epoch's N up front, in
set_epoch, from the same (seed, epoch)-seeded generator: the same N, in the same order, as one
draw per step gave (the reference below draws them one at a time), so exercise 14's numbers stay.
"""
from __future__ import annotations

import gzip
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from profiling import syncs, traces
from tests.conftest import REPO
from wellfno.unrolled import RolloutLoss

K, ACTIVE = 4, 3


def profiled_pushforward_steps(tmp_path, epoch_steps):
    """5 steps of --pushforward training of a 1x1 convolution (2 frame channels and 1 constant
    field), the last 3 recorded; nothing read back. `epoch_steps`: what set_epoch is told."""
    torch.manual_seed(0)
    model = torch.nn.Conv2d(3, 2, 1)
    x, targets = torch.randn(2, 3, 8, 8), torch.randn(2, K, 2, 8, 8)
    loss_fn = RolloutLoss(lambda pred, y: (pred - y).pow(2).mean(), frame_channels=2, steps=K,
                          pushforward=True, seed=7)
    loss_fn.set_epoch(1, epoch_steps)
    path = tmp_path / "pushforward.json.gz"
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=lambda p: traces.save(p, path),
                 schedule=schedule(wait=1, warmup=1, active=ACTIVE, repeat=1)) as prof:
        for _ in range(5):
            with record_function("forward"):
                loss = loss_fn(model, x, targets)
            with record_function("backward"):
                loss.backward()
            prof.step()
    return [row["syncs"] for row in syncs.host_syncs_per_step(traces.load(path))]


@pytest.mark.parametrize("epoch_steps", [5, 2])  # 2: the draws run out mid-epoch and refill
def test_pushforward_steps_read_nothing_back(tmp_path, epoch_steps):
    assert profiled_pushforward_steps(tmp_path, epoch_steps) == [0] * ACTIVE


def test_the_drawn_n_are_one_draw_per_step():
    """The N of an epoch drawn up front are those int(torch.randint(K, (), generator)) gave step
    after step from the epoch's seed (solution 14 before: its runs train as they did), whatever
    the number of steps drawn ahead; a resumed epoch draws the straight run's."""
    for epoch, ahead in ((1, 3), (2, 50), (3, 1024)):
        loss_fn = RolloutLoss(None, frame_channels=2, steps=K, pushforward=True, seed=11)
        loss_fn.set_epoch(epoch, ahead)
        drawn = [loss_fn.next_rolled_out() for _ in range(200)]
        reference = torch.Generator().manual_seed((11 + epoch * 0x9E3779B97F4A7C15) % 2**64)
        assert drawn == [int(torch.randint(K, (), generator=reference)) for _ in range(200)]
        assert set(drawn) == set(range(K))


@pytest.mark.slow
def test_solution_14_pushforward_profiles_without_a_host_sync(tiny_data_dir, finished_run):
    """The whole script: --pushforward's profiled steps 5-9 of 10 with the loss read back every
    1000 steps: 0 host syncs each (exercise 08's count, profiling/syncs.py)."""
    out, _ = finished_run(REPO / "solutions" / "14_long_rollouts" / "fno.py", tiny_data_dir,
                          "--epochs", "1", "--batch-size", "1", "--profile", "--max-steps", "10",
                          "--width", "8", "--modes", "4", "--bind", "none", "--log-every", "1000",
                          "--rollout-steps", "2", "--pushforward", "--input-noise", "0")
    (trace_file,) = out.glob("trace_rank0_*.json.gz")
    trace = json.loads(gzip.decompress(trace_file.read_bytes()))
    assert [row["syncs"] for row in syncs.host_syncs_per_step(trace)] == [0] * 5
