"""Our plans equal torch's own rule (torch/numa/binding.py, what `torchrun --numa-binding` runs).

torch.numa.binding reads /sys through open()/os.listdir and asks torch.cuda for the GPUs'
PCI addresses. We run its real functions on a fixture tree by giving the module an `open` and an
`os` that redirect /sys/... to the fixture, and a `torch.cuda` that reports the fixture's GPUs
(their sysfs numa_node files are still read by torch's code). Nothing of torch is reimplemented.
"""
from __future__ import annotations

import os
from inspect import signature
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]

from tests.fixtures import make_sysfs
from affinity.discover import discover, parse_cpulist
from affinity.plan import make_plan

binding = pytest.importorskip("torch.numa.binding")
FIXTURES = REPO / "tests" / "fixtures" / "sysfs"


def torch_cpus(monkeypatch, root: Path, allowed: set[int], gpu_pcis: list[str], mode: str) -> list[set[int]]:
    real_open = open

    def redirect(path):
        path = os.fspath(path)
        return str(root / path[len("/sys/"):]) if path.startswith("/sys/") else path

    monkeypatch.setattr(binding, "open", lambda p, *a, **k: real_open(redirect(p), *a, **k), raising=False)
    monkeypatch.setattr(binding, "os", SimpleNamespace(listdir=lambda p: os.listdir(redirect(p)), path=os.path,
                                                       sched_getaffinity=lambda pid: set(allowed)))
    props = []
    for pci in gpu_pcis:
        domain, bus, devfn = pci.split(":")
        props.append(SimpleNamespace(pci_domain_id=int(domain, 16), pci_bus_id=int(bus, 16),
                                     pci_device_id=int(devfn.split(".")[0], 16)))
    fake_cuda = SimpleNamespace(device_count=lambda: len(props), get_device_properties=lambda i: props[i])
    # torch up to 2.13 asks torch.cuda; 2.14 torch.accelerator, then the device module it names
    # (torch/numa/binding.py, _get_device_count, _get_numa_node_index_for_device_index)
    fake_accelerator = SimpleNamespace(device_count=lambda: len(props), is_available=lambda: True,
                                       current_accelerator=lambda: "cuda")
    monkeypatch.setattr(binding, "torch", SimpleNamespace(cuda=fake_cuda, accelerator=fake_accelerator,
                                                          get_device_module=lambda device: fake_cuda))
    options = binding.NumaOptions(affinity_mode=binding.AffinityMode(mode))
    # The keyword of the GPU's index: gpu_index up to torch 2.13, device_index from 2.14 on
    index = "device_index" if "device_index" in signature(binding._get_logical_cpus_to_bind_to).parameters \
        else "gpu_index"
    return [set(binding._get_logical_cpus_to_bind_to(**{index: i}, numa_options=options)) for i in range(len(props))]


CASES = [
    # (fixture or variant, allowed CPUs, GPUs visible to the job)
    ("dgx-a100", "0-255", None),
    ("dgx-a100", "48-63,176-191", [0, 1]),     # a job with 2 GPUs and their NUMA node
    ("dgx-a100", "48-60,176-188", [0, 1]),     # 13 cores: remainder goes to the lower GPU
    ("dgx-a100", "48-63", [0, 1]),             # no SMT siblings allowed
    ("dgx-a100", "16-31,48-63", [0, 1, 2, 3]),
    ("mi300a", "0-191", None),
    ("mi300a", "1-23,97-119,24-47", [0, 1]),   # a reserved OS core on APU 0
    ("lumi-g", "1-7,9-15,17-23,25-31,33-39,41-47,49-55,57-63,65-71,73-79,81-87,89-95,97-103,105-111,"
               "113-119,121-127", None),       # low-noise mode: first core of each CCD reserved
    ("dgx-a100-smt-off-bios", "0-127", None),
    ("mi300a-smt-off-runtime", "0-95", None),
]


@pytest.fixture(scope="module")
def variant_root(tmp_path_factory):
    out = tmp_path_factory.mktemp("sysfs")
    return {name: make_sysfs.write_tree(spec, out / name) for name, spec in make_sysfs.VARIANTS.items()}


@pytest.mark.parametrize("mode", ["exclusive", "node", "core-complex"])
@pytest.mark.parametrize("node, allowed, gpus", CASES)
def test_plan_equals_torch_numa_binding(monkeypatch, variant_root, node, allowed, gpus, mode):
    root = variant_root.get(node, FIXTURES / node)
    allowed_set = parse_cpulist(allowed)
    topo = discover(root, allowed_set)
    ours = make_plan(topo, mode, gpus=gpus)
    visible = [a.gpu.pci for a in ours]  # what CUDA_VISIBLE_DEVICES would leave torch
    theirs = torch_cpus(monkeypatch, root, allowed_set, visible, mode)
    assert [set(a.cpus) for a in ours] == theirs
