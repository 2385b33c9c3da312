"""Communication per profiled step: time in collective operations, and how much of it is hidden
behind backward compute (what DistributedDataParallel overlaps, and what it does not).

What counts as communication:
  - host side, any backend: the c10d collectives (`c10d::allreduce_`, `c10d::broadcast_`, ...),
    `record_param_comms` (torch's record of a collective's parameters) and the backend's own ranges
    (`nccl:all_reduce`, `gloo:all_reduce`, ... ; gloo runs them on its worker threads);
  - on GPUs, the device work of the collective: NCCL's and RCCL's kernels (`ncclKernel_*`,
    `ncclDevKernel_*`: RCCL keeps NCCL's names) and any copy or kernel launched from inside a
    host-side collective.
`collectives` counts the calls the training loop made (outermost c10d ops per thread).
`comm_ms` is the union of the communication time of the collectives the step started: on GPU traces
the device work launched in the step (the host side only enqueues it), on CPU traces the host ranges
that begin in the step.
`overlap_ms` is the part of `comm_ms` during which backward compute ran: on GPUs, non-communication
kernels launched by the backward part; on the CPU, non-communication ops of any thread while the
stepping thread is in its backward range. `comm_ms - overlap_ms` is the communication no backward compute
hides: with DDP, about what the end of backward waits for.
"""
from __future__ import annotations

import re
from collections import defaultdict

from profiling import traces

HOST_COMM = re.compile(r"^(c10d::|record_param_comms$|(nccl|rccl|gloo|mpi|ucc|xccl):)")
CALL_COMM = re.compile(r"^c10d::")
DEVICE_COMM = re.compile(r"^(nccl|rccl)", re.IGNORECASE)


def _host_comm(events) -> list[dict]:
    return [e for e in events if traces.is_host(e) and traces.category(e) in ("cpu_op", traces.HOST_RANGE)
            and HOST_COMM.match(str(e.get("name", "")))]


def communication(trace: dict) -> list[dict]:
    """Per ProfilerStep: dict(step, collectives, comm_ms, overlap_ms, measured_on="device"|"host")."""
    events = traces.complete_events(trace)
    where = traces.StepLocator(trace)
    host_comm = _host_comm(events)
    by_lane = defaultdict(list)
    for e in host_comm:
        by_lane[(e.get("pid"), e.get("tid"))].append(e)
    calls = defaultdict(int)
    # The calls: c10d ops (torch 2 dispatches every collective through them). Without any (older
    # torch), the backend's own ranges on threads that also run ops, i.e. not gloo's worker threads.
    has_c10d = any(CALL_COMM.match(e["name"]) for e in host_comm)
    op_lanes = {(e.get("pid"), e.get("tid")) for e in events if traces.category(e) == "cpu_op"}
    for lane, lane_events in by_lane.items():
        if has_c10d:
            called = [e for e in lane_events if CALL_COMM.match(e["name"])]
        else:
            called = lane_events if lane in op_lanes else []
        for e in traces.outermost(called):
            step = where.step_of(e["ts"])
            if step is not None:
                calls[step] += 1
    comm, compute = defaultdict(list), defaultdict(list)
    linked = [(e, l) for e, l in traces.launches(trace) if traces.category(e) in traces.DEVICE_CATEGORIES]
    on_device = bool(linked)
    if on_device:
        def inside_collective(launcher):
            return any(c["ts"] <= launcher["ts"] < c["ts"] + c["dur"]
                       for c in by_lane.get((launcher.get("pid"), launcher.get("tid")), ()))
        for e, launcher in linked:
            if launcher is None:
                continue
            step = where.step_of(launcher["ts"])
            if step is None:
                continue
            if DEVICE_COMM.match(str(e.get("name", ""))) or inside_collective(launcher):
                comm[step].append(traces.span(e))
            elif traces.category(e) == "kernel" and where.part_of(launcher["ts"]) == "backward":
                compute[step].append(traces.span(e))
    else:
        ops = defaultdict(list)
        for e in events:
            if traces.category(e) == "cpu_op" and not HOST_COMM.match(str(e.get("name", ""))):
                ops[(e.get("pid"), e.get("tid"))].append(traces.span(e))
        # Compute of a thread = its ops minus the collectives it runs inside them (DDP calls
        # c10d::allreduce_ from the AccumulateGrad hook): per thread, so that another thread's
        # communication does not erase this thread's compute.
        busy = [s for lane, spans in ops.items()
                for s in traces.difference(spans, [traces.span(e) for e in by_lane.get(lane, ())])]
        backward = [traces.span(r) for r in where.ranges if traces.part_of(r["name"]) == "backward"]
        busy_in_backward = traces.intersection(busy, backward)
        for step in where.steps:
            lo, hi = traces.span(step)
            n = traces.step_number(step)
            # The collectives the step started, whole: the end of a worker thread's range can fall
            # after the next prof.step(), and is still this step's communication.
            comm[n] = [traces.span(e) for e in host_comm if lo <= e["ts"] < hi]
            compute[n] = traces.intersection(busy_in_backward, [(lo, hi)])
    rows = []
    for step in where.steps:
        n = traces.step_number(step)
        comm_time = traces.merged(comm[n])
        rows.append(dict(step=n, collectives=calls[n], comm_ms=traces.union_length(comm_time) / 1e3,
                         overlap_ms=traces.union_length(traces.intersection(comm_time, compute[n])) / 1e3,
                         measured_on="device" if on_device else "host"))
    return rows
