"""Solution 01: fno.py with a bounded torch.profiler trace (--profile), each part of a step named.

    python solutions/01_profiling/fno.py --profile --max-steps 12   # trace steps 7-11, then stop

Writes OUT/metrics.json, OUT/rollout.png and OUT/checkpoint.pt (`--resume` continues from it).
"""
import argparse
import os
import time
from pathlib import Path

import torch
from the_well.data import WellDataset
from the_well.data.normalization import ZScoreNormalization
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import DataLoader

from profiling import summarize, timeline, traces

from wellfno import data, memory, plots
from wellfno.cli import (UserError, atomic_torch_save, atomic_write_json, check_output_dir,
                         load_checkpoint, run_main)
from wellfno.device import DEVICE_CHOICES, pick_device
from wellfno.launch import launch_environment
from wellfno.model import NextFrameFNO, channel_stats
from wellfno.progress import progress_bar
from wellfno.rollout import evaluate_rollouts


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default=data.EMBEDDED,
                   help="embedded dataset or a Well dataset name")
    p.add_argument("--data-dir", default=os.environ.get("WELL_DATA", "data"),
                   help="folder that holds datasets/ (default $WELL_DATA or ./data)")
    p.add_argument("--download", action="store_true", help="fetch a missing Well dataset")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop training after this many steps (0: no limit)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--n-steps-input", type=int, default=1, help="frames the model sees")
    p.add_argument("--width", type=int, default=32,
                   help="FNO channels: memory and compute grow with it")
    p.add_argument("--modes", type=int, default=12, help="Fourier modes kept per spatial axis")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/baseline", help="output folder")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--profile", action="store_true",
                   help="trace the last steps of a --max-steps run (default 12)")
    p.add_argument("--profile-warmup", type=int, default=2, help="steps traced, then thrown away")
    p.add_argument("--profile-active", type=int, default=5, help="steps recorded into the trace")
    p.add_argument("--profile-memory", action="store_true", help="also record tensor allocations")
    p.add_argument("--with-stack", action="store_true", help="also record Python stacks (slower)")
    args = p.parse_args(argv)
    # wait out the first steps: they pay one-time costs (allocator, FFT plans, loader start)
    args.profile_wait = 0  # without --profile there is no window to wait for
    if args.profile:
        args.max_steps = args.max_steps or 12
        args.profile_wait = args.max_steps - args.profile_warmup - args.profile_active
        if args.profile_wait < 0 or args.profile_warmup < 0 or args.profile_active < 1:
            raise UserError("--profile needs --max-steps >= --profile-warmup + --profile-active "
                            "(>= 1)")
    for name in ("epochs", "batch_size", "n_steps_input", "width", "modes"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_steps < 0 or not 0 < args.lr < float("inf") or not 0 <= args.seed < 2**63:
        raise UserError("--max-steps must be 0 or more, --lr a positive number, --seed from 0 to "
                        "2**63-1")
    check_output_dir(args.out)
    return args


WARMUP_STEPS = 1  # untimed: the first step pays one-time costs (FFT plans, allocator, loader start)


def train_one_epoch(model, loader, optimizer, device, epoch, max_steps=None, untimed_steps=0,
                    prof=None):
    """One pass over `loader`, or `max_steps` steps; returns this epoch's row of the history.

    The first `untimed_steps` steps are trained but not timed (timed_samples, timed_seconds).
    """
    model.train()
    total_loss, samples, steps, timed_samples = 0.0, 0, 0, 0
    start = timed_from = time.perf_counter()
    bar = progress_bar(loader, f"epoch {epoch}")
    batches = iter(bar)
    while True:
        with record_function("data_wait"):  # the DataLoader reading and collating the next batch
            batch = next(batches, None)
        if batch is None:
            break
        with record_function("h2d_copy"):
            x, y = data.batch_to_model(batch, device)
        with record_function("forward"):
            loss = model.loss(model(x), y)
        with record_function("backward"):
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
        # One read-back per step (on a GPU it waits for the step to finish), reused for the sum and
        # the progress bar. Exercise 08 removes even this one.
        loss_value = loss.item()
        total_loss += loss_value * len(x)
        samples, steps = samples + len(x), steps + 1
        if steps <= untimed_steps:
            timed_from = time.perf_counter()
        else:
            timed_samples += len(x)
        bar.set_postfix(loss=f"{loss_value:.4f}", refresh=False)
        if prof is not None:
            prof.step()  # closes ProfilerStep#N and moves the schedule on
        if steps == max_steps:
            break
    bar.close()
    end = time.perf_counter()
    return dict(epoch=epoch, train_loss=total_loss / samples, samples=samples, steps=steps,
                seconds=end - start,
                timed_samples=timed_samples, timed_seconds=end - timed_from)


@torch.no_grad()
def validate(model, loader, device):
    model.eval()
    total, n = 0.0, 0
    for batch in loader:
        x, y = data.batch_to_model(batch, device)
        total += model.loss(model(x), y).item() * len(x)
        n += len(x)
    return total / n


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = pick_device(args.device)
    out = Path(args.out)
    dataset_dir, dataset_stats = data.open_dataset(args.data_dir, args.dataset, args.download)
    data.check_input_steps(dataset_dir, args.n_steps_input, ("train", "valid"))
    # the_well's reader: n_steps_input frames in, the next frame out, z-scored with
    # DATASET/stats.yaml.
    splits = {split: WellDataset(path=str(dataset_dir), well_split_name=split,
                                 n_steps_input=args.n_steps_input,
                                 n_steps_output=1, use_normalization=True,
                                 normalization_type=ZScoreNormalization,
                                 return_grid=False, boundary_return_type=None)
              for split in ("train", "valid")}
    fields = data.channel_names(splits["train"])
    stats = channel_stats(dataset_stats, splits["train"].core_field_names)
    train_loader = DataLoader(splits["train"], batch_size=args.batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(args.seed))
    valid_loader = DataLoader(splits["valid"], batch_size=args.batch_size)

    # One Fourier mode count per spatial axis (2-D or 3-D), and the dataset's constant fields as
    # inputs.
    model = NextFrameFNO.for_dataset(splits["train"], args.n_steps_input, stats, width=args.width,
                                     modes=args.modes)
    print(memory.check_step_fits(model, args.batch_size, device))  # stops here if a step cannot fit
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    first_epoch, step, history = 1, 0, []
    checkpoint = out / "checkpoint.pt"
    if args.resume and checkpoint.exists():
        state = load_checkpoint(checkpoint, map_location=device)
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            first_epoch, step, history = state["epoch"] + 1, state["step"], state["history"]
        except (KeyError, RuntimeError, ValueError):
            raise UserError(f"{checkpoint} was trained with other settings: use another --out or "
                            "drop --resume")
        print(f"Resuming from {checkpoint} after epoch {state['epoch']}")
    print(f"Training on {device}: {len(splits['train'])} samples of {dataset_dir.name}, fields "
          f"{fields}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters")

    prof = trace = None
    if args.profile:
        rank = launch_environment().rank  # torchrun's or srun's rank, 0 alone
        # the recorded steps are ProfilerStep#first..#last
        first = args.profile_wait + args.profile_warmup
        trace = out / f"trace_rank{rank}_steps{first}-{first + args.profile_active - 1}.json.gz"
        # GPU kernels and copies (ROCm builds too) only on a GPU: a CPU run must not ask for CUDA.
        activities = [ProfilerActivity.CPU] + (
            [ProfilerActivity.CUDA] if device.type == "cuda" else [])
        prof = profile(activities=activities, profile_memory=args.profile_memory,
                       with_stack=args.with_stack, on_trace_ready=lambda p: traces.save(p, trace,
                                                                                        rank),
                       schedule=schedule(wait=args.profile_wait, warmup=args.profile_warmup,
                                         active=args.profile_active, repeat=1))
        prof.start()

    for epoch in range(first_epoch, args.epochs + 1):
        if args.max_steps and step >= args.max_steps:
            break
        row = train_one_epoch(model, train_loader, optimizer, device, epoch,
                              max_steps=args.max_steps - step if args.max_steps else None,
                              untimed_steps=WARMUP_STEPS if epoch == first_epoch else 0, prof=prof)
        step += row["steps"]
        if prof and step >= args.max_steps:
            break  # the profiled window is over: no validation, no checkpoint
        row["valid_loss"] = validate(model, valid_loader, device)
        history.append(row)
        print(f"epoch {epoch}/{args.epochs}  train_loss {row['train_loss']:.4f}  valid_loss "
              f"{row['valid_loss']:.4f}  "
              f"{row['samples'] / row['seconds']:.0f} samples/s")
        atomic_torch_save(checkpoint, dict(model=model.state_dict(),
                                           optimizer=optimizer.state_dict(),
                                           epoch=epoch, step=step, history=history))
    if prof:
        prof.stop()
        if not trace.exists():
            raise UserError(f"the run ended after {step} steps, before the profiled window: raise "
                            "--epochs")
        sort_by = traces.key_averages_sort_key(device)  # the key differs between torch versions
        print(prof.key_averages().table(sort_by=sort_by, row_limit=15))
        loaded = summarize.print_summary(trace)
        print(f"Wrote {trace} (open it in https://ui.perfetto.dev) and "
              f"{timeline.draw(trace, trace=loaded)}")
        return
    if not history:
        raise UserError("nothing was trained: raise --epochs or --max-steps, or drop --resume")

    rollout_data = data.rollout_dataset(dataset_dir, args.n_steps_input,
                                        max_rollout_steps=memory.rollout_steps(model, device))
    model_vrmse, persistence_vrmse, (true, pred) = evaluate_rollouts(model, rollout_data, device)
    for k in range(min(5, len(model_vrmse))):
        print(f"rollout step {k + 1}: VRMSE model {model_vrmse[k]:.4f}  persistence "
              f"{persistence_vrmse[k]:.4f}")
    plots.rollout_figure(true, pred, fields, out / "rollout.png", mean=stats["mean"],
                         std=stats["std"],
                         model_vrmse=model_vrmse, persistence_vrmse=persistence_vrmse)
    samples, seconds = (sum(h[key] for h in history) for key in ("timed_samples", "timed_seconds"))
    excludes = (f"the first {WARMUP_STEPS} step(s) of this run (start-up: FFT plans, allocator, "
                "loader start)")
    if not samples:  # a run too short to leave the start-up out
        samples, seconds = sum(h["samples"] for h in history), sum(h["seconds"] for h in history)
        excludes = "nothing"
    atomic_write_json(out / "metrics.json", dict(
        samples_per_second=samples / seconds, samples_per_second_excludes=excludes,
        train_loss=history[-1]["train_loss"], valid_loss=history[-1]["valid_loss"],
        rollout_vrmse=model_vrmse, persistence_vrmse=persistence_vrmse, device=str(device),
        dataset=str(dataset_dir), history=history, config=vars(args)))
    print(f"Wrote {out / 'metrics.json'}, {out / 'rollout.png'}, {checkpoint}")


if __name__ == "__main__":
    run_main(main)
