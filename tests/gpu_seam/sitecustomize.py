"""TEST ONLY: torch on the Slurm test cluster's stand-in GPUs (tests/test_slurm_gpus.py).

Put on PYTHONPATH by that test (never by production code). Python imports this file at start-up
in every process of a job; when (and only when) the process imports torch, torch is patched to
report the GPUs Slurm made visible to this task, with the vendor runtime's rules:
  NVIDIA: CUDA_VISIBLE_DEVICES lists node GPU numbers (the test cluster constrains no devices).
  AMD:    ROCR_VISIBLE_DEVICES picks node GPUs, then HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES
          index into what ROCR left (HIP reads both), so a doubled filter shows up as missing GPUs.
  Unset:  every GPU of the node. An index past the end ends the list (as both runtimes do).
Each GPU reports the PCI address of the recorded node it stands for (WELLFNO_GPU_SEAM_PCI, in
node GPU order). nccl runs as gloo; the first device work (a tensor or module sent to a GPU,
torch.cuda.synchronize, memory statistics...) stops the process with exit 0 after the ranks of
the process group met, so the real program's launcher, rank, device and backend choices run and
nothing needs a GPU. Every process writes what it chose to WELLFNO_GPU_SEAM/<job>-<id>.<step>-
<rank>-<pid>.json (at that stop, or at exit).
"""
try:  # the suite's garbage collector thresholds (tests/startup): this file stands in for that one
    import suite_gc

    suite_gc.apply()
except ImportError:  # started without tests/startup on PYTHONPATH
    pass

import atexit
import importlib.abc
import importlib.util
import json
import os
import sys

_OUT = os.environ.get("WELLFNO_GPU_SEAM", "")
_VENDOR = os.environ.get("GPU_VENDOR", "none")
_RECORD = {"argv": sys.argv, "events": []}


def _index_list(value, limit):
    """A *_VISIBLE_DEVICES value as positions, up to the first invalid one."""
    out = []
    for part in value.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) >= limit:
            break
        out.append(int(part))
    return out


def visible_node_gpus(env, node_gpus):
    """Node GPU numbers this process sees, in torch device order."""
    gpus = list(range(node_gpus))
    if _VENDOR == "amd":
        filters = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    else:
        filters = ("CUDA_VISIBLE_DEVICES",)
    for var in filters:
        if env.get(var) is not None:
            gpus = [gpus[i] for i in _index_list(env[var], len(gpus))]
    return gpus


def _write(stopped_at=None):
    if stopped_at is not None:
        _RECORD["device_work"] = stopped_at
    env = os.environ
    _RECORD["cpus"] = sorted(os.sched_getaffinity(0))
    _RECORD["env"] = {k: v for k, v in env.items()
                      if k.startswith(("SLURM_", "CUDA_", "ROCR_", "HIP_"))
                      or k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GPU_VENDOR",
                               "SLURMD_NODENAME")}
    rank = env.get("RANK") or env.get("SLURM_PROCID", "0")
    name = (f"{env.get('SLURM_JOB_NAME', 'local')}-{env.get('SLURM_JOB_ID', '0')}."
            f"{env.get('SLURM_STEP_ID', 'x')}-{rank}-{os.getpid()}.json")
    os.makedirs(_OUT, exist_ok=True)
    tmp = os.path.join(_OUT, "." + name)
    with open(tmp, "w") as f:
        json.dump(_RECORD, f)
    os.replace(tmp, os.path.join(_OUT, name))


def _patch(torch):
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.overrides import TorchFunctionMode

    pcis = [p for p in os.environ.get("WELLFNO_GPU_SEAM_PCI", "").split(",") if p]
    visible = visible_node_gpus(os.environ, len(pcis))
    _RECORD["visible"] = visible
    state = {"current": 0}

    def check(i):
        i = torch.device(i).index if not isinstance(i, int) else i
        i = state["current"] if i is None else i
        if not 0 <= i < len(visible):
            raise RuntimeError(f"CUDA error: invalid device ordinal {i} "
                               f"(seam: {len(visible)} visible)")
        return i

    def props(i=None):
        g = visible[check(state["current"] if i is None else i)]
        domain, bus, devfn = pcis[g].split(":")
        return SimpleNamespace(name=f"stand-in GPU {g}", total_memory=80 << 30, major=8, minor=0,
                               multi_processor_count=108, uuid=f"GPU-standin-{g}",
                               pci_domain_id=int(domain, 16), pci_bus_id=int(bus, 16),
                               pci_device_id=int(devfn.split(".")[0], 16))

    def set_device(d):
        state["current"] = check(d)
        _RECORD["events"].append({"set_device": state["current"], "gpu": visible[state["current"]]})

    def stop(what, device=None):
        index = state["current"] if device is None else check(device)
        _write({"call": what, "index": index, "gpu": visible[index] if visible else None,
                "pci": pcis[visible[index]] if visible else None})
        if dist.is_initialized():
            try:
                dist.barrier()  # every rank reached its device work: none is left waiting
            except Exception:  # noqa: BLE001 - a rank that failed already said why
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    cuda = torch.cuda
    cuda.is_available = lambda: bool(visible)
    cuda.device_count = lambda: len(visible)
    cuda.get_device_properties = props
    cuda.get_device_name = lambda i=None: props(i).name
    cuda.get_device_capability = lambda i=None: (8, 0)
    cuda.set_device = set_device
    cuda.current_device = lambda: state["current"]
    cuda.is_bf16_supported = lambda *a, **k: True
    for name in ("synchronize", "memory_allocated", "max_memory_allocated", "memory_reserved",
                 "reset_peak_memory_stats", "mem_get_info", "empty_cache", "Event", "Stream"):
        setattr(cuda, name, lambda *a, _name=name, **k: stop(f"torch.cuda.{_name}"))

    real_init = dist.init_process_group

    def init_process_group(backend=None, *args, **kwargs):
        _RECORD["backend"] = str(backend)
        if backend is not None and "nccl" in str(backend):
            backend = "gloo"
            kwargs.pop("device_id", None)  # gloo is bound to no GPU
        _RECORD["events"].append({"init_process_group": str(_RECORD["backend"]), "ran_as": backend})
        return real_init(backend, *args, **kwargs)

    dist.init_process_group = init_process_group

    def cuda_target(values):
        for v in values:
            if isinstance(v, torch.device) and v.type == "cuda":
                return v
            if isinstance(v, str) and v.startswith("cuda"):
                return torch.device(v)
        return None

    class StopAtDeviceWork(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", str(func))
            if name == "device":  # torch.device("cuda", i) names a GPU, it does no work
                return func(*args, **kwargs)
            target = cuda_target(list(args) + list(kwargs.values()))
            if target is not None or name == "cuda":
                stop(name, target)
            return func(*args, **kwargs)

    StopAtDeviceWork().__enter__()  # for the rest of the process (main thread)


class _PatchTorchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if _OUT and _VENDOR in ("nvidia", "amd"):
    sys.meta_path.insert(0, _PatchTorchOnImport())
    atexit.register(_write)
