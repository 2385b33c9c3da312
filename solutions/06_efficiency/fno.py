"""Solution 06: every device step counts: no host syncs in the step, mixed precision, torch.compile, FLOP/s vs peak.

    python fno.py                                   # embedded Gray-Scott data, made on first use
    python fno.py --dataset turbulent_radiative_layer_2D --data-dir /scratch/well --download
    python solutions/01_profiling/fno.py --profile --max-steps 12   # trace steps 7-11, then stop
    python solutions/02_data_pipeline/fno.py --num-workers 4 --pin-memory --persistent-workers --fast-reader
    srun -n 4 --gpus-per-node=4 python solutions/03_affinity/fno.py --num-workers 4 --bind exclusive
    python solutions/06_efficiency/fno.py --log-every 50 --amp bf16 --compile --width 64 --batch-size 64

Writes OUT/metrics.json (with FLOPs per sample, achieved FLOP/s and MFU), OUT/rollout.png and
OUT/checkpoint.pt (`--resume` continues from it).
"""
import argparse
import contextlib
import importlib.util
import os
import resource
import shutil
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import DataLoader
from tqdm import tqdm

from affinity.bind import bind_this_rank, worker_init_fn
from affinity.report import report_line
from profiling import summarize, timeline, traces

from wellfno import data, flops, plots
from wellfno.cli import UserError, atomic_torch_save, atomic_write_json, run_main
from wellfno.fastwell import fast_datasets
from wellfno.model import NextFrameFNO, channel_stats
from wellfno.rollout import evaluate_rollouts


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default=data.EMBEDDED, help="embedded dataset or a Well dataset name")
    p.add_argument("--data-dir", default=os.environ.get("WELL_DATA", "data"),
                   help="folder that holds datasets/ (default $WELL_DATA or ./data)")
    p.add_argument("--download", action="store_true", help="fetch a missing Well dataset")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=0, help="stop training after this many steps (0: no limit)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--n-steps-input", type=int, default=1, help="frames the model sees")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/baseline", help="output folder")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--profile", action="store_true", help="trace the last steps of a --max-steps run (default 12)")
    p.add_argument("--profile-warmup", type=int, default=2, help="steps traced, then thrown away")
    p.add_argument("--profile-active", type=int, default=5, help="steps recorded into the trace")
    p.add_argument("--profile-memory", action="store_true", help="also record tensor allocations")
    p.add_argument("--with-stack", action="store_true", help="also record Python stacks (slower)")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes (0: load in this process)")
    p.add_argument("--prefetch-factor", type=int, default=None, help="batches each worker loads ahead (torch: 2)")
    p.add_argument("--persistent-workers", action="store_true", help="keep the workers from one epoch to the next")
    p.add_argument("--pin-memory", action="store_true", help="batches in page-locked memory: faster copies to a GPU")
    p.add_argument("--fast-reader", action="store_true", help="wellfno.fastwell: WellDataset's samples, read faster")
    p.add_argument("--bind", choices=["exclusive", "node", "core-complex", "none"], default="exclusive",
                   help="pin this rank and its workers to cores near its GPU (affinity/plan.py explains the modes)")
    p.add_argument("--report-workers", action="store_true", help="each DataLoader worker prints where it runs")
    p.add_argument("--log-every", type=int, default=20,
                   help="read the loss back from the device every K steps (the only host sync of the loop)")
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none",
                   help="mixed precision: autocast the convolutions; the FFTs and spectral weights stay float32")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (compile time reported apart)")
    p.add_argument("--width", type=int, default=32, help="FNO hidden channels")
    p.add_argument("--modes", type=int, default=12, help="Fourier modes kept per dimension")
    p.add_argument("--layers", type=int, default=4, help="FNO blocks")
    p.add_argument("--nvtx", action="store_true",
                   help="emit the record_function ranges as NVTX (NVIDIA) / ROCTx (AMD) ranges for nsys / rocprofv3")
    args = p.parse_args(argv)
    if args.nvtx and args.profile:
        raise UserError("--nvtx hands the ranges to Nsight Systems or rocprofv3; --profile to torch.profiler: "
                        "use one at a time")
    if args.num_workers < 0 or (args.prefetch_factor is not None and args.prefetch_factor < 1):
        raise UserError("--num-workers must be 0 or more and --prefetch-factor at least 1")
    if args.num_workers == 0 and (args.prefetch_factor is not None or args.persistent_workers):
        print("note: --prefetch-factor and --persistent-workers act on worker processes: ignored with --num-workers 0")
    if args.profile:  # wait out the first steps: they pay one-time costs (allocator, FFT plans, loader start)
        args.max_steps = args.max_steps or 12
        args.profile_wait = args.max_steps - args.profile_warmup - args.profile_active
        if args.profile_wait < 0 or args.profile_warmup < 0 or args.profile_active < 1:
            raise UserError("--profile needs --max-steps >= --profile-warmup + --profile-active (>= 1)")
    for name in ("epochs", "batch_size", "n_steps_input", "log_every", "width", "modes", "layers"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    return args


def pick_device(name):
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda, but torch sees no GPU: use --device cpu, or run on a GPU node")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"  # ROCm builds report as cuda too
    return torch.device(name)


def synchronize(device):
    """Wait for the device's queued work: only where a time is read, never inside the step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_amp(amp, device):
    if amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError(f"--amp bf16: {torch.cuda.get_device_name(device)} has no bfloat16 support: use --amp fp16")
    if amp != "none" and not torch.amp.is_autocast_available(device.type):
        raise UserError(f"--amp {amp}: torch has no autocast for {device.type}: use --amp none")


def check_compiler(device):
    """torch.compile's inductor writes C++ (CPU) or Triton (GPU) kernels: is the toolchain there?"""
    if device.type == "cpu":
        cxx = os.environ.get("CXX", "g++")
        if not (shutil.which(cxx) or shutil.which("clang++")):
            raise UserError(f"--compile on the CPU needs a C++ compiler ({cxx} or clang++) and there is none on "
                            f"PATH: install one (e.g. apt install g++) or run without --compile")
    elif importlib.util.find_spec("triton") is None:
        raise UserError("--compile on a GPU needs Triton (pip install triton; ROCm: pytorch-triton-rocm), "
                        "which this torch lacks: install it or run without --compile")


def spectral_convs_in_float32(fno):
    """Feed every SpectralConv float32, so its FFTs and complex weights stay float32 under autocast.

    Autocast puts the 1x1 convolutions (most of the FLOPs) in bf16/fp16, and their output goes into
    the FFT. CPU autocast casts FFTs to float32 itself; CUDA and ROCm autocast do not, and there
    torch.fft refuses bfloat16 (pytorch/pytorch#117844) and does float16 only for powers of 2.
    """
    def to_float32(module, args):
        return (args[0].float(), *args[1:])
    for conv in fno.fno_blocks.convs:
        conv.register_forward_pre_hook(to_float32)


class ComplexGradsAsReal:
    """The optimizer as GradScaler sees it: complex gradients shown as real (..., 2) views.

    GradScaler cannot unscale complex gradients (pytorch/pytorch#58228), and the spectral weights
    are complex. Unscaling a real view unscales the complex gradient in place; step() is the
    optimizer's own.
    """
    def __init__(self, optimizer):
        self.optimizer = optimizer

    @property
    def param_groups(self):
        def real(p):  # GradScaler reads p.grad of each parameter: give it a real view of both
            if p.grad is None or not p.grad.is_complex():
                return p
            view = torch.view_as_real(p.detach())
            view.grad = torch.view_as_real(p.grad)
            return view
        return [{**group, "params": [real(p) for p in group["params"]]} for group in self.optimizer.param_groups]

    def step(self, *args, **kwargs):
        return self.optimizer.step(*args, **kwargs)


def train_one_epoch(model, loader, optimizer, scaler, autocast, device, epoch, steps_left, log_every,
                    prof=None, first_step_apart=False):
    """Train for an epoch; the loss stays on the device and is read back every `log_every` steps."""
    model.train()
    loss_sum = torch.zeros((), device=device)  # sum of loss x batch size, on the device
    samples, step, untimed, first_step_seconds, loss_log = 0, 0, 0, None, []
    synchronize(device)
    start = time.perf_counter()
    bar = tqdm(loader, desc=f"epoch {epoch}", mininterval=1.0, dynamic_ncols=True)
    batches = iter(bar)
    while True:
        with record_function("data_wait"):  # the DataLoader reading and collating the next batch
            batch = next(batches, None)
        if batch is None:
            break
        with record_function("h2d_copy"):
            x, y = data.batch_to_model(batch, device, non_blocking=True)
        with record_function("forward"), autocast():
            loss = model.loss(model(x), y)
        with record_function("backward"):
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
        with record_function("optimizer"):
            scaler.step(ComplexGradsAsReal(optimizer))  # = optimizer.step(), but fp16: unscale, skip inf/nan
            scaler.update()
        loss_sum += loss.detach() * len(x)  # queued on the device: no wait
        samples += len(x)
        step += 1
        if first_step_apart and step == 1:  # torch.compile compiles during the first step: time it apart
            synchronize(device)
            first_step_seconds, untimed, start = time.perf_counter() - start, samples, time.perf_counter()
        if step % log_every == 0:  # the one read-back (a host sync) every log_every steps
            loss_log.append([step, loss_sum.item() / samples])  # [step of the epoch, mean loss so far]
            bar.set_postfix(loss=f"{loss_log[-1][1]:.4f}",
                            samples_per_s=f"{(samples - untimed) / (time.perf_counter() - start):.0f}")
        steps_left -= 1
        if prof is not None:
            prof.step()  # closes ProfilerStep#N and moves the schedule on
        if steps_left == 0:
            break
    bar.close()
    total_loss = loss_sum.item()  # waits for the last step, so the time below is the device's too
    seconds = time.perf_counter() - start
    if samples == untimed:  # a one-step run: nothing but the compiling step to time
        untimed, seconds = 0, first_step_seconds
    return dict(train_loss=total_loss / samples, samples=samples, timed_samples=samples - untimed,
                seconds=seconds, first_step_seconds=first_step_seconds, loss_log=loss_log)


@torch.no_grad()
def validate(model, loader, device):
    model.eval()
    total, n = torch.zeros((), device=device), 0
    for batch in loader:
        x, y = data.batch_to_model(batch, device, non_blocking=True)
        total += model.loss(model(x), y) * len(x)
        n += len(x)
    return total.item() / n


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = pick_device(args.device)
    cpus = None
    if args.bind != "none":  # before any worker starts: workers inherit the rank's CPUs
        cpus, rank_device = bind_this_rank(args.bind)  # local rank from LOCAL_RANK or SLURM_LOCALID
        device = rank_device if rank_device.type == device.type else device  # cuda:<local rank's GPU>
    print(report_line(device=device), flush=True)  # host, rank, CPUs, NUMA, GPU: do they match?
    check_amp(args.amp, device)
    if args.nvtx and device.type != "cuda":
        raise UserError("--nvtx marks ranges for Nsight Systems / rocprofv3 on a GPU; on the CPU use --profile")
    if args.compile:
        check_compiler(device)
    out = Path(args.out)
    dataset_dir = data.resolve_dataset(args.data_dir, args.dataset, args.download)
    splits = (fast_datasets if args.fast_reader else data.well_datasets)(dataset_dir, args.n_steps_input)
    fields = data.channel_names(splits["train"])
    stats = channel_stats(data.load_stats(dataset_dir), splits["train"].core_field_names)
    grid = tuple(splits["train"][0]["input_fields"].shape[1:3])  # (H, W) of a frame
    if args.modes > min(grid):  # neuralop keeps modes/2 frequencies each side of 0; a grid has up to N/2
        raise UserError(f"--modes {args.modes} is more than the {grid[0]}x{grid[1]} grid holds: the highest "
                        f"frequency kept, modes/2, must not pass the grid's N/2: use --modes {min(grid)} or fewer")
    if args.pin_memory and device.type != "cuda":  # page-locking only speeds up copies to a GPU; torch would warn
        print(f"note: --pin-memory ignored on {device}: there is no copy to a GPU to speed up")
    loader_options = dict(num_workers=args.num_workers, pin_memory=args.pin_memory and device.type == "cuda")
    if args.num_workers:  # DataLoader refuses these without workers
        loader_options.update(prefetch_factor=args.prefetch_factor, persistent_workers=args.persistent_workers)
        if cpus:  # each worker on its own slice of the rank's cores, not all on one
            loader_options["worker_init_fn"] = worker_init_fn(cpus, report=args.report_workers)
    # The generator fixes the shuffle and each worker's seed (torch seeds torch, random and numpy in
    # worker i with base_seed + i, base_seed drawn from it): the same batches with any --num-workers.
    train_loader = DataLoader(splits["train"], batch_size=args.batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(args.seed), **loader_options)
    valid_loader = DataLoader(splits["valid"], batch_size=args.batch_size,
                              generator=torch.Generator().manual_seed(args.seed), **loader_options)

    model = NextFrameFNO(len(fields), args.n_steps_input, stats, modes=args.modes, hidden=args.width,
                         layers=args.layers).to(device)
    spectral_convs_in_float32(model.fno)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")  # fp16's small range needs it
    amp_dtype = dict(bf16=torch.bfloat16, fp16=torch.float16).get(args.amp)
    autocast = (lambda: torch.autocast(device.type, dtype=amp_dtype)) if amp_dtype else contextlib.nullcontext
    # FLOPs of one training step on this input size: forward + backward, counted once (shapes only matter).
    example = torch.zeros(args.batch_size, len(fields) * args.n_steps_input, *grid, device=device)
    counted = flops.training_flops_per_sample(model, example, example[:, :len(fields)], model.loss)
    train_model = torch.compile(model) if args.compile else model  # compiles at its first call
    first_epoch, step, history = 1, 0, []
    checkpoint = out / "checkpoint.pt"
    if args.resume and checkpoint.exists():
        state = torch.load(checkpoint, map_location=device, weights_only=True)
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scaler.load_state_dict(state.get("scaler", {}))
        except (RuntimeError, ValueError):
            raise UserError(f"{checkpoint} was trained with other settings: use another --out or drop --resume")
        first_epoch, step, history = state["epoch"] + 1, state["step"], state["history"]
        print(f"Resuming from {checkpoint} after epoch {state['epoch']}")
    print(f"Training on {device}: {len(splits['train'])} samples of {dataset_dir.name}, fields {fields}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{counted['per_sample'] / 1e6:.1f} MFLOP per sample (forward + backward), amp {args.amp}"
          f"{', compiled' if args.compile else ''}")

    prof = trace = None
    if args.profile:
        rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))
        first = args.profile_wait + args.profile_warmup  # the recorded steps are ProfilerStep#first..#last
        trace = out / f"trace_rank{rank}_steps{first}-{first + args.profile_active - 1}.json.gz"
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":  # kernels and copies on the GPU (ROCm builds too); never asked for on CPU
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities, record_shapes=True, profile_memory=args.profile_memory,
                       with_stack=args.with_stack, on_trace_ready=lambda p: traces.save(p, trace, rank),
                       schedule=schedule(wait=args.profile_wait, warmup=args.profile_warmup,
                                         active=args.profile_active, repeat=1))
        prof.start()
    # emit_nvtx turns every record_function range (and op) into an NVTX range; ROCm torch routes NVTX to ROCTx.
    nvtx = torch.autograd.profiler.emit_nvtx() if args.nvtx else contextlib.nullcontext()
    nvtx.__enter__()
    for epoch in range(first_epoch, args.epochs + 1):
        if args.max_steps and step >= args.max_steps:
            break
        steps_left = args.max_steps - step if args.max_steps else -1
        trained = train_one_epoch(train_model, train_loader, optimizer, scaler, autocast, device, epoch, steps_left,
                                  args.log_every, prof, first_step_apart=args.compile and step == 0)
        step += -(-trained["samples"] // args.batch_size)
        if prof and step >= args.max_steps:
            break  # the profiled window is over: no validation, no checkpoint
        valid_loss = validate(model, valid_loader, device)  # the eager model: no compile for eval shapes
        history.append(dict(epoch=epoch, valid_loss=valid_loss, **trained))
        compiling = trained["first_step_seconds"]
        print(f"epoch {epoch}/{args.epochs}  train_loss {trained['train_loss']:.4f}  valid_loss {valid_loss:.4f}  "
              f"{trained['timed_samples'] / trained['seconds']:.0f} samples/s"
              + (f"  (first step, compiling: {compiling:.1f} s, timed apart)" if compiling else ""))
        atomic_torch_save(checkpoint, dict(model=model.state_dict(), optimizer=optimizer.state_dict(),
                                           scaler=scaler.state_dict(), epoch=epoch, step=step, history=history))
    nvtx.__exit__(None, None, None)
    if prof:
        prof.stop()
        if not trace.exists():
            raise UserError(f"the run ended after {step} steps, before the profiled window: raise --epochs")
        sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=sort_by, row_limit=15))
        summarize.print_summary(traces.load(trace), path=trace)
        print(f"Wrote {trace} (open it in https://ui.perfetto.dev) and {timeline.draw(trace)}")
        return
    if not history:
        raise UserError("nothing was trained: raise --epochs or --max-steps, or drop --resume")

    rollout_data = data.rollout_dataset(dataset_dir, args.n_steps_input)
    model_vrmse, persistence_vrmse, (true, pred) = evaluate_rollouts(model, rollout_data, device)
    for k in range(min(5, len(model_vrmse))):
        print(f"rollout step {k + 1}: VRMSE model {model_vrmse[k]:.4f}  persistence {persistence_vrmse[k]:.4f}")
    plots.rollout_figure(true, pred, fields, out / "rollout.png", mean=stats["mean"], std=stats["std"],
                         model_vrmse=model_vrmse, persistence_vrmse=persistence_vrmse)
    samples_per_second = sum(h.get("timed_samples", h["samples"]) for h in history) / sum(h["seconds"] for h in history)
    efficiency = flops.utilization(counted["per_sample"], samples_per_second, flops.device_peak(device), args.amp)
    mfu = efficiency["mfu"]
    print(f"{efficiency['achieved_flops_per_s'] / 1e9:.2f} GFLOP/s achieved; MFU "
          f"{'unknown' if mfu is None else f'{100 * mfu:.2f}%'} of {efficiency['peak_device']} "
          f"({efficiency['peak_precision']} peak{', an estimate' if efficiency['peak_is_estimate'] else ''})")
    if device.type == "cuda":
        peak_memory = dict(peak_memory_bytes=torch.cuda.max_memory_allocated(device), peak_memory_of="device")
    else:  # ru_maxrss: KiB on Linux, bytes on macOS
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak_memory = dict(peak_memory_bytes=rss * (1 if os.uname().sysname == "Darwin" else 1024),
                           peak_memory_of="process (max RSS)")
    atomic_write_json(out / "metrics.json", dict(
        samples_per_second=samples_per_second,
        train_loss=history[-1]["train_loss"], valid_loss=history[-1]["valid_loss"],
        rollout_vrmse=model_vrmse, persistence_vrmse=persistence_vrmse, device=str(device),
        dataset=str(dataset_dir), **efficiency, flops_by_kind=counted["by_kind"],
        compile_seconds=history[0]["first_step_seconds"] if args.compile and first_epoch == 1 else None,
        **peak_memory, history=history, config=vars(args)))
    print(f"Wrote {out / 'metrics.json'}, {out / 'rollout.png'}, {checkpoint}")


if __name__ == "__main__":
    run_main(main)
