"""Where does this process run? The one-line placement report of a rank or a DataLoader worker.

    host=... rank=R local_rank=L worker=W cpus=LIST (N) cpu_numa=NODES gpu=I pci=ADDR gpu_numa=G match=yes|NO|n/a

`match` says whether every CPU of the process is on the NUMA node of the GPU it drives.
A library below bind.py and the report.py script: bind's workers report through its `then=`
hook with WorkerReport, and report.py prints these lines for ranks.
"""
from __future__ import annotations

import os
import socket
import sys

from affinity.discover import Topology, discover, format_cpulist, visible_gpu_pci
from affinity.plan import device_index_for
from wellfno.launch import launch_environment


def format_report(*, host: str, rank, local_rank, worker, cpus, topo: Topology,
                  gpu_index=None, gpu_pci: str | None = None) -> str:
    """The report line from plain facts (testable against a fixture topology).
    gpu_index set but gpu_pci None: the rank drives a GPU whose PCI address nobody could tell."""
    cpu_numa = topo.numa_nodes_of(cpus)
    gpu = next((g for g in topo.gpus if g.pci == gpu_pci), None) if gpu_pci else None
    if gpu_index is None and gpu_pci is None:
        gpu_numa, match = "-", "n/a"
    elif gpu is None:
        gpu_numa, match = "?", "n/a"  # the PCI tree is hidden (container) or the address unknown
    else:
        gpu_numa = str(gpu.numa)
        match = "yes" if cpu_numa == [gpu.numa] else "NO"

    def show(v):
        return "-" if v is None else str(v)

    return (f"host={host} rank={show(rank)} local_rank={show(local_rank)} worker={show(worker)} "
            f"cpus={format_cpulist(cpus)} ({len(set(cpus))}) cpu_numa={','.join(map(str, cpu_numa))} "
            f"gpu={show(gpu_index)} pci={'?' if gpu_index is not None and gpu_pci is None else show(gpu_pci)} "
            f"gpu_numa={gpu_numa} match={match}")


def rank_gpu(device=None, torch_module=None, sysfs: str = "/sys", env=None) -> tuple[int | None, str | None]:
    """(torch device index, PCI address) of the GPU this rank drives; (None, None) on the CPU.

    `device`: the rank's torch device (a cpu device means no GPU). None: when torch sees GPUs, the
    one this local rank drives (affinity.plan.device_index_for), so a report needs no --bind."""
    if device is not None and getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return None, None
    if torch_module is None:
        import torch as torch_module
    if not torch_module.cuda.is_available():
        return None, None
    pcis = visible_gpu_pci(torch_module, sysfs)
    if device is not None and getattr(device, "index", None) is not None:
        index = device.index
    elif device is not None:
        index = torch_module.cuda.current_device()
    else:
        launch = launch_environment(env)
        index = device_index_for(launch.local_rank, launch.local_world_size, len(pcis), launch.step_gpus, launch.launcher)
    return index, pcis[index] if index < len(pcis) else None


def report_line(device=None, worker_id=None, rank=None, local_rank=None, sysfs: str = "/sys",
                gpu: tuple[int | None, str | None] | None = None) -> str:
    """Report for the calling process. rank/local_rank default to the launcher's
    (wellfno.launch.launch_environment); the GPU is `gpu` (index, PCI) when given, else rank_gpu(device)."""
    cpus = os.sched_getaffinity(0)
    topo = discover(sysfs, allowed_cpus=cpus)
    launch = launch_environment() if rank is None or local_rank is None else None
    gpu_index, gpu_pci = rank_gpu(device, sysfs=sysfs) if gpu is None else gpu
    return format_report(host=socket.gethostname(),
                         rank=launch.rank if rank is None else rank,
                         local_rank=launch.local_rank if local_rank is None else local_rank,
                         worker=worker_id, cpus=cpus, topo=topo, gpu_index=gpu_index, gpu_pci=gpu_pci)


class WorkerReport:
    """`then=` hook for affinity.bind.worker_init_fn: each DataLoader worker prints its line.

    The rank's GPU is looked up here, in the parent: a forked worker must not touch CUDA."""

    def __init__(self, device=None, sysfs: str = "/sys", gpu: tuple[int | None, str | None] | None = None):
        self.sysfs = sysfs
        self.gpu = rank_gpu(device, sysfs=sysfs) if gpu is None else gpu

    def __call__(self, worker_id: int) -> None:
        # One write per line: workers share the pipe, and print() may split text and newline.
        sys.stdout.write(report_line(worker_id=worker_id, sysfs=self.sysfs, gpu=self.gpu) + "\n")
        sys.stdout.flush()


class ReportThen:
    """worker_init_fn(report=True) with a then= of the caller's: the report, then theirs, in that
    order (a class: it pickles)."""

    def __init__(self, report: WorkerReport, after=None):
        self.report, self.after = report, after

    def __call__(self, worker_id: int) -> None:
        self.report(worker_id)
        if self.after is not None:
            self.after(worker_id)
