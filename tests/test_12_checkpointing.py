"""Exercise 12 check-your-work: activation checkpointing changes memory, not the numbers.

    .venv/bin/python -m pytest -q tests/test_12_checkpointing.py --script YOUR_SCRIPT

Every check but one runs YOUR script: two runs on the tiny generated data, with and without
--checkpoint-blocks, in this process, with every module's forward counted (a global forward
pre-hook) and the model each run built kept. From those: the FNO blocks run forward once more
per training step with the flag and the lifting and projection layers do not; the two models
give bitwise the same gradients, and the checkpointed one keeps under 60 % of the elements
autograd saves; both runs train the same parameters and losses, and the memory line and
metrics.json say so. The 3-D gradient check is of the repository's wellfno.checkpointing (the
copy later steps use), skipped with --script. Peak memory with and without is measured by
solutions/13_domain_parallel/benchmark.py and checked against wellfno.memory's estimate in
tests/test_memory.py (not a timed test here).
"""

import contextlib
import copy
import json
import warnings

import pytest
import torch

from tests.checks import require, task
from wellfno.checkpointing import checkpoint_blocks
from wellfno.model import NextFrameFNO

STEP = "12_checkpointing"  # the cross-step matrix (tests/conftest.py) supplies `script`
RUN = [
    "--epochs",
    "1",
    "--batch-size",
    "4",
    "--bind",
    "none",
    "--max-steps",
    "2",
    "--log-every",
    "1",
]
# the parts of neuralop's FNO (NextFrameFNO.fno) whose forwards are counted: only the blocks may
# be recomputed
PARTS = {"fno_blocks": "the FNO blocks", "lifting": "the lifting layer",
         "projection": "the projection layer"}
FIX = "checkpoint model.fno.fno_blocks's original forward"


def small_model(grid=(12, 10)):
    torch.manual_seed(0)
    stats = {k: torch.rand(3) + 0.5 for k in ("mean", "std", "mean_delta", "std_delta")}
    return NextFrameFNO(
        3, 2, stats, n_spatial_dims=len(grid), resolution=grid, modes=6, width=8, layers=3
    )


@contextlib.contextmanager
def forwards_counted():
    """Yields (models, counts): every NextFrameFNO built meanwhile, and for each part of its FNO
    (PARTS) and each leaf module in it, [forwards recording autograd, all forwards], counted on
    entry (a recomputation that stops early, torch's default, still enters the block's first
    modules)."""
    models, where, counts = [], {}, {}
    init = NextFrameFNO.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        models.append(self)

    def count(module, args):
        if any(module is model for model in models):  # the parts as the model holds them now
            for part in PARTS:
                for name, leaf in getattr(module.fno, part).named_modules():
                    if not list(leaf.children()):
                        where[leaf] = (part, name)
        if module in where:
            seen = counts.setdefault(where[module], [0, 0])
            seen[0] += torch.is_grad_enabled()
            seen[1] += 1

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(NextFrameFNO, "__init__", recording_init)
        hook = torch.nn.modules.module.register_module_forward_pre_hook(count)
        try:
            yield models, counts
        finally:
            hook.remove()


RUNS = {}  # (script, data folder, options) -> this module's record of its run


def train(finished_run, script, data_dir, *extra):
    """(stdout, metrics.json, output folder, the model it built, forward counts) of one in-process
    run (conftest.py's finished_run); a run that stops with an exception is one sentence."""
    key = (str(script), str(data_dir), *extra)
    if key not in RUNS:
        stopped = None
        # the run's warnings held back: a failure's sentence is the last thing its report shows
        # (pytest's warnings summary would follow it), so a stopped run's sentence says them
        with forwards_counted() as (models, counts), warnings.catch_warnings(record=True) as caught:
            try:
                out, stdout = finished_run(script, data_dir, *RUN, *extra,
                                           fix=f"add --checkpoint-blocks {task('12', 1)}")
            except RecursionError:  # not its thousand frames
                stopped = ("RecursionError: the checkpointed forward calls itself; save "
                           "blocks.forward before replacing it and checkpoint that saved bound "
                           "method")
            except Exception as err:  # noqa: BLE001 - a participant's script: one sentence
                said = str(err).strip().splitlines()
                stopped = f"{type(err).__name__}: {said[0][:200] if said else ''}; " + (
                    "call checkpoint(block_forward, x, index, output_shape, use_reentrant=False), "
                    "block_forward the bound method saved before replacing it" if extra else
                    "without --checkpoint-blocks the script must train as before the exercise")
        if stopped and any("use_reentrant" in str(w.message) for w in caught):
            stopped += "; torch warned that use_reentrant was left out"
        for w in [] if stopped else caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        RUNS[key] = (f"{script.name} {' '.join(extra)} stopped with {stopped} {task('12', 1)}"
                     if stopped else (stdout, json.loads((out / "metrics.json").read_text()),
                                      out, models[0] if models else None, counts))
    record = RUNS[key]
    require(not isinstance(record, str), record)
    return record


def both_runs(script, data_dir, finished_run):
    """The script's plain run and its --checkpoint-blocks run."""
    return [train(finished_run, script, data_dir, *flag) for flag in ([], ["--checkpoint-blocks"])]


@pytest.mark.slow
def test_the_blocks_and_only_the_blocks_run_again(script, tiny_data_dir, finished_run):
    """With --checkpoint-blocks every module of the FNO blocks runs once more for each forward
    autograd recorded (the recomputation in the backward); the lifting and projection layers run
    as often as without the flag."""
    (*_, plain, without), (*_, checkpointed, with_flag) = both_runs(script, tiny_data_dir,
                                                                    finished_run)
    require(plain is not None and checkpointed is not None, "the script built no NextFrameFNO: "
            f"build the model with NextFrameFNO.for_dataset {task('12', 1)}")
    again, recorded = {}, {}
    for part in PARTS:
        leaves = {key for key in without.keys() | with_flag.keys() if key[0] == part}
        again[part] = sum(with_flag.get(key, [0, 0])[1] - without.get(key, [0, 0])[1]
                          for key in leaves)
        recorded[part] = sum(without.get(key, [0, 0])[0] for key in leaves)
    for part in ("lifting", "projection"):
        require(again[part] == 0, f"with --checkpoint-blocks {PARTS[part]} ran {again[part]} more "
                f"forwards than without (allowed: none; only the FNO blocks are recomputed): "
                f"{FIX}, not model.fno.{part}'s {task('12', 1)}")
    require(recorded["fno_blocks"] > 0, "the FNO blocks ran no forward that autograd recorded: "
            f"train the model built by NextFrameFNO {task('12', 1)}")
    require(again["fno_blocks"] == recorded["fno_blocks"], "with --checkpoint-blocks the FNO "
            f"blocks' modules ran {again['fno_blocks']} more forwards than without (allowed: "
            f"{recorded['fno_blocks']}, once more in the backward for each forward autograd "
            f"recorded): {FIX} in place of it {task('12', 1)}")


def grads_and_kept(model, x):
    """Every parameter's gradient of model.loss on x (a fixed target) and the number of elements
    autograd kept between the forward and the backward (saved-tensor hooks)."""
    for p in model.parameters():
        p.grad = None
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel()) or t,
                                                  lambda t: t):
        out = model(x)
        loss = model.loss(out, torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}, sum(kept)


@pytest.mark.slow
def test_your_checkpointed_model_has_the_same_gradients_and_keeps_less(script, tiny_data_dir,
                                                                      finished_run):
    """The models the two runs built, on one batch: bitwise the same gradients, and the
    checkpointed one keeps under 60 % of the elements autograd saves."""
    (*_, plain, _), (*_, checkpointed, _) = both_runs(script, tiny_data_dir, finished_run)
    require(plain is not None and checkpointed is not None, "the script built no NextFrameFNO: "
            f"build the model with NextFrameFNO.for_dataset {task('12', 1)}")
    twin = copy.deepcopy(plain)  # the plain model with the checkpointed one's parameters
    twin.load_state_dict(checkpointed.state_dict())
    twin.train(), checkpointed.train()
    torch.manual_seed(0)
    x = torch.randn(2, plain.in_channels, 16, 16)  # the tiny data's grid
    (grads, kept), (grads_ckpt, kept_ckpt) = (grads_and_kept(m, x) for m in (twin, checkpointed))
    differ = sum(n not in grads_ckpt or not torch.equal(grads_ckpt[n], g)
                 for n, g in grads.items())
    require(differ == 0, f"{differ} of {len(grads)} gradients of the checkpointed model differ "
            f"from the plain model's (allowed: none, bitwise): {FIX} {task('12', 1)}")
    require(kept_ckpt < 0.6 * kept, f"with --checkpoint-blocks autograd keeps "
            f"{100 * kept_ckpt / kept:.0f} % of the elements it keeps without (allowed: under "
            f"60 %; the FNO blocks keep only their inputs): {FIX} {task('12', 1)}")


@pytest.mark.slow
def test_checkpointed_run_trains_the_same_model(script, tiny_data_dir, finished_run):
    (_, plain, plain_out, *_), (stdout, checkpointed, ckpt_out, *_) = both_runs(
        script, tiny_data_dir, finished_run)
    require("blocks checkpointed" in stdout, "the memory line of a --checkpoint-blocks run "
            "does not say 'blocks checkpointed': pass checkpointed=args.checkpoint_blocks to "
            f"memory.check_step_fits {task('12', 1)}")
    losses = [run["history"][0].get("loss_log") for run in (plain, checkpointed)]
    require(losses[0] == losses[1], "--checkpoint-blocks changed the per-step losses (allowed: "
            f"bitwise the same): checkpoint the blocks' original forward {task('12', 1)}")
    a = torch.load(plain_out / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(ckpt_out / "checkpoint.pt", weights_only=True)["model"]
    differ = sum(k not in b or not torch.equal(a[k], b[k]) for k in a) + len(b.keys() - a.keys())
    require(differ == 0, f"{differ} of {len(a)} parameter tensors differ with --checkpoint-blocks "
            f"(allowed: none; the same state_dict keys) {task('12', 1)}")
    flag = checkpointed["config"].get("checkpoint_blocks")
    require(flag is True, f"metrics.json's config has checkpoint_blocks {flag} (allowed: true) "
            f"{task('12', 1)}")


@pytest.mark.parametrize("grid", [(12, 10), (6, 8, 4)])
def test_package_checkpointing_gradients_equal_plain_ones(grid):
    """wellfno.checkpointing, the copy later steps and the benchmark use, in 2-D and 3-D (the
    repository's code: skipped with --script, tests/conftest.py)."""
    plain = small_model(grid)
    checkpointed = copy.deepcopy(plain)
    checkpoint_blocks(checkpointed.fno)
    assert plain.state_dict().keys() == checkpointed.state_dict().keys()
    x = torch.randn(2, plain.in_channels, *grid)
    (grads, kept), (grads_ckpt, kept_ckpt) = (grads_and_kept(m, x) for m in (plain, checkpointed))
    for name, g in grads.items():
        assert torch.equal(grads_ckpt[name], g), name  # the recomputation repeats the same ops
    assert kept_ckpt < 0.6 * kept, (kept_ckpt, kept)
