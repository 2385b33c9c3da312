"""Exercises 08-11's table: one row per idea, each measured against the step it builds on.

    python solutions/11_compile/benchmark.py --data-dir data --out runs/ex11
    python solutions/11_compile/benchmark.py --data-dir $WELL_DATA --out runs/ex11_gpu \\
        --common "--num-workers 4 --pin-memory --fast-reader" --steps 200   # on a GPU node

Rows (each the solution of the step that adds the idea, against the row it builds on; not
cumulative, so each row's speed-up is that idea's own):
  NN baseline           --baseline, named after its step (default: 07, the step before 08):
                        loss.item() every step, float32, eager
  08 no host syncs      solutions/08_host_syncs/fno.py --log-every <more than the run>  (vs NN)
  09 mixed precision    solutions/09_mixed_precision/fno.py ... --amp bf16  (vs 08): bf16 where
                        the device has bf16 units, fp16 on a GPU without them; skipped, with the
                        reason, on a CPU without them (bf16 emulated there, fp16 too: slower)
  10 width W, batch B   solutions/10_mfu/fno.py ... --width W --batch-size B, float32  (vs 08, by
                        FLOP/s: more work per kernel, a bigger model, so samples/s do not compare)
  11 torch.compile      solutions/11_compile/fno.py ... --compile, float32  (vs 08: compile's own
                        effect, not on top of bf16; the compiling first step is timed apart)

For each: training samples/s (its metrics.json), FLOP/s = FLOPs per sample (wellfno.flops,
forward + backward) x samples/s, MFU against the device's peak for the precision in use,
and peak memory (device memory on a GPU; the process's max RSS on a CPU). Rows run round-robin,
`--repeats` rounds; each number is the best round (interference only slows a run down).
Writes OUT/efficiency.json (a results file: command, machine, rows) and OUT/efficiency.png;
the training runs themselves go to a temporary folder (--keep-runs DIR keeps them).
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from profiling.throughput import machine
from wellfno import data, flops
from wellfno.amp import check_amp
from wellfno.cli import UserError, run_main
from wellfno.device import pick_device
from wellfno.model import NextFrameFNO
from benchtools.resultfiles import write_result

REPO = Path(__file__).resolve().parents[2]
BASELINE = REPO / "solutions" / "07_failures" / "fno.py"  # the step before host syncs
NO_SYNCS = REPO / "solutions" / "08_host_syncs" / "fno.py"
AMP = REPO / "solutions" / "09_mixed_precision" / "fno.py"
MFU = REPO / "solutions" / "10_mfu" / "fno.py"
SOLUTION = REPO / "solutions" / "11_compile" / "fno.py"
DEFAULT_WIDTH, DEFAULT_BATCH = 32, 16  # fno.py's model and batch


def baseline_row(script: Path) -> str:
    """The first row's name, after its script (--baseline): "NN baseline" for a step's solution
    (solutions/NN_name/fno.py), else the file's name ("my_fno.py baseline")."""
    step = script.parent.name
    return f"{step[:2]} baseline" if re.fullmatch(r"\d\d_\w+", step) else f"{script.name} baseline"


BASELINE_ROW = baseline_row(BASELINE)  # the default first row's name


@dataclass
class Row:
    name: str
    script: Path
    options: list[str] = field(default_factory=list)
    against: int | None = None  # the row this one adds its idea to
    by: str = "samples/s"  # what the speed-up compares: samples/s, or FLOP/s for another model
    skipped: str | None = None  # why this device cannot show the idea (nothing is run)

    @property
    def amp(self) -> str:
        return self.options[self.options.index("--amp") + 1] if "--amp" in self.options else "none"


def mixed_precision(device: torch.device) -> tuple[str | None, str]:
    """(--amp of the mixed-precision row, why not bf16): bf16 where the device has bf16 units;
    else fp16 on a GPU (fp16 tensor cores, e.g. a V100), nothing on a CPU (no fp16 units either
    where bf16 is missing: both would be emulated, slower than float32)."""
    try:
        check_amp("bf16", device)  # the scripts' own check: bf16 units, and autocast for the device
        return "bf16", ""
    except UserError as refused:
        if device.type == "cuda":
            return "fp16", str(refused)
        return None, str(refused)


def rows_to_run(args, device: torch.device) -> list[Row]:
    no_syncs = ["--log-every", str(10 * args.steps)]  # never read back inside the timed steps
    baseline = Path(args.baseline)
    rows = [Row(baseline_row(baseline), baseline),
            Row("08 no host syncs", NO_SYNCS, no_syncs, against=0)]
    amp, why_not_bf16 = mixed_precision(device)
    if amp is None:
        rows.append(Row("09 mixed precision", AMP, no_syncs + ["--amp", "bf16"], against=1,
                        skipped=why_not_bf16.removeprefix("--amp bf16: ")))
    else:
        rows.append(Row(f"09 mixed precision ({amp})", AMP, no_syncs + ["--amp", amp], against=1))
    # Step 10 measures: a bigger model and batch, float32 and eager, against 08 by FLOP/s.
    rows.append(Row(f"10 width {args.width}, batch {args.batch_size}", MFU,
                    no_syncs + ["--width", str(args.width), "--batch-size", str(args.batch_size)],
                    against=1, by="FLOP/s"))
    if not args.no_compile:  # compile's own effect: float32, fno.py's size, against 08
        rows.append(Row("11 torch.compile", SOLUTION, no_syncs + ["--compile"], against=1))
    return rows


def flops_per_sample(dataset_dir: Path, width: int, batch_size: int) -> float:
    """FLOPs of one training sample of the FNO the scripts build, for the rows before 10 (their
    metrics lack them)."""
    splits = data.well_datasets(dataset_dir, 1)
    fields = len(data.channel_names(splits["train"]))
    grid = tuple(splits["train"][0]["input_fields"].shape[1:3])
    ones = torch.ones(fields)
    model = NextFrameFNO(fields, 1, dict(mean=0 * ones, std=ones, mean_delta=0 * ones,
                                         std_delta=ones), width=width)
    x = torch.zeros(batch_size, fields, *grid)
    return flops.training_flops_per_sample(model, x, x[:, :fields], model.loss)["per_sample"]


def run_row(args, script: Path, options: list[str], out: Path) -> dict:
    cmd = [sys.executable, str(script), "--data-dir", str(args.data_dir), "--dataset", args.dataset,
           "--out", str(out), "--epochs", "1000",
           "--max-steps", str(args.steps), "--seed", "0", "--device", args.device,
           *shlex.split(args.common), *options]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"`{shlex.join(cmd)}` failed: {last}")
    return json.loads((out / "metrics.json").read_text())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default="data", help="folder that holds datasets/")
    p.add_argument("--dataset", default=data.EMBEDDED,
                   help="embedded dataset (the default) or a Well dataset")
    p.add_argument("--out", default="runs/ex11",
                   help="output folder for efficiency.json and efficiency.png")
    p.add_argument("--keep-runs",
                   help="keep each training run's folder under this folder (default: a temporary "
                        "one)")
    p.add_argument("--steps", type=int, default=30, help="training steps per run (--max-steps)")
    p.add_argument("--repeats", type=int, default=3,
                   help="round-robin rounds; each number is the best round (default 3)")
    p.add_argument("--width", type=int, default=64, help="FNO width of the last row")
    p.add_argument("--batch-size", type=int, default=64, help="batch size of the last row")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile row")
    p.add_argument("--common", default="",
                   help="options given to every row, e.g. \"--num-workers 4 --fast-reader\"")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--baseline", default=str(BASELINE), help="the script of the first row")
    args = p.parse_args(argv)
    if min(args.steps, args.repeats, args.width, args.batch_size) < 1:
        raise UserError("--steps, --repeats, --width and --batch-size must be at least 1")
    if not Path(args.baseline).is_file():
        raise UserError(f"--baseline {args.baseline}: no such script ({BASELINE.relative_to(REPO)} "
                        "is the first row's script)")
    device = pick_device(args.device)
    dataset_dir = data.resolve_dataset(args.data_dir, args.dataset)
    out = Path(args.out)
    rows = rows_to_run(args, device)
    measured = [i for i, row in enumerate(rows) if row.skipped is None]
    info = machine(device)
    print(f"Measuring {len(measured)} rows x {args.repeats} rounds of {args.steps} steps on "
          f"{info.get('gpu', info['cpu'])}")
    for row in rows:
        if row.skipped:
            print(f"{row.name}: skipped: {row.skipped}")
    best: list[dict | None] = [None] * len(rows)
    with tempfile.TemporaryDirectory(prefix="wellfno-ex11-") as scratch:
        runs = Path(args.keep_runs or scratch)
        for round_ in range(args.repeats):
            for i in measured:
                metrics = run_row(args, rows[i].script, rows[i].options,
                                  runs / f"{i}_round{round_}")
                if best[i] is None or metrics["samples_per_second"] > best[i]["samples_per_second"]:
                    best[i] = metrics
                print(f"round {round_ + 1}/{args.repeats}  {metrics['samples_per_second']:9.1f} "
                      f"samples/s  {rows[i].name}", flush=True)
    # The rows before 10 have no FLOP count of their own: the model of their (default) size, counted
    # here, against the device's peak for their precision (float32, bf16, fp16).
    peak = flops.device_peak(device)
    default_flops = flops_per_sample(dataset_dir, DEFAULT_WIDTH, DEFAULT_BATCH)
    for i in measured:
        if "flops_per_sample" not in best[i]:
            best[i]["flops_per_sample"] = default_flops
            best[i].update(flops.utilization(best[i]["flops_per_sample"],
                                             best[i]["samples_per_second"], peak, rows[i].amp))
    table = [table_row(row, best[i], rows, best) for i, row in enumerate(rows)]
    print(flops.efficiency_markdown(table))
    last = best[measured[-1]]
    result = dict(device=str(device), peak_device=last["peak_device"],
                  peak_source=last["peak_source"],
                  steps=args.steps, repeats=args.repeats, common=args.common, rows=table)
    given = argv if argv is not None else sys.argv[1:]
    command = shlex.join(["python", "solutions/11_compile/benchmark.py", *given])
    write_result(out / "efficiency.json", command, result, device)
    print(f"Wrote {out / 'efficiency.json'} and "
          f"{figure(dict(result, machine=info), out / 'efficiency.png')}")


def table_row(row: Row, m: dict | None, rows: list[Row], best: list[dict | None]) -> dict:
    """One row of efficiency.json: its numbers (None where skipped), and its speed-up against the
    row it builds on."""
    script = row.script.relative_to(REPO) if row.script.is_relative_to(REPO) else row.script
    out = dict(row=row.name, command=" ".join([str(script), *row.options]),
               against=None if row.against is None else rows[row.against].name, speedup_of=row.by,
               speedup=None, skipped=row.skipped)
    keys = ("samples_per_s", "flops_per_sample", "achieved_flops_per_s", "peak_flops_per_s",
            "peak_precision", "mfu", "peak_memory_bytes", "peak_memory_of", "compile_seconds")
    if m is None:
        return {**out, **dict.fromkeys(keys)}
    achieved = m["flops_per_sample"] * m["samples_per_second"]
    out.update(samples_per_s=m["samples_per_second"], flops_per_sample=m["flops_per_sample"],
               achieved_flops_per_s=achieved, peak_flops_per_s=m["peak_flops_per_s"],
               peak_precision=m["peak_precision"],
               mfu=achieved / m["peak_flops_per_s"] if m["peak_flops_per_s"] else None,
               peak_memory_bytes=m.get("peak_memory_bytes"), peak_memory_of=m.get("peak_memory_of"),
               compile_seconds=m.get("compile_seconds"))
    reference = best[row.against] if row.against is not None else None
    if reference is not None:
        if row.by == "FLOP/s":
            out["speedup"] = achieved / (reference["flops_per_sample"]
                                         * reference["samples_per_second"])
        else:
            out["speedup"] = m["samples_per_second"] / reference["samples_per_second"]
    return out


def figure(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wellfno.plots import save_png

    rows = [r for r in result["rows"] if r["skipped"] is None]
    names = [r["row"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.5 * len(rows) + 1.8), sharey=True)
    axes[0].barh(names, [r["samples_per_s"] for r in rows])
    axes[0].set(xlabel="training samples/s", title="throughput")
    axes[0].invert_yaxis()
    axes[1].barh(names, [100 * (r["mfu"] or 0) for r in rows], color="tab:orange")
    axes[1].set(xlabel="MFU (% of peak)", title=f"vs {result['peak_device']}")
    fig.suptitle(f"Exercises 08-11 on {result['machine'].get('gpu', result['machine']['cpu'])}",
                 fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


if __name__ == "__main__":
    run_main(main)
