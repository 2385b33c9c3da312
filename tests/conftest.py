"""Shared fixtures: a tiny embedded dataset, generated once per test session."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

# Two CPU cores in CI: keep each process to one intra-op thread so parallel
# subprocesses do not oversubscribe the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    """DATA_DIR holding datasets/gray_scott_embedded (tiny: 16x16, 12 frames, 2 regimes)."""
    from wellfno.grayscott import generate

    data_dir = tmp_path_factory.mktemp("data")
    generate(data_dir, "tiny", seed=0, quiet=True)
    return data_dir


@pytest.fixture(scope="session")
def tiny_dataset_dir(tiny_data_dir) -> Path:
    from wellfno.grayscott import EMBEDDED

    return tiny_data_dir / "datasets" / EMBEDDED


@pytest.fixture
def tiny_data_copy(tiny_data_dir, tmp_path) -> Path:
    """A private copy a test may damage."""
    copy = tmp_path / "data"
    shutil.copytree(tiny_data_dir, copy)
    return copy


def run_script(*args, cwd=REPO, env=None, timeout=300):
    """Run a repo script as a participant would; return the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([PYTHON, *map(str, args)], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def pytest_addoption(parser):
    parser.addoption("--script", default=None,
                     help="check-your-work: test this script (e.g. your edited fno.py) instead of the reference solution")


def script_under_test(request, default: str) -> Path:
    """The participant's script given with --script, else the step's reference solution."""
    chosen = request.config.getoption("--script")
    path = Path(chosen) if chosen else REPO / default
    return path if path.is_absolute() else (Path.cwd() / path).resolve()


def pytest_configure(config):
    # Exercise 04's tests pick their script at import time from STATS_SCRIPT; --script works there too.
    chosen = config.getoption("--script", default=None)
    if chosen:
        os.environ.setdefault("STATS_SCRIPT", str(Path(chosen).resolve()))


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run where torch sees a GPU (CUDA or ROCm) and are skipped elsewhere."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU that torch sees (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
