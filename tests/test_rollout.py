"""Rollout indexing and metrics against independent numpy references."""
import numpy as np
import pytest
import torch

from wellfno.data import rollout_dataset, to_channels
from torch.utils._python_dispatch import TorchDispatchMode
import torch.utils._pytree as pytree

from wellfno.domain import Slab, slab_step_vrmse
from wellfno.rollout import (PAPER_WINDOWS, evaluate_rollouts, rollout, step_curve, step_vrmse,
                             the_well_windows, trajectory_errors, vrmse, well_report, well_vrmse,
                             window_vrmse)


def numpy_vrmse(pred, true, eps=1e-7):
    pred, true = np.asarray(pred, np.float64), np.asarray(true, np.float64)
    mse = ((pred - true) ** 2).mean(axis=(-3, -2))
    return np.sqrt(mse / (true.var(axis=(-3, -2)) + eps))


class Oracle(torch.nn.Module):
    """Returns the true next frame, found by matching the whole input window in the trajectory.

    If the rollout built its window wrongly (order, shift) the match fails loudly.
    """

    def __init__(self, trajectory, n_steps_input):
        super().__init__()
        self.trajectory = trajectory  # (T, H, W, F)
        self.n = n_steps_input

    def forward(self, x):  # (1, T*F, H, W)
        for t in range(self.n, self.trajectory.shape[0]):
            window = to_channels(self.trajectory[t - self.n:t].unsqueeze(0))
            if torch.equal(window, x):
                return self.trajectory[t].permute(2, 0, 1).unsqueeze(0)
        raise AssertionError("the rollout fed a window that is not a stretch of the trajectory")


def test_vrmse_matches_numpy():
    rng = np.random.default_rng(0)
    true, pred = rng.normal(size=(3, 8, 8, 2)), rng.normal(size=(3, 8, 8, 2))
    np.testing.assert_allclose(vrmse(torch.tensor(pred), torch.tensor(true)).numpy(), numpy_vrmse(pred, true),
                               rtol=1e-12)


@pytest.mark.parametrize("n_steps_input", [1, 3])
def test_oracle_scores_zero_and_persistence_matches_numpy(tiny_dataset_dir, n_steps_input):
    ds = rollout_dataset(tiny_dataset_dir, n_steps_input)
    sample = ds[0]
    trajectory = torch.cat([sample["input_fields"], sample["output_fields"]])
    inputs, true = sample["input_fields"].unsqueeze(0), sample["output_fields"].unsqueeze(0)
    n = true.shape[1]
    pred = rollout(Oracle(trajectory, n_steps_input), inputs, n)
    assert pred.shape == true.shape
    torch.testing.assert_close(pred, true, rtol=0, atol=0)
    # persistence at step k compares the last input frame with true frame k
    traj = trajectory.numpy()
    expected = [numpy_vrmse(traj[n_steps_input - 1], traj[n_steps_input - 1 + k]).mean() for k in range(1, n + 1)]
    got = step_vrmse(inputs, true, pred)[1].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_evaluate_rollouts_with_an_oracle_is_zero(tiny_dataset_dir):
    ds = rollout_dataset(tiny_dataset_dir, 1)

    class LookupOracle(torch.nn.Module):
        def forward(self, x):
            for s in ds:
                traj = torch.cat([s["input_fields"], s["output_fields"]])
                for t in range(1, traj.shape[0]):
                    if torch.equal(to_channels(traj[t - 1:t].unsqueeze(0)), x):
                        return traj[t].permute(2, 0, 1).unsqueeze(0)
            raise AssertionError("unknown window")

    model_curve, persistence_curve, (true, pred) = evaluate_rollouts(LookupOracle(), ds, "cpu")
    assert len(model_curve) == 11 and max(model_curve) == 0.0
    assert min(persistence_curve) > 0.0
    torch.testing.assert_close(true, pred)


def numpy_step_vrmse(inputs, true, pred, eps=1e-7):
    """The model's and persistence's VRMSE per step, mean over fields, in float64 numpy."""
    inputs, true, pred = (np.asarray(a, np.float64)[0] for a in (inputs, true, pred))
    space = tuple(range(1, true.ndim - 1))
    var = true.var(axis=space) + eps
    model_err = np.sqrt(((pred - true) ** 2).mean(axis=space) / var).mean(-1)
    persist_err = np.sqrt(((inputs[-1] - true) ** 2).mean(axis=space) / var).mean(-1)
    return model_err, persist_err


def random_trajectory(shape, seed=0):
    """(inputs, true, pred) of one trajectory: 2 input frames, T steps of `shape` = (T, *space, F)."""
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randn(1, 2, *shape[1:], generator=g)
    true = torch.randn(1, *shape, generator=g) * torch.linspace(0.5, 2.0, shape[-1])
    return inputs, true, true + 0.3 * torch.randn(1, *shape, generator=g)


@pytest.mark.parametrize("shape", [(6, 8, 8, 2), (4, 4, 6, 5, 3)])
def test_step_vrmse_matches_numpy(shape):
    inputs, true, pred = random_trajectory(shape)
    got = step_vrmse(inputs, true, pred)
    for g, want in zip(got, numpy_step_vrmse(inputs, true, pred)):
        assert g.shape == (shape[0],)
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-5)


class LargestNewTensor(TorchDispatchMode):
    """The most elements of any tensor an op allocates: an output whose storage is none of its
    arguments' storages (a view shares its base's; `_base` does not tell, it is None below
    autograd on torch 2.5)."""

    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = pytree.tree_leaves((args, kwargs))
        storages = {a.untyped_storage().data_ptr() for a in inputs if isinstance(a, torch.Tensor)}
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in storages:
                self.most = max(self.most, t.numel())
        return out


@pytest.mark.parametrize("score", [
    lambda i, t, p: step_vrmse(i, t, p),
    lambda i, t, p: slab_step_vrmse(i, t, p, Slab(0, t.shape[2], t.shape[2])),
], ids=["step_vrmse", "slab_step_vrmse"])
def test_scoring_a_rollout_allocates_at_most_a_frame(score):
    """Issue 48: scoring T steps at once made (pred - true)^2 and a persistence copy of the whole
    trajectory (T frames, in float64 on the slabs); one step at a time needs one frame."""
    inputs, true, pred = random_trajectory((12, 8, 6, 2))
    frame = true[0, 0].numel()
    with LargestNewTensor() as seen:
        score(inputs, true, pred)
    assert seen.most <= frame, f"scoring allocated {seen.most} elements; a frame has {frame}"


@pytest.mark.parametrize("shape", [(5, 8, 8, 2), (3, 6, 4, 5, 1)])
def test_slab_step_vrmse_of_a_whole_frame_is_step_vrmse(shape):
    inputs, true, pred = random_trajectory(shape, seed=3)
    whole = Slab(0, shape[1], shape[1])
    for got, want in zip(slab_step_vrmse(inputs, true, pred, whole), step_vrmse(inputs, true, pred)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


# ---- The Well's evaluation (issue 36): wellfno.rollout.well_vrmse, windows, whole trajectories.

def numpy_well_vrmse(pred, true, n_spatial_dims=2, eps=1e-7):
    """The Well's VRMSE written out in float64 numpy: the sample variance (N - 1) over space."""
    pred, true = np.asarray(pred, np.float64), np.asarray(true, np.float64)
    space = tuple(range(-1 - n_spatial_dims, -1))
    mse = ((pred - true) ** 2).mean(axis=space)
    return np.sqrt(mse / (true.var(axis=space, ddof=1) + eps))


@pytest.mark.parametrize("shape,n_spatial_dims", [((3, 4, 8, 6, 2), 2), ((2, 5, 4, 3, 2), 3)])
def test_well_vrmse_matches_numpy(shape, n_spatial_dims):
    rng = np.random.default_rng(1)
    # a spread far from 1 and a shift: eps and the variance's N - 1 both show
    true = 3.0 + 0.05 * rng.normal(size=shape)
    pred = true + 0.01 * rng.normal(size=shape)
    got = well_vrmse(torch.tensor(pred), torch.tensor(true), n_spatial_dims).numpy()
    assert got.shape == shape[:-1 - n_spatial_dims] + shape[-1:]
    np.testing.assert_allclose(got, numpy_well_vrmse(pred, true, n_spatial_dims), rtol=1e-12)


def test_well_vrmse_is_the_wells_own_metric(tiny_dataset_dir):
    """the_well.benchmark.metrics.VRMSE on the same tensors, with the dataset's own metadata."""
    from the_well.benchmark.metrics import VRMSE

    meta = rollout_dataset(tiny_dataset_dir, 1).metadata
    generator = torch.Generator().manual_seed(2)
    true = torch.randn(2, 5, *meta.spatial_resolution, meta.n_fields, generator=generator)
    pred = true + 0.1 * torch.randn(true.shape, generator=generator)
    for dtype in (torch.float32, torch.float64):
        theirs = VRMSE()(pred.to(dtype), true.to(dtype), meta)
        torch.testing.assert_close(well_vrmse(pred.to(dtype), true.to(dtype), meta.n_spatial_dims),
                                   theirs, rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=0)


def the_wells_split_up_losses(monkeypatch, loss_values, fields):
    """the_well's own Trainer.split_up_losses on (steps, fields) losses: its log keys and values.

    the_well/benchmark/trainer/training.py imports wandb, which the course does not install: a
    stand-in module lets the file import (split_up_losses itself never calls wandb)."""
    import importlib
    import sys
    import types
    from functools import partial

    monkeypatch.setitem(sys.modules, "wandb", types.ModuleType("wandb"))
    trainer = importlib.import_module("the_well.benchmark.trainer.training").Trainer
    # its defaults: num_time_intervals 5 (the_well/benchmark/configs/trainer/defaults.yaml)
    split = partial(trainer.temporal_split_losses, None)  # uses nothing of self
    itself = types.SimpleNamespace(num_time_intervals=5, temporal_split_losses=split)
    losses, _ = trainer.split_up_losses(itself, loss_values, "VRMSE", "ds", fields)
    return {key: value.item() for key, value in losses.items()}


@pytest.mark.parametrize("n_steps", [2, 5, 11, 30, 39, 100])
def test_windows_are_the_wells_trainers(monkeypatch, n_steps):
    fields = ["A", "B"]
    generator = torch.Generator().manual_seed(n_steps)
    curve = torch.rand(n_steps, 2, dtype=torch.float64, generator=generator)
    theirs = the_wells_split_up_losses(monkeypatch, curve, fields)
    rows, left_out = window_vrmse(curve, the_well_windows(n_steps), fields)
    assert left_out == []
    ours = {f"ds/full_VRMSE_{row['window']}": row["vrmse"] for row in rows}
    ours |= {f"ds/{field}_VRMSE_{row['window']}": row["per_field"][field]
             for row in rows for field in fields}
    # the_well logs an empty window (equal boundaries) as nan; wellfno leaves it out
    windows = {key: value for key, value in theirs.items() if "T=all" not in key and value == value}
    assert ours.keys() == windows.keys()
    for key, value in windows.items():
        assert ours[key] == pytest.approx(value, rel=1e-12), key
    assert theirs["ds/full_VRMSE_T=all"] == pytest.approx(curve.mean().item(), rel=1e-12)


def test_paper_windows_are_the_trainers_at_30_steps():
    """The paper's 1, 2, 3:5, 6:12, 13:30 (from 1, both ends included) are the_well's rule at 30."""
    assert [(first, last) for _, first, last in PAPER_WINDOWS] == \
        [(first, last) for _, first, last in the_well_windows(30)]
    assert [label for label, _, _ in PAPER_WINDOWS] == ["1", "2", "3:5", "6:12", "13:30"]


def test_windows_of_a_short_rollout_against_a_direct_computation():
    """11 steps: 1, 2, 3:5 whole, 6:12 over steps 6-11 only (and said), 13:30 left out."""
    rng = np.random.default_rng(3)
    curve = rng.random((11, 2))
    rows, left_out = window_vrmse(torch.tensor(curve), PAPER_WINDOWS, ["A", "B"])
    assert left_out == ["13:30"]
    assert [(r["window"], r["first"], r["last"], r["complete"]) for r in rows] == [
        ("1", 1, 1, True), ("2", 2, 2, True), ("3:5", 3, 5, True), ("6:12", 6, 11, False)]
    for row, (first, last) in zip(rows, [(1, 1), (2, 2), (3, 5), (6, 11)]):
        steps = [curve[k - 1] for k in range(first, last + 1)]  # step k is row k - 1
        per_field = [sum(s[j] for s in steps) / len(steps) for j in range(2)]
        assert row["per_field"] == pytest.approx(dict(A=per_field[0], B=per_field[1]), rel=1e-12)
        assert row["vrmse"] == pytest.approx(sum(per_field) / 2, rel=1e-12)


def test_step_curve_counts_the_trajectories_that_reach_each_step():
    rng = np.random.default_rng(4)
    short, long = rng.random((3, 2)), rng.random((5, 2))
    curve, counts = step_curve([torch.tensor(short), torch.tensor(long)])
    assert counts.tolist() == [2, 2, 2, 1, 1]
    np.testing.assert_allclose(curve.numpy()[:3], (short + long[:3]) / 2, rtol=1e-12)
    np.testing.assert_allclose(curve.numpy()[3:], long[3:], rtol=1e-12)


def test_trajectory_errors_and_report_with_an_oracle(tiny_dataset_dir):
    """An oracle scores 0 everywhere; persistence scores numpy's VRMSE of the last input frame
    against each true frame; the report's whole-trajectory means are the curves' means."""
    n_steps_input = 2
    ds = rollout_dataset(tiny_dataset_dir, n_steps_input)
    trajectories = [torch.cat([s["input_fields"], s["output_fields"]]) for s in ds]

    class LookupOracle(torch.nn.Module):
        def forward(self, x):
            for traj in trajectories:
                for t in range(n_steps_input, traj.shape[0]):
                    if torch.equal(to_channels(traj[t - n_steps_input:t].unsqueeze(0)), x):
                        return traj[t].permute(2, 0, 1).unsqueeze(0)
            raise AssertionError("unknown window")

    model_errors, persistence_errors = trajectory_errors(LookupOracle(), ds, "cpu")
    assert len(model_errors) == len(ds) >= 2
    for traj, model_error, persistence_error in zip(trajectories, model_errors,
                                                    persistence_errors):
        frames = traj.numpy()
        assert model_error.shape == (frames.shape[0] - n_steps_input, frames.shape[-1])
        assert model_error.abs().max().item() == 0.0
        later = frames[n_steps_input:]  # true frame k is row k - 1
        expected = numpy_well_vrmse(np.broadcast_to(frames[n_steps_input - 1], later.shape), later)
        np.testing.assert_allclose(persistence_error.numpy(), expected, rtol=1e-6)
    report = well_report(model_errors, persistence_errors, ["A", "B"])
    persistence = np.mean([e.numpy() for e in persistence_errors], axis=0)  # (steps, fields)
    assert report["model"]["whole_trajectory"] == 0.0
    assert report["persistence"]["whole_trajectory"] == pytest.approx(persistence.mean(), rel=1e-12)
    assert report["persistence"]["per_step"] == pytest.approx(persistence.mean(1).tolist(),
                                                              rel=1e-12)
    assert report["persistence"]["whole_trajectory_per_field"]["B"] == pytest.approx(
        persistence[:, 1].mean(), rel=1e-12)


def peak_bytes(fn, path) -> int:
    """The most memory torch's CPU allocator held while `fn` ran, above what it held before: the
    profiler's memory records ("[memory]" events: the bytes of each allocation or free and the
    allocator's "Total Allocated" after it)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    prof.export_chrome_trace(str(path))
    import json

    records = [e["args"] for e in json.loads(path.read_text())["traceEvents"]
               if e.get("name") == "[memory]"]
    before = records[0]["Total Allocated"] - records[0]["Bytes"]
    return max(r["Total Allocated"] for r in records) - before


def test_trajectory_errors_hold_no_float64_trajectory(tmp_path):
    """wellfno.memory.rollout_steps lets a trajectory's float32 true and predicted frames fill half
    the free memory; scoring them must add a few frames, not float64 copies of whole trajectories
    (5x as much: the device ran out of memory). Measured against the rollout alone, which the
    scoring cannot avoid, on a 64-step trajectory."""
    torch.manual_seed(0)
    steps, grid, fields = 64, (32, 32), 2
    sample = dict(input_fields=torch.randn(1, *grid, fields),
                  output_fields=torch.randn(steps, *grid, fields))
    model = torch.nn.Conv2d(fields, fields, 1)  # (B, F, *spatial): one input frame
    frame = 4 * fields * np.prod(grid)  # bytes of a float32 frame
    inputs, true = sample["input_fields"][None], sample["output_fields"][None]
    alone = peak_bytes(lambda: rollout(model, inputs, steps), tmp_path / "rollout.json")
    scored = peak_bytes(lambda: trajectory_errors(model, [sample], "cpu"), tmp_path / "errors.json")
    assert alone >= steps * frame  # the predictions themselves: the measurement sees them
    assert scored - alone <= 16 * frame, f"{(scored - alone) / frame:.0f} frames more"
    # the same numbers as whole float64 trajectories (the reference below: numpy's float64)
    (model_error,), (persistence_error,) = trajectory_errors(model, [sample], "cpu")
    pred = rollout(model, inputs, steps)[0].double().numpy()
    np.testing.assert_allclose(model_error.numpy(), numpy_well_vrmse(pred, true[0].numpy()),
                               rtol=1e-12)
    last = np.broadcast_to(inputs[0, -1].double().numpy(), true[0].shape)
    np.testing.assert_allclose(persistence_error.numpy(), numpy_well_vrmse(last, true[0].numpy()),
                               rtol=1e-12)
