"""wellfno.domain_check, exercise 13's check of the participant's own spectral convolution.

It must pass wellfno.domain's DomainSpectralConv (the reference) and fail a convolution with a
real bug: wellfno.domain's own code with the odd-grid shift removed (neuralop's fftshift puts
the kept modes of an odd axis one index lower; without it only odd axes but the last go wrong),
both through the harness and through exercise 13's check-your-work helpers. A script that
imports wellfno.domain's class, has none, or has no `transform` is told so in one line.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import PYTHON, REPO
from tests.domain_conv_checks import check_on_one_rank, check_on_ranks
from wellfno import domain_check
from wellfno.cli import UserError

SHIFT = "    return freqs % n, (freqs + 2 * (n // 2)) % n\n"


@pytest.fixture
def without_the_shift(tmp_path):
    """A participant's script: wellfno/domain.py's code, copied, the odd-grid shift left out."""
    source = (REPO / "wellfno" / "domain.py").read_text()
    assert source.count(SHIFT) == 1, "wellfno.domain.kept_indices changed: update SHIFT"
    script = tmp_path / "my_fno.py"
    script.write_text(source.replace(SHIFT, "    return freqs % n, freqs % n\n"))
    return script


def test_the_reference_passes_on_one_rank():
    rows = domain_check.check(domain_check.REFERENCE)
    assert [r["ranks"] for r in rows] == [1, 1] and all(r["ok"] for r in rows), rows
    assert all(max(r["errors"].values()) < 1e-6 for r in rows), rows


def test_a_convolution_without_the_odd_grid_shift_fails_on_one_rank(without_the_shift):
    cls = domain_check.convolution_of(domain_check.load_script(without_the_shift), "my_fno.py")
    assert cls is not domain_check.REFERENCE and not issubclass(cls, domain_check.REFERENCE)
    rows = domain_check.check(cls)
    assert not any(r["ok"] for r in rows), rows  # both one-rank cases have an odd axis but the last
    assert all(r["errors"]["forward"] > 0.1 for r in rows), rows
    failure = domain_check.first_failure(rows)
    assert failure.startswith("case '2-D, odd rows, one rank' (9x10 cells, 1 rank(s)): forward "), (
        failure
    )
    # exercise 13's quick check-your-work says it in one sentence naming task 2
    with pytest.raises(pytest.fail.Exception, match=r"odd rows.*\(exercise 13, task 2\)$"):
        check_on_one_rank(cls)
    check_on_one_rank(domain_check.REFERENCE)  # and passes the reference


@pytest.mark.parametrize(
    "body, said",
    [
        (
            "from wellfno.domain import DomainSpectralConv\n",
            "is wellfno.domain's: the task is to write your own",
        ),
        (
            "from wellfno import domain\n\n\nclass DomainSpectralConv(domain.DomainSpectralConv):\n"
            "    pass\n",
            "is wellfno.domain's",
        ),
        ("X = 1\n", "defines no DomainSpectralConv: write your own"),
        ("DomainSpectralConv = 3\n", "is not an nn.Module class"),
        (
            "from torch import nn\n\n\nclass DomainSpectralConv(nn.Module):\n"
            "    def __init__(self, conv, slab):\n        super().__init__()\n",
            "has no transform(x, output_shape=None) method: neuralop's FNOBlocks calls it",
        ),
    ],
)
def test_a_script_without_a_convolution_of_its_own_is_one_line(tmp_path, body, said):
    script = tmp_path / "fno.py"
    script.write_text(body)
    with pytest.raises(UserError, match="task 2") as refused:
        domain_check.convolution_of(domain_check.load_script(script), "fno.py")
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_the_command_line_refuses_in_one_line(tmp_path):
    """python -m wellfno.domain_check on a script without the class: exit 2, one error line."""
    script = tmp_path / "fno.py"
    script.write_text("X = 1\n")
    result = subprocess.run(
        [PYTHON, "-m", "wellfno.domain_check", "--script", str(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.startswith("error: fno.py defines no DomainSpectralConv")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.slow
def test_on_3_ranks_the_reference_passes_and_the_missing_shift_fails(without_the_shift, tmp_path):
    """Every case of 1, 2 and 3 gloo ranks: the reference within 1e-6, the mutant off on every case
    with an odd axis but the last, right on the case whose only odd axis is the last, and exercise
    13's check-your-work fails it in one sentence."""
    check_on_ranks(("--reference",), tmp_path / "reference.json")
    rows = json.loads((tmp_path / "reference.json").read_text())["rows"]
    assert sorted({r["ranks"] for r in rows}) == [1, 2, 3] and len(rows) == len(domain_check.CASES)
    assert all(r["ok"] and max(r["errors"].values()) < 1e-5 for r in rows), rows
    with pytest.raises(
        pytest.fail.Exception,
        match=r"3 gloo ranks \(cases of 1, 2 and 3 ranks\), case '2-D, odd rows.*"
        r"\(exercise 13, task 2\)$",
    ):
        check_on_ranks(("--script", without_the_shift), tmp_path / "mutant.json")
    rows = json.loads((tmp_path / "mutant.json").read_text())["rows"]
    right = [r["case"] for r in rows if r["ok"]]
    assert right == ["2-D, odd last axis"], right  # the rfft's axis keeps modes 0 .. m-1: no shift
