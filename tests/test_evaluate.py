"""python -m wellfno.evaluate: a run's checkpoint over whole validation trajectories, as The Well
reports it (issue 36), on the tiny data and a small model's in-process run."""
import json
import math
import shutil

import pytest
import torch
import yaml

from tests.conftest import REPO, exit_of, run_script
from wellfno import evaluate

# A small model (what is checked does not depend on its size) and 2 input frames: 10 of the tiny
# trajectories' 12 frames are rolled out, so the paper's 6:12 is partial and 13:30 left out.
RUN = ("--epochs", "1", "--batch-size", "8", "--width", "8", "--modes", "4", "--n-steps-input", "2")
STEPS = 12 - 2


@pytest.fixture
def run_copy(finished_run, tiny_data_dir, tmp_path):
    """A private copy of one finished fno.py run (the shared folder must not change)."""
    out, _ = finished_run(REPO / "fno.py", tiny_data_dir, *RUN)
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    return copy


def evaluation_of(run, *options):
    result = exit_of(evaluate, "--run", run, *options)
    assert result.returncode == 0, result.stderr
    return json.loads((run / "evaluation.json").read_text()), result.stdout


def test_whole_trajectories_agree_with_the_runs_own_rollout(run_copy, tiny_data_dir):
    """The rebuilt model's curves are those fno.py measured at the end of its run (metrics.json,
    wellfno.rollout.vrmse: the variance over N points, where The Well's divides by N - 1)."""
    report, stdout = evaluation_of(run_copy)  # --data-dir: the run's own
    metrics = json.loads((run_copy / "metrics.json").read_text())
    assert report["steps"] == STEPS == len(metrics["rollout_vrmse"])
    assert report["trajectories"] == 2 and report["trajectories_per_step"] == [2] * STEPS
    assert report["spectral_weights"] == "real (as_real)"
    assert report["steps_left_out_for_memory"] == 0
    points = 16 * 16
    to_population = math.sqrt(points / (points - 1))
    for name, theirs in (("model", "rollout_vrmse"), ("persistence", "persistence_vrmse")):
        curve = [v * to_population for v in report[name]["per_step"]]
        assert curve == pytest.approx(metrics[theirs], rel=1e-4), name
        per_field = report[name]["per_step_per_field"]
        assert set(per_field) == {"A", "B"}
        mean_of_fields = [(a + b) / 2 for a, b in zip(per_field["A"], per_field["B"])]
        assert mean_of_fields == pytest.approx(report[name]["per_step"], rel=1e-12)
        assert report[name]["whole_trajectory"] == pytest.approx(
            sum(report[name]["per_step"]) / STEPS, rel=1e-12)
        windows = [(w["window"], w["first"], w["last"], w["complete"])
                   for w in report[name]["paper_windows"]]
        assert windows == [("1", 1, 1, True), ("2", 2, 2, True), ("3:5", 3, 5, True),
                           ("6:12", 6, STEPS, False)]
    assert report["paper_windows_left_out"] == ["13:30"]
    # the printed table: both rows, the whole trajectory, and what is partial or left out
    assert "6:12*" in stdout and f"all {STEPS}" in stdout and "left out: 13:30" in stdout
    model_row = next(line for line in stdout.splitlines() if line.startswith("model "))
    assert float(model_row.split()[-1]) == pytest.approx(report["model"]["whole_trajectory"],
                                                         abs=1e-4)


def test_a_checkpoint_from_before_the_real_held_weights(run_copy, tiny_data_dir):
    """A checkpoint with neuralop's complex `.weight.tensor` entries (before issue 33) is scored
    with the same numbers as the same weights held as real parameters."""
    real, _ = evaluation_of(run_copy, "--data-dir", tiny_data_dir)
    state = torch.load(run_copy / "checkpoint.pt", weights_only=True)
    suffix = ".weight.as_real"
    old = {(key[:-len(suffix)] + ".weight.tensor" if key.endswith(suffix) else key):
           (torch.view_as_complex(value) if key.endswith(suffix) else value)
           for key, value in state["model"].items()}
    assert any(value.is_complex() for value in old.values())
    torch.save({**state, "model": old}, run_copy / "checkpoint.pt")
    complex_held, _ = evaluation_of(run_copy, "--data-dir", tiny_data_dir)
    assert complex_held["spectral_weights"] == "complex (before issue 33)"
    for name in ("model", "persistence"):
        assert complex_held[name]["per_step"] == pytest.approx(real[name]["per_step"], rel=1e-6)


def damage(case, run, data_copy):
    """Make `run` (or the data) a bad input of kind `case`; the --run to pass, and its options."""
    options = ["--data-dir", data_copy]
    if case == "missing":
        return run / "nowhere", options
    if case == "file":
        return run / "metrics.json", options
    if case == "not a run":
        (run / "metrics.json").unlink()
    elif case == "no config":
        (run / "metrics.json").write_text(json.dumps({"rollout_vrmse": [0.1]}))
    elif case == "no checkpoint":
        (run / "checkpoint.pt").unlink()
    elif case == "damaged checkpoint":
        blob = (run / "checkpoint.pt").read_bytes()
        (run / "checkpoint.pt").write_bytes(blob[:len(blob) // 2])
    elif case == "other settings":
        metrics = json.loads((run / "metrics.json").read_text())
        metrics["config"]["width"] = 16
        (run / "metrics.json").write_text(json.dumps(metrics))
    elif case == "other data":
        stats_path = data_copy / "datasets" / "gray_scott_embedded" / "stats.yaml"
        stats = yaml.safe_load(stats_path.read_text())
        stats["std_delta"] = {field: 2 * value for field, value in stats["std_delta"].items()}
        stats_path.write_text(yaml.safe_dump(stats))
    elif case == "no dataset":
        options = ["--data-dir", data_copy / "empty"]
    return run, options


@pytest.mark.parametrize("case,said", [
    ("missing", "does not exist"), ("file", "is a file, not a folder"),
    ("not a run", "no metrics.json"), ("no config", "has no config"),
    ("no checkpoint", "no checkpoint.pt"), ("damaged checkpoint", "is damaged"),
    ("other settings", "does not fit the model"), ("other data", "trained on other data"),
    ("no dataset", "gray_scott_embedded is not in --data-dir")])
def test_bad_input_is_one_line_and_writes_nothing(run_copy, tiny_data_copy, case, said):
    run, options = damage(case, run_copy, tiny_data_copy)
    before = sorted(p.name for p in run_copy.iterdir())
    result = exit_of(evaluate, "--run", run, *options)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert said in lines[0]
    assert sorted(p.name for p in run_copy.iterdir()) == before  # no evaluation.json, no temp file
    assert not (tiny_data_copy / "empty").exists()  # the embedded dataset is not generated there


def test_the_module_runs_as_a_program(tmp_path):
    result = run_script("-m", "wellfno.evaluate", "--run", tmp_path / "nowhere")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --run {tmp_path / 'nowhere'} does not exist: pass the --out folder of a training "
        "run"]
