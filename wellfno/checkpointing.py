"""Activation checkpointing: each FNO block's activations recomputed in the backward, not kept.

Without it autograd keeps, per Fourier block, about 6 tensors of `width` channels on the whole
grid (wellfno.memory) until the backward uses them. With `checkpoint_blocks(fno)` each block
keeps only its input; in the backward it runs its forward once more (about a third more
compute for the blocks) to rebuild the activations, one block at a time. Same parameters, same
state_dict, the same gradients (the recomputation repeats the same operations).

torch.utils.checkpoint with use_reentrant=False (torch's recommended variant: works with
DDP, with inputs that do not require gradients, and with collectives inside the block, since
every rank recomputes the same operations in the same order):
https://docs.pytorch.org/docs/stable/checkpoint.html
"""

from __future__ import annotations

from torch.utils.checkpoint import checkpoint


def checkpoint_blocks(fno):
    """neuralop's FNO, in place: every call of `fno.fno_blocks` (one Fourier block) checkpointed."""
    blocks = fno.fno_blocks
    block_forward = (
        blocks.forward
    )  # the bound method: FNO.forward calls fno_blocks(x, layer_idx, ...)

    def checkpointed(x, index=0, output_shape=None):
        return checkpoint(block_forward, x, index, output_shape, use_reentrant=False)

    blocks.forward = checkpointed  # an instance attribute: no parameter or buffer changes
    return fno
