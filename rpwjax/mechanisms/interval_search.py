r"""Exact interval search for RPWithPrior (Dinkelbach over sorted candidates).

For a half-width ζ the objective is a single-ratio fractional program

.. math::
   J(A_1, A_2) = \frac{G_2(A_2) - G_1(A_1)}{2\zeta + e^{-\varepsilon}(A_2 - A_1)},
   \qquad lo \le A_1 \le A_2 \le hi,

with, writing :math:`H(x) = E[(x - Y)_+]`,

* ``"neighborhood"`` (P(|Ỹ - Y| <= ζ)): :math:`G_1(a) = E[\mathrm{clip}(a - Y, 0, 2\zeta)] = H(a) - H(a - 2\zeta)`,
  :math:`G_2(b) = E[\mathrm{clip}(b + 2\zeta - Y, 0, 2\zeta)] = H(b + 2\zeta) - H(b)`;
* ``"inside"`` (the paper's Algorithm 1): :math:`G_1(a) = 2\zeta P(Y < a)`, :math:`G_2(b) = 2\zeta P(Y \le b)`.

Dinkelbach: with λ the ratio at the current point, maximise
:math:`F_2(b) - F_1(a)`, :math:`F_i(x) = G_i(x) - \lambda e^{-\varepsilon} x`, over
:math:`a \le b` by a running minimum of :math:`F_1` over sorted candidates; set λ to
the ratio at the maximiser; stop when λ no longer increases (then λ is optimal).

Candidates. Both G are piecewise quadratic (piecewise linear for point
masses) on the partition of [lo, hi] by the prior's breakpoints p and
p ± 2ζ (for point masses the support points alone suffice, see
:func:`partition`). An optimum of the inner problem has each coordinate at a partition
point, at a stationary point of its F on a piece (these depend on λ and are
recomputed each step from the piece's quadratic coefficients), or on the
diagonal a = b at a stationary point of G_2 - G_1 (fixed). For point masses
the pieces are linear, so the fixed partition alone is exact and the G values
are computed once per (prior, ζ) and shared by every ε.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

OBJECTIVES = ("neighborhood", "inside")
_MAX_ITERATIONS = 100


def g_functions(prior, zeta, objective: str):
    """(G1, G2) for a prior and half-width (see module docstring)."""
    if objective == "neighborhood":
        h = prior.partial_expectation

        def g1(a):
            return h(a) - h(a - 2 * zeta)

        def g2(b):
            return h(b + 2 * zeta) - h(b)

    elif objective == "inside":

        def g1(a):
            return 2 * zeta * prior.cdf(a, strict=True)

        def g2(b):
            return 2 * zeta * prior.cdf(b)

    else:
        raise ValueError(f"objective must be 'neighborhood' or 'inside', got objective={objective!r}")
    return g1, g2


def partition(prior, zeta, objective: str):
    """Sorted candidate points in [lo, hi] (fixed size; depends on ζ but not ε).

    Point masses: the support points and lo, hi suffice for both objectives.
    F1 = G1 - c·a is piecewise linear with slope P(a - 2ζ < Y < a) - c, which
    rises only at support points (a label enters the window) and falls at
    y + 2ζ, so every local minimum of F1 sits at a support point or an end;
    likewise F2 = G2 - c·b rises at y - 2ζ and falls at y, so its local maxima
    sit at support points; on the diagonal a = b the slope of G2 - G1 falls
    only at support points. Histograms: the bin edges and, for the
    neighbourhood objective, the edges shifted by ±2ζ (where the quadratic
    pieces of G change).
    """
    ends = jnp.array([prior.lo, prior.hi], dtype=jnp.asarray(prior.left).dtype)
    if prior.discrete:
        # already sorted and inside [lo, hi]: no sort needed
        return jnp.concatenate([ends[:1], jnp.asarray(prior.left), ends[1:]])
    points = jnp.concatenate([jnp.asarray(prior.left), jnp.asarray(prior.right)])
    if objective == "neighborhood":
        points = jnp.concatenate([points, points - 2 * zeta, points + 2 * zeta])
    return jnp.sort(jnp.clip(jnp.concatenate([points, ends]), prior.lo, prior.hi))


def _quadratic_pieces(g, t):
    """Per piece [t_k, t_k+1]: value g0, slope d and curvature q with g(t_k + h) = g0 + d h + q h²."""
    left, right = t[:-1], t[1:]
    length = right - left
    g0, gm, g1 = g(left), g(0.5 * (left + right)), g(right)
    kappa = 2 * (g0 - 2 * gm + g1)
    beta = g1 - g0 - kappa
    safe = jnp.where(length > 0, length, 1.0)
    d = jnp.where(length > 0, beta / safe, 0.0)
    q = jnp.where(length > 0, kappa / safe**2, 0.0)
    return d, q


def _stationary(t, d, q, c):
    """Stationary point of g(x) - c x on each piece (clamped into the piece)."""
    left, right = t[:-1], t[1:]
    h = jnp.where(q != 0, (c - d) / jnp.where(q != 0, 2 * q, 1.0), 0.0)
    return jnp.clip(left + h, left, right)


def make_tables(prior, zeta, objective: str):
    """Everything the ε loop needs that does not depend on ε."""
    g1, g2 = g_functions(prior, zeta, objective)
    t = partition(prior, zeta, objective)
    if prior.discrete and objective == "neighborhood":
        # t = [lo, support..., hi]: H(t) comes straight from prefix sums, only the
        # shifted points need a search (this is the hot path for large label sets)
        left, mass = jnp.asarray(prior.left), jnp.asarray(prior.mass)
        cum_mass, cum_first = jnp.cumsum(mass), jnp.cumsum(mass * left)
        h_support = left * cum_mass - cum_first
        h_t = jnp.concatenate([jnp.zeros(1, t.dtype), h_support, (prior.hi * cum_mass[-1] - cum_first[-1])[None]])
        h = prior.partial_expectation
        return {"t": t, "g1": h_t - h(t - 2 * zeta), "g2": h(t + 2 * zeta) - h_t}
    tables = {"t": t, "g1": g1(t), "g2": g2(t)}
    if not prior.discrete and objective == "neighborhood":
        d1, q1 = _quadratic_pieces(g1, t)
        d2, q2 = _quadratic_pieces(g2, t)
        tables.update(d1=d1, q1=q1, d2=d2, q2=q2, diagonal=_stationary(t, d2 - d1, q2 - q1, 0.0))
    return tables


def _inner(tables, prior, zeta, objective, epsilon, lam):
    """Maximise N - lam * D over lo <= a <= b <= hi; return (a, b, ratio at (a, b))."""
    shrink = jnp.exp(-epsilon)
    c = lam * shrink
    x, g1x, g2x = tables["t"], tables["g1"], tables["g2"]
    if "q1" in tables:
        t = tables["t"]
        extra = jnp.stack(
            [
                _stationary(t, tables["d1"], tables["q1"], c),
                _stationary(t, tables["d2"], tables["q2"], c),
                tables["diagonal"],
            ],
            axis=1,
        )
        # piece k contributes [t_k, its three stationary points] in sorted order,
        # so the flattened array stays globally sorted
        pieces = jnp.concatenate([t[:-1, None], jnp.sort(extra, axis=1)], axis=1).reshape(-1)
        x_new = jnp.concatenate([pieces, t[-1:]])
        g1f, g2f = g_functions(prior, zeta, objective)
        x, g1x, g2x = x_new, g1f(x_new), g2f(x_new)
    f1 = g1x - c * x
    f2 = g2x - c * x
    running_min = lax.cummin(f1)
    j = jnp.argmax(f2 - running_min)
    i = jnp.argmin(jnp.where(jnp.arange(x.shape[0]) <= j, f1, jnp.inf))
    a, b = x[i], x[j]
    ratio = (g2x[j] - g1x[i]) / (2 * zeta + shrink * (b - a))
    return a, b, ratio


def search(tables, prior, zeta, objective: str, epsilon, start=None):
    """Optimal (A1, A2, J) for one ε (vmap this over an ε grid).

    ``start``: an optional feasible (a, b), e.g. the optimum on a coarser copy
    of the prior. Dinkelbach then starts from λ = J(a, b) <= λ* instead of 0
    and needs fewer full passes; the result is the same exact optimum.
    """
    lo = jnp.asarray(prior.lo, dtype=tables["t"].dtype)
    if start is None:
        state = (lo, lo, jnp.zeros((), lo.dtype), 0, False)
    else:
        a0 = jnp.clip(start[0], prior.lo, prior.hi)
        b0 = jnp.clip(start[1], a0, prior.hi)
        state = (a0, b0, objective_value(prior, zeta, objective, epsilon, a0, b0), 1, False)

    def cond(state):
        _, _, _, it, done = state
        return jnp.logical_and(~done, it < _MAX_ITERATIONS)

    def body(state):
        a, b, lam, it, _ = state
        a_new, b_new, ratio = _inner(tables, prior, zeta, objective, epsilon, lam)
        improved = (it == 0) | (ratio > lam + 1e-14 * jnp.abs(lam))
        return (
            jnp.where(improved, a_new, a),
            jnp.where(improved, b_new, b),
            jnp.where(improved, ratio, lam),
            it + 1,
            ~improved,
        )

    a, b, lam, _, _ = lax.while_loop(cond, body, state)
    return a, b, lam


def objective_value(prior, zeta, objective, epsilon, a1, a2):
    """J(a1, a2) evaluated directly (for reports and tests)."""
    g1, g2 = g_functions(prior, zeta, objective)
    return (g2(a2) - g1(a1)) / (2 * zeta + jnp.exp(-epsilon) * (a2 - a1))
