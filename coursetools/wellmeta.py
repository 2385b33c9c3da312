"""The Well's published metadata for its 23 datasets, and a format check against it.

`coursetools/well_metadata/` holds each dataset's `NAME.yaml` (dimensions, resolution,
grid, field names by tensor order, constant fields and scalars, boundary types,
files, trajectories, steps) and `NAME.stats.yaml` (its published normalization
statistics), copied unchanged from github.com/PolymathicAI/the_well (see the
README there). From them `layout(NAME)` derives what the HDF5 files hold, and
`check_files` checks a dataset folder (a real download or a stand-in) against it:
every field, shape, dtype and attribute the_well's WellDataset relies on.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

import h5py
import numpy as np
import yaml

from wellfno.cli import UserError
from wellfno.data import unknown_dataset
from wellfno.wellformat import split_files

METADATA = files("coursetools") / "well_metadata"
STATS_KEYS = ("mean", "std", "mean_delta", "std_delta", "rms", "rms_delta")

# The metadata lists a dataset's boundary types as a set; which axis (and which
# end) has which type comes from each dataset's README in the_well's repository
# (datasets/NAME/README.md, "Boundary conditions"). Per axis: (low end, high end).
# Datasets with a single boundary type have it on every end and are not listed.
BOUNDARIES = {
    # "Open domain in y, reflective walls in x"
    "acoustic_scattering_discontinuous": {"x": ("WALL", "WALL"), "y": ("OPEN", "OPEN")},
    "acoustic_scattering_inclusions": {"x": ("WALL", "WALL"), "y": ("OPEN", "OPEN")},
    "acoustic_scattering_maze": {"x": ("WALL", "WALL"), "y": ("OPEN", "OPEN")},
    # spherical shells: open in radius and latitude, periodic in longitude
    "convective_envelope_rsg": {"r": ("OPEN", "OPEN"), "theta": ("OPEN", "OPEN"), "phi": ("PERIODIC", "PERIODIC")},
    "post_neutron_star_merger": {"log_r": ("OPEN", "OPEN"), "theta": ("OPEN", "OPEN"),
                                 "phi": ("PERIODIC", "PERIODIC")},
    "planetswe": {"theta": ("OPEN", "OPEN"), "phi": ("PERIODIC", "PERIODIC")},
    # sound-hard staircase below, radiating (open) above and at the sides
    "helmholtz_staircase": {"x": ("OPEN", "OPEN"), "y": ("WALL", "OPEN")},
    # horizontally periodic, walls at bottom and top
    "rayleigh_benard": {"x": ("PERIODIC", "PERIODIC"), "y": ("WALL", "WALL")},
    "rayleigh_benard_uniform": {"x": ("PERIODIC", "PERIODIC"), "y": ("WALL", "WALL")},
    "viscoelastic_instability": {"x": ("PERIODIC", "PERIODIC"), "y": ("WALL", "WALL")},
    "rayleigh_taylor_instability": {"x": ("PERIODIC", "PERIODIC"), "y": ("PERIODIC", "PERIODIC"),
                                    "z": ("WALL", "WALL")},
    # the mixing layer is periodic along it and open across it
    "turbulent_radiative_layer_2D": {"x": ("PERIODIC", "PERIODIC"), "y": ("OPEN", "OPEN")},
    "turbulent_radiative_layer_3D": {"x": ("PERIODIC", "PERIODIC"), "y": ("PERIODIC", "PERIODIC"),
                                     "z": ("OPEN", "OPEN")},
}


def dataset_names() -> list[str]:
    """The 23 datasets (the_well's WELL_DATASETS), sorted by name, case aside."""
    return sorted((p.name[: -len(".yaml")] for p in METADATA.iterdir()
                   if p.name.endswith(".yaml") and not p.name.endswith(".stats.yaml")), key=str.lower)


@lru_cache(maxsize=None)
def _read(name: str, kind: str) -> dict:
    if name not in dataset_names():
        raise unknown_dataset(name, dataset_names())
    return yaml.safe_load((METADATA / f"{name}{kind}").read_text())


def metadata(name: str) -> dict:
    return _read(name, ".yaml")


def published_stats(name: str) -> dict:
    return _read(name, ".stats.yaml")


def published_stats_text(name: str) -> str:
    return (METADATA / f"{name}.stats.yaml").read_text()


@dataclass(frozen=True)
class Layout:
    """What a dataset's HDF5 files hold, derived from its metadata."""

    name: str
    n_spatial_dims: int
    resolution: tuple[int, ...]
    grid_type: str
    spatial_dims: tuple[str, ...]  # names of the axes (dimensions/ datasets, suffixes of component names)
    fields: dict  # order -> core names of time-varying fields (`velocity`, not `velocity_x`)
    constant_fields: dict  # order -> core names of time-constant fields
    constant_scalars: tuple[str, ...]
    boundary_types: tuple[str, ...]  # the set, as the metadata lists it
    boundaries: dict  # axis -> (low type, high type)
    n_steps: tuple[int, ...]  # per trajectory, as published
    n_trajectories: int  # in the split the metadata describes

    def expanded(self, order: int, cores) -> list[str]:
        """WellDataset's channel names: `velocity` -> velocity_x, velocity_y (t2: D_xx, D_xy, ...)."""
        suffixes = ["".join(p) for p in itertools.product(self.spatial_dims, repeat=order)]
        return [f"{core}_{s}" if s else core for core in cores for s in suffixes]

    @property
    def n_channels(self) -> int:
        return sum(len(self.expanded(o, c)) for o, c in self.fields.items())

    @property
    def n_constant_channels(self) -> int:
        return sum(len(self.expanded(o, c)) for o, c in self.constant_fields.items())


def _cores(names: list[str], order: int, dims: tuple[str, ...]) -> list[str]:
    """Core field names from expanded ones (each core has len(dims)**order consecutive names)."""
    per_core = len(dims) ** order
    cores = []
    for i in range(0, len(names), per_core):
        group = names[i:i + per_core]
        suffix = "".join(dims[0] for _ in range(order))
        cores.append(group[0][: -(len(suffix) + 1)] if order else group[0])
    return cores


def _spatial_dims(meta: dict) -> tuple[str, ...]:
    """Axis names: the suffixes of the first vector field's components (velocity_log_r -> log_r), else x, y, z."""
    n = meta["n_spatial_dims"]
    for group in (meta["field_names"], meta["constant_field_names"]):
        vectors = group.get(1) or []
        if vectors:
            first = vectors[:n]
            prefix = os.path.commonprefix(first)
            prefix = prefix[: prefix.rfind("_") + 1]
            return tuple(name[len(prefix):] for name in first)
    return ("x", "y", "z")[:n]


def layout(name: str) -> Layout:
    meta = metadata(name)
    dims = _spatial_dims(meta)
    fields = {o: _cores(meta["field_names"].get(o) or [], o, dims) for o in range(3)}
    constant = {o: _cores(meta["constant_field_names"].get(o) or [], o, dims) for o in range(3)}
    types = tuple(meta["boundary_condition_types"])
    boundaries = BOUNDARIES.get(name) or {d: (types[0], types[0]) for d in dims}
    return Layout(name=name, n_spatial_dims=meta["n_spatial_dims"], resolution=tuple(meta["spatial_resolution"]),
                  grid_type=meta["grid_type"], spatial_dims=dims, fields=fields, constant_fields=constant,
                  constant_scalars=tuple(meta["constant_scalar_names"]), boundary_types=types,
                  boundaries=boundaries, n_steps=tuple(meta["n_steps_per_trajectory"]),
                  n_trajectories=sum(meta["n_trajectories_per_file"]))


def frame_bytes(lay: Layout) -> int:
    """Bytes of one saved frame of all time-varying fields (float32), what a model reads per step."""
    return 4 * lay.n_channels * int(np.prod(lay.resolution))


# --- the format check --------------------------------------------------------------------------------------------

def _names(attr) -> list[str]:
    return [a.decode() if isinstance(a, bytes) else str(a) for a in np.atleast_1d(attr)] if len(attr) else []


def _stats_shape(value) -> tuple[int, ...]:
    return np.shape(np.asarray(value, dtype=float))


def check_stats(stats, lay: Layout, where: str) -> list[str]:
    """stats.yaml has every statistic for every field, with one value per component."""
    if not isinstance(stats, dict):
        return [f"{where} is not a mapping of statistics"]
    problems = []
    for key in STATS_KEYS[:4]:  # what the_well's normalizers require
        if key not in stats:
            problems.append(f"{where} lacks '{key}'")
            continue
        wanted = [(o, c) for o, cs in lay.fields.items() for c in cs]
        if not key.endswith("_delta"):  # constant fields have no deltas
            wanted += [(o, c) for o, cs in lay.constant_fields.items() for c in cs]
        for order, core in wanted:
            if core not in stats[key]:
                problems.append(f"{where} has no '{key}' for field '{core}'")
            elif _stats_shape(stats[key][core]) != (lay.n_spatial_dims,) * order:
                problems.append(f"{where}: '{key}' of '{core}' has shape {_stats_shape(stats[key][core])}, "
                                f"expected {(lay.n_spatial_dims,) * order} (one value per component)")
    return problems


def check_file(path: Path, lay: Layout) -> list[str]:
    """Problems of one HDF5 file against the metadata ([] when it matches)."""
    problems = []

    def want(cond, text):
        if not cond:
            problems.append(f"{path.name}: {text}")
        return cond

    with h5py.File(path, "r") as f:
        attrs = f.attrs
        want(attrs.get("dataset_name") == lay.name, f"dataset_name {attrs.get('dataset_name')!r} != {lay.name!r}")
        want(attrs.get("n_spatial_dims") == lay.n_spatial_dims, f"n_spatial_dims {attrs.get('n_spatial_dims')}")
        want(attrs.get("grid_type") == lay.grid_type, f"grid_type {attrs.get('grid_type')!r} != {lay.grid_type!r}")
        n_traj = int(attrs.get("n_trajectories", 0))
        want(n_traj >= 1, "n_trajectories missing or < 1")
        want(set(_names(attrs.get("simulation_parameters", []))) == set(lay.constant_scalars),
             f"simulation_parameters {_names(attrs.get('simulation_parameters', []))} != {list(lay.constant_scalars)}")

        dims = f["dimensions"]
        spatial = tuple(_names(dims.attrs["spatial_dims"]))
        if not want(spatial == lay.spatial_dims, f"spatial_dims {spatial} != {lay.spatial_dims}"):
            return problems
        # A stand-in may be cut in resolution; it says so, and must then match what it says.
        expected_res = lay.resolution
        if "standin_original_spatial_resolution" in attrs:
            want(tuple(attrs["standin_original_spatial_resolution"]) == lay.resolution,
                 "standin_original_spatial_resolution differs from the metadata")
            expected_res = tuple(int(dims[d].shape[-1]) for d in spatial)
        res = tuple(int(dims[d].shape[-1]) for d in spatial)
        want(res == expected_res, f"resolution {res} != {expected_res}")
        for d in spatial:
            want(dims[d].dtype == np.float32 and dims[d].ndim == 1, f"dimensions/{d} is not 1-D float32")
        n_steps = int(dims["time"].shape[-1])
        want(n_steps >= 2, f"{n_steps} time steps (at least 2 needed)")

        bc_types = {str(g.attrs["bc_type"]) for g in f["boundary_conditions"].values()}
        want(bc_types == set(lay.boundary_types), f"boundary types {sorted(bc_types)} != {sorted(lay.boundary_types)}")
        for key, g in f["boundary_conditions"].items():
            assoc = _names(g.attrs["associated_dims"])
            want(set(assoc) <= set(spatial), f"boundary {key} on unknown axes {assoc}")
            if set(assoc) <= set(spatial):
                shape = tuple(len(dims[a]) for a in assoc)
                want(g["mask"].dtype == bool and g["mask"].shape == shape, f"boundary {key} mask is not bool {shape}")

        scalars = f["scalars"]
        want(set(_names(scalars.attrs["field_names"])) >= set(lay.constant_scalars),
             f"scalars/ lacks {sorted(set(lay.constant_scalars) - set(_names(scalars.attrs['field_names'])))}")
        for name in lay.constant_scalars:
            if name in scalars:
                want(not scalars[name].attrs["time_varying"], f"constant scalar {name} is time-varying")

        for order in range(3):
            group = f[f"t{order}_fields"]
            listed = _names(group.attrs["field_names"])
            varying = [n for n in listed if n in group and group[n].attrs["time_varying"]]
            constant = [n for n in listed if n in group and not group[n].attrs["time_varying"]]
            want(varying == lay.fields[order], f"t{order}_fields time-varying {varying} != {lay.fields[order]}")
            want(constant == lay.constant_fields[order],
                 f"t{order}_fields constant {constant} != {lay.constant_fields[order]}")
            for name in listed:
                if not want(name in group, f"t{order}_fields/{name} is listed but missing"):
                    continue
                dset = group[name]
                tv, sv = bool(dset.attrs["time_varying"]), bool(dset.attrs["sample_varying"])
                dim_varying = [bool(v) for v in np.atleast_1d(dset.attrs["dim_varying"])]
                want(len(dim_varying) == lay.n_spatial_dims, f"t{order}_fields/{name} dim_varying {dim_varying}")
                # The Well's spec drops the axes a field does not vary along (dim_varying False).
                shape = ((n_traj,) if sv else ()) + ((n_steps,) if tv else ()) \
                    + tuple(r for r, v in zip(res, dim_varying) if v) + (lay.n_spatial_dims,) * order
                want(dset.shape == shape, f"t{order}_fields/{name} has shape {dset.shape}, expected {shape}")
                want(dset.dtype == np.float32, f"t{order}_fields/{name} is {dset.dtype}, expected float32")
    return problems


def check_files(dataset_dir: str | Path, name: str | None = None, splits=("train", "valid", "test")) -> list[str]:
    """Every problem of a dataset folder against The Well's metadata and its stats.yaml ([] when it matches)."""
    dataset_dir = Path(dataset_dir)
    lay = layout(name or dataset_dir.name)
    problems = []
    for split in splits:
        paths = split_files(dataset_dir, split)
        if not paths:
            problems.append(f"no HDF5 files in data/{split}")
        for path in paths:
            problems += check_file(path, lay)
    stats_path = dataset_dir / "stats.yaml"
    if stats_path.is_file():
        problems += check_stats(yaml.safe_load(stats_path.read_text()), lay, "stats.yaml")
    else:
        problems.append("stats.yaml is missing")
    return problems
