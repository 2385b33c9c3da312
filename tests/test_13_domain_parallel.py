"""Exercise 13 check-your-work: one sample split across a domain group of ranks, exact against one.

    .venv/bin/python -m pytest -q tests/test_13_domain_parallel.py --script YOUR_SCRIPT

The ranks run on the CPU with gloo, started as torchrun starts them (tests/test_05_ddp.py's
`launch`). The reference is the same script on one rank. Data: the tiny embedded dataset
(16 x 16 cells; 3 domain ranks hold 6, 5 and 5 rows) with --n-steps-input 10: 8 training and 4
validation samples. The participant's own spectral convolution (task 2: a DomainSpectralConv
in the script) is compared with neuralop's SpectralConv by wellfno.domain_check, on one rank here
and on 3 gloo ranks (tests/test_domain_check.py: it catches a convolution without the odd-grid
shift). wellfno.domain's own equivalence (forward and gradients, 2-D and 3-D) is in
tests/test_domain.py, the slab reads in tests/test_slabs.py.
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

from tests.checks import require, task
from tests.conftest import PYTHON, REPO, exit_of
from tests.ddp_helpers import in_process, one_rank_reference
from tests.test_05_ddp import (
    SMALL,
    assert_ok,
    error_lines,
    free_port,
    launch,
    max_relative_difference,
    parameters,
)
from tests.domain_conv_checks import (check_on_one_rank, check_on_ranks, convolution_under_test,
                                      file_of)
from wellfno import domain_check

STEP = "13_domain_parallel"  # the cross-step matrix (tests/conftest.py) supplies `script`
ONE_STEP = ("--epochs", "1", "--max-steps", "1", *SMALL)


@pytest.fixture(scope="module")
def one_rank(script, tiny_data_dir, finished_run):
    """One rank, --batch-size 4, one step: the reference checkpoint and metrics."""
    return one_rank_reference(finished_run, script, tiny_data_dir)


def run(script_module, script, world, *args):
    """[(rc, stdout, stderr)] by rank: `world` ranks (tests/ddp_helpers.py's launch); world 0, one
    plain run, in this process (conftest.py's exit_of)."""
    if world == 0:
        return in_process(exit_of(script_module, *args))
    return launch(script, world, *args)


def adam_moments(checkpoint) -> dict:
    """Adam's first moments in a checkpoint (after one step: (1 - beta1) x the gradient), by
    parameter: the gradients' scale, which the parameters after a first step hide (Adam's step
    is lr x m / sqrt(v), the same for the gradient times any factor)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["optimizer"]["state"]
    return {str(index): moments["exp_avg"] for index, moments in state.items()
            if "exp_avg" in moments}


def metrics(out):
    return json.loads((out / "metrics.json").read_text())


def relative(values, reference):
    got, ref = torch.tensor(values, dtype=torch.float64), torch.tensor(
        reference, dtype=torch.float64
    )
    return ((got - ref).abs() / ref.abs()).max().item()


def require_close(what: str, worst: float, fix: str, allowed: float = 1e-5) -> None:
    """`what` is `worst` (relative) from one rank's: one sentence with the allowed figure."""
    require(worst <= allowed, f"{what} is {worst:.1e} (relative) from one rank's (allowed: "
            f"{allowed:.0e}): {fix}")


# ------------------------------------------------------------------ task 2: your convolution
def test_your_spectral_convolution_equals_spectral_conv_on_one_rank(request, script, script_module):
    """The participant writes DomainSpectralConv(conv, slab) (not wellfno.domain's) with the
    `transform` FNOBlocks calls; on one rank (2-D and 3-D, odd axes) its output, the input's and
    the parameters' gradients are SpectralConv's (wellfno.domain_check)."""
    check_on_one_rank(convolution_under_test(request, script, script_module))


@pytest.mark.slow
def test_your_spectral_convolution_equals_spectral_conv_on_2_and_3_ranks(
    request, script, script_module, tmp_path
):
    """wellfno.domain_check on 3 gloo ranks: every case of 1, 2 and 3 ranks, 2-D and 3-D, odd
    axes; the forward slabs and every gradient are SpectralConv's on the whole grid (1e-5)."""
    # the contract, before any rank starts; wellfno.domain's where the script is a later step's
    # that trains with it (convolution_under_test)
    convolution = convolution_under_test(request, script, script_module)
    mine = convolution is not domain_check.REFERENCE
    check_on_ranks(("--script", file_of(convolution)) if mine else ("--reference",),
                   tmp_path / "report.json")


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
    assert_ok(results, f"add --domain-size {task('13', 1)}")
    require("1 data x 2 domain ranks" in results[0][1],
            f"no '1 data x 2 domain ranks: ...' line from rank 0 {task('13', 1)}")
    worst = max_relative_difference(
        parameters(tmp_path / "checkpoint.pt"), parameters(one_rank / "checkpoint.pt")
    )
    # the gradients first: Adam's first step (lr x m / sqrt(v)) is nearly the same for a gradient
    # twice or half the sample's, its first moment (1 - beta1) x the gradient is not
    require_close("a domain group of 2's first Adam moment (the gradient) after one step",
                  max_relative_difference(adam_moments(tmp_path / "checkpoint.pt"),
                                          adam_moments(one_rank / "checkpoint.pt")),
                  "sum the loss shares over the group (each rank's share of the sample's mean, "
                  f"not its slab's) and register the DDP hook (DDP alone averages) {task('13', 4)}")
    require_close("a domain group of 2's model after one step", worst,
                  f"sum the loss shares over the group and register the DDP hook {task('13', 4)}")
    got, ref = metrics(tmp_path), metrics(one_rank)
    require_close(
        "a domain group of 2's train and valid loss",
        relative([got["train_loss"], got["valid_loss"]], [ref["train_loss"], ref["valid_loss"]]),
        f"the loss is the mean over the whole sample {task('13', 4)}",
    )
    require_close(
        "a domain group of 2's rollout VRMSE",
        relative(
            got["rollout_vrmse"] + got["persistence_vrmse"],
            ref["rollout_vrmse"] + ref["persistence_vrmse"],
        ),
        f"VRMSE over the whole frame, float64 sums over the group {task('13', 5)}",
    )
    samples = (got["history"][0].get("samples"), ref["history"][0].get("samples"))
    require(samples[0] == samples[1] == 4, f"a domain group of 2 counted {samples[0]} samples in "
            f"one step of batch 4 (allowed: 4, once per group, as one rank) {task('13', 1)}")
    shape = (got.get("global_batch_size"), got.get("world_size"))
    require(shape == (4, 2), f"metrics.json has global_batch_size {shape[0]} and world_size "
            f"{shape[1]} (allowed: 4 and 2) {task('13', 1)}")


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
    assert_ok(results, f"2 data x 2 domain ranks must train {task('13', 1)}")
    require("global batch 4 = 2 domain group(s) x --batch-size 2" in results[0][1],
            f"no 'global batch 4 = 2 domain group(s) x --batch-size 2' line {task('13', 1)}")
    worst = max_relative_difference(
        parameters(tmp_path / "checkpoint.pt"), parameters(one_rank / "checkpoint.pt")
    )
    require_close("2 data x 2 domain ranks' first Adam moment (the gradient) after one step",
                  max_relative_difference(adam_moments(tmp_path / "checkpoint.pt"),
                                          adam_moments(one_rank / "checkpoint.pt")),
                  f"the DDP hook divides the sum by the number of data groups {task('13', 4)}")
    require_close("2 data x 2 domain ranks' model after one step", worst,
                  f"the DDP hook divides the sum by the number of data groups {task('13', 4)}")
    require_close(
        "2 data x 2 domain ranks' train loss",
        relative([metrics(tmp_path)["train_loss"]], [metrics(one_rank)["train_loss"]]),
        f"the loss is the mean over the whole sample {task('13', 4)}",
    )


@pytest.mark.slow
def test_the_checkpoint_evaluates_alike_on_any_layout(
    script, script_module, tiny_data_dir, one_rank, tmp_path
):
    """One rank's checkpoint, --eval-only on 1 x 3 ranks (16 rows: 6 + 5 + 5) and on 2 x 2: the
    valid loss and the rollout VRMSE of one rank, to 1e-5 (float64 sums over the slabs)."""
    reference = None
    for world, size in ((0, 1), (3, 3), (4, 2)):
        out = tmp_path / f"w{world}"
        out.mkdir()
        shutil.copy(one_rank / "checkpoint.pt", out / "checkpoint.pt")
        assert_ok(
            run(
                script_module,
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
            ),
            f"--eval-only on {max(world, 1) // size} x {size} ranks must evaluate {task('13', 5)}",
        )
        evaluation = json.loads((out / "eval.json").read_text())
        values = [
            evaluation["valid_loss"],
            *evaluation["rollout_vrmse"],
            *evaluation["persistence_vrmse"],
        ]
        require(
            (out / "checkpoint.pt").read_bytes() == (one_rank / "checkpoint.pt").read_bytes(),
            f"--eval-only changed checkpoint.pt: it must only read it {task('13', 5)}",
        )
        if reference is None:
            reference = values
        else:
            require(len(values) == len(reference), f"--eval-only on {world // size} x {size} "
                    f"ranks wrote {len(values)} numbers, one rank {len(reference)} {task('13', 5)}")
            require_close(f"--eval-only on {world // size} x {size} ranks' valid loss and VRMSE",
                          relative(values, reference),
                          f"float64 sums over the slabs, the mean over the group {task('13', 5)}")


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
        require(any("Training on" in line for line in stdout0),
                f"a domain group of 2 never started training {task('13', 1)}")
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
    require(procs[0].returncode != 0 and elapsed < 60, f"rank 1 of a domain group was killed; "
            f"rank 0 exited with {procs[0].returncode} after {elapsed:.0f} s (allowed: non-zero, "
            f"60 s): keep train inside the Watchdog {task('07', 2)}")
    lines = error_lines(stderr0)
    require(len(lines) == 1 and "rank 1" in lines[0], f"rank 0 printed {len(lines)} error lines "
            f"(allowed: 1, naming rank 1) {task('07', 2)}")


@pytest.mark.slow
def test_a_3d_standin_of_mhd_256_trains_on_2_and_3_domain_ranks_as_on_one(
    script, script_module, tmp_path
):
    """MHD_256's layout (7 channels, 3-D) at 1/32 scale (8^3 cells: 3 ranks hold 3 + 3 + 2 rows),
    one step: 2 ranks with --checkpoint-blocks and 3 ranks give one rank's parameters and VRMSE."""
    from coursetools.standin import write_standin

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
        assert_ok(run(script_module, script, world, *common, "--out", out, *size, *extra),
                  f"a 3-D grid on {max(world, 1)} domain rank(s) must train {task('13', 3)}")
        runs[world] = out
    for world in (2, 3):
        worst = max_relative_difference(
            parameters(runs[world] / "checkpoint.pt"), parameters(runs[0] / "checkpoint.pt")
        )
        require_close(f"the model after a 3-D step on {world} domain ranks", worst,
                      f"the spectral convolution on 3-D slabs, an odd axis too {task('13', 2)}")
        got, ref = metrics(runs[world]), metrics(runs[0])
        require_close(f"a 3-D rollout VRMSE on {world} domain ranks",
                      relative(got["rollout_vrmse"], ref["rollout_vrmse"]),
                      f"VRMSE over the whole frame {task('13', 5)}")


# --------------------------------------------------------------------------- bad input
def said(lines) -> str:
    """', the first: <its start>' for an error message, or nothing."""
    return f", the first: '{lines[0][:100]}'" if lines else ""


def one_line_error(results, out, message, fix):
    """Every rank exits 2 with at most one `error:` line saying `message`, no traceback, and
    nothing written; else one sentence ending in `fix` (its task)."""
    codes = [rc for rc, _, _ in results]
    lines = [line for _, _, err in results for line in error_lines(err)]
    tracebacks = sum("Traceback" in err for _, _, err in results)
    most = max(len(error_lines(err)) for _, _, err in results)
    require(all(rc == 2 for rc in codes) and lines and all(message in line for line in lines)
            and not tracebacks and most <= 1,
            f"the ranks exited with {codes}, {len(lines)} error line(s), {tracebacks} "
            f"traceback(s){said(lines)} (allowed: 2 each, at most one line each, '{message}'): "
            f"{fix}")
    require(not out.exists() or not any(out.iterdir()),
            f"the refused run left files in its output folder: refuse before writing; {fix}")


def test_a_world_the_grid_does_not_divide_is_one_line(
    script, script_module, tiny_data_dir, tmp_path
):
    out = tmp_path / "out"
    results = run(
        script_module, script, 0, "--data-dir", tiny_data_dir, "--out", out, "--domain-size", "2",
        *ONE_STEP,
    )
    one_line_error(results, out, "do not divide into domain groups of 2",
                   f"refuse it with wellfno.domain's ProcessGrid {task('13', 1)}")


def test_compile_with_a_domain_group_is_one_line(script, script_module, tiny_data_dir, tmp_path):
    """--compile --domain-size 2 is refused before any rank is needed. Tried (torch 2.13, CPU, gloo,
    2 ranks, 16 x 16 grid): torch.compile spends minutes compiling, then Inductor stops with a
    traceback in the backward of the all-to-all exchange ("self.stride(-1) must be 1 to view
    ComplexFloat as Float", at DomainSpectralConv's split of the kept modes). Without the refusal
    this single process would fail on the layout instead ("do not divide into domain groups")."""
    out = tmp_path / "out"
    results = run(script_module, script, 0, "--data-dir", tiny_data_dir, "--out", out,
                  "--domain-size", "2", "--compile", *ONE_STEP)
    one_line_error(results, out, "--compile and --domain-size > 1 do not go together",
                   f"refuse the pair before the ranks {task('13', 1)}")


def test_more_domain_ranks_than_rows_is_one_line(script, script_module, tiny_data_dir, tmp_path):
    """16 rows, 17 domain ranks: refused before any rank is needed (the grid is checked first)."""
    out = tmp_path / "out"
    results = run(
        script_module, script, 0, "--data-dir", tiny_data_dir, "--out", out, "--domain-size", "17",
        *ONE_STEP,
    )
    one_line_error(
        results, out, "--domain-size 17 is more than the 16 cells of the first spatial axis",
        f"check the grid before the ranks {task('13', 1)}",
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
        *ONE_STEP,
        "--modes",
        "1",
    )
    one_line_error(results, out, "fewer than the 2 domain ranks",
                   f"share the modes out only when each rank gets some {task('13', 2)}")


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
        "--resume",
        *ONE_STEP,
        "--width",
        "16",
    )
    codes = [rc for rc, _, _ in results]
    lines = [line for _, _, err in results for line in error_lines(err)]
    require(all(rc == 2 for rc in codes) and lines
            and all("trained with other settings" in line for line in lines),
            f"--resume with another --width: the ranks exited with {codes} and {len(lines)} error "
            "line(s) (allowed: 2 each, '... was trained with other settings ...', as fno.py says "
            f"it): keep the serial model's state_dict {task('13', 3)}")
    require(sorted(p.name for p in out.iterdir()) == ["checkpoint.pt"]
            and (out / "checkpoint.pt").read_bytes() == before,
            f"the refused --resume changed the output folder {task('13', 5)}")


# --------------------------------------------------------------------------- Slurm
# This step's Slurm job is tested in tests/test_slurm.py with the other job scripts
# (DESIGN.md), where the jobs run side by side:
# test_slurm_13_domain_group_of_two_tasks_then_one_task_evaluates.

# --------------------------------------------------------------------------- benchmark
@pytest.mark.slow
def test_domain_benchmark_writes_numbers_that_hang_together(tmp_path):
    """benchmark.py, weak and strong on 1 and 2 CPU ranks of a tiny model: a results file whose rows
    say what ran; the exchange has a share only with 2 ranks' all_to_all (1 rank: only the
    gradients' all_reduce on a world of one). It says it measures the reference, prints each
    mode's efficiency and speed-up, and no kineto 'USDT: ... profiler_start' lines (issue 35)."""
    out = tmp_path / "bench"
    result = subprocess.run(
        [
            PYTHON,
            str(REPO / "solutions/13_domain_parallel/benchmark.py"),
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
    output = result.stdout + result.stderr
    assert "USDT" not in output, output[-2000:]
    assert result.stdout.startswith("Measuring the reference: wellfno.domain's DomainSpectralConv")
    written = json.loads((out / "domain_scaling.json").read_text())
    assert written["command"].startswith(
        "python solutions/13_domain_parallel/benchmark.py --ranks 1 2"
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
        # 2 ranks: the speed-up is twice the efficiency (strong: t1/t2 = 2 x t1/(2 t2); weak: the
        # scaled speed-up 2 t1/t2); both rows printed as the table's
        assert rows[0]["speed_up"] == 1.0 and rows[1]["speed_up"] == pytest.approx(
            2 * rows[1]["efficiency"])
        assert (f"{2:>7}{rows[1]['grid']:>12}{rows[1]['step_ms']:>10.1f}"
                f"{rows[1]['efficiency']:>12.2f}{rows[1]['speed_up']:>10.2f}") in result.stdout


def test_domain_benchmark_refuses_a_script_without_its_own_convolution(tmp_path):
    """--script names a script without its own DomainSpectralConv: one line before any rank runs."""
    script = tmp_path / "fno.py"
    script.write_text("from wellfno.domain import DomainSpectralConv\n")
    result = subprocess.run(
        [PYTHON, str(REPO / "solutions/13_domain_parallel/benchmark.py"), "--script", str(script),
         "--out", str(tmp_path / "bench")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and "write your own" in result.stderr, result
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "bench").exists()
