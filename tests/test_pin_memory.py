"""--pin-memory: on by default where batches are copied to a GPU (from step 02 on), off on a CPU.

A copy from pageable host memory "might be synchronous with respect to host" (CUDA runtime API,
API synchronization behavior): without pinning, batch_to_model's non_blocking copies wait, and
step 08's zero syncs per step would not hold on a GPU. So the default (None: not given) pins on
a GPU; --no-pin-memory turns it off; on a CPU nothing is pinned, and only an explicit
--pin-memory earns the one-line note. Checked on the statements themselves: each solution's
(02, 03, 05, 06, run as they are written) and affinity.training.loader_options (07 on), with a
stand-in torch.device("cuda") (the statements only read device.type).
"""
from __future__ import annotations

import argparse
import ast

import pytest
import torch

from affinity import training
from tests.conftest import REPO, STEPS
from wellfno import options

INLINE = ["02_data_pipeline", "03_affinity", "05_ddp", "06_exact_metrics"]  # 07 on: loader_options


def parse(*argv):
    p = argparse.ArgumentParser()
    options.add_arguments(p)
    p.add_argument("--report-workers", action="store_true")  # loader_options reads it (step 03)
    return p.parse_args(list(argv))


def inline_loader_options(step: str):
    """Solution `step`'s own statements: the `if args.pin_memory` note and `loader_options = `."""
    source = (REPO / STEPS[step]).read_text()
    body, first = next(
        (n.body, i) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)
        for i, s in enumerate(n.body)
        if isinstance(s, ast.If) and ast.unparse(s.test).startswith("args.pin_memory"))
    block = ast.Module(body=body[first:first + 2], type_ignores=[])
    assert ast.unparse(block.body[1]).startswith("loader_options = dict("), step

    def run(args, device):
        scope = dict(args=args, device=device)
        exec(compile(block, STEPS[step], "exec"), scope)  # noqa: S102 - the solution's own lines
        return scope["loader_options"]

    return run


CASES = [pytest.param(lambda args, device: training.loader_options(
    device, None, args.num_workers, args.pin_memory, args.prefetch_factor, args.persistent_workers,
    report_workers=args.report_workers), id="loader_options")]
CASES += [pytest.param(step, id=step) for step in INLINE]


@pytest.mark.parametrize("code", CASES)
@pytest.mark.parametrize("argv,device,pinned,note", [
    ((), "cuda", True, False),  # the default on a GPU: pinned
    (("--no-pin-memory",), "cuda", False, False),
    (("--pin-memory",), "cuda", True, False),
    ((), "cpu", False, False),  # the default on a CPU: nothing pinned, nothing said
    (("--pin-memory",), "cpu", False, True),  # asked for on a CPU: the one-line note
], ids=["gpu-default", "gpu-off", "gpu-on", "cpu-default", "cpu-asked"])
def test_pinned_by_default_on_a_gpu(code, argv, device, pinned, note, capsys):
    run = inline_loader_options(code) if isinstance(code, str) else code
    got = run(parse(*argv), torch.device(device))
    assert got["pin_memory"] is pinned
    out = capsys.readouterr().out
    assert ("--pin-memory ignored on cpu" in out) is note, out
