"""`make results`: every results file the docs quote, measured again on this machine.

    python -m coursetools.measure                          # all of them, in the order below
    python -m coursetools.measure 05_ddp_scaling threads   # only these (make results ONLY="...")
    python -m coursetools.measure --list                   # the names, their files and commands

then `python -m coursetools.results render` regenerates the docs' tables (make results does both).

Each target is a results file and the repository's command(s) that write it; every figure is the
best of a few rounds (the tool's own --repeats; benchtools.rounds). Around each target the 1-minute
load average is read: above the machine's CPUs, one line warns that other work's noise is in the
numbers; the load at the start goes into the file (`load_average_at_start`, beside the
`load_average` its tool recorded at the end). Every command gets OMP_NUM_THREADS=1, so that a number
does not depend on how many cores torch guesses it has (the tools that compare thread counts set
their own). A target that fails does not stop the others; the run then exits 1 naming it.
Each file records the commit it measured (benchtools.resultfiles); `python -m coursetools.staleness`
names the files whose code (`Target.commands`, `Target.runs` and what they import) changed since.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchtools.machine import busy_warning, load_average
from benchtools.resultfiles import add_load_at_start
from coursetools.day0 import GPU_LADDER, HOW_TO_MEASURE, LADDER
from coursetools.results import RUNTIME_COMMANDS
from wellfno.cli import UserError, run_main


@dataclass(frozen=True)
class Target:
    name: str
    file: str            # the results file, relative to the repository root
    commands: tuple      # {py} the venv's python, {data} the data dir, {runs} scratch output
    quoted_in: str       # where the docs show it
    # The scripts and modules (`-m name`) its tools start or load themselves, which its command
    # lines do not name: its numbers come from their code too (coursetools.staleness).
    runs: tuple = ()
    # How it is measured where `make results` does not measure it (another machine's file, in
    # ELSEWHERE): staleness says this instead of `make results ONLY=name`.
    measured_by: str = ""


# Cheapest settings whose figures are stable on 2 idle cores: short timed windows, few steps, two
# rounds each (the first step's start-up is always left out by the tools themselves).
TARGETS = (
    Target("runtimes", "results/runtimes.json",
           ("{py} -m coursetools.results runtimes --repeats 1",),
           "README quick start, INSTRUCTORS.md runtimes, exercise 01's profile",
           runs=tuple(command for _, command in RUNTIME_COMMANDS)),
    Target("throughput", "results/throughput.json",
           ("{py} profiling/throughput.py --data-dir {data} --out {runs}/throughput --seconds 2 "
            "--repeats 2 --prefetch-factor 2 --results results/throughput.json",),
           "exercise 02's loader sweep, INSTRUCTORS.md step 02"),
    Target("throughput_large", "results/throughput_large.json",
           ("{py} -m wellfno.grayscott --data-dir {runs}/large_data --size large --n-train 2 "
            "--n-steps 50",
            "{py} profiling/throughput.py --data-dir {runs}/large_data "
            "--out {runs}/throughput_large --workers 0 --readers fast --seconds 2 --repeats 2 "
            "--results results/throughput_large.json"),
           "exercise 02's readers on 128x128 windows"),
    Target("compare_scripts", "results/compare_scripts.json",
           ("{py} profiling/compare_scripts.py --data-dir {data} --out {runs}/scripts --repeats 2 "
            "--script-args '--epochs 1 --max-steps 30' --results results/compare_scripts.json "
            "--scripts fno.py solutions/01_profiling/fno.py "
            "'solutions/02_data_pipeline/fno.py --num-workers 2 --persistent-workers' "
            "'solutions/02_data_pipeline/fno.py --fast-reader' "
            "'solutions/02_data_pipeline/fno.py --num-workers 1 --persistent-workers "
            "--fast-reader' "
            "'solutions/03_affinity/fno.py --num-workers 1 --persistent-workers --fast-reader'",),
           "exercise 02's whole scripts, README"),
    Target("profiling_overhead", "results/profiling_overhead.json",
           ("{py} profiling/overhead.py --data-dir {data} --batch-size 4 --wait 8 --after 8 "
            "--repeats 6 --results results/profiling_overhead.json",),
           "exercise 01's profiler overhead, README",
           runs=("solutions/01_profiling/fno.py",)),   # its --script's default
    Target("threads", "results/threads.json",
           ("{py} profiling/threads.py --data-dir {data} --threads 1,2 --busy 0,1 --repeats 2 "
            "--results results/threads.json",),
           "INSTRUCTORS.md threads"),
    Target("affinity_benchmark", "results/affinity_benchmark.json",
           # its own --repeats (3) takes the median of interleaved rounds
           ("{py} affinity/benchmark.py --out results/affinity_benchmark.json",),
           "exercise 03, README"),
    Target("04_stats_benchmark", "results/04_stats_benchmark.json",
           ("{py} solutions/04_distributed_stats/benchmark.py --synthetic-gb 1 --ranks 1,2 "
            "--repeat 3 --json results/04_stats_benchmark.json",),
           "exercise 04, README",
           runs=("stats.py", "solutions/04_distributed_stats/stats.py",
                 "solutions/04_distributed_stats/dask_stats.py")),
    Target("05_ddp_scaling", "results/05_ddp_scaling.json",
           ("{py} solutions/05_ddp/scaling.py --ranks 1 2 --batch-size 8 --max-steps 12 "
            "--repeats 2 --data-dir {data} --out {runs}/scaling "
            "--results results/05_ddp_scaling.json",),
           "exercise 05, README",
           runs=("solutions/05_ddp/fno.py",)),
    Target("efficiency_cpu", "results/efficiency_cpu/efficiency.json",
           ("{py} solutions/11_compile/benchmark.py --data-dir {data} "
            "--out results/efficiency_cpu --steps 20 --repeats 2 --common '--bind none'",),
           "exercises 08-11, README",
           runs=tuple(f"solutions/{step}/fno.py" for step in (
               "07_failures", "08_host_syncs", "09_mixed_precision", "10_mfu", "11_compile"))),
    Target("12_checkpointing", "results/12_checkpointing.json",
           ("{py} solutions/13_domain_parallel/benchmark.py --checkpointing --rows 64 --cols 64 "
            "--layers 8 --batch-size 8 --steps 8 --repeats 2 --out {runs}/bench12 "
            "--results results/12_checkpointing.json",),
           "exercise 12"),
    Target("13_domain_scaling", "results/13_domain_scaling.json",
           ("{py} solutions/13_domain_parallel/benchmark.py --ranks 1 2 --steps 10 --repeats 2 "
            "--out {runs}/bench13 --results results/13_domain_scaling.json",),
           "exercise 13"),
    Target("14_long_rollouts", "results/14_long_rollouts.json",
           ("{py} solutions/14_long_rollouts/compare.py --data-dir {data} --out {runs}/compare14 "
            "--results results/14_long_rollouts.json",),
           "exercise 14, README (about 38 minutes on 2 idle cores: 5 variants x 5 seeds)",
           runs=("fno.py", "solutions/14_long_rollouts/fno.py", "{py} -m wellfno.evaluate")),
)
BY_NAME = {t.name: t for t in TARGETS}

# Results files measured on another machine than this CPU one: `make results` never runs them,
# coursetools.staleness checks them as it checks TARGETS' (pick(..., elsewhere=True)).
ELSEWHERE = (
    Target("gpu_ladder", GPU_LADDER.as_posix(),
           (f"{{py}} -m coursetools.day0 ladder --data-dir {{data}} --out {GPU_LADDER.as_posix()}",),
           "README (08-11, GPU), exercise 11's GPU column",
           runs=tuple(script for _, script, _, _ in LADDER), measured_by=HOW_TO_MEASURE),
)


def pick(names: list[str], elsewhere: bool = False) -> list[Target]:
    """The targets named (all of them without names); with elsewhere, ELSEWHERE's too."""
    known = {t.name: t for t in (*TARGETS, *(ELSEWHERE if elsewhere else ()))}
    away = [t for t in ELSEWHERE if t.name in names and t.name not in known]
    if away:
        raise UserError(f"{away[0].name} ({away[0].file}) is not measured by make results, on "
                        f"this machine: {away[0].measured_by}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"unknown results target {', '.join(unknown)}: one of {', '.join(known)} "
                        f"(`python -m coursetools.measure --list`)")
    return [known[n] for n in names] if names else list(known.values())


def argv_of(template: str, data_dir: str, runs: str) -> list[str]:
    return shlex.split(template.format(py=shlex.quote(sys.executable), data=shlex.quote(data_dir),
                                       runs=shlex.quote(runs)))


def warn_if_busy(when: str, name: str | None = None) -> float | None:
    load = load_average()
    line = busy_warning(load, when)
    if line:
        again = f" (make results ONLY={name})" if name else ""
        print(line + again, flush=True)
    return load


def measure(target: Target, root: Path, data_dir: str, runs: str, env: dict) -> dict:
    """Run one target's commands; its row for the summary (seconds, loads, what went wrong)."""
    print(f"== {target.name}: {target.file} ({target.quoted_in})", flush=True)
    load_start = warn_if_busy(f"at the start of {target.name}", target.name)
    started_at, start = time.time(), time.perf_counter()
    failed = None
    for template in target.commands:
        argv = argv_of(template, data_dir, runs)
        print("$ " + shlex.join(["python", *argv[1:]]), flush=True)
        if subprocess.run(argv, cwd=root, env=env).returncode != 0:
            failed = f"`{shlex.join(['python', *argv[1:]])}` failed"
            break
    path = root / target.file
    if failed is None and not (path.is_file() and path.stat().st_mtime >= started_at - 1):
        failed = f"its commands ran but did not write {target.file}"
    if failed is None:
        add_load_at_start(path, load_start)
    load_end = warn_if_busy(f"at the end of {target.name}", target.name)
    seconds = time.perf_counter() - start
    print(f"   {target.name}: {'FAILED, ' + failed if failed else 'done'} in {seconds:.0f} s, "
          f"load average {load_start} -> {load_end}", flush=True)
    return dict(name=target.name, seconds=seconds, load_start=load_start, load_end=load_end,
                failed=failed)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="results targets to measure (default: all)")
    p.add_argument("--list", action="store_true", help="list the targets and their commands")
    p.add_argument("--data-dir", default=os.environ.get("WELL_DATA", "data"),
                   help="folder that holds datasets/ (the embedded demo dataset)")
    p.add_argument("--runs", default="runs/results", help="scratch output of the measurements")
    p.add_argument("--root", default=".", help="repository root (default: here)")
    args = p.parse_args(argv)
    targets = pick(args.names)
    if args.list:
        for t in targets:
            print(f"{t.name}: {t.file} ({t.quoted_in})")
            for template in t.commands:
                argv_shown = argv_of(template, args.data_dir, args.runs)[1:]
                print("    " + shlex.join(["python", *argv_shown]))
        return 0
    root = Path(args.root).resolve()
    if not (root / "fno.py").is_file():
        raise UserError(f"{root} is not the repository root (no fno.py there): use --root")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    print(f"measuring {len(targets)} results file(s): {', '.join(t.name for t in targets)}",
          flush=True)
    start = time.perf_counter()
    rows = [measure(t, root, args.data_dir, args.runs, env) for t in targets]
    print(f"\n{'target':<20} {'seconds':>8}  load at start -> end", flush=True)
    for r in rows:
        print(f"{r['name']:<20} {r['seconds']:8.0f}  {r['load_start']} -> {r['load_end']}"
              f"{'  FAILED: ' + r['failed'] if r['failed'] else ''}")
    print(f"{'total':<20} {time.perf_counter() - start:8.0f}")
    busy = [r["name"] for r in rows for load in (r["load_start"], r["load_end"])
            if busy_warning(load, "") is not None]
    if busy:
        names = " ".join(dict.fromkeys(busy))
        print(f"warning: the machine was busy during {names}: measure them again when it is idle "
              f"(make results ONLY=\"{names}\")")
    failed = [r for r in rows if r["failed"]]
    if failed:
        raise UserError(f"{len(failed)} of {len(rows)} results target(s) failed: "
                        + "; ".join(f"{r['name']}: {r['failed']}" for r in failed))
    return 0


if __name__ == "__main__":
    run_main(main)
