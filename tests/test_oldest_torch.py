"""Every step of the course runs on the torch the tests run with: a short run of every solution.

Written for the oldest supported torch's leg (`make test-oldest`: torch 2.5.1 in .venv-oldest,
the PyPI wheel, on a CPU; CI runs it after `make test`'s main leg), and for any torch but the
pinned one (a site's, in `make test`); on the pinned torch each step's own checks run all of it
already, so the runs skip there. Here every solution (and the
variants whose code paths differ most between torch versions: fp16 with GradScaler, bf16,
torch.compile, the profiler, 2 ranks with the watchdog, the distributed statistics) trains a few
steps and writes what it should, or refuses in one line. INSTRUCTORS.md's table of the oldest
torch is this file's list.

A torch older than the oldest supported one is refused at start-up in one line
(wellfno.cli.check_torch, called by run_main): test_a_torch_below_the_range_is_one_line.
"""
from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from tests.conftest import REPO, STEPS, exit_of, import_script
from tests.ddp_helpers import SMALL_MODEL, assert_ok, launch

from wellfno.toolchain import PINNED_TORCH

# On the pinned torch every run below is one of its step's own checks already (make test's time).
not_on_the_pinned_torch = pytest.mark.skipif(
    torch.__version__.split("+")[0] == PINNED_TORCH,
    reason=f"torch {PINNED_TORCH}: each step's own tests run these (make test-oldest runs them on "
    "the oldest)")

FEW_STEPS = ("--epochs", "1", "--max-steps", "2", "--batch-size", "2", "--n-steps-input", "10",
             *SMALL_MODEL)
BINDS = {step for step in STEPS if step >= "03"}  # --bind from solution 03 on
# step: extra options of the variant, beyond a plain run
VARIANTS = [(step, ()) for step in STEPS] + [
    ("01_profiling", ("--profile", "--profile-warmup", "0", "--profile-active", "2")),
    ("09_mixed_precision", ("--amp", "fp16")),  # GradScaler over the model's real weights
    ("09_mixed_precision", ("--amp", "bf16")),  # refused in one line on a CPU without bf16 units
    ("11_compile", ("--compile",)),
    ("14_long_rollouts", ("--rollout-steps", "2")),  # K forwards before one backward
    ("14_long_rollouts", ("--rollout-steps", "2", "--pushforward")),  # no_grad steps first
]


def options(step: str, extra: tuple) -> tuple:
    return (*FEW_STEPS, *(("--bind", "none") if step in BINDS else ()), *extra)


@pytest.mark.slow
@not_on_the_pinned_torch
@pytest.mark.parametrize("step, extra", VARIANTS,
                         ids=[f"{s}{'-' + '-'.join(e) if e else ''}" for s, e in VARIANTS])
def test_every_solution_runs_a_few_steps(step, extra, tiny_data_dir, tmp_path):
    """The solution trains 2 steps and writes metrics.json with a finite loss (a profiled run: its
    trace), or stops with one `error:` line that says why (and nothing else on stderr)."""
    script = import_script(REPO / STEPS[step])
    done = exit_of(script, "--data-dir", tiny_data_dir, "--out", tmp_path, *options(step, extra))
    if done.returncode == 2 and "--amp" in extra:
        lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and "bf16" in lines[0], done.stderr[-800:]
        return
    assert done.returncode == 0, (
        f"{STEPS[step]} {' '.join(extra)} on torch {torch.__version__}: exit code "
        f"{done.returncode}\n{(done.stdout + done.stderr)[-1500:]}")
    if "--profile" in extra:
        assert list(tmp_path.glob("*.json*")), "the profiled run wrote no trace"
        return
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert math.isfinite(metrics["train_loss"]) and math.isfinite(metrics["valid_loss"]), metrics


@pytest.mark.slow
@not_on_the_pinned_torch
@pytest.mark.parametrize("step", ["07_failures", "13_domain_parallel"])
def test_two_ranks_train_with_the_default_binding_off(step, tiny_data_dir, tmp_path):
    """2 ranks as torchrun starts them: the watchdog's threads and store (07), the domain group's
    collectives (13: 1 data x 2 domain ranks). (DDP of 05, 06, 12 and 13: tests/test_nccl_seam.py.)
    """
    extra = ("--domain-size", "2") if step == "13_domain_parallel" else ()
    results = launch(REPO / STEPS[step], 2, "--data-dir", tiny_data_dir, "--out", tmp_path,
                     *options(step, extra))
    assert_ok(results)
    assert (tmp_path / "metrics.json").is_file()


@pytest.mark.slow
@not_on_the_pinned_torch
def test_distributed_statistics_equal_the_serial_ones(tiny_data_dir, tmp_path):
    """Exercise 04's solution on 2 ranks writes the serial stats.py's stats.yaml, bit for bit."""
    dataset = tiny_data_dir / "datasets" / "gray_scott_embedded"
    assert_ok(launch(REPO / "stats.py", 0, dataset, "--out", tmp_path / "serial.yaml"))
    results = launch(REPO / "solutions" / "04_distributed_stats" / "stats.py", 2, dataset,
                     "--out", tmp_path / "two.yaml")
    assert_ok(results)
    assert (tmp_path / "two.yaml").read_bytes() == (tmp_path / "serial.yaml").read_bytes()


def test_a_torch_below_the_range_is_one_line(monkeypatch, capsys):
    """run_main refuses a torch older than OLDEST_TORCH before main runs: one line naming the
    oldest supported version and how to get it, exit code 2."""
    from wellfno import cli

    ran = []
    monkeypatch.setattr(cli, "leave", sys.exit)  # run_main's os._exit would end the test process
    monkeypatch.setattr(torch, "__version__", "2.4.1+cu121")
    with pytest.raises(SystemExit) as stopped:
        cli.run_main(lambda: ran.append(True))
    said = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and not ran
    assert len(said) == 1 and said[0].startswith("error: torch 2.4.1+cu121 is older than 2.5"), said
    assert "TORCH_SPEC=" in said[0] and "module or container" in said[0]
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    with pytest.raises(SystemExit) as stopped:
        cli.run_main(lambda: ran.append(True))
    assert stopped.value.code == 0 and ran


def test_the_environment_check_says_whether_the_course_supports_this_torch():
    """python -m wellfno.toolchain: the torch, its build, its GPUs, and one verdict line."""
    from wellfno.toolchain import OLDEST_TESTED, PINNED_TORCH, torch_lines

    old = torch_lines("2.4.1+rocm6.1", None, "6.1", 8, "/site/torch")
    assert old[0] == "torch 2.4.1+rocm6.1 (ROCm/HIP 6.1) from /site/torch; GPUs torch sees: 8"
    assert old[1].startswith("NOT SUPPORTED: older than 2.5") and "TORCH_SPEC=" in old[1]
    assert len(old) == 2  # GPUs seen: no line about them
    for version in (OLDEST_TESTED, "2.7.0+cu126", PINNED_TORCH):
        lines = torch_lines(version, "12.6", None, 4, "/x")
        assert lines[1].startswith("supported: every step runs from 2.5 on"), lines
    newer = torch_lines("2.15.0", None, None, 0, "/x")
    assert newer[1].startswith("supported (from 2.5 on); newer than the course's tests"), newer
    assert newer[2].startswith("no GPU visible here"), newer


def test_the_day_0_report_says_whether_the_course_supports_the_nodes_torch():
    from coursetools.gpucheck import version_lines

    task = {"versions": dict(python="3.11", torch="2.4.0", cuda="12.1", hip=None, driver="550",
                             cudnn_or_miopen="9", nccl_or_rccl="2.20")}
    lines = version_lines([task])
    assert lines[0].startswith("versions: python 3.11, torch 2.4.0")
    assert lines[1].startswith("NOT SUPPORTED: older than 2.5"), lines
    task["versions"]["torch"] = "2.6.0"
    assert version_lines([task])[1].startswith("supported"), version_lines([task])
