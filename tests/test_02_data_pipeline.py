"""Exercise 02, check your work: DataLoader workers, pinning, prefetching, the fast reader.

    .venv/bin/python -m pytest -q tests/test_02_data_pipeline.py --script fno.py   # your edited script

Without --script it checks solution 02 and every later solution (tests/conftest.py: STEPS).
"""
import json

import pytest

from tests.conftest import call_main, run_script
from wellfno.cli import UserError

STEP = "02_data_pipeline"
FAST = ["--epochs", "1", "--max-steps", "3", "--batch-size", "4"]


@pytest.fixture(scope="module")
def fno(script_module):
    return script_module


def train(fno, data_dir, out, *options):
    call_main(fno, "--data-dir", data_dir, "--out", out, *FAST, *options)
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
    assert tuned["config"]["num_workers"] == 2
    assert losses(tuned) == losses(reference)  # bitwise: same samples, same order, same arithmetic


def test_two_epochs_with_persistent_workers(fno, tiny_data_dir, tmp_path):
    metrics = train(fno, tiny_data_dir, tmp_path / "run", "--num-workers", 1, "--persistent-workers",
                    "--epochs", 2, "--max-steps", 0)
    assert [h["epoch"] for h in metrics["history"]] == [1, 2]
    assert metrics["history"][0]["samples"] == metrics["history"][1]["samples"] > 0  # whole epochs, twice


def test_worker_options_without_workers_run(fno, tiny_data_dir, tmp_path):
    # DataLoader raises ValueError for prefetch_factor / persistent_workers with num_workers=0.
    metrics = train(fno, tiny_data_dir, tmp_path / "run", "--num-workers", 0, "--prefetch-factor", 4,
                    "--persistent-workers")
    assert metrics["history"][0]["samples"] == 12


@pytest.mark.slow  # a whole run in a child process
def test_pin_memory_on_cpu_is_a_one_line_note(script, tiny_data_dir, tmp_path):
    result = run_script(script, "--data-dir", tiny_data_dir, "--out", tmp_path / "run", *FAST, "--device", "cpu",
                        "--pin-memory", env={"PYTHONWARNINGS": "default"})
    assert result.returncode == 0, result.stderr
    said = (result.stdout + result.stderr).replace(str(tmp_path), "")
    notes = [line for line in said.splitlines() if "pin" in line.lower()]
    assert len(notes) == 1, notes  # yours, not torch's "'pin_memory' argument is set as true" warning as well


@pytest.mark.parametrize("options", [["--num-workers", -1], ["--prefetch-factor", 0, "--num-workers", 1]])
def test_impossible_values_are_user_errors(fno, tmp_path, options):
    with pytest.raises(UserError):
        call_main(fno, "--data-dir", tmp_path, "--out", tmp_path / "out", *options)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a child process, as a participant runs it
def test_negative_workers_is_one_line_error(script, tmp_path):
    result = run_script(script, "--data-dir", tmp_path, "--num-workers", "-2")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--num-workers" in lines[0]


def test_fast_reader_trains_exactly_like_welldataset(script, fno, reference, tiny_data_dir, tmp_path):
    if "--fast-reader" not in script.read_text():
        pytest.skip("optional task: --fast-reader not in this script")
    fast = train(fno, tiny_data_dir, tmp_path / "fast", "--n-steps-input", 2, "--fast-reader", "--num-workers", 2)
    assert losses(fast) == losses(reference)


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
    assert copied, "copy the batches with .to(device, non_blocking=True)"
    strays = [c for c in copied if c["ptr"] not in yielded or not c["contiguous"]]
    assert not strays, (f"{len(strays)} of {len(copied)} non-blocking copies start from a tensor made after the "
                        f"DataLoader or from a strided view of it")


@pytest.mark.gpu
@pytest.mark.parametrize("workers", [0, 2])
def test_on_a_gpu_the_non_blocking_copies_start_from_pinned_memory(fno, tiny_data_dir, tmp_path, monkeypatch, workers):
    _, copied = record_copies(monkeypatch)
    train(fno, tiny_data_dir, tmp_path / "run", "--device", "cuda", "--pin-memory", "--num-workers", workers)
    assert copied and all(c["pinned"] and c["contiguous"] for c in copied), copied
