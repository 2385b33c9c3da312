"""Exercise 04 benchmark, one run, ratios side by side: read limit, serial, distributed, dask.

    python solutions/04_distributed_stats/benchmark.py                       # synthetic 2 GB dataset
    python solutions/04_distributed_stats/benchmark.py --dataset-dir data/datasets/gray_scott_embedded \
        --ranks 1,2,4,8,16 --dask-workers 16                                  # a real node
    python solutions/04_distributed_stats/benchmark.py ... --json results/04_stats_benchmark.json
        # the results file exercise 04's README table is generated from (python -m coursetools.results render)

Rows:
- raw read: h5py reads every byte of the train split in the work items' chunks, no arithmetic
  (1 process, and N processes for the largest N): the limit for any statistics code;
- serial stats.py (target: >= 0.8 of the 1-process raw read);
- the distributed solution under torchrun with each N of --ranks (scaling efficiency vs N = 1);
- the dask version with --dask-workers threads.
Everything reads from the page cache after a warm-up read (cold-disk numbers depend on the
filesystem; on Lustre/GPFS the raw-read row moves and the ratios tell you what to expect).
"Script s" is the time the program reports for itself; "wall s" adds interpreter start,
`import torch` and process-group setup. GB/s and ratios use script seconds; each row is the
fastest of --repeat runs (other work on a shared node only ever adds time).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import h5py
import numpy as np
import yaml

from wellfno.cli import UserError, run_main
from benchtools.resultfiles import caption, read_result, write_result
from wellfno.stats import benchmark_markdown, max_relative_difference, plan_dataset, rank_ranges
from wellfno.wellformat import write_well_file

HERE = Path(__file__).resolve().parent


def synthetic_dataset(root: Path, gigabytes: float) -> Path:
    """Well-format files like the large Gray-Scott size (2 fields, 128 x 128, 100 frames), random values."""
    n_time, res, per_file = 100, 128, 8
    traj_bytes = 2 * n_time * res * res * 4
    n_traj = max(1, round(gigabytes * 1e9 / traj_bytes))
    rng = np.random.default_rng(0)
    for i, start in enumerate(range(0, n_traj, per_file)):
        n = min(per_file, n_traj - start)
        write_well_file(root / "data" / "train" / f"synthetic_{i:03d}.hdf5", dataset_name="synthetic",
                        time=np.arange(n_time, dtype=np.float32), coords={"x": np.arange(res), "y": np.arange(res)},
                        t0_fields={"A": rng.random((n, n_time, res, res), dtype=np.float32),
                                   "B": (1e4 + rng.standard_normal((n, n_time, res, res), dtype=np.float32))},
                        constant_scalars={"F": 0.03})
    return root


def read_range(args) -> float:
    """Read items [start, stop) exactly as the statistics code slices them, no arithmetic; return seconds."""
    dataset_dir, start, stop = args
    plan = plan_dataset(dataset_dir)
    started = time.perf_counter()
    n_bytes, current, f = 0, None, None
    for item in plan.items[start:stop]:
        if item.file_index != current:
            if f is not None:
                f.close()
            f, current = h5py.File(plan.files[item.file_index], "r"), item.file_index
        for spec in plan.fields:
            if spec.time_varying and spec.sample_varying:
                n_bytes += f[spec.h5path][item.trajectory, max(item.t_start - 1, 0):item.t_stop].nbytes
            elif item.with_constant_fields:
                n_bytes += f[spec.h5path][item.trajectory].nbytes
    if f is not None:
        f.close()
    return time.perf_counter() - started


def raw_read(dataset_dir: Path, processes: int) -> float:
    """Seconds of the slowest reader (process start-up excluded, like the statistics' script seconds)."""
    plan = plan_dataset(dataset_dir)
    jobs = [(dataset_dir, a, b) for a, b in rank_ranges(plan, processes)]
    if processes == 1:
        return read_range(jobs[0])
    with mp.get_context("spawn").Pool(processes) as pool:
        return max(pool.map(read_range, jobs))


def best_of(repeat: int, measure):
    """The fastest of `repeat` runs: noise from other work on the node only ever adds time."""
    return min((measure() for _ in range(repeat)), key=lambda r: r[0] if isinstance(r, tuple) else r)


def timed(cmd: list[str], pattern: str) -> tuple[float, float, str]:
    """Run cmd; return (seconds the script reports, wall seconds, stdout)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    started = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if r.returncode != 0:
        raise UserError(f"{' '.join(cmd[:4])}... failed: {r.stderr.strip().splitlines()[-1] if r.stderr else r.returncode}")
    match = re.search(pattern, r.stdout)
    return (float(match.group(1)) if match else wall), wall, r.stdout





def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset-dir", type=Path, help="a Well dataset (default: write a synthetic one)")
    parser.add_argument("--synthetic-gb", type=float, default=2.0, help="size of the synthetic train split")
    parser.add_argument("--work-dir", type=Path, help="where the synthetic dataset goes (default: a temp dir)")
    parser.add_argument("--ranks", default="1,2", help="comma-separated world sizes for torchrun (default 1,2)")
    parser.add_argument("--dask-workers", type=int, help="dask threads (default: the largest of --ranks)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the fastest counts (default 3)")
    parser.add_argument("--json", type=Path, default=ROOT / "runs" / "04_stats_benchmark.json",
                        help="results file to write (default: %(default)s)")
    parser.add_argument("--table", type=Path, metavar="JSON",
                        help="only print the table of an earlier results file, measure nothing")
    args = parser.parse_args()
    if args.table is not None:
        result = read_result(args.table)
        print(benchmark_markdown(result["data"]) + "\n\n" + caption(result))
        return 0
    if args.repeat < 1 or args.synthetic_gb <= 0:
        raise UserError("--repeat must be at least 1 and --synthetic-gb positive")
    load_at_start = os.getloadavg()[0]
    try:
        ranks = [int(r) for r in args.ranks.split(",")]
    except ValueError:
        raise UserError(f"--ranks {args.ranks!r}: give world sizes separated by commas, e.g. 1,2,4") from None
    if min(ranks) < 1:
        raise UserError(f"--ranks {args.ranks!r}: world sizes must be at least 1")
    dask_workers = args.dask_workers or max(ranks)

    tmp = None
    if args.dataset_dir is None:
        tmp = tempfile.TemporaryDirectory(dir=args.work_dir)
        print(f"writing a synthetic {args.synthetic_gb} GB dataset in {tmp.name} ...", flush=True)
        dataset_dir = synthetic_dataset(Path(tmp.name), args.synthetic_gb)
    else:
        dataset_dir = args.dataset_dir
    try:
        plan = plan_dataset(dataset_dir)
        n_bytes = sum(item.n_bytes for item in plan.items)
        gb = n_bytes / 1e9
        out_dir = Path(tempfile.mkdtemp(prefix="stats_bench_"))
        raw_read(dataset_dir, 1)  # warm the page cache: every row reads the same cached bytes
        rows = []

        def add(name, seconds, wall, ranks_used):
            rows.append({"name": name, "ranks": ranks_used, "seconds": seconds, "wall_seconds": wall,
                         "gb_per_s": gb / seconds})
            print(f"  {name:34s} {seconds:7.2f} s  ({gb / seconds:.2f} GB/s)", flush=True)

        rep = args.repeat
        t = best_of(rep, lambda: raw_read(dataset_dir, 1))
        add("raw read, 1 process", t, t, 1)
        if max(ranks) > 1:
            t = best_of(rep, lambda: raw_read(dataset_dir, max(ranks)))
            add(f"raw read, {max(ranks)} processes", t, t, max(ranks))
        s, w, _ = best_of(rep, lambda: timed([sys.executable, "stats.py", str(dataset_dir), "--out",
                                              str(out_dir / "serial.yaml")], r"in ([0-9.]+) s"))
        add("serial stats.py", s, w, 1)
        for n in ranks:
            s, w, _ = best_of(rep, lambda: timed(
                [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
                 str(HERE / "stats.py"), str(dataset_dir), "--out", str(out_dir / f"dist{n}.yaml"),
                 "--backend", "gloo"], r"rank\(s\) .*?, ([0-9.]+) s \("))
            add(f"distributed, {n} rank(s) (torchrun)", s, w, n)
        s, w, _ = best_of(rep, lambda: timed([sys.executable, str(HERE / "dask_stats.py"), str(dataset_dir), "--out",
                                              str(out_dir / "dask.yaml"), "--workers", str(dask_workers)],
                                             r"in ([0-9.]+) s"))
        add(f"dask, {dask_workers} threads", s, w, dask_workers)

        serial = yaml.safe_load((out_dir / "serial.yaml").read_text())
        agreement = {p.stem: max_relative_difference(yaml.safe_load(p.read_text()), serial)
                     for p in sorted(out_dir.glob("*.yaml")) if p.stem != "serial"}
        identical = {p.stem: p.read_bytes() == (out_dir / "serial.yaml").read_bytes()
                     for p in sorted(out_dir.glob("dist*.yaml"))}
    finally:
        if tmp is not None:
            tmp.cleanup()

    raw1 = rows[0]["seconds"]
    dist1 = next((r["seconds"] for r in rows if r["name"].startswith("distributed") and r["ranks"] == 1), None)
    for r in rows:
        r["vs_raw_read"] = raw1 / r["seconds"]
        if r["name"].startswith("distributed") and dist1:
            r["scaling_efficiency"] = dist1 / r["seconds"] / r["ranks"]
    command = "python solutions/04_distributed_stats/benchmark.py " + shlex.join(sys.argv[1:])
    data = {"load_average_at_start": round(load_at_start, 2), "load_average_at_end": round(os.getloadavg()[0], 2),
            "dataset": {"path": str(args.dataset_dir or "synthetic"), "gigabytes": gb,
                        "items": len(plan.items), "files": len(plan.files)},
            "rows": rows, "max_rel_diff_vs_serial": agreement, "bitwise_identical_to_serial": identical}
    print()
    print(benchmark_markdown(data))
    write_result(args.json, command.strip(), data)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    run_main(main)
