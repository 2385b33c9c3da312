"""A venv on top of the venv this Python runs in, so that it imports that venv's torch (make venv).

    PYTHON -m coursetools.sitevenv VENV        # PYTHON: a venv's interpreter that imports torch

`make venv` reuses a site's torch (a module's, a container's: the GPU build) instead of
installing one from PyPI. Where that torch is the base interpreter's, `python -m venv
--system-site-packages` reuses it. Where it lives in a virtual environment (a uv- or venv-built
module, some containers), that option does not: "A virtual environment is created on top of an
existing Python installation, known as the virtual environment's 'base' Python"
(https://docs.python.org/3/library/venv.html), so a venv made from a venv's interpreter is made
from its *base* interpreter, and --system-site-packages gives it the base's site-packages,
without the torch. So: a plain venv, then one .pth file in its site-packages that adds this
venv's site directories (site.getsitepackages(): this venv's, and the base's where this venv
has include-system-site-packages) with site.addsitedir, which also runs their own .pth files
("Lines starting with import (followed by space or tab) are executed",
https://docs.python.org/3/library/site.html). The new venv's own site-packages comes first, as a
venv's does before the system's: what `make venv` installs there (requirements.txt) wins, and
torch, never installed there, is this venv's.
"""
from __future__ import annotations

import importlib.util
import site
import subprocess
import sys
import venv
from pathlib import Path

from wellfno.cli import UserError, run_main

PTH = "_wellfno_parent_venv.pth"


def parent_sites() -> list[str]:
    return [p for p in site.getsitepackages() if Path(p).is_dir()]


def create(target: Path) -> str:
    """The venv at `target` on top of this one; returns the torch it imports."""
    if sys.prefix == sys.base_prefix:
        raise UserError(f"{sys.executable} is not a venv's interpreter: use `python -m venv "
                        "--system-site-packages` (make venv does, for a base interpreter's torch)")
    spec = importlib.util.find_spec("torch")  # where, without the import's seconds
    if spec is None or spec.origin is None:
        raise UserError(f"{sys.executable} has no torch: nothing to reuse; make venv from a "
                        "Python without torch installs the pinned one")
    torch_file = spec.origin
    if target.exists() and any(target.iterdir()):
        raise UserError(f"{target} exists and is not empty: remove it, or give another VENV")
    try:
        # pip of its own, as `python -m venv` gives (ensurepip, before the .pth, so that it is
        # installed here rather than found in the parent)
        venv.EnvBuilder(with_pip=True).create(target)
    except subprocess.CalledProcessError:
        # a base Python without ensurepip (Debian's without python3-venv): the parent's pip,
        # importable through the .pth, installs into this venv (pip installs into sys.prefix)
        venv.EnvBuilder(with_pip=False, clear=True).create(target)
    python = target / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True).stdout.strip()
    lines = [f"import site; site.addsitedir({p!r})" for p in parent_sites()]
    (Path(purelib) / PTH).write_text("\n".join(lines) + "\n")
    probe = subprocess.run([str(python), "-c", "import torch, pip; print(torch.__file__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or Path(probe.stdout.strip()).resolve() != Path(torch_file).resolve():
        raise UserError(f"{target} does not import {sys.executable}'s torch ({torch_file}), "
                        f"or has no pip: {(probe.stderr.strip().splitlines() or ['?'])[-1]}; "
                        "remove it and make venv from a base interpreter with torch "
                        "(INSTRUCTORS.md, 'One environment for the whole class')")
    return torch_file


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        raise UserError("usage: PYTHON -m coursetools.sitevenv VENV (a venv's python with torch)")
    where = create(Path(args[0]))
    print(f"{args[0]}: a venv on {sys.prefix}'s site-packages ({PTH}); torch from {where}")
    return 0


if __name__ == "__main__":
    run_main(main)
