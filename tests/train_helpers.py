"""What the checks of exercises 07-09 share: one training run of the script on the tiny data."""
import json

from tests.conftest import run_script

RUN = ["--epochs", "1", "--batch-size", "8", "--bind", "none"]


def train(script, data_dir, out, *extra, timeout=300, env=None):
    """One run of `script` on the tiny data (`env`: variables added to the environment); its
    metrics.json."""
    result = run_script(script, "--data-dir", data_dir, "--out", out, *RUN, *extra, timeout=timeout,
                        env=env)
    assert result.returncode == 0, f"{script.name} {' '.join(map(str, extra))} failed: " + result.stderr[-1500:]
    return json.loads((out / "metrics.json").read_text())


def per_step_losses(metrics):
    """The running mean training loss read back after each step (needs --log-every 1)."""
    return [loss for _, loss in metrics["history"][0]["loss_log"]]
