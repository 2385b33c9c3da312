"""Read and write torch.profiler Chrome traces; find the profiled steps, the labelled ranges, and which
host call launched each piece of device work.

A Chrome trace is plain JSON: {"traceEvents": [...], ...}. torch.profiler writes it through Kineto,
whose event categories are the same on NVIDIA (CUPTI) and AMD (roctracer / rocprofiler) GPUs:
  ph "X" (complete event: ts and dur in microseconds, pid, tid, name, cat, args)
    "user_annotation"       record_function ranges, ProfilerStep#N included (host threads)
    "gpu_user_annotation"   the same ranges mirrored on a GPU lane (CUDA and ROCm traces): NOT steps,
                            NOT device work; counting them made every step appear twice
    "cpu_op"                aten operators (host threads)
    "cuda_runtime", "cuda_driver"   runtime/driver API calls on the host: cudaLaunchKernel, ... and on
                            ROCm the hip* calls (hipLaunchKernel, hipMemcpyWithStream, ...) under the
                            same category
    "kernel", "gpu_memcpy", "gpu_memset"   device work; pid = device, tid = stream
    "cuda_sync"             CUPTI synchronization records (Stream Sync, Context Sync, Event Sync,
                            Stream Wait Event) drawn on the GPU lane
  ph "s"/"f" cat "ac2g"     flow arrow from a runtime call ("s") to the device work it launched ("f"),
                            id = the correlation id
  ph "M" metadata (process_name, thread_name), ph "i" instants.
Device work and its runtime call carry the same args["correlation"]; the runtime call and the aten
op that made it share args["External id"]. Sources: Kineto's category names,
https://github.com/pytorch/kineto/blob/main/libkineto/src/ActivityType.cpp ; ROCm runtime calls as
CUDA_RUNTIME and copies/fills/kernels as GPU_MEMCPY/GPU_MEMSET/CONCURRENT_KERNEL,
https://github.com/pytorch/kineto/blob/main/libkineto/src/RoctracerActivity.h (and _inl.h: which hip*
calls start a flow). HolisticTraceAnalysis links a kernel to its launch the same way ("the correlation
in the trace is a reference ID which links a Cuda kernel launch and the cuda kernel",
https://github.com/facebookresearch/HolisticTraceAnalysis/blob/main/hta/common/trace.py).
"""
from __future__ import annotations

import bisect
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
HOST_RANGE = "user_annotation"
DEVICE_RANGE = "gpu_user_annotation"
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
SYNC_CATEGORY = "cuda_sync"
FLOW_CATEGORY = "ac2g"
# Events that live on a GPU lane (pid = device): never host time, never a step.
DEVICE_LANE_CATEGORIES = (*DEVICE_CATEGORIES, DEVICE_RANGE, SYNC_CATEGORY)
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


def category(event: dict) -> str:
    return str(event.get("cat", "")).lower()


def is_host(event: dict) -> bool:
    return category(event) not in DEVICE_LANE_CATEGORIES


def profiler_steps(trace: dict) -> list[dict]:
    """The ProfilerStep#N events of the host, in step order; UserError if there are none.

    On GPU traces Kineto mirrors each ProfilerStep onto the GPU lane as gpu_user_annotation:
    the host's event defines the step, the mirror is ignored.
    """
    steps = [e for e in complete_events(trace) if STEP_RE.match(str(e.get("name", ""))) and is_host(e)]
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
                     if category(e) == HOST_RANGE and e.get("pid") == pid and e.get("tid") == tid
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


def merged(intervals) -> list[tuple[float, float]]:
    """(start, end) intervals as a sorted list of disjoint ones covering the same time."""
    out = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def intersection(a, b) -> list[tuple[float, float]]:
    """The time covered by both sets of intervals."""
    a, b, out, i, j = merged(a), merged(b), [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def difference(a, b) -> list[tuple[float, float]]:
    """The time covered by `a` and not by `b`."""
    out, b = [], merged(b)
    for start, end in merged(a):
        for lo, hi in b:
            if hi <= start or lo >= end:
                continue
            if lo > start:
                out.append((start, lo))
            start = max(start, hi)
        if end > start:
            out.append((start, end))
    return out


def span(event: dict) -> tuple[float, float]:
    return event["ts"], event["ts"] + event["dur"]


def clip(event: dict, start: float, end: float) -> tuple[float, float] | None:
    lo, hi = max(event["ts"], start), min(event["ts"] + event["dur"], end)
    return (lo, hi) if hi > lo else None


def device_events(trace: dict) -> list[dict]:
    """Kernels, copies and fills: the work a GPU did (never the mirrored gpu_user_annotation ranges)."""
    return [e for e in complete_events(trace) if category(e) in DEVICE_CATEGORIES]


def launches(trace: dict) -> list[tuple[dict, dict | None]]:
    """(device-side event, the host runtime call that launched it, or None) for every kernel, copy,
    fill and cuda_sync record.

    The link is the correlation id, in the device event's args ("correlation") or, where a build
    writes no args for device work (Kineto's roctracer path leaves them empty), through the ac2g
    flow arrow that ends on the device event. Time overlap is no link: a kernel runs long after,
    and on another lane than, the host range that launched it.
    """
    events = complete_events(trace)
    runtime = [e for e in events if category(e) in RUNTIME_CATEGORIES]
    by_correlation = {e["args"]["correlation"]: e for e in runtime
                      if isinstance(e.get("args"), dict) and "correlation" in e["args"]}
    by_place = {(e.get("pid"), e.get("tid"), e["ts"]): e for e in runtime}
    flow_start, flow_end = {}, {}
    for e in trace["traceEvents"]:
        if category(e) == FLOW_CATEGORY and e.get("ph") in ("s", "f"):
            place = (e.get("pid"), e.get("tid"), e.get("ts"))
            if e["ph"] == "s":
                flow_start[e.get("id")] = place
            else:
                flow_end[place] = e.get("id")
    linked = []
    for e in events:
        if category(e) not in (*DEVICE_CATEGORIES, SYNC_CATEGORY):
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        launcher = by_correlation.get(args.get("correlation"))
        if launcher is None:
            flow = flow_end.get((e.get("pid"), e.get("tid"), e["ts"]))
            launcher = by_correlation.get(flow) or by_place.get(flow_start.get(flow))
        linked.append((e, launcher))
    return linked


class StepLocator:
    """Which profiled step, and which part of it, a host timestamp falls in.

    Parts are the outermost labelled ranges of the thread that calls prof.step(): time on any
    other host thread (the autograd thread that runs backward on GPUs, a launcher thread) is
    attributed to what the stepping thread was doing at that moment.
    """

    def __init__(self, trace: dict):
        self.steps = profiler_steps(trace)
        lane = (self.steps[0].get("pid"), self.steps[0].get("tid"))
        self.ranges = labelled_ranges(trace, *lane)
        self._starts = [e["ts"] for e in self.ranges]

    def step_of(self, ts: float) -> int | None:
        for step in self.steps:
            if step["ts"] <= ts < step["ts"] + step["dur"]:
                return step_number(step)
        return None

    def part_of(self, ts: float) -> str:
        """A part of PARTS, or "rest" (no labelled range, or one whose name matches no part)."""
        i = bisect.bisect_right(self._starts, ts) - 1
        if i >= 0 and ts < self.ranges[i]["ts"] + self.ranges[i]["dur"]:
            return part_of(self.ranges[i]["name"]) or "rest"
        return "rest"


def key_averages_sort_key(device) -> str:
    """The `sort_by` for prof.key_averages().table() that the running torch knows.

    Self device time is `self_device_time_total` in torch from 2024 on (the old name then warns:
    https://github.com/pyg-team/pytorch_geometric/pull/9616) and `self_cuda_time_total` before,
    where the new name raises AttributeError. On CPU: self CPU time.
    """
    if getattr(device, "type", str(device)) == "cpu":
        return "self_cpu_time_total"
    from torch.autograd.profiler_util import FunctionEventAvg

    return "self_device_time_total" if hasattr(FunctionEventAvg(), "self_device_time_total") \
        else "self_cuda_time_total"


def rank_of(trace: dict, path: str | os.PathLike | None = None, default: int = 0) -> int:
    """distributedInfo.rank, else the rankN in the file name, else `default`."""
    info = trace.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    match = re.search(r"rank(\d+)", Path(path).name) if path else None
    return int(match.group(1)) if match else default
