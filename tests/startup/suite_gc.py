"""TEST ONLY: the garbage collector's thresholds of every Python process the suite starts.

Most of `make test`'s CPU time is Python processes starting: each imports torch, neuralop and
the_well, and a training run imports torch._dynamo at its first `torch.optim` call. Those imports
create about a million objects, and CPython's generational collector, at its default thresholds
(700, 10, 10), traverses everything allocated so far again and again while they do: about 0.6 s
of CPU in every `import fno` + torch._dynamo (gc.callbacks timing; 15-20 % of the import), 0.45 s
(9 %) of a short training run, a quarter of a profiled run (whose key_averages build 100,000
events). With (50_000, 20, 20) a young collection runs every 50,000 new containers and a full one
about 400 times more rarely, so a short process almost never traverses the imported modules;
cycles are still collected, and a profiled run's peak memory stayed the same (995 MB). Measured
on the 2-core CI VM, alternating runs: README.md, "What we chose".

Like OMP_NUM_THREADS=1 and TORCHINDUCTOR_COMPILE_THREADS=1 (tests/conftest.py), this is how the
suite runs the programs on 2 cores, not something the programs do: when, where and how often the
collector runs changes no result (nothing of the course waits on a finalizer: DESIGN.md, "User
errors"). tests/conftest.py puts this folder on the PYTHONPATH of every process the tests start
(never of the pytest workers, whose long lives gain nothing from it: an in-process subset took
the same CPU time either way and 180 MB more), and the seams' own sitecustomize files (which
stand in for this folder's) call `apply` too.
"""
import gc

THRESHOLDS = (50_000, 20, 20)


def apply() -> None:
    gc.set_threshold(*THRESHOLDS)
