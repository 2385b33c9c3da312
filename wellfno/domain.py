"""Domain parallelism: one sample's grid split across a domain group of P ranks, exact against one.

Each rank of a domain group holds a slab of every frame along the first spatial axis (rows
start:stop of n0; uneven slabs allowed: the first n0 % P ranks hold one row more). Everything
in neuralop's FNO but the spectral convolution is pointwise in space (lifting, 1x1 skips,
channel MLPs, projection; no padding, no normalization layers in the course's FNO), so it runs
on the slab as it is. Two parts need the whole grid:

* `DomainSpectralConv` replaces neuralop's `SpectralConv` (same parameters, same names, so the
  model and its checkpoint are the ones of one rank). Per layer:
    1. rfft / fft along the local axes (all but the first), keep the modes neuralop keeps;
    2. all_to_all: rank j gets every row of the slab group for its share K_j of the kept modes
       (the data exchanged is small: only the kept modes of the local axes travel);
    3. fft along the first axis (now whole), keep its modes, multiply by the weights of
       those modes (channels are all local: the contraction needs no communication);
    4. back again: inverse fft along the first axis, all_to_all to the slabs, inverse
       transforms along the local axes, plus the bias.
  The transforms are separable, so this is the same sum as neuralop's rfftn/irfftn (in another
  order: equal to float32 rounding). Every exchange is an autograd function whose backward is
  the reverse exchange.
* `SlabGridEmbedding` replaces the positional embedding: the slab's rows of the global grid.

The loss is the mean over the whole sample: each rank adds its slab's share and the shares are
summed over the domain group (`sample_loss`). Each rank's gradients are those of its share;
summed over the domain group they are the gradients of the sample's loss (`domain_comm_hook`:
DDP then sums over the domain and averages over the data groups).

Process groups: a 2-D grid of world_size = data x domain ranks (`ProcessGrid`), rank =
data_index * domain_size + domain_index, so a domain group is consecutive ranks (one node).

Refs: Grady et al. 2022, "Model-parallel Fourier neural operators as learned surrogates for
large-scale parametric PDEs", https://arxiv.org/abs/2204.01205 (the same transpose scheme);
all_to_all_single (uneven split sizes; gloo on CPU, NCCL on GPUs),
https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.all_to_all_single;
DDP communication hooks, https://docs.pytorch.org/docs/stable/ddp_comm_hooks.html
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from neuralop.layers.embeddings import GridEmbeddingND
from torch import nn

from wellfno.cli import UserError
from wellfno import data, memory
from wellfno.slabs import SlabRollouts


def slab_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) of each of `parts` slabs of n rows: the first n % parts one row longer."""
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for part in range(parts):
        stop = start + base + (part < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass(frozen=True)
class Slab:
    """This rank's rows start:stop of a first spatial axis of n rows, in a group of `size` ranks."""

    start: int
    stop: int
    n: int
    index: int = 0  # this rank's place in the domain group
    size: int = 1
    group: object = None  # the domain group's ProcessGroup (None: one rank holds the whole grid)

    @property
    def rows(self) -> slice:
        return slice(self.start, self.stop)

    def bounds(self) -> list[tuple[int, int]]:
        return slab_bounds(self.n, self.size)

    def frame(self, grid: tuple[int, ...]) -> tuple[int, ...]:
        """This rank's part of a frame of `grid` cells: its rows of the first axis, all the rest."""
        return (self.stop - self.start, *grid[1:])


@dataclass
class ProcessGrid:
    """The 2-D grid of ranks: data groups (DDP across them) x domain ranks (sharing one sample)."""

    data_index: int
    data_size: int
    domain_index: int
    domain_size: int
    domain_group: object = None
    data_group: object = None

    @classmethod
    def create(
        cls, rank: int, world_size: int, domain_size: int, rows: int | None = None
    ) -> "ProcessGrid":
        """Every rank calls this with the same sizes (new_group is collective over the world).

        `rows`: the first spatial axis' cells, which each domain rank needs at least one of.
        """
        check_grid(world_size, domain_size, rows)
        data_size = world_size // domain_size
        grid = cls(rank // domain_size, data_size, rank % domain_size, domain_size)
        if domain_size == 1 or not dist.is_initialized():
            return grid
        for d in range(data_size):  # every rank creates every group, in the same order
            group = dist.new_group(list(range(d * domain_size, (d + 1) * domain_size)))
            if d == grid.data_index:
                grid.domain_group = group
        for p in range(domain_size):
            group = dist.new_group(list(range(p, world_size, domain_size)))
            if p == grid.domain_index:
                grid.data_group = group
        return grid

    def slab(self, n: int) -> Slab:
        """This rank's slab of a first spatial axis of n rows."""
        if self.domain_size > n:
            raise UserError(
                f"--domain-size {self.domain_size} is more than the {n} cells of the first spatial "
                f"axis: every rank needs at least one row; use --domain-size {n} or fewer"
            )
        start, stop = slab_bounds(n, self.domain_size)[self.domain_index]
        return Slab(start, stop, n, self.domain_index, self.domain_size, self.domain_group)


def check_arguments(args) -> None:
    """Solution 13's checks of --domain-size against the command line, before any work."""
    if args.domain_size < 1:
        raise UserError("--domain-size must be at least 1")
    if args.compile and args.domain_size > 1:  # Inductor fails on the exchange's complex views
        raise UserError("--compile and --domain-size > 1 do not go together: torch.compile cannot "
                        "compile the split spectral convolution; drop --compile")


def check_grid(world_size: int, domain_size: int, rows: int | None = None) -> None:
    if domain_size < 1:
        raise UserError("--domain-size must be at least 1")
    if rows is not None and domain_size > rows:
        raise UserError(
            f"--domain-size {domain_size} is more than the {rows} cells of the first spatial axis: "
            f"every rank needs at least one row; use --domain-size {rows} or fewer"
        )
    if world_size % domain_size:
        raise UserError(
            f"{world_size} rank(s) do not divide into domain groups of {domain_size}: start a "
            f"multiple of --domain-size ranks (data x domain), or change --domain-size"
        )


def check_layout(model, domain_size: int) -> None:
    """Bad layouts, before anything is built: a 1-D grid, too few rows, too few modes to share."""
    resolution = model.resolution
    if domain_size == 1:
        return
    if len(resolution) < 2:
        raise UserError(
            f"--domain-size {domain_size}: a 1-D grid cannot be split (the split axis would be the "
            f"real FFT's); use --domain-size 1"
        )
    if domain_size > resolution[0]:
        raise UserError(
            f"--domain-size {domain_size} is more than the {resolution[0]} cells of the first "
            f"spatial axis: every rank needs at least one row; use --domain-size {resolution[0]} "
            f"or fewer"
        )
    kept = local_modes(model.fno.fno_blocks.convs[0])
    if kept < domain_size:
        raise UserError(
            f"--modes keeps {kept} Fourier modes along the local axes, fewer than the "
            f"{domain_size} domain ranks that share them after the exchange: raise --modes or "
            f"lower --domain-size"
        )


def local_modes(conv) -> int:
    """Kept modes along the local axes (all but the first): what the exchange shares out."""
    weight = conv.weight if torch.is_tensor(conv.weight) else conv.weight.to_tensor()
    return math.prod(weight.shape[3:])


# --------------------------------------------------------------------------- the exchange
class _AllToAll(torch.autograd.Function):
    """1-D real tensor: chunks of `send` sizes out, of `recv` sizes in. Backward: the reverse."""

    @staticmethod
    def forward(ctx, flat, send, recv, group):
        ctx.sizes, ctx.group = (send, recv), group
        out = flat.new_empty(sum(recv))
        dist.all_to_all_single(out, flat.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send, recv = ctx.sizes
        out = grad.new_empty(sum(send))
        dist.all_to_all_single(out, grad.contiguous(), send, recv, group=ctx.group)
        return out, None, None, None


def exchange(chunks: list[torch.Tensor], shapes: list[tuple], group) -> list[torch.Tensor]:
    """Send chunks[j] (complex) to rank j of `group`; return what rank i sent, in the given shapes.

    Complex tensors travel as their real (..., 2) views: every backend moves float32.
    """
    flats = [torch.view_as_real(c.contiguous()).reshape(-1) for c in chunks]
    send = [f.numel() for f in flats]
    recv = [2 * math.prod(s) for s in shapes]
    out = _AllToAll.apply(torch.cat(flats), send, recv, group)
    return [
        torch.view_as_complex(part.view(*shape, 2)) for part, shape in zip(out.split(recv), shapes)
    ]


# ------------------------------------------------------------------- the spectral convolution
def kept_indices(n: int, m: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) FFT indices of neuralop's m kept modes of a complex axis of n, on `device`.

    neuralop keeps the m modes around 0 after an fftshift (frequencies -m//2 .. m//2 + m%2 - 1;
    weight index j is frequency j - m//2) and shifts back with fftshift again, which for odd n lands
    one index lower: output index (k + 2 * (n//2)) mod n. Matched exactly: odd grids agree too.
    """
    freqs = torch.arange(m, device=device) - m // 2
    return freqs % n, (freqs + 2 * (n // 2)) % n


class DomainSpectralConv(nn.Module):
    """neuralop's SpectralConv on a slab of the grid; the same parameters (`weight`, `bias`)."""

    def __init__(self, conv, slab: Slab):
        super().__init__()
        if (
            conv.complex_data
            or conv.separable
            or conv.fno_block_precision != "full"
            or conv.resolution_scaling_factor is not None
            or conv.order < 2
        ):
            raise ValueError(
                "DomainSpectralConv: real data, dense weights, full precision, 2-D or 3-D only"
            )
        self.weight, self.bias = conv.weight, conv.bias  # the same parameters: state_dict unchanged
        self.fft_norm, self.out_channels, self.slab = conv.fft_norm, conv.out_channels, slab
        self._indices = {}  # (device, local axes) -> the FFT indices: see `indices`

    def indices(self, x: torch.Tensor, modes) -> tuple:
        """The FFT indices of the kept modes, on x's device, made at the first forward there.

        Not per forward: indices made on the host and copied to a GPU are a pageable host-to-device
        copy, which waits for the stream (a host sync in every convolution). Not buffers either:
        DDP would broadcast them from rank 0 at every forward (broadcast_buffers).
        """
        key = (x.device, tuple(x.shape[3:]))
        if key not in self._indices:
            self._indices[key] = (
                [kept_indices(n, m, x.device) for n, m in zip(x.shape[3:-1], modes[1:-1])],
                kept_indices(self.slab.n, modes[0], x.device),
            )
        return self._indices[key]

    def transform(self, x, output_shape=None):
        return x  # neuralop resamples the skip path only with resolution scaling: none here

    def forward(self, x: torch.Tensor, output_shape=None) -> torch.Tensor:
        slab, norm = self.slab, self.fft_norm
        weight = self.weight if torch.is_tensor(self.weight) else self.weight.to_tensor()
        modes = weight.shape[2:]  # (m0, m1, ..., m_last//2 + 1): neuralop's kept modes per axis
        local_shape = x.shape[3:]  # the local axes (all but the first)
        local_dims = tuple(range(3, x.ndim))
        local_indices, (take, put) = self.indices(x, modes)  # made once per device
        # 1. along the local axes: rfft on the last, fft on the others; keep neuralop's modes
        y = torch.fft.rfftn(x, dim=local_dims, norm=norm)
        for dim, (kept, _) in zip(local_dims[:-1], local_indices):
            y = y.index_select(dim, kept)
        y = y[..., : modes[-1]]
        batch, channels, rows = y.shape[:3]
        y = y.reshape(batch, channels, rows, -1)  # (B, C, slab rows, K kept local modes)
        shares = slab_bounds(y.shape[-1], slab.size)  # each rank's share of the K modes
        mine = slice(*shares[slab.index])
        # 2. exchange: every rank gets all rows for its share of the modes
        if slab.size > 1:
            parts = exchange(
                [y[..., a:b] for a, b in shares],
                [
                    (batch, channels, stop - start, mine.stop - mine.start)
                    for start, stop in slab.bounds()
                ],
                slab.group,
            )
            y = torch.cat(parts, dim=2)  # (B, C, n0, K_mine)
        # 3. the first axis: fft, keep its modes, multiply by the weights of these modes
        n0 = slab.n
        y = torch.fft.fft(y, dim=2, norm=norm).index_select(2, take)
        w = weight.reshape(*weight.shape[:3], -1)[..., mine]
        y = torch.einsum("bimk,iomk->bomk", y, w)
        y = y.new_zeros(batch, self.out_channels, n0, y.shape[-1]).index_copy(2, put, y)
        y = torch.fft.ifft(y, dim=2, norm=norm)
        # 4. back: all_to_all to the slabs, then the inverse transforms along the local axes
        if slab.size > 1:
            parts = exchange(
                [y[:, :, start:stop] for start, stop in slab.bounds()],
                [(batch, self.out_channels, rows, b - a) for a, b in shares],
                slab.group,
            )
            y = torch.cat(parts, dim=3)  # (B, O, slab rows, K)
        y = y.reshape(batch, self.out_channels, rows, *modes[1:])
        for dim, n, (_, kept) in zip(local_dims[:-1], local_shape[:-1], local_indices):
            shape = list(y.shape)
            shape[dim] = n
            y = y.new_zeros(shape).index_copy(dim, kept, y)
        # the last axis' rfft modes 0 .. m-1 kept: the others are zeros after them
        y = nn.functional.pad(y, (0, local_shape[-1] // 2 + 1 - modes[-1]))
        y = torch.fft.irfftn(y, s=local_shape, dim=local_dims, norm=norm)
        return y if self.bias is None else y + self.bias


class SlabGridEmbedding(GridEmbeddingND):
    """neuralop's grid positional embedding, the slab's rows of the global grid (no parameters)."""

    def __init__(self, embedding: GridEmbeddingND, slab: Slab):
        super().__init__(embedding.in_channels, embedding.dim, embedding.grid_boundaries)
        self.slab = slab

    def grid(self, spatial_dims, device, dtype):
        full = super().grid(torch.Size((self.slab.n, *spatial_dims[1:])), device, dtype)
        return [g[:, :, self.slab.rows] for g in full]


def split_model(model, slab: Slab):
    """A NextFrameFNO, in place, for frames of `slab`'s rows: the same parameters and state_dict."""
    if slab.size == 1:
        return model
    fno = model.fno
    fno.fno_blocks.convs = nn.ModuleList(
        DomainSpectralConv(conv, slab) for conv in fno.fno_blocks.convs
    )
    if fno.positional_embedding is not None:
        fno.positional_embedding = SlabGridEmbedding(fno.positional_embedding, slab)
    return model


# --------------------------------------------------------------------------- loss and gradients
class _SumOverGroup(torch.autograd.Function):
    """Forward: the sum over the group of each rank's value. Backward: the rank's own share's."""

    @staticmethod
    def forward(ctx, value, group):
        total = value.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        return (
            grad,
            None,
        )  # d(sum)/d(my share) = 1: the gradients of each rank's share, to be summed


def sum_over_domain(value: torch.Tensor, slab: Slab) -> torch.Tensor:
    return value if slab.size == 1 else _SumOverGroup.apply(value, slab.group)


def sample_loss(loss_fn, slab: Slab):
    """loss_fn (a mean over cells) -> the mean over the whole sample, on every rank of the group.

    Each rank's value is its slab's share (mean over the slab x rows / n); the shares are summed
    over the domain group. Its gradient on each rank is that of the rank's share only: summed
    over the domain group (`domain_comm_hook`), the sample's.
    """
    if slab.size == 1:
        return loss_fn

    def loss(pred, target):
        share = loss_fn(pred, target) * ((slab.stop - slab.start) / slab.n)
        return sum_over_domain(share, slab)

    return loss


def domain_comm_hook(data_size: int):
    """DDP comm hook: gradients summed over all ranks, divided by the data groups (not the world).

    = summed over each domain group (the sample's gradient), averaged over the data groups (DDP's
    mean over samples). DDP's default divides by the world size: by the domain size too.
    The bucket is reduced in place and handed back itself: a complex bucket travels as its real
    view (NCCL has no complex type), and the collective's own result would be that real view,
    which DDP's reducer before pytorch/pytorch#166863 copied back wrong
    (wellfno/complex_ddp_check.py).
    """

    def hook(state, bucket):
        buffer = bucket.buffer()
        real = torch.view_as_real(buffer) if buffer.is_complex() else buffer
        real.div_(data_size)
        return dist.all_reduce(real, async_op=True).get_future().then(lambda _: buffer)

    return hook


def group_sum(value: torch.Tensor, slab: Slab) -> torch.Tensor:
    """The sum over the domain group (no gradient): counts, sums of squares."""
    if slab.size > 1:
        value = value.clone()
        dist.all_reduce(value, group=slab.group)
    return value


# ------------------------------------------------------------------- rollouts on split frames
@torch.no_grad()
def validate(model, loader, device, loss_fn):
    """Mean loss over every validation sample once: this rank's sum and count, added over ranks.

    wellfno.ranks.validate with the loss as an argument: with --domain-size, the whole sample's
    (every rank of a domain group adds the sample: sums and count domain_size times, same ratio).
    Moved from solution 13 (tests/test_drift.py checks it is ranks.validate but for the loss).
    """
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, samples; no .item()
    for batch in loader:
        x, y = data.batch_to_model(batch, device, non_blocking=True)
        total[0] += loss_fn(model(x), y).double() * len(x)
        total[1] += len(x)
    if dist.is_initialized():
        dist.all_reduce(total)
    return (total[0] / total[1]).item()


def slab_step_vrmse(
    inputs: torch.Tensor, true: torch.Tensor, pred: torch.Tensor, slab: Slab, eps: float = 1e-7
) -> tuple[torch.Tensor, torch.Tensor]:
    """wellfno.rollout.step_vrmse of whole frames, from each rank's slabs (1, T, *slab, F): the
    model's and persistence's mean VRMSE over fields at each step, (T,) each.

    One step at a time (a few frames more, not copies of the trajectory); sums over space in
    float64, added up over the domain group: the mean first, then the squares about it (two
    passes, as torch's var), so that the slabs give one process's numbers.
    """
    space = tuple(range(1, true.ndim - 2))  # a frame (B, *slab, F)
    cells = slab.n * math.prod(true.shape[3:-1])
    last = inputs[:, -1].double()
    steps = []
    for k in range(true.shape[1]):
        t, p = true[:, k].double(), pred[:, k].double()
        steps.append(torch.stack([((p - t) ** 2).sum(space), ((last - t) ** 2).sum(space), t.sum(space)]))
    sums = group_sum(torch.stack(steps, dim=2), slab) / cells  # (3, B, T, F)
    spread = []
    for k in range(true.shape[1]):
        t = true[:, k].double()
        mean = sums[2, :, k].reshape(t.shape[0], *(1,) * len(space), t.shape[-1])
        spread.append(((t - mean) ** 2).sum(space))
    var = group_sum(torch.stack(spread, dim=1), slab) / cells  # (B, T, F)
    vrmse = torch.sqrt(sums[:2] / (var + eps)).float()  # (2, B, T, F)
    model_err, persist_err = vrmse.mean(-1)[:, 0]
    return model_err, persist_err


@torch.no_grad()
def evaluate_rollouts(
    model,
    dataset,
    device,
    grid: ProcessGrid,
    slab: Slab,
    max_steps: int | None = None,
    max_trajectories: int = 16,
):
    """wellfno.rollout.evaluate_rollouts on split frames: a domain group rolls out each trajectory.

    `dataset` holds this rank's slab of whole trajectories (wellfno.slabs.SlabRollouts).
    Trajectories go to the data groups in turn (data_index, data_index + data_size, ...); every
    trajectory counts once. Returns (model_vrmse, persistence_vrmse, example); the example (true,
    pred of the trajectory that changes most in one step, whole frames) on rank 0 only.
    """
    from wellfno.rollout import rollout

    def roll(i):
        sample = dataset[i]
        inputs = sample["input_fields"].unsqueeze(0).to(device)
        true = sample["output_fields"].unsqueeze(0).to(device)
        constants = sample.get("constant_fields")
        constants = None if constants is None else constants.unsqueeze(0).to(device)
        true = true[:, : true.shape[1] if max_steps is None else min(max_steps, true.shape[1])]
        return inputs, true, rollout(model, inputs, true.shape[1], constants)

    model.eval()
    n_trajectories = min(len(dataset), max_trajectories)
    curves, best = [], None
    for i in range(grid.data_index, n_trajectories, grid.data_size):
        inputs, true, pred = roll(i)
        curves.append(slab_step_vrmse(inputs, true, pred, slab))
        change = curves[-1][1][0].item()  # the same on every rank of the group
        if best is None or change > best[0]:
            best = (change, i, true, pred)
    world = dist.get_world_size() if dist.is_initialized() else 1
    steps = torch.tensor([min((len(m) for m, _ in curves), default=2**62)], device=device)
    mine = torch.tensor(
        [best[0], -best[1]] if best else [-1.0, -n_trajectories], dtype=torch.float64, device=device
    )
    chosen = mine
    if world > 1:
        dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    sums = torch.zeros(2, int(steps.item()), dtype=torch.float64, device=device)
    for model_err, persist_err in curves:
        sums[0] += model_err[: sums.shape[1]]
        sums[1] += persist_err[: sums.shape[1]]
    if world > 1:
        dist.all_reduce(
            sums
        )  # each domain group's ranks hold the same curves: counted domain_size times
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
        chosen = max(everyone, key=lambda b: tuple(b.tolist()))
    model_curve, persist_curve = (sums / (n_trajectories * grid.domain_size)).float()
    example = None
    if grid.data_index == 0:  # the first domain group assembles the example for rank 0
        index = int(-chosen[1].item())
        true, pred = best[2:] if best and best[1] == index else roll(index)[1:]
        true, pred = gather_rows(true[0], slab, row_dim=1), gather_rows(pred[0], slab, row_dim=1)
        if slab.index == 0:
            example = (true.cpu(), pred.cpu())
    return model_curve.tolist(), persist_curve.tolist(), example


def evaluate_slab_rollouts(model, dataset_dir, n_steps_input, device, grid: ProcessGrid, slab: Slab):
    """`evaluate_rollouts` of this rank's rows of the dataset's rollout trajectories (HDF5
    hyperslabs, wellfno.slabs.SlabRollouts), as many steps as the device's memory allows: every
    rank calls it; rank 0 gets the example (true, pred), the others None."""
    rollout_data = SlabRollouts(dataset_dir, n_steps_input, rows=slab.rows,
                                max_rollout_steps=memory.rollout_steps(model, device))
    return evaluate_rollouts(model, rollout_data, device, grid, slab)


def gather_rows(tensor: torch.Tensor, slab: Slab, row_dim: int) -> torch.Tensor | None:
    """Whole frames on the group's first rank (slabs padded, gathered, trimmed); None elsewhere."""
    if slab.size == 1:
        return tensor
    bounds = slab.bounds()
    longest = max(stop - start for start, stop in bounds)
    pad = list(tensor.shape)
    pad[row_dim] = longest - tensor.shape[row_dim]
    padded = torch.cat([tensor, tensor.new_zeros(pad)], dim=row_dim).contiguous()
    first = dist.get_global_rank(slab.group, 0)
    parts = [torch.empty_like(padded) for _ in bounds] if slab.index == 0 else None
    dist.gather(padded, parts, dst=first, group=slab.group)
    if slab.index:
        return None
    return torch.cat(
        [p.narrow(row_dim, 0, stop - start) for p, (start, stop) in zip(parts, bounds)], dim=row_dim
    )


def summed_counts(counted: dict, slab: Slab, device: torch.device) -> dict:
    """wellfno.flops' counts of one rank's slab -> of the whole sample (summed over the group).

    The counts travel on `device`, the rank's: NCCL (RCCL) reduces GPU tensors only."""
    if slab.size == 1:
        return counted
    keys = sorted(counted["by_kind"])
    values = group_sum(
        torch.tensor(
            [counted["per_sample"], *(counted["by_kind"][k] for k in keys)],
            dtype=torch.float64,
            device=device,
        ),
        slab,
    ).tolist()
    return dict(counted, per_sample=values[0], by_kind=dict(zip(keys, values[1:])))
