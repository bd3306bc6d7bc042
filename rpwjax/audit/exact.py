r"""The exact check of ``rpwjax audit``: the largest log density ratio (or δ(ε)) of the density a mechanism claims.

It is driven only by the mechanism contract (``log_density``, ``sample``,
``pure``, ``discrete``, ``breakpoints``); :func:`~rpwjax.audit.checks.audit_mechanism`
and :mod:`rpwjax.audit.verify` both run :func:`exact_check`.

**1. Exact check** (of the density the mechanism *claims*). ε-label-DP of a
mechanism with density (or pmf) :math:`p(\tilde y \mid y)` is

.. math::
   \sup_{y, y' \in [lo, hi]} \; \sup_{\tilde y} \; \log p(\tilde y \mid y) - \log p(\tilde y \mid y') \le \varepsilon .

Labels run over a grid of ``[lo, hi]`` (ends included) plus the points just
either side of every label breakpoint the mechanism reports
(``breakpoints()``: where its behaviour in ``y`` changes). Outputs:

* discrete: the full output support, i.e. every value of the mechanism's array
  fields plus every value seen in a small sample at every grid label, kept
  where some label gives it positive mass. The pmf must sum to 1 on it at
  every label (to 1e-6), so no output of more mass was missed.
* continuous: a uniform grid of ``grid_size`` points over
  ``[lo - M, hi + M]`` (M doubled from Δ until the density at the ends is
  negligible, plus far probes), and both sides of every step edge of every
  label's density, found generically: each grid cell where ``log_density``
  changes is bisected 64 times (keeping the half with the larger change);
  where a jump survives, points at η = 1e-9·max(Δ, |ỹ|) either side of it are
  added. Not the adjacent floats: where edges of two labels coincide in exact
  arithmetic (staircase edges of y and y + Δ), rounding splits them by an ulp
  and ``log_density`` mixes the two sides in between, a float artefact with a
  spurious ratio. For a piecewise-constant density this makes the maximum
  exact up to pieces narrower than η; a piece narrower than the grid spacing
  with equal values on both sides can be missed (the spacing is reported).
  The density must integrate to 1 on the grid (to 1e-6) at every label.

The support (where ``log_density`` is finite) must not depend on the label:
one label with mass where another has none is an infinite ratio. Pure
mechanisms pass iff the maximum log ratio is at most ε + 1e-9.

Mechanisms that are only (ε, δ)-DP (``pure = False``, the Gaussian) have an
unbounded ratio; for them the check is the privacy-loss profile
(hockey-stick divergence) at the claimed ε, maximised over label pairs,

.. math::
   \delta(\varepsilon) = \max_{y, y'} \int \big(p(\tilde y \mid y) - e^{\varepsilon} p(\tilde y \mid y')\big)_+ \, d\tilde y \le \delta ,

integrated by the trapezoid rule on the same grid; it passes iff
δ(ε) ≤ δ·(1 + 1e-5) (the quadrature is accurate to about 1e-6 relative at the
default grid; the analytic calibration makes the exact δ(ε) equal δ, so some
slack is needed).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from rpwjax import realized
from rpwjax.mechanisms.base import Mechanism

RATIO_TOLERANCE = 1e-9  # pass iff max log ratio <= ε + this
DELTA_RELATIVE_TOLERANCE = 1e-5  # quadrature slack on δ(ε) for (ε, δ) mechanisms
MASS_TOLERANCE_CONTINUOUS = 1e-6  # |∫ p - 1| on the grid
MASS_TOLERANCE_DISCRETE = 1e-6  # |Σ p - 1| on the support (LP-fitted pmfs are normalised only to solver precision)
JUMP_TOLERANCE = 1e-10  # a log-density change that survives bisection is a step edge
EDGE_OFFSET = 1e-9  # points "just either side" of a step edge sit this far (relative to max(Δ, |ỹ|)) from it
BISECTION_STEPS = 64  # shrinks a cell by 2^-64: far below the η offset of the edge points
TAIL_NEGLIGIBLE = 1e-14  # stop widening the grid once density·margin at its ends is below this
MAX_MARGIN_DOUBLINGS = 16
FAR_PROBES = 4  # extra points at 2, 4, 8, 16 times the margin (tails of pure mechanisms)
PRESAMPLE = 4096  # per grid label, to find the outputs of a discrete mechanism

DEFAULT_GRID_SIZE = 20_001
DEFAULT_LABEL_GRID_SIZE = 33


# --------------------------------------------------------------------------- helpers


def _claimed(params: Mechanism) -> tuple[float, float, bool]:
    """(ε, δ, pure) as the params claim them; δ is 0 for pure mechanisms."""
    eps = float(np.asarray(params.epsilon))
    pure = bool(getattr(params, "pure", True))
    delta = 0.0 if pure else float(np.asarray(getattr(params, "delta", 0.0)))
    return eps, delta, pure


def _log_density_table(params: Mechanism):
    """A compiled ``(points (P,), labels (Y,)) -> log p (Y, P)``; params are closed over (any subclass works)."""

    @jax.jit
    def table(points, labels):
        yt = jnp.broadcast_to(points[None, :], (labels.shape[0], points.shape[0]))
        y = jnp.broadcast_to(labels[:, None], yt.shape)
        return params.log_density(yt, y)

    return lambda points, labels: np.asarray(
        table(jnp.asarray(points, jnp.float64), jnp.asarray(labels, jnp.float64)), np.float64
    )


def label_grid(params: Mechanism, size: int = DEFAULT_LABEL_GRID_SIZE) -> np.ndarray:
    """``size`` equally spaced labels on [lo, hi], plus each label breakpoint and its float neighbours (the
    realized check's fixed labels, :func:`rpwjax.realized.audit_labels`, at another grid size)."""
    return realized.audit_labels(params, size)


def _change(l1, l2, xp=jnp):
    """|l1 - l2| for log densities, infinite across a support edge, 0 off the support."""
    f1, f2 = xp.isfinite(l1), xp.isfinite(l2)
    both = f1 & f2
    return xp.where(both, xp.abs(xp.where(both, l1, 0.0) - xp.where(both, l2, 0.0)), xp.where(f1 | f2, xp.inf, 0.0))


def _edge_finder(params: Mechanism):
    """Compiled bisection: cells [a, b] of label y -> the cell shrunk 2^64-fold around its largest change,
    and that change."""

    @jax.jit
    def bisect(a, b, y):
        la, lb = params.log_density(a, y), params.log_density(b, y)

        def step(_, state):
            a, b, la, lb = state
            m = a + 0.5 * (b - a)
            lm = params.log_density(m, y)
            left = _change(la, lm) >= _change(lm, lb)
            return jnp.where(left, a, m), jnp.where(left, m, b), jnp.where(left, la, lm), jnp.where(left, lm, lb)

        a, b, la, lb = lax.fori_loop(0, BISECTION_STEPS, step, (a, b, la, lb))
        return a, b, _change(la, lb)

    return bisect


MAX_EDGE_ROUNDS = 32  # a grid cell may hold several step edges of one label: each round finds one more


def _step_edges(params: Mechanism, left, right, rows, labels):
    """Every step edge inside the cells [left, right] (of label ``labels[rows]``): (a, b, rows) per edge.

    Bisection finds the largest change of a cell; the two pieces beside it are
    searched again while their ends still differ, so two edges in one grid cell
    (a window edge a hair inside a support edge) are both found.
    """
    bisect = _edge_finder(params)
    density = jax.jit(lambda x, y: params.log_density(x, y))
    found_a, found_b, found_rows = [], [], []
    for _ in range(MAX_EDGE_ROUNDS):
        if left.size == 0:
            break
        a, b, jump = (np.asarray(v) for v in bisect(left, right, labels[rows]))
        edge = jump > JUMP_TOLERANCE
        found_a.append(a[edge])
        found_b.append(b[edge])
        found_rows.append(rows[edge])
        left = np.concatenate([left[edge], b[edge]])
        right = np.concatenate([a[edge], right[edge]])
        rows = np.concatenate([rows[edge], rows[edge]])
        y = labels[rows]
        change = _change(np.asarray(density(left, y)), np.asarray(density(right, y)), np)
        keep = (change > JUMP_TOLERANCE) & (right > left)
        left, right, rows = left[keep], right[keep], rows[keep]
    return np.concatenate(found_a), np.concatenate(found_b), np.concatenate(found_rows)


def _trapezoid_weights(points: np.ndarray) -> np.ndarray:
    gaps = np.diff(points)
    w = np.zeros_like(points)
    w[:-1] += gaps / 2
    w[1:] += gaps / 2
    return w


def _cell_masses(x: np.ndarray, log_p: np.ndarray) -> np.ndarray:
    r"""Mass of each cell [x_k, x_{k+1}] (rows of ``log_p`` are densities on sorted ``x``).

    Log-linear interpolation, :math:`h\,(p_1 - p_0)/(\log p_1 - \log p_0)`: exact for
    piecewise-constant and Laplace densities (whose kinks sit on grid points),
    O(h²) for smooth ones. A cell with a support edge inside uses the trapezoid
    rule; such cells are η wide.
    """
    h = np.diff(x)
    l0, l1 = log_p[..., :-1], log_p[..., 1:]
    both = np.isfinite(l0) & np.isfinite(l1)
    d = np.where(both, l1 - np.where(both, l0, 0.0), 0.0)
    p0, p1 = np.exp(l0), np.exp(l1)
    small = np.abs(d) < 1e-6
    with np.errstate(divide="ignore", invalid="ignore"):
        log_linear = np.where(small, p0 * (1 + d / 2 + d * d / 6), (p1 - p0) / np.where(small, 1.0, d))
    return h * np.where(both, log_linear, (p0 + p1) / 2)


# --------------------------------------------------------------------------- exact check


def _continuous_outputs(params, table, labels, grid_size):
    """Output points of a continuous mechanism: uniform grid, both sides of every step edge, far probes.

    Returns ``(points, n_quadrature, edges_by_label, info)``: the first
    ``n_quadrature`` points are sorted and carry the quadrature; the rest are
    the far probes (ratio only).
    """
    lo, hi = float(params.lo), float(params.hi)
    width = hi - lo
    ends = np.array([lo, hi])
    margin = width
    for _ in range(MAX_MARGIN_DOUBLINGS):
        edge_density = np.exp(table(np.array([lo - margin, hi + margin]), ends))
        if np.all(edge_density * margin <= TAIL_NEGLIGIBLE):
            break
        margin *= 2
    base = np.unique(np.concatenate([np.linspace(lo - margin, hi + margin, grid_size), labels]))
    values = table(base, labels)
    # every cell of every label's density where the value changes is bisected to its step edge (if any)
    rows, cells = np.nonzero(_change(values[:, :-1], values[:, 1:], np) > JUMP_TOLERANCE)
    a, b, rows = _step_edges(params, base[cells], base[cells + 1], rows, labels)
    edges_by_label = {i: np.sort(b[rows == i]) for i in range(labels.size)}
    # Just either side, but not at the adjacent floats: where two labels' edges coincide in exact
    # arithmetic (staircase edges of y and y + Δ), rounding of ỹ - y splits them by an ulp, and
    # between them log_density mixes the two sides (a sliver of width ~1e-16 with a spurious ratio).
    # (relative to the width; 64 float spacings of the edge where that is more: a range far from zero)
    eta = np.maximum(EDGE_OFFSET * width, 64 * np.spacing(np.abs(b)))
    near = np.concatenate([a - eta, b + eta])
    points = np.unique(np.concatenate([base, near]))
    far = margin * 2.0 ** np.arange(1, FAR_PROBES + 1)
    probes = np.concatenate([lo - far, hi + far])
    info = {
        "grid_margin": margin,
        "grid_spacing": (2 * margin + width) / (grid_size - 1),
        "step_edges_found": int(b.size),
    }
    return np.concatenate([points, probes]), points.size, edges_by_label, info


def _discrete_outputs(params, table, labels, seed):
    """Candidate outputs of a discrete mechanism: its array fields' values and a small sample at every label."""
    candidates = []
    if dataclasses.is_dataclass(params):
        for f in dataclasses.fields(params):
            if f.name in getattr(params, "derived_fields", ()):
                continue
            value = getattr(params, f.name)
            if isinstance(value, (str, bool)) or value is None:
                continue
            arr = np.asarray(value)
            if arr.ndim >= 1 and np.issubdtype(arr.dtype, np.number):
                candidates.append(arr.astype(np.float64).ravel())
    key = jax.random.fold_in(jax.random.key(seed), 2)
    y = jnp.broadcast_to(jnp.asarray(labels, jnp.float64)[:, None], (labels.size, PRESAMPLE))
    drawn = np.asarray(jax.jit(params.sample)(key, y), np.float64).ravel()
    candidates.append(drawn[np.isfinite(drawn)])
    points = np.unique(np.concatenate(candidates))
    values = table(points, labels)
    keep = np.isfinite(values).any(axis=0)
    return points[keep], {"support_size": int(keep.sum())}


def exact_check(params, labels, grid_size, seed):
    """The exact check of ``params`` (its ideal density) at ``labels``: the max log ratio (pure) or δ(ε), with
    the quadrature details (``rpwjax audit`` and :mod:`rpwjax.audit.verify` both run it)."""
    eps, delta, pure = _claimed(params)
    table = _log_density_table(params)
    if params.discrete:
        points, info = _discrete_outputs(params, table, labels, seed)
        n_quadrature, edges_by_label = points.size, {}
        weights = np.ones(points.size)
        mass_tolerance = MASS_TOLERANCE_DISCRETE
    else:
        points, n_quadrature, edges_by_label, info = _continuous_outputs(params, table, labels, grid_size)
        # trapezoid weights for δ(ε); the far probes carry none
        weights = np.zeros(points.size)
        weights[:n_quadrature] = _trapezoid_weights(points[:n_quadrature])
        mass_tolerance = MASS_TOLERANCE_CONTINUOUS
    L = table(points, labels)
    problems = []
    if np.isnan(L).any() or np.isposinf(L).any():
        problems.append("log_density returned NaN or +inf")
    density = np.exp(L)
    if params.discrete:
        mass = density.sum(axis=1)
    else:
        mass = _cell_masses(points[:n_quadrature], L[:, :n_quadrature]).sum(axis=1)
    if np.any(np.abs(mass - 1) > mass_tolerance):
        i = int(np.argmax(np.abs(mass - 1)))
        problems.append(
            f"the density sums to {mass[i]!r} at y={labels[i]!r} on the "
            + ("outputs found: the support is not fully known" if params.discrete else "grid: it does not cover the support")
        )

    finite = np.isfinite(L)
    some, every = finite.any(axis=0), finite.all(axis=0)
    depends = some & ~every
    top = np.where(some, L.max(axis=0), -np.inf)
    bottom = np.where(some, L.min(axis=0), np.inf)
    with np.errstate(invalid="ignore"):
        per_point = np.where(some, top - bottom, -np.inf)
    worst = int(np.argmax(per_point)) if points.size else 0
    max_ratio = float(per_point[worst]) if points.size else 0.0
    if depends.any():
        problems.append(f"the support depends on the label: {int(depends.sum())} outputs, e.g. {points[depends][0]!r}")

    lo_i, hi_i = 0, labels.size - 1
    with np.errstate(invalid="ignore"):
        d = L[lo_i] - L[hi_i]
        both = np.where(finite[lo_i] | finite[hi_i], np.maximum(d, -d), -np.inf)
    ratio_lo_hi = float(np.nanmax(both)) if points.size else 0.0
    worst_pair = (int(np.argmax(L[:, worst])), int(np.argmin(L[:, worst])))

    exact_delta, delta_pair = 0.0, (lo_i, hi_i)
    if not pure:
        grow = math.exp(eps)
        profile = np.array([np.maximum(density[i][None, :] - grow * density, 0.0) @ weights for i in range(labels.size)])
        delta_pair = np.unravel_index(int(np.argmax(profile)), profile.shape)
        exact_delta = float(profile[delta_pair])
        if profile[lo_i, hi_i] >= exact_delta * (1 - 1e-9) or profile[hi_i, lo_i] >= exact_delta * (1 - 1e-9):
            delta_pair = (lo_i, hi_i)
        exact_pass = exact_delta <= delta * (1 + DELTA_RELATIVE_TOLERANCE) and not problems
        pair = tuple(int(i) for i in delta_pair)
    else:
        exact_pass = max_ratio <= eps + RATIO_TOLERANCE and not problems
        # (lo, hi) is the worst pair for every mechanism here; anything strictly worse is audited instead
        pair = (lo_i, hi_i) if ratio_lo_hi >= max_ratio - RATIO_TOLERANCE else worst_pair

    info.update(
        labels=int(labels.size),
        outputs=int(points.size),
        mass_range=(float(mass.min()), float(mass.max())),
        worst_output=float(points[worst]) if points.size else None,
        worst_labels=(float(labels[worst_pair[0]]), float(labels[worst_pair[1]])),
        ratio_lo_hi=ratio_lo_hi,
        problems=problems,
    )
    return {
        "max_ratio": max_ratio,
        "delta": exact_delta,
        "pass": bool(exact_pass),
        "pair": pair,
        "points": points,
        "n_quadrature": n_quadrature,
        "L": L,
        "edges_by_label": edges_by_label,
        "info": info,
    }
