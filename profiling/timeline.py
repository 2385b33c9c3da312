"""Draw the profiled steps of a trace as a PNG: one lane per host thread and per GPU stream.

    python profiling/timeline.py runs/profile/trace_rank0_steps7-11.json.gz [--png out.png]

For people who cannot open Perfetto (no browser on the cluster, no way to copy the trace off).
Labelled ranges (data_wait, h2d_copy, forward, backward, optimizer) are coloured by part;
lanes without labels (autograd or loader threads, GPU streams) show their outermost
operators or kernels in grey. Dashed lines mark the ProfilerStep#N boundaries.
"""
from __future__ import annotations

import argparse
from pathlib import Path


from profiling import traces
from wellfno.cli import run_main

COLOURS = {"data_wait": "tab:red", "h2d_copy": "tab:orange", "forward": "tab:blue", "backward": "tab:green",
           "optimizer": "tab:purple", None: "0.6"}


def lane_names(trace: dict) -> dict:
    """(pid, tid) -> name from the thread_name/process_name metadata, e.g. 'python 1234 / thread 1234'."""
    process, thread = {}, {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            process[e.get("pid")] = e.get("args", {}).get("name", "")
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            thread[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name", "")
    return {key: f"{process.get(key[0], key[0])} / {name}" for key, name in thread.items()}


def draw(trace_path: str | Path, png: str | Path | None = None, trace: dict | None = None) -> Path:
    """Write the timeline next to the trace (or to `png`); return its path. `trace`: already loaded."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from wellfno.plots import save_png  # also selects the Agg backend: no display on nodes

    trace_path = Path(trace_path)
    png = Path(png) if png else trace_path.with_name(trace_path.name.split(".json")[0] + "_timeline.png")
    trace = trace or traces.load(trace_path)
    steps = traces.profiler_steps(trace)
    t0, t1 = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
    main_lane = (steps[0]["pid"], steps[0]["tid"])
    window = [e for e in traces.complete_events(trace) if e["ts"] < t1 and e["ts"] + e["dur"] > t0
              and not traces.STEP_RE.match(str(e.get("name", ""))) and e.get("cat") != "Trace"]  # Trace: whole window
    lanes = {}
    for e in window:
        lanes.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    # The stepping thread first, then other host threads, then device streams.
    device_pids = {e.get("pid") for e in traces.device_events(trace)}
    order = sorted(lanes, key=lambda k: (k != main_lane, k[0] in device_pids, str(k)))
    names = lane_names(trace)

    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.5 * max(len(order), 3)))
    for row, key in enumerate(order):
        labelled = [e for e in lanes[key] if e.get("cat") == "user_annotation"]
        shown = traces.labelled_ranges(trace, *key) if labelled else traces.outermost(lanes[key])
        for e in shown:
            part = traces.part_of(e["name"]) if e.get("cat") == "user_annotation" else None
            ax.broken_barh([((e["ts"] - t0) / 1e3, e["dur"] / 1e3)], (row - 0.4, 0.8),
                           facecolors=COLOURS[part], edgecolor="none")
    for step in steps:
        x = (step["ts"] - t0) / 1e3
        ax.axvline(x, color="k", linestyle="--", linewidth=0.7)
        ax.text(x, 1.0, f" #{traces.step_number(step)}", fontsize=8, va="bottom", transform=ax.get_xaxis_transform())
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([names.get(k, f"pid {k[0]} / tid {k[1]}")[:40] for k in order], fontsize=8)
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
