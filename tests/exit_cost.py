"""What Python's final teardown costs a process of the course, and what wellfno.cli.leave saves.

    .venv/bin/python tests/exit_cost.py [RUNS]

Starts `import fno` then run_main (a process of the course that does nothing else), RUNS times
each (default 9), alternately ended by cli.leave and by sys.exit (the interpreter's ordinary
exit: Py_FinalizeEx's collection and teardown of every module and object), with one intra-op
thread; prints the median CPU seconds (user + system) of each, side by side. Run it on an idle
machine. Not part of `make test`: a benchmark, not a check (tests/test_cli.py checks leave).
"""
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAM = ("import sys, fno\nfrom wellfno import cli\n"
           "if sys.argv[1] == 'sys.exit':\n    cli.leave = sys.exit\ncli.run_main(lambda: 0)\n")


def cpu_seconds(how: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", PROGRAM, how], cwd=REPO, check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    seconds = {"leave": [], "sys.exit": []}
    for _ in range(runs):
        for how in seconds:
            seconds[how].append(cpu_seconds(how))
    median = {how: statistics.median(s) for how, s in seconds.items()}
    print(f"import fno, then exit ({runs} runs each, median CPU s, load "
          f"{os.getloadavg()[0]:.1f}): sys.exit {median['sys.exit']:.2f}, leave "
          f"{median['leave']:.2f}: {median['sys.exit'] - median['leave']:.2f} s saved "
          f"({median['leave'] / median['sys.exit']:.2f}x the CPU)")


if __name__ == "__main__":
    main()
