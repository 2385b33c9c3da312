"""The same statistics with dask.array: the "just call .mean() / .std() on the lazy arrays" way.

    python solutions/04_distributed_stats/dask_stats.py DATASET_DIR [--out FILE] [--workers N]

The comparison point of exercise 04. Every field of every train file becomes a dask
array over its HDF5 dataset; dask's `mean` and `var` (float64, chunk-wise moments
merged by dask) give values and one-step differences; files are merged with Chan's
formula. Threads on one node: HDF5 reads are serialized by h5py's lock.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path


import dask
import dask.array as da
import h5py
import numpy as np

from wellfno.cli import UserError, run_main
from wellfno.moments import empty_moments, merge
from wellfno.stats import CHUNK_BYTES, plan_dataset, stats_from_moments, write_stats_yaml


def lazy_moments(x: da.Array, order: int):
    """(count, mean, var) per component of a lazy array, reduced over all but the last `order` axes."""
    axes = tuple(range(x.ndim - order))
    count = float(np.prod([x.shape[a] for a in axes]))
    return count, x.mean(axis=axes, dtype=np.float64).reshape(-1), x.var(axis=axes, dtype=np.float64).reshape(-1)


def compute(dataset_dir: Path, split: str, workers: int) -> dict:
    plan = plan_dataset(dataset_dir, split)  # the checks and the channel layout; the numbers come from dask
    files = [h5py.File(p, "r") for p in plan.files]
    try:
        lazy = []  # (file index, channel slice, count, mean, var)
        for fi, f in enumerate(files):
            for spec in plan.fields:
                dset = f[spec.h5path]
                frame = int(np.prod(dset.shape[2:])) * dset.dtype.itemsize if spec.time_varying else 1
                chunks = (1, max(1, CHUNK_BYTES // max(frame, 1))) if spec.time_varying else (1,)
                x = da.from_array(dset, chunks=chunks + dset.shape[len(chunks):], lock=True)
                if not spec.sample_varying:
                    x = x[np.newaxis]
                lazy.append((fi, plan.value_slices[spec.name], *lazy_moments(x, spec.order)))
                if spec.time_varying:
                    x64 = x.astype(np.float64)
                    lazy.append((fi, plan.delta_slices[spec.name], *lazy_moments(x64[:, 1:] - x64[:, :-1], spec.order)))
        results = dask.compute([(m, v) for *_, m, v in lazy], scheduler="threads", num_workers=workers)[0]
    finally:
        for f in files:
            f.close()
    per_file = [empty_moments(plan.n_channels) for _ in files]
    for (fi, channels, count, _, _), (mean, var) in zip(lazy, results):
        per_file[fi][:, channels] = np.stack([np.full_like(mean, count), mean, var * count])
    total = empty_moments(plan.n_channels)
    for m in per_file:
        total = merge(total, m)
    return stats_from_moments(plan, total)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset_dir", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--split", default="train")
    parser.add_argument("--workers", type=int, default=1, help="dask threads (default: 1)")
    args = parser.parse_args()
    if args.workers < 1:
        raise UserError("--workers must be at least 1")
    started = time.perf_counter()
    stats = compute(args.dataset_dir, args.split, args.workers)
    out = write_stats_yaml(stats, args.out or args.dataset_dir / "stats.yaml")
    print(f"wrote {out} with dask ({args.workers} threads) in {time.perf_counter() - started:.2f} s")
    return 0


if __name__ == "__main__":
    run_main(main)
