"""Complex weights under DistributedDataParallel: keep them as real parameters (the course's way,
solution 05 on), and the check that DDP averages them right (2 ranks x b against 1 rank x 2b).

    torchrun --standalone --nproc-per-node 2 -m wellfno.complex_ddp_check --out DIR
                                                     # nccl on 2 GPUs, else gloo

The FNO's spectral weights are complex64 parameters. DDP moves parameters twice: it broadcasts rank
0's at start-up and all-reduces the gradients in backward. Neither is safe for complex tensors on
every torch and every backend:
- gloo in torch 2.5 has no complex type: DDP's start-up broadcast stops with
  `RuntimeError: Invalid scalar type` (measured with torch 2.5.1; tests/test_nccl_seam.py);
- NCCL (RCCL on AMD) has no complex type either: before torch 2.3 ProcessGroupNCCL refused complex
  tensors (pytorch/pytorch#71613); since pytorch/pytorch#121045 it reduces them through their real
  view and hands that real view back as the collective's result, which DDP's reducer copied into
  the complex gradients with the complex parameters' sizes and strides until pytorch/pytorch#166863
  (Nov 2025): over NCCL the averaged spectral gradients come out wrong, the imaginary parts zero
  (pytorch/pytorch#158753, open). Training still runs, but not as it does on one GPU.

`wellfno.model.spectral_weights_as_real` (NextFrameFNO applies it, so every step of the course
has it) sidesteps all of it: each complex weight becomes a float32 parameter of
shape (..., 2), its real view (torch.view_as_real), and the spectral convolution reads it back as
complex with torch.view_as_complex (a view: no copy, the same numbers, gradients flow through it).
DDP, optimizers and GradScaler then see only real tensors, which every backend of every torch
handles. Adam on the real view is the same arithmetic as Adam on the complex parameter (torch's
Adam views complex parameters as real itself). The same idea as The Well's `ComplexLinearDDP`
(the_well/benchmark/models/refno). The other way, a communication hook that averages complex
buckets through their real views and hands DDP back the bucket (as wellfno.domain's
domain_comm_hook does for step 13's sums), leaves DDP's start-up broadcast of complex tensors,
which torch 2.5's gloo cannot do, so the course does not rely on it.

The check runs one training step with plain DDP of the complex model and one with the course's real
weights, against one rank with the whole batch: over NCCL on a node it says whether plain DDP
would have been right there (information; `python -m coursetools.gpucheck`).
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path

import torch
import torch.distributed as dist

from wellfno.cli import UserError, atomic_torch_save, atomic_write_json, run_main
from wellfno.device import exact_float32
from wellfno.model import NextFrameFNO

TOLERANCE = 1e-5  # 2 ranks x b vs 1 rank x 2b: the same sums in another order (float32 ulps)
# DDP of the complex model as it comes; DDP of the course's model (spectral_weights_as_real)
VARIANTS = ("plain", "real_weights")
RESULT = "complex_ddp.json"


def as_complex_by_name(named: dict) -> dict:
    """{name: tensor} with each RealWeight's `X.as_real` entry shown as `X.tensor`, complex, as
    neuralop's own model names it (to compare the two models' parameters or gradients)."""
    return {
        (n[: -len(".as_real")] + ".tensor" if n.endswith(".as_real") else n): (
            torch.view_as_complex(t) if n.endswith(".as_real") else t
        )
        for n, t in named.items()
    }


# --------------------------------------------------------------------------- the check
def example_model(device, grid: int, width: int, modes: int, real_weights: bool = True):
    """The course's model (wellfno.model.NextFrameFNO, 2 fields); real_weights=False: with
    neuralop's complex spectral parameters."""
    torch.manual_seed(0)  # every rank and the reference start from the same weights
    ones = torch.ones(2)
    stats = dict(mean=0 * ones, std=ones, mean_delta=0 * ones, std_delta=0.1 * ones)
    model = NextFrameFNO(2, 1, stats, modes=min(modes, grid), width=width,
                         real_weights=real_weights)
    return model.to(device)


def example_batch(global_batch: int, grid: int, device):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(global_batch, 2, grid, grid, generator=generator)
    y = torch.randn(global_batch, 2, grid, grid, generator=generator)
    return x.to(device), y.to(device)


def train_step(model, loss_of, x, y, lr: float = 2e-3) -> dict:
    """One step of the course's training (Adam, solution 05's lr); the gradients it used and the
    parameters after it, on the CPU, by parameter name."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    optimizer.zero_grad(set_to_none=True)
    loss_of(model(x), y).backward()
    module = getattr(model, "module", model)  # DDP wraps the FNO
    grads = {n: p.grad.detach().cpu().clone() for n, p in module.named_parameters()}
    optimizer.step()
    params = {n: p.detach().cpu().clone() for n, p in module.named_parameters()}
    return dict(grad=as_complex_by_name(grads), param=as_complex_by_name(params))


def relative_differences(got: dict, ref: dict) -> dict:
    """{name: {"real": r, "imag": i}}: max |got - ref| / max |ref| of each part, per tensor (so that
    entries near 0 do not blow it up); a real tensor has only "real"."""
    out = {}
    for name, r in ref.items():
        g = got[name]
        parts = (
            {"real": (g.real, r.real)}
            if not r.is_complex()
            else {"real": (g.real, r.real), "imag": (g.imag, r.imag)}
        )
        out[name] = {
            k: (
                (a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)
            ).item()
            for k, (a, b) in parts.items()
        }
    return out


def worst(diffs: dict) -> tuple[str, str, float]:
    """(parameter, part, relative difference) of the largest difference."""
    return max(
        ((n, part, v) for n, d in diffs.items() for part, v in d.items()), key=lambda t: t[2]
    )


def summarize(result: dict, tolerance: float = TOLERANCE) -> dict:
    """ok and the worst difference of each variant, gradients and parameters after the step (or
    the error that stopped the variant)."""
    summary = {}
    for variant in VARIANTS:
        if "error" in result[variant]:
            summary[variant] = dict(ok=False, error=result[variant]["error"])
            continue
        entries = {}
        for what in ("grad", "param"):
            name, part, value = worst(result[variant][what])
            entries[what] = dict(parameter=name, part=part, relative_difference=value)
        summary[variant] = dict(
            ok=all(e["relative_difference"] <= tolerance for e in entries.values()), **entries
        )
    return summary


def _what_went_wrong(entry: dict) -> str:
    if "error" in entry:
        return f"stops: {entry['error']}"
    bad = entry["grad"]
    return f"{bad['parameter']} {bad['part']} part off by {bad['relative_difference']:.2g} relative"


def verdict_line(check: dict) -> str:
    """The day-0 report's one line: does DDP average the FNO's gradients right on this node, plain
    (complex weights) and as the course runs it (real weights, solution 05 on)?"""
    if not check.get("ran"):
        return f"complex gradients under DDP: not checked ({check.get('why', 'not run')})"
    if "summary" not in check:
        return (
            f"complex gradients under DDP: the check did not finish ({check.get('backend', '?')}): "
            f"{check.get('why', 'no result')}"
        )
    where = (
        f"{check['library']}, {check['world_size']} ranks x {check['batch']} "
        f"vs 1 rank x {check['world_size'] * check['batch']}"
    )
    plain, real = check["summary"]["plain"], check["summary"]["real_weights"]
    if not real["ok"]:
        return (
            f"complex gradients under DDP: the course's real weights are NOT averaged right on "
            f"this node ({where}: {_what_went_wrong(real)}): train on one GPU per job here, and "
            f"report it"
        )
    course = f"the course's real weights (solution 05 on) are averaged right ({where})"
    if plain["ok"]:
        return (
            f"complex gradients under DDP: {course}; plain DDP of complex weights would be right "
            f"here too (every real and imaginary part within {check['tolerance']:g})"
        )
    return (
        f"complex gradients under DDP: {course}; plain DDP of complex weights would NOT be "
        f"({_what_went_wrong(plain)}): why exercise 05 keeps them real"
    )


def run_check(
    out: Path, backend: str, batch: int, grid: int, width: int, modes: int, timeout: float
):
    """Every rank: one step with plain DDP and one with real weights; rank 0 also one on its own,
    the whole global batch (the reference). Each rank saves what it holds; rank 0 writes RESULT.
    With TF32 off (wellfno.device.exact_float32): NVIDIA's default TF32 convolutions differ by
    about 1e-3, far beyond TOLERANCE, and would fail every variant."""
    tf32_line = exact_float32()
    if int(os.environ["RANK"]) == 0:
        print(tf32_line, flush=True)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        if torch.cuda.device_count() <= local_rank:
            raise UserError(
                f"--backend nccl: local rank {local_rank} has no GPU of its own "
                f"({torch.cuda.device_count()} visible): start one rank per GPU"
            )
        device = torch.device("cuda", local_rank)  # torchrun --standalone: every GPU visible
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        backend,
        timeout=datetime.timedelta(seconds=timeout),
        **({"device_id": device} if device.type == "cuda" else {}),
    )
    try:
        x, y = example_batch(batch * world, grid, device)
        mine = slice(rank * batch, (rank + 1) * batch)
        held = {}
        for variant in VARIANTS:
            model = example_model(device, grid, width, modes, variant == "real_weights")
            try:
                ddp = torch.nn.parallel.DistributedDataParallel(
                    model, device_ids=[device.index] if device.type == "cuda" else None
                )
                held[variant] = train_step(ddp, model.loss, x[mine], y[mine])
            except RuntimeError as error:  # e.g. torch 2.5's gloo: no complex type, every rank
                held[variant] = {"error": str(error).strip().splitlines()[0]}
        out.mkdir(parents=True, exist_ok=True)
        atomic_torch_save(out / f"rank{rank}.pt", held)
        if rank == 0:
            model = example_model(device, grid, width, modes, real_weights=False)
            reference = train_step(model, model.loss, x, y)  # complex: neuralop's own names
            atomic_torch_save(out / "reference.pt", reference)
            result = {
                v: held[v] if "error" in held[v] else
                {w: relative_differences(held[v][w], reference[w]) for w in ("grad", "param")}
                for v in VARIANTS
            }
            complex_grads = [g for g in reference["grad"].values() if g.is_complex()]
            library = (
                ("RCCL " if torch.version.hip else "NCCL ")
                + ".".join(map(str, torch.cuda.nccl.version()))
                if backend == "nccl"
                else "gloo"
            )
            check = dict(
                ran=True,
                backend=backend,
                library=library,
                world_size=world,
                batch=batch,
                grid=grid,
                width=width,
                device=str(device),
                device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                tolerance=TOLERANCE,
                complex_parameters=len(complex_grads),
                imaginary_gradient_max=max(g.imag.abs().max().item() for g in complex_grads),
                differences=result,
                summary=summarize(result),
            )
            check["line"] = verdict_line(check)
            atomic_write_json(out / RESULT, check)
            print(check["line"], flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument("--out", required=True, help="folder for rank*.pt, reference.pt and " + RESULT)
    p.add_argument(
        "--backend",
        choices=["auto", "gloo", "nccl"],
        default="auto",
        help="auto: nccl (RCCL on AMD) where torch sees GPUs, else gloo",
    )
    p.add_argument(
        "--batch-size", type=int, default=4, help="samples per rank (the reference: all ranks')"
    )
    p.add_argument("--grid", type=int, default=16)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--modes", type=int, default=8)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a collective may wait")
    args = p.parse_args(argv)
    if min(args.batch_size, args.grid, args.width, args.modes) < 1 or not args.timeout > 0:
        raise UserError("--batch-size, --grid, --width, --modes and --timeout must be positive")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UserError(f"--out {args.out} is a file; give a folder")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise UserError(
            "start the ranks with a launcher: torchrun --standalone --nproc-per-node 2 "
            "-m wellfno.complex_ddp_check --out DIR"
        )
    run_check(
        Path(args.out),
        args.backend,
        args.batch_size,
        args.grid,
        args.width,
        args.modes,
        args.timeout,
    )


if __name__ == "__main__":
    run_main(main)
