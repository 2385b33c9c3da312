"""DDP of the FNO over a process group that handles complex tensors as NCCL does (tests/nccl_seam).

NCCL reduces and broadcasts a complex tensor through its real view and hands the view back as the
collective's result; DDP's reducer, before pytorch/pytorch#166863, copied that result into the
complex gradients with the complex parameters' strides, so plain DDP of neuralop's complex weights
averaged them wrong over NCCL (the imaginary parts zero, pytorch/pytorch#158753), and gloo in torch
2.5 refuses complex tensors outright. The course's model holds its complex weights as real
parameters (wellfno.model.spectral_weights_as_real), so that neither can happen.

These tests run the steps that train with DDP (05, 06, 12; 13 and 14 over a domain group of 2) on 2 CPU
ranks under the seam and compare every real and imaginary part of every parameter after one step
with one rank on the whole batch. On the pinned torch the reducer is already fixed; the oldest
supported torch's leg (`make test-oldest`, tests/test_oldest_torch.py) runs them where it is not:
there, with the model's complex weights back (`real_weights=False`), the same comparison fails
(test_the_seam_shows_plain_ddp_of_complex_weights_wrong_on_an_unfixed_torch).
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, STEPS, pythonpath_with
from tests.ddp_helpers import SMALL, assert_ok, launch, one_rank_reference, parameters

SEAM = Path(__file__).resolve().parent / "nccl_seam"
SEAM_LINE = "nccl-like seam: rank"
TOLERANCE = 1e-5  # the same sums in another order, float32 (tests/test_05_ddp.py)
ONE_STEP = ("--epochs", "1", "--max-steps", "1")
# step: the 2 ranks' options; the reference is one rank, --batch-size 4, one step
TWO_RANKS = {
    "05_ddp": ("--batch-size", "2"),
    "06_exact_metrics": ("--batch-size", "2"),
    "12_checkpointing": ("--batch-size", "2"),
    "13_domain_parallel": ("--batch-size", "4", "--domain-size", "2"),  # 1 data x 2 domain ranks
    "14_long_rollouts": ("--batch-size", "4", "--domain-size", "2"),  # its default rollout loss
}

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a GPU is visible: the solutions pick NCCL itself, which the seam does not stand in for "
    "(pytest -m gpu checks DDP over the real NCCL)",
)


def torch_version() -> tuple[int, int]:
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def parts(name: str, tensor: torch.Tensor) -> dict:
    """{"name real": ..., "name imag": ...} of a complex weight (held as its real view, (..., 2),
    or complex); {"name": tensor} of a real one."""
    if name.endswith(".as_real"):
        tensor = torch.view_as_complex(tensor)
    if tensor.is_complex():
        return {f"{name} real": tensor.real, f"{name} imag": tensor.imag}
    return {name: tensor}


def worst_part(got: dict, ref: dict) -> tuple[str, float]:
    """(which, relative difference) of the part (a real tensor, or the real or imaginary part of a
    complex one) farthest from `ref`: max |got - ref| / max |ref| per part."""
    assert got.keys() == ref.keys(), sorted(got.keys() ^ ref.keys())
    found = []
    for name in ref:
        if not (ref[name].is_floating_point() or ref[name].is_complex()):
            continue
        mine, theirs = parts(name, got[name]), parts(name, ref[name])
        for which, r in theirs.items():
            scale = r.double().abs().max().clamp_min(1e-30)
            found.append((which, ((mine[which].double() - r.double()).abs().max() / scale).item()))
    return max(found, key=lambda t: t[1])


@pytest.mark.slow
@pytest.mark.parametrize("step", list(TWO_RANKS))
def test_two_ranks_over_an_nccl_like_group_equal_one_rank(step, tiny_data_dir, finished_run,
                                                          tmp_path):
    """2 ranks under the seam after one step hold one rank's parameters (every real and imaginary
    part within 1e-5); and every rank ran in a nccllike group (a seam that did not load would let
    plain gloo pass for NCCL)."""
    script = REPO / STEPS[step]
    reference = one_rank_reference(finished_run, script, tiny_data_dir)
    results = launch(script, 2, "--data-dir", tiny_data_dir, "--out", tmp_path, *ONE_STEP,
                     *TWO_RANKS[step], *SMALL, env={"PYTHONPATH": pythonpath_with(SEAM)})
    assert_ok(results)
    for rank, (_, _, err) in enumerate(results):
        assert SEAM_LINE in err, f"rank {rank} did not run in the seam's group: {err[-500:]}"
    which, off = worst_part(parameters(tmp_path / "checkpoint.pt"),
                            parameters(reference / "checkpoint.pt"))
    assert off <= TOLERANCE, (
        f"{STEPS[step]}, 2 ranks over an NCCL-like group: {which} is {off:.1e} (relative) from one "
        f"rank's after one step (allowed {TOLERANCE:g}) on torch {torch.__version__}")


@pytest.mark.slow
def test_the_seam_shows_plain_ddp_of_complex_weights_wrong_on_an_unfixed_torch(tmp_path):
    """wellfno.complex_ddp_check's check under the seam: the course's real weights are averaged
    right on every torch; plain DDP of neuralop's complex weights is not on a torch whose reducer
    predates pytorch/pytorch#166863 (2.5: its real part off, its imaginary part zero), which is
    what the seam is for. (On newer torch plain DDP may be right: nothing is asserted of it
    there.)"""
    out = tmp_path / "check"
    results = launch(REPO / "wellfno" / "complex_ddp_check.py", 2, "--out", out,
                     "--backend", "gloo", "--batch-size", "2", "--grid", "8", "--width", "8",
                     "--modes", "4",
                     env={"PYTHONPATH": pythonpath_with(SEAM)}, timeout=240)
    assert_ok(results)
    assert all(SEAM_LINE in err for _, _, err in results)
    check = json.loads((out / "complex_ddp.json").read_text())
    assert check["summary"]["real_weights"]["ok"], check["summary"]
    if torch_version() < (2, 6):
        plain = check["summary"]["plain"]
        assert not plain["ok"], f"torch {torch.__version__}: plain DDP right under the seam"
        assert plain["grad"]["parameter"].endswith(".weight.tensor"), plain  # a spectral weight
        assert "NOT" in check["line"], check["line"]


def test_the_seam_hands_back_the_real_view_as_nccl_does():
    """The mechanism in one process: the seam's all-reduce and broadcast of a complex tensor run on
    its real view, in place, and return that view (float32, (..., 2), the same memory) as their
    result, as ProcessGroupNCCL does; real tensors pass as they are."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nccl_like", SEAM / "nccl_like.py")
    nccl_like = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nccl_like)
    store = torch.distributed.HashStore()
    group = nccl_like.create(store, 0, 1, datetime.timedelta(seconds=30))
    for collective in (group.allreduce, group.broadcast):
        values = torch.tensor([1 + 2j, -3 + 0.5j], dtype=torch.complex64)
        work = collective([values])
        work.wait()
        result = work.result()[0]
        assert result.dtype == torch.float32 and result.shape == (2, 2)
        assert result.data_ptr() == values.data_ptr()
        assert torch.equal(torch.view_as_complex(result), values)
        real = torch.tensor([4.0, 2.0])
        work = collective([real])
        work.wait()
        assert work.result()[0] is real or work.result()[0].data_ptr() == real.data_ptr()
