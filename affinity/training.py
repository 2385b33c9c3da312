"""Exercise 03's set-up of a training rank, moved out of the solutions once steps 02 and 03 taught it.

`bind` pins this rank near its GPU and prints where it runs; `loader_options` are the DataLoader's
settings of exercise 02 with each worker on its own slice of the rank's cores (exercise 03).
Both are solution 03's statements (tests/test_drift.py checks it); the solutions call them from
solution 07 on.
"""
from affinity.bind import bind_this_rank, worker_init_fn
from affinity.placement import report_line


def bind(args, device):
    """Pin this rank (and the workers it starts) per --bind; its CPUs and device (cuda:<its GPU>)."""
    cpus = None
    if args.bind != "none":  # before any worker starts: workers inherit the rank's CPUs
        cpus, rank_device = bind_this_rank(args.bind)  # local rank from LOCAL_RANK or SLURM_LOCALID
        device = rank_device if rank_device.type == device.type else device  # cuda:<its GPU>
    print(report_line(device=device), flush=True)  # host, rank, CPUs, NUMA, GPU: do they match?
    return cpus, device


def loader_options(args, device, cpus):
    """DataLoader keyword arguments from exercise 02's options, workers pinned to `cpus`."""
    # pin by default on a GPU (--no-pin-memory: off); on a CPU torch would warn and pin nothing
    if args.pin_memory and device.type != "cuda":
        print(f"note: --pin-memory ignored on {device}: there is no copy to a GPU to speed up")
    loader_options = dict(num_workers=args.num_workers,
                          pin_memory=args.pin_memory is not False and device.type == "cuda")
    if args.num_workers:  # DataLoader refuses these without workers
        loader_options.update(prefetch_factor=args.prefetch_factor,
                              persistent_workers=args.persistent_workers)
        if cpus:  # each worker on its own slice of the rank's cores, not all on one
            loader_options["worker_init_fn"] = worker_init_fn(cpus, report=args.report_workers)
    return loader_options
