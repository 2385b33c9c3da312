"""Autoregressive rollout and its metrics.

Given the first `n_steps_input` frames, the model predicts frame t, which joins
the input window to predict frame t+1, and so on. Prediction k is compared with
true frame k, the k-th frame after the input window (tests/test_rollout.py checks
that no off-by-one shifts the two apart).
"""
from __future__ import annotations

import torch

from wellfno.data import to_channels


def vrmse(pred: torch.Tensor, true: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """The Well's VRMSE per field: sqrt(mean((pred-true)^2) / (var(true) + eps)) over space.

    pred, true: (..., H, W, F) -> (..., F). 0 is perfect; 1 is as bad as predicting the mean.
    """
    space = tuple(range(-3, -1))
    mse = ((pred - true) ** 2).mean(dim=space)
    var = true.var(dim=space, unbiased=False)
    return torch.sqrt(mse / (var + eps))


@torch.no_grad()
def rollout(model, inputs: torch.Tensor, n_steps: int) -> torch.Tensor:
    """inputs (B, T, H, W, F) -> predictions (B, n_steps, H, W, F)."""
    window = inputs
    preds = []
    for _ in range(n_steps):
        nxt = model(to_channels(window))  # (B, F, H, W)
        nxt = nxt.permute(0, 2, 3, 1).unsqueeze(1)  # (B, 1, H, W, F)
        preds.append(nxt)
        window = torch.cat([window[:, 1:], nxt], dim=1)  # drop the oldest frame, append the prediction
    return torch.cat(preds, dim=1)


def persistence(inputs: torch.Tensor, n_steps: int) -> torch.Tensor:
    """The baseline to beat: the last input frame, repeated."""
    return inputs[:, -1:].expand(-1, n_steps, *inputs.shape[2:])


@torch.no_grad()
def evaluate_rollouts(model, dataset, device, max_steps: int | None = None, max_trajectories: int = 16):
    """Mean VRMSE per rollout step (averaged over fields and trajectories) for the model and persistence.

    Returns (model_vrmse, persistence_vrmse, example) where example holds (true, pred)
    of the trajectory that changes most in one step (the most instructive to plot).
    """
    model.eval()
    model_err, persist_err, example, most_change = [], [], None, -1.0
    for i in range(min(len(dataset), max_trajectories)):
        sample = dataset[i]
        inputs = sample["input_fields"].unsqueeze(0).to(device)
        true = sample["output_fields"].unsqueeze(0).to(device)
        n = true.shape[1] if max_steps is None else min(max_steps, true.shape[1])
        true = true[:, :n]
        pred = rollout(model, inputs, n)
        model_err.append(vrmse(pred, true).mean(-1)[0])
        persist_err.append(vrmse(persistence(inputs, n), true).mean(-1)[0])
        if persist_err[-1][0] > most_change:
            most_change, example = persist_err[-1][0].item(), (true[0].cpu(), pred[0].cpu())
    n = min(len(e) for e in model_err)
    model_curve = torch.stack([e[:n] for e in model_err]).mean(0)
    persist_curve = torch.stack([e[:n] for e in persist_err]).mean(0)
    return model_curve.tolist(), persist_curve.tolist(), example
