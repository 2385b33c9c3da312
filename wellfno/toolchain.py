"""Is the toolchain a feature needs there? One `error:` line saying what to install, no traceback.

`check_compiler`: torch.compile's inductor writes C++ kernels on the CPU and Triton kernels on a
GPU (solution 11's --compile). `torch_lines`: which torch this environment has and whether the
course supports it - the environment check, one command on a login or compute node:

    .venv/bin/python -m wellfno.toolchain
"""
from __future__ import annotations

import importlib.util
import os
import shutil

import torch

from wellfno.cli import OLDEST_TORCH, UserError, run_main, torch_version

# The torch the course pins (the Makefile's TORCH_SPEC) and the oldest it is tested with (CI's
# second leg, make test-oldest: the Makefile's OLDEST_TORCH_SPEC); every step runs on both.
PINNED_TORCH = "2.13.0"
OLDEST_TESTED = "2.5.1"


def check_compiler(device: torch.device) -> None:
    """torch.compile's inductor writes C++ (CPU) or Triton (GPU) kernels: is the toolchain there?"""
    if device.type == "cpu":
        cxx = os.environ.get("CXX", "g++")
        if not (shutil.which(cxx) or shutil.which("clang++")):
            raise UserError(f"--compile on the CPU needs a C++ compiler ({cxx} or clang++) and "
                            "there is "
                            f"none on PATH: install one (e.g. apt install g++) or run without "
                            f"--compile")
    elif importlib.util.find_spec("triton") is None:
        raise UserError("--compile on a GPU needs Triton (pip install triton; ROCm: "
                        "pytorch-triton-rocm), "
                        "which this torch lacks: install it or run without --compile")
    elif not host_c_compiler():
        raise UserError("--compile on a GPU needs a host C compiler for Triton (gcc or clang on "
                        "PATH, or CC) and there is none: install one (e.g. apt install gcc, or "
                        "module load gcc) or run without --compile")


def host_c_compiler() -> str | None:
    """The C compiler Triton builds its kernel launchers with, found as Triton finds it: $CC,
    else gcc, else clang on PATH (python/triton/runtime/build.py in triton-lang/triton, which
    otherwise fails at the first kernel: "Failed to find C compiler. Please specify via CC
    environment variable.")."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return shutil.which("gcc") or shutil.which("clang")


def torch_lines(version: str, cuda: str | None, hip: str | None, gpus: int, where: str) -> list[str]:
    """What the environment check prints: the torch, its build, the GPUs it sees, and whether the
    course supports it (every step runs from OLDEST_TORCH on; below it none: run_main refuses)."""
    build = f"ROCm/HIP {hip}" if hip else f"CUDA {cuda}" if cuda else "CPU only"
    lines = [f"torch {version} ({build}) from {where}; GPUs torch sees: {gpus}"]
    oldest = ".".join(map(str, OLDEST_TORCH))
    if torch_version(version) < OLDEST_TORCH:
        lines.append(f"NOT SUPPORTED: older than {oldest}, the oldest the course supports: no step "
                     "runs (each stops with one error line). Load a newer PyTorch module or "
                     f"container, or make venv VENV=.venv-new TORCH_SPEC=torch=={PINNED_TORCH}")
    elif torch_version(version) > torch_version(PINNED_TORCH):
        lines.append(f"supported (from {oldest} on); newer than the course's tests ({OLDEST_TESTED} "
                     f"and {PINNED_TORCH}): every step should run, run make test-fast to see")
    else:
        lines.append(f"supported: every step runs from {oldest} on (tested with {OLDEST_TESTED} "
                     f"and {PINNED_TORCH})")
    if not gpus:
        lines.append("no GPU visible here: fine on a login node or a laptop (every step runs on "
                     "the CPU); on a GPU node check the job's --gpus options and that this is a "
                     "CUDA or ROCm build of torch")
    return lines


def main(argv=None) -> None:
    import argparse
    import sys

    argparse.ArgumentParser(description="The environment check: which torch this Python has, "
                            "and whether the course supports it.").parse_args(argv)
    print(f"python {sys.version.split()[0]} in {sys.prefix}")
    for line in torch_lines(torch.__version__, torch.version.cuda, torch.version.hip,
                            torch.cuda.device_count() if torch.cuda.is_available() else 0,
                            os.path.dirname(torch.__file__)):
        print(line)


if __name__ == "__main__":
    run_main(main)
