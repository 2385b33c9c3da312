"""Compare whole training scripts: the training samples/s each one reports, run round-robin.

    python profiling/compare_scripts.py --data-dir /tmp/demo_data --out runs/ex02 --scripts fno.py \\
        solutions/01_profiling/fno.py "solutions/02_data_pipeline/fno.py --num-workers 1"

Each entry of --scripts is a script path followed by its own options; --script-args are given to
every script (default: one epoch of 40 steps). The scripts run one after the other, `--repeats`
rounds, each round in the same order; each script's number is the best of its rounds (on a shared
machine interference only ever slows a run down). Every run writes its metrics.json to
OUT/scripts/<index>_round<round>/, and the comparison goes to OUT/scripts.json (exercise 02's
results table; the results notebook plots it) and to stdout as a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from profiling.throughput import machine
from wellfno import data
from wellfno.cli import UserError, atomic_write_json, run_main
from wellfno.device import pick_device


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=os.environ.get("WELL_DATA", "data"),
                   help="folder that holds datasets/ (default $WELL_DATA or ./data)")
    p.add_argument("--dataset", default=data.EMBEDDED)
    p.add_argument("--out", default="runs/scripts", help="output folder")
    p.add_argument("--scripts", nargs="+", required=True, metavar="'SCRIPT [OPTIONS]'",
                   help="training scripts to compare, each a path followed by its own options")
    p.add_argument("--script-args", default="--epochs 1 --max-steps 40",
                   help="options given to every script (default: '--epochs 1 --max-steps 40')")
    p.add_argument("--repeats", type=int, default=2, help="round-robin rounds; each number is the best round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", help="also write the comparison to this results file (coursetools.results)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        raise UserError("--repeats must be at least 1")
    args.commands = []
    for entry in args.scripts:
        words = shlex.split(entry)
        if not words or not Path(words[0]).is_file():
            raise UserError(f"--scripts: no script '{words[0] if words else entry}' (give a path, then its options)")
        args.commands.append(words)
    return args


def compare(args, out: Path, info: dict) -> dict:
    """Each script's training samples/s (its metrics.json), best of --repeats round-robin rounds."""
    best = [0.0] * len(args.commands)
    for round_ in range(args.repeats):
        for i, words in enumerate(args.commands):
            run_dir = out / "scripts" / f"{i}_round{round_}"
            cmd = [sys.executable, words[0], "--data-dir", str(args.data_dir), "--dataset", args.dataset,
                   "--out", str(run_dir), "--seed", str(args.seed), *shlex.split(args.script_args), *words[1:]]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode:
                last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise UserError(f"`{shlex.join(cmd)}` failed: {last}")
            rate = json.loads((run_dir / "metrics.json").read_text())["samples_per_second"]
            best[i] = max(best[i], rate)
            print(f"round {round_ + 1}/{args.repeats}: {rate:8.1f} samples/s  {' '.join(words)}", flush=True)
    rows = [dict(command=" ".join(words), samples_per_s=rate, vs_first=rate / best[0])
            for words, rate in zip(args.commands, best)]
    print(f"\n| script | samples/s | vs {rows[0]['command']} |\n|---|---:|---:|")
    for row in rows:
        print(f"| `{row['command']}` | {row['samples_per_s']:.1f} | {row['vs_first']:.2f}x |")
    report = dict(machine=info, script_args=args.script_args, repeats=args.repeats, rows=rows)
    atomic_write_json(out / "scripts.json", report)
    print(f"Wrote {out / 'scripts.json'}")
    return report


def main(argv=None):
    args = parse_args(argv)
    data.resolve_dataset(args.data_dir, args.dataset)  # a missing dataset is one line, before any run
    # The scripts pick their own device (--device auto); record what they will see.
    report = compare(args, Path(args.out), machine(pick_device("auto")))
    if args.results:
        from benchtools.resultfiles import write_result
        write_result(args.results, shlex.join(["python", "profiling/compare_scripts.py", *(argv if argv is not None else sys.argv[1:])]), report)


if __name__ == "__main__":
    run_main(main)
