"""Posterior denoising E[Y | Ỹ] under the prior used."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rpwjax
from rpwjax.posterior import _discrete_posterior, posterior_mean
from rpwjax.priors import empirical_prior, histogram_prior
from helpers import slow_unless


def _generic(params, prior, yt):
    with jax.enable_x64(True):
        return np.asarray(_discrete_posterior(params, jnp.asarray(prior.left), jnp.log(jnp.asarray(prior.mass)),
                                              jnp.asarray(yt, jnp.float64)))


def test_rpwithprior_closed_form_equals_exact_sum_on_point_masses(rng):
    prior = empirical_prior(rng.beta(2, 5, 3000), 0, 1)
    for eps in (0.3, 1.0, 4.0):
        p, _ = rpwjax.fit_rpwithprior(prior, eps, zeta=0.04)
        yt = rng.uniform(float(p.a1 - p.zeta), float(p.a2 + p.zeta), 500)
        np.testing.assert_allclose(posterior_mean(p, prior, yt), _generic(p, prior, yt), rtol=1e-12, atol=1e-14)


@pytest.mark.slow
def test_rpwithprior_closed_form_on_a_histogram_matches_a_fine_discretisation(rng):
    edges = np.linspace(0, 1, 9)
    masses = rng.random(8)
    hist = histogram_prior(edges, masses)
    p, _ = rpwjax.fit_rpwithprior(hist, 1.0, zeta=0.05)
    fine = 4000
    xs = np.concatenate([l + (np.arange(fine) + 0.5) * (r - l) / fine for l, r in zip(edges[:-1], edges[1:])])
    ws = np.repeat(np.asarray(hist.mass) / fine, fine)
    approx = empirical_prior(xs, 0, 1, weights=ws)
    yt = np.linspace(float(p.a1 - p.zeta) + 1e-3, float(p.a2 + p.zeta) - 1e-3, 41)
    np.testing.assert_allclose(posterior_mean(p, hist, yt), _generic(p, approx, yt), atol=2e-4)


@pytest.mark.parametrize("mechanism", slow_unless(["rr-on-bins", "unbiased"], fast=["rr-on-bins"]))
def test_generic_posterior_is_the_prior_weighted_mean_of_the_support(mechanism):
    """E[Y | ỹ] = Σ_j p_j x_j P(ỹ | x_j) / Σ_j p_j P(ỹ | x_j), summed here straight from log_density and the
    prior's points and masses, at every output the mechanism can release."""
    points, weights = np.array([0.0, 0.2, 0.5, 1.0]), np.array([1.0, 3.0, 2.0, 4.0])
    prior = empirical_prior(points, 0, 1, weights=weights)
    fit = rpwjax.fit(mechanism, prior=prior, range=(0, 1), epsilon=1.0)
    outputs = np.unique(np.asarray(fit.params.outputs))
    with jax.enable_x64(True):
        likelihood = np.exp(np.asarray(fit.params.log_density(jnp.asarray(outputs)[:, None], jnp.asarray(points)[None, :])))
    joint = likelihood * (weights / weights.sum())[None, :]  # (outputs, support points)
    brute = (joint * points).sum(axis=1) / joint.sum(axis=1)
    got = posterior_mean(fit.params, prior, outputs)
    np.testing.assert_allclose(got, brute, rtol=1e-12, atol=1e-15)
    assert np.ptp(got) > 0.05  # the outputs carry information: the posterior means differ


@pytest.mark.slow
def test_posterior_minimises_squared_error_against_raw_outputs(rng):
    y = rng.beta(2, 5, 20000)
    fit = rpwjax.fit("rpwithprior", y, range=(0, 1), epsilon=1.0, prior="empirical", zeta=0.05)
    noisy = rpwjax.release(fit.params, rpwjax.Secret.from_seed(0), y)  # the released labels (float64, on the grid)
    assert noisy.dtype == np.float64 and not np.array_equal(noisy, y)
    clean = posterior_mean(fit.params, fit.prior_used, noisy)
    assert np.mean((clean - y) ** 2) < np.mean((noisy - y) ** 2)


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["rr-on-bins", "unbiased"])
def test_discrete_mechanisms_on_a_histogram_prior_match_a_fine_discretisation(mechanism, rng):
    edges = np.array([0.0, 0.1, 0.35, 0.5, 0.8, 1.0])  # unequal widths: cells do not align with bins
    hist = histogram_prior(edges, rng.random(5) + 0.1)
    fit = rpwjax.fit(mechanism, prior=hist, range=(0, 1), epsilon=1.0)
    outputs = np.unique(np.asarray(fit.params.outputs))
    fine = 20000
    xs = np.concatenate([l + (np.arange(fine) + 0.5) * (r - l) / fine for l, r in zip(edges[:-1], edges[1:])])
    ws = np.repeat(np.asarray(hist.mass) / fine, fine)
    approx = empirical_prior(xs, 0, 1, weights=ws)
    # RR-on-Bins' cells do not align with the fine grid; Unbiased's pmf is linear between support points
    # (bin centres and the ends, aligned with it), where treating it as constant would be off by ~2e-3
    np.testing.assert_allclose(posterior_mean(fit.params, hist, outputs), _generic(fit.params, approx, outputs),
                               atol=5e-5 if mechanism == "rr-on-bins" else 1e-9)


@pytest.mark.slow
def test_float32_discrete_outputs_are_recognised_and_impossible_ones_refused(rng):
    fit = rpwjax.fit("rr-on-bins", rng.beta(2, 5, 500), range=(0, 1), epsilon=1.0, prior="private", seed=1)
    noisy32 = np.asarray(rpwjax.sample_grid(fit.params, jax.random.key(0), jnp.full(2000, 0.3, jnp.float32)))
    out = posterior_mean(fit.params, fit.prior_used, noisy32)
    assert np.all(np.isfinite(out))
    with pytest.raises(rpwjax.InputError, match="not an output"):
        posterior_mean(fit.params, fit.prior_used, np.array([0.123456789]))


def test_prior_free_mechanism_pays_for_the_prior_it_is_denoised_with(rng):
    y = rng.uniform(0, 1, 500)
    plain = rpwjax.fit("laplace", y, range=(0, 1), epsilon=1.0, prior="private", seed=3)
    assert float(plain.epsilon_prior) == 0.0 and float(plain.epsilon_mechanism) == 1.0
    fit = rpwjax.fit("laplace", y, range=(0, 1), epsilon=1.0, prior="private", seed=3, spend_prior=True)
    assert float(fit.epsilon_prior) == pytest.approx(0.1) and float(fit.epsilon_mechanism) == pytest.approx(0.9)
    assert fit.prior_used.kind == "private-histogram"
    noisy = np.asarray(fit.params.sample(jax.random.key(0), jnp.asarray(y)), np.float64)
    clean = posterior_mean(fit.params, fit.prior_used, noisy)
    assert np.all((clean >= 0) & (clean <= 1))
    assert np.mean((clean - y) ** 2) < np.mean((noisy - y) ** 2)
