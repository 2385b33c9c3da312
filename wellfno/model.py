"""The model: neuraloperator's FNO, asked for the change to the next frame.

Between two saved frames a field moves by a small fraction of its spread
(Gray-Scott: std_delta/std is about 0.1). Predicting the next frame directly
makes the network relearn the identity; predicting the one-step change, scaled
by the dataset's `std_delta`, gives it an order-one target. The loss is then the
MSE of that scaled change, which weights each channel by 1/std_delta^2, the
loss weights of exercise 04.
"""
from __future__ import annotations

import torch
from neuralop.models import FNO
from torch import nn


def channel_stats(stats: dict, field_names: list[str]) -> dict[str, torch.Tensor]:
    """Per-channel mean, std, mean_delta, std_delta (float32) in the order of the fields."""
    out = {}
    for key in ("mean", "std", "mean_delta", "std_delta"):
        values = []
        for name in field_names:
            value = stats[key][name]
            values += list(torch.as_tensor(value, dtype=torch.float64).flatten().tolist())
        out[key] = torch.tensor(values, dtype=torch.float32)
    return out


class NextFrameFNO(nn.Module):
    """z-scored frames (B, T*C, H, W) -> z-scored next frame (B, C, H, W).

    `channels_per_frame` (C) counts tensor components, not fields: a scalar field is one
    channel, a 2-D velocity two (`wellfno.data.channel_names` lists them).
    """

    def __init__(self, channels_per_frame: int, n_steps_input: int, stats: dict[str, torch.Tensor], *,
                 modes: int = 12, hidden: int = 32, layers: int = 4):
        super().__init__()
        self.channels_per_frame = channels_per_frame
        self.fno = FNO(n_modes=(modes, modes), in_channels=channels_per_frame * n_steps_input,
                       out_channels=channels_per_frame, hidden_channels=hidden, n_layers=layers)
        # One step of change in z-scored units: (delta - mean_delta) / std_delta, times std_delta / std.
        std = stats["std"].clamp_min(1e-4)
        self.register_buffer("delta_scale", (stats["std_delta"].clamp_min(1e-4) / std).view(1, -1, 1, 1))
        self.register_buffer("delta_shift", (stats["mean_delta"] / std).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = x[:, -self.channels_per_frame:]
        return last + self.fno(x) * self.delta_scale + self.delta_shift

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """MSE in units of the typical one-step change of each channel."""
        return (((pred - target) / self.delta_scale) ** 2).mean()

    def state_dict(self, *args, **kwargs):
        # neuralop adds a '_metadata' entry holding its constructor arguments (functions
        # included); drop it so checkpoints are tensors only and load with weights_only=True.
        state = super().state_dict(*args, **kwargs)
        state.pop("_metadata", None)
        return state
