"""The baseline's contract, checked on fno.py and on every solution after it (tests/conftest.py: STEPS).

Outputs, throughput without the start-up, resume after a kill, and bad input: one line that says what
to do, a non-zero exit, and nothing written.

    .venv/bin/python -m pytest -q tests/test_fno.py --script fno.py   # your edited script
"""
import json
import os
import signal
import subprocess
import time

import pytest
import torch
import yaml

from tests.conftest import PYTHON, REPO, START_UP_SECONDS, call_main, exit_of, run_script
from wellfno.cli import UserError

STEP = "00_baseline"
FAST = ["--epochs", "1", "--max-steps", "3", "--batch-size", "4"]


def files_under(*folders):
    """Every file under the folders with its size and modification time: to see that nothing was written."""
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for folder in folders if folder.exists()
                  for p in folder.rglob("*") if p.is_file())


def expect_user_error(module, tmp_path, data_dir, args, match):
    """main() refuses `args` with a UserError matching `match`, having written nothing."""
    watched = [tmp_path, data_dir]
    before = files_under(*watched)
    with pytest.raises(UserError, match=match):
        call_main(module, "--data-dir", data_dir, "--out", tmp_path / "out", *FAST, *args)
    assert files_under(*watched) == before, "a refused run must not write anything"
    assert not (tmp_path / "out").exists()


def test_end_to_end_writes_metrics_figure_and_checkpoint(script, tiny_data_dir, trained):
    out = trained(script, tiny_data_dir, *FAST)
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("samples_per_second", "train_loss", "valid_loss", "rollout_vrmse", "persistence_vrmse",
                "device", "config", "history"):
        assert key in metrics, key
    assert metrics["device"] == "cpu" and metrics["config"]["max_steps"] == 3
    assert len(metrics["rollout_vrmse"]) == len(metrics["persistence_vrmse"]) == 11  # 12 frames - 1 input
    assert (out / "rollout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 1 and state["step"] == 3 and "model" in state and "optimizer" in state
    assert not list(out.glob(".*tmp")), "no temporary files left behind"


def test_throughput_leaves_out_the_start_up_step(script, tiny_data_dir, trained):
    """The first step pays one-time costs (in this run a stand-in 2 s); samples_per_second must not."""
    metrics = json.loads((trained(script, tiny_data_dir, *FAST) / "metrics.json").read_text())
    epoch = metrics["history"][0]
    assert epoch["steps"] == 3 and epoch["samples"] == 12 and epoch["timed_samples"] == 8  # stopped at 3 steps
    assert epoch["seconds"] - epoch["timed_seconds"] >= START_UP_SECONDS, epoch  # the slow step is not timed
    assert metrics["samples_per_second"] == pytest.approx(8 / epoch["timed_seconds"])
    assert "first 1 step" in metrics["samples_per_second_excludes"]


@pytest.mark.slow
def test_resume_continues_where_a_killed_job_stopped(script, tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    # A job that would run long; kill it (like Slurm at its time limit) once an epoch is saved.
    proc = subprocess.Popen([PYTHON, str(script), "--data-dir", str(tiny_data_dir), "--out", str(out),
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

    result = run_script(script, "--data-dir", tiny_data_dir, "--out", out, "--epochs", done + 1,
                        "--batch-size", "8", "--resume")
    assert result.returncode == 0, result.stderr
    assert f"Resuming from {out / 'checkpoint.pt'} after epoch {done}" in result.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert [h["epoch"] for h in metrics["history"]] == list(range(1, done + 2))


def test_cli_error_is_one_line_without_traceback(script_module, tmp_path):
    """As a participant sees it: a file where a folder belongs (NotADirectoryError without the check).

    `python SCRIPT ...` run in this process (conftest.py's exit_of: the same run_main, status and
    stderr)."""
    result = exit_of(script_module, "--data-dir", REPO / "README.md", "--out", tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "README.md" in lines[0], lines
    assert not (tmp_path / "out").exists()


# Each: arguments, then a word of the one-line answer.
BAD_INPUT = [
    (["--data-dir", REPO / "README.md"], "is a file"),
    (["--out", REPO / "README.md"], "is a file"),
    (["--out", REPO / "README.md" / "run"], "is a file"),
    (["--lr", "-1"], "--lr"),
    (["--lr", "0"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--lr", "inf"], "--lr"),
    (["--epochs", "0"], "--epochs"),
    (["--batch-size", "-4"], "--batch-size"),
    (["--n-steps-input", "0"], "--n-steps-input"),
    (["--n-steps-input", "12"], "at most 11 input steps fit"),
    (["--max-steps", "-1"], "--max-steps"),
    (["--seed", "-1"], "--seed"),
    (["--dataset", "gray_scot"], "unknown dataset 'gray_scot': did you mean gray_scott_embedded or gray_scott_reaction_diffusion"),
    (["--dataset", "turbulent_radiative_layer_2D"], "add --download"),
]


@pytest.mark.parametrize("args,match", BAD_INPUT, ids=[" ".join(map(str, a)).replace(str(REPO), "REPO")
                                                        for a, _ in BAD_INPUT])
def test_bad_input_is_refused_before_anything_is_written(script_module, tiny_data_dir, tmp_path, args, match):
    expect_user_error(script_module, tmp_path, tiny_data_dir, args, match)


@pytest.mark.parametrize("args", [["--device", "tpu"], ["--epochs", "two"], ["--lr", "fast"]])
def test_out_of_range_choices_are_argparse_errors(script_module, tmp_path, capsys, args):
    with pytest.raises(SystemExit) as exit_info:
        call_main(script_module, "--out", tmp_path / "out", *args)
    assert exit_info.value.code == 2
    assert [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert not (tmp_path / "out").exists()


def test_corrupt_hdf5_file(script_module, tiny_data_copy, tmp_path):
    victim = next((tiny_data_copy / "datasets/gray_scott_embedded/data/train").glob("*.hdf5"))
    victim.write_bytes(b"this is not HDF5" * 100)
    expect_user_error(script_module, tmp_path, tiny_data_copy, [], f"{victim.name} is not a readable Well HDF5 file")


def test_stats_yaml_missing(script_module, tiny_data_copy, tmp_path):
    (tiny_data_copy / "datasets/gray_scott_embedded/stats.yaml").unlink()
    expect_user_error(script_module, tmp_path, tiny_data_copy, [],
                      "stats.yaml is missing: compute it with `python stats.py")


def test_stats_yaml_lacking_keys(script_module, tiny_data_copy, tmp_path):
    path = tiny_data_copy / "datasets/gray_scott_embedded/stats.yaml"
    stats = yaml.safe_load(path.read_text())
    del stats["std_delta"]
    path.write_text(yaml.safe_dump(stats))
    expect_user_error(script_module, tmp_path, tiny_data_copy, [], "lacks std_delta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_gpu(script_module, tiny_data_dir, tmp_path):
    expect_user_error(script_module, tmp_path, tiny_data_dir, ["--device", "cuda"], "torch sees no GPU: use --device cpu")


def resumable_copy(trained_out, tmp_path):
    """A copy of a finished run's folder, to resume from."""
    import shutil

    return shutil.copytree(trained_out, tmp_path / "out")


def test_resume_with_other_settings(script_module, script, tiny_data_dir, trained, tmp_path):
    resumable_copy(trained(script, tiny_data_dir, *FAST), tmp_path)
    before = files_under(tmp_path)
    with pytest.raises(UserError, match="trained with other settings"):
        call_main(script_module, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", *FAST,
                  "--n-steps-input", "2", "--resume")
    assert files_under(tmp_path) == before


def test_resume_from_a_truncated_checkpoint_says_it_is_damaged(script_module, script, tiny_data_dir, trained,
                                                               tmp_path):
    out = resumable_copy(trained(script, tiny_data_dir, *FAST), tmp_path)
    checkpoint = out / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])  # a copy cut short
    before = files_under(tmp_path)
    with pytest.raises(UserError, match="checkpoint.pt is damaged.*delete it"):
        call_main(script_module, "--data-dir", tiny_data_dir, "--out", out, *FAST, "--epochs", "2", "--resume")
    assert files_under(tmp_path) == before


# Baseline only: these exercise wellfno.data, which every step shares.

@pytest.mark.slow
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
def test_data_dir_pointing_inside_is_accepted(tiny_data_dir, where):
    from wellfno.data import resolve_dataset

    inner = tiny_data_dir / "datasets" if where == "datasets" else tiny_data_dir / "datasets/gray_scott_embedded"
    assert resolve_dataset(inner) == tiny_data_dir / "datasets/gray_scott_embedded"


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all" * 10, b"PK\x03\x04" + b"\0" * 100])
def test_a_damaged_checkpoint_is_named_and_the_way_out_given(tmp_path, content):
    from wellfno.cli import load_checkpoint

    path = tmp_path / "checkpoint.pt"
    path.write_bytes(content)
    with pytest.raises(UserError, match=r"checkpoint.pt is damaged \(.*\): delete it"):
        load_checkpoint(path)


def test_an_output_folder_that_cannot_be_written_is_refused(tmp_path):
    from wellfno.cli import check_output_dir

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root)")
        with pytest.raises(UserError, match="not writable"):
            check_output_dir(locked / "run")
    finally:
        locked.chmod(0o700)
    assert check_output_dir(tmp_path / "new" / "run") == tmp_path / "new" / "run"  # not there yet: fine


def test_a_checkpoint_cut_anywhere_is_reported_damaged(tmp_path):
    """Every cut point of a small model's checkpoint is a UserError saying it is damaged, never
    another exception (some cut points make torch.load's zip reader raise OSError, Errno 22)."""
    import torch

    from wellfno.cli import UserError, atomic_torch_save, load_checkpoint
    from wellfno.model import NextFrameFNO

    ones = torch.ones(2)
    model = NextFrameFNO(2, 1, dict(mean=0 * ones, std=ones, mean_delta=0 * ones, std_delta=ones),
                         modes=4, width=8, layers=2)
    whole = tmp_path / "checkpoint.pt"
    atomic_torch_save(whole, {"model": model.state_dict(), "epoch": 1})
    data = whole.read_bytes()
    cut = tmp_path / "cut.pt"
    for fraction in (0.1, 0.25, 0.5, 0.75, 0.9, 0.99):
        cut.write_bytes(data[: int(len(data) * fraction)])
        with pytest.raises(UserError, match="is damaged"):
            load_checkpoint(cut)
    assert load_checkpoint(whole)["epoch"] == 1
