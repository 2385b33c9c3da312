"""TEST ONLY: torch.cpu.get_capabilities() names the bf16 units of a recorded CPU, not this one's.

Put on PYTHONPATH by tests (tests/test_09_mixed_precision.py: `as_cpu`; never by production code),
with WELLFNO_CPU_SEAM_FLAGS set to a recorded CPU's /proc/cpuinfo flags (tests/fixtures/cpuinfo.py).
Python imports this file at start-up; when the process imports torch, the capabilities that name
bf16 units (wellfno.amp.CPU_BF16_UNITS) become the recorded CPU's, and every other capability stays
this machine's (so nothing picks instructions this machine lacks). The bf16 check of the real
script then runs as on the recorded CPU; the arithmetic is this machine's (oneDNN detects the CPU
itself), which is the same rounding, emulated or not.
"""
try:  # the suite's garbage collector thresholds (tests/startup): this file stands in for that one
    import suite_gc

    suite_gc.apply()
except ImportError:  # started without tests/startup on PYTHONPATH
    pass

import importlib.abc
import importlib.util
import os
import sys

_FLAGS = set(os.environ.get("WELLFNO_CPU_SEAM_FLAGS", "").split())
_BF16_NAMES = ("avx512_bf16", "amx_bf16", "bf16", "svebf16", "sve_bf16")  # wellfno.amp's keys


def _patch(torch):
    real = getattr(torch.cpu, "get_capabilities", dict)  # none in torch 2.5: added here

    def get_capabilities():
        return {**real(), **{name: name in _FLAGS for name in _BF16_NAMES}}

    torch.cpu.get_capabilities = get_capabilities


class _PatchTorchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if "WELLFNO_CPU_SEAM_FLAGS" in os.environ:
    sys.meta_path.insert(0, _PatchTorchOnImport())
