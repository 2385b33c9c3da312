"""Exercise 06's metrics over ranks: validation, an epoch's row for the whole job, samples left out.

Solution 06 (`solutions/06_exact_metrics/fno.py`) teaches the idea in its `validate`: every rank
adds up its own loss sum and sample count, one all-reduce adds those up over the ranks, and the
mean is taken last, so every sample counts once for any world size. Later solutions import that
`validate` from here (tests/test_drift.py: the same syntax tree as solution 06's). The two
other helpers do the same for the training row and name the samples a `drop_last` sampler leaves
out. One block an earlier solution taught, which later ones call here: solution 05's rank-0-first
opening of the dataset. (Every solution's `main` starts its ranks in its own lines: issue 42.)
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from wellfno import data

ROW_KEYS = ("train_loss", "samples", "seconds", "timed_samples", "timed_seconds")


def over_ranks(row: dict, device: torch.device) -> dict:
    """This epoch's row for all ranks: loss over every sample, samples summed, the slowest seconds.

    Also `world_size` and `samples_per_second_per_rank` (each rank's own rate, timed steps)."""
    mine = torch.tensor([row["train_loss"] * row["samples"], *(row[k] for k in ROW_KEYS[1:])],
                        dtype=torch.float64, device=device)
    everyone = [mine]
    if dist.is_initialized():
        everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, mine)
    columns = torch.stack(everyone).cpu().double().T
    loss_sum, samples, seconds, timed_samples, timed_seconds = columns
    per_rank = (timed_samples / timed_seconds) if timed_samples.all() else (samples / seconds)
    return dict(row, train_loss=(loss_sum.sum() / samples.sum()).item(), samples=int(samples.sum()),
                seconds=seconds.max().item(), timed_samples=int(timed_samples.sum()),
                timed_seconds=timed_seconds.max().item(), world_size=len(everyone),
                samples_per_second_per_rank=per_rank.tolist())


def samples_left_out(sampler: DistributedSampler) -> list[int]:
    """Training samples no rank takes this epoch (with drop_last each takes len // world_size)."""
    taken = set()
    for rank in range(sampler.num_replicas):
        share = DistributedSampler(sampler.dataset, sampler.num_replicas, rank,
                                   shuffle=sampler.shuffle,
                                   seed=sampler.seed, drop_last=True)
        share.set_epoch(sampler.epoch)
        taken.update(share)
    return sorted(set(range(len(sampler.dataset))) - taken)


@torch.no_grad()
def validate(model, loader, device):
    """Mean loss over every validation sample once: this rank's sum and count, added over ranks."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, samples; no .item()
    for batch in loader:
        x, y = data.batch_to_model(batch, device, non_blocking=True)
        total[0] += model.loss(model(x), y).double() * len(x)
        total[1] += len(x)
    if dist.is_initialized():
        dist.all_reduce(total)
    return (total[0] / total[1]).item()


def open_dataset_rank_0_first(data_dir, dataset, download, env):
    """The dataset's folder and statistics, rank 0 first: it may generate or download the dataset
    the others then read. Step 05's statements (tests/test_drift.py); called from solution 07 on."""
    if env.rank > 0:
        dist.barrier()  # rank 0 first: it may generate or download the dataset the others then read
    dataset_dir, dataset_stats = data.open_dataset(data_dir, dataset, download)
    if env.rank == 0 and env.is_distributed:
        dist.barrier()
    return dataset_dir, dataset_stats
