"""Exercise 13, task 2's checks of the participant's own spectral convolution
(wellfno.domain_check), shared by its check-your-work (tests/test_13_domain_parallel.py) and
the harness's own tests (tests/test_domain_check.py: they run them on a convolution with a real
bug)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.checks import last_error_line, require, task
from tests.ddp_helpers import launch
from wellfno import domain_check
from wellfno.cli import UserError


def convolution_under_test(request, script, script_module):
    """The participant's own DomainSpectralConv (--script: wellfno.domain_check's contract), else
    wellfno.domain's, which the reference solution uses through split_model; one sentence if the
    participant's script has none of its own."""
    if request.config.getoption("--script") is None:
        return domain_check.REFERENCE
    refused = None
    try:
        return domain_check.convolution_of(script_module, Path(script).name)
    except UserError as err:
        refused = str(err)
    require(False, refused)  # outside the except: no "during handling of the above exception"


def check_on_one_rank(cls) -> None:
    """The one-rank cases (the whole grid as one slab) in this process: SpectralConv's numbers."""
    crash = None
    try:
        failure = domain_check.first_failure(domain_check.check(cls))
    except Exception as err:  # the participant's forward or backward raised
        crash, failure = f"{type(err).__name__}: {err}"[:300], None
    require(
        crash is None,
        f"DomainSpectralConv on one rank (the whole grid as one slab) raised "
        f"{crash} {task('13', 2)}",
    )
    require(
        failure is None,
        f"DomainSpectralConv on one rank (the whole grid as one slab), "
        f"{failure}: it must give SpectralConv's numbers before any exchange {task('13', 2)}",
    )


def check_on_ranks(which: tuple, report: Path) -> None:
    """python -m wellfno.domain_check on 3 gloo ranks (every case of 1, 2 and 3 ranks)."""
    results = launch("-m", 3, "wellfno.domain_check", *which, "--report", report, "--timeout", "30")
    stopped = [
        (rank, rc, last_error_line(err or out))
        for rank, (rc, out, err) in enumerate(results)
        if rc != 0
    ]
    # the rank that broke first, not one that then timed out waiting for it in a collective
    stopped.sort(key=lambda r: bool(re.search("DistBackendError|Timed out|Connection", r[2])))
    require(
        report.exists() or not stopped,
        "DomainSpectralConv on 3 gloo ranks: rank "
        f"{stopped[0][0]} ended with exit code {stopped[0][1]}: {stopped[0][2]} "
        f"{task('13', 2)}"
        if stopped
        else "",
    )
    failure = json.loads(report.read_text())["failure"] if report.exists() else None
    require(
        failure is None and not stopped,
        f"DomainSpectralConv on 3 gloo ranks (cases of 1, 2 and 3 ranks), {failure}: forward "
        f"and every gradient must be SpectralConv's on the whole grid {task('13', 2)}",
    )
