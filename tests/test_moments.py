"""wellfno.moments (the arithmetic of exercise 04) against plain float64 numpy."""
from __future__ import annotations

import numpy as np
import pytest

from wellfno import moments as M


def numpy_moments(x: np.ndarray) -> tuple[float, float, float]:
    """The definition, written plainly: count, mean, sum of squared deviations (float64, two passes)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    mean = x.mean()
    return float(x.size), float(mean), float(((x - mean) ** 2).sum())


def assert_moments_close(got, expected, rtol=1e-12):
    assert got[0] == expected[0]
    np.testing.assert_allclose(got[1], expected[1], rtol=rtol, atol=0)
    np.testing.assert_allclose(got[2], expected[2], rtol=rtol, atol=0)


RNG = np.random.default_rng(0)
CASES = {
    "standard normal": RNG.standard_normal(10_000),
    "1e4 +- 1e-2 (a pressure in Pa)": 1e4 + 1e-2 * RNG.standard_normal(10_000),
    "steady ramp": np.arange(10_000, dtype=np.float64) * 1e3 + 1e-3 * RNG.standard_normal(10_000),
    "one value": np.array([3.5]),
}


@pytest.mark.parametrize("name", CASES)
def test_vector_moments_is_the_two_pass_definition(name):
    x = CASES[name]
    assert_moments_close(M.vector_moments(x), numpy_moments(x))
    assert_moments_close(M.vector_moments(x, scratch=np.empty(x.size + 5)), numpy_moments(x))


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("shift", ["near the mean", "zero"])
def test_shifted_moments_never_loses_digits(name, shift):
    """Shifted well: one pass is exact enough; shifted badly (by 0): it must notice and take two passes."""
    x = CASES[name]
    s = x[0] if shift == "near the mean" else 0.0
    y = x - s
    n, mean, m2 = M.shifted_moments(y, np.empty(y.size))
    expected = numpy_moments(x)
    assert n == expected[0]
    np.testing.assert_allclose(mean + s, expected[1], rtol=1e-12)
    np.testing.assert_allclose(m2, expected[2], rtol=1e-9)  # the 1e4 +- 1e-2 case: sum(y^2)/M2 ~ 1e12 unshifted


def test_one_pass_formula_would_fail_here():
    """The reason for the above: E[x^2] - E[x]^2 on 1e4 +- 1e-2 keeps few digits even in float64."""
    x = CASES["1e4 +- 1e-2 (a pressure in Pa)"]
    naive_m2 = float(np.dot(x, x) - x.sum() ** 2 / x.size)
    assert abs(naive_m2 - numpy_moments(x)[2]) / numpy_moments(x)[2] > 1e-6


def test_empty_inputs_are_neutral():
    assert M.vector_moments(np.empty(0)) == (0.0, 0.0, 0.0)
    assert M.shifted_moments(np.empty(0)) == (0.0, 0.0, 0.0)
    a = (5.0, 2.0, 3.0)
    assert M.merge_scalar(a, (0.0, 0.0, 0.0)) == a and M.merge_scalar((0.0, 0.0, 0.0), a) == a


def test_merge_equals_moments_of_the_union():
    """Chan's merge of two parts == moments of everything, per channel; count 0 is neutral on either side."""
    rng = np.random.default_rng(1)
    parts = [[rng.normal(1e4 * c, 1 + c, size) for c in range(3)] for size in (7, 1000, 1)]
    arrays = [np.array([numpy_moments(channel) for channel in part]).T for part in parts]  # (3, C) each
    total = M.empty_moments(3)
    for a in arrays:
        total = M.merge(total, a)
    for c in range(3):
        assert_moments_close(total[:, c], numpy_moments(np.concatenate([p[c] for p in parts])))
    # a channel that is empty in one operand takes the other operand's numbers unchanged
    a, b = arrays[0].copy(), arrays[1].copy()
    a[:, 1] = 0.0
    merged = M.merge(a, b)
    assert np.array_equal(merged[:, 1], b[:, 1])
    # the vector merge and the scalar merge are the same formula, to the bit
    for c in range(3):
        assert M.merge_scalar(tuple(arrays[0][:, c]), tuple(arrays[1][:, c])) == tuple(M.merge(arrays[0], arrays[1])[:, c])


def test_top_blocks_are_the_binary_digits():
    assert M.top_blocks(0) == []
    assert M.top_blocks(1) == [(0, 0)]
    assert M.top_blocks(13) == [(3, 0), (2, 2), (0, 12)]  # 13 = 8 + 4 + 1: items 0-7, 8-11, 12
    assert sum(1 << level for level, _ in M.top_blocks(1000)) == 1000


def leaves(n_items, n_channels, seed=2):
    rng = np.random.default_rng(seed)
    return [np.stack([rng.integers(0, 50, n_channels).astype(float),  # counts 0 are allowed
                      rng.normal(1e4, 1, n_channels), rng.uniform(0, 5, n_channels)]) for _ in range(n_items)]


def reduce(items, start, stop):
    reducer = M.PairwiseReducer()
    for i in range(start, stop):
        reducer.push(i, items[i])
    return reducer


def test_random_splits_rebuild_the_serial_tree_bitwise():
    """Any contiguous split into ranks, packed and merged, equals the serial reduction bit for bit."""
    rng = np.random.default_rng(1)
    n_items, n_channels = 37, 3
    items = leaves(n_items, n_channels)
    serial = reduce(items, 0, n_items)
    expected = M.combine_blocks(serial.as_dict(), n_items, n_channels)
    assert len(serial.blocks) == bin(n_items).count("1")
    for _ in range(20):
        cuts = sorted(rng.choice(np.arange(0, n_items + 1), size=rng.integers(1, 6)).tolist())
        bounds = [0, *cuts, n_items]
        packed = [M.pack_blocks(reduce(items, a, b).as_dict(), n_channels) for a, b in zip(bounds[:-1], bounds[1:])]
        assert all(p.shape == (M.MAX_BLOCKS, 3 + 3 * n_channels) for p in packed)  # fixed size for all_gather
        blocks = M.unpack_blocks(np.stack(packed), n_channels)
        assert np.array_equal(M.combine_blocks(blocks, n_items, n_channels), expected)
    # and the tree agrees with plain float64 weighted sums
    counts = np.array([m[0] for m in items])
    means = np.array([m[1] for m in items])
    np.testing.assert_allclose(expected[0], counts.sum(axis=0), rtol=0)
    np.testing.assert_allclose(expected[1], (counts * means).sum(axis=0) / counts.sum(axis=0), rtol=1e-13)


def test_a_range_reduces_to_few_blocks():
    items = leaves(1000, 1)
    for start, stop in [(0, 1000), (1, 999), (333, 777), (511, 513)]:
        n_blocks = len(reduce(items, start, stop).blocks)
        assert n_blocks <= 2 * max(1, (stop - start).bit_length())


def test_missing_or_double_counted_items_are_errors():
    items = leaves(8, 2)
    first, second = reduce(items, 0, 4).as_dict(), reduce(items, 5, 8).as_dict()
    with pytest.raises(ValueError, match="item 4 is covered by no block"):
        M.combine_blocks({**first, **second}, 8, 2)
    overlapping = reduce(items, 3, 8)  # item 3 again
    packed = np.stack([M.pack_blocks(first, 2), M.pack_blocks(overlapping.as_dict(), 2),
                       M.pack_blocks(reduce(items, 3, 4).as_dict(), 2)])
    with pytest.raises(ValueError, match="counted twice"):
        M.unpack_blocks(packed, 2)
    with pytest.raises(ValueError, match="blocks >"):
        M.pack_blocks({(0, i): items[0] for i in range(M.MAX_BLOCKS + 1)}, 2)
