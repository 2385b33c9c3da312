"""Long rollouts, measured: each training variant of solution 14 and today's fno.py, several seeds.

    python solutions/14_long_rollouts/compare.py                  # every variant, seeds 0 1 2
    python solutions/14_long_rollouts/compare.py --variants fno.py unrolled-4 --seeds 0
    python solutions/14_long_rollouts/compare.py --device cuda    # a GPU node: one run at a time
    sbatch slurm/14_long_rollouts.sbatch                          # a job array: a run per task
    python solutions/14_long_rollouts/compare.py --collect --out RUN_DIR  # then its table, figure

Every (variant, seed) is a whole training run (fno.py, or solutions/14_long_rollouts/fno.py with
the variant's flags, --epochs E), then `python -m wellfno.evaluate` on its checkpoint: The Well's
VRMSE over every validation trajectory, every rollout step, beside persistence (the last input
frame, repeated). The cost per sample comes from the run's own metrics.json: samples/s (timed
steps), FLOPs per sample (a training step's: K forwards and backwards), peak memory (the GPU
allocator's, or the process's maximum RSS on a CPU, which counts the whole process).

On a CPU the runs go --jobs at a time (default: one per core, one thread each: the quality numbers
are those of any thread count up to float32 rounding; samples/s is one thread's, all variants alike,
measured side by side). On a GPU, one run at a time.

`--run-index I` trains and scores only the I-th run of the list (variants in order, each with
every seed: I = variant index x seeds + seed index), into OUT/<variant>/seed<S>: one task of
slurm/14_long_rollouts.sbatch's job array. `--collect` trains nothing: it reads the runs already
in OUT (those of the array) and writes what follows.

Writes OUT/compare.json (a results file: the command, the machine, every run's numbers and
command) and OUT/compare.png (VRMSE against rollout step, one curve per variant, persistence);
--results PATH writes the JSON there too (results/14_long_rollouts.json, which
exercises/14_long_rollouts/README.md quotes).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchtools.machine import describe
from benchtools.resultfiles import read_result, write_result
from wellfno import data, plots
from wellfno.cli import UserError, check_output_dir, run_main

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SOLUTION, BASELINE = HERE / "fno.py", REPO / "fno.py"
# name: (script, its flags). "fno.py" is today's baseline; "one-step" is solution 14 trained as
# solution 13 trains (no noise, one step); the others are wellfno.unrolled's variants.
VARIANTS = {
    "fno.py": (BASELINE, ()),
    "one-step": (SOLUTION, ("--input-noise", "0")),
    "noise-0.1": (SOLUTION, ()),  # the solution's defaults: --input-noise 0.1 --rollout-steps 1
    "unrolled-4": (SOLUTION, ("--rollout-steps", "4", "--input-noise", "0")),
    "pushforward-4": (SOLUTION, ("--rollout-steps", "4", "--pushforward", "--input-noise", "0")),
    "noise+unrolled-4": (SOLUTION, ("--rollout-steps", "4")),
}
DEFAULT = "noise-0.1"  # what solution 14 trains without flags (tests: its parser's defaults)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=4, help="every run's --epochs (fno.py's default)")
    p.add_argument("--dataset", default=data.EMBEDDED)
    p.add_argument("--data-dir", default=os.environ.get("WELL_DATA", "data"))
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--jobs", type=int, default=None,
                   help="runs at a time (CPU default: one per core, one thread each; GPU: 1)")
    p.add_argument("--out", default="runs/compare14")
    p.add_argument("--results", help="also write compare.json to this path "
                   "(results/14_long_rollouts.json)")
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
    check_output_dir(args.out)
    if args.results:
        check_output_dir(Path(args.results).parent, "--results")
    return args


def on_cpu(device: str) -> bool:
    import torch

    return device == "cpu" or (device == "auto" and not torch.cuda.is_available())


def run_commands(args, variant: str, seed: int, out: Path) -> list[list[str]]:
    """The training run's command and the evaluation's, for one variant and seed."""
    script, flags = VARIANTS[variant]
    train = [sys.executable, str(script), "--data-dir", args.data_dir, "--dataset", args.dataset,
             "--epochs", str(args.epochs), "--seed", str(seed), "--out", str(out), *flags]
    if args.device != "auto":
        train += ["--device", args.device]
    if script == SOLUTION and on_cpu(args.device):
        train += ["--bind", "none"]  # the jobs share the cores; each is given its threads below
    evaluate = [sys.executable, "-m", "wellfno.evaluate", "--run", str(out), "--data-dir",
                args.data_dir]
    if args.device != "auto":
        evaluate += ["--device", args.device]
    return [train, evaluate]


def run_all(args, runs: list[tuple[str, int, Path]], jobs: int, threads: int) -> None:
    """Every run's two commands in turn, `jobs` runs at a time; a failed one stops all with its
    log's last line."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    pending = [(variant, seed, out, run_commands(args, variant, seed, out))
               for variant, seed, out in runs]
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


def read_run(out: Path) -> dict:
    """One run's numbers: its evaluation (The Well's VRMSE) and its metrics.json's costs."""
    metrics = json.loads((out / "metrics.json").read_text())
    report = json.loads((out / "evaluation.json").read_text())
    model, persistence = report["model"], report["persistence"]
    ratios = [m / p for m, p in zip(model["per_step"], persistence["per_step"])]
    return dict(whole_trajectory=model["whole_trajectory"], per_step=model["per_step"],
                step_1=model["per_step"][0], worst_step_over_persistence=max(ratios),
                worst_step=ratios.index(max(ratios)) + 1,
                paper_windows={w["window"]: w["vrmse"] for w in model["paper_windows"]},
                persistence_per_step=persistence["per_step"],
                persistence_whole_trajectory=persistence["whole_trajectory"],
                samples_per_second=metrics.get("samples_per_second"),
                flops_per_sample=metrics.get("flops_per_sample"),
                peak_memory_bytes=metrics.get("peak_memory_bytes"),
                peak_memory_of=metrics.get("peak_memory_of"),
                steps=report["steps"], trajectories=report["trajectories"])


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarize(variants: dict) -> dict:
    """Per variant: the mean over seeds of each number, and the worst seed's figures."""
    out = {}
    for name, runs in variants.items():
        curves = [r["per_step"] for r in runs]
        out[name] = dict(
            whole_trajectory=mean([r["whole_trajectory"] for r in runs]),
            whole_trajectory_by_seed=[r["whole_trajectory"] for r in runs],
            step_1=mean([r["step_1"] for r in runs]),
            worst_step_over_persistence=max(r["worst_step_over_persistence"] for r in runs),
            per_step=[mean(step) for step in zip(*curves)],
            samples_per_second=mean([r["samples_per_second"] for r in runs]),
            flops_per_sample=mean([r["flops_per_sample"] for r in runs]),
            peak_memory_bytes=mean([r["peak_memory_bytes"] for r in runs]))
    return out


def verdict(summary: dict, persistence: float, chosen: str) -> dict | None:
    """Issue 36's conditions on the chosen variant, against fno.py and persistence (None where
    either was not measured)."""
    if chosen not in summary or "fno.py" not in summary:
        return None
    mine, today = summary[chosen], summary["fno.py"]
    return dict(
        variant=chosen,
        below_persistence_every_seed=all(v < persistence for v in mine["whole_trajectory_by_seed"]),
        below_fno_py=mine["whole_trajectory"] < today["whole_trajectory"],
        no_step_above_1_5x_persistence=mine["worst_step_over_persistence"] <= 1.5,
        step_1_within_10_percent=mine["step_1"] <= 1.1 * today["step_1"],
        step_1_ratio=mine["step_1"] / today["step_1"])


def table(summary: dict, persistence: float, steps: int) -> str:
    lines = [f"{'variant':<18}{'all ' + str(steps) + ' steps':>13}{'by seed':>22}{'step 1':>9}"
             f"{'worst/pers.':>12}{'samples/s':>11}{'MFLOP/sample':>14}{'peak MB':>9}"]
    for name, s in summary.items():
        seeds = "/".join(f"{v:.3f}" for v in s["whole_trajectory_by_seed"])
        flops = f"{s['flops_per_sample'] / 1e6:.0f}" if s["flops_per_sample"] else "-"
        memory = f"{s['peak_memory_bytes'] / 1e6:.0f}" if s["peak_memory_bytes"] else "-"
        rate = f"{s['samples_per_second']:.1f}" if s["samples_per_second"] else "-"
        lines.append(f"{name:<18}{s['whole_trajectory']:>13.4f}{seeds:>22}{s['step_1']:>9.4f}"
                     f"{s['worst_step_over_persistence']:>12.2f}{rate:>11}{flops:>14}{memory:>9}")
    lines.append(f"{'persistence':<18}{persistence:>13.4f}")
    return "\n".join(lines)


def figure(summary: dict, persistence_curve: list, path: Path, title: str) -> None:
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    steps = range(1, len(persistence_curve) + 1)
    for name, s in summary.items():
        ax.plot(steps, s["per_step"], label=f"{name} ({s['whole_trajectory']:.3f})",
                linewidth=2.5 if name == DEFAULT else 1.3)
    ax.plot(steps, persistence_curve, "k--", label=f"persistence ({mean(persistence_curve):.3f})")
    ax.set_yscale("log")
    ax.set_xlabel("rollout step")
    ax.set_ylabel("VRMSE (The Well's; mean over seeds)")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=8, title="variant (mean over all steps)", title_fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    plots.save_png(fig, path)


def figure_title(result: dict) -> str:
    d = result["data"]
    return (f"{d['dataset']}, {d['trajectories']} validation trajectories, seeds "
            f"{'/'.join(map(str, d['seeds']))}, {d['epochs']} epochs\n"
            f"{describe(result['machine'])}")


def main(argv=None):
    args = parse_args(argv)
    data.open_dataset(args.data_dir, args.dataset)  # generated (embedded) or refused, first
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
    results = {variant: [dict(seed=seed, **read_run(path)) for v, seed, path in runs
                         if v == variant] for variant in args.variants}
    first = next(iter(results.values()))[0]
    persistence_curve = first["persistence_per_step"]
    persistence = first["persistence_whole_trajectory"]
    for variant_runs in results.values():
        for r in variant_runs:  # one validation set, one persistence
            assert r.pop("persistence_per_step") == persistence_curve
            r.pop("persistence_whole_trajectory")
    summary = summarize(results)
    check = verdict(summary, persistence, DEFAULT)
    command = "python solutions/14_long_rollouts/compare.py " + shlex.join(
        argv if argv is not None else sys.argv[1:])
    payload = dict(dataset=args.dataset, epochs=args.epochs, seeds=args.seeds, jobs=jobs,
                   threads_per_run=threads if cpu else None, steps=first["steps"],
                   trajectories=first["trajectories"], default_variant=DEFAULT,
                   variants={v: dict(flags=list(VARIANTS[v][1]),
                                     script=str(VARIANTS[v][0].relative_to(REPO)))
                             for v in args.variants},
                   persistence=dict(whole_trajectory=persistence, per_step=persistence_curve),
                   summary=summary, runs=results, verdict=check,
                   seconds=None if args.collect else time.monotonic() - started,
                   commands={f"{v} seed {s}": [shlex.join(c) for c in run_commands(args, v, s, p)]
                             for v, s, p in runs})
    written = write_result(out / "compare.json", command, payload)
    result = read_result(written)
    figure(summary, persistence_curve, out / "compare.png", figure_title(result))
    if args.results:  # the results file, and its figure beside it (results/14_long_rollouts.png)
        figure(summary, persistence_curve, Path(args.results).with_suffix(".png"),
               figure_title(read_result(write_result(args.results, command, payload))))
    print(table(summary, persistence, first["steps"]))
    if check:
        print("issue 36's conditions on " + DEFAULT + ": " + ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {'yes' if v else 'NO'}"
            for k, v in check.items() if k != "variant"))
    print(f"Wrote {out / 'compare.json'}, {out / 'compare.png'}"
          + (f", {args.results}" if args.results else ""))


if __name__ == "__main__":
    run_main(main)
