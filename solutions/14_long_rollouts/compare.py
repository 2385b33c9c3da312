"""Long rollouts, measured: solution 14's training variants over several seeds, and the rule's pick.

    python solutions/14_long_rollouts/compare.py                  # the measured variants, seeds 0-4
    python solutions/14_long_rollouts/compare.py --variants one-step unrolled-4 --seeds 0
    python solutions/14_long_rollouts/compare.py --device cuda    # a GPU node: one run at a time
    sbatch slurm/14_long_rollouts.sbatch                          # a job array: a run per task
    python solutions/14_long_rollouts/compare.py --collect --out RUN_DIR  # then its table, figure

Every (variant, seed) is a whole training run (solution 14 with the variant's flags, or fno.py),
then `python -m wellfno.evaluate --context C` on its checkpoint: The Well's VRMSE over every
validation trajectory, every rollout step from frame C on (default 4, The Well's input length),
so that runs that see 1 or 4 input frames are scored on the same frames, beside persistence (the
last input frame, repeated) and the mean field (each field's spatial mean of the true frame: what
VRMSE calls 1). Per variant: the mean over the seeds and its 95 % interval, per step and over The
Well's windows (1, 2, 3:5, 6:12, 13:30) and the whole trajectory; the paired difference to
one-step (no remedy, the same seeds); the step from which it is behind persistence; and its cost
from the run's metrics.json: samples/s (timed steps), FLOPs per sample (K forwards and backwards)
and per run, peak memory (the GPU allocator's, or the process's maximum RSS on a CPU).
Then the verdict of the rule in exercises/14_long_rollouts/background.md (`rule` below).

On a CPU the runs go --jobs at a time (default: one per core, one thread each; the quality numbers
are those of any thread count up to float32 rounding; samples/s is one thread's, all variants
alike, side by side). On a GPU, one run at a time.

`--run-index I` trains and scores only the I-th run of the list (variants in order, each with
every seed: I = variant index x seeds + seed index), into OUT/<variant>/seed<S>: one task of
slurm/14_long_rollouts.sbatch's job array. `--collect` trains nothing: it reads the runs already
in OUT (those of the array) and writes what follows.

Writes OUT/compare.json (a results file: the command, the machine, every run's numbers and
command, the summary, the verdict) and OUT/compare.png (VRMSE against rollout step: each variant's
mean over the seeds and their range, persistence, the mean field); --results PATH writes both
there too (results/14_long_rollouts.json, which exercise 14's background quotes).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchtools.machine import describe
from benchtools.resultfiles import read_result, write_result
from wellfno import data, plots, rollout
from wellfno.cli import UserError, check_output_dir, run_main

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SOLUTION, BASELINE = HERE / "fno.py", REPO / "fno.py"
# name: (script, its flags). "fno.py" is today's baseline; "one-step" is solution 14 trained as
# solution 13 trains (no noise, one step, one input frame): the reference of the rule; the others
# are one change each from it. Solution 14's default is the rule's pick on
# results/14_long_rollouts.json: no remedy passed it (one-step), so each remedy is a flag.
VARIANTS = {
    "fno.py": (BASELINE, ()),
    "one-step": (SOLUTION, ("--input-noise", "0")),
    "noise-0.1": (SOLUTION, ("--input-noise", "0.1")),  # one step on noisy inputs
    "input-4": (SOLUTION, ("--n-steps-input", "4", "--input-noise", "0")),  # The Well's 4 frames
    "one-step-long": (SOLUTION, ("--input-noise", "0")),  # EPOCH_FACTOR: unrolled-4's FLOPs
    "unrolled-4": (SOLUTION, ("--rollout-steps", "4", "--input-noise", "0")),
    "pushforward-4": (SOLUTION, ("--rollout-steps", "4", "--pushforward", "--input-noise", "0")),
    "noise+unrolled-4": (SOLUTION, ("--rollout-steps", "4")),
}
# one-step-long trains as many FLOPs as unrolled-4 does in --epochs: unrolled-4 reads 36 windows
# of each 40-frame trajectory at 409 MFLOP per sample (K = 4), one-step 39 at 102 (make data's set,
# both counts from wellfno.unrolled), so 4 epochs of unrolled-4 are 4 x 36 x 409 / (39 x 102) =
# 14.8 of one-step: 15 (each run's total FLOPs are in the table, so the match is checked).
EPOCH_FACTOR = {"one-step-long": 15 / 4}
# What `make results` measures: 5 variants x 5 seeds fit about 35 minutes on 2 idle cores. Left
# out, runnable by name: fno.py (one-step's training but for the sample order), pushforward-4 and
# noise+unrolled-4 (unrolled-4's cost or step-1 price, in the earlier 3-seed measurements).
MEASURED = ("one-step", "noise-0.1", "input-4", "unrolled-4", "one-step-long")
REFERENCE = "one-step"  # the rule's no-remedy variant
DEFAULT = "one-step"  # what solution 14 trains without flags (tests: its parser's defaults)
WINDOWS = [label for label, _, _ in rollout.PAPER_WINDOWS] + ["all"]
SAME_COST = 1.10  # the rule: training FLOPs within 10 % of the cheapest count as the same cost
# Student's t, two-sided 95 % (the 0.975 quantile), for 1 to 30 degrees of freedom (scipy's
# t.ppf(0.975, df) to 3 decimals; tests/test_14_compare.py checks them against it).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060,
        2.056, 2.052, 2.048, 2.045, 2.042)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(MEASURED),
                   help=f"default: {' '.join(MEASURED)}")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--epochs", type=int, default=4,
                   help="every run's --epochs (fno.py's default; one-step-long: 15/4 of it)")
    p.add_argument("--context", type=int, default=4,
                   help="score every run from this frame on (wellfno.evaluate --context; at least "
                   "every variant's --n-steps-input)")
    p.add_argument("--dataset", default=data.EMBEDDED)
    p.add_argument("--data-dir", default=os.environ.get("WELL_DATA", "data"))
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--jobs", type=int, default=None,
                   help="runs at a time (CPU default: one per core, one thread each; GPU: 1)")
    p.add_argument("--out", default="runs/compare14")
    p.add_argument("--results", help="also write compare.json (and its figure beside it) to this "
                   "path (results/14_long_rollouts.json)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--run-index", type=int, help="train and score only this run of the list "
                      "(a job array's task: $SLURM_ARRAY_TASK_ID)")
    mode.add_argument("--collect", action="store_true",
                      help="train nothing: summarize the runs already in --out")
    args = p.parse_args(argv)
    runs = len(args.variants) * len(args.seeds)
    if args.run_index is not None and not 0 <= args.run_index < runs:
        raise UserError(f"--run-index {args.run_index}: there are {runs} runs "
                        f"({len(args.variants)} variants x {len(args.seeds)} seeds), 0 to "
                        f"{runs - 1}")
    if args.epochs < 1 or (args.jobs is not None and args.jobs < 1):
        raise UserError("--epochs and --jobs must be at least 1")
    if min(args.seeds) < 0 or len(set(args.seeds)) < len(args.seeds):
        raise UserError("--seeds must be different numbers, 0 or more")
    if len(set(args.variants)) < len(args.variants):
        raise UserError("--variants must be different names")
    frames = max(n_steps_input(v) for v in args.variants)
    if args.context < frames:
        raise UserError(f"--context {args.context}: a variant sees {frames} input frames, so every "
                        f"run is scored from frame {frames} on at the earliest: pass --context "
                        f"{frames} or more")
    check_output_dir(args.out)
    if args.results:
        check_output_dir(Path(args.results).parent, "--results")
    return args


def n_steps_input(variant: str) -> int:
    flags = VARIANTS[variant][1]
    return int(flags[flags.index("--n-steps-input") + 1]) if "--n-steps-input" in flags else 1


def epochs_of(variant: str, epochs: int) -> int:
    return max(1, round(epochs * EPOCH_FACTOR.get(variant, 1)))


def on_cpu(device: str) -> bool:
    import torch

    return device == "cpu" or (device == "auto" and not torch.cuda.is_available())


def run_commands(args, variant: str, seed: int, out: Path) -> list[list[str]]:
    """The training run's command and the evaluation's, for one variant and seed."""
    script, flags = VARIANTS[variant]
    train = [sys.executable, str(script), "--data-dir", args.data_dir, "--dataset", args.dataset,
             "--epochs", str(epochs_of(variant, args.epochs)), "--seed", str(seed), "--out",
             str(out), *flags]
    if args.device != "auto":
        train += ["--device", args.device]
    if script == SOLUTION and on_cpu(args.device):
        train += ["--bind", "none"]  # the jobs share the cores; each is given its threads below
    evaluate = [sys.executable, "-m", "wellfno.evaluate", "--run", str(out), "--data-dir",
                args.data_dir, "--context", str(args.context)]
    if args.device != "auto":
        evaluate += ["--device", args.device]
    return [train, evaluate]


def expected_cost(variant: str) -> float:
    """A run's time relative to one-step's (the FLOPs ratios above): longest runs start first, so
    that two at a time finish together."""
    flags = VARIANTS[variant][1]
    k = int(flags[flags.index("--rollout-steps") + 1]) if "--rollout-steps" in flags else 1
    per_sample = (1 + (k - 1) / 2) if "--pushforward" in flags else k
    return per_sample * EPOCH_FACTOR.get(variant, 1)


def run_all(args, runs: list[tuple[str, int, Path]], jobs: int, threads: int) -> None:
    """Every run's two commands in turn, `jobs` runs at a time; a failed one stops all with its
    log's last line."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    pending = sorted([(variant, seed, out, run_commands(args, variant, seed, out))
                      for variant, seed, out in runs], key=lambda r: -expected_cost(r[0]))
    running = []
    while pending or running:
        while pending and len(running) < jobs:
            variant, seed, out, commands = pending.pop(0)
            out.mkdir(parents=True, exist_ok=True)
            log = open(out / "compare.log", "w")
            script = " && ".join(shlex.join(c) for c in commands)
            print(f"start {variant} seed {seed}: {script}", flush=True)
            process = subprocess.Popen(["bash", "-c", script], stdout=log, stderr=subprocess.STDOUT,
                                       env=env, cwd=REPO)
            running.append((variant, seed, out, process, log, time.monotonic()))
        time.sleep(1)
        for item in list(running):
            variant, seed, out, process, log, started = item
            if process.poll() is None and time.monotonic() - started < args.timeout:
                continue
            if process.poll() is None:
                process.kill()
            log.close()
            running.remove(item)
            if process.returncode != 0:
                for _, _, _, other, other_log, _ in running:
                    other.kill()
                    other_log.close()
                lines = (out / "compare.log").read_text().strip().splitlines() or ["(no output)"]
                raise UserError(f"{variant} seed {seed} failed: {lines[-1][:300]} (whole log: "
                                f"{out / 'compare.log'})")
            print(f"done  {variant} seed {seed} ({time.monotonic() - started:.0f} s)", flush=True)


# --------------------------------------------------------------------------- statistics
def t975(df: int) -> float:
    """Student's t 0.975 quantile: the table to 30 degrees of freedom, then Cornish-Fisher's
    expansion (within 1e-3 of the exact value from 30 on)."""
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def interval(values: list[float]) -> dict:
    """Mean over seeds, sample standard deviation, the 95 % interval's half-width of the mean
    (t * s / sqrt(n), n - 1 degrees of freedom; None for one seed), the range, every value."""
    n = len(values)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    half = t975(n - 1) * sd / math.sqrt(n) if n > 1 else None
    return dict(mean=mean, sd=sd, half_width=half, min=min(values), max=max(values),
                values=list(values))


def behind_from(curve: list[float], baseline: list[float]) -> tuple[int | None, int | None]:
    """(first step, from 1, where curve is above baseline; the step from which it stays above to
    the last step): None where there is none."""
    above = [c > b for c, b in zip(curve, baseline)]
    first = above.index(True) + 1 if True in above else None
    stays = None
    for k in range(len(above), 0, -1):
        if not above[k - 1]:
            break
        stays = k
    return first, stays


def summarize(variants: dict, persistence: list[float], mean_field: list[float],
              reference: str = REFERENCE) -> dict:
    """Per variant: each window's interval over seeds, the mean curve and its range, where it
    falls behind persistence (its mean curve, and each seed's), the paired difference to the
    reference (same seeds), the cost."""
    out = {}
    for name, runs in variants.items():
        curves = [r["per_step"] for r in runs]
        mean_curve = [math.fsum(step) / len(step) for step in zip(*curves)]
        first, stays = behind_from(mean_curve, persistence)
        windows = {w: interval([r["windows"][w] for r in runs]) for w in WINDOWS
                   if all(w in r["windows"] for r in runs)}
        costs = {key: [r[key] for r in runs if r[key] is not None] for key in (
            "samples_per_second", "flops_per_sample", "peak_memory_bytes", "training_flops")}
        out[name] = dict(
            windows=windows, per_step=mean_curve,
            per_step_min=[min(step) for step in zip(*curves)],
            per_step_max=[max(step) for step in zip(*curves)],
            whole_trajectory=windows["all"]["mean"],
            whole_trajectory_by_seed=windows["all"]["values"], step_1=windows["1"]["mean"],
            worst_step_over_persistence=max(r["worst_step_over_persistence"] for r in runs),
            behind_persistence_from=first, stays_behind_persistence_from=stays,
            behind_persistence_from_by_seed=[behind_from(c, persistence)[0] for c in curves],
            above_mean_field_from=behind_from(mean_curve, mean_field)[0],
            epochs=runs[0]["epochs"], training_samples=runs[0]["training_samples"],
            **{key: (math.fsum(v) / len(v) if v else None) for key, v in costs.items()})
    if reference in variants:
        by_seed = {r["seed"]: r for r in variants[reference]}
        for name, runs in variants.items():
            if name != reference and all(r["seed"] in by_seed for r in runs):
                out[name]["vs_reference"] = {
                    w: interval([r["windows"][w] - by_seed[r["seed"]]["windows"][w] for r in runs])
                    for w in out[name]["windows"] if w in out[reference]["windows"]}
    return out


def rule(summary: dict, reference: str = REFERENCE) -> dict:
    """The rule of exercises/14_long_rollouts/background.md ("The rule that picks the default"),
    applied to the summary: every variant's three conditions against the reference, and the pick."""
    why = (f"{reference} was not measured" if reference not in summary else
           "it needs at least 2 seeds" if len(summary[reference]["windows"]["all"]["values"]) < 2
           else None)
    if why:
        return dict(reference=reference, chosen=None, why=why, checks={})
    ref = summary[reference]
    checks = {}
    for name, s in summary.items():
        if name in (reference, "fno.py") or "vs_reference" not in s:
            continue  # fno.py: the baseline, not a remedy (and it counts no FLOPs)
        diff = s["vs_reference"]["all"]
        limit = ref["windows"]["1"]["max"]
        mine, theirs = s["behind_persistence_from"], ref["behind_persistence_from"]
        check = dict(
            whole_difference=diff["mean"], whole_difference_half_width=diff["half_width"],
            lower=diff["mean"] + diff["half_width"] < 0,
            step_1=s["windows"]["1"]["mean"], step_1_limit=limit,
            step_1_ok=s["windows"]["1"]["mean"] <= limit,
            behind_from=mine, reference_behind_from=theirs,
            not_earlier=theirs is None and mine is None or (
                theirs is not None and (mine is None or mine >= theirs)),
            training_flops=s["training_flops"])
        check["passes"] = check["lower"] and check["step_1_ok"] and check["not_earlier"]
        checks[name] = check
    passing = [n for n, c in checks.items() if c["passes"]]
    chosen = reference
    if passing:
        cost = {n: checks[n]["training_flops"] or math.inf for n in passing}
        cheapest = min(cost.values())
        chosen = min((n for n in passing if cost[n] <= SAME_COST * cheapest),
                     key=lambda n: summary[n]["whole_trajectory"])
    return dict(reference=reference, chosen=chosen, remedy=bool(passing), passing=passing,
                checks=checks, solution_default=DEFAULT, agrees=chosen == DEFAULT, why=None)


def verdict_lines(verdict: dict, steps: int) -> list[str]:
    """The rule's verdict as printed (background.md's rule, its conditions by name)."""
    ref = verdict["reference"]
    head = ("the default's rule (exercises/14_long_rollouts/background.md: lower over all steps "
            f"than {ref} by more than the 95 % interval of the paired difference, step 1 at most "
            f"{ref}'s worst seed's, behind persistence no earlier than {ref})")
    if verdict["why"]:
        return [head, f"  no verdict: {verdict['why']}"]
    lines = [head]
    for name, c in verdict["checks"].items():
        behind = lambda k: "never" if k is None else f"step {k}"  # noqa: E731
        lines.append(
            f"  {name}: all {steps} steps {c['whole_difference']:+.3f} "
            f"+- {c['whole_difference_half_width']:.3f} ({'yes' if c['lower'] else 'NO'}); "
            f"step 1 {c['step_1']:.4f} vs at most {c['step_1_limit']:.4f} "
            f"({'yes' if c['step_1_ok'] else 'NO'}); behind persistence from "
            f"{behind(c['behind_from'])} vs {behind(c['reference_behind_from'])} "
            f"({'yes' if c['not_earlier'] else 'NO'}) -> {'passes' if c['passes'] else 'fails'}")
    said = (f"the cheapest that passes: {verdict['chosen']}" if verdict["remedy"] else
            f"none passes: no remedy ({ref})")
    lines.append(f"  verdict: {said}; solution 14's default is {DEFAULT} "
                 f"({'the same' if verdict['agrees'] else 'NOT the same'})")
    return lines


# --------------------------------------------------------------------------- runs and baselines
def read_run(out: Path) -> dict:
    """One run's numbers: its evaluation (The Well's VRMSE) and its metrics.json's costs."""
    metrics = json.loads((out / "metrics.json").read_text())
    report = json.loads((out / "evaluation.json").read_text())
    model, persistence = report["model"], report["persistence"]
    ratios = [m / p for m, p in zip(model["per_step"], persistence["per_step"])]
    samples = sum(h["samples"] for h in metrics["history"])
    flops = metrics.get("flops_per_sample")
    return dict(windows={**{w["window"]: w["vrmse"] for w in model["paper_windows"]},
                         "all": model["whole_trajectory"]},
                whole_trajectory=model["whole_trajectory"], per_step=model["per_step"],
                step_1=model["per_step"][0], worst_step_over_persistence=max(ratios),
                worst_step=ratios.index(max(ratios)) + 1,
                persistence_per_step=persistence["per_step"],
                persistence_windows={**{w["window"]: w["vrmse"]
                                        for w in persistence["paper_windows"]},
                                     "all": persistence["whole_trajectory"]},
                samples_per_second=metrics.get("samples_per_second"),
                flops_per_sample=flops, training_samples=samples,
                training_flops=flops * samples if flops else None,
                epochs=len(metrics["history"]),
                peak_memory_bytes=metrics.get("peak_memory_bytes"),
                peak_memory_of=metrics.get("peak_memory_of"), context=report.get("context"),
                steps=report["steps"], trajectories=report["trajectories"])


def mean_field_errors(dataset_dir: Path, context: int, steps: int) -> list:
    """The mean field's VRMSE (each field's spatial mean of the true frame, everywhere), per
    validation trajectory, scored by wellfno.evaluate's code on its frames: what VRMSE calls 1
    (sqrt((N - 1) / N) with the_well's sample variance, less where a field is flat against eps)."""
    trajectories = data.rollout_dataset(dataset_dir, context, "valid", max_rollout_steps=steps)
    errors = []
    for i in range(len(trajectories)):
        true = trajectories[i]["output_fields"].double()  # (steps, *spatial, F)
        space = tuple(range(1, true.ndim - 1))
        errors.append(rollout.well_vrmse(true.mean(dim=space, keepdim=True).expand_as(true), true,
                                         true.ndim - 2))
    return errors


def mean_field(dataset_dir: Path, context: int, steps: int) -> dict:
    curve = rollout.step_curve(mean_field_errors(dataset_dir, context, steps))[0]
    windows, _ = rollout.window_vrmse(curve, rollout.PAPER_WINDOWS, [])
    return dict(per_step=curve.mean(1).tolist(), whole_trajectory=curve.mean().item(),
                windows={**{w["window"]: w["vrmse"] for w in windows},
                         "all": curve.mean().item()})


# --------------------------------------------------------------------------- table and figure
def table(summary: dict, persistence: dict, field: dict, steps: int) -> str:
    windows = [w for w in WINDOWS if all(w in s["windows"] for s in summary.values())]
    heads = [("all " + str(steps)) if w == "all" else w for w in windows]
    lines = ["mean over seeds +- 95 % interval; behind: the first step its mean is above "
             "persistence's",
             f"{'variant':<17}" + "".join(f"{h:>16}" for h in heads)
             + f"{'behind':>7}{'samples/s':>10}{'MFLOP/sa':>9}{'TFLOP/run':>10}{'peak MB':>8}"]
    for name, s in summary.items():
        cells = "".join(f"{s['windows'][w]['mean']:>8.4f}" + (
            f" +-{s['windows'][w]['half_width']:.3f}" if s["windows"][w]["half_width"] is not None
            else " " * 7) for w in windows)
        number = lambda v, scale, fmt: "-" if v is None else format(v / scale, fmt)  # noqa: E731
        behind = s["behind_persistence_from"]
        lines.append(f"{name:<17}{cells}{'never' if behind is None else behind:>7}"
                     f"{number(s['samples_per_second'], 1, '.1f'):>10}"
                     f"{number(s['flops_per_sample'], 1e6, '.0f'):>9}"
                     f"{number(s['training_flops'], 1e12, '.2f'):>10}"
                     f"{number(s['peak_memory_bytes'], 1e6, '.0f'):>8}")
    for name, part in (("persistence", persistence), ("mean field", field)):
        lines.append(f"{name:<17}" + "".join(f"{part['windows'][w]:>8.4f}" + " " * 8
                                             for w in windows))
    return "\n".join(lines)


def figure(result: dict, path: Path) -> None:
    d = result["data"]
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    steps = range(1, d["steps"] + 1)
    for name, s in d["summary"].items():
        line, = ax.plot(steps, s["per_step"], label=f"{name} ({s['whole_trajectory']:.3f})",
                        linewidth=2.5 if name == DEFAULT else 1.3)
        ax.fill_between(steps, s["per_step_min"], s["per_step_max"], color=line.get_color(),
                        alpha=0.12, linewidth=0)
    for name, part, style in (("persistence", d["persistence"], "k--"),
                              ("mean field", d["mean_field"], "k:")):
        ax.plot(steps, part["per_step"], style, label=f"{name} ({part['whole_trajectory']:.3f})")
    ax.set_yscale("log")
    ax.set_xlabel(f"rollout step (after the first {d['context']} frames of each trajectory)")
    ax.set_ylabel("VRMSE (The Well's): mean over seeds, band: their range")
    machine = {k: v for k, v in result["machine"].items() if k != "torch_threads"}
    how = (f"{d['jobs']} run(s) at a time, {d['threads_per_run']} thread(s) each"
           if d.get("threads_per_run") else "finished runs collected (--collect)")
    longer = ", ".join(f"{v}: {spec['epochs']}" for v, spec in d["variants"].items()
                       if spec["epochs"] != d["epochs"])
    ax.set_title(f"{d['dataset']}, {d['trajectories']} validation trajectories, seeds "
                 f"{'/'.join(map(str, d['seeds']))}, {d['epochs']} epochs"
                 + (f" ({longer})" if longer else "") + f"\n{describe(machine)}; {how}",
                 fontsize=8)
    ax.legend(fontsize=8, title="variant (mean over all steps)", title_fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    plots.save_png(fig, path)


def main(argv=None):
    args = parse_args(argv)
    dataset_dir, _ = data.open_dataset(args.data_dir, args.dataset)  # generated or refused, first
    length = data.trajectory_length(dataset_dir, "valid")
    if args.context >= length:
        raise UserError(f"--context {args.context}: the valid trajectories of {args.dataset} have "
                        f"{length} frames, so at most --context {length - 1}")
    cpu = on_cpu(args.device)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    jobs = 1 if args.run_index is not None else args.jobs or (cores if cpu else 1)
    threads = max(1, cores // jobs) if cpu else int(os.environ.get("OMP_NUM_THREADS", "1"))
    out = Path(args.out)
    runs = [(variant, seed, out / variant / f"seed{seed}") for variant in args.variants
            for seed in args.seeds]
    started = time.monotonic()
    if args.run_index is not None:  # one task of the job array: its run, nothing more
        return run_all(args, [runs[args.run_index]], 1, threads)
    if args.collect:
        missing = [str(path) for _, _, path in runs if not (path / "evaluation.json").is_file()]
        if missing:
            raise UserError(f"--collect: {len(missing)} of {len(runs)} runs are not finished in "
                            f"{out} (first: {missing[0]}): wait for the job array, or run those")
    else:
        print(f"{len(runs)} runs ({len(args.variants)} variants x {len(args.seeds)} seeds), {jobs} "
              f"at a time" + (f", {threads} thread(s) each" if cpu else ""), flush=True)
        run_all(args, runs, jobs, threads)
        if cpu:  # the results file's machine says the threads each run had, not this process's
            import torch

            torch.set_num_threads(threads)
    results = {variant: [dict(seed=seed, **read_run(path)) for v, seed, path in runs
                         if v == variant] for variant in args.variants}
    first = next(iter(results.values()))[0]
    persistence = dict(per_step=first["persistence_per_step"],
                       windows=first["persistence_windows"],
                       whole_trajectory=first["persistence_windows"]["all"])
    for variant, variant_runs in results.items():
        for r in variant_runs:  # one validation set, scored from one frame: one persistence
            if (r.pop("persistence_per_step") != persistence["per_step"]
                    or r["context"] != args.context):
                raise UserError(f"{variant} seed {r['seed']} was scored on other frames than "
                                f"--context {args.context} gives: run wellfno.evaluate --context "
                                f"{args.context} on it again")
            r.pop("persistence_windows")
    field = mean_field(dataset_dir, args.context, first["steps"])
    summary = summarize(results, persistence["per_step"], field["per_step"])
    verdict = rule(summary)
    command = "python solutions/14_long_rollouts/compare.py " + shlex.join(
        argv if argv is not None else sys.argv[1:])
    steps = first["steps"]
    windows = [dict(window=label, first=a, last=min(b, steps), complete=b <= steps)
               for label, a, b in rollout.PAPER_WINDOWS if a <= steps]
    windows.append(dict(window="all", first=1, last=steps, complete=True))
    payload = dict(format=2, dataset=args.dataset, epochs=args.epochs, seeds=args.seeds,
                   context=args.context, windows=windows, jobs=None if args.collect else jobs,
                   threads_per_run=threads if cpu and not args.collect else None,
                   steps=first["steps"], trajectories=first["trajectories"],
                   default_variant=DEFAULT, reference=REFERENCE,
                   variants={v: dict(flags=list(VARIANTS[v][1]),
                                     epochs=epochs_of(v, args.epochs),
                                     script=str(VARIANTS[v][0].relative_to(REPO)))
                             for v in args.variants},
                   persistence=persistence, mean_field=field, summary=summary, runs=results,
                   verdict=verdict, seconds=None if args.collect else time.monotonic() - started,
                   commands={f"{v} seed {s}": [shlex.join(c) for c in run_commands(args, v, s, p)]
                             for v, s, p in runs})
    figure(read_result(write_result(out / "compare.json", command, payload)), out / "compare.png")
    if args.results:  # the results file, and its figure beside it (results/14_long_rollouts.png)
        figure(read_result(write_result(args.results, command, payload)),
               Path(args.results).with_suffix(".png"))
    print(table(summary, persistence, field, first["steps"]))
    print("\n".join(verdict_lines(verdict, first["steps"])))
    print(f"Wrote {out / 'compare.json'}, {out / 'compare.png'}"
          + (f", {args.results}" if args.results else ""))


if __name__ == "__main__":
    run_main(main)
