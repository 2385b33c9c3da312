"""Results files: what a measuring command ran, on which machine, when, and what it measured.

The bottom of the numbers pipeline: benchmarks write these files (`write_result`);
coursetools.results renders the docs' tables from them. No renderer lives here, so any module may
write or read a results file without importing the renderers. The machine's `load_average` is the
load when the file was written (the end of the measurement); `make results` (coursetools.measure)
adds the load at its start (`add_load_at_start`).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

from benchtools.machine import describe, machine_info
from wellfno.cli import UserError, atomic_write_json


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
        raise UserError(f"{path} lacks command/machine/data: it was not written by benchtools.resultfiles.write_result")
    return result


def add_load_at_start(path: str | os.PathLike, load: float | None) -> None:
    """Add to a results file the load average when its command started (the rest stays)."""
    result = read_result(path)
    if load is not None and isinstance(result.get("machine"), dict):
        result["machine"]["load_average_at_start"] = load
        atomic_write_json(path, result)


def caption(result: dict) -> str:
    """The line under a generated table: command, machine and date."""
    when = result.get("measured_at", "")[:10]
    return f"_Measured by `{result['command']}` on {describe(result['machine'])}{', ' + when if when else ''}._"


def md_table(header: list[str], rows: list[list], align: str = "") -> str:
    """A Markdown table; `align` has one letter per column, r for right-aligned (numbers), else left."""
    rule = ["---:" if a == "r" else "---" for a in align.ljust(len(header), "l")]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
