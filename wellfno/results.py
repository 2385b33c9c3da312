"""Results files, and the README tables generated from them.

Every number a README or INSTRUCTORS.md quotes comes from a JSON file under `results/`, written by
the command that measured it, naming the machine. A table in a Markdown file is generated:

    <!-- table: wellfno.results:runtimes_table -->
    | ... generated, do not edit ... |
    <!-- /table -->

    python -m wellfno.results render            # regenerate every such table in the repository's docs
    python -m wellfno.results render --check    # exit 1 if a table and its results file disagree (a test runs this)
    python -m wellfno.results runtimes          # time each step's documented command -> results/runtimes.json

A renderer is any `module:function` taking the repository root and returning Markdown; tools that write a
results file keep the renderer for it beside the code that writes it.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wellfno.cli import UserError, atomic_write_json, atomic_write_text, run_main
from wellfno.machine import describe, machine_info

DOCS = ("README.md", "INSTRUCTORS.md", "DESIGN.md", "slurm/README.md", "exercises/*/README.md")
TABLE = re.compile(r"(<!-- table: (?P<spec>[\w.]+:\w+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


# --------------------------------------------------------------------------- results files
def write_result(path: str | os.PathLike, command: str, data: dict, device=None) -> Path:
    """Write a results file: what was run, where, when, and what it measured (atomically)."""
    return atomic_write_json(path, {"command": command, "machine": machine_info(device),
                                    "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                                    "data": data})


def read_result(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        result = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} is missing: run the command that writes it (see `make results`)") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path} is not valid JSON ({err.msg}): run its command again") from None
    if not isinstance(result, dict) or not {"command", "machine", "data"} <= result.keys():
        raise UserError(f"{path} lacks command/machine/data: it was not written by wellfno.results.write_result")
    return result


def caption(result: dict) -> str:
    """The line under a generated table: command, machine and date."""
    when = result.get("measured_at", "")[:10]
    return f"_Measured by `{result['command']}` on {describe(result['machine'])}{', ' + when if when else ''}._"


def md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- tables in the docs
def doc_files(root: Path) -> list[Path]:
    found = []
    for pattern in DOCS:
        found += sorted(root.glob(pattern))
    return found


def render_text(text: str, root: Path) -> str:
    def replace(match: re.Match) -> str:
        module, func = match.group("spec").split(":")
        try:
            renderer = getattr(importlib.import_module(module), func)
        except (ImportError, AttributeError):
            raise UserError(f"table renderer {match.group('spec')} does not exist") from None
        return match.group(1) + renderer(root).rstrip("\n") + "\n" + match.group(4)
    return TABLE.sub(replace, text)


def render(root: Path, check: bool = False) -> list[Path]:
    """Regenerate every table; with check, change nothing and return the files that are stale."""
    stale = []
    for path in doc_files(root):
        text = path.read_text()
        new = render_text(text, root)
        if new != text:
            stale.append(path)
            if not check:
                atomic_write_text(path, new)
    return stale


# --------------------------------------------------------------------------- step runtimes
# Each step's command as the docs give it: {py} the venv's python, {D} the data dir, {OUT} an output folder.
RUNTIME_COMMANDS = [
    ("data", "{py} -m wellfno.grayscott --data-dir {D} --size demo"),
    ("00", "{py} fno.py --data-dir {D} --out {OUT}/00"),
    ("01", "{py} solutions/01_profiling/fno.py --profile --data-dir {D} --out {OUT}/01"),
    ("03", "{py} affinity/report.py --workers 2"),
    ("04", "{py} stats.py {D}/datasets/gray_scott_embedded --out {OUT}/stats.yaml"),
    ("04", "{py} -m torch.distributed.run --standalone --nproc_per_node=2 "
           "solutions/04_distributed_stats/stats.py {D}/datasets/gray_scott_embedded --out {OUT}/stats2.yaml"),
]


def measure_runtimes(root: Path, out_json: Path) -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="wellfno-runtimes-") as scratch:
        for step, template in RUNTIME_COMMANDS:
            shown = template.format(py="python", D="D", OUT="OUT")
            argv = shlex.split(template.format(py=sys.executable, D=f"{scratch}/data", OUT=f"{scratch}/runs"))
            print(f"[{step}] {shown}", flush=True)
            start = time.perf_counter()
            proc = subprocess.run(argv, cwd=root, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise UserError(f"step {step} failed ({shown}): {last}")
            row = {"step": step, "command": shown, "seconds": round(seconds, 1)}
            metrics = Path(scratch, "runs", "00", "metrics.json")
            if step == "00" and metrics.exists():
                m = json.loads(metrics.read_text())
                row["samples_per_second"] = round(m["samples_per_second"], 1)
                row["rollout_vrmse_step1"] = round(m["rollout_vrmse"][0], 4)
                row["persistence_vrmse_step1"] = round(m["persistence_vrmse"][0], 4)
            rows.append(row)
            print(f"      {seconds:.1f} s", flush=True)
    write_result(out_json, "python -m wellfno.results runtimes", {"rows": rows})
    return {"rows": rows}


def runtimes_table(root: Path) -> str:
    result = read_result(root / "results" / "runtimes.json")
    rows = []
    for row in result["data"]["rows"]:
        extra = ""
        if "samples_per_second" in row:
            extra = (f"; {row['samples_per_second']:.0f} samples/s, rollout VRMSE step 1 "
                     f"{row['rollout_vrmse_step1']:.3f} (persistence {row['persistence_vrmse_step1']:.3f})")
        rows.append([row["step"], f"`{row['command']}`", f"{row['seconds']:.1f} s{extra}"])
    return md_table(["step", "command", "wall time"], rows) + "\n\n" + caption(result)


# --------------------------------------------------------------------------- command line
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Results files and the tables generated from them.")
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("render", help="regenerate the docs' tables from results/")
    r.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is stale")
    r.add_argument("--root", default=".", help="repository root (default: here)")
    t = sub.add_parser("runtimes", help="time each step's documented command on this machine")
    t.add_argument("--root", default=".")
    t.add_argument("--out", default="results/runtimes.json")
    args = p.parse_args(argv)
    root = Path(args.root).resolve()
    if not (root / "fno.py").is_file():
        raise UserError(f"{root} is not the repository root (no fno.py there): use --root")
    if args.what == "render":
        stale = render(root, check=args.check)
        for path in stale:
            print(f"{'stale' if args.check else 'updated'}: {path.relative_to(root)}")
        return 1 if args.check and stale else 0
    measure_runtimes(root, root / args.out if not Path(args.out).is_absolute() else Path(args.out))
    print(f"wrote {args.out}; now run: python -m wellfno.results render")
    return 0


if __name__ == "__main__":
    run_main(main)
