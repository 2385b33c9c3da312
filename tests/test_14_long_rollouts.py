"""Exercise 14 check-your-work: training on the model's own rollouts, against a hand-unrolled one.

    .venv/bin/python -m pytest -q tests/test_14_long_rollouts.py --script YOUR_SCRIPT

The first part checks the rollout loss the script uses (its own RolloutLoss, next_input and
training_flops_per_sample, else wellfno.unrolled's where it imports that module; a script with
neither has done nothing of exercise 14 yet, and its checks fail naming the task) on a small model
in float64: the loss and its gradients against a rollout written out by hand in the
(B, T, *spatial, F) layout wellfno.rollout.rollout uses; the pushforward trick; the input noise;
the FLOPs it costs. The second runs the script on the tiny generated data (12 frames per
trajectory): its default (input noise 0.1 on one step) writes the whole trajectory's VRMSE;
--rollout-steps 1 without noise is solution 13's training bit for bit; the FLOPs of K steps are
a little more than K steps'; a run resumed after an epoch draws the noise and pushforward's N a
straight run draws; bad values are one line. 2 ranks x b == 1 rank x 2b with the rollout loss:
tests/test_nccl_seam.py (under an NCCL-like process group) and below. The checks of the
repository's own code (wellfno.memory's estimate of K steps, compare.py, the measurement that
chose the default) run without --script only.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.checks import require, require_refused, require_run, task
from tests.conftest import PYTHON, REPO, exit_of
from tests.ddp_helpers import in_process
from tests.test_05_ddp import SMALL, SMALL_MODEL, assert_ok, launch, max_relative_difference, parameters
from wellfno import flops, memory, unrolled
from wellfno.data import model_inputs
from wellfno.model import NextFrameFNO

STEP = "14_long_rollouts"  # the cross-step matrix (tests/conftest.py) supplies `script`
STEPS_14 = "solutions/14_long_rollouts/fno.py"
QUICK = ("--epochs", "1", "--max-steps", "2", "--batch-size", "4", "--bind", "none", "--log-every",
         "1", *SMALL_MODEL)
NO_NOISE = ("--input-noise", "0")
CHANNELS, FRAMES, CONSTANTS, GRID = 3, 2, 1, (10, 8)


# What each of the script's parts is for, said when the script has none (from_script).
PARTS = {"RolloutLoss": "the loss over the model's own K-step rollout",
         "next_input": "the next input of a rollout, the prediction fed back",
         "training_flops_per_sample": "the FLOPs of the whole K-step rollout"}


def from_script(script_module, name: str, number):
    """`name` as the script uses it: its own (defined or imported by name), else that of the
    wellfno.unrolled it imports (`from wellfno import unrolled`, as solution 14 does). A script
    with neither (step 13's) fails here with the task that adds it."""
    found = getattr(script_module, name, None)
    if found is None:
        found = getattr(getattr(script_module, "unrolled", None), name, None)
    require(found is not None, f"{Path(script_module.__file__).name} has no {name} of its own and "
            f"imports no wellfno.unrolled: add {PARTS[name]} {task('14', number)}")
    return found


@pytest.fixture
def repository_only(request):
    """A check of the repository's own code, not of a participant's script: skipped with
    --script."""
    if request.config.getoption("--script"):
        pytest.skip("checks the repository's own code (wellfno, compare.py), not your script")


def small_model():
    torch.manual_seed(0)
    stats = {k: torch.rand(CHANNELS) + 0.5 for k in ("mean", "std", "mean_delta", "std_delta")}
    return NextFrameFNO(CHANNELS, FRAMES, stats, constant_channels=CONSTANTS, resolution=GRID,
                        modes=4, width=8, layers=2).double()


def sample(batch=2, steps=3):
    """Input frames (B, T, *spatial, F), constant fields (B, *spatial, K), targets (B, K, *spatial, F)."""
    torch.manual_seed(1)
    return (torch.randn(batch, FRAMES, *GRID, CHANNELS, dtype=torch.float64),
            torch.randn(batch, *GRID, CONSTANTS, dtype=torch.float64),
            torch.randn(batch, steps, *GRID, CHANNELS, dtype=torch.float64))


def by_hand(model, frames, constants, targets, detach=False):
    """The rollout written out: the window of frames shifts by one predicted frame per step, as
    wellfno.rollout.rollout does, with gradients; one loss per step."""
    losses, window = [], frames
    for k in range(targets.shape[1]):
        pred = model(model_inputs(window, constants))  # (B, F, *spatial)
        losses.append(model.loss(pred, targets[:, k].movedim(-1, 1)))
        nxt = (pred.detach() if detach else pred).movedim(1, -1).unsqueeze(1)
        window = torch.cat([window[:, 1:], nxt], dim=1)
    return losses


def gradients(model, loss):
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def close(a, b, tol=1e-12):
    return all(torch.allclose(a[k], b[k], rtol=tol, atol=tol) for k in a)


def test_the_rollout_loss_is_a_hand_unrolled_rollouts(script_module):
    """K = 3 steps, 2 input frames and a constant field: the loss is the mean of the 3 one-step
    losses along the model's own rollout, and its gradients flow through every step."""
    RolloutLoss = from_script(script_module, "RolloutLoss", 2)
    model = small_model()
    frames, constants, targets = sample()
    rollout_loss = RolloutLoss(model.loss, model.last_frame.stop, steps=3)
    loss = rollout_loss(model, model_inputs(frames, constants), targets.movedim(-1, 2))
    reference = sum(by_hand(model, frames, constants, targets)) / 3
    require(torch.allclose(loss, reference, rtol=1e-12),
            f"the rollout loss is {loss.item():.6g}, the hand-unrolled one {reference.item():.6g}: "
            f"feed each prediction back as the newest frame, keep the constant fields last "
            f"{task('14', 2)}")
    got, want = gradients(model, rollout_loss(model, model_inputs(frames, constants),
                                              targets.movedim(-1, 2))), gradients(model, reference)
    require(close(got, want), f"the rollout loss's gradients are not the hand-unrolled ones': "
            f"do not detach the predictions you feed back (that is --pushforward) {task('14', 2)}")
    detached = sum(by_hand(model, frames, constants, targets, detach=True)) / 3
    assert not close(got, gradients(model, detached))  # the check can tell the two apart


def test_one_step_is_todays_loss(script_module):
    RolloutLoss = from_script(script_module, "RolloutLoss", 2)
    model = small_model()
    frames, constants, targets = sample(steps=1)
    x, y = model_inputs(frames, constants), targets.movedim(-1, 2)
    require(torch.equal(RolloutLoss(model.loss, model.last_frame.stop, 1)(model, x, y),
                        model.loss(model(x), y[:, 0])),
            f"with K = 1 the rollout loss is not today's one-step loss {task('14', 2)}")


def test_next_input_drops_the_oldest_frame_and_keeps_the_constants(script_module):
    if getattr(script_module, "RolloutLoss", None) is not None and \
            getattr(script_module, "next_input", None) is None:
        pytest.skip("your own RolloutLoss feeds predictions back without a next_input: the "
                    "rollout loss's check covers it")
    next_input = from_script(script_module, "next_input", 2)
    frames, constants, _ = sample()
    pred = torch.randn(2, CHANNELS, *GRID, dtype=torch.float64)
    shifted = torch.cat([frames[:, 1:], pred.movedim(1, -1).unsqueeze(1)], dim=1)
    require(torch.equal(next_input(model_inputs(frames, constants), pred, FRAMES * CHANNELS),
                        model_inputs(shifted, constants)),
            f"next_input must drop the oldest frame, append the prediction after the newest and "
            f"keep the constant fields last {task('14', 2)}")


def test_pushforward_trains_one_step_from_its_own_rollout(script_module):
    """Brandstetter et al. 2022: N steps without gradients, then one trained step on target N;
    N drawn from 0..K-1 by a generator of its own: the same draws whatever the batch's size."""
    RolloutLoss = from_script(script_module, "RolloutLoss", 4)
    model = small_model()
    frames, constants, targets = sample(steps=4)
    x, y = model_inputs(frames, constants), targets.movedim(-1, 2)
    rollout_loss = RolloutLoss(model.loss, model.last_frame.stop, 4, pushforward=True, seed=5)
    for n in range(4):
        loss = rollout_loss(model, x, y, rolled_out=n)
        reference = by_hand(model, frames, constants, targets, detach=True)[n]
        require(torch.allclose(loss, reference, rtol=1e-12) and close(
            gradients(model, rollout_loss(model, x, y, rolled_out=n)), gradients(model, reference)),
            f"pushforward after N = {n} steps is not one trained step from the N-step rollout "
            f"made without gradients, scored on target N {task('14', 4)}")
    one, two = (RolloutLoss(model.loss, model.last_frame.stop, 4, pushforward=True, seed=5)
                for _ in range(2))
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(len(args[0])))
    for _ in range(20):  # batch 2 and batch 1: the same N, step after step
        calls.clear()
        one(model, x, y)
        steps_two = len(calls)
        calls.clear()
        two(model, x[:1], y[:1])
        require(len(calls) == steps_two, f"pushforward's N differs between a batch of 2 and one "
                f"of 1: draw N from a generator of its own, seeded alike on every rank "
                f"{task('14', 4)}")
    seen = set()
    for _ in range(40):  # every N from 0 to K - 1 comes up
        calls.clear()
        one(model, x, y)
        seen.add(len(calls) - 1)
    require(seen == {0, 1, 2, 3}, f"pushforward with K = 4 rolled out N in {sorted(seen)} over "
            f"40 batches (allowed: each of 0 to 3) {task('14', 4)}")


def test_input_noise_moves_the_frames_not_the_constant_fields(script_module):
    RolloutLoss = from_script(script_module, "RolloutLoss", 4)
    model = small_model()
    frames, constants, _ = sample(batch=64)
    x = model_inputs(frames, constants)
    noisy = RolloutLoss(model.loss, model.last_frame.stop, 2, noise=0.1).add_noise(x)
    moved = noisy[:, :FRAMES * CHANNELS] - x[:, :FRAMES * CHANNELS]
    require(torch.equal(noisy[:, FRAMES * CHANNELS:], x[:, FRAMES * CHANNELS:]),
            f"the input noise moved the constant fields: noise the frames only {task('14', 4)}")
    require(abs(moved.std().item() - 0.1) < 0.005 and abs(moved.mean().item()) < 0.005,
            f"--input-noise 0.1 moved the frames by a mean {moved.mean().item():.3g} and standard "
            f"deviation {moved.std().item():.3g} (allowed: 0 and 0.1, within 0.005) "
            f"{task('14', 4)}")
    require(RolloutLoss(model.loss, model.last_frame.stop, 2).add_noise(x) is x,
            f"--input-noise 0 must leave the input as it is {task('14', 4)}")


def test_the_noise_of_a_sample_is_the_same_for_any_number_of_ranks(script_module):
    """Each rank draws the global batch's noise over whole frames and keeps its samples (every
    data_size-th, as DistributedSampler deals them) and its slab's rows: the noise one rank puts
    on a sample is the noise any layout of ranks puts on it."""
    from wellfno.domain import Slab

    RolloutLoss = from_script(script_module, "RolloutLoss", 4)
    model = small_model()
    frames, constants, _ = sample(batch=4)
    x = model_inputs(frames, constants)

    def noise(batch, **where):
        loss = RolloutLoss(model.loss, model.last_frame.stop, 2, noise=0.1, seed=3, **where)
        return loss.add_noise(batch) - batch

    one, fix = noise(x), ("draw the global batch's noise over whole frames, then keep your samples "
                          f"and rows {task('14', 4)}")
    for index in range(2):  # 2 data groups of 2 samples: samples index, index + 2
        require(torch.equal(noise(x[index::2], share=(index, 2)), one[index::2]),
                f"data group {index} of 2 puts other noise on its samples than one rank: {fix}")
    slab = Slab(start=4, stop=10, n=GRID[0], index=1, size=2)  # rows 4-9 of 10
    require(torch.equal(noise(x[:, :, slab.rows], slab=slab), one[:, :, slab.rows]),
            f"a slab of rows 4-9 gets other noise than those rows of the whole frame: {fix}")
    both = noise(x[1::2][:, :, slab.rows], share=(1, 2), slab=slab)
    require(torch.equal(both, one[1::2][:, :, slab.rows]),
            f"a data group's slab gets other noise than one rank's: {fix}")
    # the contrast: each data group's samples get their own noise, not the first group's again
    assert not torch.equal(noise(x, share=(0, 1)), noise(x[:2], share=(0, 2)).repeat(2, 1, 1, 1))


def test_each_epoch_draws_from_its_own_seed(script_module):
    """A run resumed after epoch 1 (a fresh RolloutLoss, set_epoch(2)) draws the noise and the
    pushforward N a straight run draws in epoch 2, whatever epoch 1 drew."""
    RolloutLoss = from_script(script_module, "RolloutLoss", 4)
    model = small_model()
    frames, constants, targets = sample(steps=4)
    x = model_inputs(frames, constants)

    def make():
        return RolloutLoss(model.loss, model.last_frame.stop, 4, pushforward=True, noise=0.1, seed=3)
    straight, resumed = make(), make()
    straight.set_epoch(1)
    for _ in range(3):  # epoch 1's batches
        straight.add_noise(x), torch.randint(4, (), generator=straight.generator)
    straight.set_epoch(2)
    resumed.set_epoch(2)
    fix = f"start both generators each epoch from (seed, epoch) in set_epoch {task('14', 4)}"
    require(torch.equal(straight.add_noise(x), resumed.add_noise(x)),
            f"after set_epoch(2) a fresh loss draws other noise than one that drew epoch 1: {fix}")
    require(torch.equal(torch.randint(4, (9,), generator=straight.generator),
                        torch.randint(4, (9,), generator=resumed.generator)),
            f"after set_epoch(2) a fresh loss draws another pushforward N: {fix}")
    fresh = make()
    fresh.set_epoch(1)
    assert not torch.equal(fresh.add_noise(x), resumed.add_noise(x))


def test_the_flops_of_k_steps(script_module):
    """Unrolled: one step's forward and backward, then K - 1 more whose backward also runs back
    into their input (a prediction: the chain through time); pushforward: one step's plus, on
    average, (K - 1) / 2 forwards without gradients."""
    RolloutLoss = from_script(script_module, "RolloutLoss", 2)
    training_flops_per_sample = from_script(script_module, "training_flops_per_sample", 3)
    model = small_model().float()
    x = torch.randn(2, model.in_channels, *GRID)
    y = torch.randn(2, 4, CHANNELS, *GRID)
    one = flops.training_flops_per_sample(model, x, y[:, 0], model.loss)["per_sample"]
    with torch.no_grad():
        forward = flops.count_flops(lambda: model(x))["total"] / 2
    unrolled = training_flops_per_sample(model, x, y, RolloutLoss(model.loss, model.last_frame.stop, 4))
    chained = flops.training_flops_per_sample(model, x.clone().requires_grad_(), y[:, 0],
                                              model.loss)["per_sample"]
    assert chained > one
    require(unrolled["per_sample"] == pytest.approx(one + 3 * chained, rel=1e-9),
            f"a 4-step rollout counts {unrolled['per_sample'] / one:.2f} x one step's FLOPs "
            f"(allowed: {(one + 3 * chained) / one:.2f}: one step, then 3 whose backward runs on "
            f"into their input) {task('14', 3)}")
    pushed = training_flops_per_sample(model, x, y, RolloutLoss(model.loss, model.last_frame.stop, 4,
                                                                pushforward=True))
    require(pushed["per_sample"] == pytest.approx(one + 1.5 * forward, rel=1e-9),
            f"pushforward with K = 4 counts {pushed['per_sample'] / one:.2f} x one step's FLOPs "
            f"(allowed: {(one + 1.5 * forward) / one:.2f}: one step, and on average 1.5 forwards "
            f"without gradients) {task('14', 3)}")
    require(all(p.grad is None for p in model.parameters()),
            f"counting the FLOPs left gradients on the model {task('14', 3)}")


def test_a_rollout_that_does_not_fit_says_how_many_steps_would(repository_only):
    model = NextFrameFNO(7, 1, {k: torch.ones(7) for k in ("mean", "std", "mean_delta", "std_delta")},
                         n_spatial_dims=3, resolution=(64, 64, 64))
    n = sum(p.numel() for p in model.parameters())

    def need(k):
        return memory.step_bytes(n, 4, (64, 64, 64), model.in_channels, 7, model.width, model.layers,
                                 unrolled_steps=k)
    available = (need(3) + need(4)) // 2  # 3 steps fit, 4 do not
    with pytest.raises(memory.UserError) as refused:
        memory.check_step_fits(model, 4, torch.device("cpu"), available=available, rollout_steps=4)
    said = str(refused.value)
    assert "3 rollout steps would fit" in said and "--rollout-steps to 3" in said
    assert "--pushforward" in said and "\n" not in said
    assert "4 rollout steps kept" in memory.check_step_fits(model, 4, torch.device("cpu"),
                                                             available=need(4), rollout_steps=4)
    # pushforward keeps one step's activations
    line = memory.check_step_fits(model, 4, torch.device("cpu"), available=need(1),
                                  rollout_steps=4, pushforward=True)
    assert "rollout steps kept" not in line
    assert need(4) - need(1) == 3 * (need(2) - need(1))  # activations times K, parameters once


# ---------------------------------------------------------------------------- the script
def run(script, *args, timeout=300):
    import subprocess

    return subprocess.run([PYTHON, str(script), *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def default_run(script, tiny_data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("default")
    return out, run(script, "--data-dir", tiny_data_dir, "--out", out, *QUICK)


def test_the_default_is_the_rules_pick(default_run):
    """The measured choice (compare.py's rule on results/14_long_rollouts.json): no remedy passed,
    so the default trains as solution 13 does, one step without noise; metrics.json's config says
    so, and the remedies stay behind their flags."""
    out, result = default_run
    require_run(result, "the script", f"it must train with its defaults {task('14', 5)}")
    config = json.loads((out / "metrics.json").read_text())["config"]
    said = (config.get("input_noise"), config.get("rollout_steps"), config.get("pushforward"))
    require(said == (0.0, 1, False), f"metrics.json's config has input_noise, rollout_steps and "
            f"pushforward {said}: the default is the rule's pick, which on today's measurement is "
            f"no remedy (0, 1 and false; the remedies behind their flags) {task('14', 5)}")


@pytest.fixture(scope="module")
def three_step_run(script, tiny_data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("three_steps")
    return out, run(script, "--data-dir", tiny_data_dir, "--out", out, *QUICK, "--max-steps",
                    "1", "--rollout-steps", "3")


def test_the_memory_line_counts_the_rollout_steps(three_step_run):
    _, result = three_step_run
    require_run(result, "--rollout-steps 3", f"train on a 3-step rollout {task('14', 2)}")
    require("3 rollout steps kept" in result.stdout,
            f"the memory line does not count 3 rollout steps (wellfno.memory.check_step_fits' "
            f"rollout_steps) {task('14', 3)}")


def test_the_flops_are_the_whole_rollouts(default_run, three_step_run):
    """metrics.json's FLOPs per sample with --rollout-steps 3 are a little more than 3 times one
    step's (the default's: its noise costs no FLOPs): steps 2 and 3 also back-propagate into
    their input, a prediction."""
    (one_out, one), (three_out, three) = default_run, three_step_run
    require_run(one, "the script", f"it must train with its defaults {task('14', 4)}")
    require_run(three, "--rollout-steps 3", f"train on a 3-step rollout {task('14', 2)}")
    counted = [json.loads((out / "metrics.json").read_text()).get("flops_per_sample")
               for out in (one_out, three_out)]
    require(None not in counted, f"metrics.json has no flops_per_sample {task('14', 3)}")
    ratio = counted[1] / counted[0]
    require(3 < ratio < 3 * 1.5, f"--rollout-steps 3 counts {ratio:.2f} x one step's FLOPs per "
            f"sample (allowed: a little more than 3, below 4.5): count the whole rollout's, "
            f"wellfno.unrolled.training_flops_per_sample {task('14', 3)}")


def test_a_resumed_run_draws_what_a_straight_run_draws(script_module, tiny_data_dir, tmp_path):
    """Two epochs with noise and pushforward, and the same stopped after epoch 1 and resumed: the
    same weights (the generators start each epoch from (seed, epoch), as the sampler's shuffle
    does; else the resumed epoch 2 draws epoch 1's noise and N again). In this process."""
    common = ("--data-dir", tiny_data_dir, *SMALL, "--batch-size", "4", "--input-noise", "0.1",
              "--rollout-steps", "2", "--pushforward")
    straight, split = tmp_path / "straight", tmp_path / "split"
    fix = f"noise and pushforward must train {task('14', 4)}"
    assert_ok(in_process(exit_of(script_module, *common, "--out", straight, "--epochs", "2")), fix)
    assert_ok(in_process(exit_of(script_module, *common, "--out", split, "--epochs", "1")), fix)
    assert_ok(in_process(exit_of(script_module, *common, "--out", split, "--epochs", "2",
                                 "--resume")), fix)
    worst = max_relative_difference(parameters(split / "checkpoint.pt"),
                                    parameters(straight / "checkpoint.pt"))
    require(worst <= 1e-6, f"resumed after epoch 1, the run ends {worst:.1e} (relative) from a "
            f"straight one (allowed: 1e-6): start the noise's and pushforward's generators each "
            f"epoch from (seed, epoch), as the sampler's set_epoch does {task('14', 4)}")


def test_metrics_hold_the_whole_trajectorys_vrmse(default_run):
    out, result = default_run
    require_run(result, "the script", f"it must train with its defaults {task('14', 4)}")
    metrics = json.loads((out / "metrics.json").read_text())
    for key, curve in (("whole_trajectory_vrmse", "rollout_vrmse"),
                       ("persistence_whole_trajectory_vrmse", "persistence_vrmse")):
        require(key in metrics, f"metrics.json has no {key} {task('14', 1)}")
        direct = sum(metrics[curve]) / len(metrics[curve])
        require(abs(metrics[key] - direct) <= 1e-12 * direct,
                f"metrics.json's {key} is {metrics[key]:.6g}, the mean of its {curve} "
                f"{direct:.6g} {task('14', 1)}")
    assert len(metrics["rollout_vrmse"]) == 11  # the whole trajectory: 12 frames, 1 input
    assert f"whole trajectory (11 steps): mean VRMSE {metrics['whole_trajectory_vrmse']:.4f}" in result.stdout


@pytest.mark.slow
def test_one_step_is_solution_13_bit_for_bit(script, tiny_data_dir, tmp_path):
    """One step without noise trains what solution 13 trains: the same weights after 2 steps."""
    runs = {}
    for name, path, extra in (("yours", script, ("--rollout-steps", "1", *NO_NOISE)),
                              ("13", REPO / "solutions/13_domain_parallel/fno.py", ())):
        result = run(path, "--data-dir", tiny_data_dir, "--out", tmp_path / name, *QUICK, *extra)
        require_run(result, f"{name} with {' '.join(extra) or 'its defaults'}",
                    f"one step without noise must train {task('14', 2)}")
        runs[name] = parameters(tmp_path / name / "checkpoint.pt")
    differ = [k for k in runs["13"] if not torch.equal(runs["yours"][k], runs["13"][k])]
    require(not differ, f"with --rollout-steps 1 --input-noise 0 the weights after 2 steps differ "
            f"from solution "
            f"13's in {len(differ)} tensors (first: {differ[:1]}): one step must be today's "
            f"training {task('14', 2)}")


@pytest.mark.parametrize("args, naming, number", [
    (("--rollout-steps", "0"), ("--rollout-steps",), 2),
    (("--rollout-steps", "12"), ("--rollout-steps 12", "at most --rollout-steps 11"), 2),
    (("--input-noise", "-0.1"), ("--input-noise",), 4),
    (("--input-noise", "nan"), ("--input-noise",), 4),
    (("--pushforward", "--rollout-steps", "1"), ("--pushforward",), 4),
])
def test_bad_values_are_one_line_and_write_nothing(script, tiny_data_dir, tmp_path, args, naming,
                                                   number):
    out = tmp_path / "out"
    result = run(script, "--data-dir", tiny_data_dir, "--out", out, *QUICK, *args)
    require_refused(result, " ".join(args), f"check it before training {task('14', number)}",
                    naming=naming, out=out)


@pytest.mark.parametrize("noise", ["-0.1", "nan", "inf"])
def test_input_noise_must_be_a_finite_number(repository_only, noise):
    """wellfno.unrolled.check_arguments: inf is no standard deviation either, and the line says
    so (it said "must be 0 or more" of inf)."""
    from argparse import Namespace

    args = Namespace(rollout_steps=1, input_noise=float(noise), pushforward=False, n_steps_input=1)
    with pytest.raises(unrolled.UserError, match=f"--input-noise {float(noise)} must be a finite "
                       "number, 0 or more"):
        unrolled.check_arguments(args, dataset_dir=None)  # refused before the dataset is read


# What 2 ranks x 2 != 1 rank x 4 means in each variant, and its task: the default's noise drawn
# per rank, the unrolled loss under DDP, pushforward's N drawn per rank.
VARIANTS = {
    "noise": (("--input-noise", "0.1"), "with --input-noise 0.1 (one step): a sample must get the "
              "same noise whatever the number of ranks: draw the global batch's, whole frames, "
              "and keep your samples and rows", 4),
    "unrolled": (("--rollout-steps", "2", *NO_NOISE), "with --rollout-steps 2 and no noise: K "
                 "forwards, then one backward, under DDP", 2),
    "pushforward": (("--rollout-steps", "2", "--pushforward", *NO_NOISE), "with --pushforward: "
                    "every rank must roll out the same N (a generator of its own, seeded alike)",
                    4),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", VARIANTS)
def test_two_ranks_of_b_train_as_one_rank_of_2b(script, tiny_data_dir, tmp_path, name):
    """The rollout loss under DDP (K forwards, one backward; pushforward's N the same on every
    rank; each sample's noise the same on any number of ranks, the default): 2 ranks x 2 equal 1
    rank x 4 after 2 steps (SMALL: --n-steps-input 10 of 12 frames: K at most 2)."""
    variant, what, number = VARIANTS[name]
    common = ("--epochs", "1", "--max-steps", "2", *SMALL, *variant)
    one = launch(script, 0, "--data-dir", tiny_data_dir, "--out", tmp_path / "one", "--batch-size",
                 "4", *common)
    two = launch(script, 2, "--data-dir", tiny_data_dir, "--out", tmp_path / "two", "--batch-size",
                 "2", *common)
    assert_ok(one, f"one rank {' '.join(variant)} must train {task('14', number)}")
    assert_ok(two, f"two ranks {' '.join(variant)} must train {task('14', number)}")
    worst = max_relative_difference(parameters(tmp_path / "two" / "checkpoint.pt"),
                                    parameters(tmp_path / "one" / "checkpoint.pt"))
    require(worst <= 1e-5, f"2 ranks x 2 end {worst:.1e} (relative) from 1 rank x 4 (allowed: "
            f"1e-05) {what} {task('14', number)}")
    steps = json.loads((tmp_path / "two" / "metrics.json").read_text())["config"].get(
        "rollout_steps")
    expected = 2 if "--rollout-steps" in variant else 1
    require(steps == expected, f"metrics.json's config has rollout_steps {steps} (allowed: "
            f"{expected}, the run's --rollout-steps) {task('14', 2)}")


# ------------------------------------------------------------------ the measurement (compare.py)
# compare.py's whole run on tiny data: tests/test_14_compare.py::test_compare_end_to_end_on_tiny_data
def test_compare_knows_the_solutions_default(repository_only):
    """compare.py's DEFAULT is the variant that trains as solution 14 does without flags (its flags
    set what the parser's defaults are), and every other variant's flags are options solution 14
    has."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare14", REPO / "solutions/14_long_rollouts/compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    spec = importlib.util.spec_from_file_location("solution14", REPO / STEPS_14)
    solution = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(solution)
    script, flags = compare.VARIANTS[compare.DEFAULT]
    assert script == compare.SOLUTION
    assert vars(solution.parse_args([*flags, "--out", "x"])) == vars(solution.parse_args(["--out", "x"]))
    for name, (path, flags) in compare.VARIANTS.items():
        if path == compare.SOLUTION:
            solution.parse_args([*flags, "--out", "x"])  # argparse exits on an unknown option
