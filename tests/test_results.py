"""Every table the docs generate equals what its results file says (coursetools.results)."""
import json
import shutil
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO, run_script
from coursetools import results
from wellfno.cli import UserError
from wellfno.memory import step_bytes
from wellfno.model import NextFrameFNO


def test_docs_tables_match_their_results_files():
    stale = results.render(REPO, check=True)
    assert not stale, (f"tables out of date with results/: {[str(p.relative_to(REPO)) for p in stale]}; "
                       f"run `python -m coursetools.results render`")


def _fake_repo(tmp_path, seconds):
    (tmp_path / "fno.py").write_text("")
    results.write_result(tmp_path / "results" / "runtimes.json", "python -m coursetools.results runtimes",
                         {"rows": [{"step": "00", "command": "python fno.py", "seconds": seconds}]})
    (tmp_path / "README.md").write_text("intro\n<!-- table: coursetools.results:runtimes_table -->\nold\n"
                                        "<!-- /table -->\noutro\n")


def test_render_writes_the_table_and_check_finds_drift(tmp_path):
    _fake_repo(tmp_path, 12.34)
    assert results.render(tmp_path, check=True) == [tmp_path / "README.md"]   # "old" is stale
    results.render(tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "| 00 | `python fno.py` | 12.3 s |" in text and text.startswith("intro\n") and text.endswith("outro\n")
    assert "Measured by `python -m coursetools.results runtimes` " in text and " on " in text
    assert results.render(tmp_path, check=True) == []
    # a new measurement makes the committed table stale until it is rendered again
    results.write_result(tmp_path / "results" / "runtimes.json", "python -m coursetools.results runtimes",
                         {"rows": [{"step": "00", "command": "python fno.py", "seconds": 99.0}]})
    assert results.render(tmp_path, check=True) == [tmp_path / "README.md"]
    rc = run_script("-m", "coursetools.results", "render", "--check", "--root", tmp_path)
    assert rc.returncode == 1 and "stale: README.md" in rc.stdout


def test_results_file_names_its_machine_and_command(tmp_path):
    path = results.write_result(tmp_path / "r.json", "cmd", {"x": 1})
    saved = json.loads(path.read_text())
    assert saved["command"] == "cmd" and saved["data"] == {"x": 1}
    assert saved["machine"]["cpu"] and saved["machine"]["cores"] >= 1 and saved["machine"]["torch"]
    assert "clean" in saved and ("commit_note" in saved if saved["commit"] is None else
                                 f" at commit {saved['commit'][:7]} on " in results.caption(saved))
    assert " at commit" not in results.caption({**saved, "commit": None})   # files before the stamp


def test_results_file_commands_name_no_folder_of_the_machine(tmp_path):
    """The venv's python and the checkout's absolute paths, as a tool's subprocesses are started,
    are written as `python` and repository-relative paths (issue 41)."""
    absolute = (f"{sys.executable} -m torch.distributed.run {REPO}/solutions/05_ddp/fno.py "
                f"--root {REPO}")
    path = results.write_result(tmp_path / "r.json", absolute, {
        "runs": [{"command": absolute}], "n": 3, "other": "/elsewhere/fno.py"})
    saved = json.loads(path.read_text())
    relative = "python -m torch.distributed.run solutions/05_ddp/fno.py --root ."
    assert saved["command"] == relative and saved["data"]["runs"] == [{"command": relative}]
    assert saved["data"]["n"] == 3 and saved["data"]["other"] == "/elsewhere/fno.py"
    assert str(REPO) not in path.read_text()


def test_bad_results_files_are_one_line(tmp_path):
    with pytest.raises(UserError, match="missing"):
        results.read_result(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        results.read_result(tmp_path / "bad.json")
    (tmp_path / "plain.json").write_text('{"a": 1}')
    with pytest.raises(UserError, match="lacks command"):
        results.read_result(tmp_path / "plain.json")
    rc = run_script("-m", "coursetools.results", "render", "--root", tmp_path)
    assert rc.returncode == 2 and rc.stderr.startswith("error: ") and "Traceback" not in rc.stderr


# --------------------------------------------------------------------------- the renderers, on numbers written by hand
def _write(root, name, command, data, **machine):
    path = results.write_result(root / "results" / name, command, data)
    if machine:  # a fixed machine, so the caption is known
        saved = json.loads(path.read_text())
        saved["machine"] = machine
        path.write_text(json.dumps(saved))
    return path


def _sweep_row(reader, workers, data_only, compute_only, full):
    return dict(reader=reader, num_workers=workers, pin_memory=False, prefetch_factor=2 if workers else None,
                data_only=data_only, compute_only=compute_only, full=full, efficiency=full / compute_only)


def test_throughput_tables_quote_the_sweep(tmp_path):
    _write(tmp_path, "throughput.json", "python profiling/throughput.py --x", dict(
        config={"batch_size": 16}, machine={},
        readers=dict(samples_per_s=dict(raw_h5py=1000.0, fast=500.0, well=40.0), fast_over_raw=0.5, fast_over_well=12.5,
                     well_over_raw=0.04),
        rows=[_sweep_row("well", 0, 200.0, 150.0, 75.0), _sweep_row("well", 2, 400.0, 150.0, 90.0),
              _sweep_row("fast", 0, 9000.0, 150.0, 140.0)]),
        cpu="Test CPU", cores=2, torch="2.0", load_average=1.5)
    sweep = results.throughput_table(tmp_path)
    assert "WellDataset 40 samples/s (25.0 ms a sample)" in sweep       # 1000 / 40 by hand
    assert "fast / raw **0.50**" in sweep and "fast / WellDataset **12×**" in sweep
    assert "| well | 0 | off | - | 200 | 150 | 75 | 0.50 |" in sweep
    assert "| well | 2 | off | 2 | 400 | 150 | 90 | 0.60 |" in sweep
    assert "`well`: best full 90 samples/s with 2 workers (full / compute-only 0.60); data_only with 2 workers / " \
           "0 workers = 2.00." in sweep
    assert "on Test CPU, 2 cores, torch 2.0, no GPU, load average 1.5" in sweep
    summary = results.step02_summary(tmp_path)
    assert "| the_well's `WellDataset` | 200 | 75 | 150 | 0.50 | 90 (2 workers, 0.60) |" in summary
    assert "| `wellfno.fastwell` | 9,000 | 140 | 150 | 0.93 | 140 (0 workers, 0.93) |" in summary


def test_overhead_threads_and_scripts_tables(tmp_path):
    group = lambda plain, profiled: dict(plain_steps_per_s=plain, profiled_steps_per_s=profiled,  # noqa: E731
                                         ratio=profiled / plain)
    _write(tmp_path, "profiling_overhead.json", "python profiling/overhead.py", dict(
        before=group(10.0, 9.75), outside=group(10.0, 9.9), inside=group(10.0, 8.0), idle_record_function_us=10.0))
    table = results.overhead_table(tmp_path)
    assert "| before the window (wait) | 10.00 | 9.75 | 0.975 | +2.5 % |" in table
    assert "| inside the window (warmup + active) | 10.00 | 8.00 | 0.800 | +20.0 % |" in table
    # 5 ranges x 10 us = 50 us of a 100 ms step
    assert "costs 10.0 µs here: 5 per step = 0.05 % of a 100 ms step" in table
    _write(tmp_path, "threads.json", "python profiling/threads.py", dict(batch_size=16, rows=[
        dict(threads=1, busy_processes=0, samples_per_s=100.0), dict(threads=1, busy_processes=1, samples_per_s=90.0),
        dict(threads=2, busy_processes=0, samples_per_s=150.0), dict(threads=2, busy_processes=1, samples_per_s=40.0)]))
    threads = results.threads_table(tmp_path)
    assert "| torch threads | alone | next to 1 busy process |" in threads
    assert "| 1 | 100 | 90 |" in threads and "| 2 | 150 | 40 |" in threads
    _write(tmp_path, "compare_scripts.json", "python profiling/compare_scripts.py", dict(
        script_args="--epochs 1", repeats=2, rows=[dict(command="fno.py", samples_per_s=80.0, vs_first=1.0),
                                                   dict(command="b.py --fast", samples_per_s=120.0, vs_first=1.5)]))
    scripts = results.scripts_table(tmp_path)
    assert "| `fno.py` | 80.0 | 1.00× |" in scripts and "| `b.py --fast` | 120.0 | 1.50× |" in scripts


def test_readme_row_for_step_04_says_what_ran(tmp_path):
    table = results.readme_results_table(tmp_path)      # no benchmark file yet: what the tests check, no timings
    row = next(line for line in table.splitlines() if line.startswith("| 04 |"))
    assert "timings to be measured" in row and "two torchrun agents on one machine" in row
    # benchmark.py's own layout (top-level keys), as exercise 04 writes it
    (tmp_path / "results").mkdir(exist_ok=True)
    (tmp_path / "results" / "04_stats_benchmark.json").write_text(json.dumps(dict(
        command="python solutions/04_distributed_stats/benchmark.py --ranks 1,2", date="2026-11-30",
        machine=dict(cpu="Test CPU", cores=2, load_average_at_end=3.0),
        dataset=dict(gigabytes=0.5), bitwise_identical_to_serial={"dist1": True, "dist2": True},
        rows=[dict(name="serial stats.py", ranks=1, seconds=3.0),
              dict(name="distributed, 1 rank(s) (torchrun)", ranks=1, seconds=4.0),
              dict(name="distributed, 2 rank(s) (torchrun)", ranks=2, seconds=2.5)])))
    table = results.readme_results_table(tmp_path)
    row = next(line for line in table.splitlines() if line.startswith("| 04 |"))
    assert "1 rank 4.00 s, 2 ranks 2.50 s (speed-up 1.6× with 2 ranks)" in row      # 4.0 / 2.5 by hand
    assert "2 of 2 distributed runs bit for bit equal" in row and "two torchrun agents on one machine" in row
    assert "[`results/04_stats_benchmark.json`](results/04_stats_benchmark.json)" in row
    assert "`04_stats_benchmark.json` 3.0 (2026-11-30)" in table


def test_runtimes_renderers_quote_the_profile_and_the_demo_run(tmp_path):
    dashes = "-" * 20
    key_averages = [dashes, "Name  Self CPU %", dashes] + [f"aten::op{i}  {10 - i}%" for i in range(8)] + \
                   [dashes, "Self CPU time total: 1.0s"]
    stdout = "\n".join(["Training on cpu: 10 samples", *key_averages, "",
                        "Time per profiled step (ms; the parts add up to the step):", "  step  total",
                        "Top host operators by self time in the profiled steps:",
                        *[f"  {i}.00 ms  op{i}" for i in range(5)],
                        "Wrote /tmp/x/runs/01/trace_rank0_steps7-11.json.gz"])
    # two steps: data_wait 30 + 50 of 100 + 100 ms = 40 %; 40 ms a step = 2.5 ms a sample of 16
    steps = [dict(step=7, total=100.0, data_wait=30.0, forward=70.0, rest=0.0),
             dict(step=8, total=100.0, data_wait=50.0, forward=50.0, rest=0.0)]
    _write(tmp_path, "runtimes.json", "python -m coursetools.results runtimes", {"rows": [
        dict(step="00", command="python fno.py --data-dir D --out OUT/00", seconds=100.0, samples_per_second=80.0,
             rollout_vrmse_step1=0.07, persistence_vrmse_step1=0.2,
             rollout_vrmse=[0.07, 0.1, 0.2, 0.3, 0.33, 0.9, 1.1, 2.0], persistence_vrmse=[0.2, 0.4, 0.5, 0.6, 0.8, 1.0, 1.0, 1.1],
             epochs=[dict(train_loss=0.7, valid_loss=0.3, samples_per_second=79.0)]),
        dict(step="01", command="python solutions/01_profiling/fno.py --profile", seconds=22.0, stdout=stdout,
             profile=dict(steps=steps, top_host=[]))]})
    text = results.profile_transcript(tmp_path)
    assert "aten::op5" in text and "aten::op6" not in text and "Self CPU time total: 1.0s" in text
    assert "op2\n..." in text and "op3" not in text.split("Top host operators")[1]
    assert "Wrote OUT/01/trace_rank0_steps7-11.json.gz" in text
    assert "40.0 % of the profiled steps, 40.0 ms per step of 16 samples (2.5 ms a sample" in text
    demo = results.demo_run_summary(tmp_path)
    assert "persistence is better from rollout step 7 on" in demo   # 1.1 > 1.0 first at index 6
    assert "| 6 | 0.900 | 1.000 |" in demo and "| 7 | 1.100 | 1.000 |" in demo and "| 8 | 2.000 | 1.100 |" in demo
    runtimes = results.runtimes_table(tmp_path)
    assert "| 01 | `python solutions/01_profiling/fno.py --profile` | 22.0 s; data_wait 40 % of each profiled step | " \
           "to be measured |" in runtimes
    readme = results.readme_results_table(tmp_path)
    assert "waiting for data is **40 %** of a profiled step (40 ms of 100 ms)" in readme


@pytest.mark.slow
def test_measuring_tools_write_results_files_the_renderers_read(tiny_data_dir, tmp_path):
    from profiling import threads, throughput
    (tmp_path / "fno.py").write_text("")
    throughput.main(["--data-dir", str(tiny_data_dir), "--out", str(tmp_path / "tp"), "--workers", "0",
                     "--seconds", "0.1", "--repeats", "1", "--warmup", "1", "--batch-size", "4",
                     "--results", str(tmp_path / "results" / "throughput.json")])
    saved = results.read_result(tmp_path / "results" / "throughput.json")
    assert saved["command"].startswith("python profiling/throughput.py --data-dir ")
    rows = saved["data"]["rows"]
    assert {r["reader"] for r in rows} == {"well", "fast"}
    assert f"| well | 0 | off | - | {rows[0]['data_only']:,.0f} |" in results.throughput_table(tmp_path)
    threads.main(["--data-dir", str(tiny_data_dir), "--threads", "1", "--busy", "0,1", "--seconds", "0.2",
                  "--repeats", "1", "--batch-size", "4", "--results", str(tmp_path / "results" / "threads.json")])
    measured = results.read_result(tmp_path / "results" / "threads.json")["data"]["rows"]
    assert sorted((r["threads"], r["busy_processes"]) for r in measured) == [(1, 0), (1, 1)]
    assert all(r["samples_per_s"] > 0 for r in measured)
    assert "| torch threads | alone | next to 1 busy process |" in results.threads_table(tmp_path)


@pytest.mark.parametrize("args, match", [(["--threads", "0"], "--threads values must be at least 1"),
                                         (["--busy", "-1"], "--busy values must be at least 0"),
                                         (["--seconds", "0"], "--seconds positive")])
def test_threads_benchmark_bad_options_are_one_line(args, match, tmp_path):
    from profiling import threads
    with pytest.raises(UserError, match=match):
        threads.main(["--data-dir", str(tmp_path), *args])


@pytest.mark.slow
def test_overhead_times_every_step_of_the_solutions_loop(tiny_data_dir, tmp_path):
    """profiling/overhead.py drives solutions/01_profiling's train_one_epoch; each step is timed in both modes."""
    from profiling import overhead
    (tmp_path / "fno.py").write_text("")
    overhead.main(["--data-dir", str(tiny_data_dir), "--batch-size", "2", "--wait", "2", "--warmup", "1",
                   "--active", "1", "--after", "1", "--repeats", "1",
                   "--results", str(tmp_path / "results" / "profiling_overhead.json")])
    data = results.read_result(tmp_path / "results" / "profiling_overhead.json")["data"]
    # wait + warmup + active + after = 5 steps in each mode, every one timed by the stand-in clock
    assert [len(run) for run in data["step_seconds"]["plain"]] == [5]
    assert [len(run) for run in data["step_seconds"]["profiled"]] == [5]
    assert data["before"]["ratio"] == pytest.approx(data["before"]["profiled_steps_per_s"]
                                                    / data["before"]["plain_steps_per_s"])
    assert "| before the window (wait) |" in results.overhead_table(tmp_path)


def test_a_failed_step_is_shown_not_hidden(tmp_path):
    _write(tmp_path, "runtimes.json", "python -m coursetools.results runtimes", {"rows": [
        dict(step="00", command="python fno.py", seconds=3.0, failed="ImportError: cannot import name 'x'"),
        dict(step="01", command="python solutions/01_profiling/fno.py --profile", seconds=2.0, failed="boom")]})
    assert "| 00 | `python fno.py` | 3.0 s — **failed**: `ImportError: cannot import name 'x'` |" \
        in results.runtimes_table(tmp_path)
    assert "`python fno.py` failed in the last measurement" in results.demo_run_summary(tmp_path)
    assert "failed in the last measurement (`boom`)" in results.profile_transcript(tmp_path)
    assert "| 00 |" not in results.readme_results_table(tmp_path)   # no numbers to quote


def test_render_renders_what_it_can_and_names_what_it_cannot(tmp_path):
    _fake_repo(tmp_path, 5.0)
    (tmp_path / "INSTRUCTORS.md").write_text("<!-- table: coursetools.results:threads_table -->\nkept\n<!-- /table -->\n")
    with pytest.raises(UserError, match=r"1 table\(s\) could not be rendered .*INSTRUCTORS.md: "
                                        r"coursetools.results:threads_table: .*threads.json is missing"):
        results.render(tmp_path)
    assert "| 00 | `python fno.py` | 5.0 s |" in (tmp_path / "README.md").read_text()   # rendered anyway
    assert "\nkept\n" in (tmp_path / "INSTRUCTORS.md").read_text()                   # left as it was


# ---- exercises 12 and 13 (solutions/13_domain_parallel/benchmark.py's files)
_DOMAIN_CONFIG = dict(ranks=[1, 2], modes=["weak", "strong"], rows=64, cols=64, depth=0, width=32,
                      fno_modes=12, layers=8, batch_size=8, steps=8, repeats=2, device="cpu")


def _domain_row(ranks, grid, step_ms, share, peak, **extra):
    return dict(ranks=ranks, grid=grid, step_ms=step_ms, exchange_share=share,
                peak_bytes_per_rank=peak, traced_steps=[2, 3, 4], **extra)


def test_checkpointing_table_shows_both_ratios(tmp_path):
    _write(tmp_path, "12_checkpointing.json",
           "python solutions/13_domain_parallel/benchmark.py --checkpointing",
           dict(config=_DOMAIN_CONFIG, modes={"checkpointing": [
               _domain_row(1, "64x64", 1000.0, 0.001, 200_000_000, checkpointed=False),
               _domain_row(1, "64x64", 1250.0, 0.001, 80_000_000, checkpointed=True)]}),
           cpu="Test CPU", cores=2, torch="2.0", load_average_at_start=0.5, load_average=1.5)
    table = results.checkpointing_table(tmp_path)
    assert "| 64×64, 8, 8 | 200.0 MB | 80.0 MB | **0.40** | 1000 | 1250 | **1.25** |" in table
    assert "the fastest of 2 rounds" in table
    assert ("on Test CPU, 2 cores, torch 2.0, no GPU, load average 0.5 at the start, 1.5 at the end"
            in table)
    # task 4's comparison: the estimate of the benchmark's own model (3 channels, 1 input frame)
    stats = {k: torch.ones(3) for k in ("mean", "std", "mean_delta", "std_delta")}
    model = NextFrameFNO(3, 1, stats, n_spatial_dims=2, resolution=(64, 64), modes=12, width=32,
                         layers=8)
    n = sum(p.numel() for p in model.parameters())
    plain, ckpt = (step_bytes(n, 8, (64, 64), model.in_channels, 3, 32, 8, c) for c in (False, True))
    assert (f"estimates {plain / 1e6:.1f} MB plain and {ckpt / 1e6:.1f} MB checkpointed for this "
            f"model (task 4): {plain / 200e6:.2f}× and {ckpt / 80e6:.2f}× the measured peaks") in table


def test_domain_scaling_table_has_weak_and_strong_rows(tmp_path):
    _write(tmp_path, "13_domain_scaling.json",
           "python solutions/13_domain_parallel/benchmark.py --ranks 1 2",
           dict(config=dict(_DOMAIN_CONFIG, repeats=1), modes={
               "weak": [_domain_row(1, "64x64", 300.0, 0.004, 60_000_000, efficiency=1.0),
                        _domain_row(2, "128x64", 400.0, 0.22, 63_000_000, efficiency=0.75)],
               "strong": [_domain_row(1, "128x64", 500.0, 0.002, 122_000_000, efficiency=1.0),
                          _domain_row(2, "128x64", 400.0, 0.23, 63_000_000, efficiency=0.625)]}),
           cpu="Test CPU", cores=2, torch="2.0", load_average=5.0)
    table = results.domain_scaling_table(tmp_path)
    assert "| weak | 2 | 128 × 64 | 400 | efficiency 0.75 | 22.0 % | 63.0 MB |" in table
    assert ("| strong | 2 | 128 × 64 | 400 | speed-up 1.25× (efficiency 0.62) | 23.0 % | 63.0 MB |"
            in table)
    assert "one run" in table
    assert "above the number of cores" in table   # load 5 on 2 cores: the caption says so


def test_runtimes_keep_each_commands_fastest_run_and_name_a_failure(tmp_path, monkeypatch):
    """`runtimes --repeats 2` on two cheap commands: each row is the faster of 2 fresh runs; a
    failing command runs once, its row says why, and the error names it once the file is written."""
    (tmp_path / "fno.py").write_text("")
    slow_first = ("{py} -c \"import pathlib, time; p = pathlib.Path('{D}_seen'); "
                  "time.sleep(0.0 if p.exists() else 3.0); p.touch()\"")
    failing = "{py} -c \"raise SystemExit('error: no')\""
    monkeypatch.setattr(results, "RUNTIME_COMMANDS", [("03", slow_first), ("04", failing)])
    with pytest.raises(UserError, match=r"1 step\(s\) failed: 04 .*error: no"):
        results.measure_runtimes(tmp_path, tmp_path / "runtimes.json", repeats=2)
    rows = json.loads((tmp_path / "runtimes.json").read_text())["data"]["rows"]
    # the second, fast run was kept: the first slept 3 s more, and a Python start takes under 1 s
    # even with both xdist workers and more busy (0.9 s at load 14 on 2 cores)
    assert rows[0]["runs"] == 2 and rows[0]["seconds"] < 2.5
    assert rows[1]["failed"] == "error: no" and "runs" not in rows[1]


def _ladder_row(name, against, samples, speedup, by="samples/s", skipped=None, flops=1e8,
                mfu=0.01, compile_seconds=None):
    numbers = dict(samples_per_s=samples, flops_per_sample=flops,
                   achieved_flops_per_s=None if samples is None else flops * samples,
                   peak_flops_per_s=1e11, peak_precision="fp32", mfu=mfu,
                   peak_memory_bytes=None, peak_memory_of=None, compile_seconds=compile_seconds)
    if skipped:
        numbers = dict.fromkeys(numbers)
    return dict(row=name, command="x.py", against=against, speedup_of=by, speedup=speedup,
                skipped=skipped, **numbers)


def test_ladder_renders_each_idea_against_its_reference_and_a_skipped_row(tmp_path):
    """Exercises 08-11's table and README sentence (solutions/11_compile/benchmark.py's
    efficiency.json): each speed-up against the row it names, a skipped row with its reason."""
    why = "this CPU has no bfloat16 units (AVX512_BF16, AMX-BF16 or Arm BF16), so bf16 would be " \
          "emulated, slower than float32: use --amp none"
    rows = [_ladder_row("07 baseline", None, 40.0, None),
            _ladder_row("08 no host syncs", "07 baseline", 42.0, 1.05),
            _ladder_row("09 mixed precision", "08 no host syncs", None, None, skipped=why),
            _ladder_row("10 width 64, batch 64", "08 no host syncs", 20.0, 1.73, by="FLOP/s",
                        flops=4e8, mfu=0.064),
            _ladder_row("11 torch.compile", "08 no host syncs", 46.2, 1.1, compile_seconds=19.4)]
    data = dict(device="cpu", peak_device="AMD EPYC, 1 core", peak_source="estimate: ...",
                steps=20, repeats=3, common="", rows=rows)
    results.write_result(tmp_path / results.EFFICIENCY_RESULT, "python solutions/11_compile/"
                         "benchmark.py", data)
    table = results.efficiency_table(tmp_path)
    assert "| 08 no host syncs | 42.0 | 07 baseline | 1.05× | 4.20 | 1.00% | fp32 | - | - |" in table
    assert "| 09 mixed precision | skipped | 08 no host syncs | - |" in table
    assert f"09 mixed precision: skipped: {why}." in table
    assert "| 11 torch.compile | 46.2 | 08 no host syncs | 1.10× |" in table and "| 19 |" in table
    assert "| 10 width 64, batch 64 | 20.0 | 08 no host syncs | 1.73× (FLOP/s) | 8.00 | 6.40% |" \
        in table
    sentence = results.efficiency_readme_row(results.read_result(tmp_path
                                                                 / results.EFFICIENCY_RESULT))[2]
    assert sentence.startswith("07 baseline: 40.0 samples/s; 08 no host syncs **1.05×** vs 07; "
                               "09 mixed precision: skipped, this CPU has no bfloat16 units "
                               "(AVX512_BF16, AMX-BF16 or Arm BF16); width 64")
    assert "11 torch.compile **1.10×** vs 08 (19 s compiling, timed apart)" in sentence
    assert ("width 64, batch 64: 8.0 GFLOP/s (1.73× the FLOP/s of 08 no host syncs), MFU **6.4 %** "
            "of the fp32 peak (AMD EPYC, 1 core, an estimate)") in sentence


# ---------------------------------------------------------------- stale results files (issue 41)
def test_no_results_file_is_stale():
    """Each results file was measured on today's code: no file its commands run or import changed
    in code since the commit it records (coursetools.staleness). A change to measured code
    re-measures what it touches in the same submission: `make results ONLY="..."` names them."""
    from coursetools import staleness

    why = staleness.history_unavailable(REPO)
    if why:
        pytest.skip(f"which results files are stale needs the history: {why}")
    lines = staleness.stale_files(REPO)
    assert not lines, "\n".join(lines)


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


UNROLLED = '''"""The rollout loss (a stand-in of wellfno/unrolled.py)."""
from wellfno.cli import UserError


def generator_for(seed, epoch):
    """The noise's generator."""
    return seed  # the same every epoch
'''


@pytest.fixture
def measured_repo(tmp_path):
    """A git repository like this one, whose results file `results/14.json` was measured at its
    first commit (clean) and committed in the second; and its target."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    from benchtools import resultfiles
    from coursetools import measure

    repo = tmp_path / "repo"
    files = {"fno.py": "from wellfno import cli\n", "notes.md": "notes\n",
             "wellfno/__init__.py": "", "wellfno/cli.py": "class UserError(Exception):\n    pass\n",
             "wellfno/unrolled.py": UNROLLED, "wellfno/grayscott.py": "SIZE = 16\n",
             "wellfno/other.py": "X = 1\n",
             "solutions/14_long_rollouts/fno.py": "from wellfno import unrolled\n",
             "solutions/14_long_rollouts/compare.py": "import subprocess\n"}
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "the code")
    stamp = resultfiles.code_stamp(repo)
    (repo / "results").mkdir()
    (repo / "results" / "14.json").write_text(json.dumps(
        {"command": "python solutions/14_long_rollouts/compare.py", "machine": {}, **stamp,
         "data": {}}))
    _git(repo, "add", "results")
    _git(repo, "commit", "-q", "-m", "measured")
    target = measure.Target(
        "14", "results/14.json", ("{py} solutions/14_long_rollouts/compare.py --data-dir {data}",),
        "test", runs=("solutions/14_long_rollouts/fno.py",))
    return repo, target, stamp


def test_a_results_file_records_its_commit_and_whether_the_tree_was_clean(measured_repo, tmp_path):
    from benchtools import resultfiles

    repo, _, stamp = measured_repo
    assert stamp["commit"] == _git(repo, "rev-parse", "HEAD~1") and stamp["clean"] is True
    (repo / "wellfno" / "cli.py").write_text("changed = 1\n")
    (repo / "new.py").write_text("")
    dirty = resultfiles.code_stamp(repo)
    assert dirty["clean"] is False and dirty["uncommitted"] == ["new.py", "wellfno/cli.py"]
    (tmp_path / "plain").mkdir()
    outside = resultfiles.code_stamp(tmp_path / "plain")   # no checkout: null, and why
    assert outside["commit"] is None and outside["clean"] is None
    assert "git" in outside["commit_note"]


def test_a_targets_code_is_its_scripts_and_what_they_import(measured_repo):
    from coursetools import staleness

    repo, target, _ = measured_repo
    assert staleness.dependencies(target, repo) == [
        "solutions/14_long_rollouts/compare.py", "solutions/14_long_rollouts/fno.py",
        "wellfno/__init__.py", "wellfno/cli.py", "wellfno/grayscott.py", "wellfno/unrolled.py"]


def test_stale_when_a_code_line_changed_after_the_recorded_commit(measured_repo):
    """03865ce's case: exercise 14's results measured, then a line of code in wellfno/unrolled.py
    (the generators re-seeded per epoch) committed after it."""
    from coursetools import staleness

    repo, target, _ = measured_repo
    assert staleness.stale_files(repo, [target]) == []
    (repo / "notes.md").write_text("more notes\n")                     # not its code
    (repo / "wellfno" / "other.py").write_text("X = 2\n")              # not imported by it
    (repo / "wellfno" / "unrolled.py").write_text(UNROLLED.replace(
        "The noise's generator.", "The noise's generator, per epoch.").replace(
        "# the same every epoch", "# a comment") + "# a last comment\n")  # no code changed
    _git(repo, "commit", "-q", "-am", "docs")
    assert staleness.stale_files(repo, [target]) == []
    (repo / "wellfno" / "unrolled.py").write_text(UNROLLED.replace(
        "return seed", "return seed + epoch"))
    _git(repo, "commit", "-q", "-am", "the generators re-seeded per epoch")
    [line] = staleness.stale_files(repo, [target])
    assert line.startswith("results/14.json is stale: ") and "wellfno/unrolled.py" in line
    assert "`make results ONLY=14`" in line and "other.py" not in line


def test_stale_when_an_imported_module_changes_in_the_tree_or_appears(measured_repo):
    from coursetools import staleness

    repo, target, _ = measured_repo
    # not committed
    (repo / "wellfno" / "cli.py").write_text("class UserError(ValueError):\n    pass\n")
    [line] = staleness.stale_files(repo, [target])
    assert "wellfno/cli.py" in line and "unrolled" not in line
    _git(repo, "checkout", "-q", "--", "wellfno/cli.py")
    (repo / "wellfno" / "noise.py").write_text("SCALE = 0.1\n")
    (repo / "solutions" / "14_long_rollouts" / "fno.py").write_text(
        "from wellfno import noise, unrolled\n")
    [line] = staleness.stale_files(repo, [target])
    assert "wellfno/noise.py (new since)" in line and "solutions/14_long_rollouts/fno.py" in line


@pytest.mark.parametrize("stamp, why", [
    ({}, "records no commit"),
    ({"commit": None, "commit_note": "not measured in a git checkout"},
     "not measured in a git checkout"),
    ({"commit": "0" * 40}, "not in this checkout's history"),
    ({"uncommitted": ["wellfno/unrolled.py", "results/other.json"]},
     "uncommitted changes to wellfno/unrolled.py"),
])
def test_stale_without_a_known_commit_or_with_uncommitted_code(measured_repo, stamp, why):
    from coursetools import staleness

    repo, target, recorded = measured_repo
    path = repo / target.file
    saved = json.loads(path.read_text())
    saved = {k: v for k, v in saved.items() if k not in ("commit", "clean")} if not stamp else \
        {**saved, **({"clean": False} if "uncommitted" in stamp else {}), **stamp}
    path.write_text(json.dumps(saved))
    [line] = staleness.stale_files(repo, [target])
    assert why in line and "results/other.json" not in line and "make results ONLY=14" in line


def test_staleness_needs_the_history_and_says_so(measured_repo, tmp_path):
    from coursetools import staleness

    repo, target, _ = measured_repo
    assert staleness.history_unavailable(repo) is None
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)],
                   check=True)
    assert "shallow clone" in staleness.history_unavailable(shallow)
    (tmp_path / "plain").mkdir()
    assert "not a git checkout" in staleness.history_unavailable(tmp_path / "plain")
    rc = run_script("-m", "coursetools.staleness", "--root", shallow, cwd=tmp_path)
    assert rc.returncode == 2 and rc.stderr.startswith("error: cannot tell")
    assert "Traceback" not in rc.stderr


def test_only_code_counts_as_a_change():
    from coursetools.staleness import normalized

    code = '''"""Module."""\ndef f(x):\n    """Doc."""\n    return x + 1  # one\n'''
    assert normalized(code) == normalized(code.replace("Doc.", "Other.").replace("# one", "# two"))
    assert normalized(code) == normalized(code.replace('"""Module."""\n', "# a comment\n"))
    assert normalized(code) != normalized(code.replace("x + 1", "x + 2"))
    assert normalized(code) != normalized(code.replace("return", "print(x)\n    return"))


def test_every_targets_code_is_found():
    """Each command and each script a target's tools start names a file here (a renamed script
    would drop out of its code silently); exercise 14's is solution 14 and wellfno.unrolled."""
    from coursetools import measure, staleness

    for target in measure.TARGETS:
        for command in (*target.commands, *target.runs):
            if "{py} -m pytest" not in command:
                assert staleness.scripts_of(command, REPO), (target.name, command)
    code = {t.name: staleness.dependencies(t, REPO) for t in measure.TARGETS}
    assert {"solutions/14_long_rollouts/fno.py", "wellfno/unrolled.py", "wellfno/evaluate.py",
            "fno.py", "wellfno/grayscott.py"} <= set(code["14_long_rollouts"])
    assert {"solutions/08_host_syncs/fno.py", "wellfno/model.py"} <= set(code["efficiency_cpu"])
    assert "solutions/13_domain_parallel/fno.py" in code["runtimes"]
    # and the module it imports from beside it (sys.path[0] when it runs), not a package's
    assert "solutions/13_domain_parallel/domain_conv.py" in code["runtimes"]
    assert "solutions/03_affinity/binding.py" in code["compare_scripts"]  # solution 03 runs it
    assert "solutions/05_ddp/fno.py" in code["05_ddp_scaling"]
    assert all((REPO / f).is_file() for files in code.values() for f in files)
