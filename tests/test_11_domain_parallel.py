"""Exercise 11 check-your-work: one sample split across a domain group of ranks, exact against one.

    .venv/bin/python -m pytest -q tests/test_11_domain_parallel.py --script YOUR_SCRIPT

The ranks run on the CPU with gloo, started as torchrun starts them (tests/test_05_ddp.py's
`launch`). The reference is the same script on one rank. Data: the tiny embedded dataset
(16 x 16 cells; 3 domain ranks hold 6, 5 and 5 rows) with --n-steps-input 10: 8 training and 4
validation samples. wellfno.domain's own equivalence (forward and gradients, 2-D and 3-D) is
in tests/test_domain.py, the slab reads in tests/test_slabs.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest
import torch

from tests.conftest import PYTHON, REPO
from tests.test_05_ddp import (
    SMALL,
    assert_ok,
    error_lines,
    free_port,
    launch,
    max_relative_difference,
    parameters,
)
from tests.test_slurm import (
    job_env,
    run_job,
    slurm_cluster,
    slurm_data,
)  # noqa: F401 - fixtures of the Slurm tests

STEP = "11_domain_parallel"  # the cross-step matrix (tests/conftest.py) supplies `script`
ONE_STEP = ("--epochs", "1", "--max-steps", "1", *SMALL)


@pytest.fixture(scope="module")
def one_rank(script, tiny_data_dir, tmp_path_factory):
    """One rank, --batch-size 4, one step: the reference checkpoint and metrics."""
    out = tmp_path_factory.mktemp("domain_one_rank")
    assert_ok(
        launch(script, 0, "--data-dir", tiny_data_dir, "--out", out, "--batch-size", "4", *ONE_STEP)
    )
    return out


def metrics(out):
    return json.loads((out / "metrics.json").read_text())


def relative(values, reference):
    got, ref = torch.tensor(values, dtype=torch.float64), torch.tensor(
        reference, dtype=torch.float64
    )
    return ((got - ref).abs() / ref.abs()).max().item()


@pytest.mark.slow
def test_a_domain_group_of_2_trains_as_one_rank(script, tiny_data_dir, one_rank, tmp_path):
    """1 data x 2 domain ranks, batch 4: after one step the parameters of one rank (to float32
    rounding: the same sums in another order), the same losses, VRMSE curves and samples counted
    once."""
    results = launch(
        script,
        2,
        "--data-dir",
        tiny_data_dir,
        "--out",
        tmp_path,
        "--batch-size",
        "4",
        "--domain-size",
        "2",
        *ONE_STEP,
    )
    assert_ok(results)
    assert "1 data x 2 domain ranks" in results[0][1]
    assert (
        max_relative_difference(
            parameters(tmp_path / "checkpoint.pt"), parameters(one_rank / "checkpoint.pt")
        )
        <= 1e-5
    )
    got, ref = metrics(tmp_path), metrics(one_rank)
    assert (
        relative([got["train_loss"], got["valid_loss"]], [ref["train_loss"], ref["valid_loss"]])
        <= 1e-5
    )
    assert (
        relative(
            got["rollout_vrmse"] + got["persistence_vrmse"],
            ref["rollout_vrmse"] + ref["persistence_vrmse"],
        )
        <= 1e-5
    )
    assert got["history"][0]["samples"] == ref["history"][0]["samples"] == 4
    assert got["global_batch_size"] == 4 and got["world_size"] == 2


@pytest.mark.slow
def test_2_data_x_2_domain_ranks_equal_one_rank_with_twice_the_batch(
    script, tiny_data_dir, one_rank, tmp_path
):
    results = launch(
        script,
        4,
        "--data-dir",
        tiny_data_dir,
        "--out",
        tmp_path,
        "--batch-size",
        "2",
        "--domain-size",
        "2",
        *ONE_STEP,
    )
    assert_ok(results)
    assert "global batch 4 = 2 domain group(s) x --batch-size 2" in results[0][1]
    assert (
        max_relative_difference(
            parameters(tmp_path / "checkpoint.pt"), parameters(one_rank / "checkpoint.pt")
        )
        <= 1e-5
    )
    assert relative([metrics(tmp_path)["train_loss"]], [metrics(one_rank)["train_loss"]]) <= 1e-5


@pytest.mark.slow
def test_the_checkpoint_evaluates_alike_on_any_layout(script, tiny_data_dir, one_rank, tmp_path):
    """One rank's checkpoint, --eval-only on 1 x 3 ranks (16 rows: 6 + 5 + 5) and on 2 x 2: the
    valid loss and the rollout VRMSE of one rank, to 1e-5 (float64 sums over the slabs)."""
    reference = None
    for world, size in ((0, 1), (3, 3), (4, 2)):
        out = tmp_path / f"w{world}"
        out.mkdir()
        shutil.copy(one_rank / "checkpoint.pt", out / "checkpoint.pt")
        assert_ok(
            launch(
                script,
                world,
                "--data-dir",
                tiny_data_dir,
                "--out",
                out,
                "--eval-only",
                "--batch-size",
                "3",
                "--domain-size",
                str(size),
                *SMALL,
            )
        )
        evaluation = json.loads((out / "eval.json").read_text())
        values = [
            evaluation["valid_loss"],
            *evaluation["rollout_vrmse"],
            *evaluation["persistence_vrmse"],
        ]
        assert (out / "checkpoint.pt").read_bytes() == (one_rank / "checkpoint.pt").read_bytes()
        if reference is None:
            reference = values
        else:
            assert len(values) == len(reference) and relative(values, reference) <= 1e-5, (
                world,
                values,
                reference,
            )


@pytest.mark.slow
def test_a_killed_domain_rank_ends_every_rank_within_seconds(script, tiny_data_dir, tmp_path):
    """Rank 1 of a domain group is killed (SIGKILL) while training; rank 0, blocked in the exchange
    with it, must end within seconds with one line naming rank 1, not wait out --timeout 600."""
    out = tmp_path / "run"
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update(
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        procs.append(
            subprocess.Popen(
                [
                    PYTHON,
                    str(script),
                    "--data-dir",
                    str(tiny_data_dir),
                    "--out",
                    str(out),
                    "--epochs",
                    "1000",
                    "--batch-size",
                    "1",
                    "--domain-size",
                    "2",
                    "--timeout",
                    "600",
                    *SMALL,
                ],
                cwd=REPO,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    stdout0 = []
    reader = threading.Thread(target=lambda: stdout0.extend(procs[0].stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180
        while not any("Training on" in line for line in stdout0) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert any("Training on" in line for line in stdout0), "the run never started training"
        time.sleep(2)  # in the training loop
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        stderr0 = procs[0].communicate(timeout=120)[1]
        elapsed = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert procs[0].returncode != 0 and elapsed < 60, (procs[0].returncode, elapsed)
    lines = error_lines(stderr0)
    assert len(lines) == 1 and "rank 1" in lines[0], stderr0[-3000:]


@pytest.mark.slow
def test_a_3d_standin_of_mhd_256_trains_on_2_and_3_domain_ranks_as_on_one(script, tmp_path):
    """MHD_256's layout (7 channels, 3-D) at 1/32 scale (8^3 cells: 3 ranks hold 3 + 3 + 2 rows),
    one step: 2 ranks with --checkpoint-blocks and 3 ranks give one rank's parameters and VRMSE."""
    from wellfno.standin import write_standin

    write_standin(tmp_path / "data", "MHD_256", steps=4, trajectories=2, scale=1 / 32)
    common = (
        "--data-dir",
        tmp_path / "data",
        "--dataset",
        "MHD_256",
        "--modes",
        "4",
        "--width",
        "8",
        "--batch-size",
        "2",
        "--epochs",
        "1",
        "--max-steps",
        "1",
        "--bind",
        "none",
        "--seed",
        "3",
    )
    runs = {}
    for world, extra in ((0, ()), (2, ("--checkpoint-blocks",)), (3, ())):
        out = tmp_path / f"w{world}"
        size = ("--domain-size", str(world)) if world else ()
        assert_ok(launch(script, world, *common, "--out", out, *size, *extra))
        runs[world] = out
    for world in (2, 3):
        assert (
            max_relative_difference(
                parameters(runs[world] / "checkpoint.pt"), parameters(runs[0] / "checkpoint.pt")
            )
            <= 1e-5
        ), world
        got, ref = metrics(runs[world]), metrics(runs[0])
        assert relative(got["rollout_vrmse"], ref["rollout_vrmse"]) <= 1e-5, world


# --------------------------------------------------------------------------- bad input
def one_line_error(results, out, message):
    assert all(rc == 2 for rc, _, _ in results), [(rc, err[-2000:]) for rc, _, err in results]
    lines = [line for _, _, err in results for line in error_lines(err)]
    assert lines and all(message in line for line in lines), lines
    for _, _, err in results:
        assert "Traceback" not in err, err[-3000:]
        assert len(error_lines(err)) <= 1
    assert not out.exists() or not any(out.iterdir()), "nothing may be written"


def test_a_world_the_grid_does_not_divide_is_one_line(script, tiny_data_dir, tmp_path):
    out = tmp_path / "out"
    results = launch(
        script, 0, "--data-dir", tiny_data_dir, "--out", out, "--domain-size", "2", *ONE_STEP
    )
    one_line_error(results, out, "do not divide into domain groups of 2")


def test_compile_with_a_domain_group_is_one_line(script, tiny_data_dir, tmp_path):
    """--compile --domain-size 2 is refused before any rank is needed. Tried (torch 2.13, CPU, gloo,
    2 ranks, 16 x 16 grid): torch.compile spends minutes compiling, then Inductor stops with a
    traceback in the backward of the all-to-all exchange ("self.stride(-1) must be 1 to view
    ComplexFloat as Float", at DomainSpectralConv's split of the kept modes). Without the refusal
    this single process would fail on the layout instead ("do not divide into domain groups")."""
    out = tmp_path / "out"
    results = launch(script, 0, "--data-dir", tiny_data_dir, "--out", out, "--domain-size", "2",
                     "--compile", *ONE_STEP)
    one_line_error(results, out, "--compile and --domain-size > 1 do not go together")


def test_more_domain_ranks_than_rows_is_one_line(script, tiny_data_dir, tmp_path):
    """16 rows, 17 domain ranks: refused before any rank is needed (the grid is checked first)."""
    out = tmp_path / "out"
    results = launch(
        script, 0, "--data-dir", tiny_data_dir, "--out", out, "--domain-size", "17", *ONE_STEP
    )
    one_line_error(
        results, out, "--domain-size 17 is more than the 16 cells of the first spatial axis"
    )


@pytest.mark.slow
def test_modes_too_few_to_share_is_one_line(script, tiny_data_dir, tmp_path):
    out = tmp_path / "out"
    results = launch(
        script,
        2,
        "--data-dir",
        tiny_data_dir,
        "--out",
        out,
        "--domain-size",
        "2",
        "--modes",
        "1",
        *ONE_STEP,
    )
    one_line_error(results, out, "fewer than the 2 domain ranks")


@pytest.mark.slow
def test_a_checkpoint_of_another_model_size_is_one_line(script, tiny_data_dir, one_rank, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(one_rank / "checkpoint.pt", out / "checkpoint.pt")
    before = (out / "checkpoint.pt").read_bytes()
    results = launch(
        script,
        2,
        "--data-dir",
        tiny_data_dir,
        "--out",
        out,
        "--domain-size",
        "2",
        "--width",
        "16",
        "--resume",
        *ONE_STEP,
    )
    assert all(rc == 2 for rc, _, _ in results), [err[-2000:] for _, _, err in results]
    lines = [line for _, _, err in results for line in error_lines(err)]
    assert lines and all("trained with other settings" in line for line in lines), lines
    assert (
        sorted(p.name for p in out.iterdir()) == ["checkpoint.pt"]
        and (out / "checkpoint.pt").read_bytes() == before
    )


# --------------------------------------------------------------------------- Slurm
@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_11_domain_group_of_two_tasks_then_one_task_evaluates(
    slurm_cluster, slurm_data, tmp_path
):  # noqa: F811
    """slurm/11_domain_parallel.sbatch on the local cluster: srun starts one domain group of 2 tasks
    (--domain-size = tasks per node), then 1 task evaluates the checkpoint: the same valid loss.
    """
    job = run_job(
        "11_domain_parallel.sbatch",
        "--epochs",
        "1",
        "--batch-size",
        "2",
        "--n-steps-input",
        "10",
        "--seed",
        "3",
        env=job_env(tmp_path / "runs", slurm_data),
        run_root=tmp_path / "runs",
        timeout=600,
    )
    job.assert_completed()
    metrics = json.loads((job.run_dir / "metrics.json").read_text())
    evaluation = json.loads((job.run_dir / "eval.json").read_text())
    assert (
        metrics["world_size"] == 2
        and metrics["global_batch_size"] == 2
        and evaluation["world_size"] == 1
    )
    assert metrics["config"]["domain_size"] == 2
    assert abs(evaluation["valid_loss"] - metrics["valid_loss"]) <= 1e-5 * abs(
        metrics["valid_loss"]
    )
    log = job.logs()
    assert (
        "Training on 2 rank(s) (srun, gloo backend, cpu)" in log
        and "1 data x 2 domain ranks" in log
    ), log


# --------------------------------------------------------------------------- benchmark
@pytest.mark.slow
def test_domain_benchmark_writes_numbers_that_hang_together(tmp_path):
    """benchmark.py, weak and strong on 1 and 2 CPU ranks of a tiny model: a results file whose rows
    say what ran; the exchange has a share only with 2 ranks' all_to_all (1 rank: only the
    gradients' all_reduce on a world of one)."""
    out = tmp_path / "bench"
    result = subprocess.run(
        [
            PYTHON,
            str(REPO / "solutions/11_domain_parallel/benchmark.py"),
            "--ranks",
            "1",
            "2",
            "--rows",
            "8",
            "--cols",
            "16",
            "--width",
            "8",
            "--layers",
            "2",
            "--fno-modes",
            "4",
            "--batch-size",
            "2",
            "--steps",
            "5",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    written = json.loads((out / "domain_scaling.json").read_text())
    assert written["command"].startswith(
        "python solutions/11_domain_parallel/benchmark.py --ranks 1 2"
    )
    weak, strong = written["data"]["modes"]["weak"], written["data"]["modes"]["strong"]
    assert [(r["ranks"], r["grid"]) for r in weak] == [(1, "8x16"), (2, "16x16")]
    assert [(r["ranks"], r["grid"]) for r in strong] == [(1, "16x16"), (2, "16x16")]
    for rows in (weak, strong):
        assert rows[0]["efficiency"] == 1.0 and rows[1]["efficiency"] > 0
        assert all(
            r["traced_steps"] and r["step_ms"] > 0 and r["peak_bytes_per_rank"] > 0 for r in rows
        )
        assert 0 <= rows[0]["exchange_share"] < rows[1]["exchange_share"] < 1
