"""Data-pipeline throughput: is training waiting for data?

    python profiling/throughput.py --data-dir /tmp/demo_data --out runs/throughput
    python profiling/throughput.py --data-dir $WELL_DATA --out runs/throughput_gpu --device cuda \\
        --workers 0,1,2,4,8,16 --pin-memory off,on --prefetch-factor 2,4

For every DataLoader configuration (reader x num_workers x pin_memory x prefetch_factor)
it measures, in samples/s:
  data_only     iterate the DataLoader and move every batch to the device; no model
  full          the training step of fno.py (forward, loss, backward, Adam) on those batches
and compute_only: the same training step on a synthetic batch already on the device (the
best of one measurement next to each configuration), the upper bound for `full`. Pipeline efficiency = full / compute_only.
Before the sweep, the readers alone (no DataLoader) read the same shuffled windows:
raw h5py slices (the limit), wellfno.fastwell and the_well's WellDataset.

Configurations are measured round-robin, `--repeats` rounds, and each number is the
best of its rounds: on a shared machine interference only ever slows a run down, so
the best round is the one closest to what the configuration can do. Compare ratios
from one run, not numbers across runs.

Writes OUT/throughput.json, OUT/throughput.csv and OUT/throughput.png.

Whole training scripts are compared by profiling/compare_scripts.py (exercise 02's results table).
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, RandomSampler

from wellfno import data
from wellfno.cli import UserError, atomic_write_json, atomic_write_text, run_main
from wellfno.device import DEVICE_CHOICES, pick_device
from wellfno.fastwell import FastWellDataset
from benchtools.machine import cpu_model
from wellfno.model import NextFrameFNO, channel_stats

READERS = ("well", "fast")
COLUMNS = ("reader", "num_workers", "pin_memory", "prefetch_factor", "data_only", "compute_only", "full",
           "efficiency")


def int_list(text: str, option: str, minimum: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{option} takes comma-separated whole numbers, e.g. 0,1,2: got '{text}'") from None
    if not values or min(values) < minimum:
        raise UserError(f"{option} values must be at least {minimum}: got '{text}'")
    return sorted(set(values))


def choice_list(text: str, option: str, choices) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    wrong = [v for v in values if v not in choices]
    if not values or wrong:
        raise UserError(f"{option} takes a comma-separated list of {', '.join(choices)}: got '{text}'")
    return list(dict.fromkeys(values))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=os.environ.get("WELL_DATA", "data"),
                   help="folder that holds datasets/ (default $WELL_DATA or ./data)")
    p.add_argument("--dataset", default=data.EMBEDDED)
    p.add_argument("--out", default="runs/throughput", help="output folder")
    p.add_argument("--workers", default="0,1,2,3", help="num_workers to sweep (default 0,1,2,3)")
    p.add_argument("--pin-memory", default=None,
                   help="off,on (default: off,on with a GPU, off on CPU, where there is nothing to pin for)")
    p.add_argument("--prefetch-factor", default="2,4", help="prefetch_factor to sweep, used with workers > 0")
    p.add_argument("--readers", default="well,fast", help="well (the_well's WellDataset), fast (wellfno.fastwell)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--n-steps-input", type=int, default=1)
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per measurement")
    p.add_argument("--warmup", type=int, default=3, help="untimed batches first (worker start-up, first reads)")
    p.add_argument("--repeats", type=int, default=2, help="round-robin rounds; each number is the best round")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads of the main process (0: torch's default)")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", help="also write the numbers to this results file (coursetools.results: the docs' tables)")
    args = p.parse_args(argv)
    for name in ("batch_size", "n_steps_input", "repeats"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    if args.seconds <= 0 or args.warmup < 1 or args.threads < 0:
        raise UserError("--seconds must be positive, --warmup at least 1, --threads 0 or more")
    args.workers = int_list(args.workers, "--workers", 0)
    args.prefetch_factor = int_list(args.prefetch_factor, "--prefetch-factor", 1)
    args.readers = choice_list(args.readers, "--readers", READERS)
    args.device = pick_device(args.device)
    pin = choice_list(args.pin_memory or ("off,on" if args.device.type == "cuda" else "off"), "--pin-memory",
                      ("off", "on"))
    if "on" in pin and args.device.type == "cpu":
        # Pinned (page-locked) host memory only speeds up copies to an accelerator; on CPU
        # there is no copy, and torch would warn and not pin anyway.
        print("note: --pin-memory on needs a GPU; measuring pin_memory=off only on cpu", file=sys.stderr)
        pin = ["off"]
    args.pin_memory = [v == "on" for v in pin]
    return args


def configurations(args) -> list[dict]:
    """Every DataLoader setting to measure; prefetch_factor only exists with workers."""
    configs = []
    for reader in args.readers:
        for workers in args.workers:
            for pin in args.pin_memory:
                for prefetch in (args.prefetch_factor if workers else [None]):
                    configs.append(dict(reader=reader, num_workers=workers, pin_memory=pin, prefetch_factor=prefetch))
    return configs


def make_loader(dataset, config: dict, batch_size: int, seed: int) -> DataLoader:
    # Sampling with a long, lazily drawn sequence of permutations, so one iterator outlasts any
    # measurement and no worker restarts at an epoch boundary fall inside the timed window.
    sampler = RandomSampler(dataset, num_samples=10**9, generator=torch.Generator().manual_seed(seed))
    extra = {}
    if config["num_workers"]:
        extra = dict(prefetch_factor=config["prefetch_factor"], generator=torch.Generator().manual_seed(seed))
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=config["num_workers"],
                      pin_memory=config["pin_memory"], **extra)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(batches, step, device, warmup: int, seconds: float) -> float:
    """samples/s of `step(batch)` over `batches`, after `warmup` untimed batches, for about `seconds`."""
    iterator = iter(batches)
    for _ in range(warmup):
        step(next(iterator))
    synchronize(device)
    samples, start = 0, time.perf_counter()
    while True:
        samples += step(next(iterator))
        if time.perf_counter() - start >= seconds:
            break
    synchronize(device)
    rate = samples / (time.perf_counter() - start)
    del iterator  # shuts its workers down before the next measurement
    return rate


class Trainer:
    """The training step of fno.py, on batches from a loader or on one synthetic device batch."""

    def __init__(self, dataset, n_steps_input, stats, device, seed):
        torch.manual_seed(seed)
        self.device = device
        self.model = NextFrameFNO.for_dataset(dataset, n_steps_input, stats).to(device)  # 2-D or 3-D
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)

    def train(self, x, y) -> int:
        loss = self.model.loss(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return len(x)

    def full_step(self, batch) -> int:
        return self.train(*data.batch_to_model(batch, self.device, non_blocking=True))


def data_step(device):
    def step(batch) -> int:
        x, y = data.batch_to_model(batch, device, non_blocking=True)  # the copies finish by synchronize()
        return len(x)
    return step


def measure_readers(datasets: dict, args, rounds: int) -> dict:
    """Samples/s of raw h5py slices (the limit), FastWellDataset and WellDataset on the same windows."""
    import h5py

    fast = datasets.get("fast") or FastWellDataset(args.dataset_dir, "train", args.n_steps_input)
    well = datasets.get("well") or data.well_datasets(args.dataset_dir, args.n_steps_input)["train"]
    order = torch.randperm(len(fast), generator=torch.Generator().manual_seed(args.seed)).tolist()
    files = [h5py.File(path, "r") for path in fast.files_paths]
    fields = [[f[group][name] for group, name, _ in fast.field_layout] for f in files]

    def raw(indices):  # what any reader must at least do: one slice per field and window
        files, trajectories, starts = fast.locate(indices)
        for file_idx, trajectory, start in zip(files.tolist(), trajectories.tolist(), starts.tolist()):
            for dset in fields[file_idx]:
                dset[trajectory, start:start + fast.window]

    readers = {"raw_h5py": raw, "fast": fast.__getitems__, "well": lambda indices: [well[i] for i in indices]}
    best = dict.fromkeys(readers, 0.0)
    for _ in range(rounds):
        for name, read in readers.items():
            position, samples, start = 0, 0, time.perf_counter()
            while time.perf_counter() - start < args.seconds / 2:
                indices = [order[(position + i) % len(order)] for i in range(args.batch_size)]
                read(indices)
                position, samples = position + args.batch_size, samples + args.batch_size
            best[name] = max(best[name], samples / (time.perf_counter() - start))
    for f in files:
        f.close()
    return dict(samples_per_s=best, fast_over_raw=best["fast"] / best["raw_h5py"],
                fast_over_well=best["fast"] / best["well"], well_over_raw=best["well"] / best["raw_h5py"])


def machine(device) -> dict:
    model = cpu_model()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = dict(cpu=model, cores=usable, torch=torch.__version__, threads=torch.get_num_threads(), device=str(device))
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def table(rows) -> str:
    head = f"{'reader':6s} {'workers':>7s} {'pin':>4s} {'prefetch':>8s} {'data_only':>10s} {'compute':>9s} {'full':>9s} {'full/compute':>12s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['reader']:6s} {r['num_workers']:7d} {'on' if r['pin_memory'] else 'off':>4s} "
                     f"{'-' if r['prefetch_factor'] is None else r['prefetch_factor']:>8} {r['data_only']:10.0f} "
                     f"{r['compute_only']:9.0f} {r['full']:9.0f} {r['efficiency']:12.2f}")
    return "\n".join(lines)


def figure(rows, readers: list[str], path: Path, title: str) -> None:

    from wellfno.plots import pyplot, save_png

    plt = pyplot()  # the Agg backend: no display on nodes

    fig, axes = plt.subplots(1, len(readers), figsize=(6 * len(readers), 4.2), squeeze=False, sharey=True)
    for ax, reader in zip(axes[0], readers):
        mine = [r for r in rows if r["reader"] == reader]
        series = sorted({(r["pin_memory"], r["prefetch_factor"] or 0) for r in mine if r["num_workers"]}) or [(False, 0)]
        for pin, prefetch in series:
            points = sorted((r["num_workers"], r["data_only"], r["full"]) for r in mine if r["pin_memory"] == pin
                            and (r["num_workers"] == 0 or (r["prefetch_factor"] or 0) == prefetch))
            label = f"pin {'on' if pin else 'off'}, prefetch {prefetch}" if prefetch else f"pin {'on' if pin else 'off'}"
            workers, data_only, full = zip(*points)
            line, = ax.plot(workers, data_only, "o--", label=f"data only ({label})")
            ax.plot(workers, full, "s-", color=line.get_color(), label=f"full ({label})")
        ax.axhline(max(r["compute_only"] for r in mine), color="k", lw=1, label="compute only (upper bound)")
        ax.set(xlabel="num_workers", title=f"reader: {reader}", yscale="log")
        ax.set_xticks(sorted({r["num_workers"] for r in mine}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("samples/s")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_png(fig, path, dpi=110)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    out = Path(args.out)
    args.dataset_dir = data.resolve_dataset(args.data_dir, args.dataset)
    splits = {}
    if "well" in args.readers:
        splits["well"] = data.well_datasets(args.dataset_dir, args.n_steps_input, splits=("train",))["train"]
    if "fast" in args.readers:
        splits["fast"] = FastWellDataset(args.dataset_dir, "train", args.n_steps_input)
    any_split = next(iter(splits.values()))
    stats = channel_stats(data.load_stats(args.dataset_dir), any_split.core_field_names)
    trainer = Trainer(any_split, args.n_steps_input, stats, device, args.seed)
    sample = any_split[0]
    x, y = data.batch_to_model({k: v.unsqueeze(0).expand(args.batch_size, *v.shape) for k, v in sample.items()}, device)
    synthetic = iter(lambda: (x, y), None)  # the same device batch forever: no data pipeline at all
    info = machine(device)
    configs = configurations(args)
    print(f"{len(configs)} configurations x {args.repeats} rounds on {info['cpu']} ({info['cores']} cores), "
          f"{device}, torch threads {info['threads']}, {len(any_split)} samples of {args.dataset_dir}", flush=True)

    readers = measure_readers(splits, args, args.repeats)
    r = readers["samples_per_s"]
    print(f"readers alone: raw h5py {r['raw_h5py']:.0f}, fast {r['fast']:.0f}, WellDataset {r['well']:.0f} samples/s; "
          f"fast/raw {readers['fast_over_raw']:.2f}, fast/WellDataset {readers['fast_over_well']:.1f}x", flush=True)

    best = [dict(config, data_only=0.0, full=0.0) for config in configs]
    compute_only = 0.0
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        # Going past the core count is the point of the sweep; torch's advice against it would repeat per loader.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        for round_ in range(args.repeats):
            for row in best:
                # compute_only next to every configuration: on a shared machine a single measurement
                # can land in someone else's burst, and the upper bound must not be underestimated.
                compute_only = max(compute_only, timed(synthetic, lambda b: trainer.train(*b), device,
                                                       args.warmup, args.seconds))
                dataset = splits[row["reader"]]
                config = {k: row[k] for k in ("num_workers", "pin_memory", "prefetch_factor")}
                row["data_only"] = max(row["data_only"], timed(make_loader(dataset, config, args.batch_size, args.seed),
                                                               data_step(device), device, args.warmup, args.seconds))
                row["full"] = max(row["full"], timed(make_loader(dataset, config, args.batch_size, args.seed),
                                                     trainer.full_step, device, args.warmup, args.seconds))
            print(f"round {round_ + 1}/{args.repeats} done", flush=True)
    rows = [dict(row, compute_only=compute_only, efficiency=row["full"] / compute_only) for row in best]
    print(table(rows))
    for reader in args.readers:
        mine = [row for row in rows if row["reader"] == reader]
        top, zero = max(mine, key=lambda row: row["full"]), [row for row in mine if row["num_workers"] == 0]
        line = (f"{reader}: best full {top['full']:.0f} samples/s with {top['num_workers']} workers "
                f"(pipeline efficiency {top['efficiency']:.2f})")
        for row in mine:
            if zero and row["num_workers"] == 2:
                line += f"; data_only 2 workers / 0 workers = {row['data_only'] / zero[0]['data_only']:.2f}"
                break
        print(line)

    result = dict(machine=info, dataset=str(args.dataset_dir), samples=len(any_split),
                  command=" ".join(["python", "profiling/throughput.py", *(argv if argv is not None else sys.argv[1:])]),
                  config={k: str(v) if k == "device" else v for k, v in vars(args).items() if k != "dataset_dir"},
                  readers=readers, rows=rows)
    atomic_write_json(out / "throughput.json", result)
    if args.results:
        from benchtools.resultfiles import write_result
        write_result(args.results, result["command"], result, device)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: row[k] for k in COLUMNS} for row in rows)
    atomic_write_text(out / "throughput.csv", text.getvalue())
    figure(rows, args.readers, out / "throughput.png",
           f"{info['cpu']}, {info['cores']} cores, {device}; batch {args.batch_size}, {args.dataset_dir.name}")
    print(f"Wrote {out / 'throughput.json'}, {out / 'throughput.csv'}, {out / 'throughput.png'}")


if __name__ == "__main__":
    run_main(main)
