"""Every multi-rank training program leaves on a collective that holds none of its tensors.

gloo's worker threads outlive `dist.destroy_process_group()`; one that lets go of a collective's
tensor after Python began to shut down aborts its rank (SIGABRT, "terminate called without an
active exception": exercises/05_ddp/background.md, "A rank that aborts on its way out"; one
make test failed of it). So after `train(...)` returns, and before the `finally` that destroys
the process group, every rank waits for the others at a barrier: `dist.barrier()` in 05 and
06, the watchdog's `wait_for_all()` (no --timeout limit) from 07 on and in wellfno/ranks.py,
which solutions 12 and 13 call. The race itself: tests/gloo_exit_repro.py, run many times.
"""
from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO

# (file, function whose try/finally starts and ends the ranks, what it must wait at last)
PROGRAMS = [(f"solutions/{step}/fno.py", "main", "barrier") for step in
            ("05_ddp", "06_exact_metrics")]
PROGRAMS += [(f"solutions/{step}/fno.py", "main", "wait_for_all") for step in
             ("07_failures", "08_host_syncs", "09_mixed_precision", "10_mfu", "11_compile",
              "12_checkpointing", "13_domain_parallel", "14_long_rollouts")]


def called(statement) -> str | None:
    """The name of the function (or method) a statement calls, if it is a call."""
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return None


@pytest.mark.parametrize("path, function, last", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_ranks_leave_together_after_training(path, function, last):
    tree = ast.parse((REPO / path).read_text())
    func = next(node for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef) and node.name == function)
    tries = [node for node in ast.walk(func) if isinstance(node, ast.Try)
             and any(called(s) == "destroy_process_group" for s in node.finalbody)]
    assert len(tries) == 1, f"{path}: {function} has no try/finally that destroys the group"
    body = tries[0].body
    if isinstance(body[-1], ast.With):  # 07 on: under the watchdog
        body = body[-1].body
    calls = [called(s) for s in body]
    assert calls[-2:] == ["train", last], (
        f"{path}: after train(...) every rank must wait at `{last}()` before the process group "
        f"is destroyed (exercises/05_ddp/background.md); the block ends with {calls[-2:]}")
