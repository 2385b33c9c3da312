"""profiling/ on real GPU traces (V100 and A100, torch.profiler via Kineto: tests/fixtures/traces/README.md)
and on a hand-made MI250-style trace built from Kineto's documented categories.

What is checked: each ProfilerStep is counted once although GPU traces mirror it onto the GPU lane;
kernels, copies and fills belong to the part whose host code launched them (correlation id / ac2g
flow, never time overlap); timeline lanes for GPUs show device work only; merged traces keep every
kernel linked to its own rank's launch; host syncs and communication per step.
"""
import gzip
import os
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from profiling import comms, merge_traces, summarize, syncs, timeline, traces

# The real traces are not tracked in git (binary, 3rd-party): they are read from the project's shared/ folder
# beside the repository (source and licence in tests/fixtures/traces/README.md), or WELLFNO_TRACES.
FIXTURES = Path(__file__).parent / "fixtures" / "traces"
TRACES = Path(os.environ.get("WELLFNO_TRACES", Path(__file__).resolve().parents[2] / "shared" / "traces"))
V100 = TRACES / "v100_resnet_rank0.json.gz"
A100 = TRACES / "a100_alexnet.json.gz"
if not (V100.is_file() and A100.is_file()):
    pytest.skip(f"real GPU traces not found in {TRACES}: set WELLFNO_TRACES to the folder holding them",
                allow_module_level=True)


def raw(path):
    return json.loads(gzip.decompress(path.read_bytes()))


@pytest.fixture(scope="module")
def v100():
    return traces.load(V100)


# --- a hand-made MI250-style trace --------------------------------------------------------------
# Categories and linking as Kineto writes them on ROCm (libkineto/src/RoctracerActivity.h and _inl.h):
# hip* runtime calls are "cuda_runtime" events with args.correlation; kernels, copies and fills are
# "kernel"/"gpu_memcpy"/"gpu_memset" on pid = device, tid = queue, *without* args (GpuActivity writes
# no metadata), linked only by the ac2g flow whose id is the correlation id. ProfilerStep#N and the
# record_function ranges are mirrored as gpu_user_annotation on the GPU lane (the double annotation
# that made summarize.py report steps #1, #1, #2).
HOST, AUTOGRAD, GCD, QUEUE, COMM_QUEUE = 4242, 4250, 2, 1, 2
FIRST_ID = 135071  # the V100 trace's first correlation id: merging the two must keep them apart


def mi250_trace():
    events, next_id = [], [FIRST_ID]

    def x(name, cat, ts, dur, pid=HOST, tid=HOST, **args):
        events.append(dict(ph="X", cat=cat, name=name, pid=pid, tid=tid, ts=ts, dur=dur, args=args))

    def launch(call, ts, dur, work_cat, work_name, work_ts, work_dur, tid=HOST, queue=QUEUE):
        corr = next_id[0]
        next_id[0] += 1
        x(call, "cuda_runtime", ts, dur, tid=tid, correlation=corr)
        events.append(dict(ph="s", cat="ac2g", name="ac2g", id=corr, pid=HOST, tid=tid, ts=ts))
        events.append(dict(ph="X", cat=work_cat, name=work_name, pid=GCD, tid=queue, ts=work_ts, dur=work_dur))
        events.append(dict(ph="f", cat="ac2g", name="ac2g", id=corr, pid=GCD, tid=queue, ts=work_ts, bp="e"))

    for n, t in ((1, 0), (2, 1000)):
        x(f"ProfilerStep#{n}", "user_annotation", t, 1000)
        x(f"ProfilerStep#{n}", "gpu_user_annotation", t + 40, 1080, pid=GCD, tid=QUEUE)  # the mirror
        x("batch_to_device", "user_annotation", t + 20, 70)
        x("forward", "user_annotation", t + 100, 300)
        x("backward", "user_annotation", t + 400, 400)
        x("optimizer", "user_annotation", t + 800, 150)
        for name, start, dur in (("forward", 420, 200), ("backward", 650, 300)):
            x(name, "gpu_user_annotation", t + start, dur, pid=GCD, tid=QUEUE)
    # Step 1. The copy of the batch (h2d_copy).
    x("aten::copy_", "cpu_op", 25, 60)
    launch("hipMemcpyWithStream", 30, 50, "gpu_memcpy", "Memcpy HtoD (Host -> Device)", 40, 30)
    # A forward GEMM launched at 150 runs at 420-620, while the host is already in backward.
    x("aten::mm", "cpu_op", 140, 30)
    launch("hipLaunchKernel", 150, 10, "kernel", "Cijk_Ailk_Bljk_SB_MT64x64x16_SN", 420, 200)
    # Backward runs on the autograd thread: a fill and a GEMM, then DDP's all-reduce (RCCL keeps NCCL's names).
    x("aten::zero_", "cpu_op", 445, 20, tid=AUTOGRAD)
    launch("hipMemsetAsync", 450, 5, "gpu_memset", "Memset (Device)", 630, 10, tid=AUTOGRAD)
    x("aten::mm", "cpu_op", 495, 20, tid=AUTOGRAD)
    launch("hipLaunchKernel", 500, 10, "kernel", "Cijk_Alik_Bljk_SB_MT128x64x16_SN", 650, 300, tid=AUTOGRAD)
    x("c10d::allreduce_", "cpu_op", 700, 20, tid=AUTOGRAD)
    x("record_param_comms", "cpu_op", 702, 16, tid=AUTOGRAD)
    x("nccl:all_reduce", "user_annotation", 703, 14, tid=AUTOGRAD)
    launch("hipExtLaunchKernel", 705, 8, "kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 760, 200,
           tid=AUTOGRAD, queue=COMM_QUEUE)
    # The optimizer: Adam reads its CPU step counter with .item() (no device sync), then launches a
    # kernel that runs after the step has ended on the host.
    x("Optimizer.step#Adam.step", "user_annotation", 810, 130)
    x("aten::item", "cpu_op", 815, 10)
    x("aten::_local_scalar_dense", "cpu_op", 816, 8)
    x("aten::add_", "cpu_op", 895, 10)
    launch("hipLaunchKernel", 900, 5, "kernel", "elementwise_kernel_adam", 1020, 100)
    # loss.item() after the optimizer: one read-back = a DtoH copy and a stream sync inside one op.
    x("aten::item", "cpu_op", 960, 30)
    x("aten::_local_scalar_dense", "cpu_op", 961, 28)
    launch("hipMemcpyWithStream", 962, 20, "gpu_memcpy", "Memcpy DtoH (Device -> Host)", 970, 5)
    x("hipStreamSynchronize", "cuda_runtime", 985, 3, correlation=999)
    # Step 2: one forward kernel; a bare torch.cuda.synchronize() in `rest`.
    x("aten::mm", "cpu_op", 1140, 30)
    launch("hipLaunchKernel", 1150, 10, "kernel", "Cijk_Ailk_Bljk_SB_MT64x64x16_SN", 1200, 100)
    x("hipDeviceSynchronize", "cuda_runtime", 1960, 30, correlation=1000)
    events.append(dict(ph="M", name="process_name", pid=GCD, tid=0, args=dict(name="python")))
    events.append(dict(ph="M", name="thread_name", pid=GCD, tid=QUEUE, args=dict(name="stream 1")))
    return {"traceEvents": events, "deviceProperties": [dict(id=0, name="AMD Instinct MI250X")]}


def test_mi250_steps_count_once_and_parts_add_up():
    trace = mi250_trace()
    assert [traces.step_number(s) for s in traces.profiler_steps(trace)] == [1, 2]
    rows = summarize.step_breakdown(trace)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert sum(r[c] for c in summarize.COLUMNS) == pytest.approx(r["total"])
    assert (rows[0]["h2d_copy"], rows[0]["forward"], rows[0]["backward"], rows[0]["optimizer"]) == \
        pytest.approx((0.07, 0.3, 0.4, 0.15))


def test_mi250_device_work_belongs_to_the_part_that_launched_it():
    step1, step2 = summarize.device_breakdown(mi250_trace())
    # Written out from the trace above (ms). By time overlap the forward GEMM (420-620 us) would be
    # "backward", and Adam's kernel (1020-1120 us) would be step 2.
    assert step1["kernel"] == pytest.approx(dict(data_wait=0, h2d_copy=0, forward=0.2, backward=0.5, optimizer=0.1,
                                                 rest=0))
    assert step1["gpu_memcpy"] == pytest.approx(dict(data_wait=0, h2d_copy=0.03, forward=0, backward=0, optimizer=0,
                                                     rest=0.005))
    assert step1["gpu_memset"]["backward"] == pytest.approx(0.01) and sum(step1["gpu_memset"].values()) == 0.01
    assert step2["kernel"]["forward"] == pytest.approx(0.1) and sum(step2["kernel"].values()) == pytest.approx(0.1)
    assert step1["unlinked"] == step2["unlinked"] == 0
    # Runtime calls are host time: by their own timestamp (hipLaunchKernel at 500 on the autograd thread: backward).
    assert step1["runtime"]["backward"] == pytest.approx((5 + 10 + 8) / 1e3)


def test_mi250_timeline_draws_device_work_only_on_gpu_lanes(tmp_path):
    trace = mi250_trace()
    lanes = timeline.lanes(trace)
    device = [lane for lane in lanes if lane["device"]]
    assert [lane["key"] for lane in device] == [(GCD, QUEUE), (GCD, COMM_QUEUE)]
    drawn = [e for lane in device for e, _ in lane["bars"]]
    assert {traces.category(e) for e in drawn} == {"kernel", "gpu_memcpy", "gpu_memset"}
    assert len(drawn) == 8  # every kernel, copy and fill, and nothing else
    parts = {e["name"]: part for lane in device for e, part in lane["bars"]}
    assert parts["ncclDevKernel_AllReduce_Sum_f32_RING_LL"] == "backward"
    assert parts["elementwise_kernel_adam"] == "optimizer"
    assert all(key[0] != GCD for key in (lane["key"] for lane in lanes if not lane["device"]))
    path = tmp_path / "mi250.json"
    path.write_text(json.dumps(trace))
    assert timeline.draw(path).read_bytes()[:4] == b"\x89PNG"


def test_mi250_syncs_and_communication():
    trace = mi250_trace()
    per_step = syncs.host_syncs_per_step(trace)
    # Step 1: loss.item() = one sync although it is an aten op, a DtoH copy and a stream sync;
    # Adam's .item() of its CPU counter is not one. Step 2: torch.cuda.synchronize().
    assert [(r["step"], r["syncs"]) for r in per_step] == [(1, 1), (2, 1)]
    assert per_step[0]["where"] == {"aten::item": 1} and per_step[1]["where"] == {"hipDeviceSynchronize": 1}
    (item,) = [s for s in syncs.host_syncs(trace) if s["ts"] < 1000]
    assert item["signals"] == ["DtoH copy", "aten::_local_scalar_dense", "hipStreamSynchronize"]
    step1, step2 = comms.communication(trace)
    # RCCL kernel 760-960 us; backward compute kernel 650-950 us: 190 us of the 200 are hidden.
    assert step1 == dict(step=1, collectives=1, comm_ms=pytest.approx(0.2), overlap_ms=pytest.approx(0.19),
                         measured_on="device")
    assert (step2["collectives"], step2["comm_ms"]) == (0, 0)
    # Torch before c10d ops: only the backend's range names the call; still one collective.
    older = dict(trace, traceEvents=[e for e in trace["traceEvents"] if not str(e.get("name")).startswith("c10d::")])
    assert comms.communication(older)[0]["collectives"] == 1


def test_v100_steps_101_to_105_counted_once(v100):
    assert [traces.step_number(s) for s in traces.profiler_steps(v100)] == [101, 102, 103, 104, 105]
    rows = summarize.step_breakdown(v100)
    assert [r["step"] for r in rows] == [101, 102, 103, 104, 105]
    host_steps = {int(e["name"].split("#")[1]): e["dur"] / 1e3 for e in raw(V100)["traceEvents"]
                  if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")}
    for r in rows:
        assert sum(r[c] for c in summarize.COLUMNS) == pytest.approx(host_steps[r["step"]])
        assert r["backward"] > 0 and r["forward"] > 0


def test_v100_kernels_and_copies_land_in_the_launching_part(v100):
    events = raw(V100)["traceEvents"]
    rows = {r["step"]: r for r in summarize.device_breakdown(v100)}
    assert all(r["unlinked"] == 0 for r in rows.values())
    # Independent reference: join device events to runtime calls by args.correlation, and runtime
    # calls to the step they were made in; every launch of a step is accounted for, in some part.
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    expected = defaultdict(float)
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            launch = runtime[e["args"]["correlation"]]["ts"]
            for s in steps:
                if s["ts"] <= launch < s["ts"] + s["dur"]:
                    expected[(int(s["name"].split("#")[1]), e["cat"])] += e["dur"] / 1e3
    for (step, cat), ms in expected.items():
        assert sum(rows[step][cat].values()) == pytest.approx(ms)
    # The backward of this ResNet runs on the autograd thread (tid 1262): all it launches is backward.
    autograd = defaultdict(float)
    for e in events:
        if e.get("cat") == "kernel" and runtime[e["args"]["correlation"]]["tid"] == 1262:
            launch = runtime[e["args"]["correlation"]]["ts"]
            for s in steps:
                if s["ts"] <= launch < s["ts"] + s["dur"]:
                    autograd[int(s["name"].split("#")[1])] += e["dur"] / 1e3
    for step, ms in autograd.items():
        assert rows[step]["kernel"]["backward"] >= ms - 1e-9
    # Launch, not overlap: step 101's forward launched more device work (30 ms on one stream) than
    # its host forward range lasted, which time overlap with that range could never give.
    forward_101 = next(r for r in summarize.step_breakdown(v100) if r["step"] == 101)["forward"]
    assert sum(rows[101][kind]["forward"] for kind in ("kernel", "gpu_memcpy", "gpu_memset")) > 1.5 * forward_101
    assert all(rows[s]["gpu_memcpy"]["data_wait"] == 0 for s in rows)  # no data_wait label in this trace


def test_v100_timeline_lanes_and_picture(v100, tmp_path):
    lanes = timeline.lanes(v100)
    device = [lane for lane in lanes if lane["device"]]
    assert [lane["key"] for lane in device] == [(0, 7)]  # one stream; the GPU lanes 1-7 have nothing
    assert all(traces.category(e) in traces.DEVICE_CATEGORIES for e, _ in device[0]["bars"])
    assert not any(traces.category(e) == "gpu_user_annotation" for lane in lanes for e, _ in lane["bars"])
    assert lanes[0]["key"] == (1102, 1102)  # the stepping thread first
    png = timeline.draw(V100, tmp_path / "v100.png", trace=v100)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_v100_collectives_and_syncs_per_step(v100):
    events = raw(V100)["traceEvents"]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    c10d = Counter(int(s["name"].split("#")[1]) for e in events if str(e.get("name")).startswith("c10d::")
                   for s in steps if s["ts"] <= e["ts"] < s["ts"] + s["dur"])
    rows = comms.communication(v100)
    assert [(r["step"], r["collectives"]) for r in rows] == sorted(c10d.items())
    assert all(r["collectives"] == 7 for r in rows)  # per step: 5 gradient all-reduces, 2 broadcasts
    # This rank ran NCCL with world_size 1 (distributedInfo): NCCL launches no kernel and no copy
    # then, so there is no device time in communication.
    assert raw(V100)["distributedInfo"]["world_size"] == 1
    assert all(r["comm_ms"] == 0 and r["measured_on"] == "device" for r in rows)
    assert [r["syncs"] for r in syncs.host_syncs_per_step(v100)] == [0] * 5
    (last,) = syncs.host_syncs(v100)  # one cudaDeviceSynchronize, after the last step
    assert last["name"] == "cudaDeviceSynchronize" and last["ts"] > steps[-1]["ts"] + steps[-1]["dur"]


def test_a100_cuda_sync_events_are_counted_once_each():
    events = raw(A100)["traceEvents"]
    blocking = [e for e in events if e.get("cat") == "cuda_sync" and e["args"]["cuda_sync_kind"] != "Stream Wait Event"]
    assert len(blocking) == 21  # 16 Stream Sync (after pageable HtoD copies) + 5 Context Sync
    found = syncs.host_syncs(traces.load(A100))
    assert len(found) == len(blocking)
    assert Counter(s["name"] for s in found) == {"aten::to": 16, "cudaDeviceSynchronize": 5}
    assert all(any(signal.startswith("cuda_sync") for signal in s["signals"]) for s in found)
    with pytest.raises(Exception, match="no ProfilerStep"):
        syncs.host_syncs_per_step(traces.load(A100))  # a plain profile without steps: no per-step count


def test_a100_pageable_host_to_device_copies_are_syncs_without_a_stream_sync():
    """A copy from pageable memory waits for the GPU even when nothing calls a synchronize: the
    A100 trace's 16 `Memcpy HtoD (Pageable -> Device)` came from blocking .to() calls (each with
    a cudaStreamSynchronize); without those calls and their cuda_sync records, as a
    non_blocking=True copy from pageable memory leaves the trace, each copy is still a sync. From
    pinned memory ("Pinned -> Device") the same copies are none."""
    trace = traces.load(A100)
    found = syncs.host_syncs(trace)  # as recorded: each copy's sync counted once
    assert Counter(s["name"] for s in found) == {"aten::to": 16, "cudaDeviceSynchronize": 5}
    assert all("pageable HtoD copy" in s["signals"] for s in found if s["name"] == "aten::to")
    stream_syncs = {e["args"]["correlation"] for e in trace["traceEvents"]
                    if e.get("cat") == "cuda_sync" and e["name"] == "Stream Sync"}
    non_blocking = dict(trace, traceEvents=[
        e for e in trace["traceEvents"]
        if not (e.get("cat") == "cuda_sync" and e["name"] == "Stream Sync")
        and not (e.get("cat") == "cuda_runtime" and e["name"] == "cudaStreamSynchronize")])
    assert len(stream_syncs) == 16 and len(non_blocking["traceEvents"]) == len(trace["traceEvents"]) - 32
    found = syncs.host_syncs(non_blocking)
    assert Counter(s["name"] for s in found) == {"aten::to": 16, "cudaDeviceSynchronize": 5}
    assert all(s["signals"] == ["pageable HtoD copy"] for s in found if s["name"] == "aten::to")
    pinned = dict(non_blocking, traceEvents=[
        dict(e, name=e["name"].replace("Pageable", "Pinned")) if e.get("cat") == "gpu_memcpy" else e
        for e in non_blocking["traceEvents"]])
    assert Counter(s["name"] for s in syncs.host_syncs(pinned)) == {"cudaDeviceSynchronize": 5}


def test_merged_v100_and_mi250_keep_steps_and_launches_per_rank(v100):
    merged = merge_traces.merge([(0, v100), (1, mi250_trace())])
    steps = traces.profiler_steps(merged)
    assert len(steps) == 5 + 2  # the MI250 mirrors on its GPU lane are not steps
    rank_of_pid = {e["pid"]: int(e["args"]["name"].split(":")[0].split()[1]) for e in merged["traceEvents"]
                   if e.get("name") == "process_name"}
    linked = [(e, launcher) for e, launcher in traces.launches(merged)
              if traces.category(e) in traces.DEVICE_CATEGORIES]
    assert len(linked) == 4350 + 1600 + 145 + 8 and all(launcher is not None for _, launcher in linked)
    # Both traces use correlation ids from 135071 on: each kernel still finds its own rank's launch.
    assert all(rank_of_pid[e["pid"]] == rank_of_pid[launcher["pid"]] for e, launcher in linked)
    # The tools read a merged file rank by rank: the same answers as on each rank's own trace.
    (rank0, t0), (rank1, t1) = merge_traces.split(merged)
    assert (rank0, rank1) == (0, 1)
    assert summarize.device_breakdown(t1) == summarize.device_breakdown(mi250_trace())
    assert [r["collectives"] for r in comms.communication(t0)] == [7] * 5
    parts = {e["name"]: part for lane in timeline.lanes(merged) if lane["rank"] == 1 and lane["device"]
             for e, part in lane["bars"]}
    assert parts["ncclDevKernel_AllReduce_Sum_f32_RING_LL"] == "backward"
    assert parts["elementwise_kernel_adam"] == "optimizer"


@pytest.mark.slow  # HolisticTraceAnalysis reads the 69k events again: ~20 s on 2 cores
def test_summary_cli_on_the_v100_trace(tmp_path):
    from tests.conftest import run_script

    result = run_script("profiling/summarize.py", V100, "--json", tmp_path / "s.json", "--top", "3")
    assert result.returncode == 0, result.stderr
    for column in ("syncs/step", "collectives", "comm ms", "overlap %"):
        assert column in result.stdout
    assert "Device time launched by each part" in result.stdout
    summary = json.loads((tmp_path / "s.json").read_text())
    assert [r["step"] for r in summary["steps"]] == [101, 102, 103, 104, 105]
    assert all(r["syncs"] == 0 and r["collectives"] == 7 for r in summary["steps"])
    assert [r["step"] for r in summary["device"]] == [101, 102, 103, 104, 105]


def test_key_averages_sort_key_names_a_field_this_torch_has():
    from torch.autograd.profiler_util import FunctionEventAvg

    assert traces.key_averages_sort_key(torch.device("cpu")) == "self_cpu_time_total"
    key = traces.key_averages_sort_key(torch.device("cuda"))
    assert key in ("self_device_time_total", "self_cuda_time_total")
    assert key in vars(FunctionEventAvg())  # a plain attribute here, not a deprecated alias
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(4).sum()
    assert "Name" in prof.key_averages().table(sort_by=key, row_limit=3)  # the table accepts it


def profile_labelled_loop(device, path, steps=5, active=3):
    """A tiny labelled training loop on `device`, profiled with CPU (+ CUDA/ROCm) activities; loss.item() once a step."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = torch.randn(32, 64).pin_memory() if device.type == "cuda" else torch.randn(32, 64)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=1, warmup=steps - active - 1, active=active, repeat=1),
                 on_trace_ready=lambda p: traces.save(p, path)) as prof:
        for _ in range(steps):
            with record_function("h2d_copy"):
                x = batch.to(device, non_blocking=True)
            with record_function("forward"):
                loss = model(x).pow(2).mean()
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            float(loss.item())
            prof.step()
    return traces.load(path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU that torch sees (CUDA or ROCm)")
def test_a_real_gpu_trace_counts_each_step_once_and_links_every_kernel(tmp_path):
    gpu = profile_labelled_loop(torch.device("cuda"), tmp_path / "gpu.json.gz")
    cpu = profile_labelled_loop(torch.device("cpu"), tmp_path / "cpu.json.gz")
    assert len(traces.profiler_steps(gpu)) == 3  # not 6: the GPU-lane mirrors are not steps
    rows = summarize.device_breakdown(gpu)
    assert [r["unlinked"] for r in rows] == [0, 0, 0]
    for r in rows:
        assert r["kernel"]["forward"] > 0 and r["kernel"]["backward"] > 0 and r["kernel"]["optimizer"] > 0
        assert r["gpu_memcpy"]["h2d_copy"] > 0  # the batch copy, launched in h2d_copy
    assert all(lane["device"] or traces.is_host(e) for lane in timeline.lanes(gpu) for e, _ in lane["bars"])
    # One loss.item() per step, counted the same on the GPU (copy + sync) as on the CPU.
    assert [r["syncs"] for r in syncs.host_syncs_per_step(gpu)] == [1, 1, 1]
    assert [r["syncs"] for r in syncs.host_syncs_per_step(cpu)] == [1, 1, 1]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        (torch.ones(256, 256, device="cuda") @ torch.ones(256, 256, device="cuda")).sum().item()
    prof.key_averages().table(sort_by=traces.key_averages_sort_key(torch.device("cuda")), row_limit=3)
