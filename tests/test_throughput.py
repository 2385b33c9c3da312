"""profiling/throughput.py and compare_scripts.py: run on tiny data, write their files, refuse bad input in one line."""
import csv
import json

import pytest

from profiling import compare_scripts, throughput
from tests.conftest import run_script
from wellfno.cli import UserError

REQUIRED = {"reader", "num_workers", "pin_memory", "prefetch_factor", "data_only", "compute_only", "full"}


@pytest.mark.slow  # the whole sweep: every reader, worker count and the trainer, several seconds each
def test_sweep_on_tiny_data_writes_json_csv_png(tiny_data_dir, tmp_path):
    out = tmp_path / "tp"
    result = run_script("profiling/throughput.py", "--data-dir", tiny_data_dir, "--out", out, "--workers", "0,1",
                        "--prefetch-factor", "3", "--pin-memory", "off,on", "--seconds", "0.1", "--repeats", "1",
                        "--warmup", "1", "--batch-size", "4", "--threads", "1")
    assert result.returncode == 0, result.stderr
    assert "--pin-memory on needs a GPU" in result.stderr  # CPU: measured unpinned only, and said so
    report = json.loads((out / "throughput.json").read_text())
    rows = report["rows"]
    # Per reader: 0 workers (no prefetch_factor) + 1 worker prefetching 3; pin off only on CPU.
    assert sorted((r["reader"], r["num_workers"], r["prefetch_factor"]) for r in rows) == [
        ("fast", 0, None), ("fast", 1, 3), ("well", 0, None), ("well", 1, 3)]
    for row in rows:
        assert REQUIRED <= row.keys()
        assert row["pin_memory"] is False
        assert row["data_only"] > 0 and row["full"] > 0 and row["compute_only"] > 0
        assert row["efficiency"] == pytest.approx(row["full"] / row["compute_only"])
    assert report["machine"]["cores"] >= 1 and report["machine"]["threads"] == 1
    readers = report["readers"]["samples_per_s"]
    assert readers["raw_h5py"] > 0 and readers["fast"] > 0 and readers["well"] > 0
    with open(out / "throughput.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and REQUIRED <= set(table[0])
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "full/compute" in result.stdout  # the printed table
    assert not list(out.glob(".*tmp")), "no temporary files left behind"


@pytest.mark.parametrize("args, match", [
    (["--workers", "0,-1"], "--workers values must be at least 0"),
    (["--workers", "two"], "comma-separated whole numbers"),
    (["--prefetch-factor", "0"], "--prefetch-factor values must be at least 1"),
    (["--readers", "fast,turbo"], "--readers takes a comma-separated list of well, fast"),
    (["--pin-memory", "yes"], "--pin-memory takes a comma-separated list of off, on"),
    (["--seconds", "0"], "--seconds must be positive"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
])
def test_bad_sweep_options_are_user_errors(args, match):
    with pytest.raises(UserError, match=match):
        throughput.parse_args(args)


def test_prefetch_factor_only_with_workers():
    args = throughput.parse_args(["--workers", "0,2", "--prefetch-factor", "2,4", "--readers", "fast",
                                  "--device", "cpu"])
    assert [(c["num_workers"], c["prefetch_factor"]) for c in throughput.configurations(args)] == [
        (0, None), (2, 2), (2, 4)]


def test_missing_data_is_one_line_error(tmp_path):
    result = run_script("profiling/throughput.py", "--data-dir", tmp_path, "--dataset", "turbulent_radiative_layer_2D",
                        "--out", tmp_path / "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and result.stderr.startswith("error: ")


@pytest.mark.slow  # two real training runs
def test_compare_scripts_runs_whole_training_scripts(tiny_data_dir, tmp_path):
    out = tmp_path / "cmp"
    result = run_script("profiling/compare_scripts.py", "--data-dir", tiny_data_dir, "--out", out, "--repeats", "1",
                        "--script-args", "--epochs 1 --max-steps 2 --batch-size 4",
                        "--scripts", "fno.py", "solutions/02_data_pipeline/fno.py --num-workers 1 --fast-reader")
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "scripts.json").read_text())
    assert [r["command"] for r in report["rows"]] == ["fno.py",
                                                      "solutions/02_data_pipeline/fno.py --num-workers 1 --fast-reader"]
    runs = [json.loads((out / f"scripts/{i}_round0/metrics.json").read_text()) for i in (0, 1)]
    # The table is the scripts' own numbers, each relative to the first.
    assert [r["samples_per_s"] for r in report["rows"]] == [m["samples_per_second"] for m in runs]
    assert report["rows"][1]["vs_first"] == pytest.approx(runs[1]["samples_per_second"] / runs[0]["samples_per_second"])
    assert runs[1]["config"]["num_workers"] == 1 and runs[1]["config"]["fast_reader"]
    assert runs[1]["config"]["max_steps"] == 2
    assert "| `fno.py` |" in result.stdout  # the markdown table for the README


def test_compare_scripts_missing_script_is_a_user_error(tiny_data_dir, tmp_path):
    with pytest.raises(UserError, match=r"--scripts: no script 'nope.py' \(give a path, then its options\)"):
        compare_scripts.main(["--data-dir", str(tiny_data_dir), "--out", str(tmp_path), "--scripts", "nope.py --x"])
    assert not (tmp_path / "scripts.json").exists()

