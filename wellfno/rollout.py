"""Autoregressive rollout and its metrics.

Given the first `n_steps_input` frames, the model predicts frame t, which joins
the input window to predict frame t+1, and so on. Prediction k is compared with
true frame k, the k-th frame after the input window (tests/test_rollout.py checks
that no off-by-one shifts the two apart).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from wellfno import data, memory, plots
from wellfno.data import model_inputs


def vrmse(pred: torch.Tensor, true: torch.Tensor, n_spatial_dims: int = 2, eps: float = 1e-7) -> torch.Tensor:
    """The Well's VRMSE per field: sqrt(mean((pred-true)^2) / (var(true) + eps)) over space.

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


def persistence(inputs: torch.Tensor, n_steps: int) -> torch.Tensor:
    """The baseline to beat: the last input frame, repeated."""
    return inputs[:, -1:].expand(-1, n_steps, *inputs.shape[2:])


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
        n_spatial_dims = inputs.ndim - 3  # (1, T, *spatial, F)
        curves.append((vrmse(pred, true, n_spatial_dims).mean(-1)[0],
                       vrmse(persistence(inputs, true.shape[1]), true, n_spatial_dims).mean(-1)[0]))
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


def evaluate_on_dataset(model, dataset_dir, args, device):
    """The model's and persistence's VRMSE curves on the dataset's rollout trajectories, and the
    example (true, pred) to plot: fno.py's statements (tests/test_drift.py checks it), called by
    the solutions from solution 12 on."""
    rollout_data = data.rollout_dataset(dataset_dir, args.n_steps_input,
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
