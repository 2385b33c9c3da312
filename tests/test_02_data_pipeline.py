"""Exercise 02, check your work: DataLoader workers, pinning, prefetching, the fast reader.

    .venv/bin/python -m pytest -q tests/test_02_data_pipeline.py --script fno.py   # your edited script

Without --script it checks solution 02 and every later solution (tests/conftest.py: STEPS).
Each failure is one sentence naming the task of exercises/02_data_pipeline/README.md that fixes
it (tests/checks.py).
"""
import json

import pytest

from tests.checks import require, require_run, run_main_or_fail, task
from tests.conftest import call_main, exit_of
from wellfno.cli import UserError

STEP = "02_data_pipeline"
# a small model: what these check does not depend on its size, the runs' time does
FAST = ["--epochs", "1", "--max-steps", "3", "--batch-size", "4", "--width", "8", "--modes", "4"]


@pytest.fixture(scope="module")
def fno(script_module):
    return script_module


def train(fno, data_dir, out, *options):
    shown = " ".join(map(str, options)) or "no options"
    stopped = None  # failed outside the except: no "during handling of the above exception"
    try:
        run_main_or_fail(lambda: call_main(fno, "--data-dir", data_dir, "--out", out, *FAST, *options),
                         f"a run with {shown}", f"add the loader options {task('02', 2)}")
    except UserError as err:
        stopped = f"a run with {shown} was refused: {err} {task('02', 2)}"
    except ValueError as err:  # DataLoader's own refusal, e.g. prefetch_factor without workers
        stopped = (f"a run with {shown} failed: {str(err).splitlines()[0]}; pass the worker-only options "
                   f"to DataLoader only with workers {task('02', 2)}")
    require(stopped is None, stopped)
    return json.loads((out / "metrics.json").read_text())


def losses(metrics):
    return [(h["train_loss"], h["valid_loss"]) for h in metrics["history"]] + [metrics["rollout_vrmse"]]


@pytest.fixture(scope="module")
def reference(fno, tiny_data_dir, tmp_path_factory):
    """The plain run: no workers, WellDataset, 2 input steps."""
    return train(fno, tiny_data_dir, tmp_path_factory.mktemp("reference"), "--n-steps-input", 2)


def test_workers_see_the_same_batches_as_the_main_process(fno, reference, tiny_data_dir, tmp_path):
    """Seeded shuffle and workers: 2 workers, pinned, prefetching 4 train exactly like 0 workers."""
    tuned = train(fno, tiny_data_dir, tmp_path / "w2", "--n-steps-input", 2, "--num-workers", 2,
                  "--prefetch-factor", 4, "--persistent-workers", "--pin-memory")
    require(tuned["config"].get("num_workers") == 2,
            f"metrics.json's config says num_workers={tuned['config'].get('num_workers')} after --num-workers 2 "
            f"(allowed: 2) {task('02', 2)}")
    # bitwise: same samples, same order, same arithmetic
    differ = sum(a != b for a, b in zip(losses(tuned), losses(reference)))
    require(differ == 0, f"with 2 workers {differ} of {len(losses(reference))} losses differ from 0 workers' "
            f"(allowed: none): seed the loaders through a seeded torch.Generator {task('02', 4)}")


def test_two_epochs_with_persistent_workers(fno, tiny_data_dir, tmp_path):
    metrics = train(fno, tiny_data_dir, tmp_path / "run", "--num-workers", 1, "--persistent-workers",
                    "--epochs", 2, "--max-steps", 0)
    epochs = [h["epoch"] for h in metrics["history"]]
    samples = [h["samples"] for h in metrics["history"]]
    require(epochs == [1, 2] and samples[0] == samples[-1] > 0,
            f"two epochs with persistent workers gave epochs {epochs} with {samples} samples (allowed: [1, 2], "
            f"the same whole epoch twice) {task('02', 2)}")


def test_worker_options_without_workers_run(fno, tiny_data_dir, tmp_path):
    # DataLoader raises ValueError for prefetch_factor / persistent_workers with num_workers=0.
    metrics = train(fno, tiny_data_dir, tmp_path / "run", "--num-workers", 0, "--prefetch-factor", 4,
                    "--persistent-workers")
    samples = metrics["history"][0]["samples"]
    require(samples == 12, f"--max-steps 3 at batch 4 trained {samples} samples (allowed: 12) {task('02', 2)}")


@pytest.mark.slow
def test_pin_memory_on_cpu_is_a_one_line_note(fno, tiny_data_dir, tmp_path):
    # `python SCRIPT ...` in this process, warnings shown as the interpreter shows them (exit_of)
    result = exit_of(fno, "--data-dir", tiny_data_dir, "--out", tmp_path / "run", *FAST, "--device", "cpu",
                     "--pin-memory")
    require_run(result, "--pin-memory on the CPU", f"it must run there too {task('02', 2)}")
    said = (result.stdout + result.stderr).replace(str(tmp_path), "")
    notes = [line for line in said.splitlines() if "pin" in line.lower()]
    # yours, not torch's "'pin_memory' argument is set as true" warning as well
    require(len(notes) == 1, f"--pin-memory on the CPU printed {len(notes)} lines about pinning (allowed: 1, "
            f"yours, not torch's warning): do not pass pin_memory=True on without a GPU {task('02', 2)}")


@pytest.mark.parametrize("options", [["--num-workers", -1], ["--prefetch-factor", 0, "--num-workers", 1]])
def test_impossible_values_are_user_errors(fno, tmp_path, options):
    shown = " ".join(map(str, options))
    refuse = f"refuse {options[0]} {options[1]} with a UserError naming it {task('02', 2)}"
    try:
        run_main_or_fail(lambda: call_main(fno, "--data-dir", tmp_path, "--out", tmp_path / "out", *options),
                         shown, f"add the option {task('02', 2)}")
    except UserError as err:  # the refusal of this value, not a later one (a missing dataset)
        stopped = None if options[0] in str(err) else f"{shown} was not refused: the run stopped later ({err}); {refuse}"
    except ValueError as err:  # DataLoader's own refusal, with a traceback for the participant
        stopped = f"{shown} reached DataLoader, which raised ValueError: {str(err).splitlines()[0]}; {refuse}"
    else:
        stopped = f"{shown} was accepted: {refuse}"
    require(stopped is None, stopped)  # outside the except: no chained exception in the report
    require(not (tmp_path / "out").exists(), f"{shown} left an output folder: refuse before writing "
            f"{task('02', 2)}")


@pytest.mark.slow
def test_negative_workers_is_one_line_error(script_module, tmp_path):
    # `python SCRIPT ...` as a participant runs it, in this process (conftest.py's exit_of)
    result = exit_of(script_module, "--data-dir", tmp_path, "--num-workers", "-2")
    lines = result.stderr.strip().splitlines()
    require(result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ")
            and "--num-workers" in lines[0],
            f"--num-workers -2 exited {result.returncode} with {len(lines)} lines on stderr (allowed: exit 2, one "
            f"`error:` line naming --num-workers): raise a UserError {task('02', 2)}")


def test_fast_reader_trains_exactly_like_welldataset(fno, reference, tiny_data_dir, tmp_path):
    if "--fast-reader" not in exit_of(fno, "--help").stdout:  # solution 03 on: wellfno.options
        pytest.skip("optional task: --fast-reader not in this script")
    fast = train(fno, tiny_data_dir, tmp_path / "fast", "--n-steps-input", 2, "--fast-reader", "--num-workers", 2)
    differ = sum(a != b for a, b in zip(losses(fast), losses(reference)))
    require(differ == 0, f"with --fast-reader {differ} of {len(losses(reference))} losses differ from "
            f"WellDataset's (allowed: none): build FastWellDataset with WellDataset's arguments {task('02', 'O1')}")


def record_copies(monkeypatch):
    """Storages of the tensors DataLoaders yield, and the tensors handed to `.to(..., non_blocking=True)`."""
    import torch
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    yielded, copied, kept = set(), [], []
    next_batch, to = _BaseDataLoaderIter.__next__, torch.Tensor.to

    def recording_next(self):
        batch = next_batch(self)
        for value in (batch.values() if isinstance(batch, dict) else batch):
            if isinstance(value, torch.Tensor):
                yielded.add(value.untyped_storage().data_ptr())
                kept.append(value)  # alive, so that no later tensor can reuse its address
        return batch

    def recording_to(self, *args, **kwargs):
        if kwargs.get("non_blocking"):
            copied.append(dict(ptr=self.untyped_storage().data_ptr(), contiguous=self.is_contiguous(),
                               pinned=self.is_pinned() if self.device.type == "cpu" and torch.cuda.is_available() else None))
        return to(self, *args, **kwargs)

    monkeypatch.setattr(_BaseDataLoaderIter, "__next__", recording_next)
    monkeypatch.setattr(torch.Tensor, "to", recording_to)
    return yielded, copied


def test_the_non_blocking_copy_gets_the_loaders_own_batch(fno, tiny_data_dir, tmp_path, monkeypatch):
    """The contract behind pinning: `.to(device, non_blocking=True)` is handed the memory the DataLoader
    delivered (page-locked with pin_memory on a GPU), as one contiguous block. Reshaping on the host before
    the copy hands it a new pageable tensor (2 input steps) or a strided view that torch first packs into a
    pageable temporary (1 input step): either way the "asynchronous" copy is synchronous. The layout change
    belongs after the copy (on the device) or inside the dataset/collate (in the workers, before pinning)."""
    yielded, copied = record_copies(monkeypatch)
    train(fno, tiny_data_dir, tmp_path / "run", "--pin-memory", "--n-steps-input", 2)
    train(fno, tiny_data_dir, tmp_path / "run1", "--pin-memory", "--n-steps-input", 1)
    require(copied, f"no copy to the device was non-blocking: copy the batches with "
            f".to(device, non_blocking=True) {task('02', 3)}")
    strays = [c for c in copied if c["ptr"] not in yielded or not c["contiguous"]]
    require(not strays, f"{len(strays)} of {len(copied)} non-blocking copies start from a tensor made after the "
            f"DataLoader or from a strided view of it (allowed: none): copy the loader's own batch, change the "
            f"layout on the device {task('02', 3)}")


@pytest.mark.gpu
@pytest.mark.parametrize("workers", [0, 2])
def test_on_a_gpu_the_non_blocking_copies_start_from_pinned_memory(fno, tiny_data_dir, tmp_path, monkeypatch, workers):
    _, copied = record_copies(monkeypatch)
    train(fno, tiny_data_dir, tmp_path / "run", "--device", "cuda", "--pin-memory", "--num-workers", workers)
    unpinned = [c for c in copied if not (c["pinned"] and c["contiguous"])]
    require(copied and not unpinned, f"{len(unpinned)} of {len(copied)} non-blocking copies on the GPU start "
            f"from pageable or strided memory (allowed: none) {task('02', 3)}")
