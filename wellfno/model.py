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
from neuralop.layers.spectral_convolution import SpectralConv
from neuralop.models import FNO
from torch import nn


class EagerSpectralConv(SpectralConv):
    """neuralop's SpectralConv, its forward kept out of torch.compile: the FFTs, the complex
    weights' views and product run eagerly, a graph break on each side; the rest of the FNO (the
    1x1 convolutions, activations, skips: the pointwise work compile fuses) is compiled.

    Compiled, the complex part goes through Inductor's per-op fallbacks (`_fft_r2c`,
    `view_as_complex`) on a path with open CUDA-codegen bugs: pytorch/pytorch#188718 (KeyError
    'complex64'), #181625 (a stride assertion in the `_fft_r2c` fallback), #174891 (a complex
    broadcast add decomposed wrongly); NVIDIA/torch-harmonics#260 keeps its spectral convolution
    out of the graph for the same reason. Kept out on every device, the CPU too: Inductor fuses
    nothing complex on a CPU either (the same fallbacks), and one graph everywhere lets the CPU
    tests check the graphs a GPU compiles (tests/test_compile_graphs.py). Same parameters and
    state_dict as SpectralConv; eager, the same numbers.
    """

    @torch.compiler.disable  # https://docs.pytorch.org/docs/stable/generated/torch.compiler.disable.html
    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs)


class RealWeight(nn.Module):
    """A complex weight held as its real view: `as_real`, a float32 parameter of shape (..., 2).

    Stands in for neuralop's dense weight (tltorch's DenseTensor) in a SpectralConv: the
    convolution slices it (`weight[slices]`) and calls `to_tensor()`; both give the complex view.
    """

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.as_real = nn.Parameter(torch.view_as_real(weight.detach()).clone())

    def to_tensor(self) -> torch.Tensor:
        return torch.view_as_complex(self.as_real)  # a view: gradients reach as_real

    def __getitem__(self, index) -> torch.Tensor:
        return self.to_tensor()[index]

    @property
    def shape(self) -> torch.Size:
        return self.as_real.shape[:-1]


def spectral_weights_as_real(model: nn.Module) -> nn.Module:
    """Every complex dense weight of `model`'s spectral convolutions held as a real parameter
    (RealWeight), in place; returns `model`. The forward computes the same numbers; DDP, optimizers
    and GradScaler see only float32 parameters (wellfno/complex_ddp_check.py says why that
    matters)."""
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, nn.Module) and hasattr(weight, "to_tensor"):
            tensor = weight.to_tensor()
            if not tensor.is_complex() or not isinstance(tensor, nn.Parameter):
                continue  # a factorized or real weight: nothing this function knows how to hold
            module.weight = RealWeight(tensor)
    return model


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
    """z-scored frames (B, T*C + K, *spatial) -> z-scored next frame (B, C, *spatial), in 1, 2 or 3-D.

    `channels_per_frame` (C) counts tensor components, not fields: a scalar field is one
    channel, a 2-D velocity two (`wellfno.data.channel_names` lists them). The K
    `constant_channels` (fields that do not change in time, e.g. a material's density)
    come after the frames, once (`wellfno.data.batch_to_model`). The FNO has one Fourier
    mode count per spatial axis, at most the axis' length. Its complex spectral weights are held
    as real parameters, their real views (`spectral_weights_as_real`): DistributedDataParallel
    broadcasts and averages complex tensors wrong or not at all on some backends and torch
    versions (wellfno/complex_ddp_check.py, exercises/05_ddp/background.md);
    `real_weights=False` keeps neuralop's complex parameters.
    """

    def __init__(self, channels_per_frame: int, n_steps_input: int, stats: dict[str, torch.Tensor], *,
                 n_spatial_dims: int = 2, constant_channels: int = 0, resolution=None,
                 modes: int = 12, width: int = 32, layers: int = 4, real_weights: bool = True):
        super().__init__()
        self.channels_per_frame, self.width, self.layers = channels_per_frame, width, layers
        self.resolution = tuple(resolution) if resolution else None  # for wellfno.memory's estimates
        self.in_channels = channels_per_frame * n_steps_input + constant_channels
        self.last_frame = slice(channels_per_frame * (n_steps_input - 1), channels_per_frame * n_steps_input)
        n_modes = tuple(min(modes, n) for n in resolution) if resolution else (modes,) * n_spatial_dims
        self.fno = FNO(n_modes=n_modes, in_channels=self.in_channels, out_channels=channels_per_frame,
                       hidden_channels=width, n_layers=layers,
                       conv_module=EagerSpectralConv)  # compiled around, not through (its docstring)
        if real_weights:  # complex spectral weights kept as real parameters, for DDP (exercise 05)
            spectral_weights_as_real(self.fno)
        # One step of change in z-scored units: (delta - mean_delta) / std_delta, times std_delta / std.
        std = stats["std"].clamp_min(1e-4)
        per_channel = (1, -1) + (1,) * len(n_modes)
        self.register_buffer("delta_scale", (stats["std_delta"].clamp_min(1e-4) / std).view(per_channel))
        self.register_buffer("delta_shift", (stats["mean_delta"] / std).view(per_channel))

    @classmethod
    def for_dataset(cls, dataset, n_steps_input: int, stats: dict[str, torch.Tensor], **options):
        """The model for a WellDataset's layout (`dataset.metadata`: channels, constant fields, grid)."""
        meta = dataset.metadata
        return cls(meta.n_fields, n_steps_input, stats, n_spatial_dims=meta.n_spatial_dims,
                   constant_channels=meta.n_constant_fields, resolution=meta.spatial_resolution, **options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = x[:, self.last_frame]
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
