"""Solution 09: solution 08 in mixed precision (bf16 or fp16), the FNO's spectral part in float32.

    python solutions/09_mixed_precision/fno.py --amp bf16 --log-every 50

Writes OUT/metrics.json, OUT/rollout.png and OUT/checkpoint.pt (`--resume` continues from it).
With any number of ranks; --eval-only writes OUT/eval.json and OUT/rollout.png.
OUT/metrics.json holds the peak memory too.
"""
import argparse
import contextlib
import datetime
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import record_function
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from affinity import training
from profiling import window

from wellfno import data, fastwell, memory, options, ranks, rollout
from wellfno.amp import check_amp
from wellfno.cli import (UserError, atomic_torch_save, atomic_write_json, check_output_dir,
                         load_checkpoint, run_main)
from wellfno.device import check_gpu_not_shared, pick_backend, pick_device
from wellfno.launch import launch_environment
from wellfno.model import NextFrameFNO, channel_stats
from wellfno.progress import progress_bar
from wellfno.ranks import over_ranks, samples_left_out, validate
from wellfno.rollout import evaluate_rollouts
from wellfno.watchdog import Watchdog


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    options.add_arguments(p)  # fno.py's, 01's and 02's options (wellfno.options)
    p.add_argument("--bind", choices=["exclusive", "node", "core-complex", "none"],
                   default="exclusive", help="pin this rank and its workers to cores near its GPU "
                   "(affinity/plan.py explains the modes)")
    p.add_argument("--report-workers", action="store_true",
                   help="each DataLoader worker prints where it runs")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                   help="communication library: auto = nccl on GPUs (RCCL on AMD), gloo on CPUs")
    p.add_argument("--eval-only", action="store_true",
                   help="evaluate OUT/checkpoint.pt, no training")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds a collective may wait for a rank before every rank gives up")
    p.add_argument("--log-every", type=int, default=20,
                   help="read the loss back from the device every K steps "
                        "(the only host sync of the loop)")
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none",
                   help="mixed precision: autocast the convolutions; the FFTs and spectral "
                        "weights stay float32")
    args = p.parse_args(argv)
    options.check_arguments(args)  # 02's loader options, 01's --profile window
    for name in ("epochs", "batch_size", "n_steps_input", "width", "modes", "log_every"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_steps < 0 or not 0 < args.lr < float("inf") or not 0 <= args.seed < 2**63:
        raise UserError("--max-steps must be 0 or more, --lr a positive number, --seed from 0 to "
                        "2**63-1")
    if not 0 < args.timeout < float("inf"):
        raise UserError("--timeout must be a positive number of seconds")
    if args.eval_only and args.profile:
        raise UserError("--profile traces training steps: drop it with --eval-only")
    check_output_dir(args.out)
    return args


WARMUP_STEPS = 1  # untimed: the first step pays one-time costs (FFT plans, allocator, loader start)


def synchronize(device):
    """Wait for the device's queued work: only where a time is read, never inside the step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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



def train_one_epoch(model, loader, optimizer, scaler, autocast, device, epoch, max_steps=None,
                    untimed_steps=0, prof=None, show=True, log_every=1):
    """One pass over `loader`, or `max_steps` steps; returns this epoch's row of the history.

    The first `untimed_steps` steps are trained but not timed (timed_samples, timed_seconds). The
    loss stays on the device and is read back every `log_every` steps (loss_log: [step, mean
    so far]).
    """
    model.train()
    loss_sum = torch.zeros((), device=device)  # sum of loss x batch size, on the device
    samples, steps, timed_samples, loss_log = 0, 0, 0, []
    synchronize(device)
    start = timed_from = time.perf_counter()
    bar = progress_bar(loader, f"epoch {epoch}", disable=not show)
    batches = iter(bar)
    while True:
        with record_function("data_wait"):  # the DataLoader reading and collating the next batch
            batch = next(batches, None)
        if batch is None:
            break
        with record_function("h2d_copy"):
            x, y = data.batch_to_model(batch, device, non_blocking=True)
        with record_function("forward"), autocast():
            loss = getattr(model, "module", model).loss(model(x), y)  # DDP wraps the FNO
        with record_function("backward"):
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
        with record_function("optimizer"):
            scaler.step(optimizer)  # optimizer.step(); fp16: unscale first, skip on inf/NaN
            scaler.update()
        loss_sum += loss.detach() * len(x)  # queued on the device: no wait
        samples, steps = samples + len(x), steps + 1
        if steps <= untimed_steps:
            synchronize(device)  # the untimed steps end here on the device too
            timed_from = time.perf_counter()
        else:
            timed_samples += len(x)
        if steps % log_every == 0:  # the one read-back (a host sync) every log_every steps
            loss_log.append([steps, loss_sum.item() / samples])
            bar.set_postfix(loss=f"{loss_log[-1][1]:.4f}", refresh=False)
        if prof is not None:
            prof.step()  # closes ProfilerStep#N and moves the schedule on
        if steps == max_steps:
            break
    bar.close()
    total_loss = loss_sum.item()  # waits for the last step, so the times below are the device's too
    end = time.perf_counter()
    return dict(epoch=epoch, train_loss=total_loss / samples, samples=samples, steps=steps,
                seconds=end - start,
                timed_samples=timed_samples, timed_seconds=end - timed_from, loss_log=loss_log)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    env = launch_environment()  # rank, world size, local rank from torchrun or srun; none: 1 rank
    device = pick_device(args.device)
    backend, device = pick_backend(args.backend, env.local_rank, env.local_world_size,  # nccl: GPU
                                   device.type == "cuda", env.step_gpus, env.launcher)  # gloo: CPU
    if args.device != "auto" and device.type != args.device:  # nccl runs on GPUs, gloo here on CPUs
        raise UserError(f"--backend {backend} and --device {args.device} do not go together")
    if not env.is_distributed:
        return train(args, env, None, device)
    env.export_rendezvous()  # MASTER_ADDR/PORT: from torchrun, or from the allocation under srun
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout),
                                device_id=device if device.type == "cuda" else None)
    except Exception as err:  # noqa: BLE001 - e.g. a rank never arrived
        raise UserError(f"rank {env.rank} cannot join the other ranks ({err.__class__.__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else ''})") from None
    check_gpu_not_shared(device)  # two ranks on one physical GPU: one line naming both
    try:
        with Watchdog(env.rank, env.world_size) as watchdog:  # one failed rank ends all, in seconds
            train(args, env, backend, device)
            watchdog.wait_for_all()  # 05's barrier, without --timeout's limit: rank 0 rolls out
    finally:
        dist.destroy_process_group()


def train(args, env, backend, device):
    log = print if env.rank == 0 else (lambda *a, **k: None)  # one voice for the job: rank 0's
    check_amp(args.amp, device)
    cpus, device = training.bind(args.bind, device)  # step 03's pinning (affinity.training)
    out = Path(args.out)
    checkpoint = out / "checkpoint.pt"
    if args.eval_only and not checkpoint.is_file():
        raise UserError(f"--eval-only evaluates {checkpoint}, which does not exist: train first, "
                        f"or point --out at the folder of a trained run")
    dataset_dir, dataset_stats = ranks.open_dataset_rank_0_first(  # step 05's (wellfno.ranks)
        args.data_dir, args.dataset, args.download, env)
    data.check_input_steps(dataset_dir, args.n_steps_input, ("train", "valid"))
    splits = fastwell.open_splits(dataset_dir, args.n_steps_input, args.fast_reader)  # step 02's
    for split in ("train", "valid"):
        if len(splits[split]) < env.world_size:
            raise UserError(f"the {split} split of {dataset_dir.name} has {len(splits[split])} "
                            f"samples, fewer than the {env.world_size} ranks: start at most "
                            f"{len(splits[split])}")
    fields = data.channel_names(splits["train"])
    stats = channel_stats(dataset_stats, splits["train"].core_field_names)
    loader_options = training.loader_options(  # steps 02 and 03's (affinity.training)
        device, cpus, args.num_workers, args.pin_memory, args.prefetch_factor,
        args.persistent_workers, report_workers=args.report_workers)
    # The generator fixes the shuffle and each worker's seed (torch seeds torch, random and numpy in
    # worker i with base_seed + i, base_seed drawn from it): the same batches, any --num-workers.
    # The sampler: every world_size-th sample of one shuffle (seed + epoch) to each rank, padded
    # with none: drop_last leaves out the len % world_size that do not divide (named below).
    train_sampler = torch.utils.data.DistributedSampler(
        splits["train"], env.world_size, env.rank, shuffle=True, seed=args.seed, drop_last=True)
    train_loader = DataLoader(splits["train"], batch_size=args.batch_size, sampler=train_sampler,
                              generator=torch.Generator().manual_seed(args.seed), **loader_options)
    # Validation: every sample exactly once, on one rank or another (no padding: exercise 04)
    valid_loader = DataLoader(splits["valid"], batch_size=args.batch_size,
                              sampler=range(env.rank, len(splits["valid"]), env.world_size),
                              generator=torch.Generator().manual_seed(args.seed), **loader_options)

    # One Fourier mode count per spatial axis (2-D or 3-D), and the dataset's constant fields as
    # inputs.
    model = NextFrameFNO.for_dataset(splits["train"], args.n_steps_input, stats, width=args.width,
                                     modes=args.modes)
    log(memory.check_step_fits(model, args.batch_size, device))  # stops here if a step cannot fit
    model = model.to(device)
    spectral_convs_in_float32(model.fno)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")  # fp16's small range
    amp_dtype = dict(bf16=torch.bfloat16, fp16=torch.float16).get(args.amp)
    autocast = (lambda: torch.autocast(device.type, dtype=amp_dtype)) if amp_dtype else \
        contextlib.nullcontext
    first_epoch, step, history = 1, 0, []
    if (args.resume or args.eval_only) and checkpoint.exists():  # every rank: same model, same Adam
        state = load_checkpoint(checkpoint, map_location=device)
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scaler.load_state_dict(state.get("scaler", {}))
            first_epoch, step, history = state["epoch"] + 1, state["step"], state["history"]
        except (KeyError, RuntimeError, ValueError):
            raise UserError(f"{checkpoint} was trained with other settings: use another --out or "
                            + ("give its --width, --modes" if args.eval_only else "drop --resume"))
        log(f"{'Evaluating' if args.eval_only else 'Resuming from'} {checkpoint} after epoch "
            f"{state['epoch']} (trained with {state.get('world_size', 1)} rank(s), "
            f"now {env.world_size})")
    # DDP copies rank 0's weights to all ranks; backward all-reduces (averages) the gradients.
    ddp_model = DistributedDataParallel(model) if env.is_distributed else model  # on model's device
    global_batch = args.batch_size * env.world_size
    log = (lambda *a, **k: None) if args.eval_only else log  # nothing trained, nothing said
    log(f"Training on {env.world_size} rank(s) ({env.launcher}, {backend or 'no'} backend, "
        f"{device.type}): {len(splits['train'])} samples of {dataset_dir.name}, fields {fields}, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters, amp {args.amp}")
    log(f"global batch {global_batch} = {env.world_size} rank(s) x --batch-size {args.batch_size}; "
        f"learning rate {args.lr} as given (not scaled with the number of ranks)")

    prof, trace = window.start(  # step 01's profiler (profiling.window)
        device, out, args.profile, wait=args.profile_wait, warmup=args.profile_warmup,
        active=args.profile_active, memory=args.profile_memory, with_stack=args.with_stack)

    for epoch in range(first_epoch, first_epoch if args.eval_only else args.epochs + 1):
        if args.max_steps and step >= args.max_steps:
            break
        train_sampler.set_epoch(epoch)  # a new shuffle each epoch, else each repeats the first
        left_out = samples_left_out(train_sampler) if len(splits["train"]) % env.world_size else []
        if left_out:
            log(f"epoch {epoch}: training samples {left_out} left out (drop_last: "
                f"{len(splits['train'])} samples do not divide by {env.world_size} ranks)")
        row = train_one_epoch(ddp_model, train_loader, optimizer, scaler, autocast, device, epoch,
                              max_steps=args.max_steps - step if args.max_steps else None,
                              untimed_steps=WARMUP_STEPS if epoch == first_epoch else 0, prof=prof,
                              show=env.rank == 0, log_every=args.log_every)
        step += row["steps"]
        if prof and step >= args.max_steps:
            break  # the profiled window is over: no validation, no checkpoint
        row = over_ranks(row, device)
        row["valid_loss"], row["samples_left_out"] = validate(model, valid_loader, device), left_out
        history.append(row)
        log(f"epoch {epoch}/{args.epochs}  train_loss {row['train_loss']:.4f}  valid_loss "
            f"{row['valid_loss']:.4f}  {row['samples'] / row['seconds']:.0f} samples/s "
            f"({env.world_size} rank(s))")
        if env.rank == 0:  # one writer; the others hold the same model
            atomic_torch_save(checkpoint, dict(model=model.state_dict(), epoch=epoch, step=step,
                                               optimizer=optimizer.state_dict(), history=history,
                                               world_size=env.world_size,
                                               scaler=scaler.state_dict()))
    if prof:
        return window.finish(prof, trace, step, env, device)  # step 05's end of it
    if not history:
        raise UserError("nothing was trained: raise --epochs or --max-steps, or drop --resume")
    valid_loss = (validate(model, valid_loader, device) if args.eval_only
                  else history[-1]["valid_loss"])
    if env.rank > 0:
        return  # rank 0 alone rolls out and writes

    rollout_data = data.rollout_dataset(dataset_dir, args.n_steps_input,
                                        max_rollout_steps=memory.rollout_steps(model, device))
    model_vrmse, persistence_vrmse, (true, pred) = evaluate_rollouts(model, rollout_data, device)
    rollout.print_and_plot(true, pred, model_vrmse, persistence_vrmse, fields, stats, out)
    if args.eval_only:
        atomic_write_json(out / "eval.json", dict(valid_loss=valid_loss, rollout_vrmse=model_vrmse,
            persistence_vrmse=persistence_vrmse, world_size=env.world_size, device=str(device),
            epoch=history[-1]["epoch"], dataset=str(dataset_dir)))
        print(f"valid_loss {valid_loss:.6f}; wrote {out / 'eval.json'}, {out / 'rollout.png'}")
        return
    samples, seconds = (sum(h[key] for h in history) for key in ("timed_samples", "timed_seconds"))
    excludes = (f"the first {WARMUP_STEPS} step(s) of this run (start-up: FFT plans, allocator, "
                "loader start)")
    if not samples:  # a run too short to leave the start-up out
        samples, seconds = sum(h["samples"] for h in history), sum(h["seconds"] for h in history)
        excludes = "nothing"
    peak_memory = memory.peak_memory(device)  # what low precision saves: activations kept
    atomic_write_json(out / "metrics.json", dict(
        samples_per_second=samples / seconds, samples_per_second_excludes=excludes, **peak_memory,
        samples_per_second_per_rank=history[-1].get("samples_per_second_per_rank"),  # last epoch's
        world_size=env.world_size, global_batch_size=global_batch,
        train_loss=history[-1]["train_loss"], valid_loss=valid_loss,
        rollout_vrmse=model_vrmse, persistence_vrmse=persistence_vrmse, device=str(device),
        dataset=str(dataset_dir), history=history, config=vars(args)))
    print(f"Wrote {out / 'metrics.json'}, {out / 'rollout.png'}, {checkpoint}")


if __name__ == "__main__":
    run_main(main)
