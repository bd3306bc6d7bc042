"""The two-stage, feature-aware pipeline and the mean-calibrated prior (rpwjax.pipelines.two_stage)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpwjax import InputError
from rpwjax.pipelines import calibrated, linear_prior, residuals, statistics, two_stage
from rpwjax.keys import Secret
from rpwjax.posterior import posterior_mean, posterior_mean_per_row
from rpwjax.priors import histogram_prior, histogram_release
from rpwjax.mechanisms.rpwithprior import fit_rpwithprior, fit_rpwithprior_per_row
from rpwjax.mechanisms.unbiased import fit_unbiased
from helpers import slow_unless, spends, spy

LO, HI = 0.0, 5.0


def _residual_hist(rng):
    edges = np.linspace(-(HI - LO), HI - LO, 21)
    mass = np.exp(-0.5 * (0.5 * (edges[:-1] + edges[1:]) / 0.8) ** 2) + 0.01 * rng.random(20)
    return edges, mass / mass.sum()


def _row(priors, i):
    return jax.tree_util.tree_map(lambda v: np.asarray(v)[i], priors)


def test_shifted_priors_are_the_residual_histogram_moved_and_cut_to_the_range(rng):
    edges, mass = _residual_hist(rng)
    centres = np.array([0.0, 1.3, 4.9, 5.0])
    priors = residuals.shifted_priors(edges, mass, centres, LO, HI)
    assert np.allclose(np.asarray(priors.mass).sum(axis=1), 1.0)
    assert np.asarray(priors.left).min() >= LO and np.asarray(priors.right).max() <= HI
    # inside the range the density is the residual density at y - centre, up to the renormalisation
    p = _row(priors, 1)
    ys = np.array([0.6, 1.55, 2.1, 3.2])  # no bin edge within 1e-6
    with jax.enable_x64(True):
        dens = np.diff(np.asarray(p.cdf(jnp.asarray(np.stack([ys - 1e-6, ys + 1e-6])))), axis=0)[0] / 2e-6
    expected = mass[np.searchsorted(edges, ys - 1.3, side="right") - 1] / np.diff(edges)[0]
    assert np.allclose(dens / expected, (dens / expected)[0], rtol=1e-5)


def test_shifted_priors_fall_back_when_no_mass_is_left_in_the_range():
    edges = np.linspace(-5, 5, 11)
    mass = np.zeros(10)
    mass[9] = 1.0  # all residual mass at +4..+5: nothing left inside [0, 5] for a centre at 4.5
    fallback = histogram_prior(np.linspace(LO, HI, 11), np.arange(1, 11))
    priors = residuals.shifted_priors(edges, mass, np.array([4.5, 0.0]), LO, HI, fallback)
    assert np.allclose(np.asarray(priors.mass)[0], np.asarray(fallback.mass))
    assert np.isclose(np.asarray(priors.mass)[1].sum(), 1.0)


def test_censored_priors_are_the_law_of_the_clipped_label(rng):
    """Row i of censored_priors is the law of clip(m_i + r, lo, hi), r uniform within the residual histogram's
    bins: every row has mass 1, the CDF at each grid point is the residual CDF shifted to m_i, and what lies
    beyond the range sits in the end bins (checked against the exact CDF and against 400,000 draws)."""
    edges, mass = _residual_hist(rng)
    centres = np.array([0.0, 0.3, 1.3, 2.5, 4.9, 5.0])
    priors = residuals.censored_priors(edges, mass, centres, LO, HI)
    grid = np.linspace(LO, HI, mass.size + 1)
    m = np.asarray(priors.mass)
    assert m.shape == (centres.size, mass.size) and np.allclose(m.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(priors.left), np.broadcast_to(grid[:-1], m.shape))
    np.testing.assert_array_equal(np.asarray(priors.right), np.broadcast_to(grid[1:], m.shape))
    cdf = np.concatenate([[0.0], np.cumsum(mass)])
    for i, c in enumerate(centres):
        inner = np.interp(grid[1:-1] - c, edges, cdf)  # P(m + r <= g) for the interior grid points
        np.testing.assert_allclose(np.cumsum(m[i])[:-1], inner, atol=1e-12)
        assert m[i, 0] == pytest.approx(np.interp(grid[1] - c, edges, cdf), abs=1e-12)  # all below lo included
    draws = rng.choice(mass.size, size=400_000, p=mass)
    r = rng.uniform(edges[draws], edges[draws + 1])
    for i, c in enumerate(centres):
        clipped = np.clip(c + r, LO, HI)
        freq = np.histogram(clipped, grid)[0] / r.size
        assert np.abs(freq - m[i]).max() < 5e-3
    # a centre at the bottom of the range: shifted_priors drops the half below lo and renormalises (the
    # truncated model), censored_priors keeps it at lo: more mass in the first bin, a lower prior mean
    truncated = _row(residuals.shifted_priors(edges, mass, centres[:1], LO, HI), 0)
    censored = _row(priors, 0)
    def mean(p):
        return float(np.sum(np.asarray(p.mass) * 0.5 * (np.asarray(p.left) + np.asarray(p.right))))

    assert mean(censored) < mean(truncated)
    with jax.enable_x64(True):
        assert float(censored.cdf(jnp.asarray(grid[1]))) > float(truncated.cdf(jnp.asarray(grid[1])))
    with pytest.raises(ValueError, match="cover") as caught:
        residuals.censored_priors(edges / 4, mass, centres, LO, HI)
    for value in (edges[0] / 4, edges[-1] / 4, LO - centres.max(), HI - centres.min()):  # the error names them
        assert f"{value:g}" in str(caught.value)


@pytest.mark.slow
def test_per_example_intervals_equal_the_exact_fit_on_each_row(rng):
    edges, mass = _residual_hist(rng)
    centres = np.array([0.2, 2.5, 4.7])
    priors = residuals.shifted_priors(edges, mass, centres, LO, HI)
    params = fit_rpwithprior_per_row(priors, 0.3, 1.2)
    for i in range(centres.size):
        alone, _ = fit_rpwithprior(_row(priors, i), 1.2, zeta=0.3)
        assert params.a1[i] == pytest.approx(float(alone.a1), abs=1e-9)
        assert params.a2[i] == pytest.approx(float(alone.a2), abs=1e-9)
        assert LO <= params.a1[i] <= params.a2[i] <= HI


@pytest.mark.slow
def test_per_row_posterior_equals_the_one_prior_posterior(rng):
    edges, mass = _residual_hist(rng)
    centres = rng.uniform(LO, HI, 6)
    priors = residuals.shifted_priors(edges, mass, centres, LO, HI)
    rp = fit_rpwithprior_per_row(priors, 0.25, 0.8)
    y = rng.uniform(LO, HI, 6)
    noisy = np.asarray(rp.sample(jax.random.key(0), jnp.asarray(y)))
    got = posterior_mean_per_row(rp, priors, noisy)
    for i in range(6):
        one = jax.tree_util.tree_map(lambda v: np.asarray(v)[i], rp)
        assert got[i] == pytest.approx(float(posterior_mean(one, _row(priors, i), noisy[i:i + 1])[0]), rel=1e-9)
    # a discrete mechanism shared by all rows: Unbiased, whose pmf is linear in y between support points
    unb, _ = fit_unbiased(histogram_prior(np.linspace(LO, HI, 9), np.ones(8)), 1.0)
    out = np.asarray(unb.sample(jax.random.key(1), jnp.asarray(y)))
    got = posterior_mean_per_row(unb, priors, out)
    for i in range(6):
        assert got[i] == pytest.approx(float(posterior_mean(unb, _row(priors, i), out[i:i + 1])[0]), rel=1e-9)
    assert np.all((got >= LO) & (got <= HI))


def test_per_row_posterior_of_unbiased_is_exact(rng):
    edges, mass = _residual_hist(rng)
    priors = residuals.shifted_priors(edges, mass, rng.uniform(LO, HI, 6), LO, HI)
    y = rng.uniform(LO, HI, 6)
    unb, _ = fit_unbiased(histogram_prior(np.linspace(LO, HI, 9), np.ones(8)), 1.0)
    out = np.asarray(unb.sample(jax.random.key(1), jnp.asarray(y)))
    got = posterior_mean_per_row(unb, priors, out)
    for i in range(6):
        assert got[i] == pytest.approx(float(posterior_mean(unb, _row(priors, i), out[i:i + 1])[0]), rel=1e-9)


def test_tilt_hits_the_private_mean_and_keeps_the_shape_ordering(rng):
    left, right = np.linspace(LO, HI, 11)[:-1], np.linspace(LO, HI, 11)[1:]
    mass = rng.random(10)
    mass /= mass.sum()
    for target in (0.7, 2.5, 4.1):
        tilted = calibrated._tilt_to_mean(left, right, mass, target)
        assert np.isclose(tilted.sum(), 1.0)
        assert np.sum(tilted * 0.5 * (left + right)) == pytest.approx(target, abs=1e-9)
        ratio = tilted / mass  # an exponential tilt: log ratio linear in the bin centre
        assert np.allclose(np.diff(np.log(ratio), 2), 0.0, atol=1e-9)


def discrete_laplace_moments(rate):
    """Variance, mean |Z| and excess kurtosis of Z with P(Z = z) ∝ exp(-rate·|z|) on the integers.

    Z is the difference of two i.i.d. geometric variables with P(G = k) = (1 - p) p^k, p = e^-rate:
    Var Z = 2p/(1 - p)², E|Z| = 2p/(1 - p²), excess kurtosis 3 + (1 - p)²/(2p)."""
    p, q = np.exp(-rate), -np.expm1(-rate)  # q = 1 - p, accurate for tiny rates
    return 2 * p / q**2, 2 * p / (q * (1 + p)), 3 + q**2 / (2 * p)


def assert_discrete_laplace(z, rate):
    """Integer draws ``z`` are discrete Laplace of ``rate``: integral, and mean, variance and mean |Z| within
    four standard errors of the sample size (fixed seeds: the test is deterministic)."""
    z = np.asarray(z, np.float64).ravel()
    assert np.all(np.abs(z - np.rint(z)) < 1e-3), "the noise must be integer-valued"
    z = np.rint(z)
    m = z.size
    var, mad, kurt = discrete_laplace_moments(rate)
    assert abs(z.mean()) < 4 * np.sqrt(var / m)
    # the sample variance has variance about var²·(excess kurtosis + 2)/m
    assert abs(z.var() - var) < 4 * var * np.sqrt((kurt + 2) / m)
    assert abs(np.abs(z).mean() - mad) < 4 * np.sqrt((var - mad**2) / m)


def test_discrete_laplace_moments_match_the_pmf():
    for rate in (0.3, 1.0, 2.5):
        z = np.arange(-400, 401)
        pmf = np.exp(-rate * np.abs(z))
        pmf /= pmf.sum()
        var, mad, kurt = discrete_laplace_moments(rate)
        assert np.sum(pmf * z**2) == pytest.approx(var, rel=1e-12)
        assert np.sum(pmf * np.abs(z)) == pytest.approx(mad, rel=1e-12)
        assert np.sum(pmf * z**4) / var**2 - 3 == pytest.approx(kurt, rel=1e-10)


def test_noisy_counts_add_exact_discrete_laplace_noise_of_rate_eps_over_2():
    from scipy import stats

    edges = np.linspace(LO, HI, 5001)
    values = np.repeat(0.5 * (edges[:-1] + edges[1:]), 7)  # 7 values in every bin
    noisy = histogram_release(values, edges, 1.5, Secret.from_seed(0))
    assert noisy.shape == (5000,)
    z = noisy - 7
    assert_discrete_laplace(z, 0.75)
    # the pmf itself, P(Z = k) = (1 - p)/(1 + p)·p^|k| (p = e^-rate), tails beyond ±6 lumped: a chi-square test
    # (it tells the exact discrete Laplace from a rounded continuous Laplace of the same scale)
    p, ks = np.exp(-0.75), np.arange(-6, 7)
    tail = p**7 / (1 + p)
    probs = np.concatenate([[tail], (1 - p) / (1 + p) * p ** np.abs(ks), [tail]])
    observed = np.array([np.sum(z < -6), *(np.sum(z == k) for k in ks), np.sum(z > 6)])
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert stats.chisquare(observed, probs * z.size).pvalue > 1e-3
    # the same secret reproduces the release, another secret does not
    np.testing.assert_array_equal(histogram_release(values, edges, 1.5, Secret.from_seed(0)), noisy)
    assert not np.array_equal(histogram_release(values, edges, 1.5, Secret.from_seed(1)), noisy)
    # the exact sampler keeps the shape of the counts it is given (noise in flat order)
    from rpwjax.noise import noisy_counts as exact_noisy_counts

    flat = exact_noisy_counts(np.arange(6), 1.0, Secret.from_seed(2), "shape")
    np.testing.assert_array_equal(exact_noisy_counts(np.arange(6).reshape(2, 3), 1.0, Secret.from_seed(2), "shape"),
                                  flat.reshape(2, 3))
    assert exact_noisy_counts(3, 1.0, Secret.from_seed(2), "shape").shape == ()


def test_private_mean_noise_is_discrete_laplace_on_the_rounded_sum():
    n, eps = 1000, 0.5
    y = np.full(n, 2.0)
    draws = np.array([statistics.private_mean(y, LO, HI, eps, Secret.from_seed(s)) for s in range(4000)])
    r = statistics.MEAN_RESOLUTION
    # the released mean is lo + (hi - lo)(Σ q_i + Z)/(R n), q_i = round(R (y_i - lo)/(hi - lo))
    total = n * np.rint(r * (2.0 - LO) / (HI - LO))
    z = (draws - LO) / (HI - LO) * r * n - total
    assert_discrete_laplace(z, eps / r)
    # in label units: the Laplace scale (hi - lo)/(n ε) of the continuous mechanism, mean |noise| = scale
    scale = (HI - LO) / (n * eps)
    assert np.mean(np.abs(draws - 2.0)) == pytest.approx(scale, rel=4 / np.sqrt(draws.size))  # sd |Lap(b)| = b
    assert statistics.private_mean(y, LO, HI, eps, Secret.from_seed(7)) == draws[7]


def _data(rng, n=600):
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = np.clip(2.5 + 1.2 * x[:, 0] - 0.6 * x[:, 1] + 0.3 * rng.normal(size=n), LO, HI)
    return x, y


@pytest.mark.parametrize("stage2", slow_unless(["rpwithprior", "unbiased"], fast=["unbiased"]))
def test_two_stage_accounting_and_per_label_privacy(stage2, rng, histogram_epsilons):
    x, y = _data(rng)
    # ε = 1 and prior_fraction = 1/4: each part spends 0.25 on its histogram and 0.75 on its mechanism
    cfg = two_stage.TwoStageConfig(stage2=stage2, fraction=0.4, prior_fraction=0.25)
    run = two_stage.two_stage_labels(x, y, LO, HI, 1.0, secret=Secret.from_seed(5), config=cfg, epochs=3)
    rec = run.record
    by_part = {(s["purpose"], s["rows"][0]["part"]): s["epsilon"] for s in rec["spends"]}  # part 0 is A, 1 is B
    assert by_part == pytest.approx({("histogram", 0): 0.25, ("release", 0): 0.75, ("residual-histogram", 1): 0.25,
                                     ("release", 1): 0.75}, abs=1e-15)
    assert len(rec["spends"]) == 4 and all(s["rows"][0]["partition"] == "split" for s in rec["spends"])
    assert rec["epsilon"] == rec["per_label_epsilon"] == 1.0
    # ... and the releases spent exactly that: stage 1's and the residuals' histograms, then the mechanisms
    assert histogram_epsilons == pytest.approx([0.25, 0.25], abs=1e-15)
    assert float(run.stage1_params.epsilon) == pytest.approx(0.75, abs=1e-15)
    np.testing.assert_allclose(np.asarray(run.stage2_params.epsilon), 0.75, rtol=0, atol=1e-15)
    # the split: 40% of the 600 rows in part A, disjoint from part B, together every row
    assert rec["part_a"]["rows"] == run.part_a.size == 240 and rec["part_b"]["rows"] == run.part_b.size == 360
    assert np.array_equal(np.union1d(run.part_a, run.part_b), np.arange(y.size))
    assert run.labels.shape == y.shape and np.all(np.isfinite(run.labels))
    # every stage-2 row's mechanism is eps2-DP: exact log density ratio over labels in the whole range
    labels = np.linspace(LO, HI, 101)
    params = run.stage2_params
    for row in (0, 7, 31):
        out = float(run.stage2_outputs[row])
        if stage2 == "rpwithprior":
            one = jax.tree_util.tree_map(lambda v: np.asarray(v)[row], params)
            with jax.enable_x64(True):
                logp = np.asarray(one.log_density(jnp.full(labels.shape, out), jnp.asarray(labels)))
        else:
            # the unbiased residual mechanism sees clip(y - m1(x), c_lo, c_hi)
            m1 = run.labels[run.part_b][row] - out
            z = np.clip(labels - m1, *run.residual_range)
            with jax.enable_x64(True):
                logp = np.asarray(params.log_density(jnp.full(labels.shape, out, jnp.float32), jnp.asarray(z, jnp.float32)))
        assert np.all(np.isfinite(logp))
        assert logp.max() - logp.min() <= 0.75 + 1e-6


@pytest.mark.slow
def test_two_stage_denoised_labels_beat_the_raw_stage_outputs_on_an_easy_problem(rng):
    x, y = _data(rng, n=2000)
    run = two_stage.two_stage_labels(x, y, LO, HI, 2.0, secret=Secret.from_seed(1), epochs=20)
    b = run.part_b
    assert np.mean((run.labels[b] - y[b]) ** 2) < np.mean((run.stage2_outputs - y[b]) ** 2)
    # the feature-aware labels are closer to the truth than the mechanism's raw outputs on part A too
    a = run.part_a
    assert np.mean((run.labels[a] - y[a]) ** 2) < np.mean((run.stage1_outputs - y[a]) ** 2)


@pytest.mark.slow
def test_two_stage_is_reproducible_and_rejects_bad_settings(rng):
    x, y = _data(rng, n=200)
    a = two_stage.two_stage_labels(x, y, LO, HI, 1.0, secret=Secret.from_seed(2), epochs=2).labels
    b = two_stage.two_stage_labels(x, y, LO, HI, 1.0, secret=Secret.from_seed(2), epochs=2).labels
    assert np.array_equal(a, b)
    c = two_stage.two_stage_labels(x, y, LO, HI, 1.0, secret=Secret.from_seed(3), epochs=2).labels
    assert not np.array_equal(a, c)
    with pytest.raises(InputError, match="Secret"):
        two_stage.TwoStageRun(y, LO, HI, 1.0, 2)  # an integer seed is not a secret
    with pytest.raises(InputError, match="fraction"):
        two_stage.TwoStageConfig(fraction=1.0).validate()
    with pytest.raises(InputError, match="stage2"):
        two_stage.TwoStageConfig(stage2="laplace").validate()
    with pytest.raises(InputError, match="features"):
        two_stage.two_stage_labels(x[:10], y, LO, HI, 1.0, secret=Secret.from_seed(2), epochs=1)


@pytest.mark.slow
def test_calibrated_denoising_at_small_epsilon_recovers_the_mean(rng, histogram_epsilons, monkeypatch):
    mean_epsilons = spy(monkeypatch, calibrated, "private_mean", lambda args, kwargs: float(args[3]))
    y = np.clip(rng.gamma(2.0, 0.6, 20_000), LO, HI)
    labels, record = calibrated.calibrated_denoised(y, LO, HI, 0.05, secret=Secret.from_seed(0))
    # the default prior_fraction 1/2: ε₁ = 0.025, half for the histogram, half for the mean; ε₂ = 0.025
    assert spends(record, "histogram") == spends(record, "mean") == pytest.approx([0.0125], abs=1e-15)
    assert spends(record, "release") == pytest.approx([0.025], abs=1e-15)
    assert histogram_epsilons == pytest.approx([0.0125], abs=1e-15)
    assert mean_epsilons == pytest.approx([0.0125], abs=1e-15)
    assert record["params"]["epsilon"] == pytest.approx(0.025, abs=1e-15)  # the mechanism that released
    # private mean with eps/4: discrete Laplace noise of scale about 5/(20000*0.0125) = 0.02
    assert abs(labels.mean() - y.mean()) < 0.15


def test_public_design_bounds_every_row_and_keeps_an_intercept(rng):
    x = rng.normal(size=(500, 12)) * np.arange(1, 13)
    design, bound = statistics.public_design(x, components=4)
    assert design.shape == (500, 5)
    assert np.all(np.abs(design).sum(axis=1) <= bound + 1e-9)
    assert np.all(design[:, 0] > 0)  # the intercept column (scaled down only on clipped rows)


def test_private_linear_fit_recovers_the_least_squares_fit_at_large_epsilon_and_adds_discrete_laplace_noise(rng):
    x = rng.normal(size=(4000, 3))
    y = np.clip(2.5 + x @ np.array([0.8, -0.4, 0.2]) + 0.2 * rng.normal(size=4000), LO, HI)
    design, bound = statistics.public_design(x, components=3)
    ols = np.linalg.lstsq(design, y - 2.5, rcond=None)[0]
    theta, centre = statistics.private_linear_fit(design, y, LO, HI, 1e4, Secret.from_seed(0), bound=bound)
    assert centre == 2.5 and np.allclose(theta, ols, atol=1e-3)
    # at small ε the release is noisy: Xᵀ(y - c) in integer units of (hi - lo)·bound/R, plus discrete
    # Laplace noise of rate ε/(R + d) per coordinate (R = STATISTIC_RESOLUTION, d = 4 columns)
    eps, d, r = 0.5, design.shape[1], statistics.STATISTIC_RESOLUTION
    thetas = np.array([statistics.private_linear_fit(design, y, LO, HI, eps, Secret.from_seed(s), bound=bound)[0]
                       for s in range(1000)])
    unit = (HI - LO) * bound / r
    b = (HI - LO) * bound / eps * (1 + d / r)
    ridge = 2 * b**2 / (((HI - LO) / 4) ** 2 * y.size)
    released = thetas @ (design.T @ design + ridge * np.eye(d)).T / unit  # noisy integer sums, recovered
    exact = np.rint(design * (y - 2.5)[:, None] / unit).sum(axis=0)
    assert_discrete_laplace(released - exact, eps / (r + d))
    # in statistic units: about the Laplace scale b of the continuous release, mean |noise| = b
    noise = released * unit - design.T @ (y - 2.5)
    assert np.mean(np.abs(noise)) == pytest.approx(b, rel=4 / np.sqrt(noise.size))  # sd |Lap(b)| = b


@pytest.mark.slow
def test_linear_prior_labels_accounting_and_per_row_privacy(rng, histogram_epsilons, monkeypatch):
    statistic_epsilons = spy(monkeypatch, linear_prior, "private_linear_fit", lambda args, kwargs: float(args[4]))
    released_epsilons = spy(monkeypatch, linear_prior, "release", lambda args, kwargs: np.asarray(args[0].epsilon))
    x, y = _data(rng, n=1500)
    labels, record = linear_prior.linear_prior_labels(x, y, LO, HI, 1.0, secret=Secret.from_seed(4))
    # the defaults: 0.4 of ε on the statistics, 0.1 on the residual histogram, the remaining 0.5 on RPWithPrior
    assert spends(record, "linear-fit") == pytest.approx([0.4], abs=1e-15)
    assert spends(record, "residual-histogram") == pytest.approx([0.1], abs=1e-15)
    assert spends(record, "release") == pytest.approx([0.5], abs=1e-15)
    assert record["per_label_epsilon"] == record["epsilon"] == 1.0
    # ... and what the three releases were given
    assert statistic_epsilons == pytest.approx([0.4], abs=1e-15)
    assert histogram_epsilons == pytest.approx([0.1], abs=1e-15)
    assert len(released_epsilons) == 1 and released_epsilons[0].shape == (y.size,)
    np.testing.assert_allclose(released_epsilons[0], 0.5, rtol=0, atol=1e-15)
    assert labels.shape == y.shape and np.all((labels >= LO) & (labels <= HI))
    # with a good linear model the denoised labels are much closer than the label spread
    assert np.mean((labels - y) ** 2) < 0.5 * np.var(y)
    with pytest.raises(InputError, match="features"):
        linear_prior.linear_prior_labels(x[:5], y, LO, HI, 1.0, secret=Secret.from_seed(4))


def _table(tmp_path, rng, n=400):
    import pyarrow as pa
    import pyarrow.csv as pacsv

    x, y = _data(rng, n=n)
    path = tmp_path / "in.csv"
    pacsv.write_csv(pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "name": [f"r{i}" for i in range(n)], "y": y}), path)
    return path, y


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["auto", "linear-prior", "two-stage"])
def test_privatize_table_replaces_only_the_label_column(pipeline, tmp_path, rng):
    import json

    import pyarrow.csv as pacsv

    from rpwjax import cli, ledger

    path, y = _table(tmp_path, rng)
    out = tmp_path / "out.csv"
    epochs = ["--epochs", "2"] if pipeline.startswith("two-stage") else []  # linear-prior trains no stage model
    rc = cli.main(["privatize-table", str(path), "-o", str(out), "--label-column", "y", "--range", "0", "5",
                   "--epsilon", "1", "--seed", "3", "--pipeline", pipeline, *epochs,
                   "--ledger", str(tmp_path / "book.jsonl")])
    assert rc == 0
    before, after = pacsv.read_csv(path), pacsv.read_csv(out)
    assert after.column_names == before.column_names and after.num_rows == before.num_rows
    for c in ("a", "b", "c", "name"):
        assert after[c].equals(before[c])
    labels = after["y"].to_numpy()
    assert np.all((labels >= LO) & (labels <= HI)) and not np.array_equal(labels, y)
    side = json.loads((tmp_path / "out.csv.json").read_text())
    assert side["pipeline"] == pipeline and side["feature_columns"] == ["a", "b", "c"]
    assert side["accounting"]["per_label_epsilon"] == 1.0
    # the ledger line carries the same account: its totals and entries
    (line,) = ledger.read(tmp_path / "book.jsonl")
    assert line["accounting"]["epsilon"] == line["epsilon"] == 1.0 and line["accounting"]["rows"] == y.size
    assert line["accounting"]["spends"] == [{k: v for k, v in s.items() if k not in ("sensitivity", "mechanism")}
                                            for s in side["accounting"]["spends"]]
    # the sidecar flags the experiments-only seed but never records it, nor any key material
    assert side["reproducible_seed"] is True
    assert Secret.from_seed(3).hex() not in json.dumps(side)

    def fields(record):
        if isinstance(record, dict):
            for k, v in record.items():
                yield k, v
                yield from fields(v)
        elif isinstance(record, list):
            for v in record:
                yield from fields(v)

    for k, v in fields(side):
        assert k != "seed" and not ("seed" in k and isinstance(v, int) and not isinstance(v, bool)), (k, v)


def test_privatize_table_errors_write_nothing(tmp_path, rng, capsys):
    from rpwjax import cli

    path, _ = _table(tmp_path, rng, n=50)
    out = tmp_path / "out.parquet"
    rc = cli.main(["privatize-table", str(path), "-o", str(out), "--label-column", "y", "--range", "0", "1",
                   "--epsilon", "1", "--seed", "3"])
    assert rc == 2 and "public range" in capsys.readouterr().err
    rc = cli.main(["privatize-table", str(path), "-o", str(path), "--label-column", "y", "--range", "0", "5",
                   "--epsilon", "1", "--seed", "3"])
    assert rc == 2 and "overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]


def test_stage_models_learn_labels_in_any_units_when_scaled_by_the_public_range():
    """Labels on [2000, 2020] (years): with ``target_range`` the stage models learn them mapped onto [0, 1] and
    predict in the labels' units (privatize-table's stage models, and curves on a user's table), where raw
    labels leave the network far from them."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(800, 2)).astype(np.float32)
    y = 2010 + 3 * x[:, 0]
    rows = np.arange(600)
    scaled = two_stage.stage_model_predictions(x, rows, y[rows][None], [1], epochs=20, target_range=(2000, 2020))
    raw = two_stage.stage_model_predictions(x, rows, y[rows][None], [1], epochs=20)
    held = np.arange(600, 800)
    assert np.mean((scaled[0, held] - y[held]) ** 2) < 0.3 * np.var(y)
    assert np.mean((raw[0, held] - y[held]) ** 2) > 10 * np.var(y)
