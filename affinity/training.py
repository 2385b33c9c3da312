"""Exercise 03's set-up of a training rank, moved out of the solutions once steps 02 and 03 taught it.

`bind` pins this rank near its GPU and prints where it runs; `loader_options` are the DataLoader's
settings of exercise 02 with each worker on its own slice of the rank's cores (exercise 03).
Both are solution 03's statements (tests/test_drift.py checks it); the solutions call them from
solution 07 on.
"""
from affinity.bind import bind_this_rank, worker_init_fn
from affinity.placement import report_line


def bind(mode, device):
    """Pin this rank (and the workers it starts) per --bind; its CPUs and device (cuda:<its GPU>)."""
    cpus = None
    if mode != "none":  # before any worker starts: workers inherit the rank's CPUs
        cpus, rank_device = bind_this_rank(mode)  # local rank from LOCAL_RANK or SLURM_LOCALID
        device = rank_device if rank_device.type == device.type else device  # cuda:<its GPU>
    print(report_line(device=device), flush=True)  # host, rank, CPUs, NUMA, GPU: do they match?
    return cpus, device


def loader_options(device, cpus, num_workers, pin_memory, prefetch_factor, persistent_workers,
                   report_workers=False):
    """DataLoader keyword arguments from exercise 02's options, workers pinned to `cpus`."""
    # pin by default on a GPU (--no-pin-memory: off); on a CPU torch would warn and pin nothing
    if pin_memory and device.type != "cuda":
        print(f"note: --pin-memory ignored on {device}: there is no copy to a GPU to speed up")
    loader_options = dict(num_workers=num_workers,
                          pin_memory=pin_memory is not False and device.type == "cuda")
    if num_workers:  # DataLoader refuses these without workers
        loader_options.update(prefetch_factor=prefetch_factor,
                              persistent_workers=persistent_workers)
        if cpus:  # each worker on its own slice of the rank's cores, not all on one
            loader_options["worker_init_fn"] = worker_init_fn(cpus, report=report_workers)
    return loader_options
