"""Mergeable moments in float64: the arithmetic of exercise 04, with no I/O.

A set of numbers is summarized by (count, mean, M2), M2 = sum((x - mean)^2): enough for the
mean, the population variance M2 / count and the rms sqrt(M2 / count + mean^2). Two summaries
merge exactly with Chan, Golub and LeVeque's pairwise formula (`merge`), so data read by many
processes in any order can be summarized piece by piece and combined later.

Why not sum(x) and sum(x^2)? E[x^2] - E[x]^2 cancels: for a field of 1e4 +- 1e-2 it keeps
4 digits in float64 and none in float32. Here values are shifted close to their mean first
(`shifted_moments`), and a block whose sums would still cancel is redone in two passes.

Why a fixed merge tree? Floating-point addition is not associative: merging the same pieces in
another order changes the last bits. Items are merged along one binary tree over item indices
(aligned power-of-two blocks, `PairwiseReducer`); a contiguous range of items reduces to at most
2 * 64 such blocks (`pack_blocks`: a fixed-size array, whatever the range), and whoever holds the
blocks of every range rebuilds the same tree (`combine_blocks`). The total is therefore bitwise
identical for any split of the items into ranges: for any number of ranks.

Reference: T. F. Chan, G. H. Golub, R. J. LeVeque, "Algorithms for computing the sample variance:
analysis and recommendations", The American Statistician 37(3), 1983,
https://doi.org/10.1080/00031305.1983.10483115 (the pairwise update, eq. 2.1).
"""
from __future__ import annotations

import numpy as np

# An aligned-block decomposition of any contiguous range of < 2**64 items has at most this many blocks.
MAX_BLOCKS = 128

Moments = tuple[float, float, float]  # (count, mean, M2) of one channel


def empty_moments(n_channels: int) -> np.ndarray:
    """(count, mean, M2) per channel, as rows of a (3, n_channels) float64 array: all zero, neutral in `merge`."""
    return np.zeros((3, n_channels), dtype=np.float64)


def vector_moments(values: np.ndarray, scratch: np.ndarray | None = None) -> Moments:
    """(count, mean, M2) of a contiguous 1-D float64 array: mean first, then squared deviations (two passes)."""
    n = values.size
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = values.sum() / n  # numpy sums contiguous float64 pairwise: error ~ eps * log n
    dev = np.subtract(values, mean, out=None if scratch is None else scratch[:n])
    return float(n), float(mean), float(np.dot(dev, dev))


def shifted_moments(values: np.ndarray, scratch: np.ndarray | None = None) -> Moments:
    """(count, mean, M2) of values that were shifted close to their mean; one pass when that is exact enough.

    M2 = sum(y^2) - sum(y)^2 / n loses log10(sum(y^2) / M2) digits to cancellation. The caller
    shifted y near its mean, so that ratio is ~1 and one pass (sum, dot) is as good as two.
    When the shift was poor (a drifting field) the ratio exceeds 4 and we take the exact
    two-pass route instead: speed in the common case, never a lost digit.
    """
    n = values.size
    if n == 0:
        return 0.0, 0.0, 0.0
    s1 = float(values.sum())
    s2 = float(np.dot(values, values))
    mean = s1 / n
    m2 = s2 - s1 * mean
    if s2 <= 4.0 * m2:
        return float(n), mean, m2
    return vector_moments(values, scratch)


def merge_scalar(a: Moments, b: Moments) -> Moments:
    """Chan et al.'s merge of two (count, mean, M2) triples (same formula as `merge`)."""
    na, ma, m2a = a
    nb, mb, m2b = b
    if nb == 0:
        return a
    if na == 0:
        return b
    n = na + nb
    delta = mb - ma
    return n, ma + delta * (nb / n), m2a + m2b + delta * delta * (na * nb / n)


def merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Chan et al.'s parallel merge of two (3, C) moment arrays; a channel with count 0 is neutral.

    n = na + nb;  d = mb - ma;  mean = ma + d * nb / n;  M2 = M2a + M2b + d^2 * na * nb / n
    """
    na, ma, m2a = a
    nb, mb, m2b = b
    n = na + nb
    safe_n = np.where(n > 0, n, 1.0)
    delta = mb - ma
    out = np.empty_like(a)
    out[0] = n
    out[1] = np.where(nb == 0, ma, np.where(na == 0, mb, ma + delta * (nb / safe_n)))
    out[2] = np.where(nb == 0, m2a, np.where(na == 0, m2b, m2a + m2b + delta * delta * (na * nb / safe_n)))
    return out


# --------------------------------------------------------------------------- the fixed merge tree
class PairwiseReducer:
    """Streams item moments in index order; keeps only aligned power-of-two blocks (O(log n) memory).

    A block (level, index) covers items [index * 2**level, (index + 1) * 2**level).
    Two sibling blocks are merged as soon as both are complete, left one first.
    """

    def __init__(self) -> None:
        self.blocks: list[tuple[int, int, np.ndarray]] = []

    def push(self, item_index: int, moments: np.ndarray) -> None:
        level, index, m = 0, item_index, moments
        while index % 2 == 1 and self.blocks and self.blocks[-1][:2] == (level, index - 1):
            _, _, left = self.blocks.pop()
            level, index, m = level + 1, index // 2, merge(left, m)
        self.blocks.append((level, index, m))

    def as_dict(self) -> dict[tuple[int, int], np.ndarray]:
        return {(level, index): m for level, index, m in self.blocks}


def top_blocks(n_items: int) -> list[tuple[int, int]]:
    """The aligned blocks that tile [0, n_items), largest first (the binary digits of n_items)."""
    out, start = [], 0
    for level in range(63, -1, -1):
        if n_items >> level & 1:
            out.append((level, start >> level))
            start += 1 << level
    return out


def combine_blocks(blocks: dict[tuple[int, int], np.ndarray], n_items: int, n_channels: int) -> np.ndarray:
    """Rebuild the canonical tree over [0, n_items) from disjoint aligned blocks that cover it."""

    def node(level: int, index: int) -> np.ndarray:
        if (level, index) in blocks:
            return blocks[(level, index)]
        if level == 0:
            raise ValueError(f"item {index} is covered by no block: some rank's share is missing")
        return merge(node(level - 1, 2 * index), node(level - 1, 2 * index + 1))

    total = empty_moments(n_channels)
    for level, index in top_blocks(n_items):
        total = merge(total, node(level, index))
    return total


def pack_blocks(blocks: dict[tuple[int, int], np.ndarray], n_channels: int) -> np.ndarray:
    """Blocks -> fixed-size float64 array (MAX_BLOCKS, 3 + 3C): valid, level, index, moments.

    The same shape on every rank, whatever it read: what a tensor collective (all_gather) needs.
    """
    if len(blocks) > MAX_BLOCKS:
        raise ValueError(f"{len(blocks)} blocks > {MAX_BLOCKS}")
    packed = np.zeros((MAX_BLOCKS, 3 + 3 * n_channels), dtype=np.float64)
    for row, ((level, index), m) in enumerate(sorted(blocks.items(), key=lambda kv: kv[0][1] << kv[0][0])):
        packed[row, :3] = (1.0, level, index)  # integers < 2**53 are exact in float64
        packed[row, 3:] = m.reshape(-1)
    return packed


def unpack_blocks(packed: np.ndarray, n_channels: int) -> dict[tuple[int, int], np.ndarray]:
    """Inverse of pack_blocks for one or many ranks' arrays stacked along the first axis.

    A block that appears twice means two ranks counted the same items: an error, not a merge.
    """
    blocks: dict[tuple[int, int], np.ndarray] = {}
    for r in packed.reshape(-1, 3 + 3 * n_channels):
        if r[0] != 1.0:
            continue
        key = (int(r[1]), int(r[2]))
        if key in blocks:
            raise ValueError(f"block {key} came from two ranks: some items were counted twice")
        blocks[key] = r[3:].reshape(3, n_channels).copy()
    return blocks


__all__ = ["MAX_BLOCKS", "empty_moments", "vector_moments", "shifted_moments", "merge_scalar", "merge",
           "PairwiseReducer", "top_blocks", "combine_blocks", "pack_blocks", "unpack_blocks"]
