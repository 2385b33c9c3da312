"""Which device, and which communication backend, for this process.

ROCm builds of torch report their GPUs as `cuda` (and run RCCL under the name `nccl`), so the
same code serves NVIDIA and AMD nodes. Nothing here hard-codes a device index: a rank drives the
only GPU it sees, or its *local* rank's among several (`gpu_index_for`, measured against real
Slurm in tests/test_slurm_gpus.py); `check_gpu_not_shared` then makes sure no two ranks ended up
on one physical GPU.
"""
from __future__ import annotations

import socket

import torch

from wellfno.cli import UserError

DEVICE_CHOICES = ("auto", "cpu", "cuda")
BACKEND_CHOICES = ("auto", "gloo", "nccl")
ONE_GPU_PER_RANK = ("srun --ntasks-per-node=N --gpus-per-node=N (slurm/submit_all.sh does it), "
                    "or --gpus-per-task=1")


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
    """The torch device index of the GPU a rank drives, from how many GPUs the rank sees.

    What Slurm 22.05 shows a task (measured on the test cluster, tests/test_slurm_gpus.py):
    --gpus-per-task=1 or --gpu-bind=per_task:1: its own GPU only (SLURM_STEP_GPUS is per task);
    --gpus-per-node=N: every GPU of the step on the node; --gpu-bind=closest: the GPUs of its
    NUMA domain, k of them, shared by the k consecutive local ranks there (block distribution);
    torchrun: every worker sees what its one srun task saw.
    So: one visible GPU under srun is this task's; several, at least one per rank on the node:
    the local rank's (a second node's local rank 0 drives its node's GPU 0, never
    `cuda:<global rank>`); fewer than the ranks on the node, while Slurm allocated at least one
    per rank there (`step_gpus`, SLURM_GPUS_ON_NODE): the --gpu-bind=closest case, local rank
    mod k. Anything else is more ranks than GPUs: an error. Two ranks that still land on one
    physical GPU (a closest binding whose NUMA domains hold fewer GPUs than tasks) are found
    once the process group is up, by check_gpu_not_shared.
    """
    if visible < 1:
        raise UserError("this rank sees no GPU: ask Slurm for GPUs (--gpus-per-node), "
                        "or use the CPU")
    ranks = max(local_world_size if local_world_size is not None else 1, local_rank + 1)
    if launcher == "srun" and visible == 1:
        return 0
    if ranks <= visible:
        return local_rank
    if launcher == "srun" and step_gpus is not None and ranks <= step_gpus:
        return local_rank % visible
    raise UserError(f"{ranks} ranks on this node but only {visible} GPUs visible: start at most "
                    f"one rank per GPU (--ntasks-per-node / --nproc-per-node), or use the CPU")


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


def gpu_identity(device: torch.device) -> str | None:
    """Which physical GPU a torch device is: its PCI address where torch reports one (recent
    builds, NVIDIA and ROCm), else its uuid; None when torch says neither."""
    props = torch.cuda.get_device_properties(device.index if device.index is not None
                                             else torch.cuda.current_device())
    ids = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if all(isinstance(v, int) for v in ids):
        return "{:04x}:{:02x}:{:02x}.0".format(*ids)
    uuid = str(getattr(props, "uuid", "") or "").strip()
    return uuid or None


def check_gpu_not_shared(device: torch.device) -> None:
    """Call right after dist.init_process_group: stop when two ranks drive one physical GPU.

    Each rank's (host, GPU identity) is gathered from every rank, so the answer does not depend
    on what Slurm's variables claim. NCCL itself refuses a communicator with two ranks on one
    GPU, with a message that does not say how to launch instead. Rank 0 prints the one line
    (naming both ranks and the Slurm option that gives one GPU per rank); every rank exits 2.
    """
    import torch.distributed as dist

    if device.type != "cuda" or not dist.is_initialized() or dist.get_world_size() < 2:
        return
    mine = (socket.gethostname(), gpu_identity(device))
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    first_rank: dict = {}
    for rank, (host, gpu) in enumerate(everyone):
        if gpu is None:
            continue
        if (host, gpu) in first_rank:
            if dist.get_rank() != 0:
                raise SystemExit(2)
            raise UserError(f"ranks {first_rank[host, gpu]} and {rank} both drive GPU {gpu} on "
                            f"{host}: give each rank its own GPU with {ONE_GPU_PER_RANK}")
        first_rank[host, gpu] = rank


# Taught in solution 08 (`solutions/08_host_syncs/fno.py`); solutions 10 on import it from here
# (tests/test_drift.py: the same syntax tree as solution 08's).
def synchronize(device):
    """Wait for the device's queued work: only where a time is read, never inside the step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def exact_float32() -> str:
    """Float32 matmuls and convolutions in full float32 (no TF32), for checks of one run against
    another: call it first thing in every equivalence check. Returns the line the check prints.

    On NVIDIA GPUs from Ampere on, cuDNN runs float32 convolutions in TF32 by default
    (torch.backends.cudnn.allow_tf32 is True; about 1e-3 relative): neuralop's lifting, skip,
    channel-MLP and projection layers are 1x1 Conv1d, so two runs that sum in another order differ
    by far more than the checks' float32 tolerance (1e-5). cuBLAS matmuls are float32 by default
    (allow_tf32 False, "highest"); set here too, in case a site or a script turned them on.
    Elsewhere (CPU, ROCm) the flags change nothing. https://docs.pytorch.org/docs/stable/notes/cuda.html
    (TensorFloat-32 (TF32) on Ampere (and later) devices).
    """
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return "float32 checks: TF32 off (matmuls and cuDNN convolutions in full float32)"
