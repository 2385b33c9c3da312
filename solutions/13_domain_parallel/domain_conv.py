"""Exercise 13, tasks 2 and 3: the distributed spectral convolution, and the model split for a slab.

Solution 13 (fno.py, beside this file) trains with these: `DomainSpectralConv(conv, slab)` is
neuralop's SpectralConv on this rank's rows of the grid (same parameters, same state_dict; the
four steps: exercises/13_domain_parallel/background.md), and `split_model` puts one in place of
each spectral convolution of the FNO and the slab's rows in place of its positional embedding.
The exchange (an all_to_all whose backward is the reverse one), the kept modes' FFT indices and
the slabs come from wellfno.domain, which holds a copy of both for the later steps and the
benchmark (tests/test_drift.py checks that the copies are this code).
"""

from __future__ import annotations

import torch
from torch import nn

from wellfno.domain import Slab, SlabGridEmbedding, exchange, kept_indices, slab_bounds


class DomainSpectralConv(nn.Module):
    """neuralop's SpectralConv on a slab of the grid; the same parameters (`weight`, `bias`)."""

    def __init__(self, conv, slab: Slab):
        super().__init__()
        if (
            conv.complex_data
            or conv.separable
            or conv.fno_block_precision != "full"
            or conv.resolution_scaling_factor is not None
            or conv.order < 2
        ):
            raise ValueError(
                "DomainSpectralConv: real data, dense weights, full precision, 2-D or 3-D only"
            )
        self.weight, self.bias = conv.weight, conv.bias  # the same parameters: state_dict unchanged
        self.fft_norm, self.out_channels, self.slab = conv.fft_norm, conv.out_channels, slab
        self._indices = {}  # (device, local axes) -> the FFT indices: see `indices`

    def indices(self, x: torch.Tensor, modes) -> tuple:
        """The FFT indices of the kept modes, on x's device, made at the first forward there.

        Not per forward: indices made on the host and copied to a GPU are a pageable host-to-device
        copy, which waits for the stream (a host sync in every convolution). Not buffers either:
        DDP would broadcast them from rank 0 at every forward (broadcast_buffers).
        """
        key = (x.device, tuple(x.shape[3:]))
        if key not in self._indices:
            self._indices[key] = (
                [kept_indices(n, m, x.device) for n, m in zip(x.shape[3:-1], modes[1:-1])],
                kept_indices(self.slab.n, modes[0], x.device),
            )
        return self._indices[key]

    def transform(self, x, output_shape=None):
        return x  # neuralop resamples the skip path only with resolution scaling: none here

    def forward(self, x: torch.Tensor, output_shape=None) -> torch.Tensor:
        slab, norm = self.slab, self.fft_norm
        weight = self.weight if torch.is_tensor(self.weight) else self.weight.to_tensor()
        modes = weight.shape[2:]  # (m0, m1, ..., m_last//2 + 1): neuralop's kept modes per axis
        local_shape = x.shape[3:]  # the local axes (all but the first)
        local_dims = tuple(range(3, x.ndim))
        local_indices, (take, put) = self.indices(x, modes)  # made once per device
        # 1. along the local axes: rfft on the last, fft on the others; keep neuralop's modes
        y = torch.fft.rfftn(x, dim=local_dims, norm=norm)
        for dim, (kept, _) in zip(local_dims[:-1], local_indices):
            y = y.index_select(dim, kept)
        y = y[..., : modes[-1]]
        batch, channels, rows = y.shape[:3]
        y = y.reshape(batch, channels, rows, -1)  # (B, C, slab rows, K kept local modes)
        shares = slab_bounds(y.shape[-1], slab.size)  # each rank's share of the K modes
        mine = slice(*shares[slab.index])
        # 2. exchange: every rank gets all rows for its share of the modes
        if slab.size > 1:
            parts = exchange(
                [y[..., a:b] for a, b in shares],
                [
                    (batch, channels, stop - start, mine.stop - mine.start)
                    for start, stop in slab.bounds()
                ],
                slab.group,
            )
            y = torch.cat(parts, dim=2)  # (B, C, n0, K_mine)
        # 3. the first axis: fft, keep its modes, multiply by the weights of these modes
        n0 = slab.n
        y = torch.fft.fft(y, dim=2, norm=norm).index_select(2, take)
        w = weight.reshape(*weight.shape[:3], -1)[..., mine]
        y = torch.einsum("bimk,iomk->bomk", y, w)
        y = y.new_zeros(batch, self.out_channels, n0, y.shape[-1]).index_copy(2, put, y)
        y = torch.fft.ifft(y, dim=2, norm=norm)
        # 4. back: all_to_all to the slabs, then the inverse transforms along the local axes
        if slab.size > 1:
            parts = exchange(
                [y[:, :, start:stop] for start, stop in slab.bounds()],
                [(batch, self.out_channels, rows, b - a) for a, b in shares],
                slab.group,
            )
            y = torch.cat(parts, dim=3)  # (B, O, slab rows, K)
        y = y.reshape(batch, self.out_channels, rows, *modes[1:])
        for dim, n, (_, kept) in zip(local_dims[:-1], local_shape[:-1], local_indices):
            shape = list(y.shape)
            shape[dim] = n
            y = y.new_zeros(shape).index_copy(dim, kept, y)
        # the last axis' rfft modes 0 .. m-1 kept: the others are zeros after them
        y = nn.functional.pad(y, (0, local_shape[-1] // 2 + 1 - modes[-1]))
        y = torch.fft.irfftn(y, s=local_shape, dim=local_dims, norm=norm)
        return y if self.bias is None else y + self.bias


def split_model(model, slab: Slab):
    """A NextFrameFNO, in place, for frames of `slab`'s rows: the same parameters and state_dict."""
    if slab.size == 1:
        return model
    fno = model.fno
    fno.fno_blocks.convs = nn.ModuleList(
        DomainSpectralConv(conv, slab) for conv in fno.fno_blocks.convs
    )
    if fno.positional_embedding is not None:
        fno.positional_embedding = SlabGridEmbedding(fno.positional_embedding, slab)
    return model
