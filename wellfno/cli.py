"""Small helpers every script of the course uses: one-line user errors and atomic writes.

A participant who mistypes a path should read one line that says what to do,
not a 40-line traceback. Files other steps depend on (metrics, checkpoints,
statistics) are written to a temporary file and renamed, so a job killed at its
time limit never leaves half a file behind.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn


class UserError(Exception):
    """A problem the user can fix; its message says how."""


# The oldest torch the course supports: every step runs on it (make test-oldest, CI's second leg,
# torch 2.5.1; INSTRUCTORS.md, "Oldest supported torch"). The Makefile's OLDEST_TORCH says the same.
OLDEST_TORCH = (2, 5)


def torch_version(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string: "2.5.1+cu124" -> (2, 5)."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def check_torch(version: str) -> None:
    """One `error:` line when `version` is older than the oldest torch the course supports."""
    if torch_version(version) < OLDEST_TORCH:
        oldest = ".".join(map(str, OLDEST_TORCH))
        raise UserError(
            f"torch {version} is older than {oldest}, the oldest this course supports: load a newer "
            f"PyTorch module or container (at least {oldest}), or make a venv of its own with "
            "`make venv VENV=.venv-new TORCH_SPEC=torch==2.13.0` (INSTRUCTORS.md, 'Oldest "
            "supported torch')")


def run_main(main: Callable[[], Any]) -> NoReturn:
    """Run `main`; turn a UserError (or Ctrl-C) into one line on stderr and a non-zero exit.

    A script that imported torch first has it checked against OLDEST_TORCH (not imported here:
    a tool without torch pays nothing)."""
    whole_lines()
    try:
        if "torch" in sys.modules:
            check_torch(sys.modules["torch"].__version__)
        rc = main()
    except UserError as err:
        # One write: under torchrun every rank may fail at once, and print's separate writes of
        # the text and the newline run their lines together.
        sys.stderr.write(f"error: {err}\n")
        sys.stderr.flush()
        leave(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        leave(130)
    leave(rc or 0)


def whole_lines() -> None:
    """Each printed line one write(2), also under PYTHONUNBUFFERED=1 or `python -u` (common in job
    scripts), where stdout and stderr are write-through: print() then writes the text and the
    newline apart, and ranks sharing a terminal or a log (torchrun's children do) run their
    `host=` and log lines together. Line buffering keeps the output as live as -u asks."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "write_through", False):  # a TextIOWrapper made by -u; else as it was
            stream.reconfigure(write_through=False, line_buffering=True)


def leave(code: int) -> NoReturn:
    """End the process with `code` as sys.exit would, without Python's final teardown.

    What a clean exit needs happens here, in the order the interpreter does it: the other
    (non-daemon) threads are joined, the atexit handlers run (logging's, multiprocessing's,
    which ends DataLoader workers, torch's own), stdout and stderr are flushed. Skipped is what
    comes after (Py_FinalizeEx): the garbage collection and teardown of every module and object,
    which finalizes nothing the course needs (every file it writes is closed and renamed in
    place before main returns) and costs (tests/exit_cost.py):
    - about 0.55 s of CPU in every process after `import fno` (0.54 and 0.58 s on two 2-core
      VMs), most of it collecting the objects of torch's import (`gc.freeze()` before exit
      saves nearly as much);
    - the moment that can abort a rank that finished its work: gloo's worker threads outlive
      dist.destroy_process_group(), and one that needs Python while the interpreter shuts down
      makes the C++ runtime abort the process (SIGABRT, "terminate called without an active
      exception"; pytorch/pytorch#179291, exercises/05_ddp/background.md). Leaving with
      os._exit ends those threads with the process instead (tests/gloo_exit_repro.py).
    """
    import atexit
    import threading

    shutdown = getattr(threading, "_shutdown", None)  # what Py_FinalizeEx calls first
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)  # then this
    if shutdown is None or run_exit_handlers is None:  # not CPython: the ordinary exit
        sys.exit(code)
    if sys.flags.interactive or "IPython" in sys.modules:  # `python -i`, `%run` in Jupyter:
        sys.exit(code)  # the session goes on after the script, so it must not end the process
    shutdown()
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or file: nothing more can be said there
            pass
    os._exit(code if isinstance(code, int) and 0 <= code <= 255 else 1)


@contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside `path` to write to; renamed onto `path` when the block succeeds.

    For writers that want a file name rather than a file object (h5py). On an error, or a
    kill before the rename, `path` keeps its old content (or stays absent).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:  # on disk before the rename makes it visible
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str) -> Path:
    with atomic_output(path) as tmp:
        with open(tmp, mode) as f:
            write(f)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return _atomic_write(path, lambda f: f.write(text), "w")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return _atomic_write(path, lambda f: f.write(data), "wb")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    import torch

    return _atomic_write(path, lambda f: torch.save(obj, f), "wb")


def check_output_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """`path` as a folder to write into, or a UserError before anything is written.

    Catches the usual slip of naming a file (or a folder inside a file) where a folder is meant.
    """
    path = Path(path)
    for folder in (path, *path.parents):
        if folder.exists():
            if not folder.is_dir():
                raise UserError(f"{flag} {path}: {folder} is a file, not a folder; pass a folder")
            if not os.access(folder, os.W_OK | os.X_OK):
                raise UserError(f"{flag} {path}: {folder} is not writable; pass a folder you can write to")
            break
    return path


def load_checkpoint(path: str | os.PathLike, map_location=None) -> dict:
    """A checkpoint written by `atomic_torch_save`, or a UserError that says it is damaged and what to do."""
    import pickle

    import torch

    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (FileNotFoundError, PermissionError):
        raise
    # A cut-off zip archive fails in torch.load's reader with any of these; OSError (Errno 22,
    # Invalid argument) for some cut points of a small checkpoint.
    except (RuntimeError, EOFError, pickle.UnpicklingError, ValueError, OSError) as err:
        reason = (str(err).splitlines() or [err.__class__.__name__])[0][:120]
        raise UserError(f"{path} is damaged ({reason}): delete it to start afresh "
                        f"(or move it away), or use another --out") from None
    if not isinstance(state, dict):
        raise UserError(f"{path} is not a training checkpoint: delete it or use another --out")
    return state
