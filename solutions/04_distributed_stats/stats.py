"""Dataset statistics with torch.distributed: the serial stats.py's stats.yaml, bit for bit, N times faster.

    torchrun --nproc_per_node=N solutions/04_distributed_stats/stats.py DATASET_DIR [--out FILE]
    srun --ntasks=N python solutions/04_distributed_stats/stats.py DATASET_DIR [--out FILE]
    python solutions/04_distributed_stats/stats.py DATASET_DIR          # one process

What changes from the serial stats.py (exercise 04):
1. Work items: every rank plans the same items (file, trajectory, time chunk); their size
   depends on the data and --chunk-mb, never on the number of ranks.
2. Split: each rank takes a contiguous range of items with near-equal bytes. Every item
   belongs to exactly one rank for any world size: no padding, no duplicates.
3. Local reduce: a rank reduces its range to at most 128 aligned blocks of the fixed merge
   tree: a fixed-size float64 tensor, however much data it read.
4. Merge: one all_gather of that tensor; rank 0 rebuilds the tree the serial script builds,
   so stats.yaml is bitwise identical to the serial one, for any number of ranks.
Failures (wellfno.watchdog): a rank that raises or dies ends every rank within seconds, and one
line names it; rank 0 writes stats.yaml, atomically, only when every rank succeeded.
"""
from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

import torch
import torch.distributed as dist

from wellfno.cli import UserError, run_main
from wellfno.device import BACKEND_CHOICES, pick_backend
from wellfno.launch import launch_environment
from wellfno.moments import combine_blocks, pack_blocks, unpack_blocks
from wellfno.stats import (CHUNK_BYTES, plan_dataset, plan_fingerprint, rank_ranges, reduce_range,
                           stats_from_moments, stats_output, write_stats_yaml)
from wellfno.watchdog import Watchdog, check_same_on_every_rank


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
            # 1. work items, and 2. this rank's share of them
            plan = plan_dataset(args.dataset_dir, args.split, int(args.chunk_mb * 2**20))
            start, stop = rank_ranges(plan, env.world_size)[env.rank]
            # 3. local reduce: the aligned blocks of the fixed merge tree that tile [start, stop)
            blocks = reduce_range(plan, start, stop, before_item=watchdog.step).as_dict()
            computed = time.perf_counter()
            watchdog.wait_for_all()  # collectives only once every rank has read its share
            check_same_on_every_rank(plan_fingerprint(plan), "dataset (files, fields or work items)",
                                     "; point every rank at the same dataset", device)
            # 4. merge: one fixed-size tensor per rank; rank 0 rebuilds the serial tree
            packed = torch.from_numpy(pack_blocks(blocks, plan.n_channels)).to(device)
            gathered = [torch.empty_like(packed) for _ in range(env.world_size)]
            if env.is_distributed:
                dist.all_gather(gathered, packed)
            else:
                gathered = [packed]
            if env.rank == 0:
                every_block = unpack_blocks(torch.stack(gathered).cpu().numpy(), plan.n_channels)
                total = combine_blocks(every_block, len(plan.items), plan.n_channels)
                write_stats_yaml(stats_from_moments(plan, total), out)
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
