"""Stand-ins for The Well's 23 datasets, written from their published metadata.

    python -m coursetools.standin --dataset MHD_64 --data-dir ./data [--steps 12 --trajectories 2 --scale 0.25]
    python -m coursetools.standin --table      # the README's dataset table
    python -m coursetools.standin --check /shared/well/datasets/turbulent_radiative_layer_2D   # a download

writes DATA_DIR/datasets/NAME/ exactly as `the-well-download` lays it out
(`stats.yaml`, `data/{train,valid,test}/<the real file names>.hdf5`) and in The
Well's HDF5 format: the dataset's name, dimensions, grid type, fields by tensor
order with their stored names, constant fields, constant scalars, boundary
conditions, and its real `stats.yaml`. The values are synthetic: smooth random
fields with each component's published mean and std, evolving in time with the
published std of one-step differences, so normalization, statistics and
training behave as on the real data (the physics does not). Only time steps,
trajectories, files and (with --scale) resolution are cut; each file says what
was cut in its root attributes. Use it to rehearse a dataset's jobs and to test
the course on every layout before a multi-GB download finishes.
"""
from __future__ import annotations

import argparse
import re
import shutil
from importlib.resources import files as package_files
from pathlib import Path

import numpy as np
import yaml

from wellfno.cli import UserError, atomic_write_text, run_main
from wellfno.fastwell import layout_support
from wellfno.memory import available_ram
from wellfno.wellformat import SPLITS, write_well_file
from coursetools.wellmeta import (Layout, check_files, dataset_names, frame_bytes, layout, published_stats,
                              published_stats_text)

NOTE = ("synthetic stand-in written by coursetools.standin from The Well's published metadata and stats.yaml: "
        "smooth random fields at the published mean, std and std of one-step differences, not simulation data")
# Smoothness of the random fields: spectral Gaussian cut-off in cycles per domain, so small grids stay smooth.
CUTOFF_CYCLES = 4.0
MIN_CELLS = 4


def registry_file_names(name: str) -> dict[str, list[str]]:
    """The real file names per split, from the_well's download registry."""
    registry = yaml.safe_load((package_files("the_well.utils") / "registry.yaml").read_text())
    entry = registry.get(name, {})
    return {split: [url.rsplit("/", 1)[-1] for url in entry.get(split, [])] for split in SPLITS}


def scalar_from_file_name(scalar: str, file_name: str) -> float | None:
    """Real files are named after their parameters (MHD_Ma_0.7_Ms_0.5.hdf5): read one back, if there."""
    match = re.search(rf"(?:^|_){re.escape(scalar)}_(-?[0-9.]+(?:e-?[0-9]+)?)(?=_|\.h)", file_name)
    try:
        return float(match.group(1)) if match else None
    except ValueError:
        return None


def scaled_resolution(resolution: tuple[int, ...], scale: float) -> tuple[int, ...]:
    return tuple(max(MIN_CELLS, int(round(n * scale))) for n in resolution)


def smooth_noise(rng: np.random.Generator, shape: tuple[int, ...], n_spatial: int) -> np.ndarray:
    """Unit-variance Gaussian random fields, smooth over the last n_spatial axes (periodic, low-pass in Fourier)."""
    spatial = shape[-n_spatial:]
    axes = tuple(range(-n_spatial, 0))
    k2 = np.zeros([n // 2 + 1 if i == n_spatial - 1 else n for i, n in enumerate(spatial)])
    for i, n in enumerate(spatial):
        freq = (np.fft.rfftfreq(n) if i == n_spatial - 1 else np.fft.fftfreq(n)) * n  # cycles per domain
        cutoff = min(CUTOFF_CYCLES, n / 8)  # at least 8 cells per wavelength on a coarse grid
        k2 = k2 + (freq.reshape([-1 if j == i else 1 for j in range(n_spatial)]) / cutoff) ** 2
    noise = rng.standard_normal(shape)
    field = np.fft.irfftn(np.fft.rfftn(noise, axes=axes) * np.exp(-k2 / 2), s=spatial, axes=axes)
    field -= field.mean(axis=axes, keepdims=True)
    return field / np.maximum(field.std(axis=axes, keepdims=True), 1e-12)


def component_series(rng, n_traj: int, n_steps: int, res: tuple[int, ...], mean: float, std: float,
                     mean_delta: float, std_delta: float) -> np.ndarray:
    """(n_traj, n_steps, *res) float32: mean + drift + std * z, z an AR(1) process of smooth fields.

    z[t+1] = rho z[t] + sqrt(1 - rho^2) e[t] keeps unit variance; its one-step differences have
    std sqrt(2 (1 - rho)), so rho = 1 - (std_delta / std)^2 / 2 reproduces the published std_delta
    (clipped to [0, 1) where the published ratio is out of an AR(1)'s reach).
    """
    ratio = std_delta / std if std > 0 else 0.0
    rho = float(np.clip(1.0 - ratio**2 / 2.0, 0.0, 0.999))
    z = smooth_noise(rng, (n_traj, *res), len(res))
    out = np.empty((n_traj, n_steps, *res), dtype=np.float32)
    centred_time = np.arange(n_steps) - (n_steps - 1) / 2
    for t in range(n_steps):
        if t:
            z = rho * z + np.sqrt(1 - rho**2) * smooth_noise(rng, (n_traj, *res), len(res))
        out[:, t] = mean + mean_delta * centred_time[t] + std * z
    return out


def field_values(rng, lay: Layout, stats: dict, core: str, order: int, n_traj: int, n_steps: int | None,
                 res: tuple[int, ...]) -> np.ndarray:
    """One field at its published statistics: (n_traj, [n_steps,] *res, [d, [d]]) float32."""
    d = lay.n_spatial_dims
    components = list(np.ndindex(*(d,) * order))
    steps = n_steps or 1
    out = np.empty((n_traj, steps, *res, *(d,) * order), dtype=np.float32)
    for comp in components:
        def stat(key, default=0.0):
            table = stats.get(key, {})
            return float(np.asarray(table[core], dtype=float)[comp]) if core in table else default
        std = stat("std", 1.0)
        out[(..., *comp)] = component_series(rng, n_traj, steps, res, stat("mean"), std,
                                             stat("mean_delta"), stat("std_delta", std))
    return out if n_steps else out[:, 0]


def coordinates(lay: Layout, res: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Cell centres of a uniform grid: angles in radians (theta in [0, pi], phi in [0, 2 pi)), else [0, 1]."""
    extent = {"theta": np.pi, "phi": 2 * np.pi}
    return {name: ((np.arange(n) + 0.5) / n * extent.get(name, 1.0)).astype(np.float32)
            for name, n in zip(lay.spatial_dims, res)}


def write_standin(data_dir: str | Path, name: str, *, steps: int = 12, trajectories: int = 2, files: int = 1,
                  scale: float = 1.0, seed: int = 0) -> Path:
    """Write DATA_DIR/datasets/NAME/{stats.yaml, data/<split>/*.hdf5}; return the dataset folder."""
    lay = layout(name)  # unknown names end here, with close matches
    if steps < 2:
        raise UserError("--steps must be at least 2 (one input frame and one target)")
    if trajectories < 1 or files < 1:
        raise UserError("--trajectories and --files must be at least 1")
    if not 0 < scale <= 1:
        raise UserError(f"--scale {scale} must be in (0, 1]: a fraction of the real resolution {lay.resolution}")
    res = scaled_resolution(lay.resolution, scale)
    stats = published_stats(name)
    dataset_dir = Path(data_dir) / "datasets" / name
    names = registry_file_names(name)

    cells = int(np.prod(res))
    per_file = (lay.n_channels * steps + lay.n_constant_channels) * cells * trajectories * 4
    total = per_file * files * len(SPLITS)
    existing = next(folder for folder in (dataset_dir, *dataset_dir.parents) if folder.exists())
    free = shutil.disk_usage(existing).free  # nothing is created before the checks pass
    if total > free:
        raise UserError(f"the stand-in needs {total / 1e9:.1f} GB and {dataset_dir} has {free / 1e9:.1f} GB free: "
                        f"use --scale, --steps or --trajectories to cut it down")
    ram = available_ram()
    if per_file > ram // 4:  # a file is made in memory (plus float64 noise): stay well clear of swapping
        raise UserError(f"one stand-in file is {per_file / 1e9:.1f} GB, made in memory, and {ram / 1e9:.1f} GB "
                        f"of RAM is available: use --scale, --steps or --trajectories to cut it to a quarter of that")
    cut = (f"n_steps_per_trajectory {max(lay.n_steps)} -> {steps}; trajectories per file -> {trajectories}; "
           f"files per split -> {files}; spatial_resolution {list(lay.resolution)} -> {list(res)}")
    rng = np.random.default_rng(seed)
    for split in SPLITS:
        real = names[split] or [f"{name}_{i:02d}.hdf5" for i in range(files)]
        for index in range(files):
            file_name = real[index] if index < len(real) else f"{Path(real[0]).stem}_standin_{index}.hdf5"
            fields = {o: {} for o in range(3)}
            time_varying = {}
            for order in range(3):
                for core in lay.fields[order]:
                    fields[order][core] = field_values(rng, lay, stats, core, order, trajectories, steps, res)
                for core in lay.constant_fields[order]:
                    fields[order][core] = field_values(rng, lay, stats, core, order, trajectories, None, res)
                    time_varying[core] = False
            scalars = {}
            for scalar in lay.constant_scalars:
                value = scalar_from_file_name(scalar, file_name)
                scalars[scalar] = 1.0 if value is None else value
            write_well_file(dataset_dir / "data" / split / file_name, dataset_name=name,
                            time=np.arange(steps, dtype=np.float32), coords=coordinates(lay, res),
                            t0_fields=fields[0], t1_fields=fields[1], t2_fields=fields[2],
                            time_varying=time_varying, constant_scalars=scalars, boundaries=lay.boundaries,
                            grid_type=lay.grid_type,
                            attrs={"standin": NOTE, "standin_cut": cut,
                                   "standin_original_spatial_resolution": list(lay.resolution)})
    atomic_write_text(dataset_dir / "stats.yaml", published_stats_text(name))
    return dataset_dir


# --- the README table -------------------------------------------------------------------------------------------

def _size(n_bytes: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n_bytes < 1000:
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1000
    return f"{n_bytes:.1f} PB"


def dataset_table() -> str:
    """Markdown table of the 23 datasets, from the metadata alone (README: `python -m coursetools.standin --table`)."""
    rows = ["| dataset | dims | resolution | grid | fields (t0; t1; t2) | constant fields | boundaries "
            "| steps | frame | trajectory | fast reader |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in dataset_names():
        lay = layout(name)
        fields = "; ".join(", ".join(lay.fields[o]) or "-" for o in range(3))
        constant = ", ".join(c for o in range(3) for c in lay.constant_fields[o]) or "-"
        bounds = ", ".join(f"{d}: {lo.lower()}" if lo == hi else f"{d}: {lo.lower()}/{hi.lower()}"
                           for d, (lo, hi) in lay.boundaries.items())
        steps = "/".join(str(s) for s in sorted(set(lay.n_steps)))
        frame = frame_bytes(lay)
        rows.append(f"| `{name}` | {lay.n_spatial_dims} | {' x '.join(map(str, lay.resolution))} | {lay.grid_type} "
                    f"| {fields} | {constant} | {bounds} | {steps} | {_size(frame)} | {_size(frame * max(lay.n_steps))} "
                    f"| {layout_support(lay)} |")
    return "\n".join(rows) + "\n"


TABLE_START = "<!-- datasets table: generated by `python -m coursetools.standin --table` -->\n"
TABLE_END = "<!-- end of datasets table -->\n"


def readme_table(text: str) -> str:
    """The table between the README's markers."""
    if TABLE_START not in text or TABLE_END not in text:
        raise UserError(f"the README has no dataset table markers ({TABLE_START.strip()} ... {TABLE_END.strip()})")
    return text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0]


def write_table(readme: Path) -> None:
    text = readme.read_text()
    old = readme_table(text)
    atomic_write_text(readme, text.replace(TABLE_START + old + TABLE_END, TABLE_START + dataset_table() + TABLE_END))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--dataset", help="a Well dataset name (see --table)")
    parser.add_argument("--data-dir", default="data", help="folder that holds datasets/ (default ./data)")
    parser.add_argument("--steps", type=int, default=12, help="time steps per trajectory (default 12)")
    parser.add_argument("--trajectories", type=int, default=2, help="trajectories per file (default 2)")
    parser.add_argument("--files", type=int, default=1, help="files per split (default 1)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of the real resolution per axis, e.g. 0.25 (default 1: the real one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table", nargs="?", const="-", metavar="README",
                        help="print the table of the 23 datasets, or write it into README between its markers")
    parser.add_argument("--check", metavar="DATASET_DIR",
                        help="check a downloaded (or stand-in) dataset folder against The Well's metadata")
    args = parser.parse_args(argv)
    if args.table == "-":
        print(dataset_table(), end="")
        return
    if args.table:
        write_table(Path(args.table))
        print(f"Wrote the dataset table into {args.table}")
        return
    if args.check:
        folder = Path(args.check)
        problems = check_files(folder, args.dataset or folder.name)
        if problems:
            raise UserError(f"{folder} differs from The Well's metadata of {args.dataset or folder.name} in "
                            f"{len(problems)} place(s), first: {problems[0]}")
        print(f"{folder} matches The Well's metadata of {args.dataset or folder.name} (fields, shapes, dtypes, "
              f"attributes, boundaries, stats.yaml)")
        return
    if not args.dataset:
        raise UserError("give --dataset NAME (or --table to list the 23 datasets)")
    lay = layout(args.dataset)
    res = scaled_resolution(lay.resolution, args.scale)
    print(f"Writing a stand-in for {args.dataset} ({lay.n_spatial_dims}-D, {' x '.join(map(str, res))}, "
          f"{args.steps} steps, {args.trajectories} trajectories x {args.files} file(s) per split) "
          f"in {Path(args.data_dir) / 'datasets' / args.dataset}")
    out = write_standin(args.data_dir, args.dataset, steps=args.steps, trajectories=args.trajectories,
                        files=args.files, scale=args.scale, seed=args.seed)
    print(f"Wrote {out}")


if __name__ == "__main__":
    run_main(main)
