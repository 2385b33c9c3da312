"""What the checks of exercises 08-12 share: runs of the script on the tiny data."""
import json

from tests.checks import require, task, why_it_stopped
from tests.conftest import run_script

RUN = ["--epochs", "1", "--batch-size", "8", "--bind", "none"]


def train(script, data_dir, out, *extra, fix: str, timeout=300, env=None):
    """One run of `script` on the tiny data in its own process (`env`: variables added to the
    environment); its metrics.json. A failed run is one sentence ending in `fix` (what to do and
    its task, tests/checks.py).

    For what needs a process of its own (--compile: the compiler's state stays in the process; a
    seam in the environment); the other checks share in-process runs (`run_once`)."""
    result = run_script(script, "--data-dir", data_dir, "--out", out, *RUN, *extra, timeout=timeout,
                        env=env)
    shown = " ".join(map(str, extra))
    require(result.returncode == 0, f"a run with {shown} ended with exit code "
            f"{result.returncode}: {why_it_stopped(result.stderr, fix)}")
    return json.loads((out / "metrics.json").read_text())


def run_once(finished_run, script, data_dir, *extra, fix: str = ""):
    """(metrics.json, output folder, stdout) of `script` RUN + extra on the tiny data: one run in
    this process per distinct command and session (conftest.py's `finished_run`), shared by every
    check that reads it. The folder is shared: read it, do not change it. `fix`: what to do and
    its task, said if the run stops."""
    out, stdout = finished_run(script, data_dir, *RUN, *extra, fix=fix)
    return json.loads((out / "metrics.json").read_text()), out, stdout


def per_step_losses(metrics):
    """The running mean training loss read back after each step (needs --log-every 1)."""
    log = metrics["history"][0].get("loss_log")
    require(log, "metrics.json's history has no loss_log, the [step, mean loss] pairs read back "
            f"every --log-every steps {task('08', 1)}")
    return [loss for _, loss in log]
