r"""``rpwjax audit``: check each mechanism's guarantee on a grid and on fresh labels, and try to refute it by sampling.

Two independent checks per fitted mechanism, both driven only by the
mechanism contract (``log_density``, ``sample``, ``pure``, ``discrete``,
``breakpoints``), so a new mechanism in :data:`rpwjax.api.MECHANISMS` is
audited without code here.

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

**2. Empirical audit** (of the sampler that actually runs). ``samples``
outputs at each of two labels, by one compiled call of ``sample`` per label
(float64, fixed keys): (lo, hi), unless the exact check found a strictly
worse pair. The sets tested are fixed before sampling, from public
parameters only: the outputs (discrete), or for continuous outputs the
central range of the two claimed densities (mixture mass 1e-5 left out on
each side) cut into ``bins`` equal-width bins and at every step edge of the two
densities, plus the two tails; and, per direction, the Neyman-Pearson unions
(the bins ranked by the claimed likelihood ratio, every prefix), which are the
most powerful sets for a density that is right and the ones a δ-violation
needs. For each set S and direction, Clopper-Pearson bounds
(``scipy.stats.beta``) give :math:`L \le P(M(y) \in S)` and
:math:`U \ge P(M(y') \in S)`; Bonferroni over all bounds makes them hold
together with probability ``confidence`` (99.9%). Then

.. math::
   \hat\varepsilon_{lb} = \max_{S,\ \text{directions}} \log \frac{L - \delta}{U}

is a lower bound on every ε for which the sampler is (ε, δ)-DP, at that
confidence (δ = 0 for pure mechanisms; for the Gaussian P(S|y) ≤ e^ε P(S|y') + δ
is exactly what (ε, δ)-DP allows, so the test is valid and fails only on a
real violation; 1e6 samples cannot resolve its δ = 1e-5 tails, so for it the
audit is weak and says so by passing with a small bound). The audit fails
iff :math:`\hat\varepsilon_{lb} > \varepsilon`, or a sample lies where the
claimed density is zero, or is not finite.

The exact check trusts ``log_density``; the empirical audit trusts nothing
but the samples (its sets come from ``log_density``, which only affects its
power). A sampler bug that changes the distribution by less than sampling
noise, or only at labels other than the audited pair, is not caught.

**A saved fit** (``rpwjax audit --params FILE``): instead of fitting the
example prior, the file's record is verified first
(:func:`rpwjax.audit.verify.check_record`: its fields agree, and the guarantee is
recomputed from the parameters), then its parameters get the three checks
above, judged against the ``epsilon_mechanism`` and ``delta`` the file
states. Every problem of the record is printed; the exit code is 0 iff the
record verifies and every check passes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from scipy import stats

from rpwjax import api
from rpwjax import certify, realized
from rpwjax.mechanisms.base import Mechanism
from rpwjax.errors import InputError, check_choice, check_epsilon, check_integer
from rpwjax.keys import Secret
from rpwjax.release_path import release, sidecar_fields

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
CENTRAL_TAIL_MASS = 1e-5  # binning range of the empirical audit leaves this much out per side
PRESAMPLE = 4096  # per grid label, to find the outputs of a discrete mechanism

DEFAULT_SAMPLES = 1_000_000
DEFAULT_GRID_SIZE = 20_001
DEFAULT_LABEL_GRID_SIZE = 33
DEFAULT_BINS = 100
DEFAULT_CONFIDENCE = 0.999
DEFAULT_EPSILON = 1.0
FRESH_LABELS = 4096  # labels drawn afresh by every audit for the realized check, per mechanism and ε
EXAMPLE_RANGE = (0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """The outcome of :func:`audit_mechanism` for one fitted mechanism.

    ``exact_max_log_ratio`` is the largest log density ratio found on the grid
    (for a non-pure mechanism a grid artefact: its true supremum is infinite,
    and ``exact_delta``, the δ(ε) of its privacy-loss profile, decides
    ``exact_pass``). ``empirical_lower_bound`` is the δ-aware lower bound on ε
    at ``details["confidence"]``, clamped at 0.
    """

    mechanism: str
    epsilon: float
    delta: float
    pure: bool
    exact_max_log_ratio: float
    exact_delta: float
    exact_pass: bool
    empirical_lower_bound: float
    empirical_pass: bool
    details: dict[str, Any]
    output_grid_pass: bool = True
    realized_max_log_ratio: float = float("nan")
    realized_delta: float = float("nan")
    realized_pass: bool = True

    @property
    def passed(self) -> bool:
        return self.exact_pass and self.empirical_pass and self.output_grid_pass and self.realized_pass

    def to_json(self) -> dict:
        """One JSON object (``rpwjax audit --json``)."""
        real = self.details.get("realized", {})
        finite = lambda v: v if math.isfinite(v) else str(v)  # noqa: E731 - JSON has no inf
        return {
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "guarantee": self.guarantee,
            "exact_max_log_ratio": finite(self.exact_max_log_ratio),
            "exact_delta": finite(self.exact_delta),
            "exact_pass": self.exact_pass,
            "realized_max_log_ratio": finite(self.realized_max_log_ratio),
            "realized_delta": finite(self.realized_delta),
            "realized_pass": self.realized_pass,
            "output_grid": real.get("output_grid"),
            "output_range": real.get("output_range"),
            "fewest_uniforms_in_a_cell": real.get("fewest_uniforms_in_a_cell"),
            "realized_labels": real.get("labels"),
            "audit_seed": self.details.get("audit_seed"),
            "release_mse_change": real.get("release_mse_change"),
            "empirical_lower_bound": self.empirical_lower_bound,
            "empirical_pass": self.empirical_pass,
            "output_grid_pass": self.output_grid_pass,
            "pass": self.passed,
            "problems": [f"{stage}: {p}" for stage in ("exact", "realized", "empirical", "output_grid")
                         for p in self.details.get(stage, {}).get("problems", [])],
        }

    @property
    def guarantee(self) -> str:
        return "eps-DP" if self.pure else "(eps, delta)-DP"


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


# --------------------------------------------------------------------------- empirical audit


def clopper_pearson(k, n, alpha):
    """One-sided Clopper-Pearson bounds at level ``alpha`` each: (lower, upper) on a binomial p."""
    k = np.asarray(k, np.float64)
    lower = np.where(k > 0, stats.beta.ppf(alpha, np.maximum(k, 1), n - k + 1), 0.0)
    upper = np.where(k < n, stats.beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1)), 1.0)
    return lower, upper


def _bins(params, exact, pair, labels, bins):
    """Fixed sets for the empirical audit: bin edges (continuous) or outputs (discrete), and claimed masses.

    Continuous: bins ``(-inf, e_0), [e_0, e_1), ..., [e_last, inf)``; the claimed
    mass of each bin under each label of ``pair`` comes from the exact densities.
    """
    rows = list(pair)
    if params.discrete:
        return exact["points"], np.exp(exact["L"][rows]), {"bins": int(exact["points"].size)}
    n = exact["n_quadrature"]
    xs = exact["points"][:n]
    cells = _cell_masses(xs, exact["L"][rows][:, :n])
    mixture_cdf = np.concatenate([[0.0], np.cumsum(cells.mean(axis=0))])
    total = mixture_cdf[-1]
    left = xs[np.searchsorted(mixture_cdf, CENTRAL_TAIL_MASS * total)]
    right = xs[min(np.searchsorted(mixture_cdf, (1 - CENTRAL_TAIL_MASS) * total), xs.size - 1)]
    step_edges = np.concatenate([exact["edges_by_label"].get(i, np.empty(0)) for i in rows])
    step_edges = step_edges[(step_edges > left) & (step_edges < right)]
    cap = 4 * bins
    if step_edges.size > cap:
        # many stairs: keep the edges nearest the labels, where the densities differ most
        a, b = sorted(float(labels[i]) for i in rows)
        distance = np.maximum(np.maximum(a - step_edges, step_edges - b), 0.0)
        step_edges = step_edges[np.argsort(distance, kind="stable")[:cap]]
    edges = np.unique(np.concatenate([np.linspace(left, right, bins + 1), step_edges]))
    # claimed bin masses: cumulative cell masses on the grid augmented with the edges
    aug = np.unique(np.concatenate([xs, edges]))
    cdf = np.cumsum(_cell_masses(aug, _log_density_table(params)(aug, labels[rows])), axis=1)
    cdf = np.concatenate([np.zeros((2, 1)), cdf], axis=1)
    at_edges = cdf[:, np.searchsorted(aug, edges)]
    mass = cdf[:, -1:]
    claimed = np.diff(np.concatenate([np.zeros((2, 1)), at_edges, mass], axis=1), axis=1) / mass
    info = {"bins": int(edges.size + 1), "bin_range": (float(left), float(right)), "step_edge_bins": int(step_edges.size)}
    return edges, np.maximum(claimed, 0.0), info


def _empirical(params, exact, labels, samples, seed, bins, confidence):
    eps, delta, _ = _claimed(params)
    pair = exact["pair"]
    ys = [float(labels[i]) for i in pair]
    edges, claimed, info = _bins(params, exact, pair, labels, bins)
    base = Secret.from_seed(seed).child("empirical-audit")
    counts, off_support, not_finite = [], 0, 0
    table = jax.jit(lambda yt, y: params.log_density(yt, y))
    for j, y in enumerate(ys):
        # the shipped release path, as privatize runs it (grid, clamp, derived keys)
        draws = jnp.asarray(release(params, base.child("label", j), np.full(samples, y)))
        finite = np.isfinite(np.asarray(draws))
        not_finite += int((~finite).sum())
        draws_np = np.asarray(draws, np.float64)
        if params.discrete:
            idx = np.clip(np.searchsorted(edges, draws_np), 0, edges.size - 1)
            hit = finite & (edges[idx] == draws_np)
            off_support += int((finite & ~hit).sum())
            counts.append(np.bincount(idx[hit], minlength=edges.size))
        else:
            density = np.asarray(table(draws, jnp.full_like(draws, y)))
            off_support += int((finite & ~np.isfinite(density)).sum())
            counts.append(np.bincount(np.searchsorted(edges, draws_np[finite], side="right"), minlength=edges.size + 1))
    counts = np.stack(counts).astype(np.float64)
    n_bins = counts.shape[1]

    # sets: every bin, and per direction every prefix of the bins ranked by the claimed likelihood ratio
    tests = []
    for num, den in ((0, 1), (1, 0)):
        with np.errstate(divide="ignore", invalid="ignore"):
            log_ratio = np.log(claimed[num]) - np.log(claimed[den])
        rank = np.argsort(-np.nan_to_num(log_ratio, nan=-np.inf), kind="stable")
        prefix_num = np.cumsum(counts[num][rank])[:-1]
        prefix_den = np.cumsum(counts[den][rank])[:-1]
        tests.append((np.concatenate([counts[num], prefix_num]), np.concatenate([counts[den], prefix_den]), num, rank))
    n_bounds = 2 * sum(t[0].size for t in tests)
    alpha = (1 - confidence) / n_bounds
    best, best_pure, best_where = -np.inf, -np.inf, None
    for k_num, k_den, num, _ in tests:
        lower, _ = clopper_pearson(k_num, samples, alpha)
        _, upper = clopper_pearson(k_den, samples, alpha)
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = np.where(lower > delta, np.log(np.maximum(lower - delta, 1e-300)) - np.log(upper), -np.inf)
            bound_pure = np.where(lower > 0, np.log(np.maximum(lower, 1e-300)) - np.log(upper), -np.inf)
        i = int(np.argmax(bound))
        if bound[i] > best:
            kind = f"bin {i}" if i < n_bins else f"the {i - n_bins + 1} bins of highest claimed ratio"
            best = float(bound[i])
            best_where = f"{kind}, P(y={ys[num]!r}) >= {lower[i]:.4g}, P(y={ys[1 - num]!r}) <= {upper[i]:.4g}"
        best_pure = max(best_pure, float(np.max(bound_pure)))
    problems = []
    if off_support:
        problems.append(f"{off_support} samples where the claimed density is zero")
    if not_finite:
        problems.append(f"{not_finite} samples not finite")
    info.update(
        pair=tuple(ys),
        samples=samples,
        confidence=confidence,
        tests=n_bounds // 2,
        lower_bound_raw=best,
        lower_bound_ignoring_delta=best_pure,
        strongest_set=best_where,
        problems=problems,
    )
    lower_bound = max(best, 0.0)
    return lower_bound, bool(lower_bound <= eps and not problems), info


# --------------------------------------------------------------------------- public API



def audit_mechanism(
    params: Mechanism,
    *,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    grid_size: int = DEFAULT_GRID_SIZE,
    label_grid_size: int = DEFAULT_LABEL_GRID_SIZE,
    bins: int = DEFAULT_BINS,
    confidence: float = DEFAULT_CONFIDENCE,
    name: str | None = None,
    audit_seed: int | None = None,
    fresh_labels: int = FRESH_LABELS,
) -> AuditReport:
    """Exact check and empirical audit of ONE fitted mechanism (unbatched params).

    Args:
      params: a fitted :class:`~rpwjax.mechanisms.base.Mechanism` for one ε.
      samples: outputs drawn at each of the two audited labels.
      seed: the sampling seed (public: the audit has nothing to hide).
      grid_size: points of the uniform output grid (continuous outputs).
      label_grid_size: equally spaced labels on [lo, hi] (breakpoints are added).
      bins: equal-width bins of the empirical audit (continuous outputs).
      confidence: joint confidence of all Clopper-Pearson bounds.
      name: the name in the report (default ``params.name``).
      audit_seed: the seed of the realized check's ``fresh_labels`` random labels (default: drawn from OS
        entropy, so that every audit checks labels nobody chose; recorded in the report to reproduce it).
    """
    if not isinstance(params, Mechanism):
        raise InputError(f"params must be a fitted rpwjax mechanism, got params of type {type(params).__name__}")
    if params.batch_shape != ():
        raise InputError(f"audit needs parameters for one epsilon, got batch shape {params.batch_shape}")
    samples = check_integer(samples, "samples")
    seed = check_integer(seed, "seed", 0)
    grid_size = check_integer(grid_size, "grid_size", 3)
    label_grid_size = check_integer(label_grid_size, "label_grid_size", 2)
    bins = check_integer(bins, "bins")
    if not 0 < confidence < 1:
        raise InputError(f"confidence must be in (0, 1), got confidence={confidence!r}")
    audit_seed = new_audit_seed() if audit_seed is None else check_integer(audit_seed, "audit_seed", 0)
    fresh_labels = check_integer(fresh_labels, "fresh_labels", 0)
    eps, delta, pure = _claimed(params)
    check_epsilon(eps)
    with jax.enable_x64(True), certify.suspended():  # the audit measures the release, it does not refuse it
        labels = label_grid(params, label_grid_size)
        exact = exact_check(params, labels, grid_size, seed)
        lower_bound, empirical_pass, empirical_info = _empirical(params, exact, labels, samples, seed, bins, confidence)
        real = realized.check(params, extra_labels=realized.fresh_labels(params, fresh_labels, audit_seed))
        grid_pass, grid_info = _output_grid_check(params, seed)
    return AuditReport(
        mechanism=name or params.name,
        epsilon=eps,
        delta=delta,
        pure=pure,
        exact_max_log_ratio=exact["max_ratio"],
        exact_delta=exact["delta"],
        exact_pass=exact["pass"],
        empirical_lower_bound=lower_bound,
        empirical_pass=empirical_pass,
        details={"exact": exact["info"], "empirical": empirical_info, "output_grid": grid_info, "confidence": confidence,
                 "realized": dict(real["info"], problems=real["problems"]), "audit_seed": audit_seed},
        output_grid_pass=grid_pass,
        realized_max_log_ratio=real["realized_max_log_ratio"],
        realized_delta=real["realized_delta"],
        realized_pass=real["pass"],
    )


def _output_grid_check(params: Mechanism, seed: int) -> tuple[bool, dict]:
    """What the release path writes lies in the sidecar's ``output_range`` and, if continuous, on ``output_grid``.

    Every released value must be an exact multiple of ``output_grid`` (so its
    low-order bits are zero whatever the label was) and inside
    ``output_range``; the grid must be fine enough not to collapse the
    distribution (many distinct outputs).
    """
    fields = sidecar_fields(params)
    step, (a, b) = fields["output_grid"], fields["output_range"]
    info: dict[str, Any] = {"step": step, "output_range": [a, b], "problems": []}
    labels = np.linspace(params.lo, params.hi, 100_000)
    out = release(params, Secret.from_seed(seed).child("grid-audit"), labels)
    outside = int(np.count_nonzero((out < a) | (out > b)))
    info.update(outside_range=outside)
    if outside:
        info["problems"].append(f"{outside} released values lie outside output_range=[{a!r}, {b!r}]")
    if step is None:
        info["note"] = "discrete outputs: released values are the mechanism's own output values"
        return not info["problems"], info
    off_grid = int(np.count_nonzero(np.round(out / step) * step != out))
    distinct = int(np.unique(out).size)
    info.update(off_grid=off_grid, distinct_outputs=distinct)
    if off_grid:
        info["problems"].append(f"{off_grid} released values are not multiples of output_grid={step!r}")
    if distinct < 100:
        info["problems"].append(f"only {distinct} distinct outputs among 100000: the grid collapses the distribution")
    return not info["problems"], info


def new_audit_seed() -> int:
    """A fresh audit seed from OS entropy (63 bits)."""
    import secrets

    return secrets.randbits(63)


def example_labels() -> np.ndarray:
    """The fixed public example prior: 64 Beta(2, 5) quantiles on [0, 1] (no randomness, no data)."""
    return stats.beta.ppf((np.arange(64) + 0.5) / 64, 2, 5)


def fit_example(name: str, epsilon: float) -> Mechanism:
    """``name`` fitted at ``epsilon`` on the example prior (privacy does not depend on the prior)."""
    return api.fit(name, example_labels(), range=EXAMPLE_RANGE, epsilon=epsilon, prior="empirical").params


def _names(names) -> list[str]:
    known = api.mechanism_names()
    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not names:
        raise InputError("mechanism names must not be empty, got names=[]")
    out = []
    for n in names:
        if n == "all":
            out += [m for m in known if m not in out]
        else:
            check_choice(n, "mechanism", (*known, "all"))
            if n not in out:
                out.append(n)
    return out


def audit(
    names: str | Sequence[str] = "all",
    epsilon=DEFAULT_EPSILON,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    audit_seed: int | None = None,
    **options,
) -> list[AuditReport]:
    """Fit each named mechanism (``"all"``: every registered one) at each ``epsilon`` and audit it.

    Every mechanism is fitted with :func:`rpwjax.api.fit` on :func:`example_labels`
    over [0, 1]; ``options`` go to :func:`audit_mechanism`. Reports are ordered
    by mechanism, then ε. ``audit_seed`` (default: one from OS entropy) seeds every report's fresh labels.
    """
    eps = np.atleast_1d(check_epsilon(epsilon))
    samples = check_integer(samples, "samples")
    seed = check_integer(seed, "seed", 0)
    audit_seed = new_audit_seed() if audit_seed is None else check_integer(audit_seed, "audit_seed", 0)
    return [
        audit_mechanism(fit_example(n, float(e)), samples=samples, seed=seed, name=n, audit_seed=audit_seed, **options)
        for n in _names(names) for e in eps
    ]


# --------------------------------------------------------------------------- runs and their text


def run_audit(mechanisms=None, epsilons=None, *, samples: int = DEFAULT_SAMPLES, seed: int = 0,
              audit_seed: int | None = None) -> dict:
    """Audit registered mechanisms on the example prior at one or more ε.

    Returns ``{"reports", "broken", "keys", "pass", "audit_seed"}``: one :class:`AuditReport` per (mechanism, ε); a
    mechanism that cannot be fitted or audited is reported in ``broken`` (the others are still audited);
    ``keys`` is the key-derivation check (:func:`rpwjax.realized.key_space_check`). Bad arguments
    raise :class:`~rpwjax.errors.InputError`.
    """
    eps = np.atleast_1d(check_epsilon(epsilons if epsilons is not None else [DEFAULT_EPSILON]))
    samples = check_integer(samples, "samples")
    seed = check_integer(seed, "seed", 0)
    audit_seed = new_audit_seed() if audit_seed is None else check_integer(audit_seed, "audit_seed", 0)
    names = _names(mechanisms if mechanisms is not None else "all")
    keys = realized.key_space_check()
    reports, broken = [], []
    for name in names:
        for e in eps:
            try:
                reports += audit([name], float(e), samples, seed, audit_seed=audit_seed)
            except Exception as err:  # noqa: BLE001 - the arguments are valid: this mechanism is broken, not the call
                broken.append(f"{name} at epsilon={e:g}: could not be audited: {type(err).__name__}: {err}")
    ok = bool(reports and not broken and keys["pass"] and all(r.passed for r in reports))
    return {"reports": reports, "broken": broken, "keys": keys, "pass": ok, "audit_seed": audit_seed}


# what rpwjax privatize adds to the fit's record in its sidecar (rpwjax.privatize.privatize_file)
SIDECAR_FIELDS = ("rows", "label_column", "output_grid", "output_range", "release_grid", "release_range",
                  "postprocessing", "randomness", "verified", "prior_is_public")


def fit_record(record):
    """The fit record inside a privatize sidecar (``OUTPUT.json``): the sidecar less :data:`SIDECAR_FIELDS`;
    anything else unchanged (a params file passes through)."""
    if isinstance(record, dict) and "rows" in record and "label_column" in record:
        return {k: v for k, v in record.items() if k not in SIDECAR_FIELDS}
    return record


def legend(samples: int, keys: dict, audit_seed: int | None = None) -> str:
    """What each column of :func:`format_table` means (printed under the table)."""
    return (
        f"exact: max log density ratio of the ideal density over a grid of labels and outputs, pass iff <= "
        f"eps + {RATIO_TOLERANCE:g}; (eps, delta)-DP mechanisms: delta(eps) of the privacy-loss profile <= delta."
        f"\nrealized: the exact probability of every value the release path can emit (2^52 uniforms, bisection "
        f"on the monotone sampler), max log ratio over labels, pass iff <= eps + {realized.REALIZED_TOLERANCE:g} "
        f"(Gaussian: realized delta <= delta); labels: the range ends, every breakpoint and its float "
        f"neighbours, a grid, and {FRESH_LABELS} fresh random labels"
        + ("" if audit_seed is None else f" (audit seed {audit_seed}; --audit-seed {audit_seed} reproduces them)")
        + "."
        f"\nempirical: {samples} released samples at each of two labels, Clopper-Pearson + Bonferroni lower bound "
        f"on eps at {DEFAULT_CONFIDENCE:.1%} confidence, fail iff > claimed eps."
        f"\ngrid: the public output grid (none: discrete outputs); every released value lies on it and in the "
        f"sidecar's output_range. release MSE change: label MSE of the release against the ideal mechanism."
        f"\nkeys: {keys['key_bits']}-bit block keys, every secret bit reaches them: "
        f"{'yes' if keys['pass'] else 'NO'}"
    )


def record_lines(path, record: dict) -> list[str]:
    """A verified params record in words (``rpwjax audit --params``)."""
    recomputed = record.get("epsilon_mechanism_recomputed")
    lines = [f"record: {path}: states epsilon={record['epsilon']} (prior {record['epsilon_prior']} + mechanism "
             f"{record['epsilon_mechanism']}), delta={record['delta']}, prior {record['prior']}; recomputed from the "
             f"parameters: epsilon_mechanism={recomputed}; checks "
             + ", ".join(f"{k}={'skipped' if v is None else 'yes' if v else 'NO'}" for k, v in record["checks"].items())
             + f"; verified: {'yes' if record['pass'] else 'NO'}"]
    return lines + [f"record: {problem}" for problem in record["problems"]]


def problem_lines(reports, keys, broken) -> list[str]:
    """Every failed check, one line each."""
    out = []
    for r in reports:
        for stage in ("exact", "realized", "empirical", "output_grid"):
            for problem in r.details[stage].get("problems", []):
                out.append(f"{r.mechanism} (epsilon={r.epsilon:g}): {stage}: {problem}")
    out += [f"keys: {problem}" for problem in keys["problems"]]
    return out + list(broken)


def format_table(reports: Sequence[AuditReport]) -> str:
    """The audit table: one row per (mechanism, ε)."""
    head = (
        "mechanism", "guarantee", "claimed eps", "delta", "exact (ideal density)", "realized (as shipped)",
        "empirical eps lower bound", "grid", "release MSE change", "pass",
    )
    rows = []
    for r in reports:
        real = r.details.get("realized", {})
        if r.pure:
            exact = f"{r.exact_max_log_ratio:.9f}"
            shipped = f"{r.realized_max_log_ratio:.9f}"
        else:
            # the ratio of an (ε, δ) mechanism is unbounded: its checks are δ(ε) <= δ
            exact = f"delta(eps)={r.exact_delta:.7g}"
            shipped = f"delta(eps)={r.realized_delta:.7g}"
        change = real.get("release_mse_change")
        rows.append(
            (
                r.mechanism,
                r.guarantee,
                f"{r.epsilon:g}",
                f"{r.delta:g}",
                exact + ("" if r.exact_pass else " NO"),
                shipped + ("" if r.realized_pass else " NO"),
                f"{r.empirical_lower_bound:.4f}" + ("" if r.empirical_pass else " NO"),
                "none" if real.get("output_grid") is None else f"{real['output_grid']:.6g}",
                "-" if change is None else f"{100 * change:+.4f}%",
                "yes" if r.passed else "NO",
            )
        )
    widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(len(head))]
    line = lambda row: "  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])


def _judged_against(report: AuditReport, eps2, delta) -> AuditReport:
    """``report`` re-judged against the epsilon_mechanism and delta a params file states (its checks ran at
    ``params.epsilon``; a file whose two disagree must fail at the stated, smaller one)."""
    if eps2 is None or delta is None:
        return report
    if report.pure:
        exact_pass = report.exact_pass and report.exact_max_log_ratio <= eps2 + RATIO_TOLERANCE
        realized_pass = report.realized_pass and report.realized_max_log_ratio <= eps2 + realized.REALIZED_TOLERANCE
    else:
        exact_pass = report.exact_pass and report.exact_delta <= delta * (1 + DELTA_RELATIVE_TOLERANCE)
        realized_pass = report.realized_pass and report.realized_delta <= delta
    empirical_pass = report.empirical_pass and report.empirical_lower_bound <= eps2
    return dataclasses.replace(report, epsilon=float(eps2), delta=report.delta if report.pure else float(delta),
                               exact_pass=bool(exact_pass), realized_pass=bool(realized_pass),
                               empirical_pass=bool(empirical_pass))
