"""Exercise 04 starter: make the serial stats.py parallel with torch.distributed (see README.md).

    python exercises/04_distributed_stats/stats_parallel.py DATASET_DIR --out FILE              # one process
    torchrun --standalone --nproc_per_node=3 exercises/04_distributed_stats/stats_parallel.py DATASET_DIR --out FILE
    srun --ntasks=3 python exercises/04_distributed_stats/stats_parallel.py DATASET_DIR --out FILE

The launcher plumbing is done: rank and world size from torchrun or srun, the process group
(gloo: statistics are CPU work), and a watchdog that ends every rank when one fails. As it
stands, every rank reads the whole dataset and rank 0 writes what it alone computed: right
numbers, no speed-up. The TODOs are the lesson. Check your work with

    .venv/bin/python -m pytest -q tests/test_stats_distributed.py --script exercises/04_distributed_stats/stats_parallel.py
"""
from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

import torch  # noqa: F401 - for TODO 3
import torch.distributed as dist

from wellfno.cli import UserError, run_main
from wellfno.device import BACKEND_CHOICES, pick_backend
from wellfno.launch import launch_environment
from wellfno.moments import combine_blocks, pack_blocks, unpack_blocks  # noqa: F401 - for TODO 3
from wellfno.stats import (CHUNK_BYTES, plan_dataset, plan_fingerprint, rank_ranges, reduce_range,  # noqa: F401
                           stats_from_moments, stats_output, write_stats_yaml)
from wellfno.watchdog import Watchdog, check_same_on_every_rank  # noqa: F401 - for TODO 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset_dir", type=Path, help="folder that holds data/train/")
    parser.add_argument("--out", type=Path, help="output file (default: DATASET_DIR/stats.yaml)")
    parser.add_argument("--split", default="train", help="split to summarize (default: train)")
    parser.add_argument("--chunk-mb", type=float, default=CHUNK_BYTES / 2**20,
                        help="MiB of one field read at a time (default: %(default)s); same as stats.py's")
    parser.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                        help="auto: gloo (statistics are CPU work); nccl only when asked")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a rank may go without progress, or wait in a collective (default: 300)")
    args = parser.parse_args()
    if args.timeout <= 0:
        raise UserError(f"--timeout {args.timeout} must be positive: seconds, e.g. 300")
    out = stats_output(args.out, args.dataset_dir)
    started = time.perf_counter()

    env = launch_environment()  # torchrun's or srun's variables; rank 0 of 1 without a launcher
    backend, device = pick_backend(args.backend, env.local_rank, env.local_world_size, prefer_gpu=False)
    if env.is_distributed:
        env.export_rendezvous()
        try:
            dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                                    timeout=datetime.timedelta(seconds=args.timeout))
        except Exception as err:  # noqa: BLE001 - e.g. a peer never arrived
            raise UserError(f"rank {env.rank}: cannot join the process group ({err.__class__.__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else ''})") from None
    try:
        with Watchdog(env.rank, env.world_size, stall_after_s=args.timeout) as watchdog:
            # The work items: (file, trajectory, time chunk). Every rank plans the same list.
            plan = plan_dataset(args.dataset_dir, args.split, int(args.chunk_mb * 2**20))

            # TODO 1 (split): this rank reads only its share of plan.items. Every item exactly once
            # over all ranks, for any world size (3 ranks and 17 items too), a rank may get none.
            start, stop = 0, len(plan.items)

            # TODO 2 (local reduce): nothing to change if TODO 1 gives a contiguous range; why?
            blocks = reduce_range(plan, start, stop, before_item=watchdog.step).as_dict()
            computed = time.perf_counter()
            watchdog.wait_for_all()  # collectives only once every rank has read its share

            # TODO 3 (merge): rank 0 needs every rank's blocks. They must travel as one tensor of the
            # same shape on every rank (all_gather). Then rebuild the tree over all items.
            every_block = blocks
            if env.rank == 0:
                total = combine_blocks(every_block, len(plan.items), plan.n_channels)
                write_stats_yaml(stats_from_moments(plan, total), out)

            # TODO 4 (bonus): before merging, check that every rank planned the same items.
            watchdog.wait_for_all()  # every rank exits non-zero if rank 0 could not write
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if env.rank == 0:
        n_bytes, elapsed = sum(item.n_bytes for item in plan.items), time.perf_counter() - started
        print(f"wrote {out}: {len(plan.items)} items, {n_bytes / 1e9:.3f} GB, {env.world_size} rank(s) "
              f"({env.launcher}, {backend if env.is_distributed else 'no process group'}), {elapsed:.2f} s "
              f"({computed - started:.2f} s reading), {n_bytes / 1e9 / max(elapsed, 1e-9):.2f} GB/s")
    return 0


if __name__ == "__main__":
    run_main(main)
