"""Which device, and which communication backend, for this process.

ROCm builds of torch report their GPUs as `cuda` (and run RCCL under the name `nccl`), so the
same code serves NVIDIA and AMD nodes. Nothing here hard-codes a device index: a rank uses its
*local* rank's GPU, or the only GPU it can see when Slurm gave each task one
(`--gpus-per-task=1`, where every task sees its own GPU as device 0).
"""
from __future__ import annotations

import torch

from wellfno.cli import UserError

DEVICE_CHOICES = ("auto", "cpu", "cuda")
BACKEND_CHOICES = ("auto", "gloo", "nccl")


def pick_device(name: str = "auto") -> torch.device:
    """`auto` means the GPU when torch sees one, else the CPU (a single process: device index 0)."""
    if name not in DEVICE_CHOICES:
        raise UserError(f"unknown device {name!r}: use one of {', '.join(DEVICE_CHOICES)}")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda, but torch sees no GPU: use --device cpu, or run on a GPU node")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def gpu_index_for(local_rank: int, local_world_size: int | None, visible: int,
                  step_gpus: int | None = None, launcher: str = "srun") -> int:
    """The GPU a rank drives, from how many the rank can see.

    One visible GPU: it is ours when srun bound one per task (--gpus-per-task=1); torchrun never
    narrows what a rank sees, so under torchrun one GPU for several local ranks is an error (NCCL
    would otherwise stop with its own duplicate-GPU message). Several, at least one per rank on the
    node: the local rank's, so a second node's rank 4 uses its node's GPU 0 through local rank 0,
    never `cuda:<global rank>`. Fewer than the ranks on the node, while Slurm gave the step at least
    one GPU per rank (`step_gpus`, from SLURM_STEP_GPUS): `srun --gpu-bind=closest` shows each task
    the k GPUs of its NUMA node, shared by k consecutive local ranks (block distribution), so local
    rank L drives GPU L mod k. Any other shortfall is more ranks than GPUs: an error.
    """
    if visible < 1:
        raise UserError("this rank sees no GPU: ask Slurm for GPUs (--gpus-per-task=1), or use the CPU")
    ranks = local_world_size if local_world_size is not None else local_rank + 1
    if visible == 1:
        shared = ranks > 1 and (launcher != "srun" or (step_gpus is not None and step_gpus < ranks))
        if not shared:
            return 0
    if local_rank < visible and ranks <= visible:
        return local_rank
    if step_gpus is not None and ranks <= step_gpus and ranks % visible == 0:
        return local_rank % visible
    raise UserError(f"{max(ranks, local_rank + 1)} ranks on this node but only {visible} GPUs visible: start at "
                    f"most one rank per GPU (--ntasks-per-node / --nproc-per-node), or use the CPU")


def pick_backend(requested: str, local_rank: int, local_world_size: int | None = None,
                 prefer_gpu: bool = True, step_gpus: int | None = None,
                 launcher: str = "srun") -> tuple[str, torch.device]:
    """(backend, device) for torch.distributed.

    `auto` means nccl on GPUs (RCCL on ROCm) when `prefer_gpu` and a GPU is visible, else gloo
    on the CPU. Work that is CPU work anyway (dataset statistics) passes prefer_gpu=False, so
    that `srun --ntasks=128` on a 4-GPU node does not ask for 128 GPUs.
    """
    if requested not in BACKEND_CHOICES:
        raise UserError(f"unknown backend {requested!r}: use one of {', '.join(BACKEND_CHOICES)}")
    if requested == "auto":
        requested = "nccl" if prefer_gpu and torch.cuda.is_available() else "gloo"
    if requested == "gloo":
        return "gloo", torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError("--backend nccl needs a GPU, and torch sees none: use --backend gloo")
    index = gpu_index_for(local_rank, local_world_size, torch.cuda.device_count(), step_gpus, launcher)
    torch.cuda.set_device(index)
    return "nccl", torch.device("cuda", index)
