"""The four mistakes of the original statistics script, each shown with wrong vs right numbers.

    .venv/bin/python exercises/04_distributed_stats/pitfalls.py

1. float32 E[x^2] - E[x]^2 on a field with a large mean and a small spread.
2. DistributedSampler padding + keeping the first N gathered rows: duplicates kept, samples dropped.
3. Averaging per-batch means (and per-rank standard deviations).
4. `cuda:<rank>`: on a second node the global rank names a GPU that node does not have.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from wellfno.device import gpu_index_for


def two_pass(x: np.ndarray) -> tuple[float, float]:
    x = x.astype(np.float64)
    mean = x.mean()
    return float(mean), float(np.sqrt(((x - mean) ** 2).mean()))


def float32_one_pass() -> None:
    print("1. float32 E[x^2] - E[x]^2 on a field of 1e4 +- 1e-2 (a pressure in Pa, say)")
    rng = np.random.default_rng(0)
    x = (1e4 + 1e-2 * rng.standard_normal((64, 128, 128))).astype(np.float32)
    t = torch.from_numpy(x)
    var32 = (t * t).mean() - t.mean() ** 2  # what the original did, on float32 tensors
    t64 = t.double()
    var64 = (t64 * t64).mean() - t64.mean() ** 2  # the same formula in float64: better, not right
    _, std = two_pass(x)
    std32 = np.sqrt(max(float(var32), 0))
    print(f"   float32 E[x^2]-E[x]^2: variance {float(var32):+.6g} -> std {std32:.6g}"
          f"{'  (negative variance!)' if var32 < 0 else ''}")
    print(f"   float64 E[x^2]-E[x]^2: std {np.sqrt(float(var64)):.12f}")
    print(f"   float64 two-pass     : std {std:.12f}   <- right "
          f"(relative error of the float64 one-pass: "
          f"{abs(np.sqrt(float(var64)) - std) / std:.1e})")


def padded_round_robin() -> None:
    print("2. DistributedSampler pads 10 samples to 12 for 4 ranks (round-robin); gather; "
          "keep the first 10")
    n, world = 10, 4
    dataset = list(range(n))
    per_rank = [list(DistributedSampler(dataset, num_replicas=world, rank=r, shuffle=False))
                for r in range(world)]
    # all_gather concatenates rank by rank
    gathered = [i for rank_indices in per_rank for i in rank_indices]
    kept = gathered[:n]
    counts = np.bincount(kept, minlength=n)
    print(f"   rank shares {per_rank}")
    print(f"   gathered {gathered} -> first {n}: {kept}")
    print(f"   counted twice: {np.flatnonzero(counts == 2).tolist()}, never counted: "
          f"{np.flatnonzero(counts == 0).tolist()}")
    sample_means = np.arange(n, dtype=np.float64) ** 2  # samples differ, as trajectories do
    print(f"   mean over samples: wrong {sample_means[kept].mean():.4f}, "
          f"right {sample_means.mean():.4f}")


def mean_of_means() -> None:
    print("3. averaging per-batch means (10 samples, batch size 4: batches of 4, 4, 2)")
    rng = np.random.default_rng(1)
    samples = [rng.normal(i, 1.0 + i, 1000) for i in range(10)]
    batches = [np.concatenate(samples[i:i + 4]) for i in range(0, 10, 4)]
    everything = np.concatenate(samples)
    mean, std = two_pass(everything)
    batch_means = np.mean([b.mean() for b in batches])
    print(f"   mean: mean of batch means {batch_means:.4f}, right {mean:.4f}")
    ranks = [np.concatenate(samples[r::2]) for r in range(2)]
    print(f"   std : mean of 2 ranks' stds {np.mean([r.std() for r in ranks]):.4f}, "
          f"mean of sample stds {np.mean([s.std() for s in samples]):.4f}, right {std:.4f}")
    print("   right: merge (count, mean, M2) with Chan's formula, weighting by counts")


def cuda_rank() -> None:
    print("4. cuda:<rank> on 2 nodes of 4 GPUs each (8 ranks, srun or torchrun: 4 ranks per node)")
    print("   ranks 0-3 (node 0): cuda:<rank> happens to be right")
    for rank in (4, 7):
        local_rank = rank % 4  # what LOCAL_RANK / SLURM_LOCALID says on the rank's node
        right = gpu_index_for(local_rank, 4, visible=4)
        print(f"   rank {rank} (node 1): wrong cuda:{rank} (a 4-GPU node has cuda:0-3), "
              f"right cuda:{right} (local rank {local_rank})")


if __name__ == "__main__":
    float32_one_pass()
    print()
    padded_round_robin()
    print()
    mean_of_means()
    print()
    cuda_rank()
