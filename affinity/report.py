"""Where does each rank and worker run? A Python hello_jobstep.

    python affinity/report.py                       # this process (and the GPU its local rank drives)
    python affinity/report.py --bind --workers 3    # bind like a training rank, then 3 pinned workers
    python affinity/report.py --bind --mode none --workers 3   # nothing pinned: where the OS puts them
    srun -n 8 python affinity/report.py --bind      # one line per rank

One line per process (affinity/placement.py):
  host=... rank=R local_rank=L worker=W cpus=LIST (N) cpu_numa=NODES gpu=I pci=ADDR gpu_numa=G match=yes|NO|n/a
`match` says whether every CPU of the process is on the GPU's NUMA node. When torch sees GPUs, a
rank reports the one its local rank drives, bound or not. From a training script:
print(report_line(device=device)).
"""
from __future__ import annotations

import argparse
import os

from affinity.bind import bind_this_rank, worker_init_fn
from affinity.placement import WorkerReport, format_report, report_line
from wellfno.cli import UserError, run_main

__all__ = ["format_report", "report_line", "main"]


class _Tiny:
    """A dataset of a few items, only so DataLoader starts its workers."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--bind", action="store_true", help="bind_this_rank() first, as a training rank would")
    ap.add_argument("--mode", default="exclusive",
                    help="plan mode for --bind (exclusive|node|core-complex), or none: no pinning, "
                         "the workers' neither")
    ap.add_argument("--workers", type=int, default=0,
                    help="also start this many DataLoader workers, pinned (unless --mode none)")
    ap.add_argument("--sysfs", default="/sys", help="sysfs root (default /sys)")
    args = ap.parse_args(argv)
    if args.workers < 0:
        raise UserError("--workers must be 0 or more")
    import torch

    device = None  # report_line: the GPU this local rank drives when torch sees GPUs
    cpus = sorted(os.sched_getaffinity(0))
    if args.bind:
        cpus, device = bind_this_rank(mode=args.mode, sysfs=args.sysfs)
    print(report_line(device=device, sysfs=args.sysfs), flush=True)
    if args.workers:
        report = WorkerReport(device, sysfs=args.sysfs)
        # --mode none pins no worker either: each reports the CPUs it inherited, as it runs
        pinner = report if args.mode == "none" else worker_init_fn(
            cpus, sysfs=args.sysfs, then=report)
        loader = torch.utils.data.DataLoader(_Tiny(args.workers), batch_size=1, num_workers=args.workers,
                                             worker_init_fn=pinner)
        for _ in loader:
            pass
    return 0


if __name__ == "__main__":
    run_main(main)
