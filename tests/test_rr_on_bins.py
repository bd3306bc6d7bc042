"""RR-on-Bins: exact optimum (brute force, reference DP), moments, the one-uniform sampler, validation.

Exact privacy, the JSON round trip, fits over an ε grid and bias/mse against the release are checked
for every mechanism by the contract table (tests/test_contract.py)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from rpwjax.mechanisms.base import label_mse_grid, sample_grid
from rpwjax.errors import InputError
from rpwjax.keys import Secret
from rpwjax.priors import Prior, empirical_prior, histogram_prior, private_histogram
from rpwjax.mechanisms.rr_on_bins import fit_rr_on_bins

EPSILONS = np.array([0.05, 0.5, 2.0, 8.0])

# one compiled function for the case table (a jit built per call would recompile every case)
_label_mse_over_epsilon = jax.jit(jax.vmap(lambda params, prior: params.label_mse(prior), in_axes=(0, None)))


def discrete_prior(points, mass, lo, hi):
    points = np.asarray(points, np.float64)
    mass = np.asarray(mass, np.float64)
    return Prior(points, points.copy(), mass / mass.sum(), lo, hi, True, "empirical")


def random_prior(rng, k):
    """A random discrete prior on k points in [-3, 7]; some cases spiky, some with zero masses.

    One public range for all cases: lo and hi are static, so each range would compile anew.
    """
    lo, hi = -3.0, 7.0
    a, b = np.sort(rng.uniform(lo, hi, 2))
    points = np.sort(rng.choice(np.linspace(a, b, 4 * k + 3), size=k, replace=False))
    kind = rng.integers(3)
    if kind == 0:
        mass = rng.dirichlet(np.ones(k))
    elif kind == 1:
        mass = rng.dirichlet(0.3 * np.ones(k))  # spiky
    else:
        mass = rng.dirichlet(np.ones(k))
        mass[rng.random(k) < 0.3] = 0.0  # empty support points (as in a noisy histogram)
        if mass.sum() == 0:
            mass[0] = 1.0
    return discrete_prior(points, mass, lo, hi)


def direct_mse(points, mass, groups, epsilon):
    """E[(Ỹ - Y)²] of a partition with its optimal outputs, straight from the mechanism's definition."""
    a = np.exp(epsilon)
    m = groups.max() + 1
    weight = np.where(groups[:, None] == np.arange(m)[None, :], a, 1.0)  # (k, m)
    outputs = (mass[:, None] * weight * points[:, None]).sum(0) / (mass[:, None] * weight).sum(0)
    prob = weight / (a + m - 1)
    return float(np.sum(mass[:, None] * prob * (outputs[None, :] - points[:, None]) ** 2)), outputs


def brute_force(points, mass, epsilon):
    """Minimum over all 2^(k-1) monotone partitions."""
    k = points.size
    best = (np.inf, None)
    for cuts in itertools.product([0, 1], repeat=k - 1):
        groups = np.concatenate([[0], np.cumsum(cuts)])
        value, outputs = direct_mse(points, mass, groups, epsilon)
        if value < best[0]:
            best = (value, outputs)
    return best


def reference_dp(points, mass, epsilon):
    """Textbook O(k² m) DP over (prefix, number of groups), objective written directly."""
    k = points.size
    a = np.exp(epsilon)
    total_sum, total_sq = np.sum(mass * points), np.sum(mass * points**2)
    cs = np.concatenate([[0.0], np.cumsum(mass * points)])
    cm = np.concatenate([[0.0], np.cumsum(mass)])
    # group (j, i]: weighted SSE contribution minus the shared Q, as a function of (P, S)
    best_overall = np.inf
    value = np.full(k + 1, -np.inf)
    value[0] = 0.0
    for m in range(1, k + 1):
        new = np.full(k + 1, -np.inf)
        for i in range(1, k + 1):
            j = np.arange(i)
            seg_s, seg_p = cs[i] - cs[j], cm[i] - cm[j]
            gain = (total_sum + (a - 1) * seg_s) ** 2 / (1 + (a - 1) * seg_p)
            new[i] = np.max(value[j] + gain)
        value = new
        best_overall = min(best_overall, total_sq - value[k] / (a + m - 1))
    return best_overall


@pytest.fixture(scope="module")
def brute_force_cases():
    rng = np.random.default_rng(20230501)
    cases = []
    for k in range(2, 9):
        for _ in range(8):
            prior = random_prior(rng, k)
            params, info = fit_rr_on_bins(prior, EPSILONS)
            cases.append((prior, params, info))
    return cases


def test_matches_brute_force_over_all_partitions(brute_force_cases):
    assert len(brute_force_cases) * EPSILONS.size >= 200
    for prior, params, info in brute_force_cases:
        points, mass = np.asarray(prior.left), np.asarray(prior.mass)
        with jax.enable_x64(True):  # the mechanism's own mse, through its thresholds
            reported = np.asarray(_label_mse_over_epsilon(params, prior))
        for e, eps in enumerate(EPSILONS):
            best, _ = brute_force(points, mass, eps)
            scale = np.sum(mass * (points - np.sum(mass * points)) ** 2) + 1e-300
            assert abs(info["label_mse"][e] - best) <= 1e-9 * scale, (points, mass, eps)
            assert abs(reported[e] - best) <= 1e-9 * scale


def test_outputs_increasing_and_are_weighted_means(brute_force_cases):
    for prior, params, info in brute_force_cases:
        points, mass = np.asarray(prior.left), np.asarray(prior.mass)
        for e, eps in enumerate(EPSILONS):
            m = info["num_bins"][e]
            assert int(params.num_bins[e]) == m
            outputs = params.outputs[e, :m]
            assert np.all(np.diff(outputs) >= -1e-12)
            with jax.enable_x64(True):
                groups = np.asarray(params[e].group(points))
            assert set(groups.tolist()) <= set(range(m))
            # each fitted output is the weighted mean (e^ε inside its group, 1 outside)
            weight = np.where(groups[:, None] == np.arange(m), np.exp(eps), 1.0)
            used = (mass[:, None] * weight).sum(0) > 0
            expected = (mass[:, None] * weight * points[:, None]).sum(0) / (mass[:, None] * weight).sum(0)
            np.testing.assert_allclose(outputs[used], expected[used], rtol=1e-10, atol=1e-10)


@pytest.mark.slow
def test_matches_reference_dp_on_larger_support():
    rng = np.random.default_rng(7)
    points = np.sort(rng.uniform(0, 10, 40))
    mass = rng.gamma(0.7, size=40)
    prior = discrete_prior(points, mass, 0.0, 10.0)
    eps = np.array([0.05, 1.0, 8.0])
    params, info = fit_rr_on_bins(prior, eps)
    for e in range(eps.size):
        expected = reference_dp(points, prior.mass, eps[e])
        np.testing.assert_allclose(info["label_mse"][e], expected, rtol=1e-10)
    assert info["num_bins"][-1] > info["num_bins"][0]  # more budget, more bins


@pytest.mark.slow
def test_batched_prior_one_histogram_per_epsilon():
    rng = np.random.default_rng(11)
    labels = rng.beta(2.0, 5.0, 2000)
    eps = np.array([0.5, 1.0, 4.0])
    prior = private_histogram(labels, 0.0, 1.0, 0.2 * eps, bins=12, secret=Secret.from_seed(0))
    assert np.ndim(prior.mass) == 2
    params, info = fit_rr_on_bins(prior, eps)
    for e in range(eps.size):
        one = jax.tree_util.tree_map(lambda leaf: leaf[e], prior)
        single, single_info = fit_rr_on_bins(one, float(eps[e]))
        np.testing.assert_allclose(single.outputs, params.outputs[e], rtol=1e-12)
        np.testing.assert_allclose(single_info["label_mse"], info["label_mse"][e], rtol=1e-12)
    assert label_mse_grid(params, prior).shape == (3,)
    with pytest.raises(InputError, match="3 priors for 2 epsilons"):
        fit_rr_on_bins(prior, eps[:2])


def example_priors():
    rng = np.random.default_rng(5)
    discrete = discrete_prior(np.sort(rng.choice(np.linspace(0, 4, 81), 40, replace=False)), rng.random(40), 0.0, 4.0)
    widths = rng.uniform(0.5, 2.0, 12)
    edges = np.concatenate([[0.0], np.cumsum(widths)])
    histogram = histogram_prior(edges / edges[-1] * 4.0, rng.random(12))
    return [discrete, histogram]


@pytest.mark.slow
def test_moments_match_the_pmf():
    prior = example_priors()[1]
    params, _ = fit_rr_on_bins(prior, 2.0)
    m = int(params.num_bins)
    outputs = params.outputs[:m]
    y = np.concatenate([np.linspace(params.lo - 0.5, params.hi + 0.5, 301), params.thresholds[: m - 1]])
    with jax.enable_x64(True):
        pmf = np.exp(np.asarray(params.log_density(outputs[:, None], y[None, :])))
        bias = np.asarray(params.bias(y))
        mse = np.asarray(params.mse(y))
        variance = np.asarray(params.variance(y))
    np.testing.assert_allclose(bias, (pmf * (outputs[:, None] - y)).sum(0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(mse, (pmf * (outputs[:, None] - y) ** 2).sum(0), rtol=1e-10)
    mean = (pmf * outputs[:, None]).sum(0)
    np.testing.assert_allclose(variance, (pmf * (outputs[:, None] - mean) ** 2).sum(0), rtol=1e-8, atol=1e-12)


@pytest.mark.slow
def test_histogram_label_mse_is_exact_with_breakpoints():
    prior = example_priors()[1]  # unequal bins: thresholds fall inside bins
    params, _ = fit_rr_on_bins(prior, 1.5)
    left, right, mass = (np.asarray(v) for v in (prior.left, prior.right, prior.mass))
    fine = (np.arange(20000) + 0.5) / 20000
    with jax.enable_x64(True):
        exact = float(params.label_mse(prior))
        dense = sum(mass[j] * np.mean(np.asarray(params.mse(left[j] + fine * (right[j] - left[j])))) for j in range(left.size))
    np.testing.assert_allclose(exact, dense, rtol=1e-6)


@pytest.mark.slow
def test_one_uniform_inverse_cdf_is_exact():
    prior = example_priors()[0]
    params, info = fit_rr_on_bins(prior, 4.0)
    m = info["num_bins"]
    assert m >= 3
    n = 200_000
    u = (np.arange(n) + 0.5) / n
    for y in [params.lo, params.outputs[1], 0.5 * (params.lo + params.hi), params.hi]:
        with jax.enable_x64(True):
            draws = np.asarray(params.sample_from_uniform(jnp.asarray(u), jnp.full(n, y)))
            pmf = np.exp(np.asarray(params.log_density(params.outputs[:m], y)))
        # an inverse CDF over the sorted outputs: non-decreasing in u
        assert np.all(np.diff(params.outputs[:m]) > 0) and np.all(np.diff(draws) >= 0)
        counts = np.array([(draws == v).sum() for v in params.outputs[:m]])
        assert counts.sum() == n
        np.testing.assert_allclose(counts / n, pmf, atol=2.0 / n)


@pytest.mark.slow
def test_sampler_matches_pmf_chi_square():
    prior = example_priors()[0]
    params, info = fit_rr_on_bins(prior, np.array([0.05, 1.0, 8.0]))
    labels = np.array([0.0, 1.3, 2.77, 4.0], np.float32)
    n = 40_000
    draws = np.asarray(sample_grid(params, jax.random.key(42), np.repeat(labels, n)))
    for e in range(3):
        m = info["num_bins"][e]
        outputs = params.outputs[e, :m].astype(np.float32)
        for i, y in enumerate(labels):
            sample = draws[e, i * n : (i + 1) * n]
            counts = np.array([(sample == v).sum() for v in outputs])
            assert counts.sum() == n
            pmf = np.exp(np.asarray(params[e].log_density(outputs, np.float32(y)), np.float64))
            pmf /= pmf.sum()
            if m > 1:
                assert stats.chisquare(counts, n * pmf).pvalue > 1e-3


@pytest.mark.slow
def test_sample_is_elementwise_and_keeps_dtype():
    prior = example_priors()[0]
    params, _ = fit_rr_on_bins(prior, 1.0)
    key = jax.random.key(0)
    y = jnp.linspace(0.0, 4.0, 64, dtype=jnp.float32)
    out = params.sample(key, y)
    assert out.dtype == jnp.float32 and out.shape == y.shape
    changed = y.at[5].set(3.9)
    out2 = params.sample(key, changed)
    same = np.ones(64, bool)
    same[5] = False
    np.testing.assert_array_equal(np.asarray(out)[same], np.asarray(out2)[same])
    assert np.isin(np.asarray(out), params.outputs[: int(params.num_bins)].astype(np.float32)).all()


def test_single_point_support():
    prior = empirical_prior([2.5, 2.5, 2.5], 0.0, 5.0)
    params, info = fit_rr_on_bins(prior, 1.0)
    assert info["num_bins"] == 1
    assert params.outputs[0] == 2.5 and info["label_mse"] == 0.0
    assert np.all(np.asarray(params.sample(jax.random.key(1), jnp.array([0.0, 5.0]))) == 2.5)


@pytest.mark.parametrize(
    "epsilon, message",
    [(-1.0, "epsilon=-1.0"), (0.0, "epsilon=0.0"), (float("nan"), "epsilon=nan"), ([1.0, np.inf], "epsilon=inf"), ("x", "epsilon='x'")],
)
def test_bad_epsilon(epsilon, message):
    prior = empirical_prior([0.1, 0.2], 0.0, 1.0)
    with pytest.raises(InputError, match=message):
        fit_rr_on_bins(prior, epsilon)


def test_bad_prior():
    with pytest.raises(InputError, match="prior of type ndarray"):
        fit_rr_on_bins(np.array([0.1, 0.2]), 1.0)
