"""Write HDF5 files in The Well's format.

The layout follows the files that `the-well-download` fetches (and the_well's
own `utils/dummy_data.py`): root attributes, `dimensions/`, `boundary_conditions/`,
`scalars/`, and `t0_fields/`, `t1_fields/`, `t2_fields/` (scalar, vector and
tensor fields), each dataset tagged with `time_varying`, `sample_varying` and
`dim_varying`. the_well's `WellDataset` reads these attributes to decide how
to slice and tile every array, so they must be exactly right.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import h5py
import numpy as np

from wellfno.cli import atomic_output

SPLITS = ("train", "valid", "test")


def split_files(dataset_dir: str | os.PathLike, split: str) -> list[Path]:
    """The HDF5 files of DATASET/data/<split>/ in WellDataset's order ([] if there are none).

    the_well's WellDataset globs `*.h5` and `*.hdf5` and sorts the full paths as strings;
    sample i of every reader in this package means the same sample because they all list
    the files here.
    """
    folder = Path(dataset_dir) / "data" / split
    return sorted([*folder.glob("*.h5"), *folder.glob("*.hdf5")], key=str)


def _field_group(f: h5py.File, order: int, fields: Mapping[str, np.ndarray], time_varying: Mapping[str, bool]):
    group = f.create_group(f"t{order}_fields")
    group.attrs["field_names"] = list(fields)
    n_dims = f.attrs["n_spatial_dims"]
    for name, data in fields.items():
        dset = group.create_dataset(name, data=data)
        dset.attrs["dim_varying"] = [True] * n_dims
        dset.attrs["sample_varying"] = True
        dset.attrs["time_varying"] = bool(time_varying.get(name, True))
        if order == 2:  # The Well's spec tags tensors; a general tensor is neither
            dset.attrs["symmetric"] = False
            dset.attrs["antisymmetric"] = False


def write_well_file(
    path: str | os.PathLike,
    *,
    dataset_name: str,
    time: np.ndarray,
    coords: Mapping[str, np.ndarray],
    t0_fields: Mapping[str, np.ndarray] = {},
    t1_fields: Mapping[str, np.ndarray] = {},
    t2_fields: Mapping[str, np.ndarray] = {},
    time_varying: Mapping[str, bool] = {},
    constant_scalars: Mapping[str, float] = {},
    periodic: bool = True,
    boundaries: Mapping[str, tuple[str, str]] | None = None,
    grid_type: str = "cartesian",
    attrs: Mapping[str, object] = {},
) -> Path:
    """Write one Well file, atomically (temporary name, then rename).

    Field arrays are (n_trajectories, n_time, *spatial[, d[, d]]) when
    time-varying, (n_trajectories, *spatial[, d[, d]]) otherwise.
    `boundaries` gives, per spatial dimension, the boundary type at its low and
    high end (e.g. {"y": ("WALL", "OPEN")}); without it every end is periodic
    (or open). `attrs` are extra root attributes (provenance notes).
    """
    path = Path(path)
    all_fields = {**t0_fields, **t1_fields, **t2_fields}
    n_traj = next(iter(all_fields.values())).shape[0]
    with atomic_output(path) as tmp, h5py.File(tmp, "w") as f:
        f.attrs["dataset_name"] = dataset_name
        f.attrs["grid_type"] = grid_type
        f.attrs["n_spatial_dims"] = len(coords)
        f.attrs["n_trajectories"] = n_traj
        f.attrs["simulation_parameters"] = list(constant_scalars)
        for name, value in constant_scalars.items():
            f.attrs[name] = value
        for name, value in attrs.items():
            f.attrs[name] = value

        dims = f.create_group("dimensions")
        dims.attrs["spatial_dims"] = list(coords)
        for name, values in {"time": time, **coords}.items():
            dset = dims.create_dataset(name, data=np.asarray(values, dtype=np.float32))
            dset.attrs["sample_varying"] = False
            dset.attrs["time_varying"] = name == "time"

        bcs = f.create_group("boundary_conditions")
        kind = "periodic" if periodic else "open"
        for name, values in coords.items():
            low, high = boundaries[name] if boundaries else (kind, kind)
            for bc_type in dict.fromkeys((low, high)):  # one group per type on this axis
                bc = bcs.create_group(f"{name}_{bc_type.lower()}")
                bc.attrs["associated_dims"] = [name]
                bc.attrs["associated_fields"] = []
                bc.attrs["bc_type"] = bc_type
                bc.attrs["sample_varying"] = False
                bc.attrs["time_varying"] = False
                mask = np.zeros(len(values), dtype=bool)
                mask[0], mask[-1] = low == bc_type, high == bc_type  # the boundary cells of this type
                bc.create_dataset("mask", data=mask)

        scalars = f.create_group("scalars")
        scalars.attrs["field_names"] = list(constant_scalars)
        for name, value in constant_scalars.items():
            dset = scalars.create_dataset(name, data=np.array(value, dtype=np.float32))
            dset.attrs["time_varying"] = False
            dset.attrs["sample_varying"] = False

        for order, fields in enumerate((t0_fields, t1_fields, t2_fields)):
            _field_group(f, order, fields, time_varying)
    return path
