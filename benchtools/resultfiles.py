"""Results files: what a measuring command ran, on which machine, when, and what it measured.

The bottom of the numbers pipeline: benchmarks write these files (`write_result`);
coursetools.results renders the docs' tables from them. No renderer lives here, so any module may
write or read a results file without importing the renderers. The machine's `load_average` is the
load when the file was written (the end of the measurement); `make results` (coursetools.measure)
adds the load at its start (`add_load_at_start`).

Each file also records the code it measured: the commit of this checkout (`git rev-parse HEAD`)
and whether the tree was clean (`git status --porcelain`; the uncommitted paths when not), so that
coursetools.staleness can tell when the code a number came from has changed since. Without git
(an installed copy, a tarball), the commit is null and the file says why. Its command and the
commands in its data are repository-relative: `python` for this interpreter, paths from the root.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from benchtools.machine import describe, machine_info
from wellfno.cli import UserError, atomic_write_json


# The checkout these tools run from (the packages are an editable install of it): its commit is
# the measured code's, whatever folder the command ran in.
REPO = Path(__file__).resolve().parents[1]


def _git(root: Path, *args: str) -> str | None:
    """git's output in `root`, or None where there is no git or no checkout."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def code_stamp(root: str | os.PathLike = REPO) -> dict:
    """The code a measurement ran: {commit, clean, uncommitted paths} from git, or a null commit
    and why (no git, not a checkout)."""
    commit = _git(Path(root), "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    # -z: paths as they are (no quoting); a rename's entry is followed by its old path
    status = _git(Path(root), "status", "--porcelain", "-z", "--untracked-files=all") \
        if commit else None
    if commit is None or status is None:
        return {"commit": None, "clean": None,
                "commit_note": "not measured in a git checkout (or git is missing): which code it "
                               "measured is unknown, so it counts as stale"}
    uncommitted, entries = set(), iter(status.split("\0"))
    for entry in entries:
        if entry:
            uncommitted.add(entry[3:])
            if entry[0] in "RC":
                uncommitted.add(next(entries, ""))
    uncommitted.discard("")
    stamp = {"commit": commit.strip(), "clean": not uncommitted}
    if uncommitted:
        stamp["uncommitted"] = sorted(uncommitted)
    return stamp


def repository_relative(value, root: str | os.PathLike = REPO, python: str = sys.executable):
    """`value` (a string, or lists and dicts of them) with this interpreter as `python` and paths
    under the repository relative to its root: a results file names no folder of the machine
    that measured it, and its commands run from the root as they stand."""
    edge = r"(?<![\w./-])"  # a whole word: not the tail of a longer path
    rules = [(re.compile(edge + re.escape(python) + r"(?![\w./-])"), "python"),
             (re.compile(edge + re.escape(str(root)) + "/"), ""),
             (re.compile(edge + re.escape(str(root)) + r"(?![\w./-])"), ".")]

    def relative(item):
        if isinstance(item, str):
            for pattern, replacement in rules:
                item = pattern.sub(replacement, item)
            return item
        if isinstance(item, dict):
            return {key: relative(v) for key, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [relative(v) for v in item]
        return item
    return relative(value)


def write_result(path: str | os.PathLike, command: str, data: dict, device=None) -> Path:
    """Write a results file: what was run, where, when, on which commit, and what it measured
    (atomically)."""
    stamp = code_stamp()
    if stamp["commit"] is None:
        print(f"warning: {path} records no commit: {stamp['commit_note']}", file=sys.stderr)
    when = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return atomic_write_json(path, {"command": repository_relative(command),
                                    "machine": machine_info(device), "measured_at": when,
                                    **stamp, "data": repository_relative(data)})


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
    commit = f" at commit {result['commit'][:7]}" if result.get("commit") else ""
    return (f"_Measured by `{result['command']}`{commit} on {describe(result['machine'])}"
            f"{', ' + when if when else ''}._")


def md_table(header: list[str], rows: list[list], align: str = "") -> str:
    """A Markdown table; `align` has one letter per column, r for right-aligned (numbers), else left."""
    rule = ["---:" if a == "r" else "---" for a in align.ljust(len(header), "l")]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
