"""The cross-step matrix itself: every solution is in it, every step's checks run on every later solution.

The matrix is `STEPS` in tests/conftest.py (step -> reference solution, in course order). A test module
that sets `STEP = "<step>"` and takes the `script` (or `script_module`) fixture runs on that step's
solution and on every later one; `--script FILE` runs it on FILE alone (check-your-work).
"""
import re
import types
from pathlib import Path

import pytest

from tests import conftest
from tests.conftest import REPO, STEPS, import_script, steps_from


def test_every_training_solution_is_in_the_matrix_in_course_order():
    on_disk = sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("solutions/[0-9][0-9]_*/fno.py"))
    listed = list(STEPS.values())
    assert listed[0] == "fno.py", "the matrix starts at the baseline"
    assert sorted(listed[1:]) == on_disk, "add each solutions/NN_name/fno.py to STEPS in tests/conftest.py"
    assert list(STEPS) == sorted(STEPS), "STEPS lists the steps in course order (NN_name)"
    for name, path in STEPS.items():
        assert name[:2].isdigit() and (REPO / path).is_file(), (name, path)
        if name != "00_baseline":
            assert Path(path).parent.name == name, f"step {name} should be solutions/{name}/fno.py"


def test_each_step_with_an_exercise_has_a_check_module_in_the_matrix():
    declared = {}
    for path in sorted((REPO / "tests").glob("test_*.py")):
        found = re.search(r'^STEP = "([^"]+)"', path.read_text(), flags=re.MULTILINE)
        if found:
            assert found.group(1) in STEPS, f"{path.name}: STEP {found.group(1)!r} is not in conftest.STEPS"
            declared[found.group(1)] = path.name
    for step in STEPS:
        assert step in declared, f"no test module declares STEP = {step!r}: its checks would not run on later steps"


class FakeMetafunc:
    """What pytest_generate_tests reads from pytest's Metafunc, and what it asks for."""

    def __init__(self, step, script_option=None, fixtures=("script",)):
        self.module = types.SimpleNamespace(STEP=step) if step else types.SimpleNamespace()
        self.fixturenames = list(fixtures)
        self.config = types.SimpleNamespace(getoption=lambda name: script_option if name == "--script" else None)
        self.calls = []

    def parametrize(self, *args, **kwargs):
        self.calls.append((args, kwargs))


@pytest.mark.parametrize("full", [False, True], ids=["make-test", "make-test-matrix"])
@pytest.mark.parametrize("step", list(STEPS))
def test_a_steps_checks_run_on_its_solution_and_later_ones(step, full, monkeypatch):
    """make test: the step's own solution; make test-matrix: every later one too."""
    monkeypatch.setenv("WELLFNO_FULL_MATRIX", "1" if full else "0")
    metafunc = FakeMetafunc(step)
    conftest.pytest_generate_tests(metafunc)
    (name, params), options = metafunc.calls[0]
    later = steps_from(step)
    if not full:
        later = later[:1]
    # make test-matrix: the later exercises' starting scripts too (earlier lessons folded)
    starters = [s for s in later[1:] if (REPO / "exercises" / s / "start.py").is_file()]
    assert name == "script" and [p.id for p in params] == later + [f"{s[:2]}_start" for s in starters]
    if full:
        assert later[-1] == list(STEPS)[-1]  # the last solution carries every step's checks
    assert [p.values[0] for p in params] == ([REPO / STEPS[s] for s in later]
                                             + [REPO / "exercises" / s / "start.py" for s in starters])
    assert options["indirect"] is True and options["scope"] == "module"  # one run per script and module
    # make test-fast and make test check the step's own solution; make test-matrix the others.
    assert [[m.name for m in p.marks] for p in params] == [[]] + [["slow"]] * (len(params) - 1)


def test_script_option_checks_the_participants_file_alone(tmp_path):
    mine = tmp_path / "my_fno.py"
    metafunc = FakeMetafunc("01_profiling", script_option=str(mine))
    conftest.pytest_generate_tests(metafunc)
    (_, params), _ = metafunc.calls[0]
    assert [(p.values[0], p.id, p.marks) for p in params] == [(mine, "script", ())]


def test_modules_outside_the_matrix_are_left_alone():
    for metafunc in (FakeMetafunc(None), FakeMetafunc("01_profiling", fixtures=("tmp_path",))):
        conftest.pytest_generate_tests(metafunc)
        assert metafunc.calls == []


def options_of(script: Path, capsys) -> set[str]:
    module = import_script(script)
    with pytest.raises(SystemExit):
        module.parse_args(["--help"])
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", capsys.readouterr().out))


def test_each_solution_keeps_every_option_of_the_step_before(capsys):
    """Previous step plus one idea: nothing a participant learnt to type goes away."""
    names = list(STEPS)
    options = {name: options_of(REPO / STEPS[name], capsys) for name in names}
    assert {"--data-dir", "--out", "--resume", "--max-steps"} <= options[names[0]]
    for before, after in zip(names, names[1:]):
        missing = options[before] - options[after]
        assert not missing, f"{after} dropped {sorted(missing)} of {before}"
