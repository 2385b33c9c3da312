"""wellfno.domain: the FNO split across a domain group equals the serial FNO, forward and backward.

One start of 3 gloo ranks (module fixture) computes, for each case, every rank's output slab,
loss and gradients; the tests compare them with neuralop's FNO on one process (the reference:
the same NextFrameFNO, whole grid). Cases: 2-D on 2 ranks (15 rows: slabs 8 + 7), 2-D on 3 ranks
(16 rows: 6 + 5 + 5; an odd second axis), 3-D on 3 ranks (7 rows: 3 + 2 + 2).
"""

from __future__ import annotations

import copy
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torch.utils._python_dispatch import TorchDispatchMode

from wellfno.domain import (
    DomainSpectralConv,
    ProcessGrid,
    Slab,
    domain_comm_hook,
    local_modes,
    sample_loss,
    slab_bounds,
    split_model,
    summed_counts,
)
from wellfno.device import exact_float32
from wellfno.model import NextFrameFNO

# (name, ranks in the domain group, grid, modes)
CASES = [("2d_on_2", 2, (15, 12), 8), ("2d_on_3", 3, (16, 11), 6), ("3d_on_3", 3, (7, 6, 5), 4)]
WORLD = 3
CHANNELS, BATCH = 2, 2


def make_case(grid, modes, seed=0):
    """The serial model, an input and a target (the same on every process: seeded)."""
    torch.manual_seed(seed)
    stats = {k: torch.rand(CHANNELS) + 0.5 for k in ("mean", "std", "mean_delta", "std_delta")}
    model = NextFrameFNO(
        CHANNELS,
        1,
        stats,
        n_spatial_dims=len(grid),
        resolution=grid,
        modes=modes,
        width=6,
        layers=2,
    )
    x = torch.randn(BATCH, model.in_channels, *grid)
    y = torch.randn(BATCH, CHANNELS, *grid)
    return model, x, y


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    wide = torch.complex128 if b.is_complex() else torch.float64
    return ((a.to(wide) - b.to(wide)).abs().max() / b.to(wide).abs().max().clamp_min(1e-30)).item()


def _worker(rank, port, out_dir, world=WORLD, cases=CASES, device="cpu"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    device = torch.device(device, rank) if device == "cuda" else torch.device(device)
    exact_float32()  # compared at 1e-5: TF32 convolutions (NVIDIA's default) are good to ~1e-3
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        device_id=device if device.type == "cuda" else None,
    )
    try:
        for name, size, grid, modes in cases:
            group = dist.new_group(
                list(range(size))
            )  # collective over the world: every rank calls it
            if rank >= size:
                continue
            start, stop = slab_bounds(grid[0], size)[rank]
            slab = Slab(start, stop, grid[0], rank, size, group)
            model, x, y = make_case(grid, modes)
            keys = list(model.state_dict())
            split = split_model(copy.deepcopy(model), slab).to(device)
            pred = split(x[:, :, slab.rows].to(device))
            loss = sample_loss(split.loss, slab)(pred, y[:, :, slab.rows].to(device))
            loss.backward()
            grads = {n: p.grad.clone() for n, p in split.named_parameters()}
            for g in grads.values():
                dist.all_reduce(g, group=group)  # the gradients summed over the domain group
            grads = {n: g.cpu() for n, g in grads.items()}
            off_device, counts = step_off_the_default_device(split, x, y, slab, device, rank)
            torch.save(
                dict(
                    pred=pred.detach().cpu(),
                    loss=loss.detach().cpu(),
                    grads=grads,
                    slab=(start, stop),
                    same_keys=list(split.state_dict()) == keys,
                    off_device=off_device,
                    counts=counts,
                ),
                os.path.join(out_dir, f"{name}.{rank}.pt"),
            )
        if world != WORLD:
            return
        grid = ProcessGrid.create(rank, WORLD, 3)  # a 1 x 3 grid of groups: this rank's place
        torch.save(
            dict(
                data=(grid.data_index, grid.data_size), domain=(grid.domain_index, grid.domain_size)
            ),
            os.path.join(out_dir, f"grid.{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def step_off_the_default_device(split, x, y, slab, device, rank):
    """The step again, and summed_counts, with torch's default device elsewhere (meta).

    A tensor made inside without device= lands there, and the op or collective it meets fails.
    On GPUs the same tensor would be a host one: a collective NCCL refuses (it reduces GPU
    tensors only), or a host-to-device copy in every forward (a host sync). After the first
    step, as in training: neuralop's grid embedding makes its grid once, on the host, and keeps
    it. Returns (None or the error, the summed counts).
    """
    mine = dict(per_sample=rank + 1.0, by_kind=dict(fft=10.0 * (rank + 1), mm=1.0))
    try:
        with torch.device("meta"):
            pred = split(x[:, :, slab.rows].to(device))
            sample_loss(split.loss, slab)(pred, y[:, :, slab.rows].to(device)).backward()
            return None, summed_counts(mine, slab, device)
    except Exception as err:  # noqa: BLE001 - reported by the test, with the rank's case
        return f"{type(err).__name__}: {str(err).splitlines()[0]}", None


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """{case: [per-rank results]} from one start of 3 gloo ranks."""
    out = tmp_path_factory.mktemp("domain")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_worker, args=(port, str(out)), nprocs=WORLD, start_method="spawn")
    return {
        name: [torch.load(out / f"{name}.{r}.pt", weights_only=True) for r in range(size)]
        for name, size, _, _ in CASES
    } | {"grid": [torch.load(out / f"grid.{r}.pt", weights_only=True) for r in range(WORLD)]}


def serial(grid, modes):
    model, x, y = make_case(grid, modes)
    pred = model(x)
    loss = model.loss(pred, y)
    loss.backward()
    return pred.detach(), loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_slab_bounds_uneven_and_covering():
    assert slab_bounds(16, 3) == [(0, 6), (6, 11), (11, 16)]
    assert slab_bounds(15, 2) == [(0, 8), (8, 15)]
    assert slab_bounds(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]


@pytest.mark.parametrize("name,size,grid,modes", CASES, ids=[c[0] for c in CASES])
def test_forward_equals_serial(ranks, name, size, grid, modes):
    pred, _, _ = serial(grid, modes)
    got = ranks[name]
    assert [r["slab"] for r in got] == slab_bounds(grid[0], size)
    assert all(
        r["same_keys"] for r in got
    ), "the split model must have the serial model's state_dict"
    whole = torch.cat([r["pred"] for r in got], dim=2)
    assert whole.shape == pred.shape
    assert relative(whole, pred) <= 1e-5


@pytest.mark.parametrize("name,size,grid,modes", CASES, ids=[c[0] for c in CASES])
def test_loss_and_gradients_equal_serial(ranks, name, size, grid, modes):
    _, loss, grads = serial(grid, modes)
    got = ranks[name]
    for r in got:  # every rank of the group holds the sample's loss
        assert relative(r["loss"], loss) <= 1e-5
    assert got[0]["grads"].keys() == grads.keys()
    for n, g in grads.items():
        for r in got:  # summed over the group: the same on every rank, and the serial gradient
            assert relative(r["grads"][n], g) <= 1e-5, (name, n)


@pytest.mark.parametrize("name,size,grid,modes", CASES, ids=[c[0] for c in CASES])
def test_step_and_counts_make_no_tensor_off_the_rank_device(ranks, name, size, grid, modes):
    """Every tensor of the split step and of summed_counts is made on the rank's device (see
    step_off_the_default_device); the counts are the group's sums."""
    for r in ranks[name]:
        assert r["off_device"] is None, (
            f"{name}: a tensor made off the rank's device: {r['off_device']}"
        )
        assert r["counts"] == dict(
            per_sample=sum(range(1, size + 1)) * 1.0,
            by_kind=dict(fft=10.0 * sum(range(1, size + 1)), mm=1.0 * size),
        )


class _IntegerTensorsMade(TorchDispatchMode):
    """Counts the ops that make an integer tensor (index tensors: arange, remainder, copies)."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and not out.is_floating_point() and not out.is_complex():
            self.made.append(str(func))
        return out


@pytest.mark.parametrize("grid,modes", [((15, 12), 8), ((7, 6, 5), 4)], ids=["2d", "3d"])
def test_domain_conv_makes_its_indices_once_per_device(grid, modes):
    """After the first forward on a device, a forward makes no index tensor: indices made (and
    copied to the GPU) in every forward are a host-to-device copy each, a host sync on GPUs.
    The convolution on a whole grid equals neuralop's."""
    model, _, _ = make_case(grid, modes)
    conv = model.fno.fno_blocks.convs[0]
    split = DomainSpectralConv(conv, Slab(0, grid[0], grid[0]))
    h = torch.randn(2, conv.in_channels, *grid)
    with torch.no_grad():
        assert relative(split(h), conv(h)) <= 1e-5
        counter = _IntegerTensorsMade()
        with counter:
            split(h)
    assert counter.made == [], f"index tensors made in a forward after the first: {counter.made}"


class _Bucket:  # what DDP hands a hook: buffer() is the flat gradients of the bucket's parameters
    def __init__(self, buffer):
        self._buffer = buffer

    def buffer(self):
        return self._buffer


def test_domain_comm_hook_returns_the_bucket_it_reduced():
    """The hook hands DDP back the bucket itself, divided by the data groups and summed over the
    ranks in place: for a complex bucket never the collective's result (its real view, which
    DDP's reducer would have to copy back into complex gradients); real buckets alike."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        hook = domain_comm_hook(data_size=2)
        bucket = torch.tensor([1 + 2j, -3 + 0.5j], dtype=torch.complex64)
        result = hook(None, _Bucket(bucket)).wait()
        assert result is bucket and result.dtype == torch.complex64
        assert torch.equal(result, torch.tensor([0.5 + 1j, -1.5 + 0.25j], dtype=torch.complex64))
        real = torch.tensor([4.0, 2.0])
        result = hook(None, _Bucket(real)).wait()
        assert result is real and torch.equal(result, torch.tensor([2.0, 1.0]))
    finally:
        dist.destroy_process_group()


def test_split_model_keeps_one_rank_model_when_alone():
    model, x, _ = make_case((8, 8), 4)
    reference = model(x)
    assert split_model(model, Slab(0, 8, 8)) is model
    assert torch.equal(model(x), reference)
    assert local_modes(model.fno.fno_blocks.convs[0]) == 3  # 4 modes of the last axis: 4 // 2 + 1


def test_process_grid_places_ranks(ranks):
    assert [(r["data"], r["domain"]) for r in ranks["grid"]] == [((0, 1), (i, 3)) for i in range(3)]


@pytest.mark.gpu
def test_two_gpus_equal_serial(tmp_path):
    """The 2-D case on 2 GPUs with NCCL (one rank per GPU) against the serial FNO on the CPU,
    with TF32 off (wellfno.device.exact_float32: the ranks' float32 is float32)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        _worker, args=(port, str(tmp_path), 2, CASES[:1], "cuda"), nprocs=2, start_method="spawn"
    )
    name, size, grid, modes = CASES[0]
    got = [torch.load(tmp_path / f"{name}.{r}.pt", weights_only=True) for r in range(size)]
    pred, loss, grads = serial(grid, modes)
    assert relative(torch.cat([r["pred"] for r in got], dim=2), pred) <= 1e-5
    assert relative(got[0]["loss"], loss) <= 1e-5
    for n, g in grads.items():
        assert relative(got[0]["grads"][n], g) <= 1e-5, n
