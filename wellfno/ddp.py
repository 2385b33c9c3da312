"""Complex gradients under DistributedDataParallel: a hook that averages them through real views,
and the check that DDP averages them right (2 ranks x b against 1 rank x 2b, one training step).

    torchrun --standalone --nproc-per-node 2 -m wellfno.ddp --out DIR   # nccl on 2 GPUs, else gloo

The FNO's spectral weights are complex64 parameters, and NCCL (RCCL on AMD) has no complex type:
ProcessGroupNCCL reduces a complex tensor through its real view (torch.view_as_real), and DDP's
reducer copies each bucket's result back into the gradients. Where that goes wrong, training still
runs, but not as it does on one GPU:
- pytorch/pytorch#158753 (open, 2025): a complex-valued model converges on one GPU, not under DDP;
  the imaginary part of the gradient appears to be zero; a manual all-reduce under no_sync()
  fixes it (https://github.com/pytorch/pytorch/issues/158753; a fix to the reducer's buckets:
  https://github.com/pytorch/pytorch/pull/166863, closed in Nov 2025, merged or not: PyTorch's
  bot closes the PRs it merges);
- pytorch/pytorch PR #74039 (2022, closed): ProcessGroup::Work hands the collective's result tensor
  to the reducer, and once a complex bucket was viewed as real for the collective, that result has
  to be turned back into the complex bucket "to avoid copy tearing"; custom hooks "will need to deal
  with complex tensors by themselves" (https://github.com/pytorch/pytorch/pull/74039;
  pytorch/pytorch#80080 tracks complex support in DDP);
- NVIDIA's TorchFort added its own complex gradient reduction for FNOs
  (https://github.com/NVIDIA/TorchFort/pull/2).

`complex_as_real_allreduce_hook` sidesteps the result tensor altogether: it all-reduces each bucket
in place through its real view (the same memory) and hands DDP back the bucket itself, complex as
it came. (torch 2.13's reducer already buckets complex parameters as float32, their real view:
measured with gloo, the hook then sees only real buckets; the check records which, as
`complex_buckets_as`. Older torch built complex64 buckets; the diff of pytorch/pytorch#166863
to Reducer::initialize_buckets is where that changes.) Register it with
`ddp_model.register_comm_hook(None, complex_as_real_allreduce_hook)`.
With gloo it gives what plain DDP gives (tests/test_ddp_complex.py); over NCCL the check below
says whether plain DDP needs it on a node (`python -m coursetools.gpucheck`, slurm/00_gpu_check.sbatch).
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

TOLERANCE = 1e-5  # 2 ranks x b vs 1 rank x 2b: the same sums in another order (float32 ulps)
VARIANTS = ("plain", "hook")  # DDP as solution 05 runs it; DDP with complex_as_real_allreduce_hook
RESULT = "complex_ddp.json"


def complex_as_real_allreduce_hook(process_group, bucket):
    """DDP communication hook: the bucket's mean over the ranks, reduced through its real view.

    torch.view_as_real shares the bucket's memory, so the in-place all-reduce of the view averages
    the complex gradients themselves; the future returns the bucket (complex dtype, same storage),
    never the collective's own result tensor (see the module docstring). Real buckets are reduced
    as they are. Dividing first, as torch's default allreduce_hook does, works with every backend
    (gloo has no ReduceOp.AVG).
    """
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    real = torch.view_as_real(buffer) if buffer.is_complex() else buffer
    real.div_(group.size())
    work = dist.all_reduce(real, group=group, async_op=True)
    return work.get_future().then(lambda _: buffer)


# --------------------------------------------------------------------------- the check
def example_model(device, grid: int, width: int, modes: int):
    """The course's model (wellfno.model.NextFrameFNO, 2 fields, its spectral weights complex)."""
    from wellfno.model import NextFrameFNO

    torch.manual_seed(0)  # every rank and the reference start from the same weights
    ones = torch.ones(2)
    stats = dict(mean=0 * ones, std=ones, mean_delta=0 * ones, std_delta=0.1 * ones)
    return NextFrameFNO(2, 1, stats, modes=min(modes, grid), width=width).to(device)


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
    return dict(
        grad=grads, param={n: p.detach().cpu().clone() for n, p in module.named_parameters()}
    )


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
    """ok and the worst difference of each variant, gradients and parameters after the step."""
    summary = {}
    for variant in VARIANTS:
        entries = {}
        for what in ("grad", "param"):
            name, part, value = worst(result[variant][what])
            entries[what] = dict(parameter=name, part=part, relative_difference=value)
        summary[variant] = dict(
            ok=all(e["relative_difference"] <= tolerance for e in entries.values()), **entries
        )
    return summary


def verdict_line(check: dict) -> str:
    """The day-0 report's one line: does plain DDP average complex gradients right on this node?"""
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
    plain, hook = check["summary"]["plain"], check["summary"]["hook"]
    if plain["ok"]:
        return (
            f"complex gradients under DDP: plain DDP averages them right on this node ({where}: "
            f"every gradient's real and imaginary parts within {check['tolerance']:g})"
        )
    bad = plain["grad"]
    found = (
        f"{bad['parameter']} {bad['part']} part off by {bad['relative_difference']:.2g} relative"
    )
    if hook["ok"]:
        return (
            f"complex gradients under DDP: plain DDP does NOT average them right on this node "
            f"({where}: {found}); the real-view hook does: switch it on in exercise 05 "
            f"(ddp_model.register_comm_hook(None, wellfno.ddp.complex_as_real_allreduce_hook))"
        )
    return (
        f"complex gradients under DDP: neither plain DDP nor wellfno.ddp's real-view hook averages "
        f"them right on this node ({where}: {found}): train exercise 05 on one GPU per job here"
    )


def recording_hook(seen: set):
    """complex_as_real_allreduce_hook, noting the dtype DDP's reducer gives the buckets of complex
    parameters: complex64 (the hook views them as real) or float32 (the reducer already did)."""

    def hook(process_group, bucket):
        if any(p.is_complex() for p in bucket.parameters()):
            seen.add(str(bucket.buffer().dtype).replace("torch.", ""))
        return complex_as_real_allreduce_hook(process_group, bucket)

    return hook


def run_check(
    out: Path, backend: str, batch: int, grid: int, width: int, modes: int, timeout: float
):
    """Every rank: one step with plain DDP and one with the hook; rank 0 also one step on its own,
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
        held, buckets = {}, set()
        for variant in VARIANTS:
            model = example_model(device, grid, width, modes)
            ddp = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
            if variant == "hook":
                ddp.register_comm_hook(None, recording_hook(buckets))
            held[variant] = train_step(ddp, model.loss, x[mine], y[mine])
        out.mkdir(parents=True, exist_ok=True)
        atomic_torch_save(out / f"rank{rank}.pt", held)
        if rank == 0:
            model = example_model(device, grid, width, modes)
            reference = train_step(model, model.loss, x, y)
            atomic_torch_save(out / "reference.pt", reference)
            result = {
                v: {w: relative_differences(held[v][w], reference[w]) for w in ("grad", "param")}
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
                complex_buckets_as=sorted(buckets),  # what the reducer hands a hook
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
            "-m wellfno.ddp --out DIR"
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
