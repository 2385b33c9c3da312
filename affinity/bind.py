"""Bind this rank (CPUs + GPU) and pin its DataLoader workers.

    from affinity.bind import bind_this_rank, worker_init_fn
    cpus, device = bind_this_rank(mode="exclusive")      # torchrun or srun: wellfno.launch
    loader = DataLoader(ds, num_workers=4, worker_init_fn=worker_init_fn(cpus))

The binding itself: every thread's CPU mask, the rank's CPUs and torch's threads, each
DataLoader worker's slice of them. Exercise 03 teaches it: solutions/03_affinity/binding.py is
this code as a participant writes it (the same syntax trees, tests/test_taught_modules.py), and
solution 03 imports it from there; the later steps import this copy. Where the rank should run is
planned in affinity.plan (plan_this_rank), from the node affinity.discover found.

Why pin workers explicitly: a forked DataLoader worker inherits the affinity of the thread that
forked it. If that thread had been pinned to one core (an OpenMP runtime with
KMP_AFFINITY/GOMP_CPU_AFFINITY/OMP_PROC_BIND binds the main thread; a launcher gave the task one
CPU), every worker lands on that one core and the input pipeline runs at 1/N speed.
worker_init_fn gives each worker its own slice of the rank's cores instead.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

from affinity.discover import discover, visible_gpu_pci
from affinity.placement import ReportThen, WorkerReport
from affinity.plan import (MODES, core_share, cpus_bound_by_launcher, device_index_for,
                           physical_cores, plan_this_rank)
from wellfno.cli import UserError
from wellfno.launch import LaunchEnv, launch_environment


def set_affinity_all_threads(cpus, include_pinned: bool = False) -> dict[int, set[int]]:
    """Set the CPU mask of this process's threads; returns each changed thread's previous mask.

    sched_setaffinity(0) binds only the calling thread; threads started earlier (a torch intra-op
    pool, autograd's device threads, a logging thread) keep their mask. Like torch.numa, rebind
    every thread that still has the calling thread's mask, and leave deliberately pinned ones
    alone, unless include_pinned (a benchmark that moves the whole process between conditions)."""
    cpus = set(cpus)
    original = os.sched_getaffinity(0)
    previous = {}
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = []
    for tid in tids:
        try:
            mask = os.sched_getaffinity(tid)
            if include_pinned or mask == original:
                os.sched_setaffinity(tid, cpus)
                previous[tid] = mask
        except OSError:  # the thread exited meanwhile
            pass
    if not tids:
        os.sched_setaffinity(0, cpus)
        previous[0] = original
    return previous


def bind_this_rank(mode: str = "exclusive", sysfs: str = "/sys", set_threads: bool = True,
                   torch_module=None, env: Mapping[str, str] | None = None,
                   launch: LaunchEnv | None = None):
    """Pin this process to its planned CPUs and pick its GPU. Returns (cpus, device).

    Local rank and ranks per node: `launch`, else from torchrun or srun
    (wellfno.launch.launch_environment, which keeps answering what the launcher set after
    export_rendezvous rewrote RANK and LOCAL_RANK; an inconsistent environment is a one-line
    UserError). CPUs stay within what this process may use (a Slurm cpuset or an earlier binding
    is respected, never widened). Intra-op threads: one per physical core it got.

    mode 'none': no pinning (torch's threads and the workers go where the OS puts them): returns
    the CPUs this process may use, as they are, and the GPU its local rank drives. Any other mode
    than those of affinity.plan.MODES and 'none' is a one-line UserError, before anything."""
    if mode not in (*MODES, "none"):
        raise UserError(f"unknown bind mode {mode!r}; choose one of {', '.join(MODES)}, none")
    if torch_module is None:
        import torch as torch_module
    torch = torch_module
    env = os.environ if env is None else env
    launch = launch_environment(env) if launch is None else launch
    if mode == "none":  # nothing pinned, no warning: the rank's GPU only
        gpus = len(visible_gpu_pci(torch, sysfs))
        if not gpus:
            return sorted(os.sched_getaffinity(0)), torch.device("cpu")
        device = torch.device("cuda", device_index_for(launch.local_rank, launch.local_world_size,
                                                       gpus, launch.step_gpus, launch.launcher))
        torch.cuda.set_device(device)
        return sorted(os.sched_getaffinity(0)), device
    topo = discover(sysfs)  # allowed = what this process may use now
    binding = plan_this_rank(topo, mode, launch, visible_gpu_pci(torch, sysfs),
                             cpus_bound_by_launcher(launch, env))
    if binding.warning:
        print(f"affinity: warning: rank {launch.rank}: {binding.warning}", file=sys.stderr,
              flush=True)
    if binding.device_index is None:
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", binding.device_index)
        torch.cuda.set_device(device)
    set_affinity_all_threads(binding.cpus)
    if set_threads:
        # SMT siblings share the FPU; more threads than cores mostly add contention.
        torch.set_num_threads(max(1, len(physical_cores(binding.cpus, topo.core_of))))
    return sorted(binding.cpus), device


def worker_cpus(cpus, worker_id: int, num_workers: int,
                core_of: dict[int, int] | None = None) -> set[int]:
    """CPUs of DataLoader worker `worker_id` of `num_workers` within a rank's `cpus`.

    Workers <= cores: contiguous blocks of cores (affinity.plan.core_share: lower workers get the
    remainder, SMT siblings stay together), disjoint sets. More workers than cores: worker w
    shares core w mod #cores (round robin, still spread)."""
    cpus = set(cpus)
    if num_workers <= 0:
        return cpus
    cores = physical_cores(cpus, core_of)
    if num_workers > len(cores):
        return cores[worker_id % len(cores)]
    return core_share(cpus, core_of, worker_id, num_workers)


class WorkerPinner:
    """worker_init_fn for torch DataLoader (a class, so it pickles for spawn/forkserver)."""

    def __init__(self, cpus, threads_per_worker: int = 1, core_of: dict[int, int] | None = None,
                 then=None):
        self.cpus = sorted(cpus)
        self.threads_per_worker = threads_per_worker
        self.core_of = core_of
        self.then = then

    def __call__(self, worker_id: int) -> None:
        import torch
        info = torch.utils.data.get_worker_info()
        num_workers = info.num_workers if info is not None else 1
        set_affinity_all_threads(worker_cpus(self.cpus, worker_id, num_workers, self.core_of))
        # A worker decodes one sample at a time; several torch threads per worker would
        # oversubscribe the cores the workers share between them.
        torch.set_num_threads(self.threads_per_worker)
        if self.then is not None:
            self.then(worker_id)


def worker_init_fn(cpus, threads_per_worker: int = 1, report: bool = False, sysfs: str = "/sys",
                   then=None) -> WorkerPinner:
    """DataLoader(..., worker_init_fn=worker_init_fn(cpus)) pins worker w to its own slice of
    `cpus` (see worker_cpus), then calls then(worker_id). report=True is short for
    then=affinity.placement.WorkerReport(): each worker prints its placement line.
    The SMT layout is read once here, not in every worker."""
    try:
        core_of = discover(sysfs, allowed_cpus=set(cpus)).core_of
    except UserError:
        core_of = None  # e.g. no sysfs in a sandbox: treat every CPU as its own core
    if report:
        then = ReportThen(WorkerReport(sysfs=sysfs), then)
    return WorkerPinner(cpus, threads_per_worker, core_of, then)
