"""Domain scaling of solution 13's FNO: step time, exchange time, peak memory for 1..P domain ranks.

    python solutions/13_domain_parallel/benchmark.py --ranks 1 2          # this machine: CPU, gloo
    python solutions/13_domain_parallel/benchmark.py --ranks 1 2 4 8 --device cuda --rows 256 \
        --cols 256                                                        # one GPU node
    python solutions/13_domain_parallel/benchmark.py --checkpointing     # step 12: with and without
    python solutions/13_domain_parallel/benchmark.py --ranks 1 2 --script fno.py  # your convolution

One domain group of P ranks trains the course's FNO (wellfno.model.NextFrameFNO split by
wellfno.domain) on one synthetic batch, as solution 13 does, without data loading:
- weak scaling: P ranks, P times the rows (--rows per rank), so each rank's slab stays the same;
- strong scaling: one grid (--rows x the largest P) split over 1..P ranks.
Which spectral convolution: with --script, your script's DomainSpectralConv(conv, slab) (exercise
13, task 2: wellfno.domain_check's contract); without, the reference, wellfno.domain's (solution
13's). One rank runs neuralop's SpectralConv (nothing split): the baseline of both. Each mode's
rows end in a table: efficiency (weak: t_1 / t_P; strong: t_1 / (P t_P)) and speed-up (strong:
t_1 / t_P; weak, the scaled speed-up: P t_1 / t_P, the work of P ranks against one's), both
against the smallest P measured. A machine busier than its CPUs is a warning line.
Each run is profiled (torch.profiler, the first steps left out); the step time is the median over
the traced steps of the slowest rank's ProfilerStep, the exchange's share the time in collectives
(all_to_all, the loss's all_reduce) over the step time (profiling.comms, from the traces), the
peak memory each rank's over two steps before the profiler starts, whose buffers would count
too (GPU: max_memory_allocated; CPU: the rise of the peak RSS over them, with glibc returning
freed blocks: MALLOC_MMAP_THRESHOLD_, as tests/test_memory.py measures it).
--checkpointing instead measures one rank with and without activation checkpointing (step 12).
--repeats N runs every configuration N times, round-robin, and keeps each one's fastest round.
On the CPU every rank gets one thread: P ranks use P cores. Writes OUT/domain_scaling.json (a
results file); --results PATH writes it there too. Traces stay in OUT/<mode>_<P>ranks/.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
from pathlib import Path

from benchtools.machine import busy_warning, load_average
from benchtools.resultfiles import write_result
from benchtools.rounds import best_of_rounds
from profiling import comms, summarize, traces
from wellfno import domain_check
from wellfno.cli import UserError, run_main


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument(
        "--ranks", type=int, nargs="+", default=[1, 2], help="domain group sizes to measure"
    )
    p.add_argument("--modes", nargs="+", choices=["weak", "strong"], default=["weak", "strong"])
    p.add_argument(
        "--rows",
        type=int,
        default=64,
        help="rows of the first (split) axis per rank (weak) "
        "or per rank at the largest P (strong)",
    )
    p.add_argument("--cols", type=int, default=64, help="cells of the second axis")
    p.add_argument("--depth", type=int, default=0, help="cells of a third axis (0: a 2-D grid)")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--fno-modes", type=int, default=12, help="Fourier modes per axis")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=8, help="steps per run (the first 3 untraced)")
    p.add_argument(
        "--repeats", type=int, default=1, help="rounds of every run; each row is its fastest"
    )
    p.add_argument(
        "--checkpointing",
        action="store_true",
        help="one rank, blocks checkpointed or not (step 12)",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--script",
        help="your exercise-13 script: measure its DomainSpectralConv (default: wellfno.domain's)",
    )
    p.add_argument("--out", default="runs/domain_scaling")
    p.add_argument(
        "--results", help="also write the JSON here (e.g. results/13_domain_scaling.json)"
    )
    args = p.parse_args(argv)
    if (
        min(args.ranks) < 1
        or min(args.rows, args.cols, args.width, args.layers, args.batch_size) < 1
        or args.steps < 4
        or args.repeats < 1
    ):
        raise UserError(
            "--ranks, --rows, --cols, --width, --layers, --batch-size, --repeats must be at "
            "least 1, --steps at least 4"
        )
    args.ranks = sorted(set(args.ranks))
    return args


def _worker(rank, world, port, grid, args, run_dir):
    import resource

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    from wellfno import domain
    from wellfno.checkpointing import checkpoint_blocks
    from wellfno.model import NextFrameFNO

    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
    )
    try:
        layout = domain.ProcessGrid.create(rank, world, world, rows=grid[0])
        slab = layout.slab(grid[0])
        torch.manual_seed(0)
        stats = {k: torch.ones(3) for k in ("mean", "std", "mean_delta", "std_delta")}
        model = NextFrameFNO(
            3,
            1,
            stats,
            n_spatial_dims=len(grid),
            resolution=grid,
            modes=args.fno_modes,
            width=args.width,
            layers=args.layers,
        )
        domain.check_layout(model, world)
        convs = list(model.fno.fno_blocks.convs)
        domain.split_model(model, slab)  # the slab's positional embedding, wellfno.domain's convs
        if args.script and world > 1:  # yours instead, on the same parameters
            yours = domain_check.convolution_of(domain_check.load_script(args.script), args.script)
            model.fno.fno_blocks.convs = torch.nn.ModuleList(yours(conv, slab) for conv in convs)
        if run_dir.name.startswith("checkpointed"):
            checkpoint_blocks(model.fno)
        model = model.to(device)
        loss_fn = domain.sample_loss(model.loss, slab)
        optimizer = torch.optim.Adam(model.parameters())
        shape = (args.batch_size, 3, slab.stop - slab.start, *grid[1:])
        x, y = torch.randn(shape, device=device), torch.randn(shape, device=device)

        def step():
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            # The gradients summed over the domain group, as DDP's hook does in solution 13.
            for p in model.parameters():
                dist.all_reduce(p.grad)
            optimizer.step()

        step()  # start-up: FFT plans, allocator, Adam's state
        # Peak memory over two steps without the profiler, whose event buffers would count too.
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        elif os.path.exists("/proc/self/clear_refs"):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # peak RSS := current RSS
        rss_before = _status("VmRSS")
        for _ in range(2):
            step()
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device)
        else:
            peak = (
                _status("VmHWM") - rss_before
                if rss_before
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            )
        activities = [ProfilerActivity.CPU] + (
            [ProfilerActivity.CUDA] if device.type == "cuda" else []
        )
        traced = args.steps - 3
        with profile(
            activities=activities,
            schedule=schedule(wait=1, warmup=1, active=traced, repeat=1),
            on_trace_ready=lambda p: traces.save(p, run_dir / f"trace_rank{rank}.json.gz", rank),
        ) as prof:
            for _ in range(traced + 2):
                step()
                prof.step()
        (run_dir / f"peak_rank{rank}.txt").write_text(str(peak))
    finally:
        dist.destroy_process_group()


def _status(key):
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))
    except OSError:
        return 0


def measure(run_dir: Path, world: int) -> dict:
    per_rank = []
    for rank in range(world):
        trace = traces.load(run_dir / f"trace_rank{rank}.json.gz")
        steps = {r["step"]: r for r in summarize.step_breakdown(trace)}
        for c in comms.communication(trace):
            steps[c["step"]].update(comm_ms=c["comm_ms"])
        per_rank.append(steps)
    numbers = sorted(set.intersection(*(set(s) for s in per_rank)))
    rows = [s[n] for s in per_rank for n in numbers]
    return dict(
        step_ms=statistics.median(max(s[n]["total"] for s in per_rank) for n in numbers),
        exchange_share=sum(r.get("comm_ms", 0.0) for r in rows) / sum(r["total"] for r in rows),
        peak_bytes_per_rank=max(
            int((run_dir / f"peak_rank{r}.txt").read_text()) for r in range(world)
        ),
        traced_steps=numbers,
    )


def run(args, name: str, world: int, grid: tuple, out: Path) -> dict:
    import torch.multiprocessing as mp

    run_dir = out / name
    run_dir.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault(
        "MALLOC_MMAP_THRESHOLD_", "65536"
    )  # the spawned ranks: freed tensors go back
    if args.device == "cpu":
        # Kineto (torch.profiler) prints 'USDT: ... profiler_start/stop' at every trace, at its
        # highest log level (5, above ERROR's 4), so only a level of 6 hides them: on a GPU, where
        # kineto's errors (CUPTI's) say why a trace lacks kernels, they stay.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    mp.start_processes(
        _worker, args=(world, port, grid, args, run_dir), nprocs=world, start_method="spawn"
    )
    row = dict(ranks=world, grid="x".join(map(str, grid)), **measure(run_dir, world))
    print(
        f"{name:>22}: {row['grid']:>12} cells, {row['step_ms']:8.1f} ms/step, exchange "
        f"{100 * row['exchange_share']:5.1f}%, "
        f"peak {row['peak_bytes_per_rank'] / 1e6:8.1f} MB per rank",
        flush=True,
    )
    return row


def _step_ms(row: dict) -> float:
    return row["step_ms"]


def scaling_table(mode: str, rows: list[dict]) -> str:
    """Efficiency and speed-up of each row against the first (the smallest P)."""
    lines = [f"{mode} scaling, against {rows[0]['ranks']} rank(s):",
             f"{'ranks':>7}{'grid':>12}{'ms/step':>10}{'efficiency':>12}{'speed-up':>10}"]
    for row in rows:
        lines.append(f"{row['ranks']:>7}{row['grid']:>12}{row['step_ms']:>10.1f}"
                     f"{row['efficiency']:>12.2f}{row['speed_up']:>10.2f}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.script:  # one line now, not in every spawned rank
        domain_check.convolution_of(domain_check.load_script(args.script), args.script)
        print(f"Measuring your DomainSpectralConv from {args.script} (1 rank: neuralop's "
              f"SpectralConv, the baseline)")
    elif not args.checkpointing:
        print("Measuring the reference: wellfno.domain's DomainSpectralConv (solution 13's); "
              "--script YOUR_SCRIPT measures yours")
    busy = busy_warning(load_average(), "at the start")
    if busy:
        print(busy, flush=True)
    out = Path(args.out)
    rest = (args.cols,) + ((args.depth,) if args.depth else ())
    result = dict(
        config={k: v for k, v in vars(args).items() if k not in ("out", "results")}, modes={}
    )
    if args.checkpointing:
        grid = (args.rows, *rest)
        runs = [(name, 1, grid) for name in ("plain", "checkpointed")]
        rows = best_of_rounds(runs, lambda r: run(args, *r, out), args.repeats, _step_ms)
        result["modes"]["checkpointing"] = [
            dict(row, checkpointed=name != "plain") for (name, _, _), row in zip(runs, rows)
        ]
    else:
        runs = [
            (mode, world, (args.rows * (world if mode == "weak" else max(args.ranks)), *rest))
            for mode in args.modes
            for world in args.ranks
        ]
        measured = best_of_rounds(
            runs, lambda r: run(args, f"{r[0]}_{r[1]}ranks", *r[1:], out), args.repeats, _step_ms
        )
        for mode in args.modes:
            rows = [row for (m, _, _), row in zip(runs, measured) if m == mode]
            for row in rows:
                ideal = (
                    rows[0]["step_ms"]
                    if mode == "weak"
                    else rows[0]["step_ms"] * rows[0]["ranks"] / row["ranks"]
                )
                row["efficiency"] = ideal / row["step_ms"]
                row["speed_up"] = (
                    row["efficiency"] * row["ranks"] / rows[0]["ranks"]
                    if mode == "weak"
                    else rows[0]["step_ms"] / row["step_ms"]
                )
            result["modes"][mode] = rows
            print(scaling_table(mode, rows))
    command = "python solutions/13_domain_parallel/benchmark.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    for path in [out / "domain_scaling.json"] + ([Path(args.results)] if args.results else []):
        write_result(path, command.strip(), result)
        print(f"Wrote {path}")
    busy = busy_warning(load_average(), "at the end")
    if busy:
        print(busy)


if __name__ == "__main__":
    run_main(main)
