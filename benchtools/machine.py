"""What machine a number was measured on: every benchmark prints it next to its results."""
from __future__ import annotations

import os
import platform

from wellfno.flops import cpu_model  # noqa: F401 (the tools print it; flops needs it for the CPU's peak)


def load_average() -> float | None:
    """The 1-minute load average: runnable processes, averaged (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):  # Windows has no getloadavg
        return None


def cpus() -> int:
    """Every CPU of the machine: the load average counts the processes of the whole machine."""
    return os.cpu_count() or 1


def busy_warning(load: float | None, when: str, cpus_here: int | None = None) -> str | None:
    """One line when more processes wanted a CPU than there are CPUs (the numbers then include
    other work's), else None."""
    cpus_here = cpus_here or cpus()
    if load is None or load <= cpus_here:
        return None
    return (f"warning: the machine is busy {when}: load average {load:.1f} above its {cpus_here} "
            f"CPUs, so other work's noise is in these numbers; measure again when it is idle")


def machine_info(device=None) -> dict:
    """What a results file says about where it was measured: CPU, cores, load, torch, GPU."""
    import torch

    info = {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "torch_threads": torch.get_num_threads()}
    load = load_average()
    if load is not None:
        info["load_average"] = load  # when the file is written: the end of the measurement
    if torch.cuda.is_available():
        index = device.index if device is not None and getattr(device, "index", None) is not None else 0
        info["gpu"] = torch.cuda.get_device_name(index)
        info["gpu_count"] = torch.cuda.device_count()
        info["hip"] = getattr(torch.version, "hip", None)
        info["cuda"] = torch.version.cuda
    return info


def describe(info: dict) -> str:
    """One line naming a results file's machine: 'AMD EPYC 7B13, 2 cores, torch 2.13.0+cpu, no GPU'
    (and the load average: at the start and the end where both were recorded)."""
    gpu = info.get("gpu") or "no GPU"
    load = ""
    if "load_average_at_start" in info and "load_average" in info:
        load = (f", load average {info['load_average_at_start']} at the start, "
                f"{info['load_average']} at the end")
    elif "load_average" in info:
        load = f", load average {info['load_average']}"
    threads = (f" ({info['torch_threads']} thread{'s' if info['torch_threads'] != 1 else ''})"
               if "torch_threads" in info else "")
    return (f"{info.get('cpu', 'unknown CPU')}, {info.get('cores', '?')} cores, "
            f"torch {info.get('torch', '?')}{threads}, {gpu}{load}")
