"""Test probe for tests/test_05_ddp.py, loaded at start-up by every rank a test launches.

Python imports `sitecustomize` from PYTHONPATH when it starts; the tests put this folder first on
the PYTHONPATH of the ranks they start (torchrun and its workers too), and only when asked:
- WELLFNO_PROBE_LOG=DIR: each process appends to DIR/<rank>.<pid>.log one line per dataset item
  a DataLoader reads ("train 17", "valid 3"; a script looking at one sample itself, e.g. for its
  shape, is not training on it), per rollout trajectory ("rollout 1") and per file it writes
  ("write /path") - which samples each rank used, and which rank wrote what;
- WELLFNO_PROBE_FAIL=RANK:N:raise|die: that rank raises (or is killed by SIGKILL) at its N-th
  training sample - a failing rank, on demand.
It changes nothing else. Not a way to import project code (the project is installed).
"""
try:  # the suite's garbage collector thresholds (tests/startup): this file stands in for that one
    import suite_gc

    suite_gc.apply()
except ImportError:  # started without tests/startup on PYTHONPATH
    pass

import os
import sys

_LOG = os.environ.get("WELLFNO_PROBE_LOG")
_FAIL = os.environ.get("WELLFNO_PROBE_FAIL")
_RANK = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"


def _install():
    import builtins
    import signal

    from the_well.data.datasets import WellDataset

    log_path = os.path.join(_LOG, f"{_RANK}.{os.getpid()}.log") if _LOG else None
    fail_rank, fail_at, fail_mode = (_FAIL.split(":") + ["", "", ""])[:3] if _FAIL else ("", "0", "")
    counts = {"train": 0}

    def note(line):
        if log_path:
            with _open(log_path, "a") as f:
                f.write(line + "\n")

    read_item = WellDataset.__getitem__

    def getitem(self, index):
        split = "rollout" if self.full_trajectory_mode else os.path.basename(str(self.data_path).rstrip("/"))
        if split != "rollout" and "torch/utils/data" not in sys._getframe(1).f_code.co_filename.replace("\\", "/"):
            return read_item(self, index)  # not a DataLoader's fetch: a look at one sample
        note(f"{split} {int(index)}")
        if split == "train":
            counts["train"] += 1
            if _RANK == fail_rank and counts["train"] == int(fail_at):
                if fail_mode == "die":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("injected failure (test probe)")
        return read_item(self, index)

    WellDataset.__getitem__ = getitem

    _open = builtins.open
    _replace = os.replace

    def open_(file, mode="r", *args, **kwargs):
        if any(m in mode for m in "wax+") and str(file) != log_path:
            note(f"write {os.path.abspath(file) if isinstance(file, (str, os.PathLike)) else file}")
        return _open(file, mode, *args, **kwargs)

    def replace(src, dst, *args, **kwargs):
        note(f"write {os.path.abspath(dst)}")
        return _replace(src, dst, *args, **kwargs)

    builtins.open = open_
    os.replace = replace


if _LOG or _FAIL:
    try:
        _install()
    except ImportError:  # a process without the_well (torchrun's agent in a bare venv): nothing to probe
        pass
