#!/usr/bin/env python3
"""Is this container ready for the course? `wellfno-container-check` in the image (install-course.sh
puts it there; it is the image's default command), run as the jobs run it:

    podman run --rm -v "$PWD":/course localhost/wellfno-course:cpu
    apptainer exec --rocm --bind "$PWD":/course wellfno-course.sif wellfno-container-check

Each problem is one `error:` line naming the fix; exit 2 if any, else one line saying what it saw.
  - the image's torch older than the oldest the course supports (wellfno/cli.py's OLDEST_TORCH);
  - a GPU on this node (its device files /dev/nvidia*, /dev/kfd, or a GPU selection Slurm or the
    site set: CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES) that torch inside
    does not see: the container was started without its GPU (apptainer --nv / --rocm,
    podman-hpc --gpu), or the image's torch is a CPU build;
  - the repository not bind-mounted at WELLFNO_REPO (/course): the course's programs not found.
It runs from the image, not the repository, so that it can say the repository is missing.
"""
from __future__ import annotations

import glob
import os
import sys
import warnings
from pathlib import Path

# wellfno/cli.py's OLDEST_TORCH (tests/test_container.py checks they agree); make test-oldest
# tests the course with 2.5.1.
OLDEST_TORCH = (2, 5)
REPO = Path(os.environ.get("WELLFNO_REPO", "/course"))
# What a program needs of the repository: the baseline, the packages' code, a step's solution.
PROGRAMS = ("fno.py", "wellfno/__init__.py", "Makefile", "solutions")
GPU_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
DEV = os.environ.get("WELLFNO_CHECK_DEV", "/dev")  # the device folder (tests point it elsewhere)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())


def gpus_on_this_node() -> tuple[str, str] | None:
    """(vendor, what says so), or None: device files first, then a GPU selection variable."""
    nvidia = sorted(glob.glob(f"{DEV}/nvidia[0-9]*"))
    if nvidia:
        return "NVIDIA", nvidia[0]
    if os.path.exists(f"{DEV}/kfd"):
        return "AMD", f"{DEV}/kfd"
    for name in GPU_VARS:
        value = os.environ.get(name, "").strip()
        # -1, NoDevFiles (Slurm's "no GPU in this step"), empty: none selected
        if value and value not in ("-1", "NoDevFiles"):
            return ("AMD" if name != "CUDA_VISIBLE_DEVICES" else "NVIDIA or AMD"), f"{name}={value}"
    return None


def problems() -> tuple[list[str], str]:
    found, seen = [], []
    missing = [p for p in PROGRAMS if not (REPO / p).exists()]
    if missing:
        found.append(
            f"the course's repository is not mounted at {REPO} ({', '.join(missing)} not found): "
            f"start the container with it bind-mounted, from the repository's folder: "
            f'podman run -v "$PWD":{REPO} ..., apptainer exec --bind "$PWD":{REPO} ..., '
            f"podman-hpc run -v \"$PWD\":{REPO} ...")
    else:
        seen.append(f"repository at {REPO}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch without numpy warns, which says nothing here
            import torch
    except Exception as e:  # noqa: BLE001 - any import failure is the same answer
        found.append(f"python {sys.executable} cannot import torch ({type(e).__name__}: {e}): "
                     f"build the image on a PyTorch image (containers/README.md)")
        return found, ""
    version = torch.__version__
    if version_tuple(version) < OLDEST_TORCH:
        oldest = ".".join(map(str, OLDEST_TORCH))
        found.append(f"the image's torch {version} is older than {oldest}, the oldest this course "
                     f"supports: rebuild on a newer PyTorch image (BASE=... containers/build.sh)")
    build = ("CUDA " + torch.version.cuda if torch.version.cuda else
             "ROCm " + torch.version.hip if getattr(torch.version, "hip", None) else "CPU-only")
    gpu = gpus_on_this_node()
    sees = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if gpu and not sees:
        vendor, evidence = gpu
        if build == "CPU-only":
            fix = (f"this image's torch is a CPU-only build: rebuild it on the site's PyTorch image "
                   f"(BASE=nvcr.io/nvidia/pytorch:... or rocm/pytorch:... containers/build.sh)")
        else:
            flag = {"NVIDIA": "--nv", "AMD": "--rocm"}.get(vendor, "--nv or --rocm")
            fix = (f"start the container with the GPU passed in: apptainer exec {flag}, "
                   f"podman-hpc run --gpu, podman run --device nvidia.com/gpu=all (CDI) or "
                   f"--device /dev/kfd --device /dev/dri (ROCm)")
        found.append(f"this node has a {vendor} GPU ({evidence}) but torch {version} ({build}) "
                     f"inside the container sees none: {fix}")
    seen.append(f"torch {version} ({build}), "
                + (f"{torch.cuda.device_count()} GPU(s)" if sees else "no GPU on this node"
                   if not gpu else "GPU not seen"))
    return found, "; ".join(seen)


def main() -> int:
    found, seen = problems()
    for line in found:
        print(f"error: {line}", file=sys.stderr)
    if found:
        return 2
    print(f"container check: ok: {seen}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
