"""Exercise 01's profiled window, moved out of the solutions once the steps that teach it are done.

`start` is solution 01's set-up of torch.profiler (a bounded schedule: wait, warm up, record);
`finish` is the end of a --profile run as solution 05 left it (every rank wrote its trace, rank 0
reads its own); `nvtx_ranges` is solution 10's --nvtx (NVTX / ROCTx ranges for vendor profilers).
tests/test_drift.py checks that each is the taught code, statement for statement.
"""
import contextlib

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from profiling import summarize, timeline, traces
from wellfno.cli import UserError
from wellfno.launch import launch_environment


def start(device, out, enabled, wait, warmup, active, memory=False, with_stack=False):
    """The started profiler of a --profile run and the trace it will write (None, None without):
    `wait`, `warmup` and `active` steps (--profile-wait, -warmup, -active), memory and Python
    stacks recorded if asked (--profile-memory, --with-stack), the trace written under `out`."""
    prof = trace = None
    if enabled:
        rank = launch_environment().rank  # torchrun's or srun's rank, 0 alone
        # the recorded steps are ProfilerStep#first..#last
        first = wait + warmup
        trace = out / f"trace_rank{rank}_steps{first}-{first + active - 1}.json.gz"
        # GPU kernels and copies (ROCm builds too) only on a GPU: a CPU run must not ask for CUDA.
        activities = [ProfilerActivity.CPU] + (
            [ProfilerActivity.CUDA] if device.type == "cuda" else [])
        prof = profile(activities=activities, profile_memory=memory, with_stack=with_stack,
                       on_trace_ready=lambda p: traces.save(p, trace, rank),
                       schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1))
        prof.start()
    return prof, trace


def finish(prof, trace, step, env, device):
    """Stop the profiler after `step` steps; rank 0 prints its table and summary, draws steps."""
    prof.stop()
    if not trace.exists():
        raise UserError(f"the run ended after {step} steps, before the profiled window: raise "
                        "--epochs")
    if env.rank > 0:
        return  # every rank wrote its trace; rank 0 alone reads its own
    sort_by = traces.key_averages_sort_key(device)  # the key differs between torch versions
    print(prof.key_averages().table(sort_by=sort_by, row_limit=15))
    loaded = summarize.print_summary(trace)
    print(f"Wrote {trace} (open it in https://ui.perfetto.dev) and "
          f"{timeline.draw(trace, trace=loaded)}")
    return


def nvtx_ranges(enabled):
    """Solution 10's --nvtx: the record_function ranges as NVTX (NVIDIA) / ROCTx (AMD) ranges,
    entered here; the caller exits it after training (solutions 12 on call it here)."""
    # emit_nvtx turns every record_function range (and op) into an NVTX range; ROCm torch: ROCTx.
    nvtx = torch.autograd.profiler.emit_nvtx() if enabled else contextlib.nullcontext()
    nvtx.__enter__()
    return nvtx
