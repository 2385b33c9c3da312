"""Where did each profiled step go? Per-step breakdown, GPU busy fraction, top operators of a trace.

    python profiling/summarize.py runs/profile/trace_rank0_steps7-11.json.gz [--top 10] [--json out.json]

Per ProfilerStep#N (host thread that called prof.step()): milliseconds in data_wait, h2d_copy,
forward, backward, optimizer (the record_function ranges, matched by name: see traces.KEYWORDS)
and `rest` = the part of the step no labelled range covers (loss.item(), logging, prof.step()).
The parts add up to the step.

When the trace has device kernels it also prints the GPU busy fraction per step (union of
kernels, memcpys and memsets on all streams during the step, over the step) and
HolisticTraceAnalysis's temporal breakdown (idle / compute / non-compute GPU time).

How this is computed, and why not all with HTA: HTA (HolisticTraceAnalysis) answers GPU
questions (idle time, kernel breakdown, communication overlap) and is used here for those.
It has no per-ProfilerStep split of host-side record_function ranges, and on a CPU-only trace
(no stream) its analyses have nothing to work on, so the step breakdown reads the Chrome JSON
directly: it is plain JSON and the arithmetic is a few interval unions.
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path


from profiling import traces
from profiling.traces import PARTS
from wellfno.cli import atomic_write_json, run_main

COLUMNS = (*PARTS, "rest")


def step_breakdown(trace: dict) -> list[dict]:
    """One dict per ProfilerStep: step number, total ms, ms per part; parts sum to total."""
    rows = []
    for step in traces.profiler_steps(trace):
        start, end = step["ts"], step["ts"] + step["dur"]
        ms = dict.fromkeys(PARTS, 0.0)
        covered = []
        for event in traces.labelled_ranges(trace, step["pid"], step["tid"]):
            part, span = traces.part_of(event["name"]), traces.clip(event, start, end)
            if part is None or span is None:
                continue  # an unknown label stays in `rest`
            ms[part] += (span[1] - span[0]) / 1e3
            covered.append(span)
        # `rest` from what the labels leave uncovered, not as total minus parts, so that
        # a double-counted range shows up as parts that no longer add up to the step.
        ms["rest"] = (step["dur"] - traces.union_length(covered)) / 1e3
        rows.append(dict(step=traces.step_number(step), total=step["dur"] / 1e3, **ms))
    return rows


def gpu_busy(trace: dict) -> list[dict] | None:
    """Per step: fraction of the step's wall time with device work on any stream; None without kernels."""
    device = traces.device_events(trace)
    if not device:
        return None
    rows = []
    for step in traces.profiler_steps(trace):
        start, end = step["ts"], step["ts"] + step["dur"]
        spans = [s for s in (traces.clip(e, start, end) for e in device) if s]
        rows.append(dict(step=traces.step_number(step), busy=traces.union_length(spans) / step["dur"]))
    return rows


def top_operators(trace: dict, n: int = 10) -> dict[str, list[dict]]:
    """Operators by self time inside the profiled steps: host aten ops, and device kernels if any."""
    steps = traces.profiler_steps(trace)
    lo, hi = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
    events = [e for e in traces.complete_events(trace) if lo <= e["ts"] < hi]
    # Self time of a host op = its duration minus its children's (same thread, nested in time).
    self_us, count = defaultdict(float), defaultdict(int)
    by_thread = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op":
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for ops in by_thread.values():
        stack = []
        for e in sorted(ops, key=lambda e: (e["ts"], -e["dur"])):
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
                stack.pop()
            if stack:
                self_us[stack[-1]["name"]] -= e["dur"]
            self_us[e["name"]] += e["dur"]
            count[e["name"]] += 1
            stack.append(e)
    host = [dict(name=k, self_ms=v / 1e3, calls=count[k]) for k, v in self_us.items()]
    kernel_us, kernel_count = defaultdict(float), defaultdict(int)
    for e in events:
        if e.get("cat", "").lower() in traces.DEVICE_CATEGORIES:
            kernel_us[e["name"]] += e["dur"]
            kernel_count[e["name"]] += 1
    device = [dict(name=k, self_ms=v / 1e3, calls=kernel_count[k]) for k, v in kernel_us.items()]
    by_time = lambda rows: sorted(rows, key=lambda r: -r["self_ms"])[:n]  # noqa: E731
    return dict(host=by_time(host), device=by_time(device))


def hta_temporal_breakdown(path: Path):
    """HTA's idle/compute/non-compute GPU time for one trace file, or the reason it could not run."""
    try:
        import logging

        from hta.trace_analysis import TraceAnalysis

        logging.getLogger("hta").setLevel(logging.ERROR)
        analysis = TraceAnalysis(trace_files={0: str(path.resolve())}, trace_dir=str(path.resolve().parent))
        return analysis.get_temporal_breakdown(visualize=False)
    except Exception as err:  # HTA is strict about trace fields; its breakdown is a bonus, not the summary
        return f"HTA could not analyse this trace ({err.__class__.__name__}: {err})"


def summarize(trace: dict, top: int = 10) -> dict:
    return dict(steps=step_breakdown(trace), gpu_busy=gpu_busy(trace), top=top_operators(trace, top))


def format_steps(rows: list[dict]) -> str:
    header = f"{'step':>6} {'total ms':>9} " + " ".join(f"{c:>10}" for c in COLUMNS)
    lines = [header]
    for r in rows:
        lines.append(f"{'#' + str(r['step']):>6} {r['total']:9.1f} " + " ".join(f"{r[c]:10.1f}" for c in COLUMNS))
    total = sum(r["total"] for r in rows)
    lines.append(f"{'share':>6} {'':>9} " + " ".join(f"{100 * sum(r[c] for r in rows) / total:9.1f}%"
                                                       for c in COLUMNS))
    return "\n".join(lines)


def print_summary(path: str | Path, top: int = 10) -> dict:
    """Load a trace file, print its summary; return the loaded trace (to draw it without reading it again)."""
    path = Path(path)
    trace = traces.load(path)
    result = summarize(trace, top)
    print("Time per profiled step (ms; the parts add up to the step):")
    print(format_steps(result["steps"]))
    if result["gpu_busy"] is not None:
        print("GPU busy (device work on any stream / step wall time): " +
              "  ".join(f"#{r['step']} {100 * r['busy']:.0f}%" for r in result["gpu_busy"]))
        print("HolisticTraceAnalysis temporal breakdown (whole trace):")
        print(hta_temporal_breakdown(path))
    else:
        print("No device kernels in this trace (CPU run): no GPU busy fraction.")
    for kind in ("device", "host"):
        if result["top"][kind]:
            print(f"Top {kind} operators by self time in the profiled steps:")
            for r in result["top"][kind]:
                print(f"  {r['self_ms']:9.2f} ms  {r['calls']:5d} calls  {r['name'][:90]}")
    return trace


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace", help="Chrome trace from torch.profiler (.json or .json.gz)")
    p.add_argument("--top", type=int, default=10, help="operators to list")
    p.add_argument("--json", help="also write the summary to this JSON file")
    args = p.parse_args(argv)
    trace = print_summary(args.trace, args.top)
    if args.json:
        atomic_write_json(args.json, summarize(trace, args.top))


if __name__ == "__main__":
    run_main(main)
