"""Your distributed spectral convolution against neuralop's SpectralConv: forward, every gradient.

    .venv/bin/torchrun --standalone --nproc-per-node 3 -m wellfno.domain_check --script fno.py
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m wellfno.domain_check --script fno.py
    .venv/bin/python -m wellfno.domain_check --script fno.py    # one rank: the whole grid, one slab

Exercise 13, task 2. The contract: your script defines, at module level,

    class DomainSpectralConv(nn.Module):
        def __init__(self, conv, slab): ...  # neuralop's SpectralConv, a wellfno.domain.Slab
        def forward(self, x, output_shape=None): ...  # (B, C_in, slab rows, ...) -> (B, C_out, ..)
        def transform(self, x, output_shape=None): ...  # FNOBlocks calls it on its skip paths

holding conv's own parameters under their names (`weight`: the complex weights held as real,
wellfno.model.RealWeight, `weight.to_tensor()` their complex view; `bias`), so that the split
model's state_dict and checkpoints are one rank's. On every case below each rank of a domain
group of P ranks gets its slab of the input (`slab.rows` of the first spatial axis, `slab.group`
its process group); the check compares the output slabs, the input's gradient and the parameters'
gradients (summed over the group, as solution 13's DDP hook sums them) with SpectralConv on the
whole grid in one process, to 1e-5 relative (the same sums in another order: float32 rounding).
The cases: 2-D and 3-D, on 1, 2 and 3 ranks, odd axes among them (neuralop's fftshift lands one
index lower on an odd axis: wellfno.domain.kept_indices). Cases of more ranks than were started
are left out, and the summary says so. Runs on the CPU with gloo; exit status 0 when every case
agrees, 1 when one differs, 2 when the script breaks the contract (one `error:` line).
`--reference` checks wellfno.domain's own class (the one solution 13 uses), which you read after
writing yours.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from wellfno.cli import UserError, atomic_write_json, run_main
from wellfno.device import exact_float32
from wellfno.domain import DomainSpectralConv as REFERENCE
from wellfno.domain import Slab, slab_bounds
from wellfno.launch import launch_environment
from wellfno.model import spectral_weights_as_real

ALLOWED = 1e-5  # relative: float32 rounding of the same sums in another order is about 1e-7
IN_CHANNELS, OUT_CHANNELS, BATCH = 3, 2, 2  # in != out: a transposed contraction does not pass
QUANTITIES = ("forward", "input grad", "weight grad", "bias grad")


@dataclass(frozen=True)
class Case:
    name: str
    ranks: int  # P, the domain group's size
    grid: tuple[int, ...]
    modes: int  # neuralop's n_modes per axis, at most the axis' cells

    @property
    def n_modes(self) -> tuple[int, ...]:
        return tuple(min(self.modes, n) for n in self.grid)


# Odd axes other than the last (the rfft's) are where neuralop's fftshift moves the kept modes.
CASES = (
    Case("2-D, odd rows, one rank", 1, (9, 10), 6),
    Case("3-D, odd middle axis, one rank", 1, (6, 7, 6), 4),
    Case("2-D, odd rows", 2, (15, 12), 8),
    Case("3-D, odd middle axis", 2, (8, 7, 6), 4),
    Case("2-D, odd last axis", 3, (16, 11), 6),
    Case("2-D, odd rows", 3, (13, 10), 6),
    Case("3-D, odd rows", 3, (7, 6, 5), 4),
)


def load_script(path: str | Path):
    """The script as a module (its `if __name__ == "__main__":` block does not run)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--script {path}: no such file; give your exercise-13 script")
    spec = importlib.util.spec_from_file_location(f"domain_check_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does: dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # the script's own bug: one line, which says where to look
        del sys.modules[spec.name]
        raise UserError(
            f"importing {path.name} failed ({type(err).__name__}: {err}); run "
            f'\'python -c "import runpy; runpy.run_path(\\"{path}\\")"\' for the traceback'
        ) from None
    return module


def convolution_of(module, shown: str):
    """The script's own DomainSpectralConv class, or one line saying what the contract wants."""
    cls = getattr(module, "DomainSpectralConv", None)
    if cls is None:
        raise UserError(
            f"{shown} defines no DomainSpectralConv: write your own distributed spectral "
            f"convolution, a class DomainSpectralConv(conv, slab) in your script (solution 13 "
            f"uses wellfno.domain's: read it afterwards) (exercise 13, task 2)"
        )
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise UserError(
            f"{shown}'s DomainSpectralConv is not an nn.Module class (exercise 13, task 2)"
        )
    if issubclass(cls, REFERENCE):
        raise UserError(
            f"{shown}'s DomainSpectralConv is wellfno.domain's: the task is to write your own, "
            f"and to read wellfno.domain afterwards (exercise 13, task 2)"
        )
    if not callable(getattr(cls, "transform", None)):
        raise UserError(
            f"{shown}'s DomainSpectralConv has no transform(x, output_shape=None) method: "
            f"neuralop's FNOBlocks calls it on its skip paths (AttributeError: ... has no "
            f"attribute 'transform'); return x unchanged (exercise 13, task 2)"
        )
    return cls


def make_case(case: Case, seed: int = 0):
    """SpectralConv with the course's real-held weights and a non-zero bias, an input and the
    output's gradient (a random cotangent): the same on every rank (seeded)."""
    from neuralop.layers.spectral_convolution import SpectralConv

    torch.manual_seed(seed)
    conv = spectral_weights_as_real(SpectralConv(IN_CHANNELS, OUT_CHANNELS, case.n_modes))
    with torch.no_grad():
        conv.bias.normal_()  # neuralop starts it at zero-mean noise; any values will do
    x = torch.randn(BATCH, IN_CHANNELS, *case.grid)
    cotangent = torch.randn(BATCH, OUT_CHANNELS, *case.grid)
    return conv, x, cotangent


def relative(got: torch.Tensor | None, want: torch.Tensor) -> float:
    """max |got - want| / max |want|; inf where there is nothing or the shapes differ."""
    if got is None or got.shape != want.shape:
        return math.inf
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def run_case(cls, case: Case, slab: Slab) -> tuple[list[float], list[str]]:
    """This rank's errors (QUANTITIES) and contract problems, for its slab of `case`.

    The parameters' gradients are summed over the domain group (a collective of the group)."""
    conv, x, cotangent = make_case(case)
    reference = copy.deepcopy(conv)
    whole = x.clone().requires_grad_()
    want = reference(whole)
    (want * cotangent).sum().backward()
    mine = copy.deepcopy(conv)
    split = cls(mine, slab)
    problems = []
    if {id(p) for p in split.parameters()} != {id(p) for p in mine.parameters()}:
        problems.append(
            "does not hold conv's own parameters (self.weight = conv.weight, self.bias = conv.bias)"
        )
    if sorted(split.state_dict()) != sorted(mine.state_dict()):
        problems.append(
            f"has the state_dict keys {sorted(split.state_dict())}, SpectralConv "
            f"{sorted(mine.state_dict())}: checkpoints would not be one rank's"
        )
    part = x[:, :, slab.rows].clone().requires_grad_()
    if split.transform(part) is not part and not torch.equal(split.transform(part), part):
        problems.append("transform(x) changes x: without resolution scaling it returns x")
    got = split(part)
    errors = [relative(got, want[:, :, slab.rows])]
    if got.shape == want[:, :, slab.rows].shape:
        (got * cotangent[:, :, slab.rows]).sum().backward()
    errors.append(relative(part.grad, whole.grad[:, :, slab.rows]))
    for name in ("weight.as_real", "bias"):
        grad = dict(mine.named_parameters())[name].grad
        grad = torch.zeros_like(dict(mine.named_parameters())[name]) if grad is None else grad
        if slab.size > 1:
            grad = grad.clone()
            dist.all_reduce(grad, group=slab.group)  # the sample's gradient: the group's sum
        errors.append(relative(grad, dict(reference.named_parameters())[name].grad))
    return errors, problems


def check(cls, world: int = 1, rank: int = 0, cases=CASES) -> list[dict]:
    """Every case of at most `world` ranks, on every rank: the rows (worst over the ranks).

    Every rank must call it (the groups are made collectively, by every rank of the world)."""
    rows = []
    for case in cases:
        if case.ranks > world:
            continue
        group = None
        if world > 1:  # new_group is collective over the world: every rank makes every group
            group = dist.new_group(list(range(case.ranks))) if case.ranks > 1 else None
        errors, problems = [0.0] * len(QUANTITIES), []
        if rank < case.ranks:
            start, stop = slab_bounds(case.grid[0], case.ranks)[rank]
            slab = Slab(start, stop, case.grid[0], rank, case.ranks, group)
            errors, problems = run_case(cls, case, slab)
        if world > 1:
            gathered = [None] * world
            dist.all_gather_object(gathered, (errors, problems))
            errors = [max(e[i] for e, _ in gathered) for i in range(len(QUANTITIES))]
            problems = list(dict.fromkeys(p for _, ps in gathered for p in ps))
        rows.append(
            dict(
                case=case.name,
                ranks=case.ranks,
                grid=list(case.grid),
                n_modes=list(case.n_modes),
                errors=dict(zip(QUANTITIES, errors)),
                problems=problems,
                ok=not problems and all(e <= ALLOWED for e in errors),
            )
        )
    return rows


def first_failure(rows: list[dict]) -> str | None:
    """One sentence on the first case that fails, or None."""
    for row in rows:
        if row["ok"]:
            continue
        where = (
            f"case '{row['case']}' ({'x'.join(map(str, row['grid']))} cells, "
            f"{row['ranks']} rank(s))"
        )
        if row["problems"]:
            return f"{where}: DomainSpectralConv {row['problems'][0]}"
        worst = [f"{q} {e:.1e}" for q, e in row["errors"].items() if not e <= ALLOWED]
        return f"{where}: {', '.join(worst)} relative to SpectralConv's (allowed: {ALLOWED:.0e})"
    return None


def table(rows: list[dict]) -> str:
    lines = [
        f"{'case':<32}{'ranks':>6}  {'grid':<9}{'modes':<8}"
        + "".join(f"{q:>13}" for q in QUANTITIES)
    ]
    for row in rows:
        errors = "".join(f"{row['errors'][q]:>13.1e}" for q in QUANTITIES)
        lines.append(
            f"{row['case']:<32}{row['ranks']:>6}  {'x'.join(map(str, row['grid'])):<9}"
            f"{'x'.join(map(str, row['n_modes'])):<8}{errors}"
            f"  {'ok' if row['ok'] else 'DIFFERS'}"
        )
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--script", help="your exercise-13 script, which defines DomainSpectralConv")
    which.add_argument(
        "--reference",
        action="store_true",
        help="check wellfno.domain's DomainSpectralConv (solution 13's)",
    )
    p.add_argument("--report", help="also write the rows as JSON here (rank 0)")
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a rank waits in a collective for the others (gloo)",
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.timeout <= 0:
        raise UserError("--timeout must be positive (seconds)")
    shown = "wellfno.domain" if args.reference else Path(args.script).name
    cls = REFERENCE if args.reference else convolution_of(load_script(args.script), shown)
    env = launch_environment()
    torch.set_num_threads(1)  # P ranks on P cores; the cases are small
    exact_float32()
    if env.world_size > 1:
        dist.init_process_group(
            "gloo",
            rank=env.rank,
            world_size=env.world_size,
            timeout=datetime.timedelta(seconds=args.timeout),
        )
    try:
        rows = check(cls, env.world_size, env.rank)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    failure = first_failure(rows)
    if env.rank == 0:
        print(
            f"DomainSpectralConv of {shown} against neuralop's SpectralConv on the whole grid "
            f"(relative error, allowed {ALLOWED:.0e}):"
        )
        print(table(rows))
        left_out = sorted({c.ranks for c in CASES if c.ranks > env.world_size})
        if left_out:
            print(
                f"not run: the cases on {' and '.join(map(str, left_out))} ranks (start "
                f"{max(left_out)} ranks: torchrun --standalone --nproc-per-node {max(left_out)})"
            )
        if args.report:
            atomic_write_json(
                args.report,
                dict(
                    script=shown,
                    world_size=env.world_size,
                    allowed=ALLOWED,
                    rows=rows,
                    failure=failure,
                ),
            )
        print(
            f"FAIL: {failure}"
            if failure
            else f"PASS: every case on 1 to {env.world_size} rank(s) equals SpectralConv"
        )
        sys.stdout.flush()
    return 1 if failure else 0


if __name__ == "__main__":
    run_main(main)
