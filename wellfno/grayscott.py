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
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from wellfno.cli import UserError, run_main
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
    raise RuntimeError(f"patterns died out in regime F={F}, k={k}; try another --seed")


def generate(data_dir: str | Path, size: str | Size = "demo", seed: int = 0, *, name: str = EMBEDDED,
             quiet: bool = False) -> Path:
    """Write DATA_DIR/datasets/<name>/{data/<split>/*.hdf5, stats.yaml}; return the dataset folder."""
    from wellfno.stats import compute_dataset_stats, write_stats_yaml

    spec = SIZES[size] if isinstance(size, str) else size
    dataset_dir = Path(data_dir) / "datasets" / name
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
    return dataset_dir


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="data", help="folder that holds datasets/ (default ./data)")
    parser.add_argument("--size", choices=list(SIZES), default="demo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resolution", type=int, help="override the grid size (cells per side)")
    parser.add_argument("--n-steps", type=int, help="override the saved frames per trajectory")
    parser.add_argument("--n-train", type=int, help="override the training trajectories per regime")
    args = parser.parse_args(argv)
    spec = SIZES[args.size]
    if args.resolution:
        if args.resolution < 8:
            raise UserError("--resolution must be at least 8 cells")
        spec = replace(spec, resolution=args.resolution)
    if args.n_steps:
        if args.n_steps < 2:
            raise UserError("--n-steps must be at least 2 frames")
        spec = replace(spec, n_steps=args.n_steps)
    if args.n_train:
        spec = replace(spec, n_traj={**spec.n_traj, "train": args.n_train})
    print(f"Generating {EMBEDDED} ({args.size}: {spec.resolution}x{spec.resolution}, "
          f"{spec.n_steps} frames) in {Path(args.data_dir) / 'datasets' / EMBEDDED}")
    out = generate(args.data_dir, spec, args.seed)
    print(f"Wrote {out}")


if __name__ == "__main__":
    run_main(main)
