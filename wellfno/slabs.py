"""Each rank of a domain group reads only its slab of every frame (HDF5 hyperslabs): I/O 1/P.

`SlabWellDataset(path, split, n_steps_input, rows=slice(a, b))` yields WellDataset's samples
(z-scored, channels last) cut to rows a:b of the first spatial axis, and reads no other rows:
h5py turns `dset[trajectory, t0:t1, a:b]` into one HDF5 hyperslab selection, so only those
rows come off the disk (contiguous or chunked files alike). Built on wellfno.fastwell's reader
(the samples of WellDataset, bit for bit), with the spatial slice added to every read.
`SlabRollouts` are the same for whole trajectories (wellfno.data.rollout_dataset's samples).

Ref: h5py reads a slice as a hyperslab selection,
https://docs.h5py.org/en/stable/high/dataset.html#reading-writing-data
"""

from __future__ import annotations

import numpy as np
import torch

from wellfno.fastwell import FastWellDataset


class SlabWellDataset(FastWellDataset):
    """FastWellDataset's samples, rows `rows` of the first spatial axis only (hyperslab reads)."""

    def __init__(
        self,
        path,
        well_split_name: str = "train",
        n_steps_input: int = 1,
        n_steps_output: int = 1,
        rows: slice | None = None,
        **options,
    ):
        super().__init__(path, well_split_name, n_steps_input, n_steps_output, **options)
        self.full_spatial_shape = tuple(self.spatial_shape)  # metadata keeps the whole grid's
        self.rows = slice(0, self.full_spatial_shape[0]) if rows is None else rows
        self.spatial_shape = (self.rows.stop - self.rows.start, *self.full_spatial_shape[1:])

    def read_fields(self, files, trajectories, starts) -> list[np.ndarray]:
        datasets = self._open()
        buffers = self._read_buffers(len(files))  # shaped with the slab's spatial_shape
        for b, (file_idx, trajectory, start) in enumerate(
            zip(files.tolist(), trajectories.tolist(), starts.tolist())
        ):
            for buffer, dset in zip(buffers, datasets[file_idx]):
                buffer[b] = dset[trajectory, start : start + self.window, self.rows]  # a hyperslab
        return buffers

    def constant_fields(self, file_idx: int, trajectory: int):
        """(*slab, K): the slab of a trajectory's time-constant fields, read as a hyperslab."""
        key = (file_idx, trajectory)
        if key not in self._constants:
            if len(self._constants) > 64:
                self._constants.clear()
            f = self._open_files()[file_idx]
            parts = []
            for group, name, order, sample_varying in self.constant_layout:
                dset = f[group][name]
                x = torch.as_tensor(
                    dset[trajectory, self.rows] if sample_varying else dset[self.rows]
                )
                if self._norm is not None:
                    x = self._norm.normalize(x, name)
                parts.append(x.unsqueeze(-1).flatten(-order - 1))
            self._constants[key] = torch.concatenate(parts, dim=-1)
        return self._constants[key]


class SlabRollouts(torch.utils.data.Dataset):
    """Whole trajectories of a split, as wellfno.data.rollout_dataset gives them, on slab `rows`.

    Item i: the first n_steps_input frames of trajectory i in, the next min(T - n_steps_input,
    max_rollout_steps) out (WellDataset's full_trajectory_mode, T the shortest trajectory).
    """

    def __init__(
        self,
        path,
        n_steps_input: int,
        split: str = "valid",
        max_rollout_steps: int = 100,
        rows: slice | None = None,
    ):
        probe = FastWellDataset(path, split, n_steps_input, 1, use_normalization=False)
        steps = min(probe.metadata.n_steps_per_trajectory)
        out_steps = min(steps - n_steps_input, max_rollout_steps)
        self.windows = SlabWellDataset(path, split, n_steps_input, out_steps, rows=rows)
        w = self.windows
        self.first_windows = [
            int(w.file_offsets[f]) + t * int(w.windows_per_trajectory[f])
            for f, n in enumerate(w.metadata.n_trajectories_per_file)
            for t in range(n)
        ]
        self.metadata = w.metadata

    def __len__(self) -> int:
        return len(self.first_windows)

    def __getitem__(self, i: int) -> dict:
        return self.windows[self.first_windows[i]]
