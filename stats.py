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
from wellfno.stats import CHUNK_BYTES, compute_dataset_stats, write_stats_yaml


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset_dir", type=Path, help="folder that holds data/train/")
    parser.add_argument("--out", type=Path, help="output file (default: DATASET_DIR/stats.yaml)")
    parser.add_argument("--split", default="train", help="split to summarize (default: train)")
    parser.add_argument("--chunk-mb", type=float, default=CHUNK_BYTES / 2**20,
                        help="MiB of one field read at a time; bounds memory (default: %(default)s)")
    args = parser.parse_args()
    started = time.perf_counter()
    stats = compute_dataset_stats(args.dataset_dir, args.split, int(args.chunk_mb * 2**20))
    out = write_stats_yaml(stats, args.out or args.dataset_dir / "stats.yaml")
    print(f"wrote {out} in {time.perf_counter() - started:.2f} s")
    return 0


if __name__ == "__main__":
    run_main(main)
