"""coursetools.imports: the other packages' modules the day-0 check's programs import, from their
code (the site step imports each on the machine: tests/test_day0.py)."""
from __future__ import annotations

import sys

from coursetools import day0, imports
from tests.conftest import REPO


def _write(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_what_a_program_imports_through_our_modules_and_what_it_starts(tmp_path):
    """A program's imports, inside functions too, through our modules and the scripts and `-m`
    modules it starts; a test file's module level only (collection); never the standard
    library's, torch, or an import whose failure is caught."""
    _write(tmp_path, {
        "prog.py": (
            "import os, json\nimport yaml\nimport torch.nn\nfrom mypkg import helper\n"
            "try:\n    import hta\nexcept ImportError:\n    hta = None\n"
            "def run():\n    import matplotlib.pyplot as plt\n"
            "    cmd = ['python', '-m', 'mypkg.tool']\n    return 'other.py', cmd\n"),
        "mypkg/__init__.py": "import einops\n",
        "mypkg/helper.py": "from . import local\nimport numpy as np\n",
        "mypkg/local.py": "from h5py import File\n",
        "mypkg/tool.py": "import tqdm\ncmd = ['-m', 'pytest', 'tests']\n",
        "other.py": "from the_well.data import WellDataset\nimport beside\n",
        "beside.py": "import threadpoolctl\n",
        "tests/conftest.py": "import pytest\n",
        "tests/test_x.py": ("import neuralop.models\nfrom mypkg import helper\n"
                            "def test_x():\n    import nbformat\n"),
        "unused.py": "import dask\n",
    })
    found = imports.needed(tmp_path, {tmp_path / "prog.py"})
    assert found == {"yaml": "prog.py", "matplotlib.pyplot": "prog.py",
                     "einops": "mypkg/__init__.py", "numpy": "mypkg/helper.py",
                     "h5py": "mypkg/local.py", "tqdm": "mypkg/tool.py", "the_well.data": "other.py",
                     "threadpoolctl": "beside.py", "pytest": "tests/conftest.py",
                     "neuralop.models": "tests/test_x.py"}


def test_the_day0_check_needs_the_course_packages_and_no_optional_one():
    """On this repository: what its programs import that a bare GPU image may lack."""
    found = imports.needed()
    tops = {name.split(".")[0] for name in found}
    assert {"neuralop", "the_well", "h5py", "yaml", "matplotlib", "numpy", "tqdm", "pytest",
            "threadpoolctl"} <= tops, found
    # optional (an ImportError caught: profiling.summarize's hta, wellfno.memory's psutil, a
    # test's scipy.stats), the machine's torch, and solution 04's dask (day 0 runs no step 04)
    assert not tops & {"hta", "psutil", "scipy", "torch", "dask"}, found
    assert all(name.split(".")[0] not in sys.stdlib_module_names for name in found)
    programs = {p.relative_to(REPO).as_posix() for p in imports.day0_programs()}
    assert {"coursetools/day0.py", "coursetools/gpucheck.py", "wellfno/toolchain.py",
            "wellfno/grayscott.py", "solutions/11_compile/fno.py", "tests/conftest.py"} <= programs


def test_a_package_too_old_for_the_course_is_one_line(tmp_path):
    """An h5py older than the_well's requirement (h5py>=3.9.0, its Requires-Dist) first on the
    path: one line naming it, the version, who needs what, and what to load."""
    info = tmp_path / "h5py-3.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: h5py\nVersion: 3.1.0\n")
    lines = day0.too_old([str(tmp_path), *sys.path])
    assert len(lines) == 1, lines
    assert "has h5py 3.1.0, too old: the_well 1.2.0 needs h5py>=3.9.0" in lines[0]
    assert "load the site's h5py>=3.9.0 (`module load`" in lines[0]
    assert day0.too_old(sys.path) == []  # this venv: every requirement met


def test_a_package_that_fails_to_import_is_one_line(tmp_path, monkeypatch):
    """A binary package built for another numpy (its import raises, not ModuleNotFoundError),
    and a module whose requirement is missing: one line each, naming the package."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("brokenbin", "needsmissing"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    _write(tmp_path, {
        "brokenbin/__init__.py": "raise ImportError('numpy.core.multiarray failed to import')\n",
        "needsmissing/__init__.py": "import notinstalled_zz\n",
    })
    lines = day0.import_problems(tmp_path, {"brokenbin": "x.py", "needsmissing": "y.py",
                                            "json": "z.py"})
    assert len(lines) == 2, lines
    assert "cannot import brokenbin (brokenbin ?): ImportError: numpy.core.multiarray failed" \
        in lines[0]
    assert "lacks notinstalled_zz, which needsmissing imports:" in lines[1]
    assert "load the site's notinstalled_zz (`module load`" in lines[1]
