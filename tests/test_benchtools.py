"""benchtools (what every benchmark writes) and coursetools.measure (`make results`), on the CPU."""
import json
import os
import sys

import pytest

from benchtools import machine, resultfiles
from benchtools.rounds import best_of_rounds
from coursetools import measure
from tests.conftest import REPO


def test_best_of_rounds_is_round_robin_and_keeps_each_fastest():
    seen = []
    times = {("a", 0): 3.0, ("b", 0): 5.0, ("a", 1): 2.0, ("b", 1): 6.0}

    def run(name):
        round_ = sum(1 for s in seen if s == name)
        seen.append(name)
        return {"name": name, "round": round_, "s": times[(name, round_)]}

    best = best_of_rounds(["a", "b"], run, 2, lambda row: row["s"])
    assert seen == ["a", "b", "a", "b"]   # every run once, then every run again
    assert best == [{"name": "a", "round": 1, "s": 2.0, "rounds": 2},
                    {"name": "b", "round": 0, "s": 5.0, "rounds": 2}]


def test_busy_warning_only_above_the_cpus():
    assert machine.busy_warning(2.0, "at the start", cpus_here=2) is None
    assert machine.busy_warning(None, "at the start", cpus_here=2) is None
    line = machine.busy_warning(2.5, "at the start of threads", cpus_here=2)
    assert line.startswith("warning: the machine is busy at the start of threads: "
                           "load average 2.5 above its 2")
    assert "\n" not in line


def test_the_load_at_the_start_is_added_and_named(tmp_path):
    path = resultfiles.write_result(tmp_path / "r.json", "cmd", {"x": 1})
    resultfiles.add_load_at_start(path, 0.25)
    saved = json.loads(path.read_text())
    assert saved["machine"]["load_average_at_start"] == 0.25 and saved["data"] == {"x": 1}
    assert "load average 0.25 at the start, " in resultfiles.caption(saved)


def test_every_committed_results_file_is_measured_again_by_make_results():
    committed = {str(p.relative_to(REPO)) for p in (REPO / "results").rglob("*.json")}
    assert committed <= {t.file for t in (*measure.TARGETS, *measure.ELSEWHERE)}, \
        "add the file's command to coursetools.measure.TARGETS (or ELSEWHERE: another machine's)"


def _fake_target(monkeypatch, name, file, code):
    target = measure.Target(name, file, (f"{{py}} -c {code!r}",), "a test")
    monkeypatch.setattr(measure, "TARGETS", (target,))
    monkeypatch.setattr(measure, "BY_NAME", {name: target})


def test_measure_records_the_start_load_and_warns_when_busy(tmp_path, monkeypatch, capsys):
    (tmp_path / "fno.py").write_text("")
    code = ("import os, sys; from benchtools.resultfiles import write_result; "
            "assert os.environ['OMP_NUM_THREADS'] == '1'; "
            "write_result('results/x.json', 'python x', dict(v=1))")
    _fake_target(monkeypatch, "x", "results/x.json", code)
    loads = iter([9.0, 0.5])   # busy at the start, idle at the end
    monkeypatch.setattr(measure, "load_average", lambda: next(loads))
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 2)
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    assert measure.main(["x", "--root", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "results" / "x.json").read_text())
    assert saved["machine"]["load_average_at_start"] == 9.0 and saved["data"] == {"v": 1}
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and "at the start of x" in warnings[0] and "ONLY=x" in warnings[0]
    assert "during x" in warnings[1]


def test_measure_says_which_target_failed_or_wrote_nothing(tmp_path, monkeypatch):
    (tmp_path / "fno.py").write_text("")
    _fake_target(monkeypatch, "quiet", "results/never.json", "pass")
    with pytest.raises(measure.UserError,
                       match="quiet: its commands ran but did not write results/never.json"):
        measure.main(["--root", str(tmp_path)])
    _fake_target(monkeypatch, "broken", "results/b.json", "import sys; sys.exit(3)")
    with pytest.raises(measure.UserError, match="broken: `python -c"):
        measure.main(["--root", str(tmp_path)])
    with pytest.raises(measure.UserError, match="unknown results target nope"):
        measure.main(["nope"])
    assert sys.executable  # the targets run with this interpreter ({py})


@pytest.mark.slow
def test_a_benchmark_keeps_the_fastest_of_its_rounds(tmp_path):
    """solutions/13_domain_parallel/benchmark.py --checkpointing --repeats 2 on a tiny model: each
    row is the best of 2 rounds, and its results file says so (make results runs it for step 12)."""
    import subprocess

    out = tmp_path / "bench"
    result = subprocess.run(
        [sys.executable, str(REPO / "solutions/13_domain_parallel/benchmark.py"), "--checkpointing",
         "--rows", "8", "--cols", "16", "--width", "8", "--layers", "2", "--fno-modes", "4",
         "--batch-size", "2", "--steps", "4", "--repeats", "2", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    # every configuration ran twice, round-robin
    assert result.stdout.count("plain:") == 2 and result.stdout.count("checkpointed:") == 2
    written = json.loads((out / "domain_scaling.json").read_text())
    rows = written["data"]["modes"]["checkpointing"]
    assert [(r["checkpointed"], r["rounds"]) for r in rows] == [(False, 2), (True, 2)]
    assert written["data"]["config"]["repeats"] == 2 and "--repeats 2" in written["command"]
