"""A training run's checkpoint evaluated as The Well reports it, over whole validation trajectories.

    python -m wellfno.evaluate --run runs/baseline [--data-dir data] [--device auto] [--context N]

Rebuilds the model from OUT/metrics.json's config and OUT/checkpoint.pt, rolls it out over every
validation trajectory as far as the trajectory goes, beside persistence (the last input frame,
repeated), and writes OUT/evaluation.json: The Well's VRMSE (`wellfno.rollout.well_vrmse`) per
rollout step and per field, over the Well paper's time windows (1, 2, 3:5, 6:12, 13:30) and the_well
trainer's for this rollout length, and over the whole trajectory; and prints one table of them.

`--context N` starts every rollout after the trajectory's first N frames (default: the run's
--n-steps-input) and gives the model the last --n-steps-input of them: runs that see different
numbers of frames are then scored on the same frames, beside the same persistence.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from wellfno import data, memory, rollout
from wellfno.cli import UserError, atomic_write_json, check_output_dir, load_checkpoint, run_main
from wellfno.device import DEVICE_CHOICES, pick_device
from wellfno.model import NextFrameFNO, channel_stats

SPLIT = "valid"
CONFIG_KEYS = ("data_dir", "dataset", "n_steps_input", "width", "modes")  # what rebuilds the model


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m wellfno.evaluate",
                                description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True,
                   help="a finished training run's --out folder (checkpoint.pt, metrics.json)")
    p.add_argument("--data-dir", default=None,
                   help="the folder that holds datasets/ (default: the run's own --data-dir, "
                   "as metrics.json has it: a relative one from the folder it was run in)")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    p.add_argument("--context", type=int, default=None,
                   help="start every rollout after this many frames (default: the run's "
                   "--n-steps-input), the model given the last --n-steps-input of them: runs "
                   "with different --n-steps-input scored on the same frames")
    return p.parse_args(argv)


class LastFrames:
    """A rollout dataset whose samples keep only their last `n` input frames (`--context`): the
    targets, and persistence's last frame, stay those of the whole context."""

    def __init__(self, dataset, n: int):
        self.dataset, self.n = dataset, n

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        sample = dict(self.dataset[i])
        sample["input_fields"] = sample["input_fields"][-self.n:]
        return sample


def read_run(run: Path) -> tuple[dict, Path]:
    """(metrics.json's config, checkpoint path) of a finished run, or a UserError."""
    if not run.exists():
        raise UserError(f"--run {run} does not exist: pass the --out folder of a training run")
    if not run.is_dir():
        raise UserError(f"--run {run} is a file, not a folder: pass the --out folder of a "
                        "training run")
    metrics, checkpoint = run / "metrics.json", run / "checkpoint.pt"
    if not metrics.is_file():
        raise UserError(f"--run {run} has no metrics.json, so it is not a finished training run: "
                        "pass the --out of a run that finished (metrics.json is written last)")
    try:
        config = json.loads(metrics.read_text()).get("config")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        config = None
    missing = [key for key in CONFIG_KEYS if not isinstance(config, dict) or key not in config]
    if missing:
        raise UserError(f"{metrics} has no config {', '.join(missing)}: it was not written by the "
                        "course's fno.py or a solution; pass the --out of one of their runs")
    if not checkpoint.is_file():
        raise UserError(f"--run {run} has no checkpoint.pt: pass the --out of a run that trained "
                        "at least one epoch (a --profile run writes none)")
    return config, checkpoint


def load_model(checkpoint: Path, config: dict, dataset, stats: dict, dataset_dir: Path):
    """The run's model, its weights from the checkpoint; a UserError when they do not fit the
    dataset. Returns (model, how its spectral weights were stored)."""
    state = load_checkpoint(checkpoint, map_location="cpu")
    weights = state.get("model")
    if not isinstance(weights, dict):
        raise UserError(f"{checkpoint} holds no model weights: pass the --out of a training run")
    # A checkpoint from before the spectral weights were held as real parameters (issue 33) has
    # neuralop's complex `...weight.tensor`; real_weights=False builds that model (same numbers).
    complex_held = any(key.endswith(".weight.tensor") for key in weights)
    model = NextFrameFNO.for_dataset(dataset, config["n_steps_input"], stats,
                                     width=config["width"], modes=config["modes"],
                                     layers=config.get("layers", 4),  # --layers: solution 10 on
                                     real_weights=not complex_held)
    expected = {name: buffer.clone() for name, buffer in model.named_buffers()}
    try:
        model.load_state_dict(weights)
    except RuntimeError:  # missing, unexpected or other-shaped weights
        raise UserError(f"{checkpoint} does not fit the model {dataset_dir.name} and the run's "
                        f"metrics.json describe (width {config['width']}, modes "
                        f"{config['modes']}, --n-steps-input {config['n_steps_input']}): the "
                        "checkpoint was trained on other data or settings") from None
    # The one-step-change scale comes from the dataset's stats.yaml: another dataset's (or
    # another size's) would load without a shape error but score the wrong run.
    for name, buffer in model.named_buffers():
        if not torch.allclose(buffer, expected[name], rtol=1e-5, atol=1e-7):
            raise UserError(f"{checkpoint} was trained on other data than {dataset_dir} (its "
                            f"statistics differ): pass the --data-dir the run trained on "
                            f"({config['data_dir']})")
    return model, "complex (before issue 33)" if complex_held else "real (as_real)"


def table(report: dict, dataset: str) -> str:
    """The printed table: model and persistence (and the model per field), over the paper's
    windows and the whole trajectory."""
    windows = report["model"]["paper_windows"]
    heads = [w["window"] + ("" if w["complete"] else "*") for w in windows]
    heads.append(f"all {report['steps']}")
    lines = [f"The Well's VRMSE, {report['trajectories']} {SPLIT} trajectories of {dataset}, "
             f"{report['steps']} rollout steps (0 is perfect, 1 is as bad as the mean):",
             f"{'steps':<14}" + "".join(f"{h:>9}" for h in heads)]

    def row(label, values):
        lines.append(f"{label:<14}" + "".join(f"{v:>9.4f}" for v in values))

    for name in ("model", "persistence"):
        part = report[name]
        row(name, [w["vrmse"] for w in part["paper_windows"]] + [part["whole_trajectory"]])
    for field in report["fields"]:
        part = report["model"]
        row(f"model {field}", [w["per_field"][field] for w in part["paper_windows"]]
            + [part["whole_trajectory_per_field"][field]])
    for w in windows:
        if not w["complete"]:
            lines.append(f"{w['window']}*: steps {w['first']}-{w['last']} only (the rollout ends "
                         f"at step {report['steps']})")
    if report["paper_windows_left_out"]:
        lines.append(f"left out: {', '.join(report['paper_windows_left_out'])} (starting after "
                     f"the rollout's last step, {report['steps']})")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    run = Path(args.run)
    config, checkpoint = read_run(run)
    check_output_dir(run, "--run")  # writable, before anything is computed
    device = pick_device(args.device)
    data_dir = args.data_dir if args.data_dir is not None else config["data_dir"]
    # Refused here, where open_dataset would generate the embedded dataset: scoring a run on data
    # made for the purpose would write into --data-dir and score other trajectories.
    if not (data.locate(data_dir, config["dataset"]) / "data").is_dir():
        raise UserError(f"{config['dataset']} is not in --data-dir {data_dir}: pass the --data-dir "
                        f"the run trained on ({config['data_dir']})")
    dataset_dir, dataset_stats = data.open_dataset(data_dir, config["dataset"])
    n_steps_input = config["n_steps_input"]
    data.check_input_steps(dataset_dir, n_steps_input, (SPLIT,))
    context = n_steps_input if args.context is None else args.context
    length = data.trajectory_length(dataset_dir, SPLIT)
    if not n_steps_input <= context < length:
        raise UserError(f"--context {context}: the run's model sees {n_steps_input} frame(s) and "
                        f"the {SPLIT} trajectories have {length}: pass {n_steps_input} to "
                        f"{length - 1}")
    whole = length - context  # every step there is
    trajectories = data.rollout_dataset(dataset_dir, context, SPLIT, max_rollout_steps=whole)
    stats = channel_stats(dataset_stats, trajectories.core_field_names)
    model, weights = load_model(checkpoint, config, trajectories, stats, dataset_dir)
    model = model.to(device)
    # The true and predicted frames of one trajectory must fit (memory.rollout_steps): a dataset
    # whose trajectories do not is scored over the steps that fit, and says so.
    steps = memory.rollout_steps(model, device, wanted=whole)
    if steps < whole:
        print(f"note: {steps} of {whole} rollout steps fit in memory; scoring those")
        trajectories = data.rollout_dataset(dataset_dir, context, SPLIT, max_rollout_steps=steps)
    scored = trajectories if context == n_steps_input else LastFrames(trajectories, n_steps_input)
    model_errors, persistence_errors = rollout.trajectory_errors(model, scored, device)
    report = rollout.well_report(model_errors, persistence_errors,
                                 data.channel_names(trajectories))
    report = dict(
        run=str(run), checkpoint=str(checkpoint), dataset=str(dataset_dir), split=SPLIT,
        n_steps_input=n_steps_input, context=context, spectral_weights=weights, device=str(device),
        precision="float32 rollout, metric in float64",
        steps_left_out_for_memory=whole - len(report["trajectories_per_step"]),
        metric=("The Well's VRMSE (the_well/benchmark/metrics/spatial.py VRMSE: sample variance "
                "over space, eps 1e-7), per channel; a window's and the whole trajectory's value "
                "is the mean over its steps and the channels (the_well's 'full')"),
        **report)
    print(table(report, dataset_dir.name))
    out = atomic_write_json(run / "evaluation.json", report)
    print(f"Wrote {out}")


if __name__ == "__main__":
    run_main(main)
