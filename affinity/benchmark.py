"""When does CPU placement matter? Side-by-side measurements in one run.

    python affinity/benchmark.py                 # data pipeline + competing load (+ GPU if present)
    python affinity/benchmark.py --workers 4 --samples 400 --repeats 3
    python affinity/benchmark.py --out results/affinity_benchmark.json   # the README's table (coursetools.results)

1. Data pipeline: N DataLoader workers doing CPU-heavy per-sample work (FFTs, like decoding and
   augmenting a sample), no model. Throughput in samples/s for
     collapsed   the parent was pinned to one CPU before the workers forked (what an OpenMP
                 runtime binding the main thread, or a launcher giving the task one CPU, does):
                 every worker inherits that one CPU;
     worker_init_fn  same parent, but worker_init_fn=worker_init_fn(cpus) re-spreads the workers;
     unpinned    the parent may use all allowed CPUs, no pinning (the OS scheduler decides).
2. Competing load: one worker on the CPU a busy process also runs on, vs on a free CPU.
3. GPU-resident compute (only with a GPU): a training step whose data already lives on the GPU,
   with the process pinned to one CPU vs all allowed CPUs. The GPU does the work; the CPU only
   launches kernels, so placement barely matters. Every thread of the process moves between the
   conditions (all_threads_on): autograd starts a device thread at the first backward, and that
   thread would otherwise keep the one-CPU mask of the condition it was born in.
Runs are interleaved (A B C A B C ...) and the median is reported, so drift hits all alike.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager

from affinity.bind import set_affinity_all_threads, worker_init_fn
from affinity.discover import format_cpulist
from wellfno.cli import UserError, run_main
from benchtools.machine import cpu_model


class HeavySamples:
    """Each item costs a few ms of single-threaded CPU work (FFT round trips on a 2-D field)."""

    def __init__(self, n: int, size: int = 128, rounds: int = 24):
        self.n, self.size, self.rounds = n, size, rounds

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        g = torch.Generator().manual_seed(i)
        x = torch.randn(self.size, self.size, generator=g)
        for _ in range(self.rounds):
            x = torch.fft.irfft2(torch.fft.rfft2(x) * 0.5, s=x.shape).tanh()
        return x


@contextmanager
def all_threads_on(cpus):
    """Run the block with every thread of this process on `cpus` (threads started inside the
    block inherit them), then give each thread its mask back."""
    previous = set_affinity_all_threads(cpus, include_pinned=True)
    try:
        yield
    finally:
        for tid, mask in previous.items():
            try:
                os.sched_setaffinity(tid, mask)
            except OSError:  # the thread has exited
                pass


def time_loader(samples: int, workers: int, parent_cpus, worker_init) -> float:
    """Samples/s of a DataLoader whose parent runs on parent_cpus while the workers fork."""
    import torch
    original = os.sched_getaffinity(0)
    os.sched_setaffinity(0, parent_cpus)
    try:
        loader = torch.utils.data.DataLoader(HeavySamples(samples), batch_size=4, num_workers=workers,
                                             worker_init_fn=worker_init, prefetch_factor=2)
        it = iter(loader)
        next(it)  # worker start-up is not throughput
        start = time.perf_counter()
        n = 0
        for batch in it:
            n += batch.shape[0]
        return n / (time.perf_counter() - start)
    finally:
        os.sched_setaffinity(0, original)


def busy_loop(cpu: int, stop) -> None:
    os.sched_setaffinity(0, {cpu})
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def pipeline_table(args, allowed: list[int]) -> list[tuple[str, float]]:
    one = {allowed[0]}
    conditions = {
        "collapsed": (one, None),
        "worker_init_fn": (one, worker_init_fn(allowed)),
        "unpinned": (set(allowed), None),
    }
    results = {k: [] for k in conditions}
    for _ in range(args.repeats):
        for name, (parent, init) in conditions.items():
            results[name].append(time_loader(args.samples, args.workers, parent, init))
    return [(k, statistics.median(v)) for k, v in results.items()]


def competing_table(args, allowed: list[int]) -> list[tuple[str, float]]:
    import multiprocessing as mp
    busy_cpu, free_cpu = allowed[0], allowed[-1]
    stop = mp.Event()
    hog = mp.Process(target=busy_loop, args=(busy_cpu, stop), daemon=True)
    hog.start()
    try:
        results = {f"worker on busy CPU {busy_cpu}": [], f"worker on free CPU {free_cpu}": []}
        for _ in range(args.repeats):
            for name, cpu in zip(results, (busy_cpu, free_cpu)):
                # The parent runs on the free CPU in both cases; only the worker moves.
                results[name].append(time_loader(args.samples // 2, 1, {free_cpu}, worker_init_fn([cpu])))
    finally:
        stop.set()
        hog.join(timeout=5)
    return [(k, statistics.median(v)) for k, v in results.items()]


def gpu_table(args, allowed: list[int]) -> list[tuple[str, float]] | None:
    import torch
    if not torch.cuda.is_available():
        return None
    device = torch.device("cuda", 0)
    model = torch.nn.Sequential(*[torch.nn.Conv2d(32, 32, 3, padding=1) for _ in range(6)]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(16, 32, 128, 128, device=device)

    def steps_per_s(cpus) -> float:
        with all_threads_on(cpus):
            for _ in range(5):
                model(x).square().mean().backward()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.gpu_steps):
                opt.zero_grad(set_to_none=True)
                model(x).square().mean().backward()
                opt.step()
            torch.cuda.synchronize()
            return args.gpu_steps / (time.perf_counter() - start)

    results = {f"1 CPU ({allowed[-1]})": [], f"all {len(allowed)} allowed CPUs": []}
    for _ in range(args.repeats):
        for name, cpus in zip(results, ({allowed[-1]}, set(allowed))):
            results[name].append(steps_per_s(cpus))
    return [(k, statistics.median(v)) for k, v in results.items()]


def table_text(title: str, unit: str, rows: list[tuple[str, float]]) -> str:
    base = rows[0][1]
    lines = [title, f"| condition | {unit} | ratio vs first |", "|---|---:|---:|"]
    lines += [f"| {name} | {value:.1f} | {value / base:.2f}x |" for name, value in rows]
    return "\n".join(lines)


def benchmark_table(root) -> str:
    """Renderer for `<!-- table: affinity.benchmark:benchmark_table -->` (python -m coursetools.results render)."""
    from pathlib import Path

    from benchtools.resultfiles import caption, read_result
    result = read_result(Path(root) / "results" / "affinity_benchmark.json")
    tables = [table_text(f"**{t['title']}**\n", t["unit"], [tuple(r) for r in t["rows"]]) for t in result["data"]["tables"]]
    return "\n\n".join(tables) + "\n\n" + caption(result)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: allowed CPUs)")
    ap.add_argument("--samples", type=int, default=240, help="samples per measurement")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats per condition (median)")
    ap.add_argument("--gpu-steps", type=int, default=50, help="training steps per GPU measurement")
    ap.add_argument("--skip-competing", action="store_true", help="skip the competing-load table")
    ap.add_argument("--out", default=None, help="also write the tables to this results file (JSON)")
    args = ap.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise UserError("this benchmark compares placements and needs at least 2 allowed CPUs "
                        "(run it outside taskset/srun --cpus-per-task=1)")
    args.workers = args.workers or len(allowed)
    if args.workers < 1 or args.samples < 8 or args.repeats < 1:
        raise UserError("--workers >= 1, --samples >= 8 and --repeats >= 1 please")
    import torch
    # Other work on the machine moves the rates; the ratios are measured side by side.
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"machine: {platform.node()} | {cpu_model()} | allowed CPUs {format_cpulist(allowed)} "
          f"({len(allowed)}) | torch {torch.__version__} | GPU: "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
    tables = [(f"1. data pipeline: {args.workers} workers, {args.samples} samples, median of {args.repeats}",
               "samples/s", pipeline_table(args, allowed))]
    print("\n" + table_text(*tables[-1]))
    if not args.skip_competing:
        tables.append(("2. competing load: 1 worker, a busy process pinned to one CPU", "samples/s",
                       competing_table(args, allowed)))
        print("\n" + table_text(*tables[-1]))
    rows = gpu_table(args, allowed)
    if rows is None:
        print("\n3. GPU-resident compute: skipped (no GPU here)")
    else:
        tables.append(("3. GPU-resident compute: conv stack, data on the GPU", "steps/s", rows))
        print("\n" + table_text(*tables[-1]))
    if args.out:
        from benchtools.resultfiles import write_result
        command = "python affinity/benchmark.py " + " ".join(argv if argv is not None else sys.argv[1:])
        data = {"allowed_cpus": format_cpulist(allowed), "workers": args.workers, "samples": args.samples,
                "repeats": args.repeats,
                "tables": [{"title": t, "unit": u, "rows": [[n, round(v, 2)] for n, v in r]} for t, u, r in tables]}
        print(f"\nwrote {write_result(args.out, command.strip(), data)}")
    return 0


if __name__ == "__main__":
    run_main(main)
