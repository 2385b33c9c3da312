"""What `make venv` leaves in the course's environment, beyond the pins of requirements.txt."""
import importlib.util
import sys
from pathlib import Path

import pytest


def test_neuralop_starts_without_wandb():
    """neuraloperator requires wandb but imports it only where it is installed; the course logs
    nothing to it, and its import costs every process the course and the suite start 0.8 s of
    CPU (README, "What we chose"). `make venv` uninstalls it (the Makefile says why); neuralop must still import."""
    spec = importlib.util.find_spec("wandb")
    if spec is not None and not Path(spec.origin).resolve().is_relative_to(Path(sys.prefix).resolve()):
        pytest.skip(f"wandb comes from outside this environment ({spec.origin}): a site's packages")
    assert spec is None, (f"wandb is installed in {sys.prefix} ({spec.origin}): every process that "
                          "imports neuralop spends 0.8 s of CPU importing it; `make venv` uninstalls "
                          "it (.venv/bin/python -m pip uninstall -y wandb)")
    import neuralop.models  # noqa: F401

    import wellfno.model  # noqa: F401

    assert "wandb" not in sys.modules
