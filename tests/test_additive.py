"""Laplace, Gaussian and staircase: calibration, closed forms, the float kernels' inverse CDFs, validation.

Exact privacy, the JSON round trip, fits over an ε grid and bias/mse against the release are checked
for every mechanism by the contract table (tests/test_contract.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from rpwjax.mechanisms.additive import (
    Gaussian,
    Laplace,
    fit_gaussian,
    fit_laplace,
    fit_staircase,
    staircase_noise_mse,
    staircase_optimal_gamma,
)
from rpwjax.mechanisms.base import label_mse_grid
from rpwjax.errors import InputError
from rpwjax.keys import Secret
from rpwjax.priors import empirical_prior, histogram_prior, private_histogram

LO, HI = 0.5, 2.0  # Δ = 1.5
PRIOR = empirical_prior([0.5, 0.7, 1.1, 1.1, 1.9, 2.0], LO, HI)
FITS = {"laplace": fit_laplace, "gaussian": fit_gaussian, "staircase": fit_staircase}


def gaussian_delta_direct(sigma, epsilon, width):
    """Balle & Wang's δ(σ), evaluated plainly (independent of the module's log-space version)."""
    a, b = width / (2 * sigma), epsilon * sigma / width
    return stats.norm.cdf(a - b) - np.exp(epsilon) * stats.norm.cdf(-a - b)


def noise_variance(params):
    width = params.hi - params.lo
    if isinstance(params, Laplace):
        return 2 * (width / params.epsilon) ** 2
    if isinstance(params, Gaussian):
        return params.sigma**2
    return staircase_noise_mse(params.epsilon, params.gamma, width)


# --------------------------------------------------------------------------- privacy


@pytest.mark.parametrize("epsilon", [0.05, 1.0, 8.0, 50.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-4])
def test_analytic_gaussian_condition_holds_and_is_tight(epsilon, delta):
    width = HI - LO
    params, info = fit_gaussian(PRIOR, epsilon, delta=delta)
    sigma = float(params.sigma)
    assert info == {} and params.calibration == "analytic"
    assert gaussian_delta_direct(sigma, epsilon, width) <= delta * (1 + 1e-9)
    assert gaussian_delta_direct(0.99 * sigma, epsilon, width) > delta
    if epsilon < 1:  # where both are proven, the analytic σ is the smaller one
        assert sigma < np.sqrt(2 * np.log(1.25 / delta)) * width / epsilon


def test_classic_gaussian_matches_formula():
    grid = np.array([0.1, 0.5, 1.0, 4.0])
    params, info = fit_gaussian(PRIOR, grid, delta=1e-4, calibration="classic")
    expected = np.sqrt(2 * np.log(1.25 / 1e-4)) * (HI - LO) / grid
    np.testing.assert_allclose(params.sigma, expected, rtol=1e-14)
    np.testing.assert_array_equal(info["classic_valid"], [True, True, False, False])
    np.testing.assert_array_equal(params.delta, np.full(4, 1e-4))


# --------------------------------------------------------------------------- staircase closed forms


def test_staircase_gamma_published_values_and_limits():
    with jax.enable_x64(True):
        eps = jnp.array([1.0, 2.0, 0.3, 5.0])
        gamma = np.asarray(staircase_optimal_gamma(eps))
        b = np.exp(-np.asarray(eps))
        textbook = -b / (1 - b) + np.cbrt(b - 2 * b**2 + 2 * b**4 - b**5) / (np.cbrt(2) * (1 - b) ** 2)
        tiny, huge = np.asarray(staircase_optimal_gamma(jnp.array([1e-9, 60.0])))
    np.testing.assert_allclose(gamma[:2], [0.41674, 0.33513], atol=5e-6)
    np.testing.assert_allclose(gamma, textbook, rtol=1e-10)
    np.testing.assert_allclose(tiny, 0.5, atol=1e-8)
    np.testing.assert_allclose(huge, np.cbrt(np.exp(-60.0) / 2), rtol=1e-8)
    l1, _ = fit_staircase(PRIOR, 2.0, gamma="l1")
    np.testing.assert_allclose(l1.gamma, 1 / (1 + np.e), rtol=1e-14)
    assert l1.gamma_rule == "l1"


@pytest.mark.parametrize("epsilon, published", [(2.0, 0.4227), (4.0, 0.0650)])
def test_staircase_mse_published_values(epsilon, published):
    with jax.enable_x64(True):
        params, _ = fit_staircase(empirical_prior([0.0], 0.0, 1.0), epsilon)
        assert abs(float(params.mse(0.5)) - published) < 5e-5


# --------------------------------------------------------------------------- sampler vs density


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, options, epsilon, y",
    [
        ("laplace", {}, 1.0, 0.8),
        ("gaussian", {}, 1.0, 0.8),
        ("staircase", {}, 0.5, 0.8),
        ("staircase", {"gamma": 0.8}, 3.0, 3.0),  # a label above hi is clipped first
    ],
)
def test_sampler_matches_exact_cdf(name, options, epsilon, y):
    params, _ = FITS[name](PRIOR, epsilon, **options)
    draws = np.asarray(params.sample(jax.random.key(11), jnp.full(20_000, y, jnp.float32)))
    assert draws.dtype == np.float32

    def cdf(x):
        with jax.enable_x64(True):
            return np.asarray(params.cdf(jnp.asarray(x, jnp.float64), y))

    assert stats.kstest(draws.astype(np.float64), cdf).pvalue > 1e-3


@pytest.mark.parametrize(
    "name, options, epsilon, y",
    [
        ("laplace", {}, 1.0, 0.8),
        ("gaussian", {}, 1.0, 0.8),
        ("staircase", {}, 0.5, 0.8),
        ("staircase", {"gamma": 0.3}, 1.5, LO),
        ("staircase", {"gamma": 0.8}, 3.0, 3.0),
    ],
)
def test_sampler_is_the_exact_inverse_cdf(name, options, epsilon, y):
    """One uniform per label: x(u) is non-decreasing in u and F(x(u)) = u (float64), out to the
    extreme uniforms (k + 1/2)·2^-52 of the release path."""
    params, _ = FITS[name](PRIOR, epsilon, **options)
    half = 0.5 * 2.0**-52
    with jax.enable_x64(True):
        u = np.concatenate([[half, 3 * half], (np.arange(100_000) + 0.5) / 100_000, [1 - 3 * half, 1 - half]])
        x = np.asarray(params.sample_from_uniform(jnp.asarray(u), jnp.full(u.size, y)))
        assert np.all(np.isfinite(x)) and np.all(np.diff(x) >= 0)
        np.testing.assert_allclose(np.asarray(params.cdf(jnp.asarray(x), y)), u, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_staircase_sampler_fills_every_step_as_the_density_says():
    # the cells (side, step k, lower/upper part of the step) are the pieces of the
    # one-uniform inverse CDF, where a wrong parameter would break privacy
    params, _ = fit_staircase(PRIOR, 1.5, gamma=0.3)
    width = HI - LO
    with jax.enable_x64(True):
        x = np.asarray(params.sample(jax.random.key(3), jnp.zeros(40_000))) - LO
        steps = np.arange(5.0)
        cuts = np.sort(np.concatenate([steps, steps + 0.3, [5.0]])) * width
        edges = np.concatenate([[-np.inf], -cuts[::-1], cuts[1:], [np.inf]])
        probs = np.diff(np.concatenate([[0.0], np.asarray(params.cdf(jnp.asarray(edges[1:-1] + LO), LO)), [1.0]]))
    observed, _ = np.histogram(x, bins=edges)
    assert stats.chisquare(observed, probs * x.size).pvalue > 1e-3


@pytest.mark.slow
def test_output_depends_only_on_its_own_label():
    for name in FITS:
        params, _ = FITS[name](PRIOR, 1.0)
        y = jnp.linspace(LO, HI, 10)
        a = params.sample(jax.random.key(5), y)
        b = params.sample(jax.random.key(5), y.at[7].set(LO))
        changed = np.flatnonzero(np.asarray(a != b))
        np.testing.assert_array_equal(changed, [7])


@pytest.mark.slow
def test_dtype_follows_labels_under_x64():
    with jax.enable_x64(True):
        for name in FITS:
            params, _ = FITS[name](PRIOR, 1.0)
            assert params.sample(jax.random.key(0), jnp.zeros(3)).dtype == jnp.float64


# --------------------------------------------------------------------------- batching over ε


@pytest.mark.slow
def test_batched_private_prior_is_accepted():
    grid = np.array([0.5, 2.0])
    prior = private_histogram([0.6, 1.0, 1.9], LO, HI, 0.1 * grid, bins=8, secret=Secret.from_seed(0))
    for name in FITS:
        params, _ = FITS[name](prior, grid)
        mse = label_mse_grid(params, prior)
        np.testing.assert_allclose(mse, [noise_variance(params[i]) for i in range(2)], rtol=1e-6)


# --------------------------------------------------------------------------- label MSE


@pytest.mark.parametrize("name", list(FITS))
def test_label_mse_equals_closed_form(name):
    with jax.enable_x64(True):
        params, _ = FITS[name](PRIOR, 0.7)
        variance = noise_variance(params)
        np.testing.assert_allclose(params.label_mse(PRIOR), variance, rtol=1e-12)
        np.testing.assert_allclose(params.bias(HI + 0.5), -0.5, rtol=1e-12)
        np.testing.assert_allclose(params.mse(LO - 0.25), 0.0625 + variance, rtol=1e-12)
        # a uniform prior on [0, 2.5], wider than the mechanism's [0.5, 2]: clipping the
        # labels in [0, 0.5) and (2, 2.5] adds 2·E[(0.5 - Y)²; Y < 0.5] = 2·(0.5³/3)/2.5,
        # exact only if the breakpoints split the bins at lo and hi
        wide = histogram_prior([0.0, 1.25, 2.5], [0.5, 0.5])
        np.testing.assert_allclose(params.label_mse(wide), variance + 2 * 0.5**3 / 3 / 2.5, rtol=1e-12)


# --------------------------------------------------------------------------- JSON


@pytest.mark.parametrize(
    "name, field, value, message",
    [
        ("laplace", "scale", 0.5, "scale="),
        ("gaussian", "sigma", 0.5, "sigma=0.5"),
        ("staircase", "gamma", 1.5, "gamma=1.5"),
    ],
)
def test_json_with_a_weakened_parameter_is_refused(name, field, value, message):
    params, _ = FITS[name](PRIOR, 1.0)
    fields = params.to_json()
    fields[field] = value
    with pytest.raises(InputError, match=message):
        type(params).from_json(fields)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "fit, options, message",
    [
        (fit_gaussian, {"delta": 2.0}, r"delta must be in \(0, 1\), got delta=2.0"),
        (fit_gaussian, {"delta": 0.0}, "delta=0.0"),
        (fit_gaussian, {"delta": float("nan")}, "delta=nan"),
        (fit_gaussian, {"delta": "small"}, "delta='small'"),
        (fit_gaussian, {"calibration": "exact"}, "calibration='exact'"),
        (fit_staircase, {"gamma": 1.5}, "gamma=1.5"),
        (fit_staircase, {"gamma": 0.0}, "gamma=0.0"),
        (fit_staircase, {"gamma": True}, "gamma=True"),
        (fit_staircase, {"gamma": "median"}, "gamma='median'"),
    ],
)
def test_bad_options_raise(fit, options, message):
    with pytest.raises(InputError, match=message):
        fit(PRIOR, 1.0, **options)


@pytest.mark.parametrize("fit", list(FITS.values()))
def test_bad_epsilon_raises(fit):
    with pytest.raises(InputError, match="epsilon=-1.0"):
        fit(PRIOR, -1.0)
    with pytest.raises(InputError, match="epsilon=0.0"):
        fit(PRIOR, [1.0, 0.0])


# --------------------------------------------------------------------------- tiny ε


def staircase_variance_textbook(epsilon, gamma, width):
    """E[X²] of the staircase noise by the sums S_j of its docstring, in float64 numpy (fine down to ε ≈ 1e-100,
    where (1 - b)³ is still a normal float64)."""
    eps, g = np.float64(epsilon), np.float64(gamma)
    b, one_minus_b = np.exp(-eps), -np.expm1(-eps)
    s0, s1, s2 = 1 / one_minus_b, b / one_minus_b**2, b * (1 + b) / one_minus_b**3
    bracket = 3 * s2 * (g + b * (1 - g)) + 3 * s1 * (g**2 + b * (1 - g**2)) + s0 * (g**3 + b * (1 - g**3))
    return width**2 * one_minus_b / (3 * (g + (1 - g) * b)) * bracket


@pytest.mark.parametrize("name", ["laplace", "staircase"])
def test_tiny_epsilon_variance_is_float64_and_the_release_refused_below_the_certified_floor(name):
    """At ε = 1e-17 (above the exact sampler's smallest, rpwjax.noise.min_epsilon()) the noise variance
    passes float32's range (staircase) or loses float32 precision (Laplace): it is computed in float64.
    Such an ε is then refused by the release with one line, below rpwjax.grid.MIN_EPSILON (no grid of the
    2^52 uniforms holds the realized ratio within 0.1% of it), while just above that floor it releases."""
    import rpwjax
    from rpwjax import noise
    from rpwjax.grid import MIN_EPSILON

    assert not jax.config.jax_enable_x64  # the default float32 mode, where the variance used to overflow
    width = HI - LO
    epsilon = 1e-17
    assert epsilon >= noise.min_epsilon()
    params, _ = FITS[name](PRIOR, epsilon)
    variance = params.noise_variance()
    if name == "laplace":
        expected = 2 * (width / epsilon) ** 2
    else:
        expected = staircase_variance_textbook(epsilon, params.gamma, width)
    assert np.asarray(variance).dtype == np.float64
    assert np.isfinite(expected) and expected > 0
    np.testing.assert_allclose(variance, expected, rtol=1e-13)
    with pytest.raises(InputError, match=r"epsilon=1e-17 .* cannot be certified for a float64 release: epsilon is "
                                         r"too small \(below 1.14e-10"):
        rpwjax.release(params, Secret.from_seed(0), np.array([LO, 1.0, HI]))
    params, _ = FITS[name](PRIOR, 1.01 * MIN_EPSILON)
    out = rpwjax.release(params, Secret.from_seed(0), np.array([LO, 1.0, HI]))
    assert out.dtype == np.float64 and np.all(np.isfinite(out))
    # the labels' dtype still sets the dtype of the MSE and variance on the device
    assert params.mse(jnp.zeros(2, jnp.float32)).dtype == jnp.float32
    # at ε = 1e-120, (1 - b)³ ≈ 1e-360 underflows float64, the variance ≈ 2Δ²/ε² = 4.5e240 does not
    params, _ = FITS[name](PRIOR, 1e-120)
    np.testing.assert_allclose(params.noise_variance(), 2 * (width / 1e-120) ** 2, rtol=1e-9)
