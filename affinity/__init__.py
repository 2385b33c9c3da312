"""CPU/GPU affinity toolkit: discover the node, plan CPUs per rank, bind, report.

Plain Python over sysfs (no hwloc, no vendor library), so the same code reads an
NVIDIA node, an AMD APU node, a laptop, or a fake sysfs tree under tests/fixtures.

    from affinity import bind_this_rank, pin_worker, report_line
    cpus, device = bind_this_rank(mode="exclusive")
    loader = DataLoader(ds, num_workers=4, worker_init_fn=pin_worker(cpus))
    print(report_line(device=device))

Scripts (run from the repository root): affinity/discover.py, affinity/plan.py,
affinity/report.py, affinity/benchmark.py.
"""
from affinity.discover import Gpu, Topology, discover, format_cpulist, parse_cpulist
from affinity.plan import MODES, Assignment, make_plan
from affinity.bind import bind_this_rank, pin_worker
from affinity.report import report_line

__all__ = [
    "Gpu", "Topology", "discover", "format_cpulist", "parse_cpulist",
    "MODES", "Assignment", "make_plan",
    "bind_this_rank", "pin_worker", "report_line",
]
