"""Bind this rank (CPUs + GPU) and pin its DataLoader workers.

    from affinity.bind import bind_this_rank, pin_worker
    cpus, device = bind_this_rank(mode="exclusive")      # reads LOCAL_RANK or SLURM_LOCALID
    loader = DataLoader(ds, num_workers=4, worker_init_fn=pin_worker(cpus))

Why pin workers explicitly: a forked DataLoader worker inherits the affinity of the thread that
forked it. If that thread had been pinned to one core (an OpenMP runtime with
KMP_AFFINITY/GOMP_CPU_AFFINITY/OMP_PROC_BIND binds the main thread; a launcher gave the task one
CPU), every worker lands on that one core and the input pipeline runs at 1/N speed.
pin_worker gives each worker its own slice of the rank's cores instead.
"""
from __future__ import annotations

import os
import sys


from affinity.discover import discover, format_cpulist
from affinity.plan import make_plan
from wellfno.cli import UserError


def local_rank_from_env(env=None) -> int:
    """torchrun sets LOCAL_RANK, srun sets SLURM_LOCALID; a lone process is local rank 0."""
    env = os.environ if env is None else env
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        if env.get(name, "") != "":
            try:
                return int(env[name])
            except ValueError:
                raise UserError(f"{name}={env[name]!r} is not an integer") from None
    return 0


def local_world_size_from_env(env=None) -> int | None:
    """Ranks on this node: LOCAL_WORLD_SIZE (torchrun) or SLURM_NTASKS_PER_NODE /
    SLURM_STEP_TASKS_PER_NODE (srun; the latter looks like '4(x2)' or '4,3': the first count)."""
    env = os.environ if env is None else env
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE"):
        value = env.get(name, "")
        if value:
            head = value.split(",")[0].split("(")[0]
            if head.isdigit():
                return int(head)
    return None


def visible_gpu_pci(torch_module=None) -> list[str]:
    """sysfs PCI addresses of the GPUs this process sees, in device-index order.

    CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES are already applied by the
    runtime here, so index i of this list is torch.device('cuda', i) whatever the restriction."""
    if torch_module is None:
        import torch as torch_module
    out = []
    for i in range(torch_module.cuda.device_count()):
        p = torch_module.cuda.get_device_properties(i)
        # Same formatting as torch/numa/binding.py (_get_numa_node_index_for_gpu_index).
        out.append(f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0")
    return out


def set_affinity_all_threads(cpus) -> None:
    """sched_setaffinity(0) binds only the calling thread; threads started earlier (a torch
    intra-op pool, a logging thread) keep the old mask. Like torch.numa, rebind every thread
    that still has the process's original mask and leave deliberately pinned ones alone."""
    cpus = set(cpus)
    original = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return
    for tid in tids:
        try:
            if os.sched_getaffinity(tid) == original:
                os.sched_setaffinity(tid, cpus)
        except OSError:  # the thread exited meanwhile
            pass


def physical_core_count(cpus, core_of: dict[int, int] | None) -> int:
    if not core_of:
        return len(set(cpus))
    return len({core_of.get(c, c) for c in cpus})


def bind_this_rank(mode: str = "exclusive", sysfs: str = "/sys", local_rank: int | None = None,
                   set_threads: bool = True, torch_module=None):
    """Pin this process to its planned CPUs and pick its GPU. Returns (cpus, device).

    - local rank from LOCAL_RANK or SLURM_LOCALID (or the argument);
    - GPU: device index = local rank modulo the number of visible devices, so it works both when
      every rank sees all GPUs (torchrun) and when the launcher left one per rank
      (srun --gpus-per-task=1 / --gpu-bind=closest sets CUDA_/ROCR_VISIBLE_DEVICES);
    - CPUs: the plan of `mode` for the visible GPUs, within the CPUs this process is allowed
      (a Slurm cpuset or an earlier binding is respected, never widened);
    - no GPU: disjoint CPU sets per local rank (LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE ranks).
    """
    if torch_module is None:
        import torch as torch_module
    torch = torch_module
    rank = local_rank_from_env() if local_rank is None else local_rank
    topo = discover(sysfs)  # allowed = what this process may use now
    cpus = set(topo.allowed)
    n_visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n_visible > 0:
        index = rank % n_visible
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        by_pci = {g.pci: g for g in topo.gpus}
        pcis = visible_gpu_pci(torch)
        mine = pcis[index]
        if mine in by_pci:
            selected = [by_pci[p].index for p in pcis if p in by_pci]
            plan = make_plan(topo, mode, gpus=selected)
            cpus = set(next(a.cpus for a in plan if a.gpu.pci == mine))
        else:
            # A container or VM can hide the PCI tree; keep the allowed CPUs rather than guess.
            print(f"affinity: GPU {mine} not found under {sysfs}/bus/pci; CPUs left at "
                  f"{format_cpulist(cpus)}", file=sys.stderr)
    else:
        device = torch.device("cpu")
        nranks = max(local_world_size_from_env() or 1, rank + 1)
        try:
            plan = make_plan(topo, mode, nranks=nranks, use_gpus=False)
            cpus = set(plan[rank].cpus)
        except UserError:
            # Fewer cores than local ranks: the launcher already gave this rank its own CPUs
            # (srun's default --cpu-bind=cores), or the node is oversubscribed. Keep them.
            print(f"affinity: {len(cpus)} allowed CPU(s) cannot be split among {nranks} local ranks; "
                  f"keeping {format_cpulist(cpus)}", file=sys.stderr)
    set_affinity_all_threads(cpus)
    if set_threads:
        # One intra-op thread per physical core: SMT siblings share the FPU, extra threads there
        # mostly add contention.
        torch.set_num_threads(max(1, physical_core_count(cpus, topo.core_of)))
    return sorted(cpus), device


def worker_cpus(cpus, worker_id: int, num_workers: int, core_of: dict[int, int] | None = None) -> set[int]:
    """CPUs of DataLoader worker `worker_id` of `num_workers` within a rank's `cpus`.

    Workers <= cores: the cores are split into contiguous blocks (lower workers get the
    remainder), each block with its SMT siblings -- disjoint sets, no two workers on one core.
    More workers than cores: worker w shares core w mod #cores (round robin, still spread)."""
    cpus = set(cpus)
    core_of = core_of or {}
    cores: dict[int, set[int]] = {}
    for c in cpus:
        cores.setdefault(core_of.get(c, c), set()).add(c)
    ordered = [cores[k] for k in sorted(cores)]
    if num_workers <= 0:
        return cpus
    if num_workers > len(ordered):
        return ordered[worker_id % len(ordered)]
    per, extra = divmod(len(ordered), num_workers)
    start = worker_id * per + min(worker_id, extra)
    end = start + per + (1 if worker_id < extra else 0)
    return set().union(*ordered[start:end])


class WorkerPinner:
    """worker_init_fn for torch DataLoader (a class, so it pickles for spawn/forkserver)."""

    def __init__(self, cpus, threads_per_worker: int = 1, report: bool = False,
                 core_of: dict[int, int] | None = None, then=None, sysfs: str = "/sys"):
        self.cpus = sorted(cpus)
        self.sysfs = sysfs
        self.threads_per_worker = threads_per_worker
        self.report = report
        self.core_of = core_of
        self.then = then

    def __call__(self, worker_id: int) -> None:
        import torch
        info = torch.utils.data.get_worker_info()
        num_workers = info.num_workers if info is not None else 1
        mine = worker_cpus(self.cpus, worker_id, num_workers, self.core_of)
        set_affinity_all_threads(mine)
        # A worker decodes one sample at a time; several torch threads per worker would
        # oversubscribe the cores the workers share between them.
        torch.set_num_threads(self.threads_per_worker)
        if self.report:
            from affinity.report import report_line
            # One write per line: workers share the pipe, and print() may split text and newline.
            sys.stdout.write(report_line(worker_id=worker_id, sysfs=self.sysfs) + "\n")
            sys.stdout.flush()
        if self.then is not None:
            self.then(worker_id)


def worker_init_fn(cpus, threads_per_worker: int = 1, report: bool = False, sysfs: str = "/sys",
                   then=None) -> WorkerPinner:
    """Factory: DataLoader(..., worker_init_fn=worker_init_fn(cpus)) pins worker w to its own
    slice of `cpus` (see worker_cpus). The SMT layout is read once here, not in every worker."""
    try:
        core_of = discover(sysfs, allowed_cpus=set(cpus)).core_of
    except UserError:
        core_of = None  # e.g. no sysfs in a sandbox: treat every CPU as its own core
    return WorkerPinner(cpus, threads_per_worker, report, core_of, then, sysfs)


pin_worker = worker_init_fn
