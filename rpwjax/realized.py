r"""The as-implemented privacy check: exact realized probabilities of what the release path emits.

The ideal density of a mechanism is not what ships. What ships is
:func:`rpwjax.sampling.released_values` applied to one of ``N = 2^52``
equally likely uniforms ``u_k = (k + 1/2)·2^-52``. For a label ``y`` the
*realized* probability of a released value ``c`` is

.. math::
   P(c \mid y) = \#\{k : \mathrm{release}(u_k, y) = c\} / N .

Every shipped sampler is non-decreasing in ``u`` (checked here on random
sorted ``k``), and so are the snap and the clamp, so the ``k`` that give ``c``
form an interval, and ``K(c) = \#\{k : \mathrm{release}(u_k, y) < c\}`` is found
exactly by bisection on ``k`` (vectorized over all cells and a batch of
labels; a first pass over every 2^36-th ``k`` brackets each threshold, so
the bisection takes 37 steps, not 53). The
cells are all values the release can emit: the grid points of the public
output range (continuous mechanisms, at most ``MAX_CELLS + 1``), or the
output values (discrete). Random ``k`` also confirm that every emitted value
is one of those cells.

Then, over a set of labels (range ends, both sides of every breakpoint, a
grid; ``rpwjax audit`` adds thousands of fresh random labels, streamed through
the per-cell maximum and minimum so that memory does not grow with them):

* pure mechanisms: ``realized_max_log_ratio`` = max over cells of
  log max_y P(c|y) - log min_y P(c|y) (infinite where one label can emit a
  value that another cannot); pass iff <= ε + :func:`tolerance` (ε), the smaller of
  :data:`REALIZED_TOLERANCE` and :data:`~rpwjax.grid.RELATIVE_TOLERANCE` · ε;
* (ε, δ) mechanisms: the realized δ, max over ordered label pairs of
  Σ_c max(0, P(c|y) - e^ε P(c|y')); pass iff <= δ.

The same code takes any other release rule (``value_fn`` and its count of
uniforms), e.g. a float32 sampler, whose realized probabilities it then
computes by enumerating all of its uniforms.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from rpwjax.grid import RELATIVE_TOLERANCE, UNIFORM_COUNT
from rpwjax.keys import SECRET_BYTES, Secret
from rpwjax.mechanisms.base import Mechanism
from rpwjax.sampling import released_values, spec, uniform_from_index

REALIZED_TOLERANCE = 1e-6  # the absolute part of tolerance(): what rounding may add to a log ratio at most
CHECK_DRAWS = 1 << 14  # random k per label for the monotonicity and membership checks
MAX_ENUMERATION = 1 << 25  # value_fn with at most this many uniforms may be enumerated
COARSE_BITS = 16  # the bracketing pass evaluates at most every (count / 2^16)-th uniform
LABEL_BATCH = 32  # labels bisected together (vmapped)
STREAM_BATCH = 256  # extra labels whose counts are held at once


def tolerance(epsilon):
    """How far a certified pure release's realized max log ratio may exceed ``epsilon``: ``min(1e-6, 1e-3·ε)``
    (elementwise), so the guarantee is ε-DP to 0.1% of ε, and to 1e-6 at every ε above 1e-3. Release grids
    are chosen to keep the rounding well inside it (:func:`rpwjax.grid.cell_count`)."""
    return np.minimum(REALIZED_TOLERANCE, RELATIVE_TOLERANCE * np.asarray(epsilon, np.float64))


class ValueFn:
    """``value_fn(k, y)`` split into a hashable rule ``fn(args, k, y)`` and its array arguments ``args``.

    The checks below are compiled once per rule and shape of ``args``, not once per parameter set: the
    shipped release's rule is its grid (:class:`_Shipped`), its arguments the parameters and output range.
    """

    def __init__(self, fn, args=()):
        self.fn, self.args = fn, args

    def __call__(self, k, y):
        return self.fn(self.args, k, y)


@dataclasses.dataclass(frozen=True)
class _Shipped:
    """The shipped release on ``grid`` (equal, and so one compiled check, for every parameter set of one
    class on it). The class's sampler and translation are part of the key: code that replaces them (a
    patched or wrapped sampler) is traced anew, never checked with the code compiled before."""

    grid: float | None
    sampler: Callable
    translated: Callable

    def __call__(self, args, k, y):
        params, low, high = args
        return released_values(params, self.grid, low, high, uniform_from_index(k), y)


@dataclasses.dataclass(frozen=True)
class _Plain:
    """A caller's ``value_fn(k, y)`` with no separate arguments (compiled for that function object)."""

    value_fn: Callable

    def __call__(self, args, k, y):
        return self.value_fn(k, y)


def _split(value_fn) -> tuple[Callable, Any]:
    return (value_fn.fn, value_fn.args) if isinstance(value_fn, ValueFn) else (_Plain(value_fn), ())


def shipped_value_fn(params: Mechanism, output_spec: dict | None = None):
    """(value_fn(k, y), N, cells) of the shipped release of ``params`` (with ``output_spec``, default its spec)."""
    s = spec(params) if output_spec is None else output_spec
    grid, low, high = s["grid"], float(np.min(s["low"])), float(np.max(s["high"]))
    rule = _Shipped(grid, type(params).sample_from_uniform, type(params).translated)
    value_fn = ValueFn(rule, (params, np.asarray(s["low"], np.float64), np.asarray(s["high"], np.float64)))
    if grid is None:
        cells = np.unique(np.asarray(params.outputs, np.float64))
    else:
        cells = np.arange(round(low / grid), round(high / grid) + 1, dtype=np.float64) * grid
    return value_fn, UNIFORM_COUNT, cells


@jax.jit
def _cdf_table(params, values, labels):
    """The mechanism's exact CDF at every (label, value)."""
    return params.cdf(values[None, :], labels[:, None])


def cdf_guess(params: Mechanism, grid) -> Callable | None:
    """Guesses of the shipped release's thresholds from the mechanism's exact CDF (None where it has none, or
    no grid): a value rounds up to a cell from its lower half-way point c - h/2 on, and uniform k is
    (k + 1/2)/N, so about N·F(c - h/2) - 1/2 uniforms fall below cell c; the lowest cell, where the clamp
    puts everything below it, has none below it."""
    cdf = getattr(params, "cdf", None)
    if cdf is None or grid is None:
        return None

    def guess(cells, labels):
        # padded as the check pads them, so that parameter sets share a compiled CDF
        wide = _padded_cells(np.asarray(cells, np.float64) - 0.5 * grid)
        ys = np.concatenate([labels, np.full(-labels.size % LABEL_BATCH, labels[0])])
        with jax.enable_x64(True):
            p = np.asarray(_cdf_table(params, jnp.asarray(wide), jnp.asarray(ys)), np.float64)
        out = np.ceil(np.clip(p[: labels.size, : cells.size], 0.0, 1.0) * UNIFORM_COUNT - 0.5).astype(np.int64)
        out[:, 0] = 0
        return out

    return guess


def audit_labels(params: Mechanism, grid_size: int = 17) -> np.ndarray:
    """The fixed labels of every realized check: range ends, a grid, every label breakpoint and both its float
    neighbours (where the realized pmf can change its form)."""
    lo, hi = float(params.lo), float(params.hi)
    points = [np.linspace(lo, hi, grid_size)]
    for b in params.breakpoints():
        b = np.asarray(b, np.float64).ravel()
        points += [b, np.nextafter(b, -np.inf), np.nextafter(b, np.inf)]
    labels = np.unique(np.concatenate(points))
    return labels[(labels >= lo) & (labels <= hi)]


def fresh_labels(params: Mechanism, count: int, seed: int) -> np.ndarray:
    """``count`` labels drawn uniformly on [lo, hi] from ``seed`` (the audit draws its seed from OS entropy)."""
    return np.random.default_rng(seed).uniform(float(params.lo), float(params.hi), int(count))


@partial(jax.jit, static_argnames=("fn", "count"))
def _thresholds(fn, count, args, cells, labels):
    """K[l, j] = #{k < count : fn(args, k, labels[l]) < cells[j]} by bisection (non-decreasing in k).

    A first pass evaluates every ``stride``-th k; where a cell falls among those values brackets its threshold
    to ``stride`` uniforms, then bisection finishes it. Labels are bisected together (vmapped).
    """
    count = int(count)
    bits = min(COARSE_BITS, int(cells.shape[0]).bit_length() + 1)  # 2^bits evaluations save bits steps per cell
    stride = max(count >> bits, 1)
    coarse_k = jnp.arange(0, count, stride, dtype=jnp.int64)  # k_j = j·stride < count
    ends = jnp.concatenate([coarse_k, jnp.array([count], jnp.int64)])
    steps = stride.bit_length() + 1

    def one(y):
        v = fn(args, coarse_k, y)
        j = jnp.searchsorted(v, cells, side="left")  # #{j : v_j < c}: the threshold is in (k_{j-1}, k_j]
        low = jnp.where(j > 0, ends[jnp.maximum(j - 1, 0)] + 1, 0)
        high = jnp.where(j > 0, ends[j], 0)

        def body(_, state):
            low, high = state
            mid = (low + high) // 2
            below = fn(args, jnp.minimum(mid, count - 1), y) < cells
            return jnp.where(below, mid + 1, low), jnp.where(below, high, mid)

        return lax.fori_loop(0, steps, body, (low, high))[0]

    return jax.vmap(one)(labels)


GUESS_REACH = 2  # a guess is searched within this many uniforms either side (2·reach + 2 evaluations)


@partial(jax.jit, static_argnames=("fn", "count"))
def _confirmed(fn, count, args, cells, labels, guess):
    """The thresholds K of :func:`_thresholds` near their guesses (labels × cells), and which were found: with
    r = :data:`GUESS_REACH`, K is in [g - r, g + r] when fn(g - r - 1) < cell <= fn(g + r) (each side holds
    at the ends 0 and count), and is then g - r plus the count of k in [g - r, g + r) with fn(k) < cell."""

    def one(y, g):
        first = g - GUESS_REACH
        ks = [first - 1 + i for i in range(2 * GUESS_REACH + 2)]
        below = [fn(args, jnp.clip(k, 0, count - 1), y) < cells for k in ks]
        found = (below[0] | (first - 1 < 0)) & (~below[-1] | (ks[-1] >= count))
        inside = sum(((k >= 0) & (k < count) & b).astype(jnp.int64) for k, b in zip(ks[1:-1], below[1:-1]))
        return jnp.clip(first, 0, count) + inside, found

    return jax.vmap(one)(labels, guess)


@partial(jax.jit, static_argnames=("fn", "count"))
def _bisected(fn, count, args, cells, labels):
    """K[i] = #{k < count : fn(args, k, labels[i]) < cells[i]} by bisection over all of [0, count], one pair
    (label, cell) per entry."""
    steps = int(count).bit_length() + 1

    def one(y, c):
        def body(_, state):
            low, high = state
            mid = (low + high) // 2
            below = (fn(args, jnp.minimum(mid, count - 1)[None], y)[0] < c) & (mid < count)
            return jnp.where(below, mid + 1, low), jnp.where(below, high, mid)

        return lax.fori_loop(0, steps, body, (jnp.int64(0), jnp.int64(count)))[0]

    return jax.vmap(one)(labels, cells)


def _guessed_thresholds(fn, count: int, args, cells: np.ndarray, labels: np.ndarray, guess: np.ndarray):
    """The thresholds of :func:`_thresholds` from a guess of each (labels × cells, e.g. from the mechanism's
    exact CDF): found near the guess where a few evaluations can (:func:`_confirmed`), the rest bisected one
    pair at a time (:func:`_bisected`). Exact as the bisection is: each threshold is the first k with
    fn(k) >= cell, given that fn is non-decreasing in k (checked on random draws, as for the bisection), as
    fn computes in the graph that evaluates it. XLA need not round alike in every compiled graph: at a tiny ζ
    (1e-6) one uniform in a cell was seen to land in the next cell in one graph and not in the other, moving
    the realized ratio by about 2e-13, far inside the certificate's tolerance."""
    n_labels, n_cells = guess.shape
    wide = _padded_cells(cells)
    pad_rows = -n_labels % LABEL_BATCH
    ys = np.concatenate([labels, np.full(pad_rows, labels[0])])
    g = np.full((ys.size, wide.size), count, np.int64)  # +inf cells and padded labels: count, confirmed at once
    g[:n_labels, :n_cells] = np.clip(guess, 0, count)
    parts = [_confirmed(fn, int(count), args, jnp.asarray(wide), jnp.asarray(ys[i:i + LABEL_BATCH]),
                        jnp.asarray(g[i:i + LABEL_BATCH])) for i in range(0, ys.size, LABEL_BATCH)]
    ok = np.concatenate([np.asarray(found) for _, found in parts])
    out = np.concatenate([np.asarray(k, np.int64) for k, _ in parts])[:n_labels, :n_cells].copy()
    rows, cols = np.nonzero(~ok[:n_labels, :n_cells])
    if rows.size:
        size = max(256, 1 << int(rows.size - 1).bit_length())  # padded to a power of two: few compiled sizes
        pick = np.concatenate([np.arange(rows.size), np.zeros(size - rows.size, np.int64)])
        found = np.asarray(_bisected(fn, int(count), args, jnp.asarray(cells[cols[pick]]),
                                     jnp.asarray(labels[rows[pick]])), np.int64)
        out[rows, cols] = found[: rows.size]
    return out


@partial(jax.jit, static_argnames=("fn",))
def _evaluate(fn, args, k, labels):
    return jax.vmap(lambda y: fn(args, k, y))(labels)


def _padded_cells(cells: np.ndarray) -> np.ndarray:
    """``cells`` then +inf up to a power of two (at least 64), so that parameter sets with different numbers
    of cells share a compiled check; every uniform is below +inf, so a padded cell's threshold is ``count``
    and it is dropped."""
    size = max(64, 1 << int(cells.size - 1).bit_length())
    return np.concatenate([cells, np.full(size - cells.size, np.inf)])


def realized_counts(value_fn: Callable, count: int, labels, cells=None, guess: Callable | None = None
                    ) -> dict[str, Any]:
    """Counts (L, C) of uniforms per cell and label, and the problems found on the way.

    With ``cells`` given, by bisection (``value_fn`` must be non-decreasing in
    ``k``; checked); without, by enumerating all ``count`` uniforms. ``guess(cells, labels)``, if given, guesses
    every threshold (labels × cells, the count of uniforms below each cell), searched near the guess first
    and bisected where it is not found there (:func:`_guessed_thresholds`): the same counts, found faster.
    """
    labels = np.asarray(labels, np.float64)
    problems: list[str] = []
    fn, args = _split(value_fn)
    with jax.enable_x64(True):
        if cells is None:
            if count > MAX_ENUMERATION:
                raise ValueError(f"enumerating {count} uniforms is too many; give the cells")
            k = jnp.arange(count, dtype=jnp.int64)
            values = np.asarray(_evaluate(fn, args, k, jnp.asarray(labels)), np.float64)
            cells = np.unique(values)
            counts = np.stack([np.bincount(np.searchsorted(cells, v), minlength=cells.size) for v in values])
            return {"cells": cells, "counts": counts, "problems": problems}
        cells = np.asarray(cells, np.float64)
        padded = np.concatenate([labels, np.full(-labels.size % LABEL_BATCH, labels[0] if labels.size else 0.0)])
        wide = jnp.asarray(_padded_cells(cells))
        if guess is not None and labels.size:
            thresholds = _guessed_thresholds(fn, int(count), args, cells, labels,
                                             np.asarray(guess(cells, labels), np.int64))
        else:
            thresholds = np.concatenate([
                np.asarray(_thresholds(fn, int(count), args, wide, jnp.asarray(batch)), np.int64)[:, : cells.size]
                for batch in padded.reshape(-1, LABEL_BATCH)])[: labels.size]
        draws = np.sort(np.random.default_rng(1).integers(0, count, CHECK_DRAWS))
        draws[0], draws[-1] = 0, count - 1
        values = np.concatenate([
            np.asarray(_evaluate(fn, args, jnp.asarray(draws, jnp.int64), jnp.asarray(batch)), np.float64)
            for batch in padded.reshape(-1, LABEL_BATCH)])[: labels.size]
    decreasing = int(np.count_nonzero(np.diff(values, axis=1) < 0))
    if decreasing:
        problems.append(f"the release is not monotone in the uniform ({decreasing} decreases in {values.size} draws)")
    known = cells if np.all(np.diff(cells) > 0) else np.unique(cells)  # sorted: found without sorting the draws
    outside = int(np.count_nonzero(known[np.clip(np.searchsorted(known, values), 0, known.size - 1)] != values)
                  if known.size else values.size)
    if outside:
        problems.append(f"{outside} released values in {values.size} draws are not among the {cells.size} output cells")
    if np.any(thresholds[:, 0] > 0):
        problems.append("some uniforms release a value below the lowest output cell")
    counts = np.diff(np.concatenate([thresholds, np.full((labels.size, 1), count)], axis=1), axis=1)
    return {"cells": cells, "counts": counts, "problems": problems}


def max_log_ratio(counts: np.ndarray) -> float:
    """max over cells of log(max_l count) - log(min_l count); inf where some label has none and another has some."""
    high, low = counts.max(axis=0), counts.min(axis=0)
    used = high > 0
    if np.any(used & (low == 0)):
        return float("inf")
    return float(np.max(np.log(high[used].astype(np.float64)) - np.log(low[used].astype(np.float64))))


def realized_delta(counts: np.ndarray, count: int, epsilon: float) -> float:
    """max over ordered label pairs of Σ_c max(0, P(c|y) - e^ε P(c|y'))."""
    p = counts.astype(np.float64) / count
    growth = np.exp(epsilon)
    return float(max(np.maximum(p[i][None, :] - growth * p, 0.0).sum(axis=1).max() for i in range(p.shape[0])))


def release_mse(cells, counts, count, labels) -> np.ndarray:
    """E[(released - y)²] per label, from the realized probabilities."""
    p = counts.astype(np.float64) / count
    return np.sum(p * (cells[None, :] - np.asarray(labels)[:, None]) ** 2, axis=1)


def _pair_delta(p: np.ndarray, q: np.ndarray, growth: float) -> float:
    """max over rows i of p, j of q of Σ_c max(0, p_i - e^ε q_j) (both directions are the caller's)."""
    return float(max(np.maximum(row[None, :] - growth * q, 0.0).sum(axis=1).max() for row in p))


def check(params: Mechanism, *, labels=None, value_fn=None, count=None, cells=None, output_spec=None,
          extra_labels=None) -> dict[str, Any]:
    """The as-implemented check of ``params`` (default: its shipped release, with ``output_spec``).

    ``labels`` (default :func:`audit_labels`) are all compared with each other; ``extra_labels`` (the audit's
    fresh labels) are streamed in batches into the per-cell maximum and minimum count (and, for δ, compared
    with every one of ``labels``). Returns ``realized_max_log_ratio``, ``realized_delta`` (at the claimed ε),
    ``pass``, ``problems``, the release's ``output_grid``/``output_range``, the fewest uniforms in a used
    cell, and ``release_mse_change``: the relative change of the label MSE (mean over ``labels``) that the
    grid and the clamp cause against the ideal mechanism's ``mse``.
    """
    eps = float(np.asarray(params.epsilon))
    pure = bool(getattr(params, "pure", True))
    delta = 0.0 if pure else float(np.asarray(params.delta))
    if labels is None:
        labels = audit_labels(params)
    info: dict[str, Any] = {}
    guess = None
    if value_fn is None:
        s = spec(params) if output_spec is None else output_spec
        value_fn, count, cells = shipped_value_fn(params, s)
        info.update(output_grid=s["grid"], output_range=[float(np.min(s["low"])), float(np.max(s["high"]))])
        guess = cdf_guess(params, s["grid"])
    result = realized_counts(value_fn, count, labels, cells, guess)
    counts, cells = result["counts"], result["cells"]
    problems = list(result["problems"])
    top, bottom = counts.max(axis=0), counts.min(axis=0)
    real_delta = realized_delta(counts, count, eps)
    extra = np.asarray([] if extra_labels is None else extra_labels, np.float64).ravel()
    growth = np.exp(eps)
    for start in range(0, extra.size, STREAM_BATCH):
        part = realized_counts(value_fn, count, extra[start : start + STREAM_BATCH], cells, guess)
        problems += [p for p in part["problems"] if p not in problems]
        top, bottom = np.maximum(top, part["counts"].max(axis=0)), np.minimum(bottom, part["counts"].min(axis=0))
        if not pure:
            p, q = part["counts"] / count, counts / count
            real_delta = max(real_delta, _pair_delta(p, q, growth), _pair_delta(q, p, growth))
    ratio = max_log_ratio(np.stack([top, bottom]))
    used = top > 0
    if pure and not ratio <= eps + tolerance(eps):
        problems.append(f"realized max log ratio {ratio:.9g} exceeds epsilon={eps:g} + {float(tolerance(eps)):g}")
    if not pure and not real_delta <= delta:
        problems.append(f"realized delta {real_delta:.6g} at epsilon={eps:g} exceeds delta={delta:g}")
    with jax.enable_x64(True):
        ideal = np.asarray(params.mse(jnp.asarray(labels, jnp.float64)), np.float64)
    shipped = release_mse(cells, counts, count, labels)
    info.update(
        labels=int(np.size(labels) + extra.size),
        fresh_labels=int(extra.size),
        cells=int(used.sum()),
        uniforms=int(count),
        fewest_uniforms_in_a_cell=int(bottom[used].min()) if used.any() else 0,
        release_mse_change=float(shipped.mean() / ideal.mean() - 1.0),
    )
    return {
        "realized_max_log_ratio": ratio,
        "realized_delta": real_delta,
        "pass": not problems,
        "problems": problems,
        "info": info,
    }


def key_space_check(derive: Callable[[bytes, int], np.ndarray] | None = None) -> dict[str, Any]:
    """Every bit of the secret reaches every block key, and blocks get different keys.

    ``derive(material, block)`` returns a block's key data (default: the
    shipped :meth:`rpwjax.keys.Secret.stream_key` for purpose ``"labels"``).
    Flipping each of the 256 bits of a fixed secret, and moving to the next
    block, must give 2·257 pairwise different keys; a derivation that keeps
    only part of the secret (e.g. an integer seed truncated to 32 bits) fails.
    """
    if derive is None:
        derive = lambda material, block: Secret(material).stream_key("labels", block)  # noqa: E731
    base = bytes(range(7, 7 + SECRET_BYTES))
    variants = [base] + [
        bytes(b ^ (1 << (i % 8)) if j == i // 8 else b for j, b in enumerate(base)) for i in range(8 * SECRET_BYTES)
    ]
    keys = {tuple(np.asarray(derive(m, block), np.uint32).ravel().tolist()) for m in variants for block in (0, 1)}
    bits = 32 * len(next(iter(keys)))
    problems = []
    if bits < 128:
        problems.append(f"block keys have {bits} bits (< 128)")
    if len(keys) != 2 * len(variants):
        problems.append(f"only {len(keys)} distinct keys for {2 * len(variants)} (secret, block) pairs: "
                        "some secret bits do not reach the key")
    return {"pass": not problems, "key_bits": bits, "distinct_keys": len(keys), "problems": problems}
