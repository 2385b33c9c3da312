"""wellfno.complex_ddp_check: the course's real weights and plain DDP of complex weights, on the
CPU over gloo.

Over gloo on the pinned torch both average right; what goes wrong over NCCL/RCCL on an older
torch (pytorch/pytorch#158753: the imaginary parts lost) is reproduced on the CPU by
tests/test_nccl_seam.py (a process group that hands back the real view, as ProcessGroupNCCL does)
on the oldest supported torch. These tests check the check itself: both variants equal one rank
with the whole batch here, its report says so, and the comparison would see a lost imaginary part.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO, run_script
from tests.test_05_ddp import assert_ok, launch
from wellfno import complex_ddp_check as ddp
from wellfno.cli import torch_version

TOLERANCE = 1e-5  # as tests/test_05_ddp.py: the same sums in another order, float32


def parts(t: torch.Tensor) -> dict:
    return {"real": t.real, "imag": t.imag} if t.is_complex() else {"real": t}


def assert_close_parts(got: dict, ref: dict, what: str):
    """Every tensor of `got`, real and imaginary parts apart, within TOLERANCE of `ref` (relative to
    the largest entry of that part of `ref`)."""
    assert got.keys() == ref.keys()
    for name in ref:
        for part, r in parts(ref[name]).items():
            g = parts(got[name])[part]
            scale = r.double().abs().max().clamp_min(1e-30)
            off = ((g.double() - r.double()).abs().max() / scale).item()
            assert off <= TOLERANCE, f"{what}: {name} {part} part off by {off:.2e} relative"


@pytest.fixture(scope="module")
def gloo_check(tmp_path_factory):
    """2 ranks over gloo: plain DDP and DDP with the hook, 2 ranks x 2 samples; rank 0's reference:
    1 rank x 4 samples. One launch, two processes."""
    out = tmp_path_factory.mktemp("complex_ddp")
    assert_ok(
        launch(
            REPO / "wellfno" / "complex_ddp_check.py",
            2,
            "--out",
            out,
            "--backend",
            "gloo",
            "--batch-size",
            "2",
            timeout=240,
        )
    )
    return out


@pytest.mark.slow
@pytest.mark.parametrize("variant", ddp.VARIANTS)
def test_two_ranks_equal_one_rank_with_the_whole_batch(gloo_check, variant):
    """Gradients and parameters after one step of the real FNO: 2 ranks x b == 1 rank x 2b, real and
    imaginary parts of every parameter, on both ranks."""
    reference = torch.load(gloo_check / "reference.pt", weights_only=True)
    complex_grads = [g for g in reference["grad"].values() if g.is_complex()]
    assert complex_grads, "the FNO has complex (spectral) weights"
    assert all(g.imag.abs().max() > 0 for g in complex_grads), (
        "a zero imaginary gradient: nothing to check"
    )
    for rank in (0, 1):
        held = torch.load(gloo_check / f"rank{rank}.pt", weights_only=True)[variant]
        if "error" in held and variant == "plain" and torch_version(torch.__version__) < (2, 6):
            pytest.skip(f"plain DDP of complex weights stops over torch 2.5's gloo: {held}")
        for what in ("grad", "param"):
            assert_close_parts(held[what], reference[what], f"rank {rank}, {variant} DDP, {what}")


@pytest.mark.slow
def test_real_weights_equal_plain_ddp_and_the_report_says_so(gloo_check):
    """Over gloo the course's real weights are right, and so is plain DDP of complex weights where
    gloo has a complex type (torch 2.13); torch 2.5's gloo has none: plain DDP stops, and the
    report says so."""
    import json

    plain, real = (torch.load(gloo_check / "rank0.pt", weights_only=True)[v] for v in ddp.VARIANTS)
    assert any(g.is_complex() for g in real["grad"].values()), "compared under neuralop's names"
    result = json.loads((gloo_check / ddp.RESULT).read_text())
    summary = result["summary"]
    assert summary["real_weights"]["ok"], summary
    assert result["backend"] == "gloo" and result["world_size"] == 2
    assert result["complex_parameters"] >= 1
    assert result["line"].startswith("complex gradients under DDP: the course's real weights")
    if "error" in plain and torch_version(torch.__version__) < (2, 6):
        assert "Invalid scalar type" in plain["error"] and not summary["plain"]["ok"], plain
        assert "would NOT be (stops: Invalid scalar type)" in result["line"], result["line"]
        return
    assert_close_parts(real["grad"], plain["grad"], "real weights vs plain DDP")
    assert summary["plain"]["ok"], summary
    assert "plain DDP of complex weights would be right here too" in result["line"]


def test_a_lost_imaginary_part_is_seen_and_the_line_says_which():
    """The comparison on the real FNO's gradients: zero the imaginary parts (#158753's symptom)
    and the check must fail that variant; the line says the course's weights are fine while plain
    DDP would not be, or that the course's are not (then it is a problem to report)."""
    model = ddp.example_model(torch.device("cpu"), grid=8, width=4, modes=4, real_weights=False)
    x, y = ddp.example_batch(2, 8, torch.device("cpu"))
    reference = ddp.train_step(model, model.loss, x, y)
    lost = {
        n: (torch.complex(g.real, torch.zeros_like(g.real)) if g.is_complex() else g)
        for n, g in reference["grad"].items()
    }
    same = {w: ddp.relative_differences(reference[w], reference[w]) for w in ("grad", "param")}
    broken = dict(same, grad=ddp.relative_differences(lost, reference["grad"]))
    check = dict(
        ran=True,
        library="NCCL 2.21.5",
        world_size=2,
        batch=2,
        tolerance=ddp.TOLERANCE,
        summary=ddp.summarize({"plain": broken, "real_weights": same}),
    )
    assert not check["summary"]["plain"]["ok"] and check["summary"]["real_weights"]["ok"]
    assert check["summary"]["plain"]["grad"]["part"] == "imag"
    assert check["summary"]["plain"]["grad"]["relative_difference"] == 1.0
    line = ddp.verdict_line(check)
    assert "are averaged right" in line and "would NOT be" in line and "imag part" in line, line
    assert "\n" not in line
    check["summary"] = ddp.summarize({"plain": broken, "real_weights": broken})
    assert "the course's real weights are NOT averaged right" in ddp.verdict_line(check)
    check["summary"] = ddp.summarize({"plain": {"error": "Invalid scalar type"}, "real_weights": same})
    assert "would NOT be (stops: Invalid scalar type)" in ddp.verdict_line(check)
    assert (
        ddp.verdict_line({"ran": False, "why": "needs 2 GPUs, torch sees 1"})
        == "complex gradients under DDP: not checked (needs 2 GPUs, torch sees 1)"
    )


def test_the_real_weights_compute_what_the_complex_ones_do():
    """spectral_weights_as_real changes how the weights are held, not what the model computes: the
    same output and gradients, bit for bit, as neuralop's complex parameters (float64 aside: the
    same operations on the same numbers)."""
    grads = {}
    for real in (False, True):
        model = ddp.example_model(torch.device("cpu"), grid=8, width=4, modes=4, real_weights=real)
        x, y = ddp.example_batch(2, 8, torch.device("cpu"))
        grads[real] = ddp.train_step(model, model.loss, x, y)
        assert any(p.is_complex() for p in model.parameters()) is not real
    for what in ("grad", "param"):
        assert grads[True][what].keys() == grads[False][what].keys()
        for name, value in grads[False][what].items():
            assert torch.equal(grads[True][what][name], value), (what, name)


def test_without_a_launcher_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run(
        [sys.executable, "-m", "wellfno.complex_ddp_check", "--out", str(tmp_path / "o")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.strip().startswith(
        "error: start the ranks with a launcher"
    )
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
    r = run_script("-m", "wellfno.complex_ddp_check", "--out", tmp_path / "o", "--batch-size", "0")
    assert r.returncode == 2 and "must be positive" in r.stderr
