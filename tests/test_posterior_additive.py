"""Posterior denoising of Laplace, Gaussian and staircase outputs under histogram priors (exact closed forms)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats
from scipy.special import logsumexp

import rpwjax
from rpwjax.mechanisms.additive import Gaussian, Laplace, Staircase
from rpwjax.posterior import _discrete_posterior, posterior_mean
from rpwjax.priors import Prior, empirical_prior, histogram_prior
from helpers import slow_unless

LO, HI = 0.5, 2.0  # Δ = 1.5
MECHANISMS = ["laplace", "gaussian", "staircase"]
PRIORS = {
    # a zero-mass bin in the middle
    "zero-mass": histogram_prior([0.5, 0.65, 1.0, 1.3, 1.7, 2.0], [0.3, 0.0, 0.2, 0.4, 0.1]),
    # widths from 1.5e-6 to 1.2: the narrow bins hold most of the mass
    "unequal": histogram_prior([0.5, 0.5 + 1.5e-6, 0.5015, 0.5015015, 1.8, 2.0], [0.2, 0.3, 0.1, 0.05, 0.35]),
    # zero-width bins (point masses) inside a histogram
    "with-points": Prior(np.array([0.5, 0.8, 0.8, 1.4, 2.0]), np.array([0.8, 0.8, 1.4, 1.4, 2.0]),
                         np.array([0.2, 0.3, 0.2, 0.1, 0.2]), LO, HI, False, "histogram"),
    # bins reaching beyond [lo, hi]: those parts see the likelihood of the clipped label
    "wider": Prior(np.array([0.0, 0.9, 1.6]), np.array([0.9, 1.6, 2.6]), np.array([0.3, 0.3, 0.4]), 0.0, 2.6, False,
                   "histogram"),
}


def _params(mechanism, epsilon):
    """Fitted parameters; these mechanisms take only the public range from the prior."""
    return rpwjax.fit(mechanism, prior=histogram_prior([LO, HI], [1.0]), range=(LO, HI), epsilon=epsilon).params


def _noise_scale(params):
    with jax.enable_x64(True):
        return float(np.sqrt(params.noise_variance()))


def _reference_log_noise(params, x):
    """The noise log density written out from the papers' formulas (numpy, independent of the module)."""
    x = np.asarray(x, np.float64)
    if isinstance(params, Laplace):
        return stats.laplace.logpdf(x, scale=float(params.scale))
    if isinstance(params, Gaussian):
        return stats.norm.logpdf(x, scale=float(params.sigma))
    eps, gamma, width = float(params.epsilon), float(params.gamma), params.hi - params.lo
    b = np.exp(-eps)
    z = np.abs(x) / width
    k = np.floor(z)
    return np.log((1 - b) / (2 * width * (gamma + (1 - gamma) * b))) - eps * (k + (z - k >= gamma))


def _staircase_edges(params, t, l, r):
    """Every y in (l, r) where the staircase density f(t - y) jumps, by plain enumeration of the steps."""
    width, gamma = params.hi - params.lo, float(params.gamma)
    far = max(abs(t - l), abs(t - r)) / width
    ks = np.arange(max(0.0, np.floor(far - (r - l) / width) - 2), np.ceil(far) + 2)
    xs = np.concatenate([ks * width, (ks + gamma) * width])
    return [t - x for x in np.concatenate([xs, -xs]) if l < t - x < r]


def _quadrature_posterior(params, prior, t):
    """E[Y | ỹ = t] by adaptive quadrature per bin, in log space across bins."""
    terms, means = [], []
    for l, r, m in zip(np.asarray(prior.left), np.asarray(prior.right), np.asarray(prior.mass)):
        if m == 0:
            continue

        def log_f(y):
            return float(_reference_log_noise(params, t - np.clip(y, params.lo, params.hi)))

        if r == l:
            terms.append(np.log(m) + log_f(l))
            means.append(l)
            continue
        points = [t] if l < t < r else []
        points += [x for x in (params.lo, params.hi) if l < x < r]
        if isinstance(params, Staircase):
            points += _staircase_edges(params, t, l, r)
        top = max(log_f(y) for y in [l, r, *points])
        kw = dict(epsabs=0, epsrel=1e-11, limit=400, points=sorted(set(points)) or None)
        i0 = integrate.quad(lambda y: np.exp(log_f(y) - top), l, r, **kw)[0]
        i1 = integrate.quad(lambda y: (y - l) * np.exp(log_f(y) - top), l, r, **kw)[0]
        terms.append(np.log(m / (r - l)) + top + np.log(i0))
        means.append(l + i1 / i0)
    terms = np.asarray(terms)
    return float(np.sum(np.exp(terms - logsumexp(terms)) * np.asarray(means)))


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_reference_density_is_the_mechanism_density(mechanism):
    params = _params(mechanism, 1.0)
    x = np.linspace(-9.0, 9.0, 1237)  # avoids the staircase edges
    with jax.enable_x64(True):
        own = np.asarray(params.noise_log_density(jnp.asarray(x)))
    np.testing.assert_allclose(_reference_log_noise(params, x), own, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("prior_name", list(PRIORS))
@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("epsilon", [1.0, 8.0])
def test_histogram_posterior_matches_quadrature(mechanism, prior_name, epsilon):
    prior = PRIORS[prior_name]
    params = _params(mechanism, epsilon)
    scale = _noise_scale(params)
    # inside, near the edges, and far in both tails (every term there underflows in linear space)
    y_tilde = np.array([LO + 1e-7, 0.8, 1.1234, 1.4, HI, HI + 0.3, LO - 30 * scale, HI + 30 * scale,
                        HI + 300 * scale])
    out = posterior_mean(params, prior, y_tilde)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", integrate.IntegrationWarning)  # the far tail: rounding-limited, still ~1e-10
        ref = np.array([_quadrature_posterior(params, prior, t) for t in y_tilde])
    np.testing.assert_allclose(out, ref, rtol=1e-6)


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("epsilon", [0.05, 1.0, 40.0])
def test_posterior_mean_lies_inside_the_range(mechanism, epsilon):
    for prior in (PRIORS["zero-mass"], PRIORS["unequal"], PRIORS["with-points"]):
        params = _params(mechanism, epsilon)
        scale = _noise_scale(params)
        y_tilde = np.concatenate([np.linspace(LO - 50 * scale, HI + 50 * scale, 2001), [-1e8, 1e8, -1e4 * scale,
                                  1e4 * scale]])
        out = posterior_mean(params, prior, y_tilde)
        assert np.all(np.isfinite(out))
        assert np.all((out >= LO) & (out <= HI))


@pytest.mark.parametrize("mechanism", slow_unless(MECHANISMS, fast=["laplace"]))
def test_tower_property_and_lower_error(mechanism):
    prior = PRIORS["zero-mass"]
    params = _params(mechanism, 1.0)
    rng = np.random.default_rng(7)
    n = 20_000
    left, right, mass = (np.asarray(v) for v in (prior.left, prior.right, prior.mass))
    j = rng.choice(mass.size, n, p=mass)
    y = left[j] + rng.random(n) * (right[j] - left[j])
    with jax.enable_x64(True):
        noisy = np.asarray(params.sample(jax.random.key(11), jnp.asarray(y)))
    clean = posterior_mean(params, prior, noisy)
    prior_mean = float(np.sum(mass * (left + right) / 2))
    standard_error = clean.std() / np.sqrt(n)
    assert abs(clean.mean() - prior_mean) < 4 * standard_error
    assert np.mean((clean - y) ** 2) < np.mean((noisy - y) ** 2)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_point_mass_priors_agree_with_the_exact_sum(mechanism, rng):
    points = rng.uniform(LO, HI, 12)
    weights = rng.random(12)
    empirical = empirical_prior(points, LO, HI, weights=weights)
    params = _params(mechanism, 2.0)
    y_tilde = np.concatenate([rng.uniform(LO - 3, HI + 3, 200), [HI + 30 * _noise_scale(params)]])
    with jax.enable_x64(True):
        exact = np.asarray(_discrete_posterior(params, jnp.asarray(empirical.left),
                                               jnp.log(jnp.asarray(empirical.mass)), jnp.asarray(y_tilde)))
    # the point-mass prior still takes the exact sum
    np.testing.assert_allclose(posterior_mean(params, empirical, y_tilde), exact, rtol=1e-12, atol=1e-14)
    # the same points as zero-width bins of a histogram prior take the new path and agree
    as_histogram = Prior(empirical.left, empirical.right, empirical.mass, LO, HI, False, "histogram")
    np.testing.assert_allclose(posterior_mean(params, as_histogram, y_tilde), exact, rtol=1e-12)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_params_sliced_from_an_epsilon_grid(mechanism):
    prior = PRIORS["unequal"]
    grid = rpwjax.fit(mechanism, prior=prior, range=(LO, HI), epsilon=[0.5, 2.0, 8.0])
    y_tilde = np.array([0.2, 0.9, 1.7, 3.5])
    for i, eps in enumerate([0.5, 2.0, 8.0]):
        single = rpwjax.fit(mechanism, prior=prior, range=(LO, HI), epsilon=eps)
        expected = posterior_mean(single.params, single.prior_used, y_tilde)
        np.testing.assert_array_equal(posterior_mean(grid.params[i], grid.prior_for(i), y_tilde), expected)
        np.testing.assert_array_equal(posterior_mean(grid[i].params, grid[i].prior_used, y_tilde), expected)
    with pytest.raises(rpwjax.InputError, match="one epsilon"):
        posterior_mean(grid.params, prior, y_tilde)


def test_a_noise_density_without_closed_form_is_refused():
    class Wider(Laplace):
        def noise_log_density(self, x):
            return super().noise_log_density(x / 2) - np.log(2)

    params = _params("laplace", 1.0)
    odd = Wider(params.epsilon, params.scale, params.lo, params.hi)
    with pytest.raises(rpwjax.InputError, match="point-mass prior"):
        posterior_mean(odd, PRIORS["zero-mass"], np.array([0.3]))
    posterior_mean(odd, empirical_prior([0.6, 1.2], LO, HI), np.array([0.3]))  # the exact sum still applies
