"""fno.py end to end: outputs, resume after a kill, and one-line errors for bad input."""
import json
import os
import signal
import subprocess
import time

import pytest
import torch
import yaml

import fno
from tests.conftest import PYTHON, REPO, run_script
from wellfno.cli import UserError

FAST = ["--epochs", "1", "--max-steps", "2", "--batch-size", "8"]


def test_end_to_end_writes_metrics_figure_and_checkpoint(tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    fno.main(["--data-dir", str(tiny_data_dir), "--out", str(out), *FAST])
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("samples_per_second", "train_loss", "valid_loss", "rollout_vrmse", "persistence_vrmse",
                "device", "config"):
        assert key in metrics, key
    assert metrics["samples_per_second"] > 0 and metrics["device"] == "cpu"
    assert len(metrics["rollout_vrmse"]) == len(metrics["persistence_vrmse"]) == 11  # 12 frames - 1 input
    assert metrics["config"]["max_steps"] == 2 and metrics["history"][0]["samples"] == 16  # stopped early
    assert (out / "rollout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 1 and state["step"] == 2 and "model" in state and "optimizer" in state
    assert not list(out.glob(".*tmp")), "no temporary files left behind"


def test_throughput_leaves_out_the_start_up_step(tiny_data_dir, tmp_path, monkeypatch):
    """The first step pays one-time costs (here two stand-in seconds of them); samples_per_second must not."""
    copy, calls = fno.data.batch_to_model, []

    def slow_first_copy(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(2.0)
        return copy(*args, **kwargs)

    monkeypatch.setattr(fno.data, "batch_to_model", slow_first_copy)
    out = tmp_path / "run"
    fno.main(["--data-dir", str(tiny_data_dir), "--out", str(out), "--epochs", "1", "--max-steps", "3",
              "--batch-size", "4"])
    metrics = json.loads((out / "metrics.json").read_text())
    epoch = metrics["history"][0]
    assert epoch["steps"] == 3 and epoch["samples"] == 12 and epoch["timed_samples"] == 8
    assert epoch["seconds"] >= 2.0 > epoch["timed_seconds"], epoch
    assert metrics["samples_per_second"] == pytest.approx(8 / epoch["timed_seconds"])
    assert "first 1 step" in metrics["samples_per_second_excludes"]


def test_resume_continues_where_a_killed_job_stopped(tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    # A job that would run long; kill it (like Slurm at its time limit) once an epoch is saved.
    proc = subprocess.Popen([PYTHON, "fno.py", "--data-dir", str(tiny_data_dir), "--out", str(out),
                             "--epochs", "1000", "--batch-size", "8"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (out / "checkpoint.pt").exists():
        assert proc.poll() is None, "training ended before writing a checkpoint"
        assert time.time() < deadline, "no checkpoint after 240 s"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = torch.load(out / "checkpoint.pt", weights_only=True)  # complete, not half-written
    done = saved["epoch"]
    assert done >= 1 and [h["epoch"] for h in saved["history"]] == list(range(1, done + 1))

    result = run_script("fno.py", "--data-dir", tiny_data_dir, "--out", out, "--epochs", done + 1,
                        "--batch-size", "8", "--resume")
    assert result.returncode == 0, result.stderr
    assert f"Resuming from {out / 'checkpoint.pt'} after epoch {done}" in result.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert [h["epoch"] for h in metrics["history"]] == list(range(1, done + 2))


def expect_user_error(args, match):
    with pytest.raises(UserError, match=match):
        fno.main([str(a) for a in args])


def test_cli_error_is_one_line_without_traceback(tmp_path):
    result = run_script("fno.py", "--dataset", "turbulent_radiative_layer_2D", "--data-dir", tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--download" in lines[0]


def test_missing_well_dataset_says_download_would_fetch_it(tmp_path):
    expect_user_error(["--dataset", "turbulent_radiative_layer_2D", "--data-dir", tmp_path], "add --download")


def test_unknown_dataset_lists_the_choices(tmp_path):
    expect_user_error(["--dataset", "gray_scot", "--data-dir", tmp_path], "unknown dataset 'gray_scot'.*active_matter")


def test_offline_download_that_leaves_empty_folders_is_detected(tmp_path):
    # Offline, the_well's downloader runs curl, which creates the folders, fails, and the
    # downloader still exits 0. A fake curl does exactly that, so the test never touches the network.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_curl = bin_dir / "curl"
    fake_curl.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && mkdir -p "$(dirname "$2")"; shift; done\n'
                         'echo "curl: (6) Could not resolve host" >&2; exit 6\n')
    fake_curl.chmod(0o755)
    result = run_script("fno.py", "--dataset", "turbulent_radiative_layer_2D", "--data-dir", tmp_path / "data",
                        "--download", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "left" in result.stderr and "empty" in result.stderr
    assert (tmp_path / "data/datasets/turbulent_radiative_layer_2D/data/train").is_dir()  # as curl left it


@pytest.mark.parametrize("where", ["datasets", "dataset"])
def test_data_dir_pointing_inside_is_accepted(tiny_data_dir, tmp_path, where):
    from wellfno.data import resolve_dataset

    inner = tiny_data_dir / "datasets" if where == "datasets" else tiny_data_dir / "datasets/gray_scott_embedded"
    assert resolve_dataset(inner) == tiny_data_dir / "datasets/gray_scott_embedded"


def test_corrupt_hdf5_file(tiny_data_copy):
    victim = next((tiny_data_copy / "datasets/gray_scott_embedded/data/train").glob("*.hdf5"))
    victim.write_bytes(b"this is not HDF5" * 100)
    expect_user_error(["--data-dir", tiny_data_copy, *FAST], f"{victim.name} is not a readable Well HDF5 file")


def test_stats_yaml_missing(tiny_data_copy):
    (tiny_data_copy / "datasets/gray_scott_embedded/stats.yaml").unlink()
    expect_user_error(["--data-dir", tiny_data_copy, *FAST], "stats.yaml is missing: compute it with `python stats.py")


def test_stats_yaml_lacking_keys(tiny_data_copy):
    path = tiny_data_copy / "datasets/gray_scott_embedded/stats.yaml"
    stats = yaml.safe_load(path.read_text())
    del stats["std_delta"]
    path.write_text(yaml.safe_dump(stats))
    expect_user_error(["--data-dir", tiny_data_copy, *FAST], "lacks std_delta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_gpu(tiny_data_dir):
    expect_user_error(["--data-dir", tiny_data_dir, "--device", "cuda"], "torch sees no GPU: use --device cpu")


def test_n_steps_input_too_long(tiny_data_dir):
    expect_user_error(["--data-dir", tiny_data_dir, "--n-steps-input", "12"], "at most 11 input steps fit")


def test_resume_with_other_settings(tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    fno.main(["--data-dir", str(tiny_data_dir), "--out", str(out), *FAST])
    expect_user_error(["--data-dir", tiny_data_dir, "--out", out, "--n-steps-input", "2", "--resume", *FAST],
                      "trained with other settings")
