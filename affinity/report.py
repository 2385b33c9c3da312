"""Where does each rank and worker run? A Python hello_jobstep.

    python affinity/report.py                       # this process
    python affinity/report.py --bind --workers 3    # bind like a training rank, then 3 pinned workers
    srun -n 8 python affinity/report.py --bind      # one line per rank

One line per process:
  host=... rank=R local_rank=L worker=W cpus=LIST (N) cpu_numa=NODES gpu=I pci=ADDR gpu_numa=G match=yes|NO|n/a
`match` says whether every CPU of the process is on the GPU's NUMA node.
From a training script: print(report_line(device=device)).
"""
from __future__ import annotations

import argparse
import os
import socket


from affinity.discover import Topology, discover, format_cpulist
from wellfno.cli import UserError, run_main


def _env_int(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def format_report(*, host: str, rank, local_rank, worker, cpus, topo: Topology,
                  gpu_index=None, gpu_pci: str | None = None) -> str:
    """The report line from plain facts (testable against a fixture topology)."""
    cpu_numa = topo.numa_nodes_of(cpus)
    gpu = next((g for g in topo.gpus if g.pci == gpu_pci), None) if gpu_pci else None
    if gpu_pci is None:
        gpu_numa, match = "-", "n/a"
    elif gpu is None:
        gpu_numa, match = "?", "n/a"  # the PCI tree is hidden (container): cannot tell
    else:
        gpu_numa = str(gpu.numa)
        match = "yes" if cpu_numa == [gpu.numa] else "NO"

    def show(v):
        return "-" if v is None else str(v)

    return (f"host={host} rank={show(rank)} local_rank={show(local_rank)} worker={show(worker)} "
            f"cpus={format_cpulist(cpus)} ({len(set(cpus))}) cpu_numa={','.join(map(str, cpu_numa))} "
            f"gpu={show(gpu_index)} pci={show(gpu_pci)} gpu_numa={gpu_numa} match={match}")


def report_line(device=None, worker_id=None, rank=None, local_rank=None, sysfs: str = "/sys") -> str:
    """Report for the calling process. `device`: its torch device (a cuda device adds GPU id, PCI
    bus id and the GPU's NUMA node); rank/local_rank default to RANK/SLURM_PROCID and
    LOCAL_RANK/SLURM_LOCALID."""
    cpus = os.sched_getaffinity(0)
    topo = discover(sysfs, allowed_cpus=cpus)
    gpu_index = gpu_pci = None
    if device is not None and getattr(device, "type", str(device).split(":")[0]) == "cuda":
        import torch
        from affinity.bind import visible_gpu_pci
        gpu_index = device.index if getattr(device, "index", None) is not None else torch.cuda.current_device()
        gpu_pci = visible_gpu_pci(torch)[gpu_index]
    return format_report(host=socket.gethostname(),
                         rank=_env_int("RANK", "SLURM_PROCID") if rank is None else rank,
                         local_rank=_env_int("LOCAL_RANK", "SLURM_LOCALID") if local_rank is None else local_rank,
                         worker=worker_id, cpus=cpus, topo=topo, gpu_index=gpu_index, gpu_pci=gpu_pci)


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
    ap.add_argument("--mode", default="exclusive", help="plan mode for --bind (exclusive|node|core-complex)")
    ap.add_argument("--workers", type=int, default=0, help="also start this many pinned DataLoader workers")
    ap.add_argument("--sysfs", default="/sys", help="sysfs root (default /sys)")
    args = ap.parse_args(argv)
    if args.workers < 0:
        raise UserError("--workers must be 0 or more")
    device = None
    cpus = sorted(os.sched_getaffinity(0))
    if args.bind or args.workers:
        import torch
        if args.bind:
            from affinity.bind import bind_this_rank
            cpus, device = bind_this_rank(mode=args.mode, sysfs=args.sysfs)
        elif torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
    print(report_line(device=device, sysfs=args.sysfs), flush=True)
    if args.workers:
        import torch
        from affinity.bind import worker_init_fn
        loader = torch.utils.data.DataLoader(_Tiny(args.workers), batch_size=1, num_workers=args.workers,
                                             worker_init_fn=worker_init_fn(cpus, report=True, sysfs=args.sysfs))
        for _ in loader:
            pass
    return 0


if __name__ == "__main__":
    run_main(main)
