"""Merge per-rank traces into one Chrome trace for Perfetto: one process group per rank, one clock.

    python profiling/merge_traces.py runs/profile/trace_rank*_steps7-11.json.gz --out runs/profile/merged.json.gz
    python profiling/merge_traces.py A.json.gz B.json.gz --out merged.json.gz --align step

Each rank's trace uses its own process ids, and two ranks on one node both call their GPU
"device 0" (pid 0): copied as they are, Perfetto would draw both ranks into the same tracks.
Every (rank, pid) gets a pid of its own, named "rank R: <process name>", sorted by rank;
flow arrow ids and the correlation / External ids that link a kernel to its launch are made
unique per rank, so the merged trace still says which host call launched each kernel.

Time: torch writes `ts` in microseconds against the trace's `baseTimeNanoseconds`. `--align clock`
(default) puts all ranks on that shared wall clock (fine on one node, and across nodes whose clocks
agree to well under a step; stragglers stay visible). `--align step` shifts each rank so that its
first ProfilerStep starts at 0, for nodes whose clocks disagree.
"""
from __future__ import annotations

import argparse
import gzip
import json


from profiling import traces
from wellfno.cli import UserError, atomic_write_bytes, run_main

PID_STRIDE = 1 << 32  # above any OS pid or device index
FLOW_STRIDE = 1 << 40
LINK_IDS = ("correlation", "External id")


def merge(loaded: list[tuple[int, dict]], align: str = "clock") -> dict:
    """[(rank, trace), ...] -> one trace dict; timestamps start at 0 on the first rank's first event."""
    ranks = [rank for rank, _ in loaded]
    if len(set(ranks)) != len(ranks):
        raise UserError(f"two traces claim the same rank ({sorted(ranks)}): name them trace_rankN_... "
                        f"or pass traces of different ranks")
    offsets = {}  # rank -> microseconds to add to its ts
    # Differences of the bases first: adding 1.8e15 us to each ts would cost float precision.
    min_base = min(trace.get("baseTimeNanoseconds", 0) for _, trace in loaded)
    for rank, trace in loaded:
        if align == "step":
            offsets[rank] = -traces.profiler_steps(trace)[0]["ts"]
        else:
            offsets[rank] = (trace.get("baseTimeNanoseconds", 0) - min_base) / 1e3
    timed = [e["ts"] + offsets[rank] for rank, trace in loaded for e in trace["traceEvents"]
             if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M"]
    origin = min(timed) if timed else 0.0
    events = []
    for rank, trace in loaded:
        new_pid = {}
        for e in trace["traceEvents"]:
            pid = e.get("pid")
            new_pid.setdefault(pid, rank * PID_STRIDE + len(new_pid))
        names = {e.get("pid"): e.get("args", {}).get("name", "") for e in trace["traceEvents"]
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
        for e in trace["traceEvents"]:
            e = dict(e)
            if e.get("ph") == "M" and e.get("name") in ("process_name", "process_sort_index"):
                continue  # rewritten below
            pid = e.get("pid")
            e["pid"] = new_pid[pid]
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = e["ts"] + offsets[rank] - origin if e.get("ph") != "M" else 0
            if e.get("ph") in ("s", "t", "f") and isinstance(e.get("id"), int):
                e["id"] = rank * FLOW_STRIDE + e["id"]
            if isinstance(e.get("args"), dict) and any(isinstance(e["args"].get(k), int) for k in LINK_IDS):
                e["args"] = {k: rank * FLOW_STRIDE + v if k in LINK_IDS and isinstance(v, int) else v
                             for k, v in e["args"].items()}
            events.append(e)
        for pid, merged_pid in new_pid.items():
            events.append(dict(ph="M", name="process_name", pid=merged_pid, tid=0,
                               args=dict(name=f"rank {rank}: {names.get(pid, pid)}")))
            events.append(dict(ph="M", name="process_sort_index", pid=merged_pid, tid=0,
                               args=dict(sort_index=merged_pid)))
    first = loaded[0][1]
    return dict(schemaVersion=first.get("schemaVersion", 1), displayTimeUnit="ms",
                deviceProperties=first.get("deviceProperties", []),
                mergedRanks=sorted(ranks), alignment=align, traceEvents=events)


def split(trace: dict) -> list[tuple[int, dict]]:
    """A merged trace back into [(rank, trace), ...] (by the pid ranges merge() gave each rank);
    a trace of one rank as [(its rank, itself)]. So the tools read merged files rank by rank."""
    if "mergedRanks" not in trace:
        return [(traces.rank_of(trace), trace)]
    events = {rank: [] for rank in trace["mergedRanks"]}
    for e in trace["traceEvents"]:
        if isinstance(e.get("pid"), int) and e["pid"] // PID_STRIDE in events:
            events[e["pid"] // PID_STRIDE].append(e)
    header = {k: v for k, v in trace.items() if k not in ("traceEvents", "mergedRanks")}
    return [(rank, dict(header, traceEvents=rank_events, distributedInfo={"rank": rank}))
            for rank, rank_events in events.items()]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+", help="one trace per rank (.json or .json.gz)")
    p.add_argument("--out", required=True, help="merged trace (.json.gz is gzipped)")
    p.add_argument("--align", choices=["clock", "step"], default="clock",
                   help="clock: shared wall clock; step: each rank's first ProfilerStep at 0")
    args = p.parse_args(argv)
    loaded = []
    for index, path in enumerate(args.traces):
        trace = traces.load(path)
        traces.profiler_steps(trace)  # a trace without steps is no profiler trace of a training loop
        loaded.append((traces.rank_of(trace, path, default=index), trace))
    loaded.sort(key=lambda item: item[0])
    payload = json.dumps(merge(loaded, args.align)).encode()
    out = atomic_write_bytes(args.out, gzip.compress(payload) if args.out.endswith(".gz") else payload)
    print(f"Wrote {out}: ranks {', '.join(str(r) for r, _ in loaded)} (open it in https://ui.perfetto.dev)")


if __name__ == "__main__":
    run_main(main)
