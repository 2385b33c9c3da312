"""Torch's intra-op threads next to other work: training samples/s alone and next to busy processes.

    python profiling/threads.py --data-dir data --threads 1,2 --busy 0,1 --results results/threads.json

For every (threads, busy) pair, round-robin `--repeats` rounds: start `busy` processes that spin
on a core each (what another rank, a DataLoader worker or another user's job does), set
torch.set_num_threads(threads), and time the training step of fno.py on one batch already in
memory (profiling/throughput.py's compute-only: no data loading at all), then stop them. Each
number is the best round. torch's thread pool waits for all its threads at every operator, so a
thread that loses its core to another process stalls the whole step: with more threads than free
cores the step gets slower, not faster (INSTRUCTORS.md, "Threads oversubscribing the cores").
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch

from profiling.throughput import Trainer, int_list, timed
from wellfno import data
from wellfno.cli import UserError, run_main
from wellfno.device import pick_device
from wellfno.fastwell import FastWellDataset
from wellfno.model import channel_stats


def busy_processes(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=os.environ.get("WELL_DATA", "data"),
                   help="folder that holds datasets/ (default $WELL_DATA or ./data)")
    p.add_argument("--dataset", default=data.EMBEDDED)
    p.add_argument("--threads", default="1,2", help="torch intra-op thread counts (default 1,2)")
    p.add_argument("--busy", default="0,1", help="numbers of busy processes next to it (default 0,1)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seconds", type=float, default=2.0, help="timed seconds per measurement")
    p.add_argument("--repeats", type=int, default=2, help="round-robin rounds; each number is the best round")
    p.add_argument("--results", help="also write the table to this results file (coursetools.results)")
    args = p.parse_args(argv)
    threads = int_list(args.threads, "--threads", 1)
    busy = int_list(args.busy, "--busy", 0)
    if args.batch_size < 1 or args.repeats < 1 or args.seconds <= 0:
        raise UserError("--batch-size and --repeats must be at least 1, --seconds positive")
    device = pick_device("cpu")  # threads compete for CPU cores; on a GPU node the model is not on them
    dataset_dir = data.resolve_dataset(args.data_dir, args.dataset)
    train = FastWellDataset(dataset_dir, "train", 1)
    stats = channel_stats(data.load_stats(dataset_dir), train.core_field_names)
    trainer = Trainer(train, 1, stats, device, 0)
    sample = train[0]
    x, y = data.batch_to_model({k: v.unsqueeze(0).expand(args.batch_size, *v.shape) for k, v in sample.items()},
                               device)
    batches = iter(lambda: (x, y), None)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the start", flush=True)
    default_threads = torch.get_num_threads()
    best = {(t, b): 0.0 for t in threads for b in busy}
    for round_ in range(args.repeats):
        for t, b in best:
            torch.set_num_threads(t)
            others = busy_processes(b)
            try:
                rate = timed(batches, lambda batch: trainer.train(*batch), device, 3, args.seconds)
            finally:
                for proc in others:
                    proc.kill()
                    proc.wait()
            best[(t, b)] = max(best[(t, b)], rate)
            print(f"round {round_ + 1}: {t} thread(s), {b} busy: {rate:7.1f} samples/s", flush=True)
    print("| torch threads | " + " | ".join(f"{b} busy" for b in busy) + " |")
    for t in threads:
        print(f"| {t} | " + " | ".join(f"{best[(t, b)]:.0f}" for b in busy) + " |")
    torch.set_num_threads(default_threads)   # the results file names the process's own setting
    if args.results:
        from benchtools.resultfiles import write_result
        rows = [dict(threads=t, busy_processes=b, samples_per_s=round(v, 1)) for (t, b), v in best.items()]
        command = " ".join(["python", "profiling/threads.py", *(argv if argv is not None else sys.argv[1:])])
        print(f"wrote {write_result(args.results, command, dict(batch_size=args.batch_size, rows=rows))}")


if __name__ == "__main__":
    run_main(main)
