"""Will a training step fit? An estimate from parameter and activation counts, before the first step.

A step of NextFrameFNO with Adam holds
  * 4 copies of the parameters: weights, gradients and Adam's two moments;
  * the activations autograd saves for the backward pass. neuralop's FNO saves, per
    Fourier layer, about 6 tensors of `width` channels on the full grid (the linear
    skip, the spectral convolution's inverse FFT, their sum, the activation's input,
    the channel MLP and its soft-gating skip); the lifting and projection MLPs run
    at twice the width (neuralop's lifting/projection_channel_ratio = 2), and with
    their gradients at the peak of the backward pass they hold about 20 tensors of
    `width` channels;
  * the batch itself, the prediction and the loss temporaries.
All float32: bytes = 4 * (4 P + B * cells * (6 * width * layers + 20 * width + 2 C_in + 4 C_out)).

Activation checkpointing (wellfno.checkpointing, --checkpoint-blocks) keeps only each block's
input (1 tensor of `width` channels per layer) and rebuilds one block's 6 in the backward, after
the projection's tensors are freed: the peak is then the larger of the two moments,
6 * width * layers + 20 * width becomes width * layers + max(20, 6) * width = width * (layers + 20).
Domain parallelism (wellfno.domain,
--domain-size P) gives each rank a slab of ceil(n0 / P) of the n0 rows: the activations fall
as 1/P, the 4 copies of the parameters do not (every rank holds the whole model). The
exchange's buffers hold only the kept modes (small next to the activations): not counted.
Training on a K-step rollout (wellfno.unrolled, --rollout-steps K) keeps K steps' activations
for one backward: the per-sample term times K; --pushforward trains one step after a rollout
without gradients: one step's.
tests/test_memory.py checks it against the peak memory a CPU step really takes
(within a factor of 1.5 either way: the allocator rounds and caches blocks, and
FFT workspaces come and go), on 2-D and 3-D grids of several sizes.
"""
from __future__ import annotations

import math
import os
import resource
import sys

import torch

from wellfno.cli import UserError

SAVED_PER_LAYER = 6  # width-channel tensors autograd keeps per Fourier layer
SAVED_LIFT_PROJECT = 20  # width-channel tensors of lifting + projection (2x width) and their gradients


def step_bytes(n_parameters: int, batch_size: int, resolution, in_channels: int, out_channels: int,
               width: int, layers: int, checkpointed: bool = False, domain_size: int = 1,
               unrolled_steps: int = 1) -> int:
    """Estimated peak bytes of one training step (forward, backward, Adam update) on one rank."""
    cells = math.ceil(resolution[0] / domain_size) * math.prod(resolution[1:])  # the largest slab
    saved = SAVED_PER_LAYER * width * layers + SAVED_LIFT_PROJECT * width
    if checkpointed:  # block inputs kept; one block rebuilt at a time, once the projection's are freed
        saved = width * layers + max(SAVED_LIFT_PROJECT, SAVED_PER_LAYER) * width
    per_sample = cells * (saved + 2 * in_channels + 4 * out_channels)
    return 4 * (4 * n_parameters + batch_size * unrolled_steps * per_sample)


def noise_bytes(rollout_loss, batch_size: int, resolution, in_channels: int) -> int:
    """Peak bytes of `unrolled.RolloutLoss.add_noise` on one rank (0 without noise), float32: the
    noise of the global batch's input frames over whole frames (data groups x batch x frame
    channels x every cell), this rank's noise scaled and its noisy frames (2 x batch x frame
    channels), then its input rebuilt around them (batch x in_channels); whole frames, an upper
    bound with --domain-size."""
    if rollout_loss is None or not rollout_loss.noise:
        return 0
    groups, frames = rollout_loss.share[1], rollout_loss.frame_channels
    return 4 * batch_size * ((groups + 2) * frames + in_channels) * math.prod(resolution)


def domain_ranks_needed(model, available: int, batch_size: int = 1,
                        checkpointed: bool = False) -> int | None:
    """The fewest domain ranks whose slabs let a step of `batch_size` fit in `available` bytes
    (None: not even one row per rank)."""
    n_parameters = sum(p.numel() for p in model.parameters())
    for ranks in range(1, model.resolution[0] + 1):
        if step_bytes(n_parameters, batch_size, model.resolution, model.in_channels,
                      model.channels_per_frame, model.width, model.layers, checkpointed,
                      ranks) <= available:
            return ranks
    return None


def available_ram() -> int:
    """Bytes of RAM available to a new allocation (psutil; /proc/meminfo without it)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        with open("/proc/meminfo") as f:
            return int(dict(line.split(":", 1) for line in f)["MemAvailable"].split()[0]) * 1024


def available_bytes(device: torch.device) -> tuple[int, str]:
    """Memory a step can use on `device`, and what it is (free GPU memory, or available RAM)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)  # ROCm builds answer this too
        return int(free), f"free memory on {torch.cuda.get_device_name(device)}"
    return available_ram(), "available RAM"


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def check_step_fits(model, batch_size: int, device: torch.device, available: int | None = None,
                    checkpointed: bool | None = None, domain_size: int | None = None,
                    rollout_steps: int | None = None, pushforward: bool = False,
                    noise_of=None) -> str:
    """One line with the estimate; UserError (what to change) when it exceeds what the device has.

    `model` is a NextFrameFNO built for the dataset (`NextFrameFNO.for_dataset`: it knows the grid);
    `checkpointed`: activation checkpointing per block; `domain_size`: ranks sharing one sample.
    `rollout_steps` (solution 14): K steps' activations kept, one with `pushforward`.
    `noise_of` (solution 14): its `unrolled.RolloutLoss`, whose input noise each rank draws for
    the global batch (`noise_bytes`).
    The advice names --checkpoint-blocks, --domain-size and --rollout-steps only to a script that
    passes them.
    """
    unrolled = 1 if pushforward or not rollout_steps else rollout_steps
    resolution = model.resolution
    n_parameters = sum(p.numel() for p in model.parameters())

    def need_for(batch):
        step = step_bytes(n_parameters, batch, resolution, model.in_channels,
                          model.channels_per_frame, model.width, model.layers, bool(checkpointed),
                          domain_size or 1, unrolled)
        # The noise is drawn and freed before the forward keeps an activation: the larger of the
        # two, the noise beside the weights, Adam's state and the batch (inputs, K target frames)
        cells = math.ceil(resolution[0] / (domain_size or 1)) * math.prod(resolution[1:])
        batch_data = 4 * batch * cells * (model.in_channels
                                          + (rollout_steps or 1) * model.channels_per_frame)
        return max(step, 4 * 4 * n_parameters + batch_data
                   + noise_bytes(noise_of, batch, resolution, model.in_channels))
    need = need_for(batch_size)
    what = "memory"
    if available is None:
        available, what = available_bytes(device)
    grid = "x".join(map(str, resolution))
    options = (", blocks checkpointed" if checkpointed else "") + (
        f", a slab of {domain_size} domain ranks" if (domain_size or 1) > 1 else "") + (
        f", {unrolled} rollout steps kept" if unrolled > 1 else "")
    line = (f"a training step needs about {_gb(need)} (batch {batch_size}, width {model.width}, "
            f"{model.layers} layers, {grid} cells{options}); {what}: {_gb(available)}")
    if need <= available or os.environ.get("WELLFNO_SKIP_MEMORY_CHECK"):
        return line
    fits = max((b for b in range(1, batch_size) if need_for(b) <= available), default=0)
    if unrolled > 1:  # a shorter rollout first: it keeps the batch the run was tuned for
        steps = max((k for k in range(1, unrolled) if step_bytes(
            n_parameters, batch_size, resolution, model.in_channels, model.channels_per_frame,
            model.width, model.layers, bool(checkpointed), domain_size or 1, k) <= available),
            default=0)
        if steps:
            raise UserError(f"{line}: too much; {steps} rollout steps would fit: lower "
                            f"--rollout-steps to {steps}, or train with --pushforward (one step's "
                            f"memory){f', or lower --batch-size to {fits}' if fits else ''} "
                            "(WELLFNO_SKIP_MEMORY_CHECK=1 runs anyway)")
    if fits:
        advice = f"lower --batch-size to {fits}"
    else:
        advice = ("even --batch-size 1 does not fit: use a device with more memory (a GPU node), "
                  "a lower-resolution dataset, or a smaller --width")
        if checkpointed is False:
            advice += ", or checkpoint the blocks (--checkpoint-blocks)"
        if domain_size is not None:
            ranks = domain_ranks_needed(model, available, 1, bool(checkpointed))
            advice += (f"; or split one sample across {ranks} GPUs (--domain-size {ranks})"
                       if ranks else "; not even one row per rank fits")
    raise UserError(f"{line}: too much; {advice} (WELLFNO_SKIP_MEMORY_CHECK=1 runs anyway)")


def peak_memory(device: torch.device) -> dict:
    """metrics.json's peak memory entries (solution 09 on): the device's, or the process's on a CPU.

    On a GPU, torch's allocator peak (what low precision saves: activations kept for the backward);
    on a CPU, the process's max RSS (ru_maxrss: KiB on Linux, bytes on macOS).
    """
    if device.type == "cuda":
        return dict(peak_memory_bytes=torch.cuda.max_memory_allocated(device),
                    peak_memory_of="device")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return dict(peak_memory_bytes=rss * (1 if sys.platform == "darwin" else 1024),
                peak_memory_of="process (max RSS)")


def rollout_steps(model, device: torch.device, wanted: int = 100, available: tuple[int, int] | None = None) -> int:
    """How many rollout steps (at most `wanted`, the_well's default) a validation trajectory may have.

    WellDataset reads a whole trajectory into host memory, and the rollout keeps the true and
    the predicted frames on the device: 3 copies of T frames of `channels` float32 channels
    (MHD_256: 100 frames are 47 GB each). Each may use half of what is free (host, device).
    Scoring them adds a few frames (`rollout.step_vrmse`, `rollout.trajectory_errors`: one step at a time).
    """
    frame = 4 * math.prod(model.resolution) * model.channels_per_frame
    if available is None:
        host, _ = available_bytes(torch.device("cpu"))
        gpu = available_bytes(device)[0] if device.type == "cuda" else host
        available = (host, gpu)
    host, gpu = available
    if device.type == "cuda":  # the trajectory on the host, true and predicted frames on the GPU
        fit = min(host // 2 // frame, gpu // 2 // (2 * frame))
    else:  # all three in RAM
        fit = host // 2 // (3 * frame)
    return int(max(1, min(wanted, fit)))
