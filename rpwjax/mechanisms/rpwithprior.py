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
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from rpwjax.mechanisms import interval_search
from rpwjax.mechanisms.base import Mechanism, params_dataclass
from rpwjax.errors import InputError, check_choice, check_epsilon, check_positive
from rpwjax.priors import Prior

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
        probability at least :math:`rac{h}{2} e^{-arepsilon}/\gamma` at every label;
        h is the smallest power of two with N·that >= ``MIN_CELL_COUNT`` and at
        most ``MAX_CELLS`` cells (a function of the released parameters only).
        """
        from rpwjax.release_path import MAX_CELLS, MIN_CELL_COUNT, UNIFORM_COUNT, pow2_at_least

        eps, zeta, a1, a2 = (np.asarray(v, np.float64) for v in (self.epsilon, self.zeta, self.a1, self.a2))
        gamma = 2 * zeta + np.exp(-eps) * (a2 - a1)
        width = a2 - a1 + 2 * zeta
        need = np.maximum(2.0 * MIN_CELL_COUNT * gamma * np.exp(eps) / UNIFORM_COUNT, width / MAX_CELLS)
        h = pow2_at_least(float(np.max(need)))
        return {"grid": h, "low": np.ceil((a1 - zeta) / h) * h, "high": np.floor((a2 + zeta) / h) * h}

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


def fit_rpwithprior(prior: Prior, epsilon, *, zeta="auto", objective: str = "neighborhood"):
    """Fit RPWithPrior to ``prior`` for a scalar ε or a 1-d ε grid.

    Args:
      prior: a :class:`~rpwjax.priors.Prior` (empirical or histogram); a prior
        with a leading axis (one private histogram per ε) is mapped along ε.
      epsilon: the mechanism's budget ε₂ (scalar or 1-d array).
      zeta: the window half-width (> 0, label units) or ``"auto"``.
      objective: ``"neighborhood"`` (P(|Ỹ - Y| <= ζ), default) or ``"inside"``.

    Returns:
      ``(params, info)``: :class:`RPWithPrior` with a leading ε axis when
      ``epsilon`` is 1-d, and ``info`` with the ``preservation`` and the
      ``objective_value`` reached, per ε.
    """
    eps = check_epsilon(epsilon)
    check_choice(objective, "objective", interval_search.OBJECTIVES)
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
        zetas = choose_zeta(prior, eps_grid, objective)
    else:
        zetas = np.full(eps_grid.shape, check_positive(zeta, "zeta"))
    coarse = _search_prior(prior)
    coarse = None if coarse is prior else coarse
    with jax.enable_x64(True):
        if prior_batched or not np.all(zetas == zetas[0]):
            a1, a2, value, preservation = _fit_per_epsilon(prior, zetas, eps_grid, objective, prior_batched, coarse)
        else:
            a1, a2, value, preservation = _fit_shared_zeta(prior, zetas[0], eps_grid, objective, coarse)
        params = RPWithPrior(eps_grid, zetas, np.asarray(a1), np.asarray(a2), prior.lo, prior.hi, objective)
    info = {"preservation": np.asarray(preservation), "objective_value": np.asarray(value)}
    if scalar:
        params = params[0]
        info = {k: v[0] for k, v in info.items()}
    return params, info


# --------------------------------------------------------------------------- the per-row form

_ROW_CHUNK = 2048  # rows per compiled call


def _rows(prior: Prior, start: int, stop: int) -> Prior:
    return jax.tree_util.tree_map(lambda v: jnp.asarray(v)[start:stop], prior)


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
            a, b = _intervals(_rows(priors, i, i + _ROW_CHUNK), jnp.float64(zeta), jnp.float64(epsilon))
            a1.append(np.asarray(a))
            a2.append(np.asarray(b))
    a1 = np.concatenate(a1) if a1 else np.zeros(0)
    a2 = np.concatenate(a2) if a2 else np.zeros(0)
    return RPWithPrior(np.full(n, float(epsilon)), np.full(n, float(zeta)), a1, a2, priors.lo, priors.hi)
