"""profiling/: summary, timeline and merge on real torch.profiler traces (made in-process, tiny) and
on hand-written GPU traces whose answers are known."""
import contextlib
import gzip
import json
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from tests.conftest import run_script
from profiling import comms, merge_traces, summarize, syncs, timeline, traces

ACTIVE = 3


def make_trace(path, rank=0):
    """A real CPU trace: 5 steps, the last 3 recorded, every part labelled, 1 ms unlabelled per step."""
    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=ACTIVE, repeat=1),
                 on_trace_ready=lambda p: traces.save(p, path, rank)) as prof:
        for _ in range(5):
            with record_function("data_wait"):
                time.sleep(0.002)  # a DataLoader that takes 2 ms
                x = torch.randn(64, 32)
            with record_function("h2d_copy"):
                x = x.to("cpu", copy=True)
            with record_function("forward"):
                loss = model(x).pow(2).mean()
            with record_function("backward"):
                optimizer.zero_grad()
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
            time.sleep(0.001)  # unlabelled: lands in `rest`
            prof.step()
    return path


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    return make_trace(tmp_path_factory.mktemp("trace") / "trace_rank0_steps2-4.json.gz")


def read(path):
    return json.loads(gzip.decompress(path.read_bytes()))


def test_saved_trace_is_gzipped_chrome_json_tagged_with_the_rank(cpu_trace):
    trace = read(cpu_trace)
    steps = [e for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    assert [e["name"] for e in steps] == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert trace["distributedInfo"]["rank"] == 0


def test_step_parts_add_up_to_the_profiler_steps(cpu_trace):
    durations_ms = {int(e["name"].split("#")[1]): e["dur"] / 1e3 for e in read(cpu_trace)["traceEvents"]
                    if e.get("name", "").startswith("ProfilerStep#")}
    rows = summarize.step_breakdown(traces.load(cpu_trace))
    assert [r["step"] for r in rows] == sorted(durations_ms)
    for r in rows:
        parts = sum(r[c] for c in summarize.COLUMNS)
        assert parts == pytest.approx(durations_ms[r["step"]], rel=0.05)
        assert r["data_wait"] >= 1.9 and r["rest"] >= 0.9, r  # the sleeps land where they belong
        assert min(r["h2d_copy"], r["forward"], r["backward"], r["optimizer"]) > 0, r


def test_nested_labels_are_not_counted_twice():
    def x(name, ts, dur, cat="user_annotation"):
        return dict(ph="X", name=name, cat=cat, ts=ts, dur=dur, pid=1, tid=1)

    trace = {"traceEvents": [x("ProfilerStep#0", 0, 1000), x("next batch", 0, 300), x("forward", 300, 500),
                             x("forward/encoder", 350, 200), x("my_label", 800, 100)]}
    (row,) = summarize.step_breakdown(trace)
    assert (row["data_wait"], row["forward"], row["rest"]) == (0.3, 0.5, 0.2)  # unknown label -> rest


def gpu_trace():
    """Two 1 ms steps on the host; stream kernels busy 0.4 ms of step 0 and 0.1 ms of step 1."""
    def x(name, cat, ts, dur, pid=1, tid=1):
        return dict(ph="X", name=name, cat=cat, ts=ts, dur=dur, pid=pid, tid=tid)

    return {"traceEvents": [
        x("ProfilerStep#5", "user_annotation", 0, 1000), x("ProfilerStep#6", "user_annotation", 1000, 1000),
        x("forward", "user_annotation", 0, 900),
        x("void gemm", "kernel", 100, 200, pid=0, tid=7), x("void gemm", "kernel", 200, 200, pid=0, tid=8),
        x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 600, 100, pid=0, tid=7),
        x("void relu", "kernel", 1950, 100, pid=0, tid=7),  # half inside step 6, half after it
    ]}


def test_gpu_busy_is_the_union_of_device_work_per_step():
    busy = summarize.gpu_busy(gpu_trace())
    assert [(r["step"], round(r["busy"], 3)) for r in busy] == [(5, 0.4), (6, 0.05)]
    assert summarize.gpu_busy({"traceEvents": gpu_trace()["traceEvents"][:3]}) is None
    top = summarize.top_operators(gpu_trace())["device"]
    assert top[0] == dict(name="void gemm", self_ms=0.4, calls=2)


def test_top_host_operators_use_self_time(cpu_trace):
    host = summarize.top_operators(traces.load(cpu_trace), n=50)["host"]
    assert host and all(r["self_ms"] >= 0 for r in host)
    names = {r["name"] for r in host}
    assert "aten::addmm" in names or "aten::linear" in names


def test_summary_cli_prints_the_table_and_writes_json(cpu_trace, tmp_path):
    result = run_script("profiling/summarize.py", cpu_trace, "--json", tmp_path / "s.json")
    assert result.returncode == 0, result.stderr
    assert "data_wait" in result.stdout and "#4" in result.stdout and "No device kernels" in result.stdout
    assert len(json.loads((tmp_path / "s.json").read_text())["steps"]) == ACTIVE


def test_timeline_png_is_written(cpu_trace, tmp_path):
    png = timeline.draw(cpu_trace, tmp_path / "t.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps(gpu_trace()))
    assert timeline.draw(gpu).name == "gpu_timeline.png"  # next to the trace; device lanes too


def test_merge_keeps_both_ranks_apart_on_one_clock(cpu_trace, tmp_path):
    rank1 = read(cpu_trace)
    rank1["distributedInfo"]["rank"] = 1
    rank1["baseTimeNanoseconds"] = rank1.get("baseTimeNanoseconds", 0) + 10**9  # started 1 s later
    (tmp_path / "trace_rank1.json").write_text(json.dumps(rank1))
    out = tmp_path / "merged.json.gz"
    result = run_script("profiling/merge_traces.py", cpu_trace, tmp_path / "trace_rank1.json", "--out", out)
    assert result.returncode == 0, result.stderr
    merged = read(out)
    steps = [e for e in merged["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    assert len(steps) == 2 * ACTIVE
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    pid_rank = {pid: int(name.split(":")[0].split()[1]) for pid, name in names.items()}
    step_pids = {pid_rank[e["pid"]]: e["pid"] for e in steps}
    assert set(step_pids) == {0, 1} and step_pids[0] != step_pids[1]
    first = {r: min(e["ts"] for e in steps if e["pid"] == pid) for r, pid in step_pids.items()}
    assert first[1] - first[0] == pytest.approx(1e6, abs=1.0)  # the 1 s survives
    assert min(e["ts"] for e in merged["traceEvents"] if e.get("ph") == "X") >= 0

    aligned = merge_traces.merge([(0, traces.load(cpu_trace)), (1, rank1)], align="step")
    starts = [min(e["ts"] for e in aligned["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")
                  and pid_rank.get(e["pid"], -1) == r) for r in (0, 1)]
    assert starts[0] == pytest.approx(starts[1], abs=1.0)


@pytest.mark.parametrize("tool", ["summarize.py", "timeline.py", "merge_traces.py"])
def test_bad_input_is_one_error_line(tool, tmp_path):
    not_a_trace = tmp_path / "notes.json"
    not_a_trace.write_text("hello")
    no_steps = tmp_path / "empty.json"
    no_steps.write_text(json.dumps({"traceEvents": []}))
    for bad, says in ((tmp_path / "missing.json.gz", "no such trace file"), (not_a_trace, "not a Chrome trace"),
                      (no_steps, "no ProfilerStep")):
        args = [bad, "--out", tmp_path / "m.json"] if tool == "merge_traces.py" else [bad]
        result = run_script(f"profiling/{tool}", *args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert says in lines[0]


def profile_adam_loop(path, read_loss: bool):
    """5 steps of a tiny model with Adam (which reads its CPU step counter with .item() inside
    Optimizer.step#Adam.step), the last 3 recorded; `read_loss`: loss.item() once per step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=ACTIVE, repeat=1),
                 on_trace_ready=lambda p: traces.save(p, path)) as prof:
        for _ in range(5):
            with record_function("forward"):
                loss = model(torch.randn(8, 16)).pow(2).mean()
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            if read_loss:
                float(loss.item())
            prof.step()
    return traces.load(path)


def test_host_syncs_per_step_count_read_backs_but_not_adams_counter(tmp_path):
    with_item = profile_adam_loop(tmp_path / "item.json.gz", read_loss=True)
    without = profile_adam_loop(tmp_path / "none.json.gz", read_loss=False)
    # Adam's own .item() is in the trace, inside its Optimizer.step# range, in both loops ...
    events = traces.complete_events(without)
    optim = [e for e in events if e["name"].startswith("Optimizer.step#Adam.step")]
    reads = [e for e in events if e["name"] == "aten::_local_scalar_dense"]
    assert len(optim) == ACTIVE and reads
    assert all(any(o["ts"] <= r["ts"] < o["ts"] + o["dur"] for o in optim) for r in reads)
    # ... and is not a sync; loss.item() is, once per step.
    assert [r["syncs"] for r in syncs.host_syncs_per_step(without)] == [0] * ACTIVE
    rows = syncs.host_syncs_per_step(with_item)
    assert [r["syncs"] for r in rows] == [1] * ACTIVE
    assert all(r["where"] == {"aten::item": 1} for r in rows)
    summary = summarize.summarize(with_item)
    assert [r["syncs"] for r in summary["steps"]] == [1] * ACTIVE


def gpu_step_with_two_read_backs(with_device: bool = True) -> dict:
    """One CUDA step as Kineto writes it (tests/test_gpu_traces.py has the categories): loss.item()
    (an aten::item whose _local_scalar_dense makes a cudaMemcpyAsync, its DtoH copy, and a
    cudaStreamSynchronize) and a CPU generator's int(torch.randint(...)) (an aten::item with no
    runtime call at all: step 14's --pushforward drew its N so, every step). `with_device=False`:
    the same host ops without a runtime call or device record, as a CPU trace has them."""
    host = dict(pid=1, tid=1)
    events = [dict(ph="X", cat="user_annotation", name="ProfilerStep#3", ts=0, dur=1000, **host),
              dict(ph="X", cat="cpu_op", name="aten::item", ts=100, dur=10, **host),
              dict(ph="X", cat="cpu_op", name="aten::_local_scalar_dense", ts=101, dur=8, **host),
              dict(ph="X", cat="cpu_op", name="aten::item", ts=500, dur=60, **host),
              dict(ph="X", cat="cpu_op", name="aten::_local_scalar_dense", ts=501, dur=58, **host)]
    if with_device:
        events += [dict(ph="X", cat="cuda_runtime", name="cudaMemcpyAsync", ts=505, dur=10,
                        args=dict(correlation=7), **host),
                   dict(ph="X", cat="gpu_memcpy", name="Memcpy DtoH (Device -> Pageable)", ts=520,
                        dur=2, pid=0, tid=7, args=dict(correlation=7)),
                   dict(ph="X", cat="cuda_runtime", name="cudaStreamSynchronize", ts=516, dur=40,
                        args=dict(correlation=8), **host)]
    return {"traceEvents": events}


def test_a_cpu_tensors_read_back_is_no_sync_on_a_gpu_trace():
    # On the GPU trace: loss.item() (copy + stream sync) is the one sync; the CPU draw at 100 us,
    # which waits for no device, is none (before: 2 per step, one a "sync" that never waits).
    (row,) = syncs.host_syncs_per_step(gpu_step_with_two_read_backs())
    assert (row["syncs"], row["where"]) == (1, {"aten::item": 1})
    (found,) = syncs.host_syncs(gpu_step_with_two_read_backs())
    assert found["ts"] == 500 and found["signals"] == [
        "DtoH copy", "aten::_local_scalar_dense", "cudaStreamSynchronize"]
    # A CPU trace cannot tell the two apart (every tensor is on the CPU): both count, as the
    # course's CPU checks of a GPU habit need (exercise 08).
    (row,) = syncs.host_syncs_per_step(gpu_step_with_two_read_backs(with_device=False))
    assert (row["syncs"], row["where"]) == (2, {"aten::item": 2})


def ddp_gpu_steps() -> dict:
    """Two CUDA steps of a DDP run as Kineto writes them. Step 3: DistributedDataParallel.forward
    (a record_function range, torch/nn/parallel/distributed.py) starts with DDP's runtime stats,
    a cudaEventSynchronize in no aten op (with CUPTI's Event Sync record), then the model's ops.
    Step 4: the loop's own torch.cuda.Event.synchronize(), outside DDP's forward."""
    host = dict(pid=1, tid=1)
    events = []
    for n, t in ((3, 0), (4, 1000)):
        events.append(dict(ph="X", cat="user_annotation", name=f"ProfilerStep#{n}", ts=t, dur=1000, **host))
        events.append(dict(ph="X", cat="user_annotation", name="forward", ts=t + 10, dur=300, **host))
        events.append(dict(ph="X", cat="user_annotation", name="DistributedDataParallel.forward",
                           ts=t + 20, dur=280, **host))
        events.append(dict(ph="X", cat="cpu_op", name="aten::conv1d", ts=t + 100, dur=50, **host))
    for ts, corr in ((30, 11), (1500, 12)):  # DDP's (step 3), the loop's (step 4)
        events.append(dict(ph="X", cat="cuda_runtime", name="cudaEventSynchronize", ts=ts, dur=40,
                           args=dict(correlation=corr), **host))
        events.append(dict(ph="X", cat="cuda_sync", name="Event Sync", ts=ts + 5, dur=30, pid=0,
                           tid=7, args=dict(correlation=corr, cuda_sync_kind="Event Sync")))
    return {"traceEvents": events}


def test_ddps_runtime_stats_syncs_are_named_not_counted():
    # DDP's event synchronize (forwards 2-11 and every 100th: reducer.cpp's
    # should_collect_runtime_stats) is torch's, not the loop's: named, not counted. The loop's
    # own event synchronize is counted, once with its CUPTI record.
    rows = syncs.host_syncs_per_step(ddp_gpu_steps())
    assert [(r["step"], r["syncs"]) for r in rows] == [(3, 0), (4, 1)]
    assert [r["ddp_runtime_stats"] for r in rows] == [1, 0]
    assert rows[1]["where"] == {"cudaEventSynchronize": 1}
    (ddp,) = syncs.host_syncs(ddp_gpu_steps(), ddp_runtime_stats=True)
    assert (ddp["ts"], ddp["signals"]) == (30, ["cudaEventSynchronize", "cuda_sync: Event Sync"])
    summary = summarize.summarize(ddp_gpu_steps())  # the printed summary names them apart
    assert [(r["syncs"], r["ddp_runtime_stats"]) for r in summary["steps"]] == [(0, 1), (1, 0)]


def ddp_worker(rank, world_size, out):
    """Rank of a 2-process gloo DDP run: 5 steps, the last 3 profiled, the middle one under no_sync()."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    # A file rendezvous: no port to race for with other test runs on the machine.
    dist.init_process_group("gloo", init_method=f"file://{out / 'rendezvous'}", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.3)  # one layer per bucket
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=ACTIVE, repeat=1),
                 on_trace_ready=lambda p: traces.save(p, out / f"trace_rank{rank}.json.gz", rank)) as prof:
        for step in range(5):
            x = torch.randn(64, 256)
            # Step 3 accumulates gradients: DDP decides in forward whether backward all-reduces.
            with ddp.no_sync() if step == 3 else contextlib.nullcontext():
                with record_function("forward"):
                    loss = ddp(x).pow(2).mean()
                with record_function("backward"):
                    loss.backward()
            with record_function("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            prof.step()
    if rank == 0:  # DDP's own account of its buckets: one all-reduce per bucket and step
        buckets = ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]
        (out / "buckets.json").write_text(json.dumps(len(str(buckets).split(","))))
    dist.destroy_process_group()


@pytest.mark.slow
def test_communication_column_on_a_real_two_rank_gloo_ddp_run(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(ddp_worker, args=(2, tmp_path), nprocs=2)
    buckets = json.loads((tmp_path / "buckets.json").read_text())
    assert buckets >= 2
    for rank in (0, 1):
        trace = traces.load(tmp_path / f"trace_rank{rank}.json.gz")
        rows = {r["step"]: r for r in comms.communication(trace)}
        parts = {r["step"]: r for r in summarize.step_breakdown(trace)}
        assert sorted(rows) == [2, 3, 4]
        assert rows[3]["collectives"] == 0 and rows[3]["comm_ms"] == 0  # the no_sync() step
        for step in (2, 4):
            r = rows[step]
            assert r["collectives"] == buckets and r["measured_on"] == "host"
            assert r["comm_ms"] > 0 and 0 <= r["overlap_ms"] <= min(r["comm_ms"], parts[step]["backward"]) + 1e-9
    result = run_script("profiling/summarize.py", tmp_path / "trace_rank1.json.gz")
    assert result.returncode == 0, result.stderr
    assert "collectives" in result.stdout and "overlap %" in result.stdout
    out = tmp_path / "merged.json.gz"
    result = run_script("profiling/merge_traces.py", *(tmp_path / f"trace_rank{r}.json.gz" for r in (0, 1)),
                        "--out", out)
    assert result.returncode == 0, result.stderr
    assert len(traces.profiler_steps(traces.load(out))) == 2 * ACTIVE
    result = run_script("profiling/summarize.py", out, "--json", tmp_path / "merged_summary.json")
    assert result.returncode == 0, result.stderr
    assert "=== rank 0" in result.stdout and "=== rank 1" in result.stdout
    by_rank = json.loads((tmp_path / "merged_summary.json").read_text())["ranks"]
    assert [r["collectives"] for r in by_rank["1"]["steps"]] == [buckets, 0, buckets]
