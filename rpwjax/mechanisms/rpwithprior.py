r"""RPWithPrior (Liu & Huang, 2026): the continuous-output randomizer.

With :math:`y' = \mathrm{clip}(y, A_1, A_2)`, :math:`N_y = [y' - \zeta, y' + \zeta]`,
:math:`I = [A_1 - \zeta, A_2 + \zeta]` and :math:`\gamma = 2\zeta + e^{-\varepsilon}(A_2 - A_1)`:

.. math::
   p(\tilde y \mid y) = \begin{cases} 1/\gamma & \tilde y \in N_y \\
   e^{-\varepsilon}/\gamma & \tilde y \in I \setminus N_y \\ 0 & \text{otherwise.}\end{cases}

Every density has the same support I and takes only the values 1/γ and
e^{-ε}/γ on it, so the log ratio between any two labels is at most ε.
(A1, A2) maximise neighbourhood preservation under the prior (see
:mod:`rpwjax.mechanisms.interval_search`); ζ is given, or ``"auto"`` chooses it to
minimise the label MSE under the same prior (no privacy cost).

**Its bias, and the debiased release.** With :math:`s = e^{-\varepsilon}`,
integrating the three pieces gives

.. math::
   E[\tilde Y \mid y] = a y' + b, \qquad a = \frac{2\zeta(1 - s)}{\gamma}, \qquad
   b = \frac{s\,((A_2 + \zeta)^2 - (A_1 - \zeta)^2)}{2\gamma} = \frac{s\,(A_2 - A_1 + 2\zeta)(A_1 + A_2)}{2\gamma},

so :math:`D = (\tilde Y - b)/a` (post-processing of the released label, no
privacy cost) has :math:`E[D \mid y] = y'`. Centred at
:math:`c = (A_1 + A_2)/2` with :math:`L = (A_2 - A_1)/2` and
:math:`v = y' - c` (the mechanism is then symmetric and b vanishes),
:math:`E[(\tilde Y - c)^2 \mid y] = a v^2 + m_2` with
:math:`m_2 = \tfrac{2}{3}((1 - s)\zeta^3 + s (L + \zeta)^3)/\gamma`, hence

.. math::
   \mathrm{Var}(D \mid y) = \frac{1 - a}{a} v^2 + \frac{m_2}{a^2}, \qquad
   E[(D - y)^2 \mid y] = \mathrm{Var}(D \mid y) + (y' - y)^2 .

``objective="debiased"`` chooses ζ and (A1, A2) to minimise the prior
expectation of the last expression (:func:`fit_rpwithprior`).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from rpwjax.errors import InputError, check_choice, check_epsilon, check_positive
from rpwjax.grid import MAX_CELLS, UNIFORM_COUNT, cell_count, origin, pow2_at_least
from rpwjax.mechanisms import interval_search
from rpwjax.mechanisms.base import Mechanism, params_dataclass
from rpwjax.priors import Prior, tree_rows

_ZETA_GRID = np.geomspace(1e-3, 0.5, 24)  # fractions of the range width
_ZETA_REFINE = 12
_ZETA_SEARCH_BINS = 1024  # auto-ζ scores large priors on a copy with at most this many bins


@params_dataclass(static=("lo", "hi", "objective"))
class RPWithPrior(Mechanism):
    """Fitted RPWithPrior: ``epsilon`` (ε₂), ``zeta``, ``a1``, ``a2`` over the public ``[lo, hi]``."""

    epsilon: jax.Array
    zeta: jax.Array
    a1: jax.Array
    a2: jax.Array
    lo: float
    hi: float
    objective: str = "neighborhood"

    name = "rpwithprior"
    position_fields = ("lo", "hi", "a1", "a2")

    @property
    def gamma(self):
        return 2 * self.zeta + jnp.exp(-self.epsilon) * (self.a2 - self.a1)

    def _cast(self, dtype):
        return [jnp.asarray(v, dtype) for v in (self.epsilon, self.zeta, self.a1, self.a2)]

    def projected(self, y):
        y = jnp.clip(y, self.lo, self.hi)
        _, _, a1, a2 = self._cast(y.dtype)
        return jnp.clip(y, a1, a2)

    def sample_from_uniform(self, u, y):
        """Inverse CDF of the three-piece density at ``u`` (one uniform per label, branch-free, monotone)."""
        eps, zeta, a1, a2 = self._cast(y.dtype)
        yc = self.projected(y)
        shrink = jnp.exp(-eps)
        gamma = 2 * zeta + shrink * (a2 - a1)
        t = u * gamma  # position along the CDF, in units of mass * gamma
        left_mass = shrink * (yc - a1)
        grow = jnp.exp(eps)
        out = jnp.where(
            t < left_mass,
            a1 - zeta + t * grow,
            jnp.where(t < left_mass + 2 * zeta, yc - zeta + (t - left_mass), yc + zeta + (t - left_mass - 2 * zeta) * grow),
        )
        return jnp.clip(out, a1 - zeta, a2 + zeta)

    def release_spec(self) -> dict:
        r"""Grid h and range [a, b]: a, b the grid points just inside the support [A1 - ζ, A2 + ζ].

        The end cells then hold at least h/2 of the support, so every cell has
        probability at least :math:`\frac{h}{2} e^{-\varepsilon}/\gamma` at every label;
        h is the smallest power of two with N·that >= :func:`rpwjax.grid.cell_count` (ε) and at
        most ``MAX_CELLS`` cells (a function of the released parameters only).
        """
        eps, zeta, a1, a2 = (np.asarray(v, np.float64) for v in (self.epsilon, self.zeta, self.a1, self.a2))
        gamma = 2 * zeta + np.exp(-eps) * (a2 - a1)
        width = a2 - a1 + 2 * zeta
        need = np.maximum(2.0 * cell_count(eps) * gamma * np.exp(eps) / UNIFORM_COUNT, width / MAX_CELLS)
        h = pow2_at_least(float(np.max(need)))
        return {"grid": h, "low": np.ceil((a1 - zeta) / h) * h, "high": np.floor((a2 + zeta) / h) * h}

    def realized_ratio_bound(self, grid, low, high):
        r"""An upper bound on the realized max log ratio of the shipped release, per parameter row (NaN: none).

        For the shipped sampler only (this class's :meth:`sample_from_uniform`, run relative to the release's
        origin o by :func:`rpwjax.sampling.released_values`). With A = A1 - o, B = A2 - o, g = fl(e^ε) and
        Γ the computed γ, every intermediate of the inverse CDF is at most R = |A| + |B| + 2ζ + Γg + |lo - o| +
        |hi - o| in size, each branch rounds at most six times and multiplies an error by g at most once, and
        the branch point and the right end of the support move by at most 2^-52·R between the computed and the
        exact piecewise-linear map of t = uΓ (slopes g, 1, g: densities 1/(Γg) and 1/Γ, ratio g between any two
        labels at every point of the common support). So the computed value is within E = 32·2^-53·R of the
        exact one (twice the count of roundings). A cell's count of the 2^52 uniforms is then N·P ± (2NE/Γ + 2)
        (the band of width 2E has mass at most 2E/Γ; each end of an interval of uniforms, one index), while
        every cell, the two end cells included (at least h/2 of the support each, less the rounding of the
        grid points), has ideal probability at least P_min = (h/2 - 2E - 2^-52(|A1| + |A2| + ζ))/(Γg). With
        r = (2E/Γ + 2/N)/P_min the realized ratio is at most g(1 + r)/(1 - r).
        """
        shipped = (type(self).sample_from_uniform is RPWithPrior.sample_from_uniform
                   and type(self).translated is Mechanism.translated)
        eps, zeta, a1, a2 = (np.asarray(v, np.float64) for v in (self.epsilon, self.zeta, self.a1, self.a2))
        low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
        if not shipped or grid is None:
            return np.full(np.broadcast(eps, a1, low).shape, np.nan)
        h, o = float(grid), origin(self, grid)
        unit = 2.0 ** -53
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            g = np.exp(eps)
            a, b = a1 - o, a2 - o
            big_gamma = 2 * zeta + np.exp(-eps) * (b - a)
            size = np.abs(a) + np.abs(b) + 2 * zeta + big_gamma * g + abs(self.lo - o) + abs(self.hi - o)
            err = 32 * unit * size
            p_min = (h / 2 - 2 * err - 2 * unit * (np.abs(a1) + np.abs(a2) + zeta)) / (big_gamma * g)
            r = (2 * err / big_gamma + 2.0 / UNIFORM_COUNT) / p_min
            bound = np.log(g) + np.log1p(r) - np.log1p(-r) + 8 * unit
            valid = ((zeta > 0) & (self.lo <= a1) & (a1 <= a2) & (a2 <= self.hi) & (low >= a1 - zeta - h / 2)
                     & (high <= a2 + zeta + h / 2) & (low < high) & (p_min > 0) & (r < 1) & np.isfinite(g))
        return np.where(valid, bound, np.nan)

    def cdf(self, y_tilde, y):
        """P(Ỹ <= ỹ | y), exact: piecewise linear in ỹ (slopes e^-ε/γ, 1/γ, e^-ε/γ over the support)."""
        y_tilde = jnp.asarray(y_tilde)
        eps, zeta, a1, a2 = self._cast(y_tilde.dtype)
        yc = self.projected(jnp.asarray(y, y_tilde.dtype))
        shrink = jnp.exp(-eps)
        t = jnp.clip(y_tilde, a1 - zeta, a2 + zeta)
        below = shrink * jnp.maximum(jnp.minimum(t, yc - zeta) - (a1 - zeta), 0)
        inside = jnp.clip(t - (yc - zeta), 0, 2 * zeta)
        above = shrink * jnp.maximum(t - (yc + zeta), 0)
        return (below + inside + above) / (2 * zeta + shrink * (a2 - a1))

    def log_density(self, y_tilde, y):
        y_tilde = jnp.asarray(y_tilde)
        yc = self.projected(jnp.asarray(y, y_tilde.dtype))
        eps, zeta, a1, a2 = self._cast(y_tilde.dtype)
        log_gamma = jnp.log(2 * zeta + jnp.exp(-eps) * (a2 - a1))
        in_support = (y_tilde >= a1 - zeta) & (y_tilde <= a2 + zeta)
        in_window = jnp.abs(y_tilde - yc) <= zeta
        return jnp.where(in_window, -log_gamma, jnp.where(in_support, -eps - log_gamma, -jnp.inf))

    def _moment(self, y, power):
        """E[(Ỹ - y)^power] for power 1 or 2, from the three uniform pieces."""
        y = jnp.asarray(y)
        eps, zeta, a1, a2 = self._cast(y.dtype)
        yc = self.projected(y)
        shrink = jnp.exp(-eps)
        gamma = 2 * zeta + shrink * (a2 - a1)
        pieces = ((a1 - zeta, yc - zeta, shrink), (yc - zeta, yc + zeta, 1.0), (yc + zeta, a2 + zeta, shrink))
        k = power + 1
        return sum(rho * ((v - y) ** k - (u - y) ** k) / k for u, v, rho in pieces) / gamma

    def bias(self, y):
        return self._moment(y, 1)

    def mse(self, y):
        return self._moment(y, 2)

    def breakpoints(self):
        return (self.a1, self.a2)

    def debias_coefficients(self, dtype=jnp.float64):
        """(a, b) with E[Ỹ | y] = a·clip(y, A1, A2) + b (module docstring); (Ỹ - b)/a is unbiased for y'."""
        eps, zeta, a1, a2 = self._cast(dtype)
        shrink = jnp.exp(-eps)
        gamma = 2 * zeta + shrink * (a2 - a1)
        return 2 * zeta * -jnp.expm1(-eps) / gamma, shrink * (a2 - a1 + 2 * zeta) * (a1 + a2) / (2 * gamma)

    def debiased_variance(self, y):
        """Var((Ỹ - b)/a | y) = (1 - a)/a·(y' - c)² + m₂/a² (module docstring)."""
        y = jnp.asarray(y)
        eps, zeta, a1, a2 = self._cast(y.dtype)
        alpha, beta = _debiased_terms(eps, zeta, 0.5 * (a2 - a1))
        return alpha * (self.projected(y) - 0.5 * (a1 + a2)) ** 2 + beta

    def debiased_mse(self, y):
        """E[((Ỹ - b)/a - y)²] = the debiased variance + (y' - y)²."""
        y = jnp.asarray(y)
        return self.debiased_variance(y) + (self.projected(y) - y) ** 2

    def debiased_label_mse(self, prior):
        """E[((Ỹ - b)/a - Y)²] with Y drawn from ``prior`` (unbatched parameters)."""
        return prior.expect(self.debiased_mse, self.breakpoints())

    def to_json(self) -> dict:
        out = super().to_json()
        out["A1"], out["A2"] = out.pop("a1"), out.pop("a2")
        gamma = np.asarray(2 * np.asarray(self.zeta) + np.exp(-np.asarray(self.epsilon)) * (np.asarray(self.a2) - np.asarray(self.a1)))
        out["gamma"] = gamma.item() if gamma.ndim == 0 else gamma.tolist()
        return out

    @classmethod
    def from_json(cls, fields: dict):
        fields = dict(fields)
        fields["a1"], fields["a2"] = fields.pop("A1"), fields.pop("A2")
        params = super().from_json(fields)
        if not (params.lo <= np.min(params.a1) and np.all(params.a1 <= params.a2) and np.max(params.a2) <= params.hi):
            raise InputError(f"RPWithPrior needs lo <= A1 <= A2 <= hi, got A1={params.a1}, A2={params.a2}")
        check_positive(np.min(params.zeta), "zeta")
        check_epsilon(params.epsilon)
        return params

    def preservation(self, prior: Prior):
        """P(|Ỹ - Y| <= ζ) under ``prior`` (the neighbourhood objective at (A1, A2))."""
        return interval_search.objective_value(prior, self.zeta, "neighborhood", self.epsilon, self.a1, self.a2)


# --------------------------------------------------------------------------- fitting


def _warm_start(coarse, zeta, epsilon, objective):
    """Exact optima on a coarse copy of the prior: a feasible start for the full search."""
    if coarse is None:
        return None
    tables = interval_search.make_tables(coarse, zeta, objective)
    a, b, _ = interval_search.search(tables, coarse, zeta, objective, epsilon)
    return a, b


@partial(jax.jit, static_argnames=("objective",))
def _fit_shared_zeta(prior, zeta, epsilon, objective, coarse=None):
    # tables depend on (prior, ζ) only: built once, shared by the whole ε grid
    tables = interval_search.make_tables(prior, zeta, objective)

    def one(e):
        start = _warm_start(coarse, zeta, e, objective)
        a, b, value = interval_search.search(tables, prior, zeta, objective, e, start)
        return a, b, value, interval_search.objective_value(prior, zeta, "neighborhood", e, a, b)

    return jax.vmap(one)(epsilon)


@partial(jax.jit, static_argnames=("objective", "prior_batched"))
def _fit_per_epsilon(prior, zeta, epsilon, objective, prior_batched, coarse=None):
    def one(p, z, e):
        tables = interval_search.make_tables(p, z, objective)
        start = _warm_start(coarse, z, e, objective)
        a, b, value = interval_search.search(tables, p, z, objective, e, start)
        return a, b, value, interval_search.objective_value(p, z, "neighborhood", e, a, b)

    return jax.vmap(one, in_axes=(0 if prior_batched else None, 0, 0))(prior, zeta, epsilon)


@partial(jax.jit, static_argnames=("objective", "prior_batched"))
def _zeta_scores(prior, zetas, epsilon, objective, prior_batched):
    """Label MSE of the optimal interval for each (ε, ζ): zetas (E, Z) -> (E, Z)."""

    def one(p, z, e):
        tables = interval_search.make_tables(p, z, objective)
        a1, a2, _ = interval_search.search(tables, p, z, objective, e)
        return RPWithPrior(e, z, a1, a2, p.lo, p.hi, objective).label_mse(p)

    over_zeta = jax.vmap(one, in_axes=(None, 0, None))
    return jax.vmap(over_zeta, in_axes=(0 if prior_batched else None, 0, 0))(prior, zetas, epsilon)


def _search_prior(prior: Prior) -> Prior:
    """The prior used to score ζ: itself, or a coarser copy of it when it is large.

    Point masses are merged per equal-width cell into one point at the cell's
    weighted mean (the cheap piecewise-linear path stays available); a large
    histogram is rebinned. Only the choice of ζ uses the copy: the interval
    for the chosen ζ is then searched exactly on the full prior.
    """
    if np.ndim(prior.mass) > 1 or prior.size <= _ZETA_SEARCH_BINS:
        return prior
    edges = np.linspace(prior.lo, prior.hi, _ZETA_SEARCH_BINS + 1)
    centres = 0.5 * (np.asarray(prior.left) + np.asarray(prior.right))
    weights = np.asarray(prior.mass)
    mass, _ = np.histogram(centres, bins=edges, weights=weights)
    if not prior.discrete:
        return Prior(edges[:-1], edges[1:], mass / mass.sum(), prior.lo, prior.hi, False, prior.kind)
    first, _ = np.histogram(centres, bins=edges, weights=weights * centres)
    keep = mass > 0
    points = np.clip(first[keep] / mass[keep], prior.lo, prior.hi)
    return Prior(points, points.copy(), mass[keep] / mass[keep].sum(), prior.lo, prior.hi, True, prior.kind)


def choose_zeta(prior: Prior, epsilon, objective: str = "neighborhood") -> np.ndarray:
    """ζ minimising the label MSE E[(Ỹ - Y)²] under ``prior``, per ε (a grid, then a finer grid)."""
    eps = np.atleast_1d(np.asarray(epsilon, np.float64))
    width = prior.hi - prior.lo
    scoring = _search_prior(prior)
    batched = np.ndim(scoring.mass) > 1
    grid = np.broadcast_to(width * _ZETA_GRID, (eps.size, _ZETA_GRID.size))
    with jax.enable_x64(True):
        scores = np.asarray(_zeta_scores(scoring, grid, eps, objective, batched))
        best = np.argmin(scores, axis=1)
        lower = grid[np.arange(eps.size), np.maximum(best - 1, 0)]
        upper = grid[np.arange(eps.size), np.minimum(best + 1, _ZETA_GRID.size - 1)]
        fine = np.geomspace(lower, upper, _ZETA_REFINE, axis=1)
        fine_scores = np.asarray(_zeta_scores(scoring, fine, eps, objective, batched))
    return fine[np.arange(eps.size), np.argmin(fine_scores, axis=1)]


# --------------------------------------------------------------------------- the debiased objective

OBJECTIVES = interval_search.OBJECTIVES + ("debiased",)
_DEBIASED_ZETA_GRID = np.geomspace(1e-3, 2.0, 28)  # fractions of the range width
_DEBIASED_CANDIDATES = 129  # equally spaced ends and as many prior quantiles
_DEBIASED_ROUNDS = 6  # local refinement rounds
_DEBIASED_LOCAL = 17  # points per coordinate and round


def _debiased_terms(eps, zeta, half):
    """(α, β) with Var((Ỹ - b)/a | y) = α (y' - c)² + β, for half-width L = ``half`` of [A1, A2]."""
    shrink = jnp.exp(-eps)
    one_minus = -jnp.expm1(-eps)
    alpha = shrink * (zeta + half) / (zeta * one_minus)
    beta = (one_minus * zeta**3 + shrink * (half + zeta) ** 3) * (zeta + shrink * half) / (3 * (zeta * one_minus) ** 2)
    return alpha, beta


def _partial_moments(left, right, mass, t):
    """(P(Y <= t), E[Y; Y <= t], E[Y²; Y <= t]) under a prior of uniform bins (zero width: point masses)."""
    width = right - left
    safe = jnp.where(width > 0, width, 1.0)
    full = jnp.stack([mass, mass * 0.5 * (left + right), mass * (left * left + left * right + right * right) / 3])
    cum = jnp.concatenate([jnp.zeros((3, 1), mass.dtype), jnp.cumsum(full, axis=1)], axis=1)
    k = jnp.searchsorted(left, t, side="right")  # bins with left <= t
    last = jnp.maximum(k - 1, 0)
    l, r, m = left[last], right[last], mass[last]
    top = jnp.minimum(t, r)
    frac = jnp.where(width[last] > 0, (top - l) / safe[last], 1.0)
    part = jnp.stack([m * frac, m * frac * 0.5 * (l + top), m * frac * (l * l + l * top + top * top) / 3])
    return tuple(jnp.where(k > 0, cum[:, last] + part, 0.0))


def _debiased_value(moments, totals, eps, zeta, a1, a2):
    """The debiased label MSE (normalised units) at ends with precomputed partial moments (broadcasting)."""
    (f1, m11, m21), (f2, m12, m22) = moments
    _, total1, total2 = totals
    half, centre = 0.5 * (a2 - a1), 0.5 * (a1 + a2)
    inside_sq = (m22 - m21) - 2 * centre * (m12 - m11) + centre**2 * (f2 - f1)
    spread = half**2 * (f1 + 1 - f2) + inside_sq  # E[(Y' - c)²]
    clipped = a1**2 * f1 - 2 * a1 * m11 + m21 + (total2 - m22) - 2 * a2 * (total1 - m12) + a2**2 * (1 - f2)
    alpha, beta = _debiased_terms(eps, zeta, half)
    return alpha * spread + beta + clipped


def _debiased_one(prior, candidates, zetas, eps, search_zeta):
    """Best (A1, A2, ζ, value) in normalised units for one prior (leaves on [0, 1]) and one ε.

    A grid over candidate pairs (i <= j) and the ζ grid, then rounds of local grids around the best point
    (each coordinate within a shrinking window), keeping the best value seen; exact objective throughout.
    """
    left, right, mass = (jnp.asarray(v) for v in (prior.left, prior.right, prior.mass))
    totals = _partial_moments(left, right, mass, jnp.asarray(1.0, left.dtype))
    at = _partial_moments(left, right, mass, candidates)
    pair = ((at[0][:, None], at[1][:, None], at[2][:, None]), (at[0][None, :], at[1][None, :], at[2][None, :]))
    a1, a2 = candidates[:, None], candidates[None, :]
    valid = a1 <= a2

    def grid_best(z):
        v = jnp.where(valid, _debiased_value(pair, totals, eps, z, a1, a2), jnp.inf)
        flat = jnp.argmin(v)
        return v.reshape(-1)[flat], flat

    values, flats = lax.map(grid_best, zetas)
    best = jnp.argmin(values)
    g = candidates.size
    i, j = flats[best] // g, flats[best] % g
    z = zetas[best]
    value = values[best]
    # local rounds: A1, A2 and (when searched) log ζ on small grids around the incumbent, windows shrinking
    spacing = jnp.max(jnp.diff(candidates))
    span_a = jnp.maximum(spacing, 1e-12)
    ratio = jnp.log(zetas[1] / zetas[0]) if zetas.size > 1 else 0.0
    span_z = ratio
    offsets = jnp.linspace(-1.0, 1.0, _DEBIASED_LOCAL)

    def local_round(_, state):
        x1, x2, z, value, span_a, span_z = state
        c1 = jnp.clip(x1 + span_a * offsets, 0.0, 1.0)
        c2 = jnp.clip(x2 + span_a * offsets, 0.0, 1.0)
        m1 = _partial_moments(left, right, mass, c1)
        m2 = _partial_moments(left, right, mass, c2)
        local = ((m1[0][:, None], m1[1][:, None], m1[2][:, None]), (m2[0][None, :], m2[1][None, :], m2[2][None, :]))
        zs = z * jnp.exp(span_z * offsets) if search_zeta else z[None]

        def local_best(zz):
            v = jnp.where(c1[:, None] <= c2[None, :], _debiased_value(local, totals, eps, zz, c1[:, None], c2[None, :]),
                          jnp.inf)
            flat = jnp.argmin(v)
            return v.reshape(-1)[flat], flat

        lv, lf = lax.map(local_best, zs)
        k = jnp.argmin(lv)
        better = lv[k] < value
        shrink = 2.0 / (_DEBIASED_LOCAL - 1)
        return (jnp.where(better, c1[lf[k] // _DEBIASED_LOCAL], x1), jnp.where(better, c2[lf[k] % _DEBIASED_LOCAL], x2),
                jnp.where(better, zs[k], z), jnp.where(better, lv[k], value), span_a * shrink, span_z * shrink)

    state = (candidates[i], candidates[j], z, value, span_a, jnp.asarray(span_z, value.dtype))
    x1, x2, z, value, _, _ = lax.fori_loop(0, _DEBIASED_ROUNDS, local_round, state)
    return x1, x2, z, value


@partial(jax.jit, static_argnames=("search_zeta", "prior_batched", "zeta_batched"))
def _debiased_search(prior, candidates, zetas, eps, search_zeta, prior_batched, zeta_batched):
    """:func:`_debiased_one` vmapped over ε (the prior and the candidates too when batched)."""
    axis = 0 if prior_batched else None
    one = lambda p, c, z, e: _debiased_one(p, c, z, e, search_zeta)  # noqa: E731
    return jax.vmap(one, in_axes=(axis, axis, 0 if zeta_batched else None, 0))(prior, candidates, zetas, eps)


def _quantiles(left, right, mass, levels):
    """Inverse CDF of a prior of bins at ``levels`` (numpy; candidates for the debiased search)."""
    x = np.stack([left, right], axis=1).ravel()
    cdf = np.cumsum(mass)
    y = np.stack([cdf - mass, cdf], axis=1).ravel()
    return np.interp(levels, y, x)


def _fit_debiased(prior: Prior, eps_grid: np.ndarray, zetas):
    """(A1, A2, ζ, debiased label MSE) per ε, in label units; ``zetas`` None means search ζ too."""
    lo, hi = float(prior.lo), float(prior.hi)
    width = hi - lo
    left, right, mass = (np.asarray(v, np.float64) for v in (prior.left, prior.right, prior.mass))
    batched = mass.ndim > 1
    left, right, mass = (np.atleast_2d(v) for v in (left, right, mass))
    left, right, mass = (left - lo) / width, (right - lo) / width, mass / mass.sum(axis=1, keepdims=True)
    levels = (np.arange(_DEBIASED_CANDIDATES) + 0.5) / _DEBIASED_CANDIDATES
    candidates = np.stack([np.sort(np.concatenate([np.linspace(0.0, 1.0, _DEBIASED_CANDIDATES),
                                                   np.clip(_quantiles(l, r, m, levels), 0.0, 1.0)]))
                           for l, r, m in zip(left, right, mass)])
    if not batched:
        left, right, mass, candidates = left[0], right[0], mass[0], candidates[0]
    normalised = Prior(left, right, mass, 0.0, 1.0, prior.discrete, prior.kind)
    z = _DEBIASED_ZETA_GRID if zetas is None else (np.asarray(zetas, np.float64) / width)[:, None]
    with jax.enable_x64(True):
        a1, a2, z, value = _debiased_search(normalised, jnp.asarray(candidates), jnp.asarray(z, jnp.float64),
                                            jnp.asarray(eps_grid, jnp.float64), search_zeta=zetas is None,
                                            prior_batched=batched, zeta_batched=zetas is not None)
    a1, a2, z, value = (np.asarray(v, np.float64) for v in (a1, a2, z, value))
    a2 = np.minimum(lo + width * a2, hi)  # lo <= A1 <= A2 <= hi also after rounding
    return np.minimum(lo + width * a1, a2), a2, width * z, value * width**2


def fit_rpwithprior(prior: Prior, epsilon, *, zeta="auto", objective: str = "neighborhood", shrink_zeta: bool = False):
    """Fit RPWithPrior to ``prior`` for a scalar ε or a 1-d ε grid.

    Args:
      prior: a :class:`~rpwjax.priors.Prior` (empirical or histogram); a prior
        with a leading axis (one private histogram per ε) is mapped along ε.
      epsilon: the mechanism's budget ε₂ (scalar or 1-d array).
      zeta: the window half-width (> 0, label units) or ``"auto"``.
      objective: ``"neighborhood"`` (P(|Ỹ - Y| <= ζ), default), ``"inside"``,
        or ``"debiased"``: (A1, A2) (and ζ, with ``zeta="auto"``) minimise the
        prior expectation of E[((Ỹ - b)/a - Y)²], the label MSE after
        :func:`rpwjax.posterior.debias` (module docstring). The objective is
        exact (closed-form moments of the prior); the search is a grid over
        both ends (129 equally spaced points and 129 prior quantiles) and 28
        values of ζ from 0.001 to 2 range widths, then six rounds of local
        grids (17 points per coordinate, windows shrinking 8-fold each round):
        deterministic and vmapped over ε, but not certified globally optimal.
      shrink_zeta: after the interval search, reduce ζ to (A2 - A1)/2 where the
        interval is narrower than 2ζ (and not a point), keeping (A1, A2): the
        rule of the authors' released code (the sweep's ``paper`` configuration).

    Returns:
      ``(params, info)``: :class:`RPWithPrior` with a leading ε axis when
      ``epsilon`` is 1-d, and ``info`` with the ``preservation`` and the
      ``objective_value`` reached (for ``"debiased"``: the debiased label MSE
      under the prior), per ε.
    """
    eps = check_epsilon(epsilon)
    check_choice(objective, "objective", OBJECTIVES)
    scalar = eps.ndim == 0
    eps_grid = np.atleast_1d(eps)
    prior_batched = np.ndim(prior.mass) > 1
    if prior_batched and np.shape(prior.mass)[0] != eps_grid.size:
        raise InputError(
            f"a batched prior needs one histogram per epsilon: {np.shape(prior.mass)[0]} priors for {eps_grid.size} epsilons"
        )
    if isinstance(zeta, str):
        if zeta != "auto":
            raise InputError(f"zeta must be a positive number or 'auto', got zeta={zeta!r}")
        zetas = None if objective == "debiased" else choose_zeta(prior, eps_grid, objective)
    else:
        zetas = np.full(eps_grid.shape, check_positive(zeta, "zeta"))
    preservation = None
    if objective == "debiased":
        a1, a2, zetas, value = _fit_debiased(prior, eps_grid, zetas)
    else:
        coarse = _search_prior(prior)
        coarse = None if coarse is prior else coarse
        with jax.enable_x64(True):
            if prior_batched or not np.all(zetas == zetas[0]):
                a1, a2, value, preservation = _fit_per_epsilon(prior, zetas, eps_grid, objective, prior_batched, coarse)
            else:
                a1, a2, value, preservation = _fit_shared_zeta(prior, zetas[0], eps_grid, objective, coarse)
    a1, a2, value = (np.asarray(v, np.float64) for v in (a1, a2, value))
    shrunk = False
    if shrink_zeta:
        half = 0.5 * (a2 - a1)
        reduce = (half > 0) & (half < zetas)
        zetas, shrunk = np.where(reduce, half, zetas), bool(reduce.any())
    with jax.enable_x64(True):
        params = RPWithPrior(eps_grid, np.asarray(zetas, np.float64), a1, a2, prior.lo, prior.hi, objective)
        if preservation is None or shrunk:
            preservation = _preservation(prior, params, prior_batched)
        if shrunk:
            value = _objective_at(prior, params, prior_batched, objective)
    info = {"preservation": np.asarray(preservation), "objective_value": np.asarray(value)}
    if scalar:
        params = params[0]
        info = {k: v[0] for k, v in info.items()}
    return params, info


@partial(jax.jit, static_argnames=("prior_batched",))
def _preservation(prior, params, prior_batched):
    """P(|Ỹ - Y| <= ζ) per ε (the neighbourhood objective at the fitted interval)."""
    def one(p, q):
        return interval_search.objective_value(q, p.zeta, "neighborhood", p.epsilon, p.a1, p.a2)

    return jax.vmap(one, in_axes=(0, 0 if prior_batched else None))(params, prior)


@partial(jax.jit, static_argnames=("prior_batched", "objective"))
def _objective_at(prior, params, prior_batched, objective):
    """The fit's objective at the final parameters (after any ζ reduction)."""
    def one(p, q):
        if objective == "debiased":
            return p.debiased_label_mse(q)
        return interval_search.objective_value(q, p.zeta, objective, p.epsilon, p.a1, p.a2)

    return jax.vmap(one, in_axes=(0, 0 if prior_batched else None))(params, prior)


# --------------------------------------------------------------------------- the per-row form

_ROW_CHUNK = 2048  # rows per compiled call


@jax.jit
def _intervals(priors, zeta, epsilon):
    def one(p):
        tables = interval_search.make_tables(p, zeta, "neighborhood")
        a, b, _ = interval_search.search(tables, p, zeta, "neighborhood", epsilon)
        return a, b

    return jax.vmap(one)(priors)


def fit_rpwithprior_per_row(priors: Prior, zeta: float, epsilon: float) -> RPWithPrior:
    """The per-row form: one exact interval per row of a batched prior (shared ζ and ε), params batched over rows.

    Each row's (A1, A2) is the exact optimum of neighbourhood preservation under its own prior (the
    same Dinkelbach search as :func:`fit_rpwithprior`, vmapped over rows in chunks of rows). The
    feature-aware pipelines use it with one prior per training row (:mod:`rpwjax.pipelines`).
    """
    n = int(np.shape(priors.mass)[0])
    a1, a2 = [], []
    with jax.enable_x64(True):
        for i in range(0, n, _ROW_CHUNK):
            a, b = _intervals(tree_rows(priors, i, i + _ROW_CHUNK), jnp.float64(zeta), jnp.float64(epsilon))
            a1.append(np.asarray(a))
            a2.append(np.asarray(b))
    a1 = np.concatenate(a1) if a1 else np.zeros(0)
    a2 = np.concatenate(a2) if a2 else np.zeros(0)
    return RPWithPrior(np.full(n, float(epsilon)), np.full(n, float(zeta)), a1, a2, priors.lo, priors.hi)
