"""A GPU's energy counter, and the energy of a training script's timed steps read from it.

The counters (each the board's energy since the driver loaded, so a measurement is the difference
of two readings):
- NVIDIA: NVML's nvmlDeviceGetTotalEnergyConsumption, through `pynvml` (the nvidia-ml-py
  package): "total energy consumption for this GPU in millijoules (mJ) since the driver was last
  reloaded. For Volta or newer fully supported devices"
  (https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html; the cuda-python
  bindings' page quotes it: cuda.bindings.nvml.device_get_total_energy_consumption). The
  readings are updated every 20-100 ms on newer GPUs (PETSc's PetscLogGpuEnergyMeter notes,
  https://petsc.org/main/manualpages/Log/PetscLogGpuEnergyMeter): a window of a second is good to
  a few percent, not better.
- AMD: amdsmi's amdsmi_get_energy_count: "energy_accumulator * counter_resolution =
  total_energy_consumption in micro-Joules" (ROCm/amdsmi, py-interface/README.md; the C API:
  https://rocm.docs.amd.com/projects/amdsmi/en/latest/doxygen/docBin/html/group__tagPowerQuery.html,
  "not supported on virtual machine guest"); before ROCm 6.4 the accumulator's key was `power`
  (deprecated there, same count).
Neither answering (a CPU, no pynvml or amdsmi, a GPU older than Volta, a VM guest): `open_counter`
says why, and the ladder's energy columns are NOT ANSWERED with that reason.

Reading the counter never stalls the training: the ladder reads it in its own process, which
runs no GPU work, while the script trains in another. The window it reads is the script's own
timed steps: each epoch's timer starts after a device synchronize (08 on; before, every step reads
the loss back) and ends after the last step's work is done on the device (the loss read back), the
interval metrics.json's history records (`seconds`, `timed_seconds`); where an epoch starts, the
ladder sees as the script's progress bar's first draw (wellfno.progress: tqdm draws its bar when
it is made, right after the timer starts), on the script's stderr as it comes.
"""
from __future__ import annotations

import os
import re
import subprocess
import threading
import time

import numpy as np

# Counter readings per second while a script trains: between two, np.interp (the counters'
# own updates, every 20-100 ms on NVML, are coarser)
SAMPLE_INTERVAL = 0.02
# the progress bar's first draw of an epoch: "epoch 3:   0%|..." (wellfno.progress, desc)
EPOCH_BAR = re.compile(rb"epoch (\d+):")


def _pci(value) -> str:
    """A PCI address as affinity.discover writes it, 0000:47:00.0 (NVML's has 8 domain digits)."""
    text = (value.decode() if isinstance(value, bytes) else str(value)).strip().lower()
    domain, bus, rest = text.split(":")
    return f"{int(domain, 16):04x}:{bus}:{rest}"


class NvmlCounter:
    """NVML's total energy of the GPU at `pci`, in joules."""

    def __init__(self, pynvml, pci: str):
        self.nvml = pynvml
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        found = [h for h in handles if _pci(pynvml.nvmlDeviceGetPciInfo(h).busId) == pci]
        if not found:
            pynvml.nvmlShutdown()
            raise LookupError(f"NVML lists no GPU at {pci}")
        self.handle = found[0]
        self.source = f"NVML nvmlDeviceGetTotalEnergyConsumption (mJ), GPU {pci}"
        self.read()  # NVMLError_NotSupported before Volta: raised here, not mid-ladder

    def read(self) -> float:
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3

    def close(self):
        self.nvml.nvmlShutdown()


class AmdSmiCounter:
    """amdsmi's energy accumulator of the GPU at `pci`, in joules."""

    def __init__(self, amdsmi, pci: str):
        self.amdsmi = amdsmi
        amdsmi.amdsmi_init()
        found = [h for h in amdsmi.amdsmi_get_processor_handles()
                 if _pci(amdsmi.amdsmi_get_gpu_device_bdf(h)) == pci]
        if not found:
            amdsmi.amdsmi_shut_down()
            raise LookupError(f"amdsmi lists no GPU at {pci}")
        self.handle = found[0]
        self.source = (f"amdsmi amdsmi_get_energy_count (accumulator x resolution, µJ), "
                       f"GPU {pci}")
        self.read()  # AMDSMI_STATUS_NOT_SUPPORTED (a VM guest): raised here

    def read(self) -> float:
        got = self.amdsmi.amdsmi_get_energy_count(self.handle)
        count = got["energy_accumulator"] if "energy_accumulator" in got else got["power"]
        return count * got["counter_resolution"] / 1e6

    def close(self):
        self.amdsmi.amdsmi_shut_down()


def open_counter(torch, device) -> tuple[object | None, str]:
    """(the energy counter of `device`, its source), or (None, why none answers)."""
    if device.type != "cuda":
        return None, "no GPU: the energy counters are a GPU's (NVML, amdsmi)"
    from affinity.discover import visible_gpu_pci

    pci = visible_gpu_pci(torch)[device.index or 0]
    if pci is None:
        return None, "torch gives no PCI address of the GPU, so no NVML or amdsmi device to read"
    tried = []
    hip = getattr(torch.version, "hip", None)
    for module, counter in (("amdsmi", AmdSmiCounter), ("pynvml", NvmlCounter)) if hip else \
            (("pynvml", NvmlCounter), ("amdsmi", AmdSmiCounter)):
        try:
            found = counter(__import__(module), pci)
        except Exception as err:  # noqa: BLE001 - not there, not supported: the next, then why
            tried.append(f"{module}: {type(err).__name__}: {err}".rstrip(": "))
            continue
        return found, found.source
    return None, "no energy counter answers (" + "; ".join(tried) + ")"


class Trace:
    """The counter read every SAMPLE_INTERVAL s in a thread: (monotonic time, joules)."""

    def __init__(self, counter, interval: float = SAMPLE_INTERVAL):
        self.counter, self.interval = counter, interval
        self.times: list[float] = []
        self.joules: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self):
        before = time.monotonic()
        self.joules.append(self.counter.read())
        self.times.append((before + time.monotonic()) / 2)  # the reading's moment, within µs

    def _loop(self):
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self):
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()

    def between(self, start: float, end: float) -> float:
        """Joules used from `start` to `end` (monotonic times inside the trace)."""
        if start < self.times[0] or end > self.times[-1]:
            raise ValueError("the window is outside the readings")
        got = np.interp([start, end], self.times, self.joules)
        return float(got[1] - got[0])


def run_watched(cmd: list[str], timeout: float, cwd, env=None) -> tuple[int, str, dict]:
    """Run `cmd` as subprocess.run would (its exit code, its stderr), and note when each epoch's
    progress bar first appeared on its stderr: {epoch: monotonic time}. TimeoutExpired after
    `timeout` s, the process killed."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    chunks, opened = [], {}

    def watch():
        tail = b""
        while True:
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                return
            seen = time.monotonic()
            chunks.append(chunk)
            for m in EPOCH_BAR.finditer(tail + chunk):  # a bar split across two reads too
                opened.setdefault(int(m.group(1)), seen)
            tail = chunk[-32:]

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    finally:
        reader.join(timeout=30)  # a killed script's DataLoader workers end within seconds
        proc.stderr.close()
    return proc.returncode, b"".join(chunks).decode(errors="replace"), opened


def timed_energy(trace: Trace, opened: dict, history: list[dict]) -> dict:
    """The energy of a run's timed steps: each epoch's window, [its start + (seconds -
    timed_seconds), its start + seconds], from the trace; J per timed sample and mean W."""
    joules = seconds = samples = 0.0
    for row in history:
        if not row.get("timed_samples"):
            continue
        if row["epoch"] not in opened:
            raise LookupError(f"epoch {row['epoch']}'s progress bar never showed on stderr, so "
                              "where its timed steps were is unknown")
        end = opened[row["epoch"]] + row["seconds"]
        joules += trace.between(end - row["timed_seconds"], end)
        seconds += row["timed_seconds"]
        samples += row["timed_samples"]
    if not samples:
        raise LookupError("the run timed no step (too short to leave its start-up out)")
    return {"joules": joules, "timed_seconds": seconds, "timed_samples": int(samples),
            "joules_per_sample": joules / samples, "mean_watts": joules / seconds}
