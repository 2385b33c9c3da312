"""Exercise 01 check-your-work: a bounded, labelled torch.profiler run of fno.py.

    .venv/bin/python -m pytest -q tests/test_01_profiling.py --script fno.py   # your edited script

Without --script it checks solution 01 and every later solution (tests/conftest.py: STEPS).

Runs the script once on tiny generated data with `--profile --max-steps 10` (not the README's 12,
so that a window hard-wired to 12 steps shows) and reads the trace it writes with plain json,
not with the course's tools. Each failure is one sentence naming the task of
exercises/01_profiling/README.md that fixes it (tests/checks.py).
"""
import gzip
import json
import re
from pathlib import Path

import pytest

from tests.checks import require, require_run, run_main_or_fail, task
from tests.conftest import call_main, exit_of
from wellfno.cli import UserError

STEP = "01_profiling"
# 44 steps per epoch: the window ends inside epoch 1; a small model (a third of the run's time)
TINY = ["--batch-size", "1", "--epochs", "1", "--width", "8", "--modes", "4"]
PROFILER_STEP = re.compile(r"ProfilerStep#(\d+)$")


def profiled_run(module, tiny_data_dir, out, max_steps):
    # `python SCRIPT ...` in this process (conftest.py's exit_of): its exit status and output
    result = exit_of(module, "--data-dir", tiny_data_dir, "--out", out, "--profile", "--max-steps", max_steps,
                     *TINY)
    require_run(result, f"{Path(module.__file__).name} --profile --max-steps {max_steps}",
                f"add --profile {task('01', 2)} and bound it by --max-steps {task('01', 3)}")
    found = sorted(out.glob("*rank0*.json*"))
    require(len(found) == 1, f"found {len(found)} trace files named after rank 0 in the output folder "
            f"(allowed: 1, e.g. trace_rank0_steps5-9.json.gz) {task('01', 4)}")
    raw = found[0].read_bytes()
    trace = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return result, found[0], trace


MAX_STEPS = 10


@pytest.fixture(scope="module")
def profiled(script_module, tiny_data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    return (out, *profiled_run(script_module, tiny_data_dir, out, MAX_STEPS))


def complete(trace):
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def steps_of(trace):
    return sorted((e for e in complete(trace) if PROFILER_STEP.match(e.get("name", ""))), key=lambda e: e["ts"])


def test_trace_is_chrome_json_with_the_profiled_steps(profiled):
    _, _, path, trace = profiled
    steps = steps_of(trace)
    require(isinstance(trace.get("traceEvents"), list) and len(steps) >= 5,
            f"the trace holds {len(steps)} ProfilerStep ranges (allowed: at least 5, the active steps): call "
            f"prof.step() once per training step {task('01', 3)}")
    numbers = [int(PROFILER_STEP.match(e["name"]).group(1)) for e in steps]
    require(numbers == list(range(numbers[0], numbers[-1] + 1)),
            f"the profiled steps #{numbers[0]}..#{numbers[-1]} are not consecutive: one window, repeat=1 "
            f"{task('01', 3)}")
    # The window is the end of the run: the last of 10 steps is ProfilerStep#9 ...
    require(numbers[-1] == MAX_STEPS - 1,
            f"with --max-steps {MAX_STEPS} the window ends at step #{numbers[-1]} (allowed: #{MAX_STEPS - 1}, the "
            f"last step): wait = max_steps - warmup - active {task('01', 3)}")
    # ... and the file says which steps it holds.
    require(re.search(rf"{numbers[0]}\D+{numbers[-1]}", path.name),
            f"the trace file {path.name} does not name its steps {numbers[0]}-{numbers[-1]} {task('01', 4)}")
    require(all(e["dur"] > 0 and isinstance(e["ts"], (int, float)) for e in steps),
            f"a ProfilerStep has no duration: export with prof.export_chrome_trace {task('01', 4)}")


def test_each_step_has_the_labelled_ranges(profiled):
    _, _, _, trace = profiled
    labels = [e for e in complete(trace) if e.get("cat") == "user_annotation" and not PROFILER_STEP.match(e["name"])]
    for step in steps_of(trace):
        inside = [e["name"].lower() for e in labels
                  if e["tid"] == step["tid"] and step["ts"] <= e["ts"] < step["ts"] + step["dur"]]
        for word in ("forward", "backward", "optimizer"):
            require(any(word in name for name in inside),
                    f"{step['name']} has no record_function range named *{word}* ({len(inside)} ranges in it) "
                    f"{task('01', 1)}")
        require(any(w in name for name in inside for w in ("data", "batch", "wait", "load")),
                f"{step['name']} has no range around the wait for the next batch (e.g. data_wait, around "
                f"next(iterator)) {task('01', 1)}")
        require(any(w in name for name in inside for w in ("h2d", "copy", "to_device", "transfer")),
                f"{step['name']} has no range around the host-to-device copy (e.g. h2d_copy) {task('01', 1)}")


def test_cpu_run_asks_for_no_gpu_activity(profiled):
    _, result, _, trace = profiled
    gpu_events = [e for e in complete(trace) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    require(not gpu_events and not trace.get("deviceProperties"),
            f"a CPU run's trace has {len(gpu_events)} GPU events or device properties: ask for "
            f"ProfilerActivity.CUDA only when the model is on a GPU {task('01', 2)}")


def test_prints_a_key_averages_table_sorted_by_cpu_time(profiled):
    _, result, _, _ = profiled
    require("Self CPU time total" in result.stdout,
            f"no key_averages table in the output: print prof.key_averages().table(...) {task('01', 5)}")
    rows = [line for line in result.stdout.splitlines() if re.match(r"\s*aten::\S+\s+\d", line)]
    require(len(rows) >= 3, f"the key_averages table has {len(rows)} operator rows (allowed: at least 3) "
            f"{task('01', 5)}")

    def self_cpu_ms(line):  # columns: Name, Self CPU %, Self CPU, ...: the first value with a time unit
        value, unit = re.findall(r"([\d.]+)(us|ms|s)\b", line)[0]
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    times = [self_cpu_ms(line) for line in rows]
    require(times == sorted(times, reverse=True),
            f"the key_averages table is not sorted by self CPU time on a CPU run (first rows: "
            f"{', '.join(f'{t:.2f}' for t in times[:3])} ms): sort_by='self_cpu_time_total' {task('01', 5)}")


def test_max_steps_stops_right_after_the_window(profiled):
    out, result, _, trace = profiled
    # No validation, rollout or metrics after the window: the run is over.
    require(not (out / "metrics.json").exists() and not (out / "rollout.png").exists()
            and "rollout step" not in result.stdout,
            f"the run went on after the profiled window (metrics.json, rollout): with --profile, stop "
            f"right after it {task('01', 3)}")


@pytest.mark.parametrize("options", [["--max-steps", 4], ["--profile-active", 0], ["--profile-warmup", -1]])
def test_a_window_that_does_not_fit_is_a_user_error(script_module, tiny_data_dir, tmp_path, options):
    argv = ["--data-dir", tiny_data_dir, "--out", tmp_path / "out", "--profile", *options]
    shown = " ".join(map(str, options))
    try:
        run_main_or_fail(lambda: call_main(script_module, *argv), f"--profile {shown}",
                         f"add --profile and its window options {task('01', 3)}")
    except UserError as err:
        require("--profile" in str(err), f"--profile {shown} is refused, but the error does not name --profile "
                f"{task('01', 3)}")
    else:
        require(False, f"--profile {shown} ran: a window that does not fit must be a one-line UserError naming "
                f"--profile {task('01', 3)}")
    require(not (tmp_path / "out").exists(), f"--profile {shown} left an output folder: refuse before "
            f"writing {task('01', 3)}")
