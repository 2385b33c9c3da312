"""CPU/GPU affinity toolkit: discover the node, plan CPUs per rank, bind, report.

Plain Python over sysfs (no hwloc, no vendor library), so the same code reads an
NVIDIA node, an AMD APU node, a laptop, or a fake sysfs tree under tests/fixtures.

    from affinity import bind_this_rank, worker_init_fn, report_line
    cpus, device = bind_this_rank(mode="exclusive")
    loader = DataLoader(ds, num_workers=4, worker_init_fn=worker_init_fn(cpus))
    print(report_line(device=device))

Layers (each imports only those above it): discover (hardware) -> plan (CPU sets) ->
placement (the report line) -> bind (pin ranks and workers) -> report (script).
Scripts (run from the repository root): affinity/discover.py, affinity/plan.py,
affinity/report.py, affinity/benchmark.py.
"""
from affinity.discover import Gpu, Topology, discover, format_cpulist, parse_cpulist, visible_gpu_pci
from affinity.plan import MODES, Assignment, RankBinding, device_index_for, make_plan, plan_this_rank
from affinity.placement import WorkerReport, report_line
from affinity.bind import bind_this_rank, worker_init_fn

__all__ = [
    "Gpu", "Topology", "discover", "format_cpulist", "parse_cpulist", "visible_gpu_pci",
    "MODES", "Assignment", "RankBinding", "device_index_for", "make_plan", "plan_this_rank",
    "WorkerReport", "report_line",
    "bind_this_rank", "worker_init_fn",
]
