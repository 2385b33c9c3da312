"""Results files, and the README tables generated from them.

Every number a README or INSTRUCTORS.md quotes comes from a JSON file under `results/`, written by
the command that measured it, naming the machine. A table in a Markdown file is generated:

    <!-- table: coursetools.results:runtimes_table -->
    | ... generated, do not edit ... |
    <!-- /table -->

    python -m coursetools.results render            # regenerate every such table in the repository's docs
    python -m coursetools.results render --check    # exit 1 if a table and its results file disagree (a test runs this)
    python -m coursetools.results runtimes          # time each step's documented command -> results/runtimes.json

A renderer is any `module:function` taking the repository root and returning Markdown; tools that write a
results file keep the renderer for it beside the code that writes it.
"""
from __future__ import annotations

import argparse
import importlib
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchtools.resultfiles import caption, md_table, read_result, write_result  # noqa: F401 (re-exported)
from coursetools import day0
from wellfno import flops, stats
from wellfno.cli import UserError, atomic_write_text, run_main

DOCS = ("README.md", "INSTRUCTORS.md", "DESIGN.md", "slurm/README.md", "exercises/*/README.md",
        "exercises/*/background.md")
TABLE = re.compile(r"(<!-- table: (?P<spec>[\w.]+:\w+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


# --------------------------------------------------------------------------- tables in the docs
def doc_files(root: Path) -> list[Path]:
    found = []
    for pattern in DOCS:
        found += sorted(root.glob(pattern))
    return found


def render_text(text: str, root: Path, errors: list[str] | None = None) -> str:
    """Every table of one document rendered again; a table whose renderer fails keeps its old body
    and its error goes to `errors` (without a list, the first error is raised)."""
    def replace(match: re.Match) -> str:
        module, func = match.group("spec").split(":")
        try:
            renderer = getattr(importlib.import_module(module), func)
        except (ImportError, AttributeError):
            failure = UserError(f"table renderer {match.group('spec')} does not exist")
        else:
            try:
                return match.group(1) + renderer(root).rstrip("\n") + "\n" + match.group(4)
            except UserError as err:
                failure = UserError(f"{match.group('spec')}: {err}")
        if errors is None:
            raise failure
        errors.append(str(failure))
        return match.group(0)
    return TABLE.sub(replace, text)


def render(root: Path, check: bool = False) -> list[Path]:
    """Regenerate every table; with check, change nothing and return the files that are stale.
    Every table that can be rendered is; then one error lists the tables that could not be."""
    stale, errors = [], []
    for path in doc_files(root):
        text = path.read_text()
        mine: list[str] = []
        new = render_text(text, root, mine)
        errors += [f"{path.relative_to(root)}: {e}" for e in mine]
        if new != text:
            stale.append(path)
            if not check:
                atomic_write_text(path, new)
    if errors:
        raise UserError(f"{len(errors)} table(s) could not be rendered" + (" (the others were)" if not check else "")
                        + ": " + "; ".join(errors))
    return stale


# --------------------------------------------------------------------------- step runtimes
# Each step's command as the docs give it: {py} the venv's python, {D} the data dir, {OUT} an output folder.
# (step, command, what it stands for in the table); step 01's run is also the profile exercise 01 shows.
RUNTIME_COMMANDS = [
    ("data", "{py} -m wellfno.grayscott --data-dir {D}_tiny --size tiny"),
    ("data", "{py} -m wellfno.grayscott --data-dir {D} --size demo"),
    ("00", "{py} fno.py --data-dir {D} --out {OUT}/00"),
    ("01", "{py} solutions/01_profiling/fno.py --profile --data-dir {D} --out {OUT}/01"),
    ("02", "{py} profiling/throughput.py --data-dir {D} --out {OUT}/02 --seconds 2 --repeats 2 --prefetch-factor 2"),
    ("03", "{py} affinity/report.py --workers 2"),
    ("04", "{py} stats.py {D}/datasets/gray_scott_embedded --out {OUT}/stats.yaml"),
    ("04", "{py} -m torch.distributed.run --standalone --nproc_per_node=2 "
           "solutions/04_distributed_stats/stats.py {D}/datasets/gray_scott_embedded --out {OUT}/stats2.yaml"),
    # 05-11: one epoch each (the exercises' runs are a few epochs of this); 2 ranks where the step
    # is about ranks, one process otherwise; 08 in float32 (a CPU without bf16 units refuses bf16).
    ("05", "{py} -m torch.distributed.run --standalone --nproc_per_node=2 "
           "solutions/05_ddp/fno.py --data-dir {D} --out {OUT}/05 --epochs 1"),
    ("06", "{py} -m torch.distributed.run --standalone --nproc_per_node=2 "
           "solutions/06_exact_metrics/fno.py --data-dir {D} --out {OUT}/06 --epochs 1"),
    ("07", "{py} -m torch.distributed.run --standalone --nproc_per_node=2 "
           "solutions/07_failures/fno.py --timeout 30 --data-dir {D} --out {OUT}/07 --epochs 1"),
    ("08", "{py} solutions/08_host_syncs/fno.py --data-dir {D} --out {OUT}/08 --epochs 1"),
    ("09", "{py} solutions/09_mixed_precision/fno.py --data-dir {D} --out {OUT}/09 --epochs 1"),
    ("10", "{py} solutions/10_mfu/fno.py --data-dir {D} --out {OUT}/10 --epochs 1"),
    ("11", "{py} solutions/11_compile/fno.py --compile --data-dir {D} --out {OUT}/11 --epochs 1"),
    ("12", "{py} solutions/12_checkpointing/fno.py --checkpoint-blocks --data-dir {D} --out {OUT}/12 "
           "--epochs 1"),
    ("13", "{py} -m torch.distributed.run --standalone --nproc_per_node=2 "
           "solutions/13_domain_parallel/fno.py --domain-size 2 --data-dir {D} --out {OUT}/13 --epochs 1"),
    ("14", "{py} solutions/14_long_rollouts/fno.py --data-dir {D} --out {OUT}/14 --epochs 1"),
    ("notebooks", "{py} -m pytest -q tests/test_notebooks.py"),
]

TRAINING_STEPS = ("05", "06", "07", "08", "09", "10", "11", "12", "13", "14")  # their metrics.json: samples/s


CPU_ONLY_STEPS = ("data", "04")   # these commands never use a GPU: nothing to measure there


def _folder_megabytes(path: Path) -> float:
    """Size on disk of a folder (what `du -s` counts: allocated blocks)."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file()) / 1e6


def _step_extras(step: str, argv: list[str], stdout: str, runs: Path) -> dict:
    """What a step's run showed besides its wall time: the numbers the docs quote from it."""
    extra = {}
    if step == "data":
        dataset = Path(argv[argv.index("--data-dir") + 1]) / "datasets" / "gray_scott_embedded"
        extra["size_mb"] = round(_folder_megabytes(dataset), 1)
    elif step == "00" and (runs / "00" / "metrics.json").exists():
        m = json.loads((runs / "00" / "metrics.json").read_text())
        extra.update(samples_per_second=round(m["samples_per_second"], 1),
                     rollout_vrmse=[round(v, 4) for v in m["rollout_vrmse"]],
                     persistence_vrmse=[round(v, 4) for v in m["persistence_vrmse"]],
                     epochs=[{k: round(h[k], 4) for k in ("train_loss", "valid_loss")}
                             | {"samples_per_second": round(h["samples"] / h["seconds"], 1)} for h in m["history"]])
        # kept for older readers of this file
        extra.update(rollout_vrmse_step1=extra["rollout_vrmse"][0], persistence_vrmse_step1=extra["persistence_vrmse"][0])
    elif step in TRAINING_STEPS and (runs / step / "metrics.json").exists():
        m = json.loads((runs / step / "metrics.json").read_text())
        extra["samples_per_second"] = round(m["samples_per_second"], 1)
    elif step == "01":
        found = sorted((runs / "01").glob("trace_rank0_steps*.json.gz"))
        if found:
            from profiling import summarize, traces
            summary = summarize.summarize(traces.load(found[0]))
            extra["profile"] = {"trace": found[0].name, "steps": summary["steps"],
                                "top_host": summary["top"]["host"][:10]}
        extra["stdout"] = stdout
    return extra


def _run_step(root: Path, step: str, template: str, data_dir: str, runs: Path) -> dict:
    """One documented command, timed: its row (with the figures it showed, or why it failed)."""
    shown = template.format(py="python", D="D", OUT="OUT")
    argv = shlex.split(template.format(py=sys.executable, D=data_dir, OUT=runs))
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=root, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    row = {"step": step, "command": shown, "seconds": round(seconds, 1)}
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines()
                  if "Error" in line or line.startswith("error:")]
        last = (errors or proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        row["failed"] = last.strip()[:200]
    else:
        row.update(_step_extras(step, argv, proc.stdout, runs))
    return row


def measure_runtimes(root: Path, out_json: Path, repeats: int = 1) -> dict:
    """Each documented command run `repeats` times in a row (the later commands need the data the
    first ones generate, so not round-robin), keeping its fastest run; each run in a fresh folder."""
    rows, failed = [], []
    with tempfile.TemporaryDirectory(prefix="coursetools-runtimes-") as scratch:
        for step, template in RUNTIME_COMMANDS:
            print(f"[{step}] {template.format(py='python', D='D', OUT='OUT')}", flush=True)
            best = None
            for i in range(repeats):
                # the data the later commands use is the first run's; a repeat generates anew
                data_dir = f"{scratch}/data" + (f"_repeat{i}" if step == "data" and i else "")
                row = _run_step(root, step, template, data_dir, Path(scratch, f"runs{i}"))
                failure = f": FAILED: {row['failed']}" if "failed" in row else ""
                print(f"      {row['seconds']:.1f} s{failure}", flush=True)
                if "failed" in row:
                    # The table says so, and the other steps are still measured: one broken step
                    # must not cost the whole (long) run.
                    best = row
                    break
                if best is None or row["seconds"] < best["seconds"]:
                    best = row
            if "failed" in best:
                failed.append(f"{step} ({best['command']}): {best['failed']}")
            rows.append(dict(best, runs=repeats) if "failed" not in best else best)
    write_result(out_json, "python -m coursetools.results runtimes" + (f" --repeats {repeats}" if repeats > 1 else ""),
                 {"rows": rows})
    if failed:
        raise UserError(f"wrote {out_json}, but {len(failed)} step(s) failed: " + "; ".join(failed))
    return {"rows": rows}


def _caption(result: dict) -> str:
    """caption(), plus a warning when other work outnumbered the cores during the run."""
    machine = result["machine"]
    loads = [machine[k] for k in ("load_average_at_start", "load_average") if machine.get(k) is not None]
    load, cores = max(loads, default=None), machine.get("cores")
    if load is not None and cores and load > cores:
        return (caption(result) + f" _The load average ({load}) was above the number of cores ({cores}): other "
                "jobs' noise is in these numbers; re-measure on an idle machine (`make results`)._")
    return caption(result)


def _result(root, name: str) -> dict:
    return read_result(Path(root) / "results" / name)


def _optional(root, name: str) -> dict | None:
    return _result(root, name) if (Path(root) / "results" / name).exists() else None


def _rows_by_step(result: dict) -> dict[str, list[dict]]:
    steps: dict[str, list[dict]] = {}
    for row in result["data"]["rows"]:
        steps.setdefault(row["step"], []).append(row)
    return steps


def _profile_shares(profile: dict) -> dict[str, float]:
    """Each part's share of the profiled steps' total time (the summary's `share` row)."""
    steps = profile["steps"]
    total = sum(s["total"] for s in steps)
    # the step's parts (profiling/summarize.py); other per-step columns (syncs, collectives) are counts
    parts = [k for k in ("data_wait", "h2d_copy", "forward", "backward", "optimizer", "rest") if k in steps[0]]
    return {k: sum(s[k] for s in steps) / total for k in parts}


def _failed_step(row: dict, result: dict) -> str:
    return (f"`{row['command']}` failed in the last measurement (`{row.get('failed', 'no output recorded')}`): "
            f"nothing to show until it runs again.\n\n{_caption(result)}")


def _runtime_note(row: dict) -> str:
    if "failed" in row:
        return f" — **failed**: `{row['failed']}`"
    if "size_mb" in row:
        return f"; {row['size_mb']:.0f} MB on disk" if row["size_mb"] >= 1 else f"; {row['size_mb']:.1f} MB on disk"
    if "rollout_vrmse" in row or "rollout_vrmse_step1" in row:
        return (f"; {row['samples_per_second']:.0f} samples/s, rollout VRMSE step 1 "
                f"{row['rollout_vrmse_step1']:.3f} (persistence {row['persistence_vrmse_step1']:.3f})")
    if "samples_per_second" in row:
        return f"; {row['samples_per_second']:.0f} samples/s"
    if "profile" in row:
        return f"; data_wait {100 * _profile_shares(row['profile'])['data_wait']:.0f} % of each profiled step"
    return ""


def _with_unmeasured_steps(measured: list[dict]) -> list[dict]:
    """The measured rows, plus a row without `seconds` for each documented step the results file
    has none of (a step added since the last `make results`), in the course's order."""
    order = list(dict.fromkeys(step for step, _ in RUNTIME_COMMANDS))
    have = {row["step"] for row in measured}
    missing = [{"step": step, "command": template.format(py="python", D="D", OUT="OUT")}
               for step, template in RUNTIME_COMMANDS if step not in have]
    rank = {step: i for i, step in enumerate(order)}
    return sorted([*measured, *missing], key=lambda row: rank.get(row["step"], len(order)))


def runtimes_table(root: Path) -> str:
    """INSTRUCTORS.md's expected runtimes: results/runtimes.json, and results/runtimes_gpu.json where measured."""
    result = _result(root, "runtimes.json")
    gpu = _optional(root, "runtimes_gpu.json")
    gpu_seconds = {row["command"]: row for row in gpu["data"]["rows"]} if gpu else {}
    rows = []
    for row in _with_unmeasured_steps(result["data"]["rows"]):
        on_gpu = gpu_seconds.get(row["command"])
        here = "to be measured" if row.get("seconds") is None else \
            f"{row['seconds']:.1f} s{_runtime_note(row)}"
        rows.append([row["step"], f"`{row['command']}`", here,
                     f"{on_gpu['seconds']:.1f} s{_runtime_note(on_gpu)}" if on_gpu else
                     "(CPU only)" if row["step"] in CPU_ONLY_STEPS else "to be measured"])
    lines = md_table(["step", "command", "wall time here", "GPU node"], rows) + "\n\n" + _caption(result)
    if gpu:
        lines += "\n" + _caption(gpu).replace("_Measured by", "_GPU column measured by")
    return lines


def dataset_sizes_table(root: Path) -> str:
    """INSTRUCTORS.md's embedded dataset sizes: generation time and size on disk from results/runtimes.json."""
    result = _result(root, "runtimes.json")
    measured = {}
    for row in _rows_by_step(result).get("data", []):
        size = "tiny" if "--size tiny" in row["command"] else "demo"
        measured[size] = f"{row['seconds']:.1f} s wall, {row.get('size_mb', 0):.1f} MB on disk"
    rows = [["`tiny`", "16×16, 12", "2/1/1, 2 regimes", measured.get("tiny", "to be measured") + " (tests only)"],
            ["`demo`", "32×32, 40", "6/2/2, 6 regimes", measured.get("demo", "to be measured")],
            ["`large`", "128×128 (The Well's resolution), 201", "16/2/2, 6 regimes",
             "not generated here; 6 × 20 trajectories × 201 frames × 128² × 2 fields × 4 bytes = 3.2 GB of "
             "float32 (arithmetic, not a measurement); to be measured"]]
    return md_table(["size", "grid, frames", "trajectories (train/valid/test per regime)", "measured here"],
                    rows) + "\n\n" + _caption(result)


def demo_run_summary(root: Path) -> str:
    """INSTRUCTORS.md's step 00: losses per epoch and where persistence overtakes the rollout (runtimes.json)."""
    result = _result(root, "runtimes.json")
    row = _rows_by_step(result)["00"][0]
    if "rollout_vrmse" not in row:
        return _failed_step(row, result)
    model, persistence = row["rollout_vrmse"], row["persistence_vrmse"]
    worse = next((k for k, (m, p) in enumerate(zip(model, persistence)) if m > p), None)
    shown = sorted({0, 4} | ({worse - 1, worse} if worse else set()) | {len(model) - 1})
    table = md_table(["epoch", "train loss", "valid loss", "samples/s"],
                     [[i + 1, f"{e['train_loss']:.4f}", f"{e['valid_loss']:.4f}", f"{e['samples_per_second']:.0f}"]
                      for i, e in enumerate(row["epochs"])])
    table += "\n\n" + md_table(["rollout step", "VRMSE model", "VRMSE persistence"],
                               [[k + 1, f"{model[k]:.3f}", f"{persistence[k]:.3f}"] for k in shown if 0 <= k < len(model)])
    first = f"persistence is better from rollout step {worse + 1} on" if worse is not None else \
        "the model beats persistence at every rollout step"
    return f"`{row['command']}`: {first}.\n\n{table}\n\n{_caption(result)}"


def demo_transcript(root: Path) -> str:
    """README's quick start: what `fno.py` printed per epoch and rollout step in runtimes.json's step 00."""
    result = _result(root, "runtimes.json")
    row = _rows_by_step(result)["00"][0]
    if "epochs" not in row:
        return _failed_step(row, result)
    n = len(row["epochs"])
    lines = [f"$ {row['command']}        # {row['seconds']:.0f} s", "..."]
    lines += [f"epoch {i + 1}/{n}  train_loss {e['train_loss']:.4f}  valid_loss {e['valid_loss']:.4f}  "
              f"{e['samples_per_second']:.0f} samples/s" for i, e in enumerate(row["epochs"])]
    lines += [f"rollout step {k + 1}: VRMSE model {m:.4f}  persistence {q:.4f}"
              for k, (m, q) in enumerate(zip(row["rollout_vrmse"][:5], row["persistence_vrmse"][:5]))]
    return "```\n" + "\n".join(lines) + "\n```\n\n" + _caption(result)


# ---- exercise 01: the profile (step 01 of runtimes.json) and the profiler's overhead
def _elide(lines: list[str], keep: int) -> list[str]:
    return lines if len(lines) <= keep else lines[:keep] + ["..."]


def profile_transcript(root: Path) -> str:
    """Exercise 01's "what you should see": the profiled run's output, long tables cut, from runtimes.json."""
    result = _result(root, "runtimes.json")
    row = _rows_by_step(result)["01"][0]
    if "profile" not in row:
        return _failed_step(row, result)
    out, lines, i = [], [line.rstrip() for line in row["stdout"].splitlines()], 0   # torch pads its table
    while i < len(lines):
        line = lines[i]
        if line.startswith("-----") and i + 2 < len(lines) and "Name" in lines[i + 1]:
            j = i + 3   # key_averages: the header, 6 operators, the total
            body = []
            while j < len(lines) and not lines[j].startswith("-----"):
                body.append(lines[j])
                j += 1
            out += lines[i:i + 3] + _elide(body, 6) + lines[j:j + 2]
            i = j + 2
        elif line.startswith("Top ") and line.endswith(":"):
            j = i + 1
            while j < len(lines) and lines[j].startswith("  "):
                j += 1
            out += [line] + _elide(lines[i + 1:j], 3)
            i = j
        else:
            out.append(line)
            i += 1
    text = "\n".join(out)
    text = re.sub(r"\S*/runs\d*/01/", "OUT/01/", text)   # the run's scratch folder
    shares = _profile_shares(row["profile"])
    steps = row["profile"]["steps"]
    wait_ms = sum(s["data_wait"] for s in steps) / len(steps)
    return (f"```\n$ {row['command']}\n{text}\n```\n\n"
            f"The whole command took {row['seconds']:.0f} s. The data wait: {100 * shares['data_wait']:.1f} % of the "
            f"profiled steps, {wait_ms:.1f} ms per step of 16 samples "
            f"({wait_ms / 16:.1f} ms a sample, DataLoader and collation included).\n\n{_caption(result)}")


def overhead_table(root: Path) -> str:
    """Exercise 01's profiler overhead, from results/profiling_overhead.json (profiling/overhead.py --results)."""
    result = _result(root, "profiling_overhead.json")
    d = result["data"]
    labels = {"before": "before the window (wait)", "outside": "outside the window (wait + after)",
              "inside": "inside the window (warmup + active)"}
    rows = [[label, f"{d[k]['plain_steps_per_s']:.2f}", f"{d[k]['profiled_steps_per_s']:.2f}", f"{d[k]['ratio']:.3f}",
             f"{100 * (1 - d[k]['ratio']):+.1f} %"] for k, label in labels.items() if k in d]
    step_ms = 1e3 / d["outside"]["plain_steps_per_s"]
    idle = d["idle_record_function_us"]
    return (md_table(["steps", "plain steps/s", "profiled steps/s", "ratio", "slower by"], rows, "lrrrr") +
            f"\n\nAn idle `record_function` range (no profiler running) costs {idle:.1f} µs here: 5 per step "
            f"= {100 * 5 * idle / 1e3 / step_ms:.2f} % of a {step_ms:.0f} ms step.\n\n" + _caption(result))


# ---- exercise 02: the loader sweep, the readers, the scripts
def _workers(n: int) -> str:
    return f"{n} worker{'' if n == 1 else 's'}"


def _fmt_rate(value: float) -> str:
    """samples/s: whole numbers, but a decimal below 10 (a loaded machine gets there)."""
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def throughput_table(root: Path, name: str = "throughput.json") -> str:
    """Exercise 02's loader sweep, from results/throughput.json (profiling/throughput.py --results)."""
    result = _result(root, name)
    d = result["data"]
    r = d["readers"]
    rates = r["samples_per_s"]
    rows = [[row["reader"], row["num_workers"], "on" if row["pin_memory"] else "off",
             "-" if row["prefetch_factor"] is None else row["prefetch_factor"], _fmt_rate(row["data_only"]),
             _fmt_rate(row["compute_only"]), _fmt_rate(row["full"]), f"{row['efficiency']:.2f}"] for row in d["rows"]]
    text = (f"Readers alone (no DataLoader, batches of {d['config']['batch_size']}): raw h5py "
            f"{_fmt_rate(rates['raw_h5py'])}, fast reader {_fmt_rate(rates['fast'])}, WellDataset "
            f"{_fmt_rate(rates['well'])} samples/s ({1e3 / rates['well']:.1f} ms a sample); fast / raw "
            f"**{r['fast_over_raw']:.2f}**, fast / WellDataset **{r['fast_over_well']:.0f}×**.\n\n")
    text += md_table(["reader", "workers", "pin", "prefetch", "data_only", "compute_only", "full", "full / compute"],
                     rows, "lrlrrrrr")
    for reader in dict.fromkeys(row["reader"] for row in d["rows"]):
        mine = [row for row in d["rows"] if row["reader"] == reader]
        top = max(mine, key=lambda row: row["full"])
        line = (f"\n\n`{reader}`: best full {_fmt_rate(top['full'])} samples/s with {_workers(top['num_workers'])} "
                f"(full / compute-only {top['efficiency']:.2f})")
        zero = [row for row in mine if row["num_workers"] == 0]
        two = [row for row in mine if row["num_workers"] == 2]
        if zero and two:
            line += f"; data_only with 2 workers / 0 workers = {two[0]['data_only'] / zero[0]['data_only']:.2f}"
        text += line + "."
    return text + "\n\n" + _caption(result)


def readers_large_table(root: Path) -> str:
    """Exercise 02's readers on 128×128 windows, from results/throughput_large.json."""
    result = _result(root, "throughput_large.json")
    r = result["data"]["readers"]
    rates = r["samples_per_s"]
    return (md_table(["reader", "samples/s", "vs raw h5py"], align="lrr", rows=
                     [["raw h5py slices", _fmt_rate(rates["raw_h5py"]), "1.00"],
                      ["fast reader", _fmt_rate(rates["fast"]), f"**{r['fast_over_raw']:.2f}**"],
                      ["WellDataset", _fmt_rate(rates["well"]), f"{r['well_over_raw']:.3f}"]])
            + "\n\n" + _caption(result))


def scripts_table(root: Path) -> str:
    """Exercise 02's whole-script comparison, from results/compare_scripts.json (compare_scripts.py --results)."""
    result = _result(root, "compare_scripts.json")
    d = result["data"]
    rows = [[f"`{row['command']}`", f"{row['samples_per_s']:.1f}", f"{row['vs_first']:.2f}×"] for row in d["rows"]]
    return (md_table(["script", "samples/s", f"vs {d['rows'][0]['command']}"], rows, "lrr") +
            f"\n\nEach script with `{d['script_args']}`, best of {d['repeats']} round-robin rounds.\n\n" + _caption(result))


def step02_summary(root: Path) -> str:
    """INSTRUCTORS.md's step 02 figures: the same results/throughput.json as exercise 02's sweep."""
    result = _result(root, "throughput.json")
    d = result["data"]
    names = {"well": "the_well's `WellDataset`", "fast": "`wellfno.fastwell`"}
    rows = []
    for reader in dict.fromkeys(row["reader"] for row in d["rows"]):
        mine = [row for row in d["rows"] if row["reader"] == reader]
        zero = next(row for row in mine if row["num_workers"] == 0) if any(r["num_workers"] == 0 for r in mine) else mine[0]
        top = max(mine, key=lambda row: row["full"])
        rows.append([names.get(reader, reader), _fmt_rate(zero["data_only"]), _fmt_rate(zero["full"]),
                     _fmt_rate(zero["compute_only"]), f"{zero['efficiency']:.2f}",
                     f"{_fmt_rate(top['full'])} ({_workers(top['num_workers'])}, {top['efficiency']:.2f})"])
    return (md_table(["reader", "DataLoader alone, 0 workers", "full step, 0 workers", "compute-only",
                      "full / compute-only", "best full step (workers, full / compute-only)"], rows, "lrrrrr")
            + "\n\nsamples/s; exercise 02's sweep table has every configuration.\n\n" + _caption(result))


# ---- INSTRUCTORS.md: torch threads next to a busy process
def threads_table(root: Path) -> str:
    """Training samples/s by torch threads, alone and next to busy processes (profiling/threads.py --results)."""
    result = _result(root, "threads.json")
    d = result["data"]
    busy = sorted({row["busy_processes"] for row in d["rows"]})
    threads = sorted({row["threads"] for row in d["rows"]})
    rate = {(row["threads"], row["busy_processes"]): row["samples_per_s"] for row in d["rows"]}
    header = ["torch threads"] + ["alone" if b == 0 else f"next to {b} busy process{'es' if b > 1 else ''}"
                                  for b in busy]
    rows = [[t] + [_fmt_rate(rate[(t, b)]) if (t, b) in rate else "" for b in busy] for t in threads]
    return md_table(header, rows, "r" * len(header)) + "\n\n" + _caption(result)


# ---- README.md: one row per step, each quoting its results file
def _link(name: str) -> str:
    return f"[`results/{name}`](results/{name})"


def _stats_benchmark(root: Path) -> dict | None:
    """Exercise 04's benchmark file, in write_result's layout or in benchmark.py's own (top-level keys)."""
    path = Path(root) / "results" / "04_stats_benchmark.json"
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    if "data" in raw:
        return read_result(path)
    machine = dict(raw.get("machine", {}))
    if "load_average_at_end" in machine:
        machine.setdefault("load_average", round(machine["load_average_at_end"], 2))
    return {"command": raw.get("command", "python solutions/04_distributed_stats/benchmark.py"), "machine": machine,
            "measured_at": raw.get("date", ""), "data": raw}


def readme_results_table(root: Path) -> str:
    root = Path(root)
    rows, results = [], {}

    def use(name):
        results[name] = results.get(name) or _optional(root, name)
        return results[name]

    runtimes = use("runtimes.json")
    steps = _rows_by_step(runtimes) if runtimes else {}
    if "00" in steps and "rollout_vrmse" in steps["00"][0]:
        r = steps["00"][0]
        rows.append(["00", f"`{r['command']}`", f"{r['seconds']:.0f} s; {r['samples_per_second']:.0f} samples/s; "
                     f"rollout VRMSE step 1 **{r['rollout_vrmse'][0]:.3f} vs {r['persistence_vrmse'][0]:.3f}** for "
                     f"persistence, step 5 {r['rollout_vrmse'][4]:.3f} vs {r['persistence_vrmse'][4]:.3f}",
                     _link("runtimes.json")])
    if "01" in steps and "profile" in steps["01"][0]:
        r = steps["01"][0]
        prof = r["profile"]["steps"]
        wait = sum(s["data_wait"] for s in prof) / len(prof)
        total = sum(s["total"] for s in prof) / len(prof)
        over = use("profiling_overhead.json")
        cost = (f"; steps/s with the profiler waiting for its window / without: "
                f"{over['data']['before']['ratio']:.2f} (`profiling/overhead.py`, {_link('profiling_overhead.json')})"
                if over else "")
        rows.append(["01", f"`{r['command']}`", f"{r['seconds']:.0f} s; waiting for data is "
                     f"**{100 * wait / total:.0f} %** of a profiled step ({wait:.0f} ms of {total:.0f} ms){cost}",
                     _link("runtimes.json")])
    scripts, tp = use("compare_scripts.json"), use("throughput.json")
    if scripts or tp:
        parts = []
        if scripts:
            srows = scripts["data"]["rows"]
            top = max(srows, key=lambda row: row["samples_per_s"])
            parts.append(f"training samples/s: `{srows[0]['command']}` {_fmt_rate(srows[0]['samples_per_s'])}, "
                         f"fastest of {len(srows)} scripts `{top['command']}` {_fmt_rate(top['samples_per_s'])} "
                         f"(**{top['vs_first']:.2f}×**)")
        if tp:
            rd = tp["data"]["readers"]
            parts.append(f"fast reader at {rd['fast_over_raw']:.2f} of raw h5py and {rd['fast_over_well']:.0f}× "
                         f"`WellDataset`")
        rows.append(["02", "`python profiling/compare_scripts.py ...`, `python profiling/throughput.py ...` "
                     "([exercise 02](exercises/02_data_pipeline/background.md#results))", "; ".join(parts),
                     ", ".join(_link(n) for n, r in (("compare_scripts.json", scripts), ("throughput.json", tp)) if r)])
    aff = use("affinity_benchmark.json")
    if aff:
        tables = aff["data"]["tables"]
        pipeline = dict((n, v) for n, v in tables[0]["rows"])
        text = (f"2 DataLoader workers collapsed on one core vs spread by `worker_init_fn`: "
                f"**{pipeline['worker_init_fn'] / pipeline['collapsed']:.2f}×**")
        if len(tables) > 1:
            busy, free = (v for _, v in tables[1]["rows"][:2])
            text += f"; a worker sharing a busy core: {free / busy:.2f}× slower"
        rows.append(["03", f"`{aff['command']}` ([exercise 03](exercises/03_affinity/background.md#5-measure-when-does-it-pay))",
                     text, _link("affinity_benchmark.json")])
    stats = _stats_benchmark(root)
    if stats:
        results["04_stats_benchmark.json"] = stats
    tested = ("the tests (`tests/test_stats_distributed.py`) check that 1, 2, 3 and 4 ranks on one machine "
              "(python, srun-style and torchrun launches) and two torchrun agents on one machine standing in for "
              "two nodes write the serial `stats.yaml` bit for bit")
    if stats:
        d = stats["data"]
        by_ranks = {r["ranks"]: r for r in d["rows"] if r["name"].startswith("distributed")}
        same = [k for k, v in d["bitwise_identical_to_serial"].items() if v]
        text = (f"on a {d['dataset']['gigabytes']:.2f} GB split: " +
                ", ".join(f"{n} rank{'s' if n > 1 else ''} {r['seconds']:.2f} s" for n, r in sorted(by_ranks.items())))
        if 1 in by_ranks and len(by_ranks) > 1:
            n = max(by_ranks)
            text += f" (speed-up {by_ranks[1]['seconds'] / by_ranks[n]['seconds']:.1f}× with {n} ranks)"
        text += (f"; {len(same)} of {len(d['bitwise_identical_to_serial'])} distributed runs bit for bit equal to "
                 f"the serial `stats.yaml`; {tested}")
        rows.append(["04", f"`{stats['command']}`", text, _link("04_stats_benchmark.json")])
    else:
        rows.append(["04", "`python solutions/04_distributed_stats/benchmark.py --json results/04_stats_benchmark.json`",
                     f"timings to be measured (no results file yet); {tested}", "—"])
    scaling = use("05_ddp_scaling.json")
    if scaling:  # exercise 05: its sentence lives beside the table it summarises
        rows.append(ddp_readme_row(scaling) + [_link("05_ddp_scaling.json")])
    efficiency = use("efficiency_cpu/efficiency.json")
    ladder = day0.gpu_ladder(root)   # a CPU's (a dry run's) is refused, one line naming it
    if efficiency:  # exercises 08-11: its sentence lives beside the table it summarises
        rows.append(efficiency_readme_row(efficiency, ladder)
                    + [_link("efficiency_cpu/efficiency.json")])
    gpu_name = day0.GPU_LADDER.relative_to("results").as_posix()
    if ladder:
        results[gpu_name] = ladder
    rows.append(gpu_ladder_readme_row(ladder) + ([_link(gpu_name)] if ladder else ["—"]))
    checkpointing = use("12_checkpointing.json")
    if checkpointing:  # exercise 12: its sentence lives beside the table it summarises
        rows.append(checkpointing_readme_row(checkpointing) + [_link("12_checkpointing.json")])
    domain = use("13_domain_scaling.json")
    if domain:
        rows.append(domain_readme_row(domain) + [_link("13_domain_scaling.json")])
    long_rollouts = use("14_long_rollouts.json")
    if long_rollouts:
        rows.append(long_rollouts_readme_row(long_rollouts) + [_link("14_long_rollouts.json")])
    machines = {}
    for name, res in results.items():
        if res:
            m = res["machine"]
            machines.setdefault(f"{m.get('cpu', 'unknown CPU')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}, "
                                f"{m.get('gpu') or 'no GPU'}", []).append(
                f"`{name}` {res['machine'].get('load_average', '?')} ({res.get('measured_at', '')[:10]})")
    notes = "; ".join(f"{m} — load average at the end of each run: {', '.join(v)}" for m, v in machines.items())
    return md_table(["step", "command", "what it measured", "results file"], rows) + f"\n\n_Machine: {notes}._"


# --------------------------------------------------------------------------- exercises 04, 05 and 06
def stats_benchmark_table(root: Path) -> str:
    """Exercise 04's benchmark table (solutions/04_distributed_stats/benchmark.py --json)."""
    result = read_result(Path(root) / "results" / "04_stats_benchmark.json")
    return stats.benchmark_markdown(result["data"]) + "\n\n" + caption(result)


def ddp_scaling_table(root: Path) -> str:
    """The README table of results/05_ddp_scaling.json (`python -m coursetools.results render`)."""
    result = read_result(Path(root) / "results" / "05_ddp_scaling.json")
    rows = [[mode, r["ranks"], r["per_rank_batch"], r["global_batch"], f"{r['step_ms']:.0f}",
             f"{r['samples_per_second']:.1f}", f"{r['efficiency']:.2f}", f"{100 * r['comm_share']:.0f} %",
             f"{100 * r['exposed_comm_share']:.0f} %"]
            for mode, mode_rows in result["data"]["modes"].items() for r in mode_rows]
    return md_table(["scaling", "ranks", "batch per rank", "global batch", "step ms", "samples/s", "efficiency",
                     "in collectives", "exposed"], rows) + "\n\n" + caption(result)



def ddp_readme_row(result: dict) -> list[str]:
    """The course README's results row of exercise 05 (step, command, what it measured) from its results file."""
    parts = []
    for mode, rows in result["data"]["modes"].items():
        first, last = rows[0], rows[-1]
        parts.append(f"{mode} scaling {first['ranks']} to {last['ranks']} ranks: efficiency "
                     f"**{last['efficiency']:.2f}**, {100 * last['comm_share']:.0f} % of a step in collectives "
                     f"({100 * last['exposed_comm_share']:.0f} % not hidden by the backward)")
    return ["05", f"`{result['command']}` ([exercise 05](exercises/05_ddp/background.md#scaling))",
            "; ".join(parts) + "; the tests check 2 ranks × b = 1 rank × 2b after a step (≤ 1e-5) and "
            "`--eval-only` equal on 1, 2, 3 ranks (≤ 1e-6); GPU nodes: the README's commands, to be measured"]


EFFICIENCY_RESULT = Path("results") / "efficiency_cpu" / "efficiency.json"


def efficiency_table(root: Path) -> str:
    """README renderer (coursetools.results): exercises 08-11's table from its committed results file."""
    result = read_result(root / EFFICIENCY_RESULT)
    data = result["data"]
    return (flops.efficiency_markdown(data["rows"]) + f"\n\nPeak: {data['peak_device']} ({data['peak_source']}).\n\n"
            + caption(result))


def _gpu_summary(ladder: dict) -> str:
    """The GPU ladder in a few words: its first row to its last measured one, and that one's MFU."""
    rows = [r for r in ladder["data"]["rows"] if not r["skipped"]]
    if not rows:
        return "every row skipped (the next row says why)"
    first, last = rows[0], rows[-1]
    text = f"{first['row']} {first['samples_per_s']:.0f} samples/s"
    if last is not first:
        text += (f" to {last['row']} {last['samples_per_s']:.0f} samples/s "
                 f"(**{last['samples_per_s'] / first['samples_per_s']:.2f}×**)")
    return text + ("" if last["mfu"] is None else f", MFU {100 * last['mfu']:.2f} %")


def efficiency_readme_row(result: dict, ladder: dict | None = None) -> list[str]:
    """The course README's results row of exercises 08-11 (step, command, what it measured) from
    its results file, and the GPU's ladder (day0.GPU_LADDER) in a few words where there is one."""
    gpu = (f"GPU ({day0.gpu_machine(ladder)}): {_gpu_summary(ladder)}; the next row has each step"
           if ladder else "GPU: to be measured, the next row says how")
    return ["08-11", f"`{result['command']}` ([exercises 08-11](exercises/11_compile/background.md#what-you-should-see))",
            flops.efficiency_summary(result["data"]) + "; " + gpu]


def gpu_ladder_readme_row(ladder: dict | None) -> list[str]:
    """The README's row of the GPU ladder (step, command, what it measured): each row's samples/s
    and MFU, the machine and the commit; without one, that GPU numbers are to be measured, how."""
    link = "[exercise 11](exercises/11_compile/background.md#on-a-gpu)"
    if ladder is None:
        return ["08-11, GPU", f"`OUT=DIR bash tests/device/day0.sh` ({link})",
                f"GPU numbers to be measured (no `{day0.GPU_LADDER.as_posix()}` yet): "
                + day0.HOW_TO_MEASURE]
    d = ladder["data"]
    return ["08-11, GPU", f"`{ladder['command']}` ({link})",
            f"{day0.gpu_machine(ladder)}, {day0.measured_commit(ladder)}; {d['grid']} grid, "
            f"{d['steps']} steps a row: " + "; ".join(day0.ladder_row_text(r) for r in d["rows"])
            + f"; MFU against {d['peak_device']}'s cited peak"]


_STEP_ORDER = ("fno.py", "02", "07", "08", "09", "10", "11")


def _cells(row: dict | None) -> list[str]:
    """A ladder row's samples/s (speed-up against the row it builds on) and MFU cells."""
    if row is None:
        return ["not in this ladder", ""]
    if row["skipped"]:
        return ["skipped", "-"]
    rate = _fmt_rate(row["samples_per_s"])
    if row["speedup"] is not None:
        rate += (f" ({row['speedup']:.2f}× {row['against'].split()[0]}"
                 + ("" if row["speedup_of"] == "samples/s" else f", {row['speedup_of']}") + ")")
    return [rate, "-" if row["mfu"] is None else f"{100 * row['mfu']:.2f}% {row['peak_precision']}"]


def _energy_cells(row: dict | None) -> list[str]:
    """A GPU ladder row's J per sample and mean W of its timed steps (coursetools.energy)."""
    if row is None or row.get("joules_per_sample") is None:
        return ["-", "-"]
    return [f"{row['joules_per_sample']:.3g}", f"{row['mean_watts']:.0f}"]


def efficiency_gpu_table(root: Path) -> str:
    """Exercise 11's GPU column: the CPU's ladder (EFFICIENCY_RESULT) and the GPU's (day0's
    GPU_LADDER) side by side, step by step; without a GPU file, how to measure one."""
    root = Path(root)
    ladder = day0.gpu_ladder(root)
    if ladder is None:
        return (f"GPU: to be measured (no `{day0.GPU_LADDER.as_posix()}` yet): "
                f"{day0.HOW_TO_MEASURE}.")
    cpu = _optional(root, EFFICIENCY_RESULT.relative_to("results").as_posix())
    by_step = {}
    for side, result in (("cpu", cpu), ("gpu", ladder)):
        for r in (result["data"]["rows"] if result else []):
            by_step.setdefault(r["row"].split()[0], {})[side] = r
    order = sorted(by_step, key=lambda k: _STEP_ORDER.index(k) if k in _STEP_ORDER else 99)
    d = ladder["data"]
    energy = d.get("energy")  # a ladder from before the energy columns has none
    rows = []
    for step in order:
        mine = by_step[step]
        name = (mine.get("gpu") or mine["cpu"])["row"]
        rows.append([name, *(_cells(mine.get("cpu")) if cpu else []), *_cells(mine.get("gpu"))]
                    + (_energy_cells(mine.get("gpu")) if energy else []))
    head = (["row"] + (["CPU samples/s", "CPU MFU"] if cpu else [])
            + ["GPU samples/s", "GPU MFU"] + (["GPU J/sample", "GPU mean W"] if energy else []))
    skipped = [f"GPU {r['row']}: skipped: {r['skipped']}." for r in d["rows"] if r["skipped"]]
    return (md_table(head, rows, "l" + "r" * (len(head) - 1))
            + ("\n\n" + " ".join(skipped) if skipped else "")
            + f"\n\nGPU column: {day0.gpu_machine(ladder)}, {day0.measured_commit(ladder)}; the "
            f"day-0 check's ladder on a {d['grid']} grid, {d['steps']} steps a row, one run each "
            f"(each speed-up against the row named); MFU against {d['peak_device']} "
            f"({d['peak_source']})."
            + (f" CPU column: `{EFFICIENCY_RESULT.as_posix()}`, the table above." if cpu else "")
            + ("" if not energy else f" Energy: NOT ANSWERED ({energy['not_answered']})."
               if "not_answered" in energy else
               f" J/sample and mean W: each row's timed steps, {energy['source']}.")
            + "\n\n" + _caption(ladder).replace("_Measured by", "_GPU column measured by"))


# --------------------------------------------------------------------------- exercises 12 and 13
# Both files are written by solutions/13_domain_parallel/benchmark.py (--checkpointing for step 12).
def _mb(n_bytes: float) -> str:
    return f"{n_bytes / 1e6:.1f} MB"


def _domain_config(config: dict) -> str:
    repeats = config.get("repeats", 1)
    return (f"width {config['width']}, {config['layers']} blocks, {config['fno_modes']} modes per "
            f"axis, batch {config['batch_size']}; ms/step: the median of the traced steps (of the "
            f"slowest rank), "
            + (f"the fastest of {repeats} rounds" if repeats > 1 else "one run")
            + f"; {config['device'].upper()}, one thread per rank")


def checkpointing_table(root: Path) -> str:
    """Exercise 12's plain vs checkpointed step, from results/12_checkpointing.json."""
    result = _result(root, "12_checkpointing.json")
    d = result["data"]
    by = {row["checkpointed"]: row for row in d["modes"]["checkpointing"]}
    plain, ckpt = by[False], by[True]
    c = d["config"]
    rows = [[f"{plain['grid'].replace('x', '×')}, {c['layers']}, {c['batch_size']}",
             _mb(plain["peak_bytes_per_rank"]), _mb(ckpt["peak_bytes_per_rank"]),
             f"**{ckpt['peak_bytes_per_rank'] / plain['peak_bytes_per_rank']:.2f}**",
             f"{plain['step_ms']:.0f}", f"{ckpt['step_ms']:.0f}",
             f"**{ckpt['step_ms'] / plain['step_ms']:.2f}**"]]
    estimate = checkpointing_estimates(c, tuple(int(n) for n in plain["grid"].split("x")))
    ratios = [estimate[k] / by[k]["peak_bytes_per_rank"] for k in (False, True)]
    return (md_table(["grid, layers, batch", "peak plain", "peak checkpointed", "peak ratio",
                      "ms/step plain", "ms/step checkpointed", "step time ratio"], rows, "lrrrrrr")
            + f"\n\nOne rank, synthetic batches; {_domain_config(c)}. `wellfno.memory.step_bytes` "
            f"estimates {_mb(estimate[False])} plain and {_mb(estimate[True])} checkpointed for this "
            f"model (task 4): {ratios[0]:.2f}× and {ratios[1]:.2f}× the measured peaks.\n\n"
            + _caption(result))


def checkpointing_estimates(config: dict, grid: tuple[int, ...]) -> dict[bool, int]:
    """wellfno.memory.step_bytes, plain (False) and checkpointed (True), of the benchmark's model
    (solutions/13_domain_parallel/benchmark.py: 3 channels, one input step): an estimate, no run."""
    import torch

    from wellfno import memory
    from wellfno.model import NextFrameFNO

    model = NextFrameFNO(3, 1, {k: torch.ones(3) for k in ("mean", "std", "mean_delta", "std_delta")},
                         n_spatial_dims=len(grid), resolution=grid, modes=config["fno_modes"],
                         width=config["width"], layers=config["layers"])
    n_parameters = sum(p.numel() for p in model.parameters())
    return {checkpointed: memory.step_bytes(n_parameters, config["batch_size"], grid,
                                            model.in_channels, model.channels_per_frame,
                                            config["width"], config["layers"], checkpointed)
            for checkpointed in (False, True)}


def domain_scaling_table(root: Path) -> str:
    """Exercise 13's weak and strong domain scaling, from results/13_domain_scaling.json."""
    result = _result(root, "13_domain_scaling.json")
    d = result["data"]
    rows = []
    for mode, mode_rows in d["modes"].items():
        first = mode_rows[0]
        for r in mode_rows:
            if mode == "strong":
                speed_up = first["step_ms"] / r["step_ms"]
                scaled = f"speed-up {speed_up:.2f}× (efficiency {r['efficiency']:.2f})"
            else:
                scaled = f"efficiency {r['efficiency']:.2f}"
            rows.append([mode, r["ranks"], r["grid"].replace("x", " × "), f"{r['step_ms']:.0f}",
                         scaled,
                         f"{100 * r['exchange_share']:.1f} %", _mb(r["peak_bytes_per_rank"])])
    return (md_table(["mode", "ranks", "grid", "ms/step", "efficiency / speed-up", "exchange share",
                      "peak per rank"], rows, "lrlrlrr")
            + f"\n\nSynthetic batches; {_domain_config(d['config'])}.\n\n" + _caption(result))


def checkpointing_readme_row(result: dict) -> list[str]:
    """The course README's results row of exercise 12 (step, command, what it measured)."""
    by = {row["checkpointed"]: row for row in result["data"]["modes"]["checkpointing"]}
    plain, ckpt = by[False], by[True]
    link = "[exercise 12](exercises/12_checkpointing/background.md#what-you-should-see)"
    return ["12", f"`{result['command']}` ({link})",
            f"{plain['grid'].replace('x', '×')}, {result['data']['config']['layers']} blocks, one "
            f"rank: peak {_mb(plain['peak_bytes_per_rank'])} plain, "
            f"{_mb(ckpt['peak_bytes_per_rank'])} checkpointed "
            f"(**{ckpt['peak_bytes_per_rank'] / plain['peak_bytes_per_rank']:.2f}×**), step time "
            f"**{ckpt['step_ms'] / plain['step_ms']:.2f}×**"]


def domain_readme_row(result: dict) -> list[str]:
    """The course README's results row of exercise 13 (step, command, what it measured)."""
    parts = []
    for mode, rows in result["data"]["modes"].items():
        first, last = rows[0], rows[-1]
        gain = (f"efficiency **{last['efficiency']:.2f}**" if mode == "weak" else
                f"speed-up **{first['step_ms'] / last['step_ms']:.2f}×**")
        parts.append(f"{mode} {first['ranks']} to {last['ranks']} domain ranks: {gain}, exchange "
                     f"{100 * last['exchange_share']:.0f} % of a step, peak per rank "
                     f"{_mb(first['peak_bytes_per_rank'])} to {_mb(last['peak_bytes_per_rank'])}")
    link = "[exercise 13](exercises/13_domain_parallel/background.md#what-you-should-see)"
    return ["13", f"`{result['command']}` ({link})",
            "; ".join(parts)]


# --------------------------------------------------------------------------- command line
# --------------------------------------------------------------------------- exercise 14
_LONG_ROLLOUTS_OLD = ("results/14_long_rollouts.json was written by an earlier compare.py (no "
                      "windows, intervals or mean field): measure it again, `make results "
                      "ONLY=14_long_rollouts`.")


def _long_rollouts(root: Path) -> tuple[dict, dict] | tuple[dict, None]:
    """(the results file, its data when compare.py's format 2 wrote it, else None)."""
    result = _result(root, "14_long_rollouts.json")
    return result, (result["data"] if result["data"].get("format") == 2 else None)


def _pm(part: dict | None, digits: int = 3) -> str:
    """'mean ± half-width' of an interval over seeds (the mean alone for one seed)."""
    if part is None:
        return ""
    half = part.get("half_width")
    return f"{part['mean']:.{digits}f}" + ("" if half is None else f" ± {half:.{digits}f}")


def _behind(step: int | None) -> str:
    return "never" if step is None else str(step)


def _seed_range(steps: list) -> str:
    """The seeds' earliest and latest step behind persistence ('never' for a seed never behind)."""
    found = sorted(k for k in steps if k is not None)
    if not found:
        return "never"
    low, high = str(found[0]), "never" if None in steps else str(found[-1])
    return low if low == high else f"{low}–{high}"


def _run_of(d: dict, name: str) -> str:
    spec = d["variants"][name]
    flags = " ".join(spec["flags"] + (["--epochs", str(spec["epochs"])]
                                      if spec["epochs"] != d["epochs"] else []))
    return f"`{spec['script']} {flags}`".replace(" `", "`") + ("" if flags else " (its defaults)")


def long_rollouts_table(root: Path) -> str:
    """Exercise 14's variants side by side, from results/14_long_rollouts.json (compare.py): The
    Well's VRMSE per window, mean over seeds ± its 95 % interval, where each falls behind
    persistence, the paired difference to the reference; then what each costs."""
    result, d = _long_rollouts(root)
    if d is None:
        return _LONG_ROLLOUTS_OLD
    windows = d["windows"]
    heads = [(f"all {w['last']}" if w["window"] == "all" else w["window"])
             + ("" if w["complete"] else "*") for w in windows]
    ref = d["reference"]
    rows = []
    for name, s in d["summary"].items():
        label = f"**{name}** (the default)" if name == d["default_variant"] else name
        seeds = _seed_range(s["behind_persistence_from_by_seed"])
        versus = s.get("vs_reference", {}).get("all")
        rows.append([label, _run_of(d, name)]
                    + [_pm(s["windows"].get(w["window"]), 4 if w["window"] in ("1", "2") else 3)
                       for w in windows]
                    + [f"{_behind(s['behind_persistence_from'])} ({seeds})",
                       "" if name == ref else (_pm(versus) if versus else "-")])
    for name, what in (("persistence", "the last input frame, repeated"),
                       ("mean field", "each field's spatial mean of the true frame")):
        part = d[name.replace(" ", "_")]
        rows.append([name, what] + [f"{part['windows'][w['window']]:.4f}" for w in windows]
                    + ["", ""])
    quality = md_table(["variant", "run"] + heads + ["behind persistence from step (seeds)",
                                                     f"vs {ref}, all {d['steps']} steps"],
                       rows, "ll" + "r" * (len(heads) + 2))
    cost_rows = []
    for name, s in d["summary"].items():
        cost_rows.append([name, str(s["epochs"]), str(s["training_samples"]),
                          f"{s['training_flops'] / 1e12:.2f}" if s["training_flops"] else "-",
                          f"{s['samples_per_second']:.1f}" if s["samples_per_second"] else "-",
                          f"{s['flops_per_sample'] / 1e6:.0f}" if s["flops_per_sample"] else "-",
                          _mb(s["peak_memory_bytes"]) if s["peak_memory_bytes"] else "-"])
    cost = md_table(["variant", "epochs", "samples trained", "TFLOP per run", "samples/s",
                     "MFLOP/sample", "peak memory"], cost_rows, "lrrrrrr")
    seeds, n = "/".join(map(str, d["seeds"])), len(d["seeds"])
    partial = [w for w in windows if not w["complete"]]
    return (quality + "\n\n" + cost
            + f"\n\nThe Well's VRMSE (`python -m wellfno.evaluate --context {d['context']}`) over "
            f"{d['trajectories']} validation trajectories of {d['dataset']}, each rolled out for "
            f"{d['steps']} steps after its first {d['context']} frames (a model that sees fewer "
            f"frames is given the last of them), {d['epochs']} epochs a run"
            + "".join(f" ({name}: {spec['epochs']})" for name, spec in d["variants"].items()
                      if spec["epochs"] != d["epochs"])
            + f"; each window's mean over its steps, then over seeds {seeds}"
            + (f" ± the 95 % interval of that mean (Student's t with {n - 1} degrees of freedom: "
               f"t·s/√{n}, s the seeds' standard deviation)" if n > 1 else "")
            + "; behind persistence from: the first step at which the mean over the seeds is "
            "above persistence's (in brackets the seeds' earliest and latest such step; never: "
            f"not within the {d['steps']} steps); vs {ref}: the mean over seeds of the difference "
            f"to {ref} of the same seed, ± its interval (below 0 by more than the interval: "
            f"lower than {ref}); the mean field scores what VRMSE calls 1. Costs from each run's "
            "metrics.json (means over seeds): TFLOP per run, MFLOP per sample times the samples "
            "trained; peak memory, the process's maximum RSS on a CPU"
            + (f"; {d['jobs']} runs at a time, {d['threads_per_run']} thread(s) each"
               if d.get("threads_per_run") else "")
            + "."
            + "".join(f" {w['window']}*: steps {w['first']}–{w['last']} only." for w in partial)
            + "\n\n" + _caption(result))


def long_rollouts_claims(root: Path) -> str:
    """Exercise 14's claims as sentences, from results/14_long_rollouts.json: per variant, up to
    which step it is ahead of persistence and by how much it is behind after; then the verdict
    of the default's rule (compare.py's `rule`)."""
    result, d = _long_rollouts(root)
    if d is None:
        return _LONG_ROLLOUTS_OLD
    persistence, ref = d["persistence"]["per_step"], d["reference"]
    field = d["mean_field"]["windows"]
    late = next((w for w in d["windows"] if w["window"] == "13:30"), None)
    lines = []
    for name, s in d["summary"].items():
        k, stays = s["behind_persistence_from"], s["stays_behind_persistence_from"]
        if k is None:
            said = f"ahead of persistence at every one of the {d['steps']} steps"
        elif k == 1:
            gap = max(m - p for m, p in zip(s["per_step"], persistence))
            said = f"behind persistence from step 1, by at most {gap:.3f} in VRMSE"
        else:
            gap = max(m - p for m, p in zip(s["per_step"][k - 1:], persistence[k - 1:]))
            said = (f"ahead of persistence up to step {k - 1}, then behind it"
                    + ("" if stays == k else f" (for good from step {stays})" if stays else
                       " (ahead again by the last step)")
                    + f", by at most {gap:.3f} in VRMSE")
        said += f" (mean of {len(d['seeds'])} seeds)"
        if late:
            part = s["windows"]["13:30"]
            said += (f"; steps {late['first']}–{late['last']}: {_pm(part)} against persistence's "
                     f"{d['persistence']['windows']['13:30']:.3f} and the mean field's "
                     f"{field['13:30']:.3f}")
        versus = s.get("vs_reference", {}).get("all")
        if versus and versus.get("half_width") is not None:
            said += f"; all {d['steps']} steps {_pm(versus)} against {ref}"
        lines.append(f"- **{name}**: {said}.")
    v = d["verdict"]
    if v.get("why"):
        lines.append(f"- The default's rule gives no verdict: {v['why']}.")
    else:
        passing = ", ".join(v["passing"]) or "none"
        lines.append(f"- The default's rule: passing {passing}; "
                     + (f"the cheapest, **{v['chosen']}**" if v["remedy"] else
                        f"so no remedy (**{ref}**)")
                     + f". Solution 14's default is {v['solution_default']}: "
                     + ("the rule's pick." if v["agrees"] else "**not** the rule's pick."))
    return "\n".join(lines) + "\n\n" + _caption(result)


def long_rollouts_readme_row(result: dict) -> list[str]:
    """The course README's row of exercise 14, from results/14_long_rollouts.json."""
    d = result["data"]
    link = ("[exercise 14](exercises/14_long_rollouts/background.md#what-you-should-see)")
    if d.get("format") != 2:
        return ["14", f"`{result['command']}` ({link})", _LONG_ROLLOUTS_OLD]
    v, chosen = d["verdict"], d["summary"].get(d["verdict"].get("chosen") or "")
    said = "the default's rule gives no verdict" + (f" ({v['why']})" if v.get("why") else "")
    if chosen:
        k = chosen["behind_persistence_from"]
        said = ((f"the default's rule picks **{v['chosen']}**" if v["remedy"] else
                 f"no remedy passes the default's rule: **{v['chosen']}**")
                + f" ({len(d['seeds'])} seeds): "
                + (f"ahead of persistence at all {d['steps']} steps" if k is None else
                   "behind persistence from step 1" if k == 1 else
                   f"ahead of persistence up to step {k - 1} of {d['steps']}")
                + f", {_pm(chosen['windows']['all'])} over all steps vs "
                f"{d['persistence']['whole_trajectory']:.3f} for persistence")
    return ["14", f"`{result['command']}` ({link})",
            said + "; GPU: the same command, to be measured"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Results files and the tables generated from them.")
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("render", help="regenerate the docs' tables from results/")
    r.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is stale")
    r.add_argument("--root", default=".", help="repository root (default: here)")
    t = sub.add_parser("runtimes", help="time each step's documented command on this machine")
    t.add_argument("--root", default=".")
    t.add_argument("--out", default="results/runtimes.json")
    t.add_argument("--repeats", type=int, default=1,
                   help="runs of each command; its fastest is kept")
    args = p.parse_args(argv)
    root = Path(args.root).resolve()
    if not (root / "fno.py").is_file():
        raise UserError(f"{root} is not the repository root (no fno.py there): use --root")
    if args.what == "render":
        stale = render(root, check=args.check)
        for path in stale:
            print(f"{'stale' if args.check else 'updated'}: {path.relative_to(root)}")
        return 1 if args.check and stale else 0
    if args.repeats < 1:
        raise UserError("--repeats must be at least 1")
    measure_runtimes(root, root / args.out if not Path(args.out).is_absolute() else Path(args.out), args.repeats)
    print(f"wrote {args.out}; now run: python -m coursetools.results render")
    return 0


if __name__ == "__main__":
    run_main(main)
