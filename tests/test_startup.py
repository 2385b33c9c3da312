"""tests/startup: every process the suite starts collects garbage at suite_gc's thresholds, seams
included; the pytest workers themselves keep the interpreter's own."""
import gc
import os
import subprocess

from tests.conftest import PYTHON, STARTUP, run_script, pythonpath_with
from tests.ddp_helpers import PROBE
from tests.test_09_mixed_precision import as_cpu

SHOW = "import gc; print(gc.get_threshold())"


def thresholds(env=None) -> str:
    result = run_script("-c", SHOW, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def interpreters_own() -> str:
    """What a process prints without tests/startup (the rest of PYTHONPATH kept)."""
    kept = [p for p in os.environ["PYTHONPATH"].split(os.pathsep) if p and p != str(STARTUP)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(kept)}
    return subprocess.run([PYTHON, "-c", SHOW], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_process_the_tests_start_uses_the_suites_thresholds():
    from tests.startup.suite_gc import THRESHOLDS

    assert str(STARTUP) in os.environ["PYTHONPATH"].split(os.pathsep)
    assert thresholds() == str(THRESHOLDS) != interpreters_own()


def test_a_seam_keeps_them():
    """A seam's sitecustomize stands in for tests/startup's: it imports suite_gc itself."""
    from tests.startup.suite_gc import THRESHOLDS

    assert thresholds(as_cpu("amd_epyc_7763")) == str(THRESHOLDS)
    assert thresholds({"PYTHONPATH": pythonpath_with(PROBE)}) == str(THRESHOLDS)


def test_the_pytest_process_keeps_the_interpreters_own():
    assert str(gc.get_threshold()) == interpreters_own()
