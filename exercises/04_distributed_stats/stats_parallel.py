"""Exercise 04 starter: make the serial stats.py parallel with torch.distributed (see README.md).

    cp exercises/04_distributed_stats/stats_parallel.py my_stats.py      # your own file
    .venv/bin/python my_stats.py DATASET_DIR --out FILE                      # one process
    .venv/bin/torchrun --standalone --nproc_per_node=3 my_stats.py DATASET_DIR --out FILE
    srun --ntasks=3 .venv/bin/python my_stats.py DATASET_DIR --out FILE

The launcher plumbing is done: rank and world size from torchrun or srun, the process group
(gloo: statistics are CPU work), and a watchdog that ends every rank when one fails. Reading an
item's values from HDF5 is done too (`reduce_range`). The idea is yours to write: the TODOs.
The helpers in wellfno/ are one answer to compare with once yours works (`rank_ranges` in
wellfno/stats.py, `merge` and `combine_blocks` in wellfno/moments.py). Check your work with

    .venv/bin/python -m pytest -q tests/test_stats_distributed.py --script YOUR_FILE
"""
from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

import numpy as np
import torch  # noqa: F401 - for TODO 3
import torch.distributed as dist

from wellfno.cli import UserError, run_main
from wellfno.device import BACKEND_CHOICES, pick_backend
from wellfno.launch import launch_environment
from wellfno.stats import (CHUNK_BYTES, plan_dataset, reduce_range, stats_from_moments,
                           stats_output, write_stats_yaml)
from wellfno.watchdog import Watchdog


def split_items(n_items: int, world_size: int) -> list[tuple[int, int]]:
    """TODO 1 (task 3): one contiguous range (start, stop) of item indices per rank.

    Every item in exactly one range, for any world size (3 ranks and 17 items too); ranks get
    about the same number of items; a rank may get none (start == stop).
    """
    return [(0, n_items)] * world_size  # as it stands: every rank reads everything


def chan_merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """TODO 2 (task 4): merge two summaries of disjoint sets of values, per channel.

    a and b are float64 arrays of shape (3, C): rows count, mean, M2 (the sum of squared
    deviations from the mean) of each of C channels. Return the (3, C) summary of both sets
    together (Chan et al.): n = na + nb; d = mb - ma; mean = ma + d * nb / n;
    M2 = M2a + M2b + d**2 * na * nb / n. A channel with count 0 on one side is the other side.
    """
    raise UserError("chan_merge in your stats_parallel.py is not written yet (exercise 04, task 4)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset_dir", type=Path, help="folder that holds data/train/")
    parser.add_argument("--out", type=Path, help="output file (default: DATASET_DIR/stats.yaml)")
    parser.add_argument("--split", default="train", help="split to summarize (default: train)")
    parser.add_argument("--chunk-mb", type=float, default=CHUNK_BYTES / 2**20,
                        help="MiB of one field read at a time (default: %(default)s), "
                             "as stats.py's")
    parser.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                        help="auto: gloo (statistics are CPU work); nccl only when asked")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a rank may go without progress, or wait in a collective "
                             "(default: 300)")
    args = parser.parse_args()
    if args.timeout <= 0:
        raise UserError(f"--timeout {args.timeout} must be positive: seconds, e.g. 300")
    out = stats_output(args.out, args.dataset_dir)
    started = time.perf_counter()

    env = launch_environment()  # torchrun's or srun's variables; rank 0 of 1 without a launcher
    backend, device = pick_backend(args.backend, env.local_rank, env.local_world_size,
                                   prefer_gpu=False)
    if env.is_distributed:
        env.export_rendezvous()
        try:
            dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                                    timeout=datetime.timedelta(seconds=args.timeout))
        except Exception as err:  # noqa: BLE001 - e.g. a peer never arrived
            first = str(err).splitlines()[0] if str(err) else ""
            raise UserError(f"rank {env.rank}: cannot join the process group "
                            f"({err.__class__.__name__}: {first})") from None
    try:
        with Watchdog(env.rank, env.world_size, stall_after_s=args.timeout) as watchdog:
            # The work items: (file, trajectory, time chunk). Every rank plans the same list.
            plan = plan_dataset(args.dataset_dir, args.split, int(args.chunk_mb * 2**20))
            start, stop = split_items(len(plan.items), env.world_size)[env.rank]

            # Read items [start, stop): (count, mean, M2) per channel of a few blocks of
            # consecutive items (keys (level, index): items index * 2**level onwards).
            blocks = reduce_range(plan, start, stop, before_item=watchdog.step).as_dict()
            local = np.zeros((3, plan.n_channels))  # count 0: the empty summary
            for level, index in sorted(blocks, key=lambda key: key[1] << key[0]):
                local = chan_merge(local, blocks[(level, index)])
            computed = time.perf_counter()
            watchdog.wait_for_all()  # collectives only once every rank has read its share

            # TODO 3 (task 5): rank 0 needs every rank's `local`, in rank order. Send them as
            # tensors of the same shape on every rank (one all_gather), not as Python objects.
            every_local = [local]  # as it stands: rank 0 has only its own
            if env.rank == 0:
                total = np.zeros((3, plan.n_channels))
                for part in every_local:
                    total = chan_merge(total, part)
                write_stats_yaml(stats_from_moments(plan, total), out)
            watchdog.wait_for_all()  # every rank exits non-zero if rank 0 could not write
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if env.rank == 0:
        n_bytes, elapsed = sum(item.n_bytes for item in plan.items), time.perf_counter() - started
        print(f"wrote {out}: {len(plan.items)} items, {n_bytes / 1e9:.3f} GB, "
              f"{env.world_size} rank(s) ({env.launcher}), {elapsed:.2f} s "
              f"({computed - started:.2f} s reading)")
    return 0


if __name__ == "__main__":
    run_main(main)
