"""The scripts participants read and diff side by side pass the linter (pyproject.toml [tool.ruff]):
at most 100 characters a line in fno.py, solutions/ and exercises/, and no pyflakes errors."""
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_scripts_pass_ruff():
    ruff = shutil.which("ruff", path=str(REPO / ".venv" / "bin")) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: `make venv` installs it (requirements.txt)")
    result = subprocess.run([ruff, "check", "--output-format", "concise", "fno.py", "solutions",
                             "exercises"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, "ruff check (fix these lines):\n" + result.stdout[-3000:] + result.stderr[-500:]


def test_ruff_is_pinned_and_configured():
    pinned = [line for line in (REPO / "requirements.txt").read_text().splitlines() if line.startswith("ruff==")]
    assert len(pinned) == 1, "requirements.txt pins ruff (ruff==X.Y.Z)"
    config = (REPO / "pyproject.toml").read_text()
    assert "[tool.ruff]\nline-length = 100\n" in config, "pyproject.toml: [tool.ruff] line-length = 100"
    version = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True,
                             text=True)
    if version.returncode == 0:
        assert version.stdout.split()[-1] == pinned[0].split("==")[1], "the venv's ruff is not the pinned one"
