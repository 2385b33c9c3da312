"""What does profiling cost? The same training steps with the profiler schedule and without, side by side.

    python profiling/overhead.py                         # embedded dataset in ./data, the solution's loop
    python profiling/overhead.py --data-dir /tmp/tiny --repeats 5 --script fno_mine.py

Runs `train_one_epoch` of the profiled script (default solutions/01_profiling/fno.py) for
wait + warmup + active + after steps, once with prof=None (the record_function ranges are
there, no profiler) and once inside torch.profiler.profile with the schedule
(wait, warmup, active, repeat=1), alternating which goes first, `--repeats` times. Every run
starts from the same weights and the same shuffled batches. A step's time is the time between
two prof.step() calls, prof.step() included, so the trace export at the end of the window
is counted in the last active step.

Prints steps/s of each mode and the ratio for the steps outside the window (wait and after:
the profiler is idle there, target < 5 % slower) and inside it (warmup + active: recording),
plus the cost of an idle record_function range. On a shared machine compare ratios from one
run; each mode's number is the sum over its repeats.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import DataLoader

from wellfno import data
from wellfno.cli import UserError, atomic_write_json, run_main
from wellfno.device import DEVICE_CHOICES, pick_device
from benchtools.machine import cpu_model
from wellfno.model import NextFrameFNO, channel_stats


class StepClock:
    """Stands in for the profiler in train_one_epoch: timestamps every step, forwards to the real one."""

    def __init__(self, prof=None):
        self.prof, self.durations, self.last = prof, [], time.perf_counter()

    def step(self):
        if self.prof is not None:
            self.prof.step()
        now = time.perf_counter()
        self.durations.append(now - self.last)
        self.last = now


def load_script(path: Path):
    if not path.is_file():
        raise UserError(f"{path}: no such script (pass --script with your profiled fno.py)")
    spec = importlib.util.spec_from_file_location("profiled_fno", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "train_one_epoch"):
        raise UserError(f"{path} has no train_one_epoch(model, loader, optimizer, device, epoch, steps_left, prof)")
    return module


def run(script, setup, n_steps, prof):
    """n_steps training steps from fresh, identical weights and batches; the step durations (s)."""
    torch.manual_seed(0)
    model = NextFrameFNO.for_dataset(setup["dataset"], 1, setup["stats"]).to(setup["device"])
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    loader = DataLoader(setup["dataset"], batch_size=setup["batch_size"], shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    clock, epoch = StepClock(prof), 1
    while len(clock.durations) < n_steps:
        # prof by name: the solution's signature has untimed_steps before it
        script.train_one_epoch(model, loader, optimizer, setup["device"], epoch, n_steps - len(clock.durations),
                               prof=clock)
        epoch += 1
    return clock.durations


def idle_record_function_us(n=20000) -> float:
    start = time.perf_counter()
    for _ in range(n):
        with record_function("idle"):
            pass
    return (time.perf_counter() - start) / n * 1e6


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=os.environ.get("WELL_DATA", "data"))
    p.add_argument("--dataset", default=data.EMBEDDED)
    p.add_argument("--script", default=str(REPO / "solutions/01_profiling/fno.py"),
                   help="script whose train_one_epoch is measured")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--wait", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--active", type=int, default=5)
    p.add_argument("--after", type=int, default=10, help="steps after the window (profiler idle again)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    p.add_argument("--json", help="also write the numbers to this JSON file")
    p.add_argument("--results", help="also write them to this results file (coursetools.results: the docs' tables)")
    args = p.parse_args(argv)
    if min(args.wait, args.after) < 1 or args.active < 1 or args.warmup < 0 or args.repeats < 1:
        raise UserError("--wait, --after, --active and --repeats must be at least 1, --warmup at least 0")
    script = load_script(Path(args.script).resolve())
    device = pick_device(args.device)
    dataset_dir = data.resolve_dataset(args.data_dir, args.dataset)
    train = data.well_datasets(dataset_dir)["train"]
    stats = channel_stats(data.load_stats(dataset_dir), train.core_field_names)
    setup = dict(device=device, dataset=train, batch_size=args.batch_size, stats=stats)
    n_steps = args.wait + args.warmup + args.active + args.after
    window = range(args.wait, args.wait + args.warmup + args.active)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    print(f"{cpu_model()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {device}; {n_steps} steps "
          f"(wait {args.wait}, warmup {args.warmup}, active {args.active}, after {args.after}) x {args.repeats}")

    times = {"plain": [], "profiled": []}  # per repeat: list of step durations
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mode in (("plain", "profiled") if repeat % 2 == 0 else ("profiled", "plain")):
                if mode == "plain":
                    durations = run(script, setup, n_steps, None)
                else:
                    with profile(activities=activities, record_shapes=True,
                                 schedule=schedule(wait=args.wait, warmup=args.warmup, active=args.active, repeat=1),
                                 on_trace_ready=lambda prof: prof.export_chrome_trace(f"{tmp}/trace.json")) as prof:
                        durations = run(script, setup, n_steps, prof)
                times[mode].append(durations)
                print(f"  repeat {repeat + 1} {mode:8s}: {n_steps / sum(durations):6.2f} steps/s", flush=True)

    def rate(mode, indices):
        # 1 / median step time: on a shared machine a few steps stall for seconds, and a mean
        # would measure those stalls rather than the profiler.
        steps = [d for run_ in times[mode] for i, d in enumerate(run_) if i in indices]
        return 1.0 / statistics.median(steps)

    before = set(range(args.wait))
    after = set(range(window.stop, n_steps))
    groups = (  # the solution stops right after the window, so "before" is what a real run pays
        ("before the window (wait)", "before", before),
        ("outside the window (wait + after)", "outside", before | after),
        ("inside the window (warmup + active)", "inside", set(window)),
    )
    result = {}
    for label, key, indices in groups:
        plain, profiled = rate("plain", indices), rate("profiled", indices)
        result[key] = dict(plain_steps_per_s=plain, profiled_steps_per_s=profiled, ratio=profiled / plain)
        print(f"{label:38s} plain {plain:6.2f} steps/s  profiled {profiled:6.2f} steps/s  "
              f"ratio {profiled / plain:.3f} ({100 * (1 - profiled / plain):+.1f} % slower)")
    idle_us = idle_record_function_us()
    mean_step_ms = 1e3 / result["outside"]["plain_steps_per_s"]
    print(f"an idle record_function range costs {idle_us:.1f} us: 5 per step = "
          f"{100 * 5 * idle_us / 1e3 / mean_step_ms:.3f} % of a {mean_step_ms:.0f} ms step")
    result.update(idle_record_function_us=idle_us, cpu=cpu_model(), cpus=os.cpu_count(), device=str(device),
                  torch=torch.__version__, config=vars(args), step_seconds=times)
    if args.json:
        atomic_write_json(args.json, result)
    if args.results:
        import sys

        from benchtools.resultfiles import write_result
        write_result(args.results, " ".join(["python", "profiling/overhead.py", *(argv if argv is not None else sys.argv[1:])]),
                     result, device)


if __name__ == "__main__":
    run_main(main)
