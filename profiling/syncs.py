"""Host syncs made visible: where the host stops and waits for (or reads back from) the device.

A host sync is one of:
  - `aten::_local_scalar_dense`: the op behind `.item()`, `float(t)`, `if t:`: a read-back of one
    number. On a GPU trace (one with runtime calls or device work) it counts only where it reads
    the device: a runtime call inside it (on CUDA, `_local_scalar_dense_cuda` is a cudaMemcpyAsync
    and a stream synchronize: aten/src/ATen/native/cuda/CUDAScalar.cu); a CPU tensor's `.item()`
    (a CPU generator's draw, a CPU counter) calls no runtime and never waits for the device (step
    14's --pushforward drew its N that way every step). A CPU trace cannot tell them apart
    (every tensor is on the CPU): there every read-back counts, as it would on a GPU, except inside
    the optimizer's own `Optimizer.step#...` range: Adam and friends keep their step counters on
    the CPU and read them with `.item()`;
  - a blocking runtime call: cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize
    (and their driver and HIP names);
  - a `cuda_sync` record of CUPTI (Stream Sync, Context Sync, Event Sync; not "Stream Wait Event",
    which makes one stream wait for another and never blocks the host);
  - a device-to-host copy;
  - a host-to-device copy from pageable memory: CUDA stages it through a pinned buffer, and even a
    non_blocking one "might be synchronous with respect to host" (the runtime API's "API
    synchronization behavior"); the host waits for the stream, with no synchronize call or
    cuda_sync record to show for it. CUDA traces name it "Memcpy HtoD (Pageable -> Device)"
    (from pinned memory: "(Pinned -> Device)", no sync). ROCm traces do not say where a copy
    comes from: there it is not counted.
Not counted, but named (`ddp_runtime_stats` in each step's row): the event synchronizes of DDP's
own runtime statistics. DistributedDataParallel.forward calls `Logger::set_runtime_stats_and_log`
first (torch/csrc/distributed/c10d/logger.cpp), which on iterations 1 to 10 and every 100th
(`Reducer::should_collect_runtime_stats`, num_iterations_ <= 10 or num_iterations_ %
ddp_runtime_logging_sample_rate_, 100, == 0; torch/csrc/distributed/c10d/reducer.cpp; the count
is raised in prepare_for_forward, after the check) times the previous iteration with CUDA events, and
`CudaTimer::measureDifference` calls `event.synchronize()` on them (reducer_cuda.cpp): a
cudaEventSynchronize inside the `DistributedDataParallel.forward` range, in no aten op, in forwards
2 to 11 and 101, 201, ... of a run on GPUs. They are torch's, not the training loop's (the default
`--profile` window, steps 8 to 12 of 12, holds four); a participant cannot remove them.
One `.item()` on a GPU tensor shows up as several of these (the aten op, a DtoH memcpy, a
cudaStreamSynchronize and its cuda_sync record). They are one sync: signals are grouped by the
outermost host op (on the same thread) they happen in, or by the runtime call itself when no op
encloses it (torch.cuda.synchronize()). So the count reads the same on CPU and GPU traces.

Sources: the cuda_sync kinds are CUPTI's CUpti_ActivitySynchronizationType as Kineto names them
(https://docs.nvidia.com/cupti/api/group__CUPTI__ACTIVITY__API.html); cudaMemcpyKind
(https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html) and HIP's hipMemcpyKind
share the value 2 for device-to-host; https://docs.nvidia.com/cuda/cuda-runtime-api/api-sync-behavior.html
(pageable host-to-device copies).
"""
from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict

from profiling import traces

READ_BACK_OP = "aten::_local_scalar_dense"
SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
    "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize",
})
NOT_BLOCKING_SYNC_KINDS = ("stream wait event",)
OPTIMIZER_RANGE = re.compile(r"Optimizer\.step#")
DDP_FORWARD_RANGE = re.compile(r"DistributedDataParallel\.forward$")
EVENT_SYNC_CALLS = frozenset({"cudaEventSynchronize", "cuEventSynchronize", "hipEventSynchronize"})
# cudaMemcpyKind / hipMemcpyKind: DeviceToHost is 2 in both runtimes.
DEVICE_TO_HOST_KIND = 2


def _is_device_to_host(copy: dict, launcher: dict | None) -> bool:
    # CUDA names the copy "Memcpy DtoH (Device -> Pageable)"; ROCm builds write the direction
    # spelled out or only as the runtime call's `kind`.
    name = copy.get("name", "").replace(" ", "").lower()
    if "dtoh" in name or "devicetohost" in name:
        return True
    kind = (launcher or {}).get("args", {}).get("kind")
    return str(kind) in (str(DEVICE_TO_HOST_KIND), "hipMemcpyDeviceToHost", "cudaMemcpyDeviceToHost")


def _is_pageable_host_to_device(copy: dict) -> bool:
    # CUDA names the source memory: "Memcpy HtoD (Pageable -> Device)" / "(Pinned -> Device)".
    name = copy.get("name", "").replace(" ", "").lower()
    return "htod" in name and "(pageable->" in name


class _Lanes:
    """Per host thread: its outermost cpu ops, its Optimizer.step and DistributedDataParallel.forward
    ranges, for lookups by time."""

    def __init__(self, events):
        ops, optim, ddp = defaultdict(list), defaultdict(list), defaultdict(list)
        for e in events:
            lane, name = (e.get("pid"), e.get("tid")), str(e.get("name", ""))
            if traces.category(e) == "cpu_op":
                ops[lane].append(e)
            elif traces.category(e) == traces.HOST_RANGE and OPTIMIZER_RANGE.match(name):
                optim[lane].append(traces.span(e))
            elif traces.category(e) == traces.HOST_RANGE and DDP_FORWARD_RANGE.match(name):
                ddp[lane].append(traces.span(e))
        self.ops = {lane: traces.outermost(v) for lane, v in ops.items()}
        self.starts = {lane: [e["ts"] for e in v] for lane, v in self.ops.items()}
        self.optim, self.ddp_forward = optim, ddp

    def enclosing_op(self, lane, ts):
        i = bisect.bisect_right(self.starts.get(lane, []), ts) - 1
        if i >= 0:
            op = self.ops[lane][i]
            if ts < op["ts"] + op["dur"]:
                return op
        return None

    def in_optimizer(self, lane, ts) -> bool:
        return any(lo <= ts < hi for lo, hi in self.optim.get(lane, ()))

    def in_ddp_forward(self, lane, ts) -> bool:
        return any(lo <= ts < hi for lo, hi in self.ddp_forward.get(lane, ()))


def host_syncs(trace: dict, ddp_runtime_stats: bool = False) -> list[dict]:
    """Every host sync in the trace, in time order: dict(ts, pid, tid, name, signals).

    `name` is the host op (or runtime call) the sync happened in; `signals` the evidence, e.g.
    ["aten::_local_scalar_dense", "cudaStreamSynchronize", "cuda_sync: Stream Sync", "DtoH copy"].
    `ddp_runtime_stats=True`: DDP's own event synchronizes instead (the module docstring), which
    are not counted.
    """
    events = traces.complete_events(trace)
    lanes = _Lanes(events)
    calls = defaultdict(list)  # per host thread: the start of each runtime / driver call
    for e in events:
        if traces.category(e) in traces.RUNTIME_CATEGORIES:
            calls[(e.get("pid"), e.get("tid"))].append(e["ts"])
    for starts in calls.values():
        starts.sort()
    # a GPU trace: read-backs are known by the device calls in them (a CPU trace has none at all)
    gpu_trace = bool(calls) or any(traces.category(e) in traces.DEVICE_CATEGORIES for e in events)
    signals = []  # (lane, ts, label, touches_device, fallback_name)
    for e in events:
        lane, cat, name = (e.get("pid"), e.get("tid")), traces.category(e), str(e.get("name", ""))
        if cat == "cpu_op" and name == READ_BACK_OP:
            # a runtime call inside it (a copy, a synchronize): it read the device. Also where the
            # trace lost the copy's device record (ROCm's hipMemcpyWithStream blocks by itself).
            starts = calls.get(lane, [])
            i = bisect.bisect_left(starts, e["ts"])
            reads_device = i < len(starts) and starts[i] < e["ts"] + e["dur"]
            signals.append((lane, e["ts"], READ_BACK_OP, reads_device, name))
        elif cat in traces.RUNTIME_CATEGORIES and name in SYNC_CALLS:
            signals.append((lane, e["ts"], name, True, name))
    for e, launcher in traces.launches(trace):
        cat = traces.category(e)
        if cat == traces.SYNC_CATEGORY:
            kind = str(e.get("args", {}).get("cuda_sync_kind", e.get("name", "")))
            if kind.lower() in NOT_BLOCKING_SYNC_KINDS:
                continue
            label = f"cuda_sync: {kind}"
        elif cat == "gpu_memcpy" and _is_device_to_host(e, launcher):
            label = "DtoH copy"
        elif cat == "gpu_memcpy" and _is_pageable_host_to_device(e):
            label = "pageable HtoD copy"
        else:
            continue
        if launcher is None:  # no host call to pin it to: a sync of its own, at its device time
            signals.append(((e.get("pid"), e.get("tid")), e["ts"], label, True, e.get("name", label)))
        else:
            signals.append(((launcher.get("pid"), launcher.get("tid")), launcher["ts"], label, True,
                            launcher.get("name", label)))
    groups = {}
    for lane, ts, label, touches_device, fallback in signals:
        op = lanes.enclosing_op(lane, ts)
        key = (lane, op["ts"]) if op else (lane, ts, fallback)
        group = groups.setdefault(key, dict(ts=op["ts"] if op else ts, pid=lane[0], tid=lane[1],
                                            name=op["name"] if op else fallback, signals=[], device=False,
                                            in_optimizer=lanes.in_optimizer(lane, ts),
                                            ddp=op is None and fallback in EVENT_SYNC_CALLS
                                            and lanes.in_ddp_forward(lane, ts)))
        group["signals"].append(label)
        group["device"] |= touches_device
    # On a GPU trace a read-back that touched no device read host memory: not a sync. On a CPU
    # trace it stands for the GPU's, but for the optimizer's CPU step counters.
    kept = [g for g in groups.values() if g["ddp"] == ddp_runtime_stats
            and (g["device"] or not (gpu_trace or g["in_optimizer"]))]
    for g in kept:
        g["signals"] = sorted(set(g["signals"]))
        del g["device"], g["in_optimizer"], g["ddp"]
    return sorted(kept, key=lambda g: g["ts"])


def host_syncs_per_step(trace: dict) -> list[dict]:
    """Per ProfilerStep: dict(step, syncs, where, ddp_runtime_stats); `where` counts the syncs by
    the op they happened in; `ddp_runtime_stats` DDP's own event synchronizes, not in `syncs`.

    UserError if the trace has no ProfilerStep#N.
    """
    steps = traces.profiler_steps(trace)
    rows = {traces.step_number(s): dict(step=traces.step_number(s), syncs=0, where=Counter(),
                                        ddp_runtime_stats=0) for s in steps}
    for key, found in (("syncs", host_syncs(trace)),
                       ("ddp_runtime_stats", host_syncs(trace, ddp_runtime_stats=True))):
        for sync in found:
            for s in steps:
                if s["ts"] <= sync["ts"] < s["ts"] + s["dur"]:
                    row = rows[traces.step_number(s)]
                    row[key] += 1
                    if key == "syncs":
                        row["where"][sync["name"]] += 1
                    break
    return [dict(row, where=dict(row["where"])) for row in rows.values()]
