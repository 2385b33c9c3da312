"""Test seam: gloo on the CPU, with NCCL's handling of complex tensors (tests/test_nccl_seam.py).

Python imports `sitecustomize` from PYTHONPATH when it starts; the tests put this folder first on
the PYTHONPATH of the ranks they start, and only there. It registers the backend `nccllike`
(tests/nccl_seam/nccl_like.py) and makes every process group the program asks for with gloo
(`init_process_group("gloo")`, `new_group()` under it) a `nccllike` one. It changes nothing else.
"""
try:  # the suite's garbage collector thresholds (tests/startup): this file stands in for that one
    import suite_gc

    suite_gc.apply()
except ImportError:  # started without tests/startup on PYTHONPATH
    pass

try:
    import nccl_like

    nccl_like.install()
except ImportError:  # a process without torch (a launcher's helper in a bare venv): nothing to do
    pass
