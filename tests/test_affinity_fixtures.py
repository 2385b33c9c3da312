"""The committed sysfs fixture trees are exactly what tests/fixtures/make_sysfs.py writes."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from tests.fixtures import make_sysfs


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for sub in ("devices", "bus")
            for p in sorted((root / sub).rglob("*")) if p.is_file()}


def test_committed_trees_match_the_generator(tmp_path):
    for name, spec in make_sysfs.NODES.items():
        committed = REPO / "tests" / "fixtures" / "sysfs" / name
        assert (committed / "README.md").is_file(), f"{name}: every fixture cites its sources"
        fresh = make_sysfs.write_tree(spec, tmp_path / name)
        assert _files(committed) == _files(fresh), f"{name}: rerun python tests/fixtures/make_sysfs.py"
