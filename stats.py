"""Dataset statistics of a Well dataset's train split -> stats.yaml (serial baseline of exercise 04).

    python stats.py DATASET_DIR [--out FILE]

DATASET_DIR is the folder that holds data/train/ (e.g. data/datasets/gray_scott_embedded).
Writes the_well's stats.yaml (mean, std, rms and their *_delta per field, plus loss_weight),
by default DATASET_DIR/stats.yaml. One process reads every file in turn; exercise 04 makes
this parallel (solutions/04_distributed_stats/stats.py).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from wellfno.cli import run_main
from wellfno.moments import combine_blocks
from wellfno.stats import CHUNK_BYTES, plan_dataset, reduce_range, stats_from_moments, stats_output, write_stats_yaml


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset_dir", type=Path, help="folder that holds data/train/")
    parser.add_argument("--out", type=Path, help="output file (default: DATASET_DIR/stats.yaml)")
    parser.add_argument("--split", default="train", help="split to summarize (default: train)")
    parser.add_argument("--chunk-mb", type=float, default=CHUNK_BYTES / 2**20,
                        help="MiB of one field read at a time; bounds memory (default: %(default)s)")
    args = parser.parse_args()
    started = time.perf_counter()
    out = stats_output(args.out, args.dataset_dir)

    # The work items: (file, trajectory, time chunk), checked and listed; the same for everyone.
    plan = plan_dataset(args.dataset_dir, args.split, int(args.chunk_mb * 2**20))
    # Read every item, reduce each to float64 (count, mean, M2) per channel, merged along a fixed tree.
    blocks = reduce_range(plan, 0, len(plan.items)).as_dict()
    total = combine_blocks(blocks, len(plan.items), plan.n_channels)

    write_stats_yaml(stats_from_moments(plan, total), out)
    print(f"wrote {out} in {time.perf_counter() - started:.2f} s")
    return 0


if __name__ == "__main__":
    run_main(main)
