"""What the checks of exercises 07-09 share: one training run of the script on the tiny data."""
import json

from tests.checks import last_error_line, require, task
from tests.conftest import run_script

RUN = ["--epochs", "1", "--batch-size", "8", "--bind", "none"]


def train(script, data_dir, out, *extra, fix: str, timeout=300, env=None):
    """One run of `script` on the tiny data (`env`: variables added to the environment); its
    metrics.json. A failed run is one sentence ending in `fix` (what to do and its task,
    tests/checks.py)."""
    result = run_script(script, "--data-dir", data_dir, "--out", out, *RUN, *extra, timeout=timeout,
                        env=env)
    shown = " ".join(map(str, extra))
    require(result.returncode == 0, f"a run with {shown} exited with {result.returncode}: "
            f"{last_error_line(result.stderr)}; {fix}")
    return json.loads((out / "metrics.json").read_text())


def per_step_losses(metrics):
    """The running mean training loss read back after each step (needs --log-every 1)."""
    log = metrics["history"][0].get("loss_log")
    require(log, "metrics.json's history has no loss_log, the [step, mean loss] pairs read back "
            f"every --log-every steps {task('07', 1)}")
    return [loss for _, loss in log]
