"""Every table the docs generate equals what its results file says (wellfno.results)."""
import json

import pytest

from tests.conftest import REPO, run_script
from wellfno import results
from wellfno.cli import UserError


def test_docs_tables_match_their_results_files():
    stale = results.render(REPO, check=True)
    assert not stale, (f"tables out of date with results/: {[str(p.relative_to(REPO)) for p in stale]}; "
                       f"run `python -m wellfno.results render`")


def _fake_repo(tmp_path, seconds):
    (tmp_path / "fno.py").write_text("")
    results.write_result(tmp_path / "results" / "runtimes.json", "python -m wellfno.results runtimes",
                         {"rows": [{"step": "00", "command": "python fno.py", "seconds": seconds}]})
    (tmp_path / "README.md").write_text("intro\n<!-- table: wellfno.results:runtimes_table -->\nold\n"
                                        "<!-- /table -->\noutro\n")


def test_render_writes_the_table_and_check_finds_drift(tmp_path):
    _fake_repo(tmp_path, 12.34)
    assert results.render(tmp_path, check=True) == [tmp_path / "README.md"]   # "old" is stale
    results.render(tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "| 00 | `python fno.py` | 12.3 s |" in text and text.startswith("intro\n") and text.endswith("outro\n")
    assert "Measured by `python -m wellfno.results runtimes` on " in text
    assert results.render(tmp_path, check=True) == []
    # a new measurement makes the committed table stale until it is rendered again
    results.write_result(tmp_path / "results" / "runtimes.json", "python -m wellfno.results runtimes",
                         {"rows": [{"step": "00", "command": "python fno.py", "seconds": 99.0}]})
    assert results.render(tmp_path, check=True) == [tmp_path / "README.md"]
    rc = run_script("-m", "wellfno.results", "render", "--check", "--root", tmp_path)
    assert rc.returncode == 1 and "stale: README.md" in rc.stdout


def test_results_file_names_its_machine_and_command(tmp_path):
    path = results.write_result(tmp_path / "r.json", "cmd", {"x": 1})
    saved = json.loads(path.read_text())
    assert saved["command"] == "cmd" and saved["data"] == {"x": 1}
    assert saved["machine"]["cpu"] and saved["machine"]["cores"] >= 1 and saved["machine"]["torch"]


def test_bad_results_files_are_one_line(tmp_path):
    with pytest.raises(UserError, match="missing"):
        results.read_result(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        results.read_result(tmp_path / "bad.json")
    (tmp_path / "plain.json").write_text('{"a": 1}')
    with pytest.raises(UserError, match="lacks command"):
        results.read_result(tmp_path / "plain.json")
    rc = run_script("-m", "wellfno.results", "render", "--root", tmp_path)
    assert rc.returncode == 2 and rc.stderr.startswith("error: ") and "Traceback" not in rc.stderr
