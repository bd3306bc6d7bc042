"""RPWithPrior: exact interval search (brute force), density, sampler, private prior, accounting.

Exact privacy, the JSON round trip, fits over an ε grid and bias/mse against the release are checked
for every mechanism by the contract table (tests/test_contract.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

import rpwjax
from rpwjax.keys import Secret
from rpwjax.priors import Prior, empirical_prior, histogram_prior, private_histogram
from rpwjax.mechanisms.rpwithprior import RPWithPrior, _fit_shared_zeta, fit_rpwithprior

EPS_GRID = np.array([0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 4.0, 8.0])


# ----------------------------------------------------------------- independent reference
def reference_numerator(a1, a2, zeta, objective, points, masses, widths=None):
    """sum_j p_j E[n(Y_j)] written from the definition, per bin, with scipy quadrature for bins."""

    def n(y):
        if objective == "inside":
            return 2 * zeta * ((a1 <= y) & (y <= a2))
        return np.where(
            (a1 <= y) & (y <= a2),
            2 * zeta,
            np.where(y < a1, np.maximum(y + 2 * zeta - a1, 0), np.maximum(a2 + 2 * zeta - y, 0)),
        )

    if widths is None:
        return float(np.sum(masses * n(points)))
    total = 0.0
    for left, w, p in zip(points, widths, masses):
        kinks = [k for k in (a1, a2, a1 - 2 * zeta, a2 + 2 * zeta) if left < k < left + w]
        val, _ = integrate.quad(lambda t: float(n(np.array(t))), left, left + w, points=kinks or None, epsabs=1e-13)
        total += p * val / w
    return total


def reference_ratio(a1, a2, eps, zeta, objective, points, masses, widths=None):
    return reference_numerator(a1, a2, zeta, objective, points, masses, widths) / (2 * zeta + np.exp(-eps) * (a2 - a1))


def grid_ratios(grid, eps, zeta, objective, points, masses, widths=None):
    """J on all pairs a <= b of a grid, vectorised, from the definition (exact piecewise integrals)."""
    a = grid[:, None, None]
    b = grid[None, :, None]
    if widths is None:
        y = points[None, None, :]
        if objective == "inside":
            num = 2 * zeta * ((a <= y) & (y <= b))
        else:
            num = np.where(
                (a <= y) & (y <= b), 2 * zeta, np.where(y < a, np.maximum(y + 2 * zeta - a, 0), np.maximum(b + 2 * zeta - y, 0))
            )
        num = (num * masses).sum(-1)
    else:
        # E over a uniform bin of the piecewise-linear integrand: integrate via the
        # antiderivative of (x)_+ : F(x) = x_+^2 / 2
        l = points[None, None, :]
        r = (points + widths)[None, None, :]
        ramp = lambda u, v: (np.maximum(v, 0) ** 2 - np.maximum(u, 0) ** 2) / 2  # int_u^v (t)_+ dt
        inside_len = np.clip(np.minimum(r, b) - np.maximum(l, a), 0, None)
        if objective == "inside":
            per = 2 * zeta * inside_len
        else:
            # y < a part: (y + 2z - a)_+ over y in [l, min(r, a)]
            top = np.minimum(r, a)
            left_part = np.where(top > l, ramp(l + 2 * zeta - a, top + 2 * zeta - a), 0)
            # y > b part: (b + 2z - y)_+ over y in [max(l, b), r]
            bot = np.maximum(l, b)
            right_part = np.where(r > bot, ramp(b + 2 * zeta - r, b + 2 * zeta - bot), 0)
            per = 2 * zeta * inside_len + left_part + right_part
        num = (per / (r - l) * masses).sum(-1)
    ratio = num / (2 * zeta + np.exp(-eps) * (b[..., 0] - a[..., 0]))
    return np.where(b[..., 0] >= a[..., 0], ratio, -np.inf)


def random_discrete(rng, count, size, lo=0.0, hi=1.0):
    pts = np.sort(rng.uniform(lo, hi, (count, size)), axis=1)
    pts[:, 0] = np.where(rng.random(count) < 0.3, lo, pts[:, 0])  # masses on the boundary too
    m = rng.dirichlet(np.ones(size), count)
    return pts, m


def random_histogram(rng, count, bins, lo=0.0, hi=1.0):
    cuts = np.sort(rng.uniform(lo, hi, (count, bins - 1)), axis=1)
    edges = np.concatenate([np.full((count, 1), lo), cuts, np.full((count, 1), hi)], axis=1)
    m = rng.dirichlet(np.ones(bins) * 0.7, count)
    return edges, m


# ----------------------------------------------------------------- exactness against brute force
@pytest.mark.slow
@pytest.mark.parametrize("objective", ["neighborhood", "inside"])
def test_discrete_prior_interval_is_brute_force_optimum(objective, rng):
    """200 random empirical priors: our optimum >= every pair of a dense grid that includes all candidates."""
    count, size = 200, 6
    pts, m = random_discrete(rng, count, size)
    eps = rng.choice(EPS_GRID, count)
    zetas = rng.choice([0.01, 0.05, 0.15, 0.4], count)
    dense = np.linspace(0, 1, 121)
    for zeta in np.unique(zetas):
        sel = np.flatnonzero(zetas == zeta)
        prior = Prior(pts[sel], pts[sel].copy(), m[sel], 0.0, 1.0, True, "empirical")
        params, info = fit_rpwithprior(prior, eps[sel], zeta=float(zeta), objective=objective)
        for k, i in enumerate(sel):
            cands = np.concatenate([pts[i], pts[i] + 2 * zeta, pts[i] - 2 * zeta, [0.0, 1.0], dense])
            grid = np.unique(np.clip(cands, 0, 1))
            brute = grid_ratios(grid, eps[i], zeta, objective, pts[i], m[i]).max()
            ours = reference_ratio(params.a1[k], params.a2[k], eps[i], zeta, objective, pts[i], m[i])
            assert 0.0 <= params.a1[k] <= params.a2[k] <= 1.0
            assert ours == pytest.approx(info["objective_value"][k], abs=1e-12)
            assert ours == pytest.approx(brute, abs=1e-12), (i, ours, brute)


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["neighborhood", "inside"])
def test_histogram_prior_interval_is_brute_force_optimum(objective, rng):
    """200 random histogram priors: optimum >= a dense grid (incl. edges +- 2 zeta), and within its resolution."""
    count, bins = 200, 5
    edges, m = random_histogram(rng, count, bins)
    eps = rng.choice(EPS_GRID, count)
    zetas = rng.choice([0.02, 0.08, 0.3], count)
    dense = np.linspace(0, 1, 401)
    worst_gap = 0.0
    for zeta in np.unique(zetas):
        sel = np.flatnonzero(zetas == zeta)
        prior = Prior(edges[sel, :-1], edges[sel, 1:], m[sel], 0.0, 1.0, False, "histogram")
        params, info = fit_rpwithprior(prior, eps[sel], zeta=float(zeta), objective=objective)
        for k, i in enumerate(sel):
            e = edges[i]
            grid = np.unique(np.clip(np.concatenate([e, e + 2 * zeta, e - 2 * zeta, dense]), 0, 1))
            ratios = grid_ratios(grid, eps[i], zeta, objective, e[:-1], m[i], np.diff(e))
            brute = ratios.max()
            # zoom twice around the three best grid pairs (the optimum may sit between grid points)
            for flat in np.argsort(ratios, axis=None)[-3:]:
                ia, ib = np.unravel_index(flat, ratios.shape)
                ca, cb, step = grid[ia], grid[ib], 1.0 / 400
                for _ in range(2):
                    za = np.clip(np.linspace(ca - 1.5 * step, ca + 1.5 * step, 61), 0, 1)
                    zb = np.clip(np.linspace(cb - 1.5 * step, cb + 1.5 * step, 61), 0, 1)
                    local = np.unique(np.concatenate([za, zb]))
                    r = grid_ratios(local, eps[i], zeta, objective, e[:-1], m[i], np.diff(e))
                    la, lb = np.unravel_index(np.argmax(r), r.shape)
                    brute = max(brute, r.max())
                    ca, cb, step = local[la], local[lb], step / 20
            ours = reference_ratio(params.a1[k], params.a2[k], eps[i], zeta, objective, e[:-1], m[i], np.diff(e))
            assert ours == pytest.approx(info["objective_value"][k], abs=1e-9)
            assert ours >= brute - 1e-10, (i, ours, brute)
            worst_gap = max(worst_gap, ours - brute)
    assert worst_gap < 1e-5  # the zoomed brute force reaches our optimum


@pytest.mark.slow
def test_neighborhood_beats_inside_on_its_own_objective(rng):
    y = rng.beta(2, 5, 500)
    prior = empirical_prior(y, 0, 1)
    pn, infon = fit_rpwithprior(prior, EPS_GRID, zeta=0.05, objective="neighborhood")
    pi, _ = fit_rpwithprior(prior, EPS_GRID, zeta=0.05, objective="inside")
    with jax.enable_x64(True):
        pres_inside = np.asarray(jax.vmap(lambda p: p.preservation(prior))(pi))
    assert np.all(infon["preservation"] >= pres_inside - 1e-12)


# ----------------------------------------------------------------- density, sampler, moments
def three_piece_cdf(t, params, y):
    eps, z, a1, a2 = (float(params.epsilon), float(params.zeta), float(params.a1), float(params.a2))
    yc = min(max(y, a1), a2)
    g = 2 * z + np.exp(-eps) * (a2 - a1)
    dens = lambda u: np.where((u >= yc - z) & (u <= yc + z), 1 / g, np.exp(-eps) / g)
    t = np.clip(t, a1 - z, a2 + z)
    # piecewise linear CDF through its three pieces
    knots = np.array([a1 - z, yc - z, yc + z, a2 + z])
    cdf_knots = np.concatenate([[0], np.cumsum(np.diff(knots) * dens(0.5 * (knots[:-1] + knots[1:])))])
    return np.interp(t, knots, cdf_knots)


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(7)
    y = np.concatenate([rng.beta(2, 5, 3000), np.zeros(300)])
    prior = empirical_prior(y, 0.0, 1.0)
    params, info = fit_rpwithprior(prior, EPS_GRID, zeta=0.04)
    return prior, y, params, info


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 5, 9])
@pytest.mark.parametrize("label", [0.0, 0.2, 0.9, 1.0])
def test_sampler_matches_density_ks(fitted, index, label):
    _, _, params, _ = fitted
    p = params[index]
    with jax.enable_x64(True):
        draws = np.asarray(p.sample(jax.random.key(11), jnp.full(40000, label)))
    res = stats.kstest(draws, lambda t: three_piece_cdf(t, p, label))
    assert res.pvalue > 1e-3, res


@pytest.mark.slow
def test_density_integrates_to_one_and_matches_cdf(fitted):
    _, _, params, _ = fitted
    for i in range(len(EPS_GRID)):
        p = params[i]
        lo_s, hi_s = float(p.a1 - p.zeta), float(p.a2 + p.zeta)
        for y in (0.0, float(p.a1), 0.5, 1.0):
            with jax.enable_x64(True):
                f = lambda t: float(np.exp(p.log_density(jnp.float64(t), jnp.float64(y))))
                kinks = sorted({float(np.clip(y, p.a1, p.a2) - p.zeta), float(np.clip(y, p.a1, p.a2) + p.zeta)})
                total, _ = integrate.quad(f, lo_s - 0.1, hi_s + 0.1, points=kinks + [lo_s, hi_s], limit=200)
            assert total == pytest.approx(1.0, abs=1e-9)


@pytest.mark.slow
def test_preservation_matches_monte_carlo(fitted):
    prior, y, params, info = fitted
    key = jax.random.key(3)
    with jax.enable_x64(True):
        for i in (0, 4, 7, 9):
            p = params[i]
            labels = jnp.asarray(np.tile(y, 30))
            draws = p.sample(jax.random.fold_in(key, i), labels)
            hit = np.mean(np.abs(np.asarray(draws) - np.asarray(labels)) <= float(p.zeta))
            se = np.sqrt(hit * (1 - hit) / labels.size)
            assert abs(hit - info["preservation"][i]) < 5 * se + 1e-12


@pytest.mark.slow
def test_label_mse_of_an_empirical_prior_is_the_mean_of_the_mse(fitted):
    _, y, params, _ = fitted
    with jax.enable_x64(True):
        for i in (0, 5, 9):
            p = params[i]
            expected = np.mean([float(p.mse(v)) for v in y[:50]])
            assert float(p.label_mse(empirical_prior(y[:50], 0, 1))) == pytest.approx(expected, rel=1e-12)


@pytest.mark.slow
def test_histogram_label_mse_is_exact_integral(rng):
    edges, m = random_histogram(rng, 1, 4)
    prior = histogram_prior(edges[0], m[0])
    params, _ = fit_rpwithprior(prior, 1.0, zeta=0.07)
    with jax.enable_x64(True):
        ref = sum(
            pk * integrate.quad(lambda t: float(params.mse(t)), l, r, points=[float(params.a1), float(params.a2)])[0] / (r - l)
            for l, r, pk in zip(edges[0][:-1], edges[0][1:], m[0])
        )
        assert float(params.label_mse(prior)) == pytest.approx(ref, rel=1e-10)


@pytest.mark.slow
def test_float32_sampling_stays_in_support(fitted):
    _, _, params, _ = fitted
    p = params[9]
    out = p.sample(jax.random.key(0), jnp.linspace(0, 1, 100000, dtype=jnp.float32))
    assert out.dtype == jnp.float32
    assert float(out.min()) >= float(p.a1 - p.zeta) - 1e-6 and float(out.max()) <= float(p.a2 + p.zeta) + 1e-6


# ----------------------------------------------------------------- batching and compilation
def test_sampling_grid_equals_per_epsilon_sampling(fitted):
    _, y, params, _ = fitted
    labels = jnp.asarray(y[:1000], jnp.float32)
    key = jax.random.key(5)
    grid = rpwjax.sample_grid(params, key, labels)
    assert grid.shape == (len(EPS_GRID), 1000)
    keys = jax.random.split(key, len(EPS_GRID))
    for i in range(len(EPS_GRID)):
        # same draws; jit may fuse float32 arithmetic differently from eager mode (1 ulp)
        np.testing.assert_allclose(np.asarray(grid[i]), np.asarray(params[i].sample(keys[i], labels)), rtol=3e-7, atol=1e-7)
    batches = rpwjax.sample_batches(params[3], key, labels.reshape(4, 250))
    assert batches.shape == (4, 250)


def test_new_epsilons_of_same_shape_do_not_recompile(fitted):
    prior, _, _, _ = fitted
    fit_rpwithprior(prior, EPS_GRID, zeta=0.04)
    before = _fit_shared_zeta._cache_size()
    fit_rpwithprior(prior, EPS_GRID * 1.37, zeta=0.09)
    assert _fit_shared_zeta._cache_size() == before


@pytest.mark.slow
def test_auto_zeta_minimises_label_mse(rng):
    prior = empirical_prior(rng.beta(2, 5, 300), 0, 1)
    for eps in (0.3, 2.0):
        best, _ = fit_rpwithprior(prior, eps, zeta="auto")
        best_mse = float(best.label_mse(prior))
        for z in np.geomspace(0.002, 0.5, 15):
            other, _ = fit_rpwithprior(prior, eps, zeta=float(z))
            assert best_mse <= float(other.label_mse(prior)) + 1e-12


# ----------------------------------------------------------------- private prior and accounting
@pytest.mark.slow
def test_private_prior_reads_labels_only_through_bin_counts(rng):
    """Two label sets with the same counts per public bin give the same fit: nothing else leaks in."""
    bins = 16
    edges = np.linspace(0, 1, bins + 1)
    y1 = rng.beta(2, 5, 2000)
    cell = np.clip(np.digitize(y1, edges) - 1, 0, bins - 1)
    y2 = edges[cell] + rng.random(y1.size) * (edges[cell + 1] - edges[cell])  # moved within bins
    y2 = rng.permutation(y2)
    f1 = rpwjax.fit("rpwithprior", y1, range=(0, 1), epsilon=[0.5, 2.0], prior="private", bins=bins, seed=9)
    f2 = rpwjax.fit("rpwithprior", y2, range=(0, 1), epsilon=[0.5, 2.0], prior="private", bins=bins, seed=9)
    assert f1.records() == f2.records()
    # an integer seed is the secret it expands to; another secret gives another noisy histogram
    f3 = rpwjax.fit("rpwithprior", y1, range=(0, 1), epsilon=[0.5, 2.0], prior="private", bins=bins,
                    secret=Secret.from_seed(9))
    assert f3.records() == f1.records()
    f4 = rpwjax.fit("rpwithprior", y1, range=(0, 1), epsilon=[0.5, 2.0], prior="private", bins=bins,
                    secret=Secret.from_seed(10))
    assert all(a["prior"] != b["prior"] for a, b in zip(f4.records(), f1.records()))
    with pytest.raises(rpwjax.InputError, match="secret or seed"):
        rpwjax.fit("rpwithprior", y1, range=(0, 1), epsilon=1.0, secret=Secret.from_seed(9), seed=9)


@pytest.mark.slow
def test_private_prior_accounting_is_reported(rng):
    y = rng.beta(2, 5, 1000)
    res = rpwjax.fit("rpwithprior", y, range=(0, 1), epsilon=[1.0, 2.0], prior="private", prior_epsilon=0.2, seed=1)
    for rec, eps in zip(res.records(), (1.0, 2.0)):
        assert rec["epsilon_prior"] == 0.2
        assert rec["epsilon_mechanism"] == pytest.approx(eps - 0.2)
        assert rec["epsilon"] == eps and rec["delta"] == 0.0
        assert rec["prior"]["kind"] == "private-histogram" and rec["prior"]["bins"] == 32
        assert rec["params"]["epsilon"] == pytest.approx(eps - 0.2)
    known = rpwjax.fit("rpwithprior", y, range=(0, 1), epsilon=1.0, prior="empirical")
    assert known.records()[0]["epsilon_prior"] == 0.0 and known.records()[0]["epsilon_mechanism"] == 1.0
    # the default is the private prior (eps1 = 0.1 eps), its noise from fresh entropy
    default = rpwjax.fit("rpwithprior", y, range=(0, 1), epsilon=1.0).records()[0]
    assert default["prior"]["kind"] == "private-histogram"
    assert default["epsilon_prior"] == pytest.approx(0.1) and default["epsilon_mechanism"] == pytest.approx(0.9)


def test_private_histogram_noise_is_exact_discrete_laplace():
    """Integer counts + discrete Laplace noise of rate eps1/2, clipped at zero and normalised."""
    bins, eps1 = 1000, 2.0
    p = np.exp(-eps1 / 2)  # P(Z = k) = (1 - p)/(1 + p)·p^|k|
    # empty bins: only clipped noise survives, non-zero with probability P(Z > 0) = p/(1 + p)
    prior = private_histogram(np.full(100_000, 0.5), 0, 1, eps1, bins=bins, secret=Secret.from_seed(0))
    mass = np.asarray(prior.mass)
    assert (mass >= 0).all() and mass.sum() == pytest.approx(1.0)
    assert mass[500] > 0.9  # 0.5 falls into bin 500
    empty = np.delete(mass, 500)
    positive = p / (1 + p)
    assert abs(np.mean(empty > 0) - positive) < 4 * np.sqrt(positive * (1 - positive) / empty.size)
    # 50 labels in every bin: no count is clipped, and the noisy integer counts n_i = mass_i·T come back
    # exactly (T = Σ n_i is the one total in reach that makes every mass_i·T an integer)
    # four histograms (seeds 1-4, 4,000 noise draws) pooled: one seed's 1,000 draws gave a chi-square p of 8e-4
    # once the keys became per release (seeds 2-12 alone: 0.01-0.81)
    labels = np.repeat((np.arange(bins) + 0.5) / bins, 50)
    draws = []
    for seed in range(1, 5):
        mass = np.asarray(private_histogram(labels, 0, 1, eps1, bins=bins, secret=Secret.from_seed(seed)).mass)
        totals = np.arange(50 * bins - 2000, 50 * bins + 2001)
        scaled = mass[None, :] * totals[:, None]
        error = np.abs(scaled - np.rint(scaled)).max(axis=1)
        best = int(np.argmin(error))
        assert error[best] < 1e-6 and np.sort(error)[1] > 1e-3
        draws.append(np.rint(scaled[best]) - 50)
    z = np.concatenate(draws)
    # the pmf, tails beyond ±5 lumped (chi-square), and the variance 2p/(1 - p)² (4 standard errors;
    # the sample variance has variance var²·(excess kurtosis + 2)/m, excess kurtosis 3 + (1 - p)²/(2p))
    ks = np.arange(-5, 6)
    tail = p**6 / (1 + p)
    probs = np.concatenate([[tail], (1 - p) / (1 + p) * p ** np.abs(ks), [tail]])
    observed = np.array([np.sum(z < -5), *(np.sum(z == k) for k in ks), np.sum(z > 5)])
    assert stats.chisquare(observed, probs * z.size).pvalue > 1e-3
    var, kurt = 2 * p / (1 - p) ** 2, 3 + (1 - p) ** 2 / (2 * p)
    assert abs(z.var() - var) < 4 * var * np.sqrt((kurt + 2) / z.size)
    assert abs(z.mean()) < 4 * np.sqrt(var / z.size)


def test_private_histogram_is_reproducible_and_independent_per_epsilon():
    y = np.random.default_rng(3).beta(2, 5, 2000)
    one = np.asarray(private_histogram(y, 0, 1, 0.5, bins=16, secret=Secret.from_seed(4)).mass)
    np.testing.assert_array_equal(np.asarray(private_histogram(y, 0, 1, 0.5, bins=16, secret=Secret.from_seed(4)).mass), one)
    assert not np.array_equal(np.asarray(private_histogram(y, 0, 1, 0.5, bins=16, secret=Secret.from_seed(5)).mass), one)
    # a grid of epsilons: each value gets its own noise, keyed by the value (not by its position)
    grid = np.asarray(private_histogram(y, 0, 1, np.array([0.2, 0.5]), bins=16, secret=Secret.from_seed(4)).mass)
    np.testing.assert_array_equal(grid[1], one)
    swapped = np.asarray(private_histogram(y, 0, 1, np.array([0.5, 0.2]), bins=16, secret=Secret.from_seed(4)).mass)
    np.testing.assert_array_equal(swapped[::-1], grid)
    with pytest.raises(rpwjax.InputError, match="Secret"):
        private_histogram(y, 0, 1, 0.5, bins=16, secret=4)


def test_private_histogram_masses_are_the_clipped_noisy_counts_and_all_zero_gives_uniform():
    """Every mass equals the value computed here from the definition: the true counts (label 0.5 in bin 2
    of 4), plus the exact discrete Laplace draws of the same secret, purpose and ε key, clipped at zero and
    normalised, or 1/4 each when no noisy count is positive. At ε₁ = 1e-9 the noise is ~1e9 counts: all
    four are <= 0 with probability about 1/16."""
    from rpwjax.keys import epsilon_index
    from rpwjax.noise import noisy_counts

    eps1, counts = 1e-9, np.array([0, 0, 1, 0])
    uniform = 0
    for s in range(200):
        secret = Secret.from_seed(s)
        mass = np.asarray(private_histogram(np.array([0.5]), 0, 1, eps1, bins=4, secret=secret).mass)
        noisy = np.maximum(noisy_counts(counts, eps1, secret, "histogram", epsilon_index(eps1)), 0).astype(np.float64)
        expected = noisy / noisy.sum() if noisy.sum() > 0 else np.full(4, 0.25)
        np.testing.assert_allclose(mass, expected, rtol=1e-15, atol=0)
        uniform += bool(noisy.sum() == 0)
    assert abs(uniform / 200 - 1 / 16) < 4 * np.sqrt(1 / 16 * 15 / 16 / 200)
    assert uniform > 0  # the uniform branch was exercised


def test_json_names_the_papers_fields(fitted):
    """The saved fields are the paper's names (A1, A2, ζ, γ); γ = 2ζ + e^{-ε}(A2 - A1) is written out."""
    _, _, params, _ = fitted
    fields = params[3].to_json()
    assert set(fields) == {"epsilon", "zeta", "A1", "A2", "gamma", "lo", "hi", "objective"}
    eps, zeta, a1, a2 = (float(v[3]) for v in (EPS_GRID, params.zeta, params.a1, params.a2))
    assert (fields["epsilon"], fields["zeta"], fields["A1"], fields["A2"]) == (eps, zeta, a1, a2)
    assert fields["gamma"] == pytest.approx(2 * zeta + np.exp(-eps) * (a2 - a1), rel=1e-15)


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"epsilon": 0.0}, "epsilon=0.0"),
        ({"epsilon": -1.0}, "epsilon=-1.0"),
        ({"epsilon": float("inf")}, "epsilon=inf"),
        ({"epsilon": float("nan")}, "epsilon=nan"),
        ({"epsilon": 1.0, "zeta": 0.0}, "zeta=0.0"),
        ({"epsilon": 1.0, "zeta": -0.1}, "zeta=-0.1"),
        ({"epsilon": 1.0, "zeta": "big"}, "zeta='big'"),
        ({"epsilon": 1.0, "objective": "outside"}, "objective='outside'"),
    ],
)
def test_fit_rejects_bad_parameters(kwargs, message):
    prior = empirical_prior([0.1, 0.5], 0, 1)
    with pytest.raises(rpwjax.InputError, match=message.replace("(", r"\(").replace(".", r"\.")):
        fit_rpwithprior(prior, **kwargs)


@pytest.mark.parametrize(
    "labels, rng_, message",
    [
        ([0.1, float("nan")], (0, 1), r"labels\[1\]=nan"),
        ([0.1, float("inf")], (0, 1), r"labels\[1\]=inf"),
        ([0.1, 1.5], (0, 1), r"labels\[1\]=1\.5"),
        ([], (0, 1), "empty"),
        ([0.1], (1, 0), "lo=1.0, hi=0.0"),
        ([0.1], (1, 1), "lo=1.0, hi=1.0"),
    ],
)
def test_fit_rejects_bad_labels_and_range(labels, rng_, message):
    with pytest.raises(rpwjax.InputError, match=message):
        rpwjax.fit("rpwithprior", labels, range=rng_, epsilon=1.0)


def test_prior_epsilon_must_be_below_epsilon():
    with pytest.raises(rpwjax.InputError, match="prior_epsilon=1.0 for epsilon=0.5"):
        rpwjax.fit("rpwithprior", [0.2], range=(0, 1), epsilon=[2.0, 0.5], prior="private", prior_epsilon=1.0)


@pytest.mark.slow
def test_clip_is_opt_in():
    res = rpwjax.fit("rpwithprior", [0.2, 1.7, -3.0], range=(0, 1), epsilon=1.0, clip=True)
    assert res.records()[0]["range"] == [0.0, 1.0]


@pytest.mark.slow
def test_warm_start_from_coarse_prior_gives_the_same_exact_optimum(rng):
    """Large priors start Dinkelbach from the optimum of a coarse copy; the answer must not change."""
    y = np.concatenate([rng.beta(2, 5, 5000), np.zeros(500), np.full(200, 1.0)])
    prior = empirical_prior(y, 0, 1)
    assert prior.size > 1024  # the warm-start path is taken
    warm, info = fit_rpwithprior(prior, EPS_GRID, zeta=0.03)
    with jax.enable_x64(True):
        a1, a2, value, _ = _fit_shared_zeta(prior, 0.03, EPS_GRID, "neighborhood", None)
    np.testing.assert_array_equal(warm.a1, np.asarray(a1))
    np.testing.assert_array_equal(warm.a2, np.asarray(a2))
    np.testing.assert_allclose(info["objective_value"], np.asarray(value), rtol=1e-13)


# ----------------------------------------------------------------- debiasing (post-processing)


_debiased_label_mse_grid = jax.jit(jax.vmap(lambda p, q: p.debiased_label_mse(q), in_axes=(0, None)))
_debiased_variance = jax.jit(lambda p, y: p.debiased_variance(y))
_debiased_mse = jax.jit(lambda p, y: p.debiased_mse(y))
_log_density = jax.jit(lambda p, t, y: p.log_density(t, y))


def _density_moments(p, y, power):
    """∫ ((t - b)/a)^power p(t | y) dt from the mechanism's own log_density, exact on its three constant pieces."""
    a, b = (float(v) for v in p.debias_coefficients())
    yc = float(np.clip(y, p.a1, p.a2))
    zeta = float(p.zeta)
    edges = [float(p.a1) - zeta, yc - zeta, yc + zeta, float(p.a2) + zeta]
    nodes, weights = np.polynomial.legendre.leggauss(4)
    total = 0.0
    for left, right in zip(edges[:-1], edges[1:]):
        t = 0.5 * (left + right) + 0.5 * (right - left) * nodes
        density = np.exp(float(_log_density(p, jnp.float64(0.5 * (left + right)), jnp.float64(y))))
        total += float(density * np.sum(0.5 * (right - left) * weights * ((t - b) / a) ** power))
    return total


def test_debias_coefficients_match_the_mechanisms_own_bias(rng):
    prior = empirical_prior(rng.beta(2, 5, 3000), 0, 1)
    params, _ = fit_rpwithprior(prior, np.array([0.3, 1.0, 4.0]), zeta="auto")
    y = np.linspace(0.0, 1.0, 41)
    with jax.enable_x64(True):
        for i in range(3):
            p = params[i]
            a, b = (float(v) for v in p.debias_coefficients())
            eps, zeta, a1, a2 = (float(v) for v in (p.epsilon, p.zeta, p.a1, p.a2))
            gamma = 2 * zeta + np.exp(-eps) * (a2 - a1)
            assert a == pytest.approx(2 * zeta * (1 - np.exp(-eps)) / gamma, rel=1e-12)
            assert b == pytest.approx(np.exp(-eps) * ((a2 + zeta) ** 2 - (a1 - zeta) ** 2) / (2 * gamma), rel=1e-12)
            mean = y + np.asarray(p.bias(jnp.asarray(y)))  # E[Ỹ | y] from the three pieces
            np.testing.assert_allclose(mean, a * np.clip(y, a1, a2) + b, rtol=0, atol=1e-12)
            # E[(Ỹ - b)/a | y] = y' and its variance, by integrating the density
            for label in (0.0, a1, 0.5 * (a1 + a2), a2, 1.0, 0.37):
                target = float(np.clip(label, a1, a2))
                assert _density_moments(p, label, 1) == pytest.approx(target, abs=1e-9)
                second = _density_moments(p, label, 2)
                assert second - target**2 == pytest.approx(float(_debiased_variance(p, jnp.float64(label))), rel=1e-9)
                assert float(_debiased_mse(p, jnp.float64(label))) == pytest.approx(
                    second - 2 * label * target + label**2, rel=1e-9, abs=1e-12)


def test_debiased_release_is_unbiased_inside_the_interval(rng):
    from rpwjax.posterior import debias

    labels = rng.beta(2, 5, 4000)
    fit = rpwjax.fit("rpwithprior", labels, range=(0, 1), epsilon=[1.0, 4.0], prior="private", seed=2,
                     objective="debiased")
    n = 200_000
    with jax.enable_x64(True):
        for i in range(2):
            p = fit.params[i]
            a1, a2 = float(p.a1), float(p.a2)
            for k, y in enumerate((a1, 0.5 * (a1 + a2), a2, a1 + 0.2 * (a2 - a1))):
                released = rpwjax.release(p, Secret.from_seed(50 + 10 * i + k), np.full(n, y))
                clean = debias(p, released)
                se = float(np.sqrt(_debiased_variance(p, jnp.float64(y)))) / np.sqrt(n)
                assert abs(clean.mean() - y) <= 4.5 * se, (i, y, clean.mean(), se)
    # batched parameters take the (E, n) output of release_grid; the plain released labels are biased
    grid = rpwjax.release_grid(fit.params, Secret.from_seed(9), np.full(n, float(fit.params.a2[0])))
    clean = debias(fit.params, grid)
    assert clean.shape == grid.shape
    np.testing.assert_array_equal(clean[1], debias(fit.params[1], grid[1]))
    assert abs(grid[0].mean() - float(fit.params.a2[0])) > 10 * grid[0].std() / np.sqrt(n)
    with pytest.raises(rpwjax.InputError, match="leading shape"):
        debias(fit.params, grid[0])
    with pytest.raises(rpwjax.InputError, match="rpwithprior"):
        debias(rpwjax.fit("laplace", labels, range=(0, 1), epsilon=1.0).params, grid[0])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["empirical", "histogram"])
def test_debiased_fit_beats_the_neighbourhood_fit_on_debiased_mse(kind, rng):
    labels = rng.beta(2, 5, 3000)
    if kind == "empirical":
        prior = empirical_prior(labels, 0, 1)
    else:
        prior = histogram_prior(np.linspace(0, 1, 17), np.histogram(labels, np.linspace(0, 1, 17))[0])
    eps = np.array([0.5, 1.0, 2.0, 4.0, 8.0])
    debiased, info = fit_rpwithprior(prior, eps, zeta="auto", objective="debiased")
    plain, _ = fit_rpwithprior(prior, eps, zeta="auto")
    assert debiased.objective == "debiased"
    with jax.enable_x64(True):
        ours, theirs = (np.asarray(_debiased_label_mse_grid(p, prior)) for p in (debiased, plain))
    np.testing.assert_allclose(info["objective_value"], ours, rtol=1e-10)  # the search's objective is the exact one
    assert np.all(ours < theirs), (ours, theirs)
    # one ε alone gives its row of the vmapped fit
    one, _ = fit_rpwithprior(prior, 2.0, objective="debiased")
    assert float(one.zeta) == pytest.approx(float(debiased.zeta[2]), rel=1e-12)
    assert float(one.a1) == pytest.approx(float(debiased.a1[2]), abs=1e-12)


@pytest.mark.slow
def test_debiased_search_reaches_a_dense_brute_force_grid(rng):
    prior = histogram_prior(np.linspace(0, 1, 13), rng.random(12) + 0.05)
    ends = np.linspace(0, 1, 81)
    a1, a2 = (v.ravel() for v in np.meshgrid(ends, ends, indexing="ij"))
    keep = a1 <= a2
    a1, a2 = a1[keep], a2[keep]
    zetas = np.geomspace(1e-3, 2.0, 60)
    for eps in (0.5, 2.0, 8.0):
        params, info = fit_rpwithprior(prior, eps, objective="debiased")

        @jax.jit
        def brute(z):
            cand = RPWithPrior(jnp.full(a1.shape, eps), jnp.full(a1.shape, z), jnp.asarray(a1), jnp.asarray(a2), 0.0, 1.0)
            return jnp.min(jax.vmap(lambda p: p.debiased_label_mse(prior))(cand))

        with jax.enable_x64(True):
            best = min(float(brute(z)) for z in zetas)
        assert info["objective_value"] <= best * (1 + 1e-9), (eps, info["objective_value"], best)
    # a fixed ζ: only the interval is searched
    fixed, info = fit_rpwithprior(prior, 1.0, zeta=0.1, objective="debiased")
    assert float(fixed.zeta) == 0.1
    with jax.enable_x64(True):
        best = float(jax.jit(lambda: jnp.min(jax.vmap(lambda p: p.debiased_label_mse(prior))(
            RPWithPrior(jnp.full(a1.shape, 1.0), jnp.full(a1.shape, 0.1), jnp.asarray(a1), jnp.asarray(a2), 0.0, 1.0))))())
    assert info["objective_value"] <= best * (1 + 1e-9)


def test_shrink_zeta_caps_zeta_at_half_the_interval(rng):
    prior = empirical_prior(rng.beta(20, 20, 2000), 0, 1)  # concentrated: a narrow interval
    wide, _ = fit_rpwithprior(prior, np.array([0.5, 4.0]), zeta=0.4, objective="inside")
    capped, info = fit_rpwithprior(prior, np.array([0.5, 4.0]), zeta=0.4, objective="inside", shrink_zeta=True)
    np.testing.assert_array_equal(capped.a1, wide.a1)
    np.testing.assert_array_equal(capped.a2, wide.a2)
    half = 0.5 * (np.asarray(wide.a2) - np.asarray(wide.a1))
    assert np.all(half < 0.4)
    np.testing.assert_allclose(capped.zeta, half)
    with jax.enable_x64(True):
        for i in range(2):
            assert info["preservation"][i] == pytest.approx(float(capped[i].preservation(prior)), rel=1e-12)


@pytest.mark.parametrize("index", [0, 5, 9])
@pytest.mark.parametrize("label", [0.0, 0.2, 0.9, 1.0])
def test_cdf_is_the_three_piece_cdf_and_the_sampler_its_inverse(fitted, index, label):
    """RPWithPrior.cdf (the realized check guesses its thresholds from it) is the three-piece CDF, and the
    sampler is its inverse: F(x(u)) = u out to the extreme uniforms (k + 1/2)·2^-52 of the release path."""
    _, _, params, _ = fitted
    p = params[index]
    half = 0.5 * 2.0**-52
    with jax.enable_x64(True):
        t = np.linspace(float(p.a1 - p.zeta) - 0.1, float(p.a2 + p.zeta) + 0.1, 2001)
        np.testing.assert_allclose(np.asarray(p.cdf(jnp.asarray(t), label)), three_piece_cdf(t, p, label),
                                   rtol=0, atol=1e-12)
        u = np.concatenate([[half, 3 * half], (np.arange(100_000) + 0.5) / 100_000, [1 - 3 * half, 1 - half]])
        x = np.asarray(p.sample_from_uniform(jnp.asarray(u), jnp.full(u.size, label)))
        np.testing.assert_allclose(np.asarray(p.cdf(jnp.asarray(x), label)), u, rtol=0, atol=1e-12)
