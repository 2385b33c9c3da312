"""Shared fixtures: a tiny embedded dataset, generated once per test session."""
import contextlib
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

# Two CPU cores in CI: keep each process to one intra-op thread so parallel
# subprocesses do not oversubscribe the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# torch.compile's inductor compiles in a pool of one worker process per CPU (up to 32), each of
# which imports torch (torch/_inductor/config.py: decide_compile_threads); on 2 cores that costs
# the compiling tests more CPU than it gives back. 1: compile in the process itself.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    """DATA_DIR holding datasets/gray_scott_embedded (tiny: 16x16, 12 frames, 2 regimes)."""
    from wellfno.grayscott import generate

    data_dir = tmp_path_factory.mktemp("data")
    generate(data_dir, "tiny", seed=0, quiet=True)
    return data_dir


@pytest.fixture(scope="session")
def tiny_dataset_dir(tiny_data_dir) -> Path:
    from wellfno.grayscott import EMBEDDED

    return tiny_data_dir / "datasets" / EMBEDDED


@pytest.fixture
def tiny_data_copy(tiny_data_dir, tmp_path) -> Path:
    """A private copy a test may damage."""
    copy = tmp_path / "data"
    shutil.copytree(tiny_data_dir, copy)
    return copy


def run_script(*args, cwd=REPO, env=None, timeout=300):
    """Run a repo script as a participant would; return the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([PYTHON, *map(str, args)], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


# The course in order: step -> its reference solution. A test module that sets `STEP = "<step>"` and uses the
# `script` fixture runs on that step's solution and on every later one (the cross-step matrix: each solution is
# the previous step plus one idea, so every earlier check must still pass). Adding a step is one line here.
STEPS = {
    "00_baseline": "fno.py",
    "01_profiling": "solutions/01_profiling/fno.py",
    "02_data_pipeline": "solutions/02_data_pipeline/fno.py",
    "03_affinity": "solutions/03_affinity/fno.py",
    "05_ddp": "solutions/05_ddp/fno.py",
    "06_exact_metrics": "solutions/06_exact_metrics/fno.py",
    "07_failures": "solutions/07_failures/fno.py",
    "08_host_syncs": "solutions/08_host_syncs/fno.py",
    "09_mixed_precision": "solutions/09_mixed_precision/fno.py",
    "10_mfu": "solutions/10_mfu/fno.py",
    "11_compile": "solutions/11_compile/fno.py",
    "12_checkpointing": "solutions/12_checkpointing/fno.py",
    "13_domain_parallel": "solutions/13_domain_parallel/fno.py",
    "14_long_rollouts": "solutions/14_long_rollouts/fno.py",
}


def starting_script(step: str) -> Path:
    """What exercise `step` starts from: exercises/STEP/start.py where the step's solution folds
    code an earlier step taught into packages (tests/test_lesson_diffs.py), else the previous
    step's solution. `diff starting_script(step) STEPS[step]` is the lesson."""
    starter = REPO / "exercises" / step / "start.py"
    if starter.is_file():
        return starter
    return REPO / STEPS[list(STEPS)[list(STEPS).index(step) - 1]]


def steps_from(step: str) -> list[str]:
    """`step` and every later step of the course."""
    names = list(STEPS)
    return names[names.index(step):]


def pytest_addoption(parser):
    parser.addoption("--script", default=None,
                     help="check-your-work: test this script (e.g. your edited fno.py) instead of the reference solution")


def pytest_generate_tests(metafunc):
    """The matrix: `script` is each solution from the module's STEP on, or the file given with --script."""
    step = getattr(metafunc.module, "STEP", None)
    if step is None or "script" not in metafunc.fixturenames:
        return
    chosen = metafunc.config.getoption("--script")
    if chosen:
        params = [pytest.param(Path(chosen).resolve(), id="script")]
    else:
        # `make test` and `make test-fast` check the step's own solution; `make test-matrix` every
        # later one too, the last included. On the last solution alone the earlier checks were 17 %
        # of make test's time. tests/test_drift.py holds each solution to its predecessor's syntax
        # tree, so what a later step does not teach is the code these checks passed on.
        full = os.environ.get("WELLFNO_FULL_MATRIX") == "1"
        later = steps_from(step)[1:] if full else []
        params = [pytest.param(REPO / STEPS[step], id=step)]
        params += [pytest.param(REPO / STEPS[name], id=name, marks=[pytest.mark.slow]) for name in later]
        # a later exercise's starting script is a solution from this step on with earlier lessons
        # folded into packages: this step's checks pass on it too
        params += [pytest.param(starting_script(name), id=f"{name[:2]}_start", marks=[pytest.mark.slow])
                   for name in later if starting_script(name).name == "start.py"]
    metafunc.parametrize("script", params, indirect=True, scope="module")


@pytest.fixture(scope="module")
def script(request) -> Path:
    """The script under test (see pytest_generate_tests)."""
    path = request.param
    assert path.is_file(), f"{path} does not exist"
    return path


@pytest.fixture(scope="module")
def script_module(script):
    """The script under test, imported as a module, so its main(argv) runs in the test process."""
    return import_script(script)


def call_main(module, *argv):
    """module.main(argv) in this process, on the test process's one intra-op thread and CPUs.

    Solution 03 and later bind the process they run in and set torch's threads to its cores; on 2
    shared cores that makes each in-process run several times slower, and it would leak into later
    tests. The binding itself is checked in subprocesses (tests/test_03_affinity_solution.py).

    An option the script does not know yet that a task adds (tests/checks.py, OPTION_TASKS) fails
    the test with one sentence naming that task, instead of argparse's usage and exit 2.
    """
    import argparse

    import torch

    from tests.checks import unknown_option

    affinity, missing = os.sched_getaffinity(0), []
    error = argparse.ArgumentParser.error

    def refuse(parser, message):
        sentence = unknown_option(message)
        if sentence is None:
            error(parser, message)  # usage and `error:` on stderr, exit 2, as the process does
        missing.append(sentence)
        raise SystemExit(2)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "set_num_threads", lambda n: None)
        patch.setattr(argparse.ArgumentParser, "error", refuse)
        try:
            return module.main([str(a) for a in argv])
        except SystemExit:
            if not missing:
                raise
        finally:
            os.sched_setaffinity(0, affinity)
    # outside the except: no "During handling of the above exception" under the sentence
    pytest.fail(f"{Path(getattr(module, '__file__', 'script')).name} stopped: {missing[0]}",
                pytrace=False)


def beside_modules(path: Path) -> dict[str, Path]:
    """The modules a script imports from its own folder (solution 03's binding.py, 10's
    flop_count.py, 13's domain_conv.py): top-level names that are a .py file beside it."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    folder = Path(path).resolve().parent
    return {name: folder / f"{name}.py" for name in sorted(names)
            if "." not in name and (folder / f"{name}.py").is_file()}


def import_script(path: Path):
    """The script as a module, imported as `python path` runs it: the modules it imports from
    beside itself (`python path` finds them in the script's folder) are the ones in its folder,
    loaded by file first (each script its own: another folder may hold a module of the same
    name), and stay in sys.modules as an import leaves them; sys.path is left as it is."""
    import importlib.util

    for name, file in beside_modules(path).items():
        beside_spec = importlib.util.spec_from_file_location(name, file)
        sys.modules[name] = importlib.util.module_from_spec(beside_spec)
        beside_spec.loader.exec_module(sys.modules[name])
    spec = importlib.util.spec_from_file_location(f"script_under_test_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does: a script's dataclasses look it up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """trained(script, *options) -> the output folder of one finished in-process run, made once per session.

    The run's first copy to the device is delayed by 2 s, a stand-in for the one-time start-up costs
    (FFT plans, allocator, DataLoader workers) that samples_per_second must leave out.
    """
    runs = {}

    def run(script: Path, data_dir: Path, *options) -> Path:
        key = (str(script), str(data_dir), *map(str, options))
        if key not in runs:
            module = import_script(script)
            out = tmp_path_factory.mktemp("trained")
            calls = []

            def slow_first(copy):
                def slow_first_copy(*args, **kwargs):
                    calls.append(1)
                    if len(calls) == 1:
                        time.sleep(START_UP_SECONDS)
                    return copy(*args, **kwargs)
                return slow_first_copy

            # the first step's copy of a batch, whichever the script trains with: a frame
            # (data.batch_to_model) or, from solution 14 on, a rollout (unrolled.batch_to_rollout)
            copies = [(module.data, "batch_to_model")]
            if hasattr(module, "unrolled"):
                copies.append((module.unrolled, "batch_to_rollout"))
            with pytest.MonkeyPatch.context() as patch:
                for owner, name in copies:
                    patch.setattr(owner, name, slow_first(getattr(owner, name)))
                call_main(module, "--data-dir", data_dir, "--out", out, *options)
            runs[key] = out
        return runs[key]

    return run


START_UP_SECONDS = 2.0


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """finished_run(script, data_dir, *options) -> (output folder, stdout) of one in-process run.

    One run per distinct command and session: the checks that read the same run (exercise 08's
    --log-every runs, 08's float32 reference, 09's eager reference) share it, instead of each
    starting a process that imports torch again. Callers read the folder; they must not change it.
    A run that refuses its options fails the test with the script's one `error:` line.
    """
    from wellfno.cli import UserError

    runs, modules = {}, {}

    def run(script: Path, data_dir: Path, *options, fix: str = ""):
        """`fix`: what to do and its task (tests/checks.py), said when the run stops."""
        key = (str(script), str(data_dir), *map(str, options))
        if key not in runs:
            if str(script) not in modules:
                modules[str(script)] = import_script(script)
            out = tmp_path_factory.mktemp("run")
            stdout, stderr = io.StringIO(), io.StringIO()
            shown = f"{Path(script).name} {' '.join(map(str, options))}"
            stopped = None
            try:
                with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                    call_main(modules[str(script)], "--data-dir", data_dir, "--out", out, *options)
            except UserError as err:
                stopped = f"error: {err}"
            except SystemExit as err:  # argparse: a value the script refuses
                if err.code not in (0, None):
                    said = [line for line in stderr.getvalue().splitlines() if line.strip()]
                    stopped = f"exit code {err.code}" + (f": {said[-1][:200]}" if said else "")
            if stopped is not None:  # outside the except: no "During handling of the above ..."
                pytest.fail(f"{shown} stopped: {stopped}" + (f"; {fix}" if fix else ""),
                            pytrace=False)
            runs[key] = out, stdout.getvalue()
        return runs[key]

    return run


# Python's default warning filters, what `python SCRIPT` shows on stderr (pytest would record the
# rest): https://docs.python.org/3/library/warnings.html#default-warning-filter
DEFAULT_WARNING_FILTERS = [("default", DeprecationWarning, "__main__"),
                           ("ignore", DeprecationWarning, ""),
                           ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""),
                           ("ignore", ResourceWarning, "")]


def exit_of(module, *argv) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGV` of an imported script, run in this process: its exit status and output.

    For the checks of what a refused command prints and leaves behind (one `error:` line, exit 2,
    nothing written): the script's `__main__` block is `run_main(main)` (wellfno.cli), called here
    as there, so the status, stdout and stderr are those of the process, warnings included, and an
    exception that would end the process with a traceback does so here (status 1). It saves the
    seconds of a new process that imports torch; what depends on the process itself (its
    environment, its CPUs, its ranks) is checked in real processes.
    """
    import traceback
    import warnings

    from wellfno import cli

    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), \
            warnings.catch_warnings(record=True) as caught, pytest.MonkeyPatch.context() as patch:
        # run_main ends the process with cli.leave (os._exit after the atexit handlers); here it
        # ends with the SystemExit of the same status (tests/test_cli.py checks leave itself)
        patch.setattr(cli, "leave", sys.exit)
        # argparse names the program after sys.argv[0]: "fno.py: error: ...", as in the process
        patch.setattr(sys, "argv", [getattr(module, "__file__", "script"), *map(str, argv)])
        warnings.resetwarnings()
        for action, category, where in reversed(DEFAULT_WARNING_FILTERS):
            warnings.filterwarnings(action, category=category, module=where)
        try:
            cli.run_main(lambda: call_main(module, *argv))
        except SystemExit as exit_info:
            code = exit_info.code if isinstance(exit_info.code, int) else (exit_info.code is not None)
        except (pytest.fail.Exception, pytest.skip.Exception):
            raise  # the check's own sentence (call_main: an option a task adds), not the script's
        except BaseException:  # noqa: BLE001 - what the interpreter would print and exit with
            traceback.print_exc(file=stderr)
            code = 1
    shown = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
                    for w in caught)
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), shown + stderr.getvalue())


def script_under_test(request, default: str) -> Path:
    """For a module outside the matrix: the participant's --script, else `default` (a reference solution)."""
    chosen = request.config.getoption("--script")
    path = Path(chosen) if chosen else REPO / default
    return path if path.is_absolute() else (Path.cwd() / path).resolve()


# tests/startup/sitecustomize.py: the garbage collector's thresholds of every process the tests
# start (tests/startup/suite_gc.py says why: 0.75 s of CPU less in a 1-epoch training run,
# `.venv/bin/python tests/gc_cost.py`).
STARTUP = REPO / "tests" / "startup"


def pythonpath_with(folder: Path) -> str:
    """PYTHONPATH with `folder` ahead of what the tests already put there: tests/startup itself, or
    a seam, whose sitecustomize stands in for tests/startup's and applies its thresholds too."""
    return os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


def pytest_configure(config):
    # a new session's times (pytest.main runs again in one process: tests/test_check_messages.py)
    _SECONDS_BY_KIND.clear()
    # Exercise 04's tests pick their script at import time from STATS_SCRIPT; --script works there
    # too, and wins over a STATS_SCRIPT already set (a session before this one in the same process).
    chosen = config.getoption("--script", default=None)
    if chosen:
        os.environ["STATS_SCRIPT"] = str(Path(chosen).resolve())
    # Every process this one starts, except the workers of `pytest -n` (in the controller: no
    # workerinput, a number of processes), whose children get it from them.
    controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if not controller and str(STARTUP) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        os.environ["PYTHONPATH"] = pythonpath_with(STARTUP)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """The xdist groups of `make test`; `gpu` tests run where torch sees a GPU (CUDA or ROCm) and
    are skipped elsewhere; with --script, the checks of the repository's own code are skipped.

    Under `pytest -n 2 --dist loadgroup` every test marked `slurm` is in one group, "slurm", which
    runs on one worker, one after the other in file order (the local cluster's jobs and the
    module-scoped job batches of tests/test_slurm*.py expect that), and first: it is the longest
    and the other worker runs the rest meanwhile. Every other test is in its file's group, so that
    a module-scoped fixture (a training run, a background job) is made once, not on both workers.
    Without xdist the marks do nothing. https://pytest-xdist.readthedocs.io/en/stable/distribution.html
    """
    if config.getoption("--script", default=None):
        # check-your-work: a check module's test that takes no `script` checks the repository's
        # own code (a package, a benchmark), not the participant's file: it skips, saying so,
        # instead of passing whatever the file does (DESIGN.md, "What each check runs")
        own = pytest.mark.skip(reason="checks the repository's own code, not your --script")
        for item in items:
            if getattr(getattr(item, "module", None), "STEP", None) and \
                    not {"script", "script_module"} & set(getattr(item, "fixturenames", ())):
                item.add_marker(own)
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
    if getattr(config.option, "loadgroup", False):  # an xdist worker of --dist loadgroup
        for item in items:
            if not item.get_closest_marker("slurm"):
                item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        # xdist hands out the groups in collection order (--no-loadscope-reorder in the Makefile)
        items.sort(key=lambda item: not item.get_closest_marker("slurm"))  # stable: file order
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU that torch sees (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


# The suite's time by kind, printed at the end of `make test`: the README quotes the Slurm tests'
# share (issue 19 holds them to 5 minutes) and the rest's. A batched Slurm module's jobs run while
# its own tests wait, so the sum over its tests' phases is its wall time.
_SECONDS_BY_KIND: dict[str, list] = {}


def pytest_runtest_logreport(report):
    kind = "slurm" if "slurm" in report.keywords else "other"
    seconds, tests = _SECONDS_BY_KIND.setdefault(kind, [0.0, set()])
    _SECONDS_BY_KIND[kind][0] = seconds + report.duration
    tests.add(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    # Under xdist this runs in the controller, which receives every worker's reports.
    if _SECONDS_BY_KIND:
        workers = getattr(terminalreporter.config.option, "numprocesses", None)
        terminalreporter.write_line("time by kind: " + "; ".join(
            f"{kind} tests: {len(tests)} in {seconds / 60:.1f} min"
            for kind, (seconds, tests) in sorted(_SECONDS_BY_KIND.items()))
            + (f" (summed over {workers} xdist workers running side by side)" if workers else ""))
