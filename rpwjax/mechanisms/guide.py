r"""Guide tables: a search over a short sorted array in a few fixed steps instead of a full binary search.

A release looks up, for every label, where the label falls among the
mechanism's breakpoints (Unbiased's support, RR-on-Bins' group thresholds) and,
for Unbiased, where the uniform falls in the label's cumulative probabilities.
A full binary search costs ⌈log₂ n⌉ dependent gathers per row. A guide table
cuts the public interval into :data:`BUCKETS` equal buckets (a uniform's
(0, 1) into :data:`UNIFORM_BUCKETS`: equal ones in the middle, finer ones in
the tails) and stores, per bucket, the counts at its two ends, widened by a
margin that covers the rounding of the bucket index. The exact answer lies
between them, and a binary search over that bracket finishes it. ``steps``,
the largest bracket's ⌈log₂(width + 1)⌉ over the whole table, is a static
number: 1-2 for the label searches seen, 1-3 for Unbiased's outputs at ε ≤ 1
and up to 6 at ε = 11 (against 7-10 for a full search).

The result is the exact count that the full search returns. The bracket only
limits where the search looks, and the last comparisons are the same
comparisons of the same values, so a release through the guide is bit for bit
the release through a full binary search: the same outputs, the same monotone
map from uniforms to outputs, and so the same realized probabilities.

Tables are built on the host in float64 from concrete parameters. The traced
functions are used only for float64 inputs, because the margins are sized for
float64 rounding; a caller falls back to the full search otherwise.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

BUCKETS = 1024  # buckets per table (a power of two: a float64 uniform times it is exact)
_POSITION_MARGIN = 1e-12  # relative to hi - lo (see count_brackets)


def steps(low, high) -> int:
    """Binary-search steps that finish every bracket [low, high] of a table (at least one)."""
    width = np.asarray(high, np.int64) - np.asarray(low, np.int64)
    return max(1, math.ceil(math.log2(int(np.max(width, initial=0)) + 1)))


def count_brackets(points, lo: float, hi: float, side: str, buckets: int = BUCKETS):
    """(low, high, steps) for :func:`guided_count` over the last axis of ``points`` (sorted), labels in [lo, hi].

    ``side="right"`` counts points ``<= y``, ``"left"`` points ``< y``. ``low``/``high`` have shape
    ``points.shape[:-1] + (buckets,)`` (int32).
    """
    points = np.asarray(points, np.float64)
    lo, hi = float(lo), float(hi)
    # the bucket index floor((y - lo) * buckets / (hi - lo)) carries a few roundings relative to hi - lo, the
    # host's bucket edges one at the range's magnitude: this margin is far above both
    margin = _POSITION_MARGIN * (hi - lo) + 8.0 * float(np.spacing(max(abs(lo), abs(hi))))
    edges = lo + (hi - lo) * (np.arange(buckets + 1) / buckets)
    flat = points.reshape(-1, points.shape[-1])
    # labels are in [lo, hi]: a bucket's labels lie in [start - margin, end + margin] cut to [lo, hi] (points
    # at hi, such as RR-on-Bins' padding, then never widen the last bucket)
    start, end = np.maximum(edges[:-1] - margin, lo), np.minimum(edges[1:] + margin, hi)
    low = np.stack([np.searchsorted(row, start, side=side) for row in flat])
    high = np.stack([np.searchsorted(row, end, side=side) for row in flat])
    shape = points.shape[:-1] + (buckets,)
    return low.reshape(shape).astype(np.int32), high.reshape(shape).astype(np.int32), steps(low, high)


def _bucket(x, start, scale, buckets):
    return jnp.clip(jnp.floor((x - start) * scale), 0, buckets - 1).astype(jnp.int32)


def guided_count(points, low, high, steps: int, lo: float, hi: float, y, side: str):
    """``jnp.searchsorted(points, y, side=side)`` for ``y`` in [lo, hi] (float64), through the tables of
    :func:`count_brackets`."""
    buckets = low.shape[-1]
    c = _bucket(y, lo, buckets / (hi - lo), buckets)
    first, last = jnp.asarray(low)[c], jnp.asarray(high)[c]
    points = jnp.asarray(points)
    n = points.shape[-1]
    for _ in range(steps):
        mid = (first + last) // 2
        x = points[jnp.minimum(mid, n - 1)]
        more = (first < last) & ((x <= y) if side == "right" else (x < y))
        first = jnp.where(more, mid + 1, first)
        last = jnp.where(more, last, mid)
    return first


# Buckets of a uniform u in (0, 1): 1024 equal buckets in the middle, and in each tail (u or 1 - u below
# 2^-6) buckets of 1/16 of an octave, read off the float's exponent and top mantissa bits, so that outputs of
# tiny probability (the tails of a large ε) spread over many buckets too.
_TAIL_EXPONENT = 6  # the tails are u < 2^-6 and 1 - u < 2^-6
_MANTISSA_BITS = 4  # buckets per octave in the tails: 2^4
_SMALLEST_EXPONENT = 53  # u and 1 - u are at least 2^-53 (uniforms are (i + 1/2) 2^-52)
_TAIL = (_SMALLEST_EXPONENT - _TAIL_EXPONENT) << _MANTISSA_BITS  # buckets per tail
_MIDDLE = 1024  # equal buckets over [0, 1); those of [2^-6, 1 - 2^-6] are used
_FIRST_MIDDLE = _MIDDLE >> _TAIL_EXPONENT
_LAST_MIDDLE = _MIDDLE - _FIRST_MIDDLE  # floor(u * 1024) reaches this at u = 1 - 2^-6
UNIFORM_BUCKETS = 2 * _TAIL + _LAST_MIDDLE - _FIRST_MIDDLE + 1
_BIAS = (1023 - _SMALLEST_EXPONENT) << _MANTISSA_BITS  # the key of 2^-53


def _tail_key(v):
    """Bucket of ``v`` in [2^-53, 2^-6) within its tail: exponent and top mantissa bits, minus those of 2^-53."""
    bits = jax.lax.bitcast_convert_type(v, jnp.int64) >> (52 - _MANTISSA_BITS)
    return jnp.clip(bits - _BIAS, 0, _TAIL - 1).astype(jnp.int32)


def uniform_bucket(u):
    """The bucket of each float64 uniform: non-decreasing in ``u``; :func:`uniform_bucket_edges` bounds them."""
    upper = u > 0.5
    v = jnp.where(upper, 1.0 - u, u)  # exact for u >= 1/2
    tail = v < 2.0 ** -_TAIL_EXPONENT
    key = _tail_key(v)
    middle = _TAIL + jnp.floor(u * _MIDDLE).astype(jnp.int32) - _FIRST_MIDDLE
    return jnp.where(tail, jnp.where(upper, UNIFORM_BUCKETS - 1 - key, key), middle)


def uniform_bucket_edges():
    """(start, end), float64 (UNIFORM_BUCKETS,): every uniform of bucket b lies in [start[b], end[b]]."""
    key = np.arange(_TAIL + 1, dtype=np.int64)
    tail_edges = ((key + _BIAS) << (52 - _MANTISSA_BITS)).view(np.float64)  # [2^-53, ..., 2^-6]
    middle = np.arange(_FIRST_MIDDLE, _LAST_MIDDLE + 1)
    start = np.concatenate([tail_edges[:-1], middle / _MIDDLE, 1.0 - tail_edges[1:][::-1]])
    end = np.concatenate([tail_edges[1:], (middle + 1) / _MIDDLE, 1.0 - tail_edges[:-1][::-1]])
    return start, end


def cdf_brackets(probabilities):
    """(low, high, steps) for :func:`guided_inverse_cdf`: per pair of consecutive rows (j, j + 1) of the
    row-stochastic ``probabilities`` (..., k, M) and per bucket of the uniform (:func:`uniform_bucket`), the range
    of output slots where the inverse CDF of any mixture of the two rows can lie. Shapes
    ``(..., k - 1, UNIFORM_BUCKETS)`` (int32)."""
    probabilities = np.asarray(probabilities, np.float64)
    size = probabilities.shape[-1]
    # any order of summation of the cumulative sums, and the rounding of the mixture, stay well inside this
    margin = max(1e-12, 8.0 * size * np.finfo(np.float64).eps)
    cdf = np.cumsum(probabilities, axis=-1)[..., :-1]  # the last slot is always the end
    cdf = cdf.reshape((-1,) + cdf.shape[-2:])
    start, end = uniform_bucket_edges()
    # slots surely counted (C + margin <= start) and surely not (C - margin > end)
    below = np.stack([[np.searchsorted(row + margin, start, side="right") for row in rows] for rows in cdf])
    above = np.stack([[np.searchsorted(row - margin, end, side="right") for row in rows] for rows in cdf])
    # slots whose cumulative probability is exactly zero (the padding of a stacked fit) are summed from zeros
    # alone, so they are exactly zero in any order of summation and count for every uniform (u > 0)
    below = np.maximum(below, (cdf == 0).sum(-1)[..., None])
    low = np.minimum(below[:, :-1], below[:, 1:])
    high = np.maximum(above[:, :-1], above[:, 1:])
    shape = probabilities.shape[:-2] + low.shape[-2:]
    return low.reshape(shape).astype(np.int32), high.reshape(shape).astype(np.int32), steps(low, high)


def guided_inverse_cdf(cdf, low, high, steps: int, lower, upper, w, u):
    """The number of slots m < M - 1 with ``w·cdf[lower, m] + (1 - w)·cdf[upper, m] <= u`` (the inverse CDF of the
    mixture at ``u``; ``upper = lower + 1``), through the tables of :func:`cdf_brackets` (float64)."""
    b = uniform_bucket(u)
    size = cdf.shape[-1]
    if size < 1 << 15:
        # both ends of the bracket in one int32 (high in the top half): one gather per row instead of two (the
        # packed table is loop-invariant, so XLA builds it once per release, not once per block)
        both = (jnp.asarray(low) | (jnp.asarray(high) << 16))[lower, b]
        first, last = both & 0xFFFF, both >> 16
    else:
        first, last = jnp.asarray(low)[lower, b], jnp.asarray(high)[lower, b]
    for _ in range(steps):
        mid = (first + last) // 2
        mixed = w * cdf[lower, mid] + (1 - w) * cdf[upper, mid]
        more = (first < last) & (mixed <= u) & (mid < size - 1)
        first = jnp.where(more, mid + 1, first)
        last = jnp.where(more, last, mid)
    return first
