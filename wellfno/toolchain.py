"""Is the toolchain a feature needs there? One `error:` line saying what to install, no traceback.

`check_compiler`: torch.compile's inductor writes C++ kernels on the CPU and Triton kernels on a
GPU (solution 11's --compile).
"""
from __future__ import annotations

import importlib.util
import os
import shutil

import torch

from wellfno.cli import UserError


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
