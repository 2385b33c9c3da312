"""Exercise 10, task 1: the FLOPs of one training step, counted on the real model and input size.

`torch.utils.flop_counter.FlopCounterMode` watches every operator a forward and backward pass
runs and adds up the FLOPs of those it has a formula for (a multiply-add is 2 FLOPs). Its formulas
(the registry at the top of torch/utils/flop_counter.py,
https://github.com/pytorch/pytorch/blob/main/torch/utils/flop_counter.py) cover matrix products,
convolutions and attention: what a transformer spends its time in. An FNO needs two corrections:

* its spectral weights are complex: one complex multiply-add is 4 real multiplies and 4 real
  adds, 8 FLOPs, where the real formula counts 2;
* its FFTs have no formula at all, so FlopCounterMode counts them as 0. They get the usual
  estimate, FFTW's convention (https://www.fftw.org/speed/method.html): 5 N log2 N FLOPs per
  complex transform of N points, half that for a real one.

    from flop_count import training_flops_per_sample   # fno.py, beside this file

wellfno/flops.py holds a copy of these functions for the later steps (tests/test_taught_modules.py
holds the two identical); the device peaks and the MFU arithmetic stay there (wellfno.flops).
"""
import math

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry

aten = torch.ops.aten


def _complex_aware(counted):
    """A FlopCounterMode formula that counts a complex product as 4 real ones."""
    # `counted` is torch's formula for the real product (2 FLOPs per multiply-add); with a complex
    # operand each of those multiply-adds is 4 real multiplies and 4 adds: 4x as many.
    def count(*args, out_val=None, **kwargs):
        factor = 4 if any(isinstance(a, torch.Tensor) and a.is_complex() for a in args) else 1
        return factor * counted(*args, out_val=out_val, **kwargs)
    count._get_raw = True  # FlopCounterMode hands it the tensors, not only their shapes
    return count


def fft_flops(points: int, transforms: int, real: bool) -> int:
    """5 N log2 N per complex transform of N points, half for a real one (FFTW's convention)."""
    if points <= 1:
        return 0
    per = 5 * points * math.log2(points)
    return int(round(transforms * (per / 2 if real else per)))


def _fft_formula(kind: str):
    """A FlopCounterMode formula for torch's FFTs: r2c (rfftn), c2r (irfftn), c2c (fftn)."""
    # `dim` are the transformed axes: N = the product of their lengths; every other axis (batch,
    # channels) is one more transform. For c2r the input is the half spectrum: N is the output's.
    def count(x, dim, *args, out_val=None, **kwargs):
        full = out_val if kind == "c2r" else x  # the transform's length is the real signal's
        points = math.prod(full.shape[d] for d in dim)
        return fft_flops(points, full.numel() // max(points, 1), real=kind != "c2c")
    count._get_raw = True
    return count


# The formulas FlopCounterMode uses in place of (or besides) its own: the four matrix products
# the spectral contraction can run as (torch.einsum becomes bmm), and the three FFT operators that
# torch.fft's functions call.
FLOP_FORMULAS = {
    **{op: _complex_aware(flop_registry[op])
       for op in (aten.mm, aten.addmm, aten.bmm, aten.baddbmm)},
    aten._fft_r2c: _fft_formula("r2c"), aten._fft_c2r: _fft_formula("c2r"),
    aten._fft_c2c: _fft_formula("c2c"),
}
FFT_OPS = {aten._fft_r2c, aten._fft_c2r, aten._fft_c2c}


def count_flops(step) -> dict:
    """Run `step()` under FlopCounterMode: {'total': FLOPs, 'by_op': {op: FLOPs}, 'by_kind':
    {'matmul_conv': FLOPs, 'fft': FLOPs}}."""
    # display=False: no table printed on exit; the counts are read from the counter instead.
    with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as counter:
        step()
    by_op = {str(op).split(".")[-1]: int(n)
             for op, n in counter.get_flop_counts()["Global"].items()}
    fft = sum(int(n) for op, n in counter.get_flop_counts()["Global"].items()
              if op in FFT_OPS)
    total = int(counter.get_total_flops())
    return dict(total=total, by_op=by_op, by_kind=dict(matmul_conv=total - fft, fft=fft))


def training_flops_per_sample(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                              loss_fn) -> dict:
    """FLOPs of one forward + backward pass on the batch (x, y), per sample.

    The model's gradients are left as they were (the count runs a real backward pass); the
    optimizer step is not counted (a few FLOPs per parameter, nothing next to the convolutions).
    FLOPs depend on shapes only: a zero batch of the training shape, in float32, counts them.
    """
    saved = [p.grad for p in model.parameters()]
    for p in model.parameters():
        p.grad = None

    def step():
        loss_fn(model(x), y).backward()

    try:
        counted = count_flops(step)
    finally:
        for p, g in zip(model.parameters(), saved):
            p.grad = g
    n = len(x)
    return dict(per_sample=counted["total"] / n, batch_size=n,
                by_op={k: v / n for k, v in counted["by_op"].items()},
                by_kind={k: v / n for k, v in counted["by_kind"].items()})
