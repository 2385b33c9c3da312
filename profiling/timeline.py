"""Draw the profiled steps of a trace as a PNG: one lane per host thread and per GPU stream.

    python profiling/timeline.py runs/profile/trace_rank0_steps7-11.json.gz [--png out.png]

For people who cannot open Perfetto (no browser on the cluster, no way to copy the trace off).
Labelled ranges (data_wait, h2d_copy, forward, backward, optimizer) are coloured by part;
host lanes without labels (autograd or loader threads) show their outermost operators in grey.
GPU lanes (one per device and stream) show device work only (kernels, copies, fills), each
coloured by the part whose host code launched it; the ranges Kineto mirrors onto GPU lanes
(gpu_user_annotation) are left out: drawn as bars they would make the GPU look busy between
kernels. Dashed lines mark the ProfilerStep#N boundaries.
"""
from __future__ import annotations

import argparse
from pathlib import Path


from profiling import merge_traces, traces
from wellfno.cli import run_main

COLOURS = {"data_wait": "tab:red", "h2d_copy": "tab:orange", "forward": "tab:blue", "backward": "tab:green",
           "optimizer": "tab:purple", None: "0.6"}


def lane_names(trace: dict) -> dict:
    """(pid, tid) -> a short lane name from the metadata: 'thread 1102 (pt_main_thread)', 'GPU 0 stream 7'."""
    labels, thread = {}, {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "process_labels":
            labels[e.get("pid")] = e.get("args", {}).get("labels", "")
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            thread[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name", "").strip()
    return {key: f"{labels[key[0]]} {name}" if labels.get(key[0], "").startswith("GPU") else name
            for key, name in thread.items()}


def lanes(trace: dict) -> list[dict]:
    """What each lane shows in the profiled window: dict(key=(pid, tid), rank, device, bars=[(event, part)]).

    Order: per rank (a trace merged by merge_traces.py holds several), the stepping thread, the other
    host threads, then the device streams.
    """
    return [lane for rank, rank_trace in merge_traces.split(trace) for lane in _rank_lanes(rank_trace, rank)]


def _rank_lanes(trace: dict, rank: int) -> list[dict]:
    steps = traces.profiler_steps(trace)
    t0, t1 = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
    main_lane = (steps[0].get("pid"), steps[0].get("tid"))
    where = traces.StepLocator(trace)
    launched_by = {id(e): where.part_of(launcher["ts"]) for e, launcher in traces.launches(trace) if launcher}
    host, device = {}, {}
    for e in traces.complete_events(trace):
        if not (e["ts"] < t1 and e["ts"] + e["dur"] > t0) or traces.STEP_RE.match(str(e.get("name", ""))):
            continue
        key = (e.get("pid"), e.get("tid"))
        if traces.category(e) in traces.DEVICE_CATEGORIES:
            device.setdefault(key, []).append(e)
        elif traces.is_host(e) and traces.category(e) != "trace":  # Trace: one event for the whole window
            host.setdefault(key, []).append(e)
    result = []
    for key in sorted(host, key=lambda k: (k != main_lane, str(k))):
        # The stepping thread: its labelled ranges. Other threads (autograd, communication, loader):
        # whatever is outermost there, coloured where it is a labelled range of a known part.
        shown = traces.labelled_ranges(trace, *key) if key == main_lane else traces.outermost(host[key])
        result.append(dict(key=key, rank=rank, device=False, bars=[
            (e, traces.part_of(e["name"]) if traces.category(e) == traces.HOST_RANGE else None) for e in shown]))
    for key in sorted(device, key=str):
        shown = [(e, launched_by.get(id(e))) for e in traces.outermost(device[key])]
        result.append(dict(key=key, rank=rank, device=True, bars=[(e, None if p == "rest" else p) for e, p in shown]))
    return result


def draw(trace_path: str | Path, png: str | Path | None = None, trace: dict | None = None) -> Path:
    """Write the timeline next to the trace (or to `png`); return its path. `trace`: already loaded."""
    from matplotlib.patches import Patch

    from wellfno.plots import pyplot, save_png

    plt = pyplot()  # the Agg backend: no display on nodes

    trace_path = Path(trace_path)
    png = Path(png) if png else trace_path.with_name(trace_path.name.split(".json")[0] + "_timeline.png")
    trace = trace or traces.load(trace_path)
    all_steps = traces.profiler_steps(trace)
    steps = traces.profiler_steps(merge_traces.split(trace)[0][1])  # the boundaries drawn: the first rank's
    t0, t1 = min(s["ts"] for s in all_steps), max(s["ts"] + s["dur"] for s in all_steps)
    order = lanes(trace)
    names = lane_names(trace)
    merged = "mergedRanks" in trace

    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.5 * max(len(order), 3)))
    for row, lane in enumerate(order):
        by_part = {}  # one collection per colour and lane: a GPU lane holds thousands of kernels
        for e, part in lane["bars"]:
            by_part.setdefault(part, []).append(((e["ts"] - t0) / 1e3, e["dur"] / 1e3))
        for part, bars in by_part.items():
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=COLOURS[part], edgecolor="none")
    for step in steps:
        x = (step["ts"] - t0) / 1e3
        ax.axvline(x, color="k", linestyle="--", linewidth=0.7)
        ax.text(x, 1.0, f" #{traces.step_number(step)}", fontsize=8, va="bottom", transform=ax.get_xaxis_transform())
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([(f"rank {lane['rank']} " if merged else "")
                        + names.get(lane["key"], f"pid {lane['key'][0]} / tid {lane['key'][1]}")[:40]
                        for lane in order], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_xlabel("ms since the first profiled step")
    ax.set_title(f"{trace_path.name}: ProfilerStep#{traces.step_number(steps[0])}-#{traces.step_number(steps[-1])}",
                 pad=14)
    ax.legend(handles=[Patch(color=c, label=p or "other / unlabelled") for p, c in COLOURS.items()],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    return save_png(fig, png, dpi=80)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace", help="Chrome trace from torch.profiler (.json or .json.gz)")
    p.add_argument("--png", help="output picture (default: next to the trace, *_timeline.png)")
    args = p.parse_args(argv)
    print(f"Wrote {draw(args.trace, args.png)}")


if __name__ == "__main__":
    run_main(main)
