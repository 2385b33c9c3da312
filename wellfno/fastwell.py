"""A faster reader for The Well: the samples of `WellDataset`, without its per-item overhead.

`FastWellDataset(path=..., well_split_name=..., n_steps_input=...)` takes WellDataset's
arguments and yields exactly what the_well's `WellDataset` yields with them (n_steps_output=1,
z-score normalization, return_grid=False, boundary_return_type=None): the same
samples in the same order, with the same keys, dtypes, shapes and values, bit for
bit (the normalization is the same float32 `(x - mean) / std`, only applied to
all channels at once).

Where the time goes in `WellDataset.__getitem__`, per item:
  * it opens the HDF5 file again, through fsspec with an 8 MiB block cache, so a
    small file is read whole for every sample;
  * it re-reads the attributes of every field (`field_names`, `time_varying`, ...)
    to decide how to slice it;
  * it normalizes and tiles each field separately, then concatenates.
Here the file layout is read once in `__init__`; each process opens the files on
first use and keeps them open (opened lazily, after the DataLoader forks, so every
worker has its own HDF5 handles: h5py handles must not be shared across a fork);
and `__getitems__` (which DataLoader calls with a whole batch of indices) reads
each field's window with one contiguous slice and normalizes the batch in one go.
"""
from __future__ import annotations

import itertools
import os
from pathlib import Path

import h5py
import numpy as np
import torch
import yaml
from the_well.data import WellDataset
from the_well.data.normalization import ZScoreNormalization
from torch.utils.data import Dataset

from wellfno.cli import UserError
from wellfno.wellformat import split_files

FIELD_GROUPS = ("t0_fields", "t1_fields", "t2_fields")


def _unsupported(path, what: str) -> UserError:
    return UserError(f"{path}: {what}; the fast reader handles fields that vary along every axis (and in time "
                     f"with the trajectory) and constant scalars only: drop --fast-reader to use the_well's WellDataset")


def layout_support(lay) -> str:
    """Whether FastWellDataset reads a Well dataset's layout (a coursetools.wellmeta.Layout): 'yes' or 'no: why'.

    All 23 datasets' metadata describe fields it reads; what it refuses (`_unsupported`) shows
    only in the files' attributes: fields constant along an axis, or changing in time but the
    same in every trajectory.
    """
    return "yes" if lay.n_spatial_dims in (1, 2, 3) else f"no: {lay.n_spatial_dims}-D"


class FastWellDataset(Dataset):
    """Windows of `n_steps_input + n_steps_output` frames, z-scored like WellDataset's samples.

    Each sample is {"input_fields": (n_in, *spatial, C), "output_fields": (n_out, *spatial, C),
    "constant_fields": (*spatial, K), "constant_scalars": (S,)} (the last two only if the files
    have time-constant fields or constant scalars), in 2-D or 3-D.
    """

    def __init__(self, path: str | Path, well_split_name: str = "train", n_steps_input: int = 1,
                 n_steps_output: int = 1, use_normalization: bool = True, normalization_type=None,
                 return_grid: bool = False, boundary_return_type: str | None = None, min_std: float = 1e-4):
        """WellDataset's arguments (the ones the course uses), so it is a drop-in for `WellDataset(...)`."""
        from the_well.data.normalization import ZScoreNormalization
        from the_well.data.utils import raw_steps_to_possible_sample_t0s

        if normalization_type not in (None, ZScoreNormalization) or return_grid or boundary_return_type is not None:
            raise UserError("the fast reader does z-score normalization only, without grid or boundary "
                            "conditions: drop --fast-reader to use the_well's WellDataset")
        split = well_split_name
        self.dataset_dir = Path(path)
        self.n_steps_input, self.n_steps_output = n_steps_input, n_steps_output
        self.window = n_steps_input + n_steps_output
        self.files_paths = [str(path) for path in split_files(self.dataset_dir, split)]  # WellDataset's order
        if not self.files_paths:
            raise UserError(f"no HDF5 files in {self.dataset_dir / 'data' / split}")

        windows, offsets, self.constant_scalars, trajectories, all_steps = [], [0], [], [], []
        for index, path in enumerate(self.files_paths):
            with h5py.File(path, "r") as f:
                if index == 0:
                    self._read_layout(f, path)
                steps = f["dimensions"]["time"].shape[-1]
                trajectories.append(int(f.attrs["n_trajectories"]))
                all_steps.append(int(steps))
                n_windows = raw_steps_to_possible_sample_t0s(steps, n_steps_input, n_steps_output, 1)
                if n_windows < 1:
                    raise UserError(f"{path} has {steps} frames: too few for {n_steps_input} input "
                                    f"and {n_steps_output} output steps")
                windows.append(n_windows)
                offsets.append(offsets[-1] + int(f.attrs["n_trajectories"]) * n_windows)
                self.constant_scalars.append(self._read_constant_scalars(f, path))
        self.windows_per_trajectory = np.asarray(windows)
        self.file_offsets = np.asarray(offsets)  # sample index where each file starts
        self.len = int(self.file_offsets[-1])
        self.metadata = self._metadata(trajectories, all_steps)

        # Per-channel mean and std, float32, exactly the values the_well's ZScoreNormalization
        # uses per field (std clipped at min_std), broadcast to the field's tensor components.
        self.channel_mean = self.channel_std = self._norm = None
        if use_normalization:
            stats = yaml.safe_load((self.dataset_dir / "stats.yaml").read_text())
            norm = ZScoreNormalization(stats, self.core_field_names, self.core_constant_field_names,
                                       min_denom=min_std)
            self._norm = norm  # time-constant fields: normalized with it, as WellDataset does
            means, stds = [], []
            for _, field, component_shape in self.field_layout:
                for source, out in ((norm.means[field], means), (norm.stds[field], stds)):
                    out.append(torch.broadcast_to(source, component_shape).reshape(-1))
            self.channel_mean, self.channel_std = torch.cat(means), torch.cat(stds)
            self._mean, self._std = self.channel_mean.numpy(), self.channel_std.numpy()  # numpy float32 scalars
        self._open_pid, self._datasets, self._buffers_pid, self._buffers = None, None, None, {}
        self._files = None
        self._constants = {}  # (file, trajectory) -> constant_fields tensor, read once

    def _read_layout(self, f: h5py.File, path) -> None:
        """Field names in WellDataset's channel order: t0, then t1, then t2 fields, components last."""
        spatial_dims = [d.decode() if isinstance(d, bytes) else d for d in f["dimensions"].attrs["spatial_dims"]]
        self.n_spatial_dims = len(spatial_dims)
        self.grid_type = str(f.attrs["grid_type"])
        self.bc_types = sorted({str(bc.attrs["bc_type"]) for bc in f["boundary_conditions"].values()})
        self.field_names = {order: [] for order in range(3)}
        self.constant_field_names = {order: [] for order in range(3)}
        self.core_field_names, self.field_layout, dtypes = [], [], set()
        self.core_constant_field_names, self.constant_layout = [], []
        for order, group in enumerate(FIELD_GROUPS):
            for name in f[group].attrs["field_names"]:
                dset = f[group][name]
                if not all(dset.attrs["dim_varying"]):
                    raise _unsupported(path, f"field {group}/{name} is constant along an axis")
                # Component names as WellDataset builds them: A, or u_x, u_y, or S_xx, S_xy, ...
                names = [f"{name}_{''.join(dims)}" if dims else name
                         for dims in itertools.product(spatial_dims, repeat=order)]
                if not dset.attrs["time_varying"]:  # e.g. a material's density: one per trajectory (or file)
                    self.constant_layout.append((group, name, order, bool(dset.attrs["sample_varying"])))
                    self.core_constant_field_names.append(name)
                    self.constant_field_names[order] += names
                    continue
                if not dset.attrs["sample_varying"]:
                    raise _unsupported(path, f"field {group}/{name} changes in time but is the same in every trajectory")
                component_shape = dset.shape[2 + self.n_spatial_dims:]
                self.field_layout.append((group, name, component_shape))
                self.core_field_names.append(name)
                self.field_names[order] += names
                dtypes.add(dset.dtype)
        if len(dtypes) != 1:
            raise _unsupported(path, f"fields of several dtypes ({sorted(map(str, dtypes))})")
        self.dtype = dtypes.pop()
        self.spatial_shape = f[self.field_layout[0][0]][self.field_layout[0][1]].shape[2:2 + self.n_spatial_dims]
        self.n_channels = len([n for names in self.field_names.values() for n in names])

    @staticmethod
    def _read_constant_scalars(f: h5py.File, path):
        """Constant scalars as WellDataset stacks them (file dtype, one value each), read once per file."""
        values = []
        for name in f["scalars"].attrs["field_names"]:
            dset = f["scalars"][name]
            if dset.attrs["time_varying"] or dset.attrs["sample_varying"]:
                raise _unsupported(path, f"scalar {name} varies in time or sample")
            values.append(torch.as_tensor(dset[()]).unsqueeze(-1))
        return torch.cat(values) if values else None

    def _metadata(self, trajectories: list[int], steps: list[int]):
        """the_well's WellMetadata of this split, as WellDataset.metadata describes it."""
        from the_well.data.datasets import WellMetadata

        with h5py.File(self.files_paths[0], "r") as f:
            scalars = [str(n) for n in f["scalars"].attrs["field_names"]]
            name = str(f.attrs["dataset_name"])
        return WellMetadata(dataset_name=name, n_spatial_dims=self.n_spatial_dims,
                            spatial_resolution=tuple(map(int, self.spatial_shape)), scalar_names=[],
                            constant_scalar_names=scalars, field_names=self.field_names,
                            constant_field_names=self.constant_field_names, boundary_condition_types=self.bc_types,
                            n_files=len(self.files_paths), n_trajectories_per_file=trajectories,
                            n_steps_per_trajectory=steps, grid_type=self.grid_type)

    def constant_fields(self, file_idx: int, trajectory: int):
        """(*spatial, K): a trajectory's time-constant fields, with WellDataset's own torch ops, so bitwise equal."""
        key = (file_idx, trajectory)
        if key not in self._constants:
            if len(self._constants) > 64:
                self._constants.clear()
            f = self._open_files()[file_idx]
            parts = []
            for group, name, order, sample_varying in self.constant_layout:
                x = torch.as_tensor(f[group][name][trajectory] if sample_varying else f[group][name][...])
                if self._norm is not None:
                    x = self._norm.normalize(x, name)
                parts.append(x.unsqueeze(-1).flatten(-order - 1))  # components last, as WellDataset flattens
            self._constants[key] = torch.concatenate(parts, dim=-1)
        return self._constants[key]

    def __len__(self) -> int:
        return self.len

    def __getstate__(self):
        # Open HDF5 handles cannot be pickled (spawned workers) and must not be shared after a fork.
        return {**self.__dict__, "_open_pid": None, "_datasets": None, "_files": None, "_buffers_pid": None,
                "_buffers": {}, "_constants": {}}

    def _open(self):
        """HDF5 datasets of this process, opened on first use after a fork."""
        if self._open_pid != os.getpid():
            self._files = [h5py.File(path, "r") for path in self.files_paths]
            self._datasets = [[f[group][name] for group, name, _ in self.field_layout] for f in self._files]
            self._open_pid = os.getpid()
        return self._datasets

    def _open_files(self) -> list[h5py.File]:
        self._open()
        return self._files

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample indices -> (file, trajectory in the file, first frame) arrays, as WellDataset counts them."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if indices.size and not (0 <= indices.min() and indices.max() < self.len):
            raise IndexError(f"index out of range for {self.len} samples: {indices.tolist()}")
        files = np.searchsorted(self.file_offsets, indices, side="right") - 1
        local = indices - self.file_offsets[files]
        windows = self.windows_per_trajectory[files]
        return files, local // windows, local % windows

    def _read_buffers(self, batch_size: int) -> list[np.ndarray]:
        """Per field, a (B, window, *spatial, *components) array this process reuses from batch to batch.

        Fresh multi-MB arrays per batch cost more than the reads themselves at 128x128: every
        page of them is faulted in and zeroed by the kernel again.
        """
        if self._buffers_pid != os.getpid() or len(self._buffers) > 4:
            self._buffers, self._buffers_pid = {}, os.getpid()
        if batch_size not in self._buffers:
            self._buffers[batch_size] = [np.empty((batch_size, self.window, *self.spatial_shape, *components),
                                                  dtype=self.dtype) for _, _, components in self.field_layout]
        return self._buffers[batch_size]

    def read_fields(self, files, trajectories, starts) -> list[np.ndarray]:
        """Per field, the raw windows (B, window, *spatial, *components): one contiguous slice each.

        The arrays are this process's reusable buffers: the next call overwrites them.
        """
        datasets = self._open()
        buffers = self._read_buffers(len(files))
        for b, (file_idx, trajectory, start) in enumerate(zip(files.tolist(), trajectories.tolist(), starts.tolist())):
            for buffer, dset in zip(buffers, datasets[file_idx]):
                buffer[b] = dset[trajectory, start:start + self.window]
        return buffers

    def __getitems__(self, indices) -> list[dict]:
        """A batch of samples; DataLoader calls this with all the indices of a batch at once."""
        files, trajectories, starts = self.locate(indices)
        if not len(files):
            return []
        fields = self.read_fields(files, trajectories, starts)
        normalize = self.channel_mean is not None
        dtype = np.result_type(self.dtype, np.float32) if normalize else self.dtype
        out = np.empty((len(files), self.window, *self.spatial_shape, self.n_channels), dtype=dtype)
        channel = 0
        for field in fields:
            components = field.reshape(*field.shape[:2 + self.n_spatial_dims], -1)
            for k in range(components.shape[-1]):
                component = components[..., k]
                if normalize:
                    # The same float32 (x - mean) / std as WellDataset's per-field normalize, so bitwise
                    # equal values. In place on the field's own (contiguous) buffer, one channel at a
                    # time: a torch op broadcasting over a last dim of 2 channels is ~50x slower, and
                    # its thread pool stalls when DataLoader workers hold the other cores.
                    np.subtract(component, self._mean[channel], out=component)
                    np.divide(component, self._std[channel], out=component)
                out[..., channel] = component  # interleave: WellDataset puts channels last
                channel += 1
        windows = torch.from_numpy(out)
        samples = []
        for b, file_idx in enumerate(files.tolist()):
            sample = {"input_fields": windows[b, :self.n_steps_input], "output_fields": windows[b, self.n_steps_input:]}
            if self.constant_layout:
                sample["constant_fields"] = self.constant_fields(file_idx, int(trajectories[b]))
            scalars = self.constant_scalars[file_idx]
            if scalars is not None:
                sample["constant_scalars"] = scalars
            samples.append(sample)
        return samples

    def __getitem__(self, index: int) -> dict:
        sample = self.__getitems__([index])[0]
        return {key: value.clone() for key, value in sample.items()}  # not views of a one-sample batch

    def __repr__(self) -> str:
        return f"<{self.__class__.__name__}: {self.dataset_dir}, {self.len} samples>"


def fast_datasets(dataset_dir: Path, n_steps_input: int = 1, splits=("train", "valid")) -> dict:
    """FastWellDataset per split, the drop-in for `wellfno.data.well_datasets`."""
    from wellfno.data import check_input_steps

    check_input_steps(dataset_dir, n_steps_input, splits)
    return {split: FastWellDataset(dataset_dir, split, n_steps_input) for split in splits}


def open_splits(dataset_dir, n_steps_input, fast_reader):
    """The train and valid splits, with the_well's reader or this one (--fast-reader): step 02's
    statements (tests/test_drift.py checks it); the solutions call it from solution 07 on."""
    # the_well's reader: n_steps_input frames in, the next frame out, z-scored with
    # DATASET/stats.yaml.
    reader = FastWellDataset if fast_reader else WellDataset  # the same samples, bit for bit
    splits = {split: reader(path=str(dataset_dir), well_split_name=split, n_steps_output=1,
                            n_steps_input=n_steps_input, use_normalization=True,
                            normalization_type=ZScoreNormalization, return_grid=False,
                            boundary_return_type=None) for split in ("train", "valid")}
    return splits
