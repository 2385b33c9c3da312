"""Exercise 13, task 2's checks of the participant's own spectral convolution
(wellfno.domain_check), shared by its check-your-work (tests/test_13_domain_parallel.py) and
the harness's own tests (tests/test_domain_check.py: they run them on a convolution with a real
bug)."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

from tests.checks import OPTION_TASKS, last_error_line, require, task
from tests.ddp_helpers import launch
from wellfno import domain, domain_check
from wellfno.cli import UserError


def later_steps_options(script) -> list[str]:
    """The options of exercises after 13 (tests/checks.py's OPTION_TASKS) that the script's
    source names: a later step's script (exercise 14 starts from solution 13; solution 14 trains
    with wellfno.domain's convolution) when there are any."""
    source = Path(script).read_text()
    return [option for option, (exercise, _) in OPTION_TASKS.items()
            if exercise > "13" and f'"{option}"' in source]


def where_the_convolution_is(script, script_module):
    """The module that holds the script's DomainSpectralConv: the script itself (a participant's,
    as task 2 asks), or a module beside it that it imports (solution 13's domain_conv.py)."""
    if hasattr(script_module, "DomainSpectralConv"):
        return script_module
    folder = Path(script).resolve().parent
    beside = [value for value in vars(script_module).values()
              if inspect.ismodule(value) and hasattr(value, "DomainSpectralConv")
              and Path(getattr(value, "__file__", None) or "/").resolve().parent == folder]
    return beside[0] if beside else script_module


def trains_with_wellfno_domain(script, script_module) -> bool:
    """The script's spectral convolution is wellfno.domain's: it imports that module, as solution
    14 does (split_model), or its DomainSpectralConv by name."""
    holder = where_the_convolution_is(script, script_module)
    own = getattr(holder, "DomainSpectralConv", None)
    return own is domain_check.REFERENCE or (own is None and getattr(script_module, "domain", None)
                                             is domain)


def convolution_under_test(request, script, script_module):
    """The participant's own DomainSpectralConv (--script: wellfno.domain_check's contract), or
    solution 13's (domain_conv.py, beside it); else wellfno.domain's, which a later step's script
    trains with through split_model; one sentence if the participant's step-13 script has none of
    its own."""
    if trains_with_wellfno_domain(script, script_module) and (
            request.config.getoption("--script") is None or later_steps_options(script)):
        # Exercise 13's own convolution is asked of the step-13 script. A later step's script may
        # train with wellfno.domain's, as the solutions from 14 on do: that is the one checked then.
        return domain_check.REFERENCE
    holder = where_the_convolution_is(script, script_module)
    refused = None
    try:
        return domain_check.convolution_of(holder, Path(holder.__file__).name)
    except UserError as err:
        refused = str(err)
    require(False, refused)  # outside the except: no "during handling of the above exception"


def file_of(convolution) -> Path:
    """The file that defines the class: what `python -m wellfno.domain_check --script` loads (it
    imports the file alone, so solution 13's is domain_conv.py, not the fno.py that imports it)."""
    return Path(inspect.getfile(convolution))


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
