"""Autoregressive rollout and its metrics.

Given the first `n_steps_input` frames, the model predicts frame t, which joins
the input window to predict frame t+1, and so on. Prediction k is compared with
true frame k, the k-th frame after the input window (tests/test_rollout.py checks
that no off-by-one shifts the two apart).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from wellfno import data, memory, plots
from wellfno.data import model_inputs


def vrmse(pred: torch.Tensor, true: torch.Tensor, n_spatial_dims: int = 2, eps: float = 1e-7) -> torch.Tensor:
    """The Well's VRMSE per field: sqrt(mean((pred-true)^2) / (var(true) + eps)) over space.

    var divides by N (the_well's by N - 1: `well_vrmse`, what wellfno.evaluate reports).

    pred, true: (..., *spatial, F) -> (..., F). 0 is perfect; 1 is as bad as predicting the mean.
    """
    space = tuple(range(-1 - n_spatial_dims, -1))
    mse = ((pred - true) ** 2).mean(dim=space)
    var = true.var(dim=space, unbiased=False)
    return torch.sqrt(mse / (var + eps))


@torch.no_grad()
def rollout(model, inputs: torch.Tensor, n_steps: int, constant_fields: torch.Tensor | None = None) -> torch.Tensor:
    """inputs (B, T, *spatial, F) [and constant fields (B, *spatial, K)] -> predictions (B, n_steps, *spatial, F)."""
    window = inputs
    preds = []
    for _ in range(n_steps):
        nxt = model(model_inputs(window, constant_fields))  # (B, F, *spatial)
        nxt = nxt.movedim(1, -1).unsqueeze(1)  # (B, 1, *spatial, F)
        preds.append(nxt)
        window = torch.cat([window[:, 1:], nxt], dim=1)  # drop the oldest frame, append the prediction
    return torch.cat(preds, dim=1)


def step_errors(metric, inputs: torch.Tensor, true: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """`metric(pred, true)` of each step's frames of a trajectory (B, T, *spatial, F), for the model
    and for persistence (the last input frame, the baseline to beat): (2, T, ...).

    One step at a time: scoring a long rollout then needs a few frames more, not copies of the
    whole trajectory (`memory.rollout_steps` counts on it)."""
    last = inputs[:, -1]
    return torch.stack([torch.stack([metric(pred[:, k], true[:, k]), metric(last, true[:, k])])
                        for k in range(true.shape[1])], dim=1)


def step_vrmse(inputs: torch.Tensor, true: torch.Tensor, pred: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean VRMSE over fields at each step (T,) of a trajectory (1, T, *spatial, F), for the model
    and for persistence (`step_errors`)."""
    n_spatial_dims = true.ndim - 3
    errors = step_errors(lambda p, t: vrmse(p, t, n_spatial_dims), inputs, true, pred)
    model_err, persist_err = errors.mean(-1)[:, :, 0]  # (2, T, B, F) -> (2, T), B = 1
    return model_err, persist_err


@torch.no_grad()
def evaluate_rollouts(model, dataset, device, max_steps: int | None = None, max_trajectories: int = 16,
                      rank: int = 0, world_size: int = 1):
    """Mean VRMSE per rollout step (averaged over fields and trajectories) for the model and persistence.

    Returns (model_vrmse, persistence_vrmse, example) where example holds (true, pred)
    of the trajectory that changes most in one step (the most instructive to plot).

    With world_size > 1 (torch.distributed initialised) each rank rolls out its share of the
    trajectories (rank, rank + world_size, ...) and the error sums and counts are all-reduced: every
    trajectory is counted once, whatever the world size (no padding, unlike DistributedSampler), and
    every rank returns the curves of one process. The example is returned on rank 0, None elsewhere.
    """
    model.eval()
    n_trajectories = min(len(dataset), max_trajectories)
    curves, best = [], None  # best: (change in one step, index, true, pred)
    for i in range(rank, n_trajectories, world_size):
        inputs, true, pred = _rollout_trajectory(model, dataset, i, device, max_steps)
        curves.append(step_vrmse(inputs, true, pred))
        change = curves[-1][1][0].item()  # persistence's error after one step: how much the field moves
        if best is None or change > best[0]:
            best = (change, i, true, pred)
    # Curves as long as the shortest trajectory; sums in float64, so that the order of the ranks does not matter.
    steps = torch.tensor([min((len(m) for m, _ in curves), default=2**62)], device=device)
    if world_size > 1:
        dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    sums = torch.zeros(2, int(steps.item()), dtype=torch.float64, device=device)
    for model_err, persist_err in curves:
        sums[0] += model_err[:sums.shape[1]]
        sums[1] += persist_err[:sums.shape[1]]
    # The example: largest change, then lowest index (the first of equals, as in one process).
    mine = torch.tensor([best[0], -best[1]] if best else [-1.0, -n_trajectories], dtype=torch.float64,
                        device=device)
    chosen = mine
    if world_size > 1:
        dist.all_reduce(sums)
        everyone = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(everyone, mine)
        chosen = max(everyone, key=lambda b: tuple(b.tolist()))
    model_curve, persist_curve = (sums / n_trajectories).float()
    example = None
    if rank == 0:
        index = int(-chosen[1].item())
        _, true, pred = best[1:] if best and best[1] == index else _rollout_trajectory(model, dataset, index,
                                                                                       device, max_steps)
        example = (true[0].cpu(), pred[0].cpu())
    return model_curve.tolist(), persist_curve.tolist(), example


def _rollout_trajectory(model, dataset, i: int, device, max_steps: int | None):
    """(inputs, true, pred) of trajectory i, batch of one, on `device`."""
    sample = dataset[i]
    inputs = sample["input_fields"].unsqueeze(0).to(device)
    true = sample["output_fields"].unsqueeze(0).to(device)
    constants = sample.get("constant_fields")
    constants = None if constants is None else constants.unsqueeze(0).to(device)
    true = true[:, :true.shape[1] if max_steps is None else min(max_steps, true.shape[1])]
    return inputs, true, rollout(model, inputs, true.shape[1], constants)


def evaluate_on_dataset(model, dataset_dir, n_steps_input, device):
    """The model's and persistence's VRMSE curves on the dataset's rollout trajectories, and the
    example (true, pred) to plot: fno.py's statements (tests/test_drift.py checks it), called by
    the solutions from solution 12 on."""
    rollout_data = data.rollout_dataset(dataset_dir, n_steps_input,
                                        max_rollout_steps=memory.rollout_steps(model, device))
    model_vrmse, persistence_vrmse, (true, pred) = evaluate_rollouts(model, rollout_data, device)
    return model_vrmse, persistence_vrmse, (true, pred)


def print_and_plot(true, pred, model_vrmse, persistence_vrmse, fields, stats, out):
    """The first rollout steps' VRMSE, printed, and OUT/rollout.png: fno.py's statements
    (tests/test_drift.py checks it), called by the solutions from solution 07 on."""
    for k in range(min(5, len(model_vrmse))):
        print(f"rollout step {k + 1}: VRMSE model {model_vrmse[k]:.4f}  persistence "
              f"{persistence_vrmse[k]:.4f}")
    plots.rollout_figure(true, pred, fields, out / "rollout.png", mean=stats["mean"],
                         std=stats["std"],
                         model_vrmse=model_vrmse, persistence_vrmse=persistence_vrmse)


# ---- Evaluation as The Well reports it (issue 36): its VRMSE, time windows, whole trajectories.

def well_vrmse(pred: torch.Tensor, true: torch.Tensor, n_spatial_dims: int = 2,
               eps: float = 1e-7) -> torch.Tensor:
    """The Well's VRMSE exactly, per channel: (..., *spatial, F) -> (..., F).

    the_well/benchmark/metrics/spatial.py: `VRMSE.eval` is `NRMSE.eval(norm_mode="std")`, which is
    sqrt(`NMSE.eval`) = sqrt(mean over space of (pred - true)^2 / (torch.std(true over space)^2
    + eps)), eps = 1e-7 added to the variance. torch.std is the sample standard deviation (divides
    by N - 1), where `vrmse` above divides by N: `vrmse` is this times sqrt((N - 1) / N) up to eps
    (1 - 5e-4 on 32 x 32 points). Computed on z-scored frames it is the VRMSE of the physical
    fields the_well scores (its trainer denormalizes first): each channel's shift cancels and its
    scale divides the error and the spread alike, except against eps.
    """
    space = tuple(range(-1 - n_spatial_dims, -1))
    mse = ((pred - true) ** 2).mean(dim=space)
    return torch.sqrt(mse / (torch.std(true, dim=space) ** 2 + eps))


@torch.no_grad()
def trajectory_errors(model, dataset, device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The Well's VRMSE of every trajectory of `dataset` (`data.rollout_dataset`: whole
    trajectories), rolled out as far as it goes, for the model and for persistence: two lists of
    (steps, F) float64 tensors on the CPU, one per trajectory, in the dataset's order."""
    model.eval()
    model_errors, persistence_errors = [], []
    for i in range(len(dataset)):
        inputs, true, pred = _rollout_trajectory(model, dataset, i, device, None)
        n_spatial_dims = inputs.ndim - 3  # (1, T, *spatial, F)
        # The metric's sums in float64 (1024+ points per frame, 39+ steps), one step's frames at a
        # time (`step_errors`): float64 copies of the whole true, predicted and persistence
        # trajectories (and their difference) were 5x the float32 true and predicted frames,
        # which memory.rollout_steps sizes to fill half the free memory. A step's VRMSE reduces
        # over that step's frame alone, so step by step it is the same number.
        errors = step_errors(lambda p, t: well_vrmse(p.double(), t.double(), n_spatial_dims)[0],
                             inputs, true, pred).cpu()  # (2, steps, F), one copy to the host
        model_errors.append(errors[0])
        persistence_errors.append(errors[1])
    return model_errors, persistence_errors


def step_curve(errors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-trajectory errors (steps_i, F) -> (mean per rollout step and field (steps, F),
    trajectories per step (steps,)): each step's mean over the trajectories that reach it.
    the_well's rollouts all have one length (the shortest file's, WellDataset's
    full_trajectory_mode), so there every step counts every trajectory and this is its mean over
    the batch (`Trainer.validation_loop`)."""
    n_steps = max(len(e) for e in errors)
    sums = torch.zeros(n_steps, errors[0].shape[-1], dtype=torch.float64)
    counts = torch.zeros(n_steps, dtype=torch.int64)
    for e in errors:
        sums[:len(e)] += e
        counts[:len(e)] += 1
    return sums / counts[:, None], counts


def the_well_windows(n_steps: int, num_time_intervals: int = 5) -> list[tuple[str, int, int]]:
    """the_well trainer's time windows for a rollout of n_steps: (its log key, first, last step),
    steps counted from 1, both included.

    the_well/benchmark/trainer/training.py, `Trainer.split_up_losses`: boundaries
    [0] + [int(exp(x)) for x in linspace(0, log(n_steps), min(n_steps, num_time_intervals))], window
    k = losses[b_k:b_k+1] (from 0, end excluded), logged as "T=b_k:b_k+1"; num_time_intervals is 5
    in its defaults (the_well/benchmark/configs/trainer/defaults.yaml). Kept as it computes them:
    int() of exp(log(n)) may give n - 1, so its last window can end one step early (39 steps:
    15:38; its "T=all" still counts every step). An empty window (11 steps: 1:1), whose mean
    the_well logs as nan, is left out here.
    """
    n = min(n_steps, num_time_intervals)
    bounds = [0] + [int(np.exp(x)) for x in np.linspace(0, np.log(n_steps), n)]
    return [(f"T={a}:{b}", a + 1, b) for a, b in zip(bounds, bounds[1:]) if b > a]


# The windows of the Well paper's tables (steps 1, 2, 3-5, 6-12, 13-30, from 1, both included; the
# paper's "6:12" and "13:30"): the_well's rule above at a rollout of 30 steps (tests/test_rollout.py
# checks that they are).
PAPER_WINDOWS = (("1", 1, 1), ("2", 2, 2), ("3:5", 3, 5), ("6:12", 6, 12), ("13:30", 13, 30))


def window_vrmse(curve: torch.Tensor, windows, fields: list[str]) -> tuple[list[dict], list[str]]:
    """Mean of a (steps, F) curve over each window (label, first, last): (rows, labels left out).

    A window that starts after the rollout's last step is left out; one that ends after it is
    averaged over the steps there are and reported as such: its row's `last` is the last step
    averaged and `complete` is false. A row's `vrmse` is the mean over its steps and the fields
    (the_well's "full": the fields' mean at each step, then the steps' mean).
    """
    rows, left_out = [], []
    for label, first, last in windows:
        if first > len(curve):
            left_out.append(label)
            continue
        covered = min(last, len(curve))
        part = curve[first - 1:covered]
        rows.append(dict(window=label, first=first, last=covered, complete=covered == last,
                         vrmse=part.mean().item(),
                         per_field=dict(zip(fields, part.mean(0).tolist()))))
    return rows, left_out


def well_report(model_errors: list[torch.Tensor], persistence_errors: list[torch.Tensor],
                fields: list[str]) -> dict:
    """The model's and persistence's VRMSE as The Well reports it, from per-trajectory errors
    (`trajectory_errors`): per rollout step and field, over the paper's and the trainer's time
    windows, and over the whole trajectory (the mean over every step and field: the_well's
    T=all)."""
    counts = step_curve(model_errors)[1]
    report = dict(steps=len(counts), trajectories=len(model_errors),
                  trajectories_per_step=counts.tolist(), fields=fields)
    for name, errors in (("model", model_errors), ("persistence", persistence_errors)):
        curve = step_curve(errors)[0]
        paper, paper_left_out = window_vrmse(curve, PAPER_WINDOWS, fields)
        trainer, _ = window_vrmse(curve, the_well_windows(len(curve)), fields)
        report[name] = dict(
            whole_trajectory=curve.mean().item(),
            whole_trajectory_per_field=dict(zip(fields, curve.mean(0).tolist())),
            per_step=curve.mean(1).tolist(),
            per_step_per_field={field: curve[:, j].tolist() for j, field in enumerate(fields)},
            paper_windows=paper, trainer_windows=trainer)
    report["paper_windows_left_out"] = paper_left_out  # start after the rollout's last step
    return report
