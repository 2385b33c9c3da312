"""Exercise 14's training for long rollouts: noisy inputs, or the loss over K of its own steps.

A model trained on one step from true frames only ever sees true inputs; rolled out, it is fed its
own predictions, whose small errors it never learned to correct, and they grow step after step
(the distribution shift of autoregressive models). Three remedies, behind solution 14's flags:

* **unrolled training** (`--rollout-steps K`): the loss is the mean of the K one-step losses along
  the model's own K-step rollout from a true frame, back-propagated through all K steps (as an
  RNN is trained through time); K times the compute of a step and K times its activations.
* **the pushforward trick** (`--pushforward`): Brandstetter, Worrall & Welling 2022, "Message
  Passing Neural PDE Solvers" (ICLR; arXiv:2202.03376, section 2.3): the model first rolls out
  N steps without gradients, N drawn uniformly from 0 to K-1 for each batch, then trains one step
  from its own prediction: the stability of K steps for the memory of one.
* **input noise** (`--input-noise SIGMA`): Sanchez-Gonzalez et al. 2020, "Learning to Simulate
  Complex Physics with Graph Networks" (ICML; arXiv:2002.09405, section 3): Gaussian noise of
  standard deviation SIGMA (z-scored units) on the input frames, the target left true, so the
  model learns to undo errors it will make. Every rank draws the noise of the whole global batch
  and of the whole frame, from one generator seeded alike on every rank, and keeps its own
  samples' (DistributedSampler's every data_size-th) and its slab's rows: the same noise on each
  sample for any number of ranks, so 2 ranks x b train as 1 rank x 2b, as without noise.

Lippe et al. 2023, "PDE-Refiner" (NeurIPS; arXiv:2308.05732) refines each prediction in several
denoising steps: a different model, not built here. What the solution trains by default was
chosen by a measurement and a rule written before it (solutions/14_long_rollouts/compare.py,
results/14_long_rollouts.json, exercises/14_long_rollouts/background.md): no remedy passed, so the
default is one step without noise, and each remedy is a flag.
"""
from __future__ import annotations

import math

import torch

from wellfno.cli import UserError
from wellfno.data import model_inputs, trajectory_length


def check_arguments(args, dataset_dir) -> None:
    """--rollout-steps, --pushforward and --input-noise against each other and the dataset's
    trajectories, before anything is written."""
    if args.rollout_steps < 1:
        raise UserError("--rollout-steps must be at least 1 (1: one-step training)")
    if not 0 <= args.input_noise < math.inf:
        raise UserError(f"--input-noise {args.input_noise} must be a finite number, 0 or more (a "
                        "standard deviation in z-scored units)")  # nan and inf fail here too
    if args.pushforward and args.rollout_steps < 2:
        raise UserError("--pushforward rolls out before the trained step: give it "
                        "--rollout-steps 2 or more")
    frames = trajectory_length(dataset_dir, "train")
    if args.n_steps_input + args.rollout_steps > frames:
        raise UserError(f"--rollout-steps {args.rollout_steps} with --n-steps-input "
                        f"{args.n_steps_input} needs {args.n_steps_input + args.rollout_steps} "
                        f"frames, but the train split's trajectories have {frames}: use at most "
                        f"--rollout-steps {max(frames - args.n_steps_input, 1)}")


def training_split(dataset_dir, n_steps_input: int, rollout_steps: int, fast_reader: bool,
                   rows: slice | None = None):
    """The train split in windows of n_steps_input + K frames: K targets per sample. The reader
    the run uses for its other splits (wellfno.fastwell.open_splits): the_well's, --fast-reader's,
    or, with `rows` (--domain-size), the slab reader of wellfno.slabs."""
    from the_well.data import WellDataset
    from the_well.data.normalization import ZScoreNormalization

    from wellfno.fastwell import FastWellDataset
    from wellfno.slabs import SlabWellDataset

    steps = dict(n_steps_input=n_steps_input, n_steps_output=rollout_steps)
    if rows is not None:
        return SlabWellDataset(dataset_dir, "train", rows=rows, **steps)
    reader = FastWellDataset if fast_reader else WellDataset
    return reader(path=str(dataset_dir), well_split_name="train", use_normalization=True,
                  normalization_type=ZScoreNormalization, return_grid=False,
                  boundary_return_type=None, **steps)


def batch_to_rollout(batch: dict, device, non_blocking: bool = False):
    """A batch of K-step windows -> (inputs (B, T*C + K', *spatial), targets (B, K, C, *spatial)).

    `wellfno.data.batch_to_model` with every output frame kept, not the first: copied first, laid
    out after, on the device.
    """
    frames = batch["input_fields"].to(device, non_blocking=non_blocking)
    targets = batch["output_fields"].to(device, non_blocking=non_blocking)
    constants = batch.get("constant_fields")
    if constants is not None:
        constants = constants.to(device, non_blocking=non_blocking)
    return model_inputs(frames, constants), targets.movedim(-1, 2).nan_to_num()


def next_input(x: torch.Tensor, pred: torch.Tensor, frame_channels: int) -> torch.Tensor:
    """The model's next input: the oldest frame dropped, the prediction appended after the newest,
    the constant fields (the last channels) kept: what `wellfno.rollout.rollout` feeds it."""
    channels = pred.shape[1]
    return torch.cat([x[:, channels:frame_channels], pred, x[:, frame_channels:]], dim=1)


class RolloutLoss:
    """The training loss along the model's own rollout: `loss(model, x, targets)`.

    `step_loss(pred, target)` is one step's loss (the model's, or domain.sample_loss's);
    `frame_channels` the input's channels that are frames (the rest are constant fields). With
    steps == 1, no pushforward and no noise it is `step_loss(model(x), targets[:, 0])`, today's.
    `share` = (this rank's data group, data groups) and `slab` (wellfno.domain.Slab: rows of n)
    place the rank's batch in the global one, for the noise.
    """

    def __init__(self, step_loss, frame_channels: int, steps: int, pushforward: bool = False,
                 noise: float = 0.0, seed: int = 0, share: tuple[int, int] = (0, 1), slab=None):
        self.step_loss, self.frame_channels = step_loss, frame_channels
        self.steps, self.pushforward, self.noise = steps, pushforward, noise
        self.seed, self.share, self.slab = seed, share, slab
        # pushforward's N: one CPU generator, the same on every rank (it must not depend on the
        # batch's size or device, so that 2 ranks x b trains as 1 rank x 2b)
        self.generator = torch.Generator().manual_seed(seed)
        self.noise_generator = None  # on the batch's device, made at the first batch
        self.epoch_seed = seed
        self.draws: list[int] = []  # the N of the steps to come, drawn ahead (set_epoch)

    def set_epoch(self, epoch: int, steps: int = 1024) -> None:
        """Both generators start each epoch from (seed, epoch), as DistributedSampler's shuffle
        does: a run resumed after epoch E draws what a straight run draws from epoch E + 1.
        With --pushforward, the N of the epoch's `steps` steps are drawn here, up front."""
        self.epoch_seed = (self.seed + epoch * 0x9E3779B97F4A7C15) % 2**64
        self.generator.manual_seed(self.epoch_seed)
        if self.noise_generator is not None:
            self.noise_generator.manual_seed(self.epoch_seed)
        self.draws = []
        if self.pushforward:
            self.draw_ahead(steps)

    def draw_ahead(self, steps: int) -> None:
        # One draw of `steps` N, outside the training step: int(torch.randint(...)) in the step
        # was an `aten::_local_scalar_dense` (`.item()`) every step, a "host sync" to
        # profiling/syncs.py on a CPU trace that never waits for a device. tolist() reads the CPU
        # tensor without an aten op, and CPU randint draws element after element from the
        # generator (aten/src/ATen/native/cpu/DistributionTemplates.h: random_from_to_kernel is a
        # cpu_serial_kernel), so the N are those that one draw per step gave, in the same order.
        self.draws = torch.randint(self.steps, (max(steps, 1),), generator=self.generator).tolist()
        self.draws.reverse()  # pop() from the end: the first drawn first

    def next_rolled_out(self) -> int:
        if not self.draws:  # more steps than drawn (no set_epoch, or a longer epoch): more
            self.draw_ahead(1024)
        return self.draws.pop()

    def add_noise(self, x: torch.Tensor) -> torch.Tensor:
        if not self.noise:
            return x
        if self.noise_generator is None:  # drawn where x lives: no host-to-device copy per step
            self.noise_generator = torch.Generator(x.device).manual_seed(self.epoch_seed)
        index, groups = self.share
        frames = x[:, :self.frame_channels]
        rows = self.slab.n if self.slab is not None else frames.shape[2]
        # the global batch's noise (DistributedSampler gives data group i the samples i, i + groups,
        # ... of it), whole frames; then this rank's samples and rows
        noise = torch.randn((groups * len(x), frames.shape[1], rows, *frames.shape[3:]),
                            generator=self.noise_generator, device=x.device, dtype=x.dtype)
        noise = noise[index::groups]
        if self.slab is not None:
            noise = noise[:, :, self.slab.rows]
        noisy = frames + self.noise * noise  # the constant fields stay exact
        return torch.cat([noisy, x[:, self.frame_channels:]], dim=1)

    def __call__(self, model, x: torch.Tensor, targets: torch.Tensor,
                 rolled_out: int | None = None) -> torch.Tensor:
        x = self.add_noise(x)
        if self.pushforward:  # N steps without gradients, then one trained step from there
            n = rolled_out if rolled_out is not None else self.next_rolled_out()
            with torch.no_grad():
                for _ in range(n):
                    x = next_input(x, model(x), self.frame_channels)
            return self.step_loss(model(x), targets[:, n])
        losses = []
        for k in range(self.steps):  # back-propagated through every step: K graphs kept
            pred = model(x)
            losses.append(self.step_loss(pred, targets[:, k]))
            if k + 1 < self.steps:
                x = next_input(x, pred, self.frame_channels)
        return sum(losses) / self.steps


def training_flops_per_sample(model, x: torch.Tensor, targets: torch.Tensor,
                              loss: RolloutLoss) -> dict:
    """`wellfno.flops.training_flops_per_sample` of the rollout loss: FLOPs of one training step
    (its K forwards and backwards) per sample; with --pushforward the mean over N = 0 .. K-1.
    The model's gradients are left as they were."""
    import copy

    from wellfno.flops import count_flops

    loss = copy.copy(loss)  # counted without noise: the training's noise draws stay as they were
    loss.noise = 0.0
    saved = [p.grad for p in model.parameters()]
    counts = []
    try:
        for n in range(loss.steps) if loss.pushforward else [None]:
            for p in model.parameters():
                p.grad = None
            counts.append(count_flops(lambda: loss(model, x, targets, rolled_out=n).backward()))
    finally:
        for p, g in zip(model.parameters(), saved):
            p.grad = g
    per_run = len(x) * len(counts)  # per sample, and the mean over the N counted

    def mean(key):
        return {k: sum(c[key].get(k, 0) for c in counts) / per_run
                for k in sorted({k for c in counts for k in c[key]})}
    return dict(per_sample=sum(c["total"] for c in counts) / per_run, batch_size=len(x),
                by_op=mean("by_op"), by_kind=mean("by_kind"))
