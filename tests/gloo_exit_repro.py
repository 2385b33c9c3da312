"""Do gloo ranks that leave right after a collective abort at exit? (exercises/05_ddp/background.md)

Each rank all-reduces a tensor of its own; rank 0 then works on for 1.5 s (as it rolls out
after training) while the others leave at once; `barrier` ends with `dist.barrier()`, a
collective that holds no tensor of the program's, before `dist.destroy_process_group()`.
Without it a rank now and then dies of SIGABRT ("terminate called without an active
exception"): gloo's worker thread lets go of the all-reduce's tensor after the interpreter
began to shut down (pytorch/pytorch#179291). `leave` has no barrier and ends through
wellfno.cli.run_main, as the course's programs do: cli.leave skips the interpreter's shutdown,
so no thread is ended under it. A race, so count over many runs, on a busy machine:

    for i in $(seq 30); do for mode in plain barrier leave; do
      .venv/bin/torchrun --standalone --nproc-per-node 3 tests/gloo_exit_repro.py $mode \
        > /dev/null 2>&1 || echo "$mode aborted"; done; done | sort | uniq -c

Not part of `make test`: a race proves nothing in one run.
"""
import sys
import time

import torch
import torch.distributed as dist

from wellfno.cli import run_main

mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
if mode not in ("plain", "barrier", "leave"):
    sys.exit("error: the mode is plain, barrier or leave")
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(200, 200))
total = torch.ones(4)
dist.all_reduce(total)
if dist.get_rank() == 0:
    time.sleep(1.5)
if mode == "barrier":
    dist.barrier()
dist.destroy_process_group()
if mode == "leave":
    run_main(lambda: 0)
