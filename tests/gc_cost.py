"""What the garbage collector costs the processes the suite starts, at Python's thresholds and at
the suite's (tests/startup/suite_gc.py).

    .venv/bin/python tests/gc_cost.py [RUNS]

Generates the tiny dataset, then runs two programs of the course RUNS times each (default 5),
alternately with the interpreter's own thresholds and with the suite's, one intra-op thread, and
prints the median CPU seconds (user + system) of each, side by side: a short training run
(solution 07, one epoch) and a profiled one (solution 01, --profile --max-steps 12). Run it on an
idle machine. Not part of `make test`: a benchmark, not a check (tests/test_startup.py checks that
the suite's processes get the thresholds).
"""
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STARTUP = REPO / "tests" / "startup"
PROGRAMS = {
    "training run (solution 07, 1 epoch)": ["solutions/07_failures/fno.py", "--epochs", "1",
                                            "--batch-size", "8", "--bind", "none"],
    "profiled run (solution 01, 12 steps)": ["solutions/01_profiling/fno.py", "--profile",
                                             "--max-steps", "12"],
}


def cpu_seconds(argv, data_dir: Path, out: Path, suite: bool) -> float:
    # the PYTHONPATH it was started with (a site's module may need it), less or plus tests/startup
    site = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(STARTUP)]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(([str(STARTUP)] if suite else []) + site)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *argv, "--data-dir", str(data_dir), "--out", str(out)],
                   cwd=REPO, check=True, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, "-m", "wellfno.grayscott", "--data-dir", str(tmp),
                        "--size", "tiny"], check=True, stdout=subprocess.DEVNULL)
        for name, argv in PROGRAMS.items():
            seconds = {False: [], True: []}
            for i in range(runs):
                for suite in seconds:
                    seconds[suite].append(cpu_seconds(argv, tmp, tmp / f"out{i}{suite}", suite))
            python, ours = (statistics.median(seconds[s]) for s in (False, True))
            print(f"{name} ({runs} runs each, median CPU s, load {os.getloadavg()[0]:.1f}): "
                  f"Python's thresholds {python:.2f}, the suite's {ours:.2f}: "
                  f"{python - ours:.2f} s saved ({ours / python:.2f}x the CPU)")


if __name__ == "__main__":
    main()
