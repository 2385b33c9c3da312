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

from wellfno.domain import ProcessGrid, Slab, local_modes, sample_loss, slab_bounds, split_model
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
            torch.save(
                dict(
                    pred=pred.detach().cpu(),
                    loss=loss.detach().cpu(),
                    grads=grads,
                    slab=(start, stop),
                    same_keys=list(split.state_dict()) == keys,
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
    """The 2-D case on 2 GPUs with NCCL (one rank per GPU) against the serial FNO on the CPU."""
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
