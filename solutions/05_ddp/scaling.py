"""Scaling of solution 05: samples/s and efficiency for 1..N ranks, weak and strong, time in comms.

    python solutions/05_ddp/scaling.py --ranks 1 2                   # this machine: CPU ranks, gloo
    python solutions/05_ddp/scaling.py --ranks 1 2 4 8 --device cuda --dataset-size large  # 1 node
    salloc -N 2 --ntasks-per-node 4 --gpus-per-node 4 ...      # then, inside the allocation:
    python solutions/05_ddp/scaling.py --ranks 1 2 4 8 --launcher srun --device cuda
                                                # 1-4 ranks on the first node, 8 = 2 nodes x 4

Each point is one profiled run of solutions/05_ddp/fno.py (--profile: --max-steps S, the last
--profile-active steps traced on every rank, the first ones - allocator, FFT plans, loader start -
left out):
- weak scaling: --batch-size B per rank, so the global batch grows with the ranks (B x N);
- strong scaling: the global batch G (default B x the largest N) split over the ranks (G / N each).
samples/s = global batch / step time, the step time being the median over the traced steps of
the slowest rank's ProfilerStep (DDP makes every rank wait for the slowest one). Efficiency =
samples/s(N) / (N x samples/s(1)): 1.0 is perfect. The communication share is the time in
collectives over the step time, from the traces (profiling.comms: host ranges of gloo/NCCL
collectives, or NCCL/RCCL kernels on GPUs); `exposed` is the part no backward compute overlaps.

On the CPU (no GPU, or --device cpu) every rank gets one thread and no binding (--bind none,
OMP_NUM_THREADS=1): N ranks use N cores, as N ranks use N GPUs on a GPU node. (Bound, a lone rank
would take every core with one thread each, and the comparison would be of threads, not ranks.)

Writes OUT/scaling.json (a results file: the command, the machine, every number, the runs'
commands) and OUT/scaling.png; --results PATH writes the same JSON there too (the repository's
copy: results/05_ddp_scaling.json, rendered into exercises/05_ddp/background.md by
`coursetools.results.ddp_scaling_table`).
The per-rank traces stay in OUT/<mode>_<N>ranks/ for ui.perfetto.dev. --repeats R runs every
point R times, round-robin, and keeps each point's fastest run (the traces are the last run's).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchtools.machine import describe
from benchtools.resultfiles import read_result, write_result
from benchtools.rounds import best_of_rounds
from profiling import comms, summarize, traces
from wellfno import data, plots
from wellfno.cli import UserError, run_main

SCRIPT = Path(__file__).resolve().parent / "fno.py"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="world sizes to measure")
    p.add_argument("--modes", nargs="+", choices=["weak", "strong"], default=["weak", "strong"])
    p.add_argument("--batch-size", type=int, default=8,
                   help="weak: per rank; strong: per rank at the largest N")
    p.add_argument("--global-batch", type=int, default=None,
                   help="strong scaling's global batch (default: --batch-size x largest --ranks)")
    p.add_argument("--max-steps", type=int, default=12,
                   help="steps per run (the last --active traced)")
    p.add_argument("--active", type=int, default=5, help="traced steps per run")
    p.add_argument("--launcher", choices=["torchrun", "srun"], default="torchrun",
                   help="torchrun: one node; srun: inside a Slurm allocation (any number of nodes)")
    p.add_argument("--srun-args", default="",
                   help="extra srun options, e.g. '--gpus-per-task=1 --cpu-bind=none'")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dataset", default=data.EMBEDDED)
    p.add_argument("--dataset-size", choices=["tiny", "demo", "large"], default="demo",
                   help="size of the embedded dataset, generated into --data-dir if missing")
    p.add_argument("--data-dir", default=os.environ.get("WELL_DATA", "data"))
    p.add_argument("--out", default="runs/scaling")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of every point, round-robin; each point keeps its fastest")
    p.add_argument("--results",
                   help="also write scaling.json to this path (e.g. results/05_ddp_scaling.json)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more options for fno.py")
    args = p.parse_args(argv)
    if (min(args.ranks) < 1 or args.batch_size < 1 or args.active < 1 or args.repeats < 1
            or args.max_steps < args.active + 3):
        raise UserError("--ranks, --batch-size and --repeats must be at least 1, --max-steps at "
                        "least --active + 3 "
                        "(the first steps are warm-up, never traced)")
    args.ranks = sorted(set(args.ranks))
    args.global_batch = args.global_batch or args.batch_size * max(args.ranks)
    if "strong" in args.modes and any(args.global_batch % n for n in args.ranks):
        raise UserError(f"strong scaling splits the global batch {args.global_batch} over the "
                        "ranks: it must "
                        f"divide by every --ranks value ({args.ranks}); set --global-batch")
    args.extra = [a for a in args.extra if a != "--"]
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_cpu(args) -> bool:
    import torch

    return args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())


def srun_layout(world: int, env=None) -> tuple[int, list[str]]:
    """Nodes and srun options for `world` ranks inside this allocation: its nodes filled in order.

    srun given only --ntasks spreads the ranks over every node of the allocation (2 ranks in a
    2-node allocation: one per node), so the points would mix intra- and inter-node steps; here
    N ranks use ceil(N / tasks per node) nodes, as a table of ranks and nodes says.
    """
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID"):
        raise UserError("--launcher srun runs inside a Slurm allocation: e.g. salloc -N 2 "
                        "--ntasks-per-node 4 (GPU sites: --gpus-per-node 4), then this command")
    from wellfno.launch import tasks_per_node

    spec = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    per_node = min(tasks_per_node(spec)) if spec else int(env.get("SLURM_NTASKS", "1"))
    have = int(env.get("SLURM_JOB_NUM_NODES", "1") or 1)
    nodes = -(-world // per_node)
    if nodes > have:
        raise UserError(f"{world} ranks need {nodes} node(s) of {per_node} tasks, the allocation "
                        f"has {have}: drop {world} from --ranks or allocate more nodes")
    per_node_here = -(-world // nodes)
    return nodes, [f"--nodes={nodes}", f"--ntasks={world}", f"--ntasks-per-node={per_node_here}"]


def run_command(args, world: int, batch: int, out: Path, data_dir: Path) -> list[str]:
    fno = [str(SCRIPT), "--data-dir", str(data_dir), "--dataset", args.dataset, "--out", str(out),
           "--batch-size", str(batch), "--epochs", "1000", "--max-steps", str(args.max_steps),
           "--profile",
           "--profile-warmup", "2", "--profile-active", str(args.active), "--device", args.device,
           *(["--bind", "none"] if on_cpu(args) else []), *args.extra]
    if args.launcher == "srun":
        return ["srun", *srun_layout(world)[1], *shlex.split(args.srun_args), sys.executable, *fno]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *fno]


def measure(run_dir: Path, world: int, global_batch: int) -> dict:
    """Step time, samples/s and communication shares from the traces of every rank."""
    per_rank, measured_on = [], None
    for rank in range(world):
        found = sorted(run_dir.glob(f"trace_rank{rank}_steps*.json.gz"))
        if not found:
            raise UserError(f"no trace of rank {rank} in {run_dir}: see {run_dir / 'log.txt'}")
        trace = traces.load(found[-1])
        steps = {r["step"]: r for r in summarize.step_breakdown(trace)}
        for c in comms.communication(trace):
            steps[c["step"]].update(comm_ms=c["comm_ms"], overlap_ms=c["overlap_ms"])
            measured_on = c["measured_on"]
        per_rank.append(steps)
    step_numbers = sorted(set.intersection(*(set(s) for s in per_rank)))
    step_ms = statistics.median(max(s[n]["total"] for s in per_rank) for n in step_numbers)
    rows = [s[n] for s in per_rank for n in step_numbers]
    total = sum(r["total"] for r in rows)
    comm = sum(r.get("comm_ms", 0.0) for r in rows)
    return dict(step_ms=step_ms, samples_per_second=global_batch / (step_ms / 1e3),
                traced_steps=step_numbers,
                comm_share=comm / total, comm_measured_on=measured_on,
                exposed_comm_share=(comm - sum(r.get("overlap_ms", 0.0) for r in rows)) / total)


def scaling_figure(result: dict, machine: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, rows in result["modes"].items():
        ranks = [r["ranks"] for r in rows]
        line, = left.plot(ranks, [r["samples_per_second"] for r in rows], "o-",
                          label=f"{mode} (measured)")
        left.plot(ranks, [rows[0]["samples_per_second"] * n for n in ranks], ":",
                  color=line.get_color(),
                  label=f"{mode} (ideal)")
        right.plot(ranks, [r["efficiency"] for r in rows], "o-", color=line.get_color(),
                   label=f"{mode} efficiency")
        right.plot(ranks, [r["comm_share"] for r in rows], "s--", color=line.get_color(), alpha=0.6,
                   label=f"{mode} communication share")
    left.set(xlabel="ranks", ylabel="samples/s", title="throughput", xticks=result["ranks"])
    right.set(xlabel="ranks", ylabel="fraction", title="efficiency and time in collectives",
              ylim=(0, 1.15),
              xticks=result["ranks"])
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"solution 05 scaling on {machine} ({result['device']}, {result['launcher']})",
                 fontsize=8)
    fig.tight_layout()
    return plots.save_png(fig, path)


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out)
    dataset_dir = data.locate(args.data_dir, args.dataset)
    if args.dataset == data.EMBEDDED and not (dataset_dir / "data").is_dir():
        from wellfno.grayscott import generate

        generate(Path(args.data_dir), args.dataset_size)
    data.resolve_dataset(args.data_dir, args.dataset)
    result = dict(device=args.device, launcher=args.launcher,
                  threads_per_rank=1 if on_cpu(args) else None,
                  dataset=str(dataset_dir), ranks=args.ranks, max_steps=args.max_steps,
                  traced_steps=args.active,
                  load_average_before=round(os.getloadavg()[0], 2), modes={}, commands=[])
    def point(mode_world):
        mode, world = mode_world
        batch = args.batch_size if mode == "weak" else args.global_batch // world
        run_dir = out / f"{mode}_{world}ranks"
        cmd = run_command(args, world, batch, run_dir, Path(args.data_dir))
        print(f"{mode} scaling, {world} rank(s), {batch} per rank: {shlex.join(cmd)}",
              flush=True)
        started = time.perf_counter()
        run_dir.mkdir(parents=True, exist_ok=True)
        for old in run_dir.glob("trace_rank*.json.gz"):
            old.unlink()  # a trace of an earlier run must not pass for this one
        with open(run_dir / "log.txt", "w") as log:
            try:
                done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                      timeout=args.timeout,
                                      env={**os.environ, **({"OMP_NUM_THREADS": "1"}
                                                            if on_cpu(args) else {})})
            except subprocess.TimeoutExpired:
                raise UserError(f"{mode} scaling with {world} rank(s) took over "
                                f"{args.timeout:.0f} s: see {run_dir / 'log.txt'}; raise "
                                f"--timeout or lower --max-steps") from None
        if done.returncode != 0:
            raise UserError(f"{mode} scaling with {world} rank(s) failed (exit "
                            f"{done.returncode}): "
                            f"see {run_dir / 'log.txt'}")
        if re.search(r"^epoch \d+/\d+ ", (run_dir / "log.txt").read_text(), re.M):
            # validation between epochs would fall inside a traced step and inflate it
            raise UserError(f"{mode} scaling with {world} rank(s): an epoch ended within "
                            f"--max-steps {args.max_steps}; use a larger dataset "
                            f"(--dataset-size) or fewer --max-steps")
        nodes = srun_layout(world)[0] if args.launcher == "srun" else 1
        if shlex.join(cmd) not in result["commands"]:
            result["commands"].append(shlex.join(cmd))
        return dict(ranks=world, nodes=nodes, per_rank_batch=batch, global_batch=batch * world,
                    seconds=time.perf_counter() - started,
                    **measure(run_dir, world, batch * world))

    points = [(mode, world) for mode in args.modes for world in args.ranks]
    measured = best_of_rounds(points, point, args.repeats, lambda row: row["step_ms"])
    for mode in args.modes:
        rows = [row for (m, _), row in zip(points, measured) if m == mode]
        for row in rows:
            row["efficiency"] = row["samples_per_second"] / (row["ranks"] / rows[0]["ranks"] *
                                                             rows[0]["samples_per_second"])
        result["modes"][mode] = rows
    result["load_average_after"] = round(os.getloadavg()[0], 2)
    command = shlex.join(["python", "solutions/05_ddp/scaling.py",
                          *(argv if argv is not None else sys.argv[1:])])
    written = read_result(write_result(out / "scaling.json", command, result))
    if args.results:
        write_result(args.results, command, result)
    figure = scaling_figure(result, describe(written["machine"]), out / "scaling.png")
    print(f"\nscaling of solutions/05_ddp/fno.py on {describe(written['machine'])} "
          f"({args.device}, {args.launcher}):")
    print(f"{'mode':>7} {'ranks':>5} {'nodes':>5} {'batch/rank':>10} {'step ms':>8} "
          f"{'samples/s':>10} {'efficiency':>10} {'comm':>6} {'exposed':>8}")
    for mode, rows in result["modes"].items():
        for r in rows:
            print(f"{mode:>7} {r['ranks']:5d} {r.get('nodes', 1):5d} {r['per_rank_batch']:10d} "
                  f"{r['step_ms']:8.1f} "
                  f"{r['samples_per_second']:10.1f} {r['efficiency']:10.2f} "
                  f"{100 * r['comm_share']:5.1f}% "
                  f"{100 * r['exposed_comm_share']:7.1f}%")
    print(f"Wrote {out / 'scaling.json'}{' and ' + args.results if args.results else ''} and "
          f"{figure}")


if __name__ == "__main__":
    run_main(main)
