"""Read and write torch.profiler Chrome traces; find the profiled steps and the labelled ranges in them.

A Chrome trace is plain JSON: {"traceEvents": [...], ...}. The events used here:
  ph "X" (complete event: ts and dur in microseconds, pid, tid, name, cat)
    cat "user_annotation"      record_function ranges, ProfilerStep#N included (host threads)
    cat "cpu_op"               aten operators (host threads)
    cat "kernel", "gpu_memcpy", "gpu_memset"   device work; pid = device, tid = stream
  ph "M" metadata (process_name, thread_name), ph "s"/"f" flow arrows (id), ph "i" instants.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
from pathlib import Path

from wellfno.cli import UserError, atomic_write_bytes

# The parts of a training step, in step order. A labelled range belongs to the first part one of
# whose keywords its (lower-cased) name contains; "h2d" goes before "data" so that
# "batch_to_device" is a copy, not a wait.
PARTS = ("data_wait", "h2d_copy", "forward", "backward", "optimizer")
KEYWORDS = {
    "h2d_copy": ("h2d", "copy", "to_device", "transfer", "host"),
    "forward": ("forward",),
    "backward": ("backward",),
    "optimizer": ("optimizer",),
    "data_wait": ("data", "batch", "wait", "load"),
}
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
STEP_RE = re.compile(r"ProfilerStep#(\d+)$")


def part_of(name: str) -> str | None:
    lowered = name.lower()
    for part, words in KEYWORDS.items():
        if any(word in lowered for word in words):
            return part
    return None


def load(path: str | os.PathLike) -> dict:
    """A trace file (.json or .json.gz) as a dict, or a UserError that says what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such trace file (torch.profiler writes OUT/trace_rank*_steps*.json.gz)")
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    try:
        with opener(path, "rt") as f:
            trace = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, EOFError) as err:
        raise UserError(f"{path} is not a Chrome trace ({err.__class__.__name__}: {err}); "
                        f"pass a file written by torch.profiler (export_chrome_trace)") from None
    if isinstance(trace, list):  # the JSON Array Format of the Chrome trace spec
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise UserError(f"{path} is JSON but not a Chrome trace (no traceEvents list)")
    return trace


def save(prof, path: str | os.PathLike, rank: int = 0) -> Path:
    """on_trace_ready helper: export the window gzipped and atomically, tagged with the rank.

    `distributedInfo.rank` is where HolisticTraceAnalysis and merge_traces.py read the rank;
    torch writes it itself only when torch.distributed is initialised. It is spliced in as text
    (the trace can be tens of MB; parsing it only to add one key would double the export time).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".trace-") as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        payload = raw.read_bytes()
    if b'"distributedInfo"' not in payload[:65536]:  # torch writes it, if at all, before traceEvents
        brace = payload.index(b"{") + 1
        payload = payload[:brace] + b'\n  "distributedInfo": {"rank": %d},' % rank + payload[brace:]
    return atomic_write_bytes(path, gzip.compress(payload, compresslevel=6))


def complete_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and "ts" in e and "dur" in e]


def profiler_steps(trace: dict) -> list[dict]:
    """The ProfilerStep#N events, in step order; UserError if there are none."""
    steps = [e for e in complete_events(trace) if STEP_RE.match(str(e.get("name", "")))]
    if not steps:
        raise UserError("the trace has no ProfilerStep#N events: profile with a schedule and call prof.step() "
                        "once per training step")
    return sorted(steps, key=lambda e: e["ts"])


def step_number(event: dict) -> int:
    return int(STEP_RE.match(event["name"]).group(1))


def outermost(events) -> list[dict]:
    """The events not nested in another one of `events` (one lane): a child's time is its parent's."""
    kept, end = [], float("-inf")
    for event in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if event["ts"] >= end:
            kept.append(event)
            end = event["ts"] + event["dur"]
    return kept


def labelled_ranges(trace: dict, pid, tid) -> list[dict]:
    """record_function ranges of one host thread (ProfilerStep#N excluded), outermost only.

    A range inside another labelled range belongs to its parent: counting both would count
    the time twice.
    """
    return outermost(e for e in complete_events(trace)
                     if e.get("cat") == "user_annotation" and e.get("pid") == pid and e.get("tid") == tid
                     and not STEP_RE.match(str(e.get("name", ""))))


def union_length(intervals) -> float:
    """Total length covered by (start, end) intervals, overlaps counted once."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def clip(event: dict, start: float, end: float) -> tuple[float, float] | None:
    lo, hi = max(event["ts"], start), min(event["ts"] + event["dur"], end)
    return (lo, hi) if hi > lo else None


def device_events(trace: dict) -> list[dict]:
    return [e for e in complete_events(trace) if e.get("cat", "").lower() in DEVICE_CATEGORIES]


def rank_of(trace: dict, path: str | os.PathLike | None = None, default: int = 0) -> int:
    """distributedInfo.rank, else the rankN in the file name, else `default`."""
    info = trace.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    match = re.search(r"rank(\d+)", Path(path).name) if path else None
    return int(match.group(1)) if match else default
