"""What machine a number was measured on: every benchmark prints it next to its results."""
from __future__ import annotations

import platform

from wellfno.flops import cpu_model  # noqa: F401 (the tools print it; flops needs it for the CPU's peak)


def machine_info(device=None) -> dict:
    """What a results file says about where it was measured: CPU, cores, load, torch, GPU."""
    import os

    import torch

    info = {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "torch_threads": torch.get_num_threads()}
    try:
        info["load_average"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    if torch.cuda.is_available():
        index = device.index if device is not None and getattr(device, "index", None) is not None else 0
        info["gpu"] = torch.cuda.get_device_name(index)
        info["gpu_count"] = torch.cuda.device_count()
        info["hip"] = getattr(torch.version, "hip", None)
        info["cuda"] = torch.version.cuda
    return info


def describe(info: dict) -> str:
    """One line naming a results file's machine: 'AMD EPYC 7B13, 2 cores, torch 2.13.0+cpu, no GPU'."""
    gpu = info.get("gpu") or "no GPU"
    load = f", load average {info['load_average']}" if "load_average" in info else ""
    threads = f" ({info['torch_threads']} thread{'s' if info['torch_threads'] != 1 else ''})" if "torch_threads" in info else ""
    return (f"{info.get('cpu', 'unknown CPU')}, {info.get('cores', '?')} cores, torch {info.get('torch', '?')}{threads}, "
            f"{gpu}{load}")
