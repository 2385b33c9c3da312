"""Exercise 01 check-your-work: a bounded, labelled torch.profiler run of fno.py.

    .venv/bin/python -m pytest -q tests/test_01_profiling.py --script fno.py   # your edited script

Without --script it checks solution 01 and every later solution (tests/conftest.py: STEPS).

Runs the script once on tiny generated data with `--profile --max-steps 10` (not the README's 12,
so that a window hard-wired to 12 steps shows) and reads the trace it writes with plain json,
not with the course's tools.
"""
import gzip
import json
import re

import pytest

from tests.conftest import call_main, run_script
from wellfno.cli import UserError

STEP = "01_profiling"
TINY = ["--batch-size", "1", "--epochs", "1"]  # 44 steps per epoch: the window ends inside epoch 1
PROFILER_STEP = re.compile(r"ProfilerStep#(\d+)$")


def profiled_run(script, tiny_data_dir, out, max_steps):
    result = run_script(script, "--data-dir", tiny_data_dir, "--out", out, "--profile", "--max-steps", max_steps,
                        *TINY, timeout=120)
    assert result.returncode == 0, f"{script} --profile failed:\n{result.stderr[-3000:]}"
    found = sorted(out.glob("*rank0*.json*"))
    assert len(found) == 1, f"expected one trace named after rank 0 in {out}, found {[p.name for p in out.iterdir()]}"
    raw = found[0].read_bytes()
    trace = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return result, found[0], trace


MAX_STEPS = 10


@pytest.fixture(scope="module")
def profiled(script, tiny_data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    return (out, *profiled_run(script, tiny_data_dir, out, MAX_STEPS))


def complete(trace):
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def steps_of(trace):
    return sorted((e for e in complete(trace) if PROFILER_STEP.match(e.get("name", ""))), key=lambda e: e["ts"])


def test_trace_is_chrome_json_with_the_profiled_steps(profiled):
    _, _, path, trace = profiled
    steps = steps_of(trace)
    assert isinstance(trace["traceEvents"], list) and len(steps) >= 5, "expected at least 5 active ProfilerSteps"
    numbers = [int(PROFILER_STEP.match(e["name"]).group(1)) for e in steps]
    assert numbers == list(range(numbers[0], numbers[-1] + 1)), numbers
    # The window is the end of the run: the last of 10 steps is ProfilerStep#9 ...
    assert numbers[-1] == MAX_STEPS - 1, \
        f"--max-steps {MAX_STEPS}: the profiled window should end at step #{MAX_STEPS - 1}, got {numbers}"
    # ... and the file says which steps it holds.
    assert re.search(rf"{numbers[0]}\D+{numbers[-1]}", path.name), f"{path.name}: name the step window"
    for e in steps:
        assert e["dur"] > 0 and isinstance(e["ts"], (int, float))


def test_each_step_has_the_labelled_ranges(profiled):
    _, _, _, trace = profiled
    labels = [e for e in complete(trace) if e.get("cat") == "user_annotation" and not PROFILER_STEP.match(e["name"])]
    for step in steps_of(trace):
        inside = [e["name"].lower() for e in labels
                  if e["tid"] == step["tid"] and step["ts"] <= e["ts"] < step["ts"] + step["dur"]]
        for word in ("forward", "backward", "optimizer"):
            assert any(word in name for name in inside), f"{step['name']}: no range named *{word}* in {inside}"
        assert any(w in name for name in inside for w in ("data", "batch", "wait", "load")), \
            f"{step['name']}: label the wait for the next batch (e.g. data_wait): {inside}"
        assert any(w in name for name in inside for w in ("h2d", "copy", "to_device", "transfer")), \
            f"{step['name']}: label the host-to-device copy (e.g. h2d_copy): {inside}"


def test_cpu_run_asks_for_no_gpu_activity(profiled):
    _, result, _, trace = profiled
    assert not [e for e in complete(trace) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert not trace.get("deviceProperties"), "ProfilerActivity.CUDA only when a GPU is used"


def test_prints_a_key_averages_table_sorted_by_cpu_time(profiled):
    _, result, _, _ = profiled
    assert "Self CPU time total" in result.stdout, "print prof.key_averages().table(...)"
    rows = [line for line in result.stdout.splitlines() if re.match(r"\s*aten::\S+\s+\d", line)]
    assert len(rows) >= 3, "no operator rows in the key_averages table"

    def self_cpu_ms(line):  # columns: Name, Self CPU %, Self CPU, ...: the first value with a time unit
        value, unit = re.findall(r"([\d.]+)(us|ms|s)\b", line)[0]
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    times = [self_cpu_ms(line) for line in rows]
    assert times == sorted(times, reverse=True), "sort the table by self CPU time (sort_by='self_cpu_time_total')"


def test_max_steps_stops_right_after_the_window(profiled):
    out, result, _, trace = profiled
    # No validation, rollout or metrics after the window: the run is over.
    assert not (out / "metrics.json").exists() and not (out / "rollout.png").exists(), \
        "with --profile, stop after the profiled window (no validation, rollout, metrics)"
    assert "rollout step" not in result.stdout


@pytest.mark.parametrize("options", [["--max-steps", 4], ["--profile-active", 0], ["--profile-warmup", -1]])
def test_a_window_that_does_not_fit_is_a_user_error(script_module, tiny_data_dir, tmp_path, options):
    with pytest.raises(UserError, match="--profile"):
        call_main(script_module, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", "--profile", *options)
    assert not (tmp_path / "out").exists()
