"""Find, check and load a dataset of The Well.

`open_dataset` turns what a participant typed (`--data-dir`, `--dataset`,
`--download`) into a dataset folder that is known to be complete, or a one-line
error that says what to do. `well_datasets` builds the_well's own `WellDataset`
for each split, z-score normalized with the dataset's `stats.yaml`.
"""
from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import yaml

from wellfno.cli import UserError
from wellfno.grayscott import EMBEDDED, generate
from wellfno.wellformat import split_files

REQUIRED_STATS = ("mean", "std", "mean_delta", "std_delta")


def well_dataset_names() -> list[str]:
    from the_well.data.utils import WELL_DATASETS

    return list(WELL_DATASETS)


def unknown_dataset(name: str, known: list[str]) -> UserError:
    """One line: the name is unknown; the closest of the known names, else all of them."""
    by_lower = {k.lower(): k for k in known}
    # names that contain what was typed (a prefix, a part), then the most similar ones
    close = [k for k in by_lower if name.lower() in k] if len(name) >= 3 else []
    close += [k for k in difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.5)
              if k not in close]
    if close:
        hint = "did you mean " + " or ".join(by_lower[c] for c in close[:4]) + "?"
    else:
        hint = "known: " + ", ".join(known)
    return UserError(f"unknown dataset '{name}': {hint} (`python -m coursetools.standin --table` lists all)")


def locate(data_dir: str | Path, dataset: str) -> Path:
    """DATA_DIR/datasets/<dataset>, forgiving the two usual slips.

    The_well's downloader puts files in `<base>/datasets/<name>/`. People then
    pass `<base>/datasets` or `<base>/datasets/<name>` as the data folder and end
    up with `datasets/datasets`; both are accepted here.
    """
    data_dir = Path(data_dir).expanduser()
    if data_dir.name == dataset and (data_dir / "data").is_dir():
        return data_dir  # the dataset folder itself
    if data_dir.name == "datasets" and not (data_dir / "datasets").is_dir():
        return data_dir / dataset  # the datasets/ folder
    return data_dir / "datasets" / dataset


def check_dataset(dataset_dir: Path, splits=("train", "valid")) -> dict:
    """Complete and readable? Return the statistics; raise UserError otherwise."""
    grids = {}  # cells per spatial axis -> the first file with that grid
    for split in splits:
        files = split_files(dataset_dir, split)
        if not files:
            folder = dataset_dir / "data" / split
            raise UserError(f"no HDF5 files in {folder}: the dataset is incomplete "
                            f"(an interrupted or offline download leaves empty folders); download it again")
        for path in files:
            if path.stat().st_size == 0:
                raise UserError(f"{path} is empty (interrupted download?): delete it and download again")
            try:
                with h5py.File(path, "r") as f:
                    f.attrs["n_trajectories"], f["dimensions"]["time"].shape, f["t0_fields"].attrs["field_names"]
                    grid = tuple(f["dimensions"][axis].shape[-1] for axis in f["dimensions"].attrs["spatial_dims"])
            except (OSError, KeyError) as err:
                raise UserError(f"{path} is not a readable Well HDF5 file ({err.__class__.__name__}: {err}); "
                                f"delete it and download or generate it again") from None
            grids.setdefault(grid, path)
    if len(grids) > 1:
        raise mixed_grids(dataset_dir, grids)
    stats_path = dataset_dir / "stats.yaml"
    if not stats_path.is_file():
        raise UserError(f"{stats_path} is missing: compute it with `python stats.py {dataset_dir}`")
    try:
        stats = yaml.safe_load(stats_path.read_text())
    except yaml.YAMLError as err:
        raise UserError(f"{stats_path} is not valid YAML ({err.__class__.__name__}); "
                        f"recompute it with `python stats.py {dataset_dir}`") from None
    missing = [key for key in REQUIRED_STATS if not isinstance(stats, dict) or key not in stats]
    if missing:
        raise UserError(f"{stats_path} lacks {', '.join(missing)}: recompute it with `python stats.py {dataset_dir}`")
    first = split_files(dataset_dir, splits[0])[0]
    check_stats_cover_fields(first, stats, stats_path)
    check_uniform_grid(first)
    return stats


def mixed_grids(dataset_dir: Path, grids: dict) -> UserError:
    """One line for a dataset whose files have grids of different sizes (the_well's WellDataset
    stops on it with `AssertionError: Multiple resolutions found in specified path`)."""
    found = ", ".join(f"{'x'.join(map(str, grid))} in {path.parent.name}/{path.name}"
                      for grid, path in grids.items())
    if dataset_dir.name == EMBEDDED:
        redo = (f"generate it again, whole: `python -m wellfno.grayscott --data-dir "
                f"{dataset_dir.parent.parent} --size demo --force` (each size in its own --data-dir)")
    else:
        redo = "delete it and download it again into an empty --data-dir"
    return UserError(f"{dataset_dir} mixes grids of different sizes ({found}): files of another "
                     f"dataset were written into its folder; {redo}")


def check_stats_cover_fields(path: Path, stats: dict, stats_path: Path) -> None:
    """Every field of the files has its statistics (time-constant fields have no deltas), else one line."""
    with h5py.File(path, "r") as f:
        for order in range(3):
            group = f[f"t{order}_fields"]
            for name in group.attrs["field_names"]:
                keys = REQUIRED_STATS if group[name].attrs["time_varying"] else ("mean", "std")
                for key in keys:
                    if not isinstance(stats[key], dict) or name not in stats[key]:
                        raise UserError(f"{stats_path} has no '{key}' for field '{name}' (t{order}_fields/{name} "
                                        f"in {path.name}): the files and their statistics disagree; recompute "
                                        f"them with `python stats.py {stats_path.parent}`")


def check_uniform_grid(path: Path) -> None:
    """The FNO's FFT assumes equally spaced cells along every axis: refuse other grids in one line.

    Spherical and equiangular grids of equally spaced angles pass: the model sees them, as
    The Well's own benchmarks do, as arrays in index space.
    """
    with h5py.File(path, "r") as f:
        dims = f["dimensions"]
        for axis in dims.attrs["spatial_dims"]:
            coords = dims[axis][0] if dims[axis].attrs.get("sample_varying", False) else dims[axis][...]
            spacing = np.diff(np.asarray(coords, dtype=np.float64))
            if spacing.size > 1 and np.abs(spacing - spacing.mean()).max() > 0.01 * np.abs(spacing.mean()):
                raise UserError(f"{path.name}: the {axis} coordinates are not equally spaced (from "
                                f"{np.abs(spacing).min():.3g} to {np.abs(spacing).max():.3g}), and the FNO's FFT "
                                f"assumes a uniform grid: resample the data onto a uniform grid first, or use a "
                                f"model for irregular grids (e.g. neuralop's GINO)")


def download(data_dir: Path, dataset: str) -> None:
    """The Well's own downloader (curl under the hood). It exits 0 even offline, so check after."""
    print(f"Downloading {dataset} into {data_dir}/datasets with the-well-download ...", flush=True)
    cmd = [sys.executable, "-m", "the_well.utils.download", "--base-path", str(data_dir), "--dataset", dataset]
    subprocess.run(cmd, check=False)


def open_dataset(data_dir: str | Path, dataset: str = EMBEDDED, download_missing: bool = False) -> tuple[Path, dict]:
    """The folder of a complete dataset and its statistics (stats.yaml, read once); generate or download if asked."""
    if Path(data_dir).expanduser().exists() and not Path(data_dir).expanduser().is_dir():
        raise UserError(f"--data-dir {data_dir} is a file: pass the folder that holds datasets/")
    dataset_dir = locate(data_dir, dataset)
    data_root = dataset_dir.parent.parent
    present = (dataset_dir / "data").is_dir()
    if not present and dataset == EMBEDDED:
        print(f"{dataset} not found in {data_root}: generating it (demo size, under a minute)", flush=True)
        generate(data_root, "demo")
    elif not present or (download_missing and not split_files(dataset_dir, "train")):
        known = well_dataset_names()
        if dataset not in known:
            raise unknown_dataset(dataset, [EMBEDDED, *known])
        if not download_missing:
            raise UserError(f"{dataset} not found in {data_root}/datasets: add --download to fetch it from "
                            f"The Well (large), or point --data-dir at the folder that holds datasets/")
        download(data_root, dataset)
        for split in ("train", "valid", "test"):
            if not split_files(dataset_dir, split):
                raise UserError(f"the download of {dataset} left {dataset_dir / 'data' / split} empty "
                                f"(no network on this machine?): download on a login node with internet, "
                                f"then pass --data-dir")
    return dataset_dir, check_dataset(dataset_dir)


def resolve_dataset(data_dir: str | Path, dataset: str = EMBEDDED, download_missing: bool = False) -> Path:
    """The folder of a complete dataset (`open_dataset` without the statistics)."""
    return open_dataset(data_dir, dataset, download_missing)[0]


def trajectory_length(dataset_dir: Path, split: str) -> int:
    """The shortest trajectory (in saved frames) of a split."""
    lengths = []
    for path in split_files(dataset_dir, split):
        with h5py.File(path, "r") as f:
            lengths.append(f["dimensions"]["time"].shape[-1])
    return min(lengths)


def check_input_steps(dataset_dir: Path, n_steps_input: int, splits) -> None:
    """n_steps_input frames in and one out must fit in every trajectory of every split."""
    for split in splits:
        length = trajectory_length(dataset_dir, split)
        if n_steps_input + 1 > length:
            raise UserError(f"--n-steps-input {n_steps_input} is too long: the {split} trajectories have "
                            f"{length} frames, so at most {length - 1} input steps fit")


def well_datasets(dataset_dir: Path, n_steps_input: int = 1, splits=("train", "valid")) -> dict:
    """the_well's WellDataset per split: n_steps_input frames in, the next frame out, z-scored."""
    from the_well.data import WellDataset
    from the_well.data.normalization import ZScoreNormalization

    check_input_steps(dataset_dir, n_steps_input, splits)
    return {
        split: WellDataset(path=str(dataset_dir), well_split_name=split, n_steps_input=n_steps_input,
                           n_steps_output=1, use_normalization=True, normalization_type=ZScoreNormalization,
                           return_grid=False, boundary_return_type=None)
        for split in splits
    }


def rollout_dataset(dataset_dir: Path, n_steps_input: int, split: str = "valid", max_rollout_steps: int = 100):
    """Whole trajectories: the first n_steps_input frames in, the rest (at most max_rollout_steps) out."""
    from the_well.data import WellDataset
    from the_well.data.normalization import ZScoreNormalization

    return WellDataset(path=str(dataset_dir), well_split_name=split, n_steps_input=n_steps_input,
                       full_trajectory_mode=True, max_rollout_steps=max_rollout_steps, use_normalization=True,
                       normalization_type=ZScoreNormalization, return_grid=False, boundary_return_type=None)


def to_channels(fields):
    """(B, T, *spatial, C) -> (B, T*C, *spatial): time steps and channels stacked as channels, as FNO wants.

    Any number of spatial axes: The Well has 2-D and 3-D datasets.
    """
    return fields.movedim(-1, 2).flatten(1, 2)


def model_inputs(frames, constant_fields=None):
    """The model's input: frames (B, T, *spatial, C) as channels, then constant fields (B, *spatial, K).

    Fields that do not change in time (a material's density, a geometry mask) come once, after
    the frames, z-scored by WellDataset like every field: what the_well's own training code does
    (the_well.data.data_formatter.DefaultChannelsFirstFormatter), so a model trained here reads
    its inputs in the same order. NaNs become 0, as there (the_well: "in some cases (staircase),
    it's ok").
    """
    x = to_channels(frames)
    if constant_fields is not None:
        import torch

        x = torch.cat([x, constant_fields.movedim(-1, 1)], dim=1)
    return x.nan_to_num()


def batch_to_model(batch: dict, device, non_blocking: bool = False):
    """A WellDataset batch -> (inputs (B, T*C + K, *spatial), target (B, C, *spatial)) on `device`.

    Copy first, change the layout after, on the device: `.to()` then gets the DataLoader's own
    tensors, which are page-locked with pin_memory=True, so a non_blocking copy is asynchronous.
    Permuting on the host first would hand `.to()` a new pageable tensor: a synchronous copy.
    """
    inputs = batch["input_fields"].to(device, non_blocking=non_blocking)
    outputs = batch["output_fields"].to(device, non_blocking=non_blocking)
    constants = batch.get("constant_fields")  # WellDataset leaves the key out when there are none
    if constants is not None:
        constants = constants.to(device, non_blocking=non_blocking)
    return model_inputs(inputs, constants), to_channels(outputs[:, :1]).nan_to_num()


def load_stats(dataset_dir: Path) -> dict:
    return yaml.safe_load((Path(dataset_dir) / "stats.yaml").read_text())


def channel_names(dataset) -> list[str]:
    """Names of the channels in the order WellDataset stacks them (t0, then t1, then t2 fields)."""
    return [name for order in range(3) for name in dataset.field_names[order]]
