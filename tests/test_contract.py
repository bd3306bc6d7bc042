"""The contract table: every registered mechanism × prior kind × ε, every case through the same checks.

In the style of numpyro's ``test_distributions``: :data:`CASES` is one list, built from the registry
:data:`rpwjax.mechanisms.MECHANISMS`, and every check below is one test function parametrized over all
of it, so a new mechanism joins the table by joining the registry (options its fit needs go into
:data:`FIT_OPTIONS`; its fast case into :data:`FAST`, which
:func:`test_every_registered_mechanism_is_in_the_table` asks for). Fits go through ``MECHANISMS[name].fit(prior, epsilon, **options)``, releases
through ``rpwjax.release(params, Secret.from_seed(k), labels)`` (the one release path), and the checks
use only the public contract of a fitted mechanism (``log_density``, ``bias``, ``mse``,
``breakpoints``, ``release_spec``, ``pure``, ``discrete``, ``to_json``/``from_json``), never a
mechanism's internals.

Prior kinds: ``"empirical"`` (:func:`rpwjax.empirical_prior`, 73 distinct points), ``"histogram"``
(:func:`rpwjax.histogram_prior`, 7 unequal bins) and ``"private"`` (:func:`rpwjax.private_histogram`, 12
bins, ε₁ = 1, ``Secret.from_seed(3)``). Mechanisms that read the prior (``uses_prior``: RPWithPrior,
RR-on-Bins, Unbiased) run with all three; the prior-free ones (Laplace, Gaussian, Staircase) take the
prior argument but ignore it, so they run with the empirical prior only, and
:func:`test_prior_free_fit_ignores_the_prior` checks that all three kinds give them identical
parameters. ε ∈ {0.5, 2, 8} for every mechanism × prior kind: 36 cases. The fast subset
(``-m "not slow"``) is :data:`FAST`, one case per mechanism at ε = 2 that between them use every prior
kind; the other 30 are marked ``slow`` (each new prior shape costs JAX compilations, each ε an LP).

Checks, per case:

* **exact privacy** (:func:`test_exact_privacy`): the log density (log pmf) on a grid of labels
  (range ends, a grid, every breakpoint and the floats just either side of it) and of outputs (every
  output of a discrete mechanism; a grid over the release range plus both sides of every step edge
  of every label's density, found by bisection, for a continuous one). The support must not depend on
  the label and the density must integrate (sum) to one. Pure mechanisms: max log ratio ≤ ε + 1e-9 and
  attained (≥ ε - 1e-6: RPWithPrior, Laplace, Staircase, RR-on-Bins and Unbiased are all tight),
  unless the fitted mechanism ignores the label altogether (then the ratio is exactly 0; e.g.
  RPWithPrior with A1 = A2). Gaussian ((ε, δ) only): δ(ε), the hockey-stick divergence integrated
  from ``log_density`` over every label pair, is ≤ δ and attained (analytic calibration), equals the
  closed form, and the ratio does exceed ε (no pure guarantee).
* **release vs density** (:func:`test_release_matches_the_density`): released values at four labels
  against the exact density, chi-square over bins whose edges sit halfway between output grid points
  (so snapping never moves a value across a bin edge) with masses integrated from ``log_density``, or
  over the pmf of the outputs; p > 1e-4 with fixed seeds. :func:`test_goodness_of_fit_rejects_a_wrong_density`
  shows the same helper rejects wrong densities.
* **JSON round trip** (:func:`test_json_round_trip`): ``from_json(json.loads(json.dumps(to_json())))``
  gives identical fields and an identical ``log_density``, ``to_json`` and release, for the case's
  fit and for the fit over the whole ε grid (one batched object).
* **vmap over ε ≡ loop** (:func:`test_fit_over_an_epsilon_grid_equals_fits_one_at_a_time`): the fit over
  the grid (0.5, 2, 8) and the fit at the case's ε alone agree on the parameters, ``log_density``,
  ``bias`` and ``mse``.
* **bias and mse vs Monte Carlo** (:func:`test_bias_and_mse_match_the_release`): ``params.bias(y)`` and
  ``params.mse(y)`` against the mean error and mean squared error of the released values, within 4.5
  standard errors (plus h²/6 on the mse for the snap to the output grid h).
"""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from scipy import stats

import rpwjax
from rpwjax.audit.exact import _cell_masses as audit_cell_masses
from rpwjax.audit.exact import _change as audit_change
from rpwjax.audit.exact import label_grid
from rpwjax import Secret
from rpwjax.mechanisms import MECHANISMS
from rpwjax.mechanisms.additive import Laplace, gaussian_delta
from rpwjax.mechanisms.rr_on_bins import RROnBins

LO, HI = -1.0, 3.0  # Δ = 4; a negative lo catches sign slips
WIDTH = HI - LO
EPSILONS = (0.5, 2.0, 8.0)  # the grid of the vmap check; every case's ε is one of these
PRIOR_KINDS = ("empirical", "histogram", "private")
FIT_OPTIONS: dict[str, dict] = {}  # per mechanism, options for MECHANISMS[name].fit (defaults otherwise)

RATIO_TOLERANCE = 1e-9  # exact privacy: max log ratio <= ε + this
ATTAINED_TOLERANCE = 1e-6  # ... and >= ε - this (Unbiased solves its LP at ε - 1e-8)
MASS_TOLERANCE = 1e-6
P_VALUE = 1e-4  # goodness of fit threshold (fixed seeds: deterministic, not flaky)
STANDARD_ERRORS = 4.5
SAMPLES = 40_000  # released values per label, for the goodness of fit and the Monte Carlo moments
EDGE_OFFSET = 1e-9  # points "just either side" of a step edge, relative to max(Δ, |ỹ|)


def _labels():
    """400 labels: Beta(2, 5) quantiles on [lo, hi] rounded to 0.04 (73 distinct values, both ends in)."""
    y = LO + WIDTH * np.round(stats.beta.ppf((np.arange(400) + 0.5) / 400, 2, 5) * 100) / 100
    return np.concatenate([y, [LO, HI]])


@functools.lru_cache(maxsize=None)
def prior(kind: str) -> rpwjax.Prior:
    if kind == "empirical":
        return rpwjax.empirical_prior(_labels(), LO, HI)
    if kind == "histogram":
        return rpwjax.histogram_prior([-1.0, -0.5, 0.0, 0.25, 0.7, 1.2, 2.0, 3.0], [1, 3, 4, 2, 3, 1, 0.5])
    if kind == "private":
        return rpwjax.private_histogram(_labels(), LO, HI, 1.0, bins=12, secret=Secret.from_seed(3))
    raise ValueError(kind)


# --------------------------------------------------------------------------- the table


@dataclasses.dataclass(frozen=True)
class Case:
    mechanism: str
    prior: str
    epsilon: float

    @property
    def id(self) -> str:
        return f"{self.mechanism}-{self.prior}-eps{self.epsilon:g}"


# the fast subset (``-m "not slow"``): one case per mechanism, every prior kind at least once; the other
# cases (more JAX compilations of other prior shapes, LP fits at other ε) run in the full suite
FAST = {
    Case("rpwithprior", "empirical", 2.0),
    Case("laplace", "empirical", 2.0),
    Case("gaussian", "empirical", 2.0),
    Case("staircase", "empirical", 2.0),
    Case("rr-on-bins", "histogram", 2.0),
    Case("unbiased", "private", 2.0),
}


def _cases():
    out = []
    for name, entry in MECHANISMS.items():
        for kind in PRIOR_KINDS if entry.uses_prior else PRIOR_KINDS[:1]:
            for eps in EPSILONS:
                case = Case(name, kind, eps)
                out.append(pytest.param(case, id=case.id, marks=[] if case in FAST else [pytest.mark.slow]))
    return out


CASES = _cases()


@functools.lru_cache(maxsize=None)
def fitted(case: Case):
    params, _ = MECHANISMS[case.mechanism].fit(prior(case.prior), case.epsilon, **FIT_OPTIONS.get(case.mechanism, {}))
    assert params.batch_shape == ()
    return params


@functools.lru_cache(maxsize=None)
def fitted_grid(mechanism: str, kind: str):
    params, _ = MECHANISMS[mechanism].fit(prior(kind), np.array(EPSILONS), **FIT_OPTIONS.get(mechanism, {}))
    assert params.batch_shape == (len(EPSILONS),)
    return params


def release_labels(params) -> np.ndarray:
    """Four labels: both ends and two interior points (off the support points of a discrete prior)."""
    return np.array([params.lo, params.lo + 0.37 * WIDTH, params.lo + 0.71 * WIDTH, params.hi])


@functools.lru_cache(maxsize=None)
def released(case: Case):
    """SAMPLES released values at each of :func:`release_labels` (one release, seed fixed per case)."""
    params = fitted(case)
    ys = release_labels(params)
    seed = 1000 + [c.values[0] for c in CASES].index(case)
    out = rpwjax.release(params, Secret.from_seed(seed), np.repeat(ys, SAMPLES))
    return ys, out.reshape(ys.size, SAMPLES)


# --------------------------------------------------------------------------- helpers (public contract only)


def _padded(x, fill=None):
    """``x`` padded with copies of its last value to a power-of-two length: one compilation per size class."""
    x = np.asarray(x, np.float64)
    size = 1 << max(int(x.size - 1).bit_length(), 4)
    return np.concatenate([x, np.full(size - x.size, x[-1] if fill is None else fill)])


@jax.jit
def _table(params, points, labels):
    """log p(points | labels): (labels, points)."""
    yt = jnp.broadcast_to(points[None, :], (labels.shape[0], points.shape[0]))
    return params.log_density(yt, jnp.broadcast_to(labels[:, None], yt.shape))


def log_density_table(params, points, labels) -> np.ndarray:
    points, labels = np.asarray(points, np.float64), np.asarray(labels, np.float64)
    with jax.enable_x64(True):
        out = _table(params, jnp.asarray(_padded(points)), jnp.asarray(_padded(labels)))
    return np.asarray(out)[: labels.size, : points.size]


def moments(params, labels):
    with jax.enable_x64(True):
        y = jnp.asarray(labels, jnp.float64)
        return np.asarray(params.bias(y), np.float64), np.asarray(params.mse(y), np.float64)


def privacy_labels(params, size: int = 33) -> np.ndarray:
    """Range ends, an equal grid, every label breakpoint and the floats just either side of it (the audit's grid)."""
    return label_grid(params, size)


def _change(a, b, xp=np):
    """|a - b| of two log densities: infinite across a support edge, 0 where both are off the support."""
    return audit_change(a, b, xp)


@jax.jit
def _bisect(params, a, b, y):
    """Shrink each cell [a, b] of label y 2^64-fold around its largest log-density change."""

    def step(_, state):
        a, b, la, lb = state
        m = a + 0.5 * (b - a)
        lm = params.log_density(m, y)
        left = _change(la, lm, jnp) >= _change(lm, lb, jnp)
        return jnp.where(left, a, m), jnp.where(left, m, b), jnp.where(left, la, lm), jnp.where(left, lm, lb)

    la, lb = params.log_density(a, y), params.log_density(b, y)
    a, b, la, lb = lax.fori_loop(0, 64, step, (a, b, la, lb))
    return b, _change(la, lb, jnp)


def step_edges(params, base, labels) -> np.ndarray:
    """Every step edge of every label's density between points of ``base`` (bisection, any mechanism)."""
    values = log_density_table(params, base, labels)
    rows, cells = np.nonzero(_change(values[:, :-1], values[:, 1:]) > 1e-10)
    if rows.size == 0:
        return np.empty(0)
    with jax.enable_x64(True):
        a, b, y = (jnp.asarray(_padded(v)) for v in (base[cells], base[cells + 1], labels[rows]))
        edge, jump = _bisect(params, a, b, y)
    edge, jump = np.asarray(edge)[: rows.size], np.asarray(jump)[: rows.size]
    return np.unique(edge[jump > 1e-10])


def output_range(params):
    """[a, b]: the release range widened by Δ (the density's mass beyond it is negligible)."""
    spec = params.release_spec()
    return float(np.min(spec["low"])) - WIDTH, float(np.max(spec["high"])) + WIDTH


def continuous_points(params, labels, size: int = 8001):
    """Sorted output points for quadrature: a grid, the labels, and both sides of every step edge."""
    a, b = output_range(params)
    base = np.unique(np.concatenate([np.linspace(a, b, size), labels]))
    edges = step_edges(params, base, labels)
    eta = EDGE_OFFSET * np.maximum(WIDTH, np.abs(edges))
    return np.unique(np.concatenate([base, edges - eta, edges + eta])), edges


def trapezoid_weights(x):
    w = np.zeros_like(x)
    w[:-1] += np.diff(x) / 2
    w[1:] += np.diff(x) / 2
    return w


def cell_masses(x, log_p):
    """Mass of each cell [x_k, x_{k+1}] of densities ``exp(log_p)`` on sorted ``x`` (the audit's quadrature)."""
    return audit_cell_masses(x, log_p)


def exact_privacy(params) -> dict:
    """What the exact check measures: max log ratio, per-label total mass, label-free or not, and δ(ε)."""
    labels = privacy_labels(params)
    if params.discrete:
        outputs = np.unique(np.asarray(params.outputs, np.float64))
        between = np.concatenate([0.5 * (outputs[1:] + outputs[:-1]), [outputs[0] - WIDTH, outputs[-1] + WIDTH]])
        L = log_density_table(params, outputs, labels)
        off = log_density_table(params, between, labels)
        mass = np.exp(L).sum(axis=1)
        probes = np.empty((labels.size, 0))
    else:
        points, _ = continuous_points(params, labels)
        a, b = output_range(params)
        far = (b - a) * 2.0 ** np.arange(1, 5)
        L = log_density_table(params, points, labels)
        off = np.full((labels.size, 0), -np.inf)
        probes = log_density_table(params, np.concatenate([a - far, b + far]), labels)
        mass = cell_masses(points, L).sum(axis=1)
    every = np.concatenate([L, probes], axis=1)
    finite = np.isfinite(every)
    result = {
        "labels": labels,
        "support_depends_on_label": bool(np.any(finite.any(axis=0) & ~finite.all(axis=0))),
        "mass_on_non_outputs": bool(np.isfinite(off).any()),
        "mass": mass,
        "nan": bool(np.isnan(every).any() or np.isposinf(every).any()),
    }
    used = finite.all(axis=0)
    ratio = every[:, used].max(axis=0) - every[:, used].min(axis=0)
    result["max_log_ratio"] = float(ratio.max())
    result["label_free"] = bool(np.all(ratio == 0))
    if not params.pure:
        # δ(ε) = max over label pairs of ∫ (p(·|y) - e^ε p(·|y'))_+, trapezoid on a dense grid (a smooth integrand)
        eps = float(params.epsilon)
        a, b = output_range(params)  # ... widened: the release range leaves out ~1e-8 of tail, ~1e-3 of δ
        a, b = a - (b - a), b + (b - a)
        x = np.unique(np.concatenate([np.linspace(a, b, 64_001), labels]))
        density = np.exp(log_density_table(params, x, labels))
        w = trapezoid_weights(x)
        profile = [np.maximum(density[i][None, :] - np.exp(eps) * density, 0.0) @ w for i in range(labels.size)]
        result["delta"] = float(np.max(profile))
    return result


def bin_masses(params, y, edges, a, b) -> np.ndarray:
    """Masses of (-inf, e_1), [e_1, e_2), ..., [e_last, inf) at label y, integrated from log_density on [a, b]
    (log-linear cells on a fine grid that holds both sides of every step edge: exact for step densities)."""
    base = np.unique(np.concatenate([np.linspace(a, b, 20_001), [y], edges]))
    jumps = step_edges(params, base, np.array([y]))
    eta = EDGE_OFFSET * np.maximum(WIDTH, np.abs(jumps))
    x = np.unique(np.concatenate([base, jumps - eta, jumps + eta]))
    cdf = np.concatenate([[0.0], np.cumsum(cell_masses(x, log_density_table(params, x, np.array([y]))[0]))])
    return np.diff(np.concatenate([[0.0], cdf[np.searchsorted(x, edges)], [cdf[-1]]]))


def goodness_of_fit(params, draws, y, grid, bins: int = 40) -> dict:
    """Chi-square of released values ``draws`` at label ``y`` against the density of ``params``.

    Discrete: the pmf over the outputs (outputs expected fewer than 5 times pooled into one cell).
    Continuous: ``bins`` bins at quantiles of the density, their edges moved to halfway between points
    of the output ``grid`` (a released value is a grid point and the snap moves a value by at most h/2,
    so no value crosses an edge); the masses are not renormalised, so a density that does not integrate
    to one is rejected too. Returns the p-value and the number of draws the density says are impossible.
    """
    draws = np.asarray(draws, np.float64)
    n = draws.size
    if params.discrete:
        outputs = np.unique(np.asarray(params.outputs, np.float64))
        index = np.clip(np.searchsorted(outputs, draws), 0, outputs.size - 1)
        impossible = int(np.count_nonzero(outputs[index] != draws))
        observed = np.bincount(index, minlength=outputs.size).astype(np.float64)
        expected = n * np.exp(log_density_table(params, outputs, np.array([y]))[0])
        impossible += int(observed[expected == 0].sum())
        rare = expected < 5
        observed = np.append(observed[~rare], observed[rare].sum())
        expected = np.append(expected[~rare], expected[rare].sum())
        keep = expected > 0
        observed, expected = observed[keep], expected[keep]
    else:
        a, b = output_range(params)
        x = np.linspace(a, b, 20_001)
        cdf = np.concatenate([[0.0], np.cumsum(cell_masses(x, log_density_table(params, x, np.array([y]))[0]))])
        edges = np.interp(np.arange(1, bins) / bins * cdf[-1], cdf, x)
        if grid is not None:
            edges = (np.floor(edges / grid) + 0.5) * grid
        edges = np.unique(edges)
        expected = n * bin_masses(params, y, edges, a, b)
        observed = np.bincount(np.searchsorted(edges, draws, side="right"), minlength=edges.size + 1).astype(np.float64)
        impossible = int(np.count_nonzero(~np.isfinite(log_density_table(params, np.unique(draws), np.array([y]))[0])))
    statistic = float(np.sum((observed - expected) ** 2 / expected))
    return {"p": float(stats.chi2.sf(statistic, observed.size - 1)), "impossible": impossible, "cells": observed.size}


# --------------------------------------------------------------------------- the table's own checks


def test_every_registered_mechanism_is_in_the_table():
    in_table = {c.values[0].mechanism for c in CASES}
    assert in_table == set(MECHANISMS)
    fast = [c.values[0] for c in CASES if not any(m.name == "slow" for m in c.marks)]
    assert {c.mechanism for c in fast} == set(MECHANISMS)  # the fast subset runs every mechanism
    assert {c.prior for c in fast} == set(PRIOR_KINDS)  # ... and every prior kind
    for name, entry in MECHANISMS.items():
        kinds = {c.values[0].prior for c in CASES if c.values[0].mechanism == name}
        assert kinds == (set(PRIOR_KINDS) if entry.uses_prior else {"empirical"})


@pytest.mark.parametrize("name", [n for n, e in MECHANISMS.items() if not e.uses_prior])
def test_prior_free_fit_ignores_the_prior(name):
    records = [MECHANISMS[name].fit(prior(kind), 2.0, **FIT_OPTIONS.get(name, {}))[0].to_json() for kind in PRIOR_KINDS]
    assert records[0] == records[1] == records[2]


# --------------------------------------------------------------------------- the checks, per case


@pytest.mark.parametrize("case", CASES)
def test_exact_privacy(case):
    params = fitted(case)
    eps = case.epsilon
    result = exact_privacy(params)
    assert not result["nan"], "log_density returned NaN or +inf"
    assert not result["support_depends_on_label"], "one label has mass where another has none"
    assert not result["mass_on_non_outputs"], "a discrete mechanism has mass off its outputs"
    np.testing.assert_allclose(result["mass"], 1.0, rtol=0, atol=MASS_TOLERANCE)
    if params.pure:
        assert result["max_log_ratio"] <= eps + RATIO_TOLERANCE
        if result["label_free"]:
            # the fit ignores the label (e.g. RPWithPrior with A1 = A2, RR-on-Bins with one bin): ratio exactly 0
            assert result["max_log_ratio"] == 0.0
        else:
            assert result["max_log_ratio"] >= eps - ATTAINED_TOLERANCE  # tight: no budget wasted
    else:
        delta = float(params.delta)
        assert result["max_log_ratio"] > eps  # not pure: δ covers outputs whose loss exceeds ε
        assert result["delta"] <= delta * (1 + 1e-4)
        assert result["delta"] >= delta * (1 - 1e-3)  # the analytic calibration spends all of δ
        closed_form = float(gaussian_delta(params.sigma, eps, WIDTH))
        assert result["delta"] == pytest.approx(closed_form, rel=1e-4)


def test_the_label_free_branch_is_the_exception():
    """Every pure mechanism attains ε in some fast case (so the label-free branch cannot hide a loose bound)."""
    for name, entry in MECHANISMS.items():
        cases = [c.values[0] for c in CASES if c.values[0].mechanism == name and not c.marks]
        if not entry.params.pure:
            continue
        assert any(not exact_privacy(fitted(c))["label_free"] for c in cases), name


@pytest.mark.parametrize("case", CASES)
def test_release_matches_the_density(case):
    params = fitted(case)
    ys, draws = released(case)
    grid = params.release_spec()["grid"]
    for y, sample in zip(ys, draws):
        fit = goodness_of_fit(params, sample, y, grid)
        assert fit["impossible"] == 0, (y, fit)
        if not params.discrete:
            assert fit["cells"] >= 30, (y, fit)  # 40 quantile bins, a few merged by the snap to the grid at most
        assert fit["p"] > P_VALUE, (y, fit)


@pytest.mark.parametrize("lo", [0.0, -0.0], ids=["lo0", "lo-0"])
@pytest.mark.parametrize("name", [n for n, e in MECHANISMS.items() if not e.params.discrete])
def test_the_grid_point_zero_is_released_as_one_value(name, lo):
    """With the range starting at 0 (or -0.0) a draw just below 0 rounds to -0.0: a file would hold -0.0 beside
    0.0, two values where the certificate counts one cell. Every zero released is +0.0."""
    prior = rpwjax.priors.histogram_prior(np.linspace(lo, 1.0, 5), [8.0, 1.0, 1.0, 1.0])  # RPWithPrior: A1 at 0
    params, _ = MECHANISMS[name].fit(prior, 1.0, **FIT_OPTIONS.get(name, {}))
    out = rpwjax.release(params, Secret.from_seed(5), np.zeros(1_000_000))
    zeros = out[out == 0]
    assert zeros.size > 0 and not np.signbit(zeros).any()  # RPWithPrior's finer grid: tens of zeros


def test_goodness_of_fit_rejects_a_wrong_density():
    """The helper above can fail: a density 5% too wide (continuous) or at the wrong ε (discrete) is rejected
    on the same released values that the right density passes."""
    case = Case("laplace", "empirical", 2.0)
    params = fitted(case)
    ys, draws = released(case)
    grid = params.release_spec()["grid"]
    wrong = Laplace(params.epsilon, params.scale * 1.05, params.lo, params.hi)
    for y, sample in zip(ys, draws):
        assert goodness_of_fit(params, sample, y, grid)["p"] > P_VALUE
        assert goodness_of_fit(wrong, sample, y, grid)["p"] < P_VALUE
    # a fifth of a scale off centre: same shape, wrong place
    shifted = Laplace(params.epsilon, params.scale, params.lo + 0.2 * float(params.scale), params.hi)
    assert goodness_of_fit(shifted, draws[0], ys[0], grid)["p"] < P_VALUE

    case = Case("rr-on-bins", "histogram", 2.0)
    params = fitted(case)
    ys, draws = released(case)
    wrong = RROnBins(params.epsilon * 1.05, params.outputs, params.thresholds, params.num_bins, params.lo, params.hi)
    for y, sample in zip(ys, draws):
        assert goodness_of_fit(params, sample, y, None)["p"] > P_VALUE
        assert goodness_of_fit(wrong, sample, y, None)["p"] < P_VALUE


def test_exact_privacy_helper_catches_a_weakened_mechanism():
    """A Laplace scale 1% below Δ/ε claims ε but spends 1.01 ε: the exact check measures that."""
    params = fitted(Case("laplace", "empirical", 2.0))
    weak = Laplace(params.epsilon, params.scale / 1.01, params.lo, params.hi)
    assert exact_privacy(weak)["max_log_ratio"] == pytest.approx(2.0 * 1.01, rel=1e-9)
    assert exact_privacy(params)["max_log_ratio"] == pytest.approx(2.0, rel=1e-9)


def _round_trip(params, name):
    text = json.dumps(params.to_json())
    back = MECHANISMS[name].params.from_json(json.loads(text))
    assert type(back) is type(params) and back.batch_shape == params.batch_shape
    for f in dataclasses.fields(params):
        a, b = getattr(params, f.name), getattr(back, f.name)
        if isinstance(a, (str, bool, float, int)) or a is None:
            assert a == b, f.name
        else:
            np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=f.name)
    assert json.dumps(back.to_json()) == text
    return back


@pytest.mark.parametrize("case", CASES)
def test_json_round_trip(case):
    params = fitted(case)
    back = _round_trip(params, case.mechanism)
    labels = privacy_labels(params)
    points = np.unique(np.asarray(params.outputs)) if params.discrete else np.linspace(*output_range(params), 2001)
    np.testing.assert_array_equal(log_density_table(back, points, labels), log_density_table(params, points, labels))
    y = np.linspace(LO, HI, 1000)
    np.testing.assert_array_equal(rpwjax.release(back, Secret.from_seed(1), y), rpwjax.release(params, Secret.from_seed(1), y))
    # a fit over an ε grid round-trips as one batched object
    grid = fitted_grid(case.mechanism, case.prior)
    back = _round_trip(grid, case.mechanism)
    i = EPSILONS.index(case.epsilon)
    np.testing.assert_array_equal(log_density_table(back[i], points, labels), log_density_table(grid[i], points, labels))


@pytest.mark.parametrize("case", CASES)
def test_fit_over_an_epsilon_grid_equals_fits_one_at_a_time(case):
    single = fitted(case)
    batched = fitted_grid(case.mechanism, case.prior)[EPSILONS.index(case.epsilon)]
    assert batched.batch_shape == () and float(batched.epsilon) == case.epsilon
    for f in dataclasses.fields(single):
        if f.name in single.derived_fields:
            continue  # lookup tables of the sampler: indices into the padded outputs; compared through the pmf
        a, b = getattr(single, f.name), getattr(batched, f.name)
        if isinstance(a, (str, bool, float, int)) or a is None:
            assert a == b, f.name
        elif np.shape(a) == np.shape(b):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-9, atol=1e-12 * WIDTH, err_msg=f.name)
        # else: padded to the grid's largest output count (Unbiased); compared through the pmf below
    labels = privacy_labels(single)
    if single.discrete:
        points = np.unique(np.concatenate([np.asarray(single.outputs), np.asarray(batched.outputs)]))
    else:
        points = np.linspace(*output_range(single), 2001)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(np.exp(log_density_table(batched, points, labels)),
                                   np.exp(log_density_table(single, points, labels)), rtol=1e-9, atol=1e-12)
    for got, want in zip(moments(batched, labels), moments(single, labels)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * WIDTH**2)


@pytest.mark.parametrize("case", CASES)
def test_bias_and_mse_match_the_release(case):
    params = fitted(case)
    ys, draws = released(case)
    grid = params.release_spec()["grid"]
    h = 0.0 if grid is None else float(grid)
    bias, mse = moments(params, ys)
    for y, sample, b, m in zip(ys, draws, bias, mse):
        err = sample - y
        se_bias = err.std() / np.sqrt(err.size)
        se_mse = (err**2).std() / np.sqrt(err.size)
        assert abs(err.mean() - b) <= STANDARD_ERRORS * se_bias, (y, err.mean(), b, se_bias)
        # snapping to the grid adds about h²/12 to the mse (h <= std/16: far below a standard error)
        assert abs((err**2).mean() - m) <= STANDARD_ERRORS * se_mse + h**2 / 6, (y, (err**2).mean(), m, se_mse)


GUIDED_CASES = [c for c in CASES if MECHANISMS[c.values[0].mechanism].params.derived_fields]


def _without_derived(params):
    """``params`` with its derived fields (the sampler's lookup tables) dropped: the full searches."""
    plain = object.__new__(type(params))
    for f in dataclasses.fields(params):
        object.__setattr__(plain, f.name, getattr(params, f.name))
    defaults = {f.name: f.default for f in dataclasses.fields(params)}
    for name in type(params).derived_fields:
        object.__setattr__(plain, name, defaults[name])
    return plain


@pytest.mark.parametrize("case", GUIDED_CASES)
def test_lookup_tables_change_no_released_value(case):
    """A sampler's guide tables only shorten its searches: with and without them, the same output for the same
    uniform and label, bit for bit, at labels on and next to every breakpoint and at uniforms next to every
    bucket edge, in both tails and at random (for one ε and for every ε of a stacked fit)."""
    from rpwjax.mechanisms import guide

    rng = np.random.default_rng(7)
    grid = fitted_grid(case.mechanism, case.prior)
    for params in (fitted(case), grid[EPSILONS.index(case.epsilon)], grid):
        plain = _without_derived(params)
        assert params.guide_steps and not plain.guide_steps
        flat = params if params.batch_shape == () else params[0]
        breaks = np.concatenate([np.ravel(b) for b in flat.breakpoints()] + [[flat.lo, flat.hi]])
        breaks = breaks[(breaks >= flat.lo) & (breaks <= flat.hi)]
        y = np.concatenate([breaks, np.nextafter(breaks, -np.inf), np.nextafter(breaks, np.inf),
                            rng.uniform(flat.lo, flat.hi, 4000)])
        y = np.clip(y, flat.lo, flat.hi)
        start, end = guide.uniform_bucket_edges()
        edges = np.concatenate([start, end])
        ulp = 2.0 ** -52
        u = np.concatenate([edges - ulp, edges, edges + ulp, (np.arange(64) + 0.5) * ulp, 1 - (np.arange(64) + 0.5) * ulp,
                            (rng.integers(0, 2**52, 4000) + 0.5) * ulp])
        u = np.clip(np.round(u / ulp - 0.5) + 0.5, 0.5, 2**52 - 0.5) * ulp  # uniforms the release can draw
        yy, uu = np.repeat(y, 8), rng.choice(u, y.size * 8)
        uu[: u.size] = u[: uu.size]
        with jax.enable_x64(True):
            if params.batch_shape == ():
                fast = jax.jit(type(params).sample_from_uniform)(params, uu, yy)
                full = jax.jit(type(plain).sample_from_uniform)(plain, uu, yy)
            else:
                def draw(p):
                    return jax.jit(jax.vmap(lambda q: q.sample_from_uniform(uu, yy)))(p)
                fast, full = draw(params), draw(plain)
        np.testing.assert_array_equal(np.asarray(fast), np.asarray(full))
