"""coursetools.energy, the ladder's energy columns, on the CPU: stand-in counters (a pynvml and
an amdsmi module written here, on the path, answering as their documented calls do), and a real
training script whose timed steps the ladder finds on its stderr. No GPU number is made up: the
stand-ins' readings are the tests' own, and nothing here is rendered as a GPU's."""
from __future__ import annotations

import json
import sys
import time
import types

import pytest
import torch

from coursetools import day0, energy
from tests.conftest import REPO

PCI = "0000:47:00.0"
# NVML's busId has eight domain digits (nvmlPciInfo_t); the second GPU is another one
FAKE_PYNVML = """\
import types
READINGS = iter({readings})  # nvmlDeviceGetTotalEnergyConsumption's, in mJ
BUS_IDS = [b"00000000:0B:00.0", b"00000000:47:00.0"]
calls = []

class NVMLError_NotSupported(Exception):
    pass

def nvmlInit():
    calls.append("init")

def nvmlShutdown():
    calls.append("shutdown")

def nvmlDeviceGetCount():
    return len(BUS_IDS)

def nvmlDeviceGetHandleByIndex(i):
    return i

def nvmlDeviceGetPciInfo(handle):
    return types.SimpleNamespace(busId=BUS_IDS[handle])

def nvmlDeviceGetTotalEnergyConsumption(handle):
    calls.append(("energy", handle))
    if {not_supported}:
        raise NVMLError_NotSupported("Not Supported")
    return next(READINGS)
"""
FAKE_AMDSMI = """\
READINGS = iter({readings})  # the accumulator's counts
def amdsmi_init(): pass
def amdsmi_shut_down(): pass
def amdsmi_get_processor_handles(): return ["h0", "h1"]
def amdsmi_get_gpu_device_bdf(handle): return {{"h0": "0000:47:00.0", "h1": "0000:0b:00.0"}}[handle]
def amdsmi_get_energy_count(handle):
    assert handle == "h0"
    return {{"{key}": next(READINGS), "counter_resolution": 15.3, "timestamp": 0}}
"""


def _one_gpu(hip=None):
    """torch as it looks on a one-GPU node, for open_counter (its PCI address: PCI)."""
    props = types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x47, pci_device_id=0)
    return types.SimpleNamespace(
        version=types.SimpleNamespace(hip=hip),
        cuda=types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1,
                                   get_device_properties=lambda i: props))


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write stand-in counter modules onto the path; none there: their import fails."""
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("pynvml", "amdsmi"):
        monkeypatch.setitem(sys.modules, name, None)  # `import` of it raises ImportError

    def write(name, text):
        (tmp_path / f"{name}.py").write_text(text)
        monkeypatch.delitem(sys.modules, name)
    return write


def test_nvml_reads_millijoules_of_the_gpu_at_its_pci_address(modules):
    modules("pynvml", FAKE_PYNVML.format(readings=[5_000_000, 5_000_250, 5_012_750],
                                         not_supported=False))
    counter, source = energy.open_counter(_one_gpu(), torch.device("cuda", 0))
    assert source == f"NVML nvmlDeviceGetTotalEnergyConsumption (mJ), GPU {PCI}"
    assert counter.read() == 5000.25 and counter.read() == 5012.75  # J (the first: the probe)
    counter.close()
    import pynvml

    assert pynvml.calls[0] == "init" and pynvml.calls[-1] == "shutdown"
    assert {c[1] for c in pynvml.calls if isinstance(c, tuple)} == {1}  # the GPU at 47:00.0


def test_amdsmi_reads_its_accumulator_times_its_resolution(modules):
    """energy_accumulator x counter_resolution is µJ (ROCm 6.4 on); before, the key was power."""
    for key in ("energy_accumulator", "power"):
        modules("amdsmi", FAKE_AMDSMI.format(readings=[0, 2_000_000], key=key))
        counter, source = energy.open_counter(_one_gpu(hip="6.2"), torch.device("cuda", 0))
        assert source.startswith("amdsmi amdsmi_get_energy_count") and PCI in source
        assert counter.read() == pytest.approx(2_000_000 * 15.3 / 1e6)


def test_no_counter_is_not_answered_with_why(modules):
    """A GPU before Volta (NVML: not supported), no pynvml or amdsmi, a CPU: why, no number."""
    modules("pynvml", FAKE_PYNVML.format(readings=[], not_supported=True))
    counter, why = energy.open_counter(_one_gpu(), torch.device("cuda", 0))
    assert counter is None and "pynvml: NVMLError_NotSupported: Not Supported" in why
    assert "amdsmi: ModuleNotFoundError" in why
    assert energy.open_counter(torch, torch.device("cpu")) == (
        None, "no GPU: the energy counters are a GPU's (NVML, amdsmi)")


class Constant:
    """A counter of a board drawing `watts` all along: joules = watts x time."""

    def __init__(self, watts):
        self.watts = watts

    def read(self):
        return self.watts * time.monotonic()


def test_the_energy_of_a_scripts_timed_steps(tiny_data_dir, tmp_path):
    """fno.py trained for a few steps, its stderr watched: each epoch's timed window is found
    (its bar's first draw + the history's seconds), inside the run, and the stand-in's 250 W
    over it is the metrics' timed seconds x 250 J, per timed sample."""
    cmd = [sys.executable, str(REPO / "fno.py"), "--data-dir", str(tiny_data_dir), "--out",
           str(tmp_path / "run"), "--epochs", "2", "--batch-size", "4", "--seed", "0"]
    before = time.monotonic()
    with energy.Trace(Constant(250.0)) as trace:
        rc, stderr, opened = energy.run_watched(cmd, 300, REPO)
    assert rc == 0, stderr[-2000:]
    history = json.loads((tmp_path / "run" / "metrics.json").read_text())["history"]
    assert sorted(opened) == [row["epoch"] for row in history] == [1, 2]
    assert all(before < opened[r["epoch"]] and opened[r["epoch"]] + r["seconds"]
               < trace.times[-1] for r in history)
    assert opened[1] + history[0]["seconds"] < opened[2]  # epoch 2 starts after 1 ends
    got = energy.timed_energy(trace, opened, history)
    seconds = sum(r["timed_seconds"] for r in history)
    samples = sum(r["timed_samples"] for r in history)
    assert got["timed_seconds"] == seconds and got["timed_samples"] == samples
    assert got["mean_watts"] == pytest.approx(250.0, rel=1e-4)
    assert got["joules_per_sample"] == pytest.approx(250.0 * seconds / samples, rel=1e-4)
    with pytest.raises(LookupError, match="epoch 3's progress bar never showed"):
        energy.timed_energy(trace, opened, history + [{**history[0], "epoch": 3}])


def _row(name, jps=None, watts=None, why=None):
    return {"row": name, "against": None, "speedup_of": "samples/s", "speedup": None,
            "skipped": None, "samples_per_s": 100.0, "achieved_flops_per_s": 1e9, "mfu": 0.1,
            "peak_precision": "bf16", "peak_memory_bytes": None, "compile_seconds": None,
            "joules_per_sample": jps, "mean_watts": watts,
            "energy": {"not_answered": why} if why else {"joules_per_sample": jps}}


def test_the_ladder_table_shows_joules_per_sample_and_mean_watts():
    result = {"rows": [_row("fno.py", 0.512, 301.4), _row("02 data pipeline", why="no bar")],
              "energy": {"source": f"NVML nvmlDeviceGetTotalEnergyConsumption (mJ), GPU {PCI}"}}
    text = day0.ladder_markdown(result)
    lines = text.splitlines()
    assert lines[0].endswith("| compile (s) | J/sample | mean W |")
    assert lines[1].endswith("---:|---:|")
    assert lines[2].endswith("| - | 0.512 | 301 |") and lines[3].endswith("| - | - | - |")
    assert lines[-1] == ("Energy of each row's timed steps: NVML "
                         f"nvmlDeviceGetTotalEnergyConsumption (mJ), GPU {PCI}; NOT ANSWERED for "
                         "02 data pipeline: no bar.")
    assert "0.512 J/sample at 301 W" in day0.ladder_row_text(result["rows"][0])
    none = day0.ladder_markdown({"rows": [_row("fno.py")], "energy": {"not_answered": "no GPU"}})
    assert none.splitlines()[-1] == "Energy: NOT ANSWERED (no GPU)."
    old = {"rows": [_row("fno.py")]}  # a ladder.json from before the energy columns
    assert "J/sample" not in day0.ladder_markdown(old)
