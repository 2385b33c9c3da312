"""TEST ONLY: the garbage collector's thresholds of every Python process the suite starts.

Most of `make test`'s CPU time is Python processes starting: each imports torch, neuralop and
the_well, and a training run imports torch._dynamo at its first `torch.optim` call. Those imports
create about a million objects, and CPython's generational collector, at its default thresholds
(700, 10, 10), traverses what was allocated so far again and again while they do: 0.6 s of CPU
in `import fno` + torch._dynamo (gc.callbacks timing: 15-20 % of the import), 0.75 s of a
1-epoch training run, 3.7 s of a profiled one (whose key_averages build 100,000 events):
`.venv/bin/python tests/gc_cost.py`.

With a first threshold of 1,000,000 no collection runs until a process holds a million more
container objects than it freed: a short run of the course's scripts never gets there (no
collection at all in a 1-epoch run of solution 07 on the tiny data), and a long one is collected
as usual from then on, so cyclic garbage stays bounded. Peak memory did not move (a profiled run:
995 MB and 997 MB; a --compile run: 547 MB either way). Measured on the 2-core CI VM: DESIGN.md,
"How long the tests take".

Like OMP_NUM_THREADS=1 and TORCHINDUCTOR_COMPILE_THREADS=1 (tests/conftest.py), this is how the
suite runs the programs on 2 cores, not something the programs do: when the collector runs
changes no result (nothing of the course waits on a finalizer: DESIGN.md, "User errors").
tests/conftest.py puts this folder on the PYTHONPATH of every process the tests start, never of
the pytest workers themselves (long-lived; an in-process subset took the same CPU time with
(50_000, 20, 20) and 180 MB more), and the seams' own sitecustomize files, which stand in for
this folder's, call `apply` too.
"""
import gc

THRESHOLDS = (1_000_000, 20, 20)


def apply() -> None:
    gc.set_threshold(*THRESHOLDS)
