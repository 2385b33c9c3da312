"""Where did each profiled step go? Per-step breakdown, GPU busy fraction, top operators of a trace.

    python profiling/summarize.py runs/profile/trace_rank0_steps7-11.json.gz [--top 10] [--json out.json]

Per ProfilerStep#N (host thread that called prof.step()): milliseconds in data_wait, h2d_copy,
forward, backward, optimizer (the record_function ranges, matched by name: see traces.KEYWORDS)
and `rest` = the part of the step no labelled range covers (loss.item(), logging, prof.step()).
The parts add up to the step. Next to them: `syncs/step`, the host syncs of the step (read-backs
such as .item(), blocking synchronize calls, device-to-host copies: profiling/syncs.py), and, when
the run communicates, the collectives of the step, their time, and how much of it overlaps with
backward compute (profiling/comms.py).

When the trace has device work it also prints, per step, the device time (kernels, copies, fills)
launched by each part: a kernel belongs to the part whose host code launched it (linked by
correlation id), not to whatever host range happens to run while it executes. Then the GPU busy
fraction per step (union of kernels, memcpys and memsets on all streams during the step, over the
step) and HolisticTraceAnalysis's temporal breakdown (idle / compute / non-compute GPU time).

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


from profiling import comms, merge_traces, syncs, traces
from profiling.traces import DEVICE_CATEGORIES, PARTS
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


def device_breakdown(trace: dict) -> list[dict] | None:
    """Per step: ms of kernels, copies (gpu_memcpy) and fills (gpu_memset) launched by each part,
    and host ms in runtime calls (cudaLaunchKernel, hipMemcpyWithStream, ...) per part; None without
    device work.

    Each device event goes to the step and part in which its runtime call was made (the launch);
    `unlinked` counts the device events of the step whose launch is not in the trace.
    """
    linked = [(e, launcher) for e, launcher in traces.launches(trace) if traces.category(e) in DEVICE_CATEGORIES]
    if not linked:
        return None
    where = traces.StepLocator(trace)
    rows = {traces.step_number(s): dict(step=traces.step_number(s), unlinked=0,
                                        **{kind: dict.fromkeys(COLUMNS, 0.0) for kind in (*DEVICE_CATEGORIES,
                                                                                          "runtime")})
            for s in where.steps}
    for e, launcher in linked:
        if launcher is None:
            step = where.step_of(e["ts"])
            if step is not None:
                rows[step]["unlinked"] += 1
            continue
        step = where.step_of(launcher["ts"])
        if step is not None:
            rows[step][traces.category(e)][where.part_of(launcher["ts"])] += e["dur"] / 1e3
    for e in traces.complete_events(trace):
        if traces.category(e) in traces.RUNTIME_CATEGORIES:
            step = where.step_of(e["ts"])
            if step is not None:
                rows[step]["runtime"][where.part_of(e["ts"])] += e["dur"] / 1e3
    return list(rows.values())


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
        if traces.category(e) == "cpu_op":
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
        if traces.category(e) in DEVICE_CATEGORIES:
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
    steps = step_breakdown(trace)
    sync_rows = {r["step"]: r for r in syncs.host_syncs_per_step(trace)}
    comm_rows = {r["step"]: r for r in comms.communication(trace)}
    for row in steps:
        row["syncs"] = sync_rows[row["step"]]["syncs"]
        row["syncs_where"] = sync_rows[row["step"]]["where"]
        row["ddp_runtime_stats"] = sync_rows[row["step"]]["ddp_runtime_stats"]  # named, not counted
        row.update({k: comm_rows[row["step"]][k] for k in ("collectives", "comm_ms", "overlap_ms")})
    return dict(steps=steps, device=device_breakdown(trace), gpu_busy=gpu_busy(trace),
                top=top_operators(trace, top))


def format_steps(rows: list[dict]) -> str:
    communicates = any(r["collectives"] or r["comm_ms"] for r in rows)
    extra = ("syncs/step", *(("collectives", "comm ms", "overlap %") if communicates else ()))
    header = f"{'step':>6} {'total ms':>9} " + " ".join(f"{c:>10}" for c in (*COLUMNS, *extra))
    lines = [header]
    for r in rows:
        line = f"{'#' + str(r['step']):>6} {r['total']:9.1f} " + " ".join(f"{r[c]:10.1f}" for c in COLUMNS)
        line += f" {r['syncs']:10d}"
        if communicates:
            share = f"{100 * r['overlap_ms'] / r['comm_ms']:9.0f}%" if r["comm_ms"] else f"{'-':>10}"
            line += f" {r['collectives']:11d} {r['comm_ms']:10.1f} {share}"
        lines.append(line)
    total = sum(r["total"] for r in rows)
    lines.append(f"{'share':>6} {'':>9} " + " ".join(f"{100 * sum(r[c] for r in rows) / total:9.1f}%"
                                                       for c in COLUMNS))
    return "\n".join(lines)


def format_device(rows: list[dict]) -> str:
    header = f"{'step':>6} " + " ".join(f"{c:>10}" for c in COLUMNS) + f" {'copies':>10} {'runtime':>10}"
    lines = [header]
    for r in rows:
        device = {c: sum(r[kind][c] for kind in DEVICE_CATEGORIES) for c in COLUMNS}
        lines.append(f"{'#' + str(r['step']):>6} " + " ".join(f"{device[c]:10.2f}" for c in COLUMNS)
                     + f" {sum(r['gpu_memcpy'].values()):10.2f} {sum(r['runtime'].values()):10.2f}"
                     + (f"  ({r['unlinked']} device events without their launch)" if r["unlinked"] else ""))
    return "\n".join(lines)


def print_result(result: dict, path: Path | None) -> None:
    """Print one rank's summary; `path`: its own trace file, for HolisticTraceAnalysis (None: skip HTA)."""
    print("Time per profiled step (ms; the parts add up to the step; syncs/step: host syncs, see profiling/syncs.py):")
    print(format_steps(result["steps"]))
    for row in result["steps"]:
        if row["syncs_where"]:
            print(f"  #{row['step']} syncs in: " + ", ".join(f"{name} x{n}" for name, n in row["syncs_where"].items()))
    ddp = [f"#{row['step']}" for row in result["steps"] if row["ddp_runtime_stats"]]
    if ddp:  # torch's own, on DDP's iterations 1-10 and every 100th (profiling/syncs.py)
        print(f"  not counted: DDP's runtime-stats event synchronize in {', '.join(ddp)} "
              "(DistributedDataParallel.forward, its iterations 1-10 and every 100th)")
    if result["device"] is not None:
        print("Device time launched by each part (ms of kernels + copies + fills, by the part whose host code "
              "launched them; copies: of which memcpy; runtime: host ms in runtime calls):")
        print(format_device(result["device"]))
    if result["gpu_busy"] is not None:
        print("GPU busy (device work on any stream / step wall time): " +
              "  ".join(f"#{r['step']} {100 * r['busy']:.0f}%" for r in result["gpu_busy"]))
        if path is not None:
            print("HolisticTraceAnalysis temporal breakdown (whole trace):")
            print(hta_temporal_breakdown(path))
    else:
        print("No device kernels in this trace (CPU run): no GPU busy fraction.")
    for kind in ("device", "host"):
        if result["top"][kind]:
            print(f"Top {kind} operators by self time in the profiled steps:")
            for r in result["top"][kind]:
                print(f"  {r['self_ms']:9.2f} ms  {r['calls']:5d} calls  {r['name'][:90]}")


def report(path: str | Path, top: int = 10) -> tuple[dict, dict]:
    """Load a trace file and print its summary: (trace, summary). A trace merged by merge_traces.py
    is summarized rank by rank: summary = {"ranks": {rank: summary}}."""
    path = Path(path)
    trace = traces.load(path)
    ranks = merge_traces.split(trace)
    if len(ranks) == 1 and "mergedRanks" not in trace:
        result = summarize(trace, top)
        print_result(result, path)
        return trace, result
    results = {}
    for rank, rank_trace in ranks:
        print(f"=== rank {rank}")
        results[rank] = summarize(rank_trace, top)
        print_result(results[rank], None)  # HTA reads one file per rank: run it on the rank files
    return trace, dict(ranks=results)


def print_summary(path: str | Path, top: int = 10) -> dict:
    """Load a trace file, print its summary; return the loaded trace (to draw it without reading it again)."""
    return report(path, top)[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace", help="Chrome trace from torch.profiler (.json or .json.gz)")
    p.add_argument("--top", type=int, default=10, help="operators to list")
    p.add_argument("--json", help="also write the summary to this JSON file")
    args = p.parse_args(argv)
    _, result = report(args.trace, args.top)
    if args.json:
        atomic_write_json(args.json, result)


if __name__ == "__main__":
    run_main(main)
