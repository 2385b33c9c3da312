"""The embedded dataset: 2-D Gray-Scott reaction-diffusion in The Well's format.

The Well's `gray_scott_reaction_diffusion` (154 GB) simulates

    dA/dt = D_A lap(A) - A B^2 + F (1 - A)
    dB/dt = D_B lap(B) + A B^2 - (F + k) B

on a periodic square with D_A = 2e-5, D_B = 1e-5 and six (F, k) regimes. We run
the same equations with the same coefficients and the same grid spacing (128
cells on [-1, 1]), so a 32 x 32 grid is a 32-cell-wide periodic patch that
forms the same patterns at the same size in cells. The solver is pseudo-spectral
and semi-implicit: diffusion exactly in Fourier space, reaction explicitly
(first-order IMEX, the standard scheme for this system).

    python -m wellfno.grayscott --data-dir ./data --size demo

A dataset is written whole or not at all: into a temporary folder beside its place, renamed
when complete. A dataset already there is kept if it is the one asked for, refused in one line
if it is another (another size, seed or setting: pass another --data-dir, or --force to replace
it whole), so sizes never mix in one folder (the_well refuses mixed grids with an
AssertionError).
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from wellfno.cli import UserError, check_output_dir, run_main
from wellfno.wellformat import SPLITS, write_well_file

EMBEDDED = "gray_scott_embedded"  # the dataset this module writes; --dataset default of every script
D_A, D_B = 2e-5, 1e-5
DX = 2.0 / 128  # The Well's grid spacing

# The six regimes of The Well's gray_scott_reaction_diffusion (name: F, k).
REGIMES = {
    "gliders": (0.014, 0.054),
    "bubbles": (0.098, 0.057),
    "maze": (0.029, 0.057),
    "worms": (0.058, 0.065),
    "spirals": (0.018, 0.051),
    "spots": (0.030, 0.062),
}


@dataclass(frozen=True)
class Size:
    resolution: int
    n_traj: dict  # split -> trajectories per regime
    n_steps: int  # saved frames per trajectory
    save_every: float  # time between saved frames
    burn_in: float  # simulated time before the first saved frame
    regimes: tuple = tuple(REGIMES)
    dt: float = 1.0


SIZES = {
    # seconds to generate; for tests
    "tiny": Size(16, {"train": 2, "valid": 1, "test": 1}, 12, 20.0, 200.0, ("maze", "spots")),
    # about a minute of FNO training on 2 CPU cores
    "demo": Size(32, {"train": 6, "valid": 2, "test": 2}, 40, 20.0, 200.0),
    # for data-loading work on a node: The Well's resolution (128 x 128), several GB
    "large": Size(128, {"train": 16, "valid": 2, "test": 2}, 201, 10.0, 0.0),
}


def initial_condition(rng: np.random.Generator, n: int, resolution: int) -> tuple[np.ndarray, np.ndarray]:
    """Smooth random patches of B in an A = 1, B = 0 background, plus 1% noise.

    A low-pass-filtered Gaussian random field, thresholded, seeds B (as Pearson's
    1993 square seeds do) in blobs of random size and number.
    """
    freqs = np.fft.fftfreq(resolution)  # cycles per cell: blobs of the same size in cells at any resolution
    radius2 = freqs[:, None] ** 2 + freqs[None, :] ** 2
    noise = np.fft.fft2(rng.standard_normal((n, resolution, resolution)))
    smooth = np.fft.ifft2(noise * np.exp(-radius2 / (2 * (1 / 16) ** 2))).real
    smooth /= smooth.std(axis=(1, 2), keepdims=True)
    threshold = rng.uniform(0.0, 1.0, size=(n, 1, 1))  # fraction of the domain seeded varies
    seeded = smooth > threshold
    # Seeds sit near the B-rich uniform state of the 'bubbles' regime (A, B) = (0.43, 0.36),
    # which every regime's patterns can grow from; Pearson's (0.5, 0.25) dies out there.
    a = np.where(seeded, 0.43, 1.0) + 0.01 * rng.standard_normal(smooth.shape)
    b = np.where(seeded, 0.36, 0.0) + 0.01 * rng.standard_normal(smooth.shape)
    return a, b


def simulate(a: np.ndarray, b: np.ndarray, F: float, k: float, *, n_steps: int, save_every: float,
             burn_in: float = 0.0, dt: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Integrate a batch of trajectories (n, H, W); return frames (n, n_steps, H, W) of A and B.

    Frame 0 is the state after `burn_in`; frame j is `j * save_every` later.
    """
    resolution = a.shape[-1]
    wavenumbers = 2 * np.pi * np.fft.fftfreq(resolution, d=DX)
    k2 = wavenumbers[:, None] ** 2 + wavenumbers[None, :] ** 2
    implicit_a = 1.0 / (1.0 + dt * D_A * k2)
    implicit_b = 1.0 / (1.0 + dt * D_B * k2)
    steps_per_frame = int(round(save_every / dt))
    burn_in_steps = int(round(burn_in / dt))

    def step(a, b):
        reaction = a * b * b
        a_next = np.fft.ifft2(np.fft.fft2(a + dt * (-reaction + F * (1 - a))) * implicit_a).real
        b_next = np.fft.ifft2(np.fft.fft2(b + dt * (reaction - (F + k) * b)) * implicit_b).real
        return a_next, b_next

    for _ in range(burn_in_steps):
        a, b = step(a, b)
    frames_a = np.empty((a.shape[0], n_steps) + a.shape[1:], dtype=np.float32)
    frames_b = np.empty_like(frames_a)
    for j in range(n_steps):
        if j:
            for _ in range(steps_per_frame):
                a, b = step(a, b)
        frames_a[:, j], frames_b[:, j] = a, b
    return frames_a, frames_b


def simulate_patterns(rng: np.random.Generator, spec: Size, F: float, k: float, n: int, tries: int = 10):
    """`n` trajectories whose pattern survives to the last frame.

    In the low-feed regimes (gliders, spirals) a small seed can die out and leave
    the uniform state A = 1, B = 0: a dull trajectory. Those are drawn again.
    """
    kept_a, kept_b = [], []
    for _ in range(tries):
        a0, b0 = initial_condition(rng, n, spec.resolution)
        frames_a, frames_b = simulate(a0, b0, F, k, n_steps=spec.n_steps, save_every=spec.save_every,
                                      burn_in=spec.burn_in, dt=spec.dt)
        alive = frames_b[:, -1].std(axis=(1, 2)) > 1e-3
        kept_a += list(frames_a[alive])
        kept_b += list(frames_b[alive])
        if len(kept_a) >= n:
            return np.stack(kept_a[:n]), np.stack(kept_b[:n])
    raise UserError(f"patterns died out in regime F={F}, k={k} in every one of {tries} draws; "
                    f"try another --seed")


RECORD = "generator.json"  # in the dataset folder: the settings it was made with (readers skip it)


def settings(spec: Size, seed: int) -> dict:
    """What makes one dataset differ from another: every field of the size, and the seed."""
    return {**json.loads(json.dumps(asdict(spec))), "seed": seed}  # through JSON: tuples as lists


def size_name(record: dict) -> str:
    """tiny, demo or large; `custom` when an option (--resolution, --n-steps, --n-train) set it."""
    return next((name for name, spec in SIZES.items() if settings(spec, record["seed"]) == record),
                "custom")


def describe(record: dict | None) -> str:
    if record is None:
        return "made without a record of its settings: by an older version, or copied there"
    return (f"size {size_name(record)}: {record['resolution']}x{record['resolution']}, "
            f"{record['n_steps']} frames, seed {record['seed']}")


def read_record(dataset_dir: Path) -> dict | None:
    try:
        return json.loads((dataset_dir / RECORD).read_text())
    except (FileNotFoundError, ValueError):
        return None


def legacy_matches(dataset_dir: Path, wanted: dict) -> bool:
    """A dataset an earlier version wrote, with no record: is it, file by file, the one `wanted`
    describes (one file per regime and split, each with the split's trajectories, all frames at
    the wanted grid)? Then `make data` again keeps it, as it did; a mixed or other one is not."""
    import h5py

    from wellfno.wellformat import split_files

    for split in SPLITS:
        files = split_files(dataset_dir, split)
        if len(files) != len(wanted["regimes"]):
            return False
        for path in files:
            try:
                with h5py.File(path, "r") as f:
                    shapes = {tuple(a.shape) for a in f["t0_fields"].values()}
            except (OSError, KeyError):
                return False
            grid = (wanted["resolution"],) * 2
            if shapes != {(wanted["n_traj"][split], wanted["n_steps"], *grid)}:
                return False
    return True


def existing_dataset(dataset_dir: Path, wanted: dict, force: bool) -> bool:
    """True when `dataset_dir` already holds the dataset `wanted` describes; a UserError when it
    holds another one and `force` is not given; False when there is none (or force)."""
    if not dataset_dir.exists() or (dataset_dir.is_dir() and not any(dataset_dir.iterdir())):
        return False
    record = read_record(dataset_dir) if dataset_dir.is_dir() else None
    if not force and (record == wanted or (record is None and legacy_matches(dataset_dir, wanted))):
        return True
    if not dataset_dir.is_dir():
        raise UserError(f"{dataset_dir} is a file, not a dataset folder: move it away, or pass "
                        f"another --data-dir")
    if not force:
        raise UserError(f"{dataset_dir} already holds another dataset ({describe(record)}), not "
                        f"the one asked for ({describe(wanted)}): pass another --data-dir (e.g. "
                        f"--data-dir data_{size_name(wanted)}), or --force to replace the whole "
                        f"dataset")
    return False


def install(tmp_dir: Path, dataset_dir: Path, wanted: dict) -> None:
    """Rename the complete dataset `tmp_dir` onto `dataset_dir` (whatever was there moved aside
    first and deleted after), so a reader sees the old dataset, the new one or none, never a mix."""
    old = None
    if dataset_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dataset_dir.name}.old-", dir=dataset_dir.parent))
        os.replace(dataset_dir, old / dataset_dir.name)
    try:
        os.rename(tmp_dir, dataset_dir)
    except OSError as err:  # another process (a second rank, a second pytest worker) was first
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        if read_record(dataset_dir) != wanted:
            raise UserError(f"{dataset_dir} was written by another process at the same time, with "
                            f"other settings ({describe(read_record(dataset_dir))}): generate one "
                            f"dataset per --data-dir at a time") from None
        shutil.rmtree(tmp_dir)  # the same dataset (the generator is deterministic): keep theirs
    if old is not None:
        shutil.rmtree(old)


def generate(data_dir: str | Path, size: str | Size = "demo", seed: int = 0, *, name: str = EMBEDDED,
             quiet: bool = False, force: bool = False) -> Path:
    """Write DATA_DIR/datasets/<name>/{data/<split>/*.hdf5, stats.yaml}; return the dataset folder.

    Nothing to do if the same dataset is there; a UserError if another one is (unless `force`).
    """
    spec = SIZES[size] if isinstance(size, str) else size
    dataset_dir = Path(data_dir) / "datasets" / name
    wanted = settings(spec, seed)
    if existing_dataset(dataset_dir, wanted, force):
        if not quiet:
            print(f"{dataset_dir} already holds this dataset ({describe(wanted)}): nothing to do "
                  f"(--force writes it again)")
        return dataset_dir
    if not quiet:
        print(f"Generating {name} ({describe(wanted)}) in {dataset_dir}", flush=True)
    dataset_dir.parent.mkdir(parents=True, exist_ok=True)
    # Beside its place (one file system, so the rename is atomic), hidden from readers by the dot.
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=dataset_dir.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_dir, 0o777 & ~umask)  # mkdtemp makes 0700: the usual permissions (shared data)
        write_dataset(tmp_dir, spec, seed, name, quiet)
        (tmp_dir / RECORD).write_text(json.dumps(wanted, indent=2) + "\n")
        install(tmp_dir, dataset_dir, wanted)
    except BaseException:  # an error, Ctrl-C: no half-written dataset is left behind
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    if not quiet:
        print(f"Wrote {dataset_dir}")
    return dataset_dir


def write_dataset(dataset_dir: Path, spec: Size, seed: int, name: str, quiet: bool) -> None:
    from wellfno.stats import compute_dataset_stats, write_stats_yaml

    coords = (np.arange(spec.resolution) + 0.5) * DX - spec.resolution * DX / 2  # cell centres
    time_grid = spec.burn_in + spec.save_every * np.arange(spec.n_steps)
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    for regime in spec.regimes:
        F, k = REGIMES[regime]
        for split in SPLITS:
            frames_a, frames_b = simulate_patterns(rng, spec, F, k, spec.n_traj[split])
            path = dataset_dir / "data" / split / f"{name}_{regime}_F_{F}_k_{k}.hdf5"
            write_well_file(path, dataset_name=name, time=time_grid, coords={"x": coords, "y": coords},
                            t0_fields={"A": frames_a, "B": frames_b}, constant_scalars={"F": F, "k": k})
        if not quiet:
            print(f"  {regime:8s} F={F} k={k}: {sum(spec.n_traj.values())} trajectories "
                  f"({time.perf_counter() - start:.1f} s)")
    write_stats_yaml(compute_dataset_stats(dataset_dir), dataset_dir / "stats.yaml")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="data", help="folder that holds datasets/ (default ./data)")
    parser.add_argument("--size", choices=list(SIZES), default="demo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resolution", type=int, help="override the grid size (cells per side)")
    parser.add_argument("--n-steps", type=int, help="override the saved frames per trajectory")
    parser.add_argument("--n-train", type=int, help="override the training trajectories per regime")
    parser.add_argument("--force", action="store_true",
                        help="replace a dataset of other settings already in --data-dir (whole)")
    args = parser.parse_args(argv)
    spec = SIZES[args.size]
    check_output_dir(args.data_dir, "--data-dir")
    if args.resolution is not None:
        if args.resolution < 8:
            raise UserError("--resolution must be at least 8 cells")
        spec = replace(spec, resolution=args.resolution)
    if args.n_steps is not None:
        if args.n_steps < 2:
            raise UserError("--n-steps must be at least 2 frames")
        spec = replace(spec, n_steps=args.n_steps)
    if args.n_train is not None:
        if args.n_train < 1:
            raise UserError("--n-train must be at least 1 trajectory")
        spec = replace(spec, n_traj={**spec.n_traj, "train": args.n_train})
    generate(args.data_dir, spec, args.seed, force=args.force)


if __name__ == "__main__":
    run_main(main)
