"""The auto pipeline (rpwjax.pipelines.auto) and the fair comparison (rpwjax.pipelines.feature_prior)."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpwjax import InputError
from rpwjax.keys import Secret
from rpwjax.mechanisms.rpwithprior import fit_rpwithprior_per_row
from rpwjax.pipelines import auto, feature_aware, feature_prior, linear_prior, pipeline, residuals
from rpwjax.pipelines.rule import DEFAULT_RULE as RULE
from rpwjax.pipelines.statistics import public_design
from rpwjax.accounting import Accounting
from helpers import slow_unless, spends, spy

LO, HI = 0.0, 5.0


def _feature_prior(design, bound, y, p, secret, rule=RULE):
    """auto's feature-aware prior under ``rule``: ``(prior, ε₂, calibration, fit)``, the last two as recorded."""
    prior, planned = feature_aware.feature_aware_prior(design, bound, y, LO, HI, p, secret, rule)
    recorded = planned.to_json()
    return prior, planned.mechanism_epsilon, recorded["calibration"], recorded["fit"]


def _anchor_epsilon(p, rule=RULE):
    """What the level anchor takes from the release under ``rule`` for the plan ``p`` (denoised, censored priors)."""
    return rule.level_anchor_share * p.epsilon if p.branch == "denoised" and p.row_prior == "censored" else 0.0


def _data(rng, n):
    x = rng.normal(size=(n, 4))
    y = np.clip(2.0 + 0.9 * x[:, 0] - 0.5 * x[:, 1] + 0.4 * np.sin(2 * x[:, 2]) + 0.3 * rng.normal(size=n), LO, HI)
    return x, y


def _one_feature(rng, eps, slope, noise, n=1600):
    """A Crime-sized table with one feature: ``(x, y, design, bound, plan)`` at ``eps``."""
    x = rng.normal(size=(n, 1))
    y = np.clip(1.0 + slope * x[:, 0] + noise * rng.normal(size=n), LO, HI)
    design, bound = auto.afforded_design(x, eps)
    return x, y, design, bound, auto.plan(eps, n, design.shape[1] - 1, bound, HI - LO)


def test_plan_reads_public_numbers_only_and_spends_exactly_epsilon():
    branches = []
    for rows in (300, 2_000, 20_000, 1_000_000):
        for eps in (0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 4.0, 8.0):
            p = auto.plan(eps, rows, 8, 7.0, 5.0)
            branches.append(p.branch)
            assert p.statistics_epsilon + p.residual_histogram_epsilon + p.release_epsilon == pytest.approx(eps, abs=1e-12)
            readable = rows * p.residual_histogram_epsilon / 2 / RULE.fewest_residual_bins
            if p.fallback is not None:  # the residual histogram cannot be read: mean-matched, the usual split
                assert p.branch == "denoised" and p.unbiased_noise_ratio < RULE.uninformative_release
                assert p.row_prior == "mean-matched" and p.fallback.reason == "unreadable-histogram"
                assert p.fallback.rows_per_noise_per_bin == pytest.approx(readable, rel=1e-12)
                assert readable < p.fallback.threshold == RULE.rows_per_noise_per_bin
                assert p.release_epsilon >= 0.4 * eps - 1e-12
            elif p.row_prior == "mean-matched":  # the release cannot inform a model: 70% to the fit, 20% released
                assert p.branch == "denoised" and p.unbiased_noise_ratio >= RULE.uninformative_release
                assert p.statistics_epsilon == pytest.approx(RULE.uninformative_statistics_share * eps, abs=1e-15)
                assert p.release_epsilon == pytest.approx(0.2 * eps, abs=1e-12)
            else:
                assert p.release_epsilon >= 0.4 * eps - 1e-12
                assert p.row_prior == ("censored" if p.branch == "denoised" else None)
                assert p.branch != "denoised" or p.unbiased_noise_ratio < RULE.uninformative_release
                assert p.branch != "denoised" or readable >= RULE.rows_per_noise_per_bin
            # ρ is the fit's coefficient noise over a coefficient's scale: the noise falls as 1/(ε·n) and grows
            # with the L1 bound; more coefficients share the same budget, each one smaller
            assert auto.plan(eps, 2 * rows, 8, 7.0, 5.0).rho_at_half == pytest.approx(p.rho_at_half / 2)
            assert auto.plan(eps, rows, 8, 14.0, 5.0).rho_at_half == pytest.approx(2 * p.rho_at_half)
            assert auto.plan(eps, rows, 3, 7.0, 5.0).rho_at_half < p.rho_at_half
            assert auto.plan(eps, rows, 8, 7.0, 20.0).rho_at_half == p.rho_at_half  # relative: W cancels
            if p.branch == "calibrated":
                assert p.rho_at_half > RULE.afford_rho and p.statistics_epsilon == 0.0
            elif p.branch == "unbiased":
                # the statistics take at most 15% of ε: the release's noise falls steeply with its ε
                assert p.unbiased_noise_ratio < RULE.unbiased_below
                assert p.statistics_epsilon + p.residual_histogram_epsilon <= 0.15 * eps + 1e-12
            else:
                assert p.unbiased_noise_ratio >= RULE.unbiased_below
        # more rows or more ε never moves the rule back from unbiased labels to denoised or calibrated ones
        order = {"calibrated": 0, "denoised": 1, "unbiased": 2}
        ranks = [order[b] for b in branches[-10:]]
        assert ranks == sorted(ranks)
        # nor from a release that can inform a model back to one that cannot
        uninformative = [auto.plan(e, rows, 8, 7.0, 5.0).row_prior == "mean-matched" for e in (0.05, 0.1, 0.3, 0.5)]
        assert uninformative == sorted(uninformative, reverse=True)
    assert {"calibrated", "denoised", "unbiased"} <= set(branches)
    assert auto.plan(0.05, 2_000, 1, 2.0, 5.0).row_prior == "mean-matched"  # Crime at ε = 0.05: k = 1, B ≈ 2.9
    # the noise ratio is the uniform-prior Unbiased variance, scaled by the range, over n W²/12
    p = auto.plan(2.0, 20_000, 8, 7.0, 5.0)
    assert p.unbiased_noise_ratio == pytest.approx(auto.uniform_unbiased_variance(2.0) * 12 / 20_000)


def test_a_forced_branch_fixes_step_2_only():
    """``branch`` (the registry's auto-denoised / auto-unbiased, for validating the rule) fixes the outcome of
    step 2; the budget split is then the one the rule gives that branch, and step 1 is untouched."""
    free_denoised = auto.plan(0.5, 20_000, 8, 7.0, 5.0)
    free_unbiased = auto.plan(4.0, 20_000, 8, 7.0, 5.0)
    assert (free_denoised.branch, free_unbiased.branch) == ("denoised", "unbiased")
    assert free_denoised.forced_branch is None and free_unbiased.to_json()["forced_branch"] is None
    for free, other in ((free_denoised, "unbiased"), (free_unbiased, "denoised")):
        forced = auto.plan(free.epsilon, 20_000, 8, 7.0, 5.0, branch=other)
        same_branch = free_unbiased if other == "unbiased" else free_denoised
        assert forced.branch == other and forced.forced_branch == other
        assert forced.unbiased_noise_ratio == free.unbiased_noise_ratio  # the rule's quantity is still reported
        eps = free.epsilon
        assert forced.statistics_epsilon + forced.residual_histogram_epsilon + forced.release_epsilon == \
            pytest.approx(eps, abs=1e-12)
        # the split is that branch's own (as shares of ε; the unbiased share depends on ρ, clipped to 5-10%)
        share = forced.residual_histogram_epsilon / eps
        assert share == pytest.approx(same_branch.residual_histogram_epsilon / same_branch.epsilon)
        # forcing the branch the rule picks anyway changes nothing but the record
        again = auto.plan(eps, 20_000, 8, 7.0, 5.0, branch=free.branch)
        assert dataclasses.replace(again, forced_branch=None) == free
    # step 1 still sends features that cannot be afforded to the calibrated branch
    assert auto.plan(0.05, 300, 8, 7.0, 5.0, branch="unbiased").branch == "calibrated"
    with pytest.raises(InputError, match="branch must be one of denoised, unbiased, got branch='calibrated'"):
        auto.plan(1.0, 20_000, 8, 7.0, 5.0, branch="calibrated")
    # the registry rows run auto_labels with the branch fixed, and say so in the record
    for name, branch in (("auto-denoised", "denoised"), ("auto-unbiased", "unbiased")):
        row = pipeline(name)
        assert row.kind == "auto" and dict(row.settings) == {"branch": branch}
    x, y = _data(np.random.default_rng(5), 1500)
    design, bound = public_design(x, RULE.components)
    assert auto.plan(0.5, 1500, design.shape[1] - 1, bound, HI - LO).branch == "denoised"  # what the rule picks
    labels, record = pipeline("auto-unbiased").run(x, y, LO, HI, 0.5, secret=Secret.from_seed(3))
    assert record["auto"]["plan"]["branch"] == "unbiased" and record["auto"]["plan"]["forced_branch"] == "unbiased"
    assert record["mechanism"] == "unbiased" and labels.shape == y.shape


def test_step_1_winsorizes_a_heavy_tailed_score_so_the_bound_keeps_its_signal(rng):
    """A feature whose variance sits in 1% of the rows (a heavy tail) and whose bulk carries the signal: bounded
    as it is, its column loses its spread with the rows the L1 bound shrinks, X'X is nearly singular along
    it and the fit's noise is amplified there; step 1 clips every score to its 1% and 99% quantiles first
    (public features only), which keeps the bulk's spread: a well-conditioned design, a better least-squares
    fit and, over 12 secrets, better private centres."""
    from rpwjax.pipelines.linear_prior import linear_centres
    from rpwjax.pipelines.statistics import bounded_design, principal_scores, winsorized_scores

    n = 6000
    bulk = rng.normal(size=n)
    heavy = np.where(rng.random(n) < 0.01, rng.choice([-60.0, 60.0], n), bulk)  # 1% of the rows far out
    x = np.column_stack([heavy, rng.normal(size=(n, 2))])
    y = np.clip(1.0 + 0.25 * bulk * (np.abs(heavy) < 10) + 0.2 * rng.normal(size=n), LO, HI)
    raw = bounded_design(principal_scores(x, 3))
    kept = bounded_design(winsorized_scores(principal_scores(x, 3), RULE.score_quantile))
    design, bound = auto.afforded_design(x, 1.0)
    np.testing.assert_array_equal(design, kept[0])
    assert bound == kept[1]

    def smallest(d):
        return np.linalg.eigvalsh(d.T @ d / n).min()

    def least_squares(d):
        return np.mean((d @ np.linalg.lstsq(d, y, rcond=None)[0] - y) ** 2)

    assert smallest(raw[0]) < 0.25 < 0.8 < smallest(kept[0])
    assert least_squares(kept[0]) < 0.6 * least_squares(raw[0])
    errors = {name: np.mean([np.mean((linear_centres(*d, y, LO, HI, 0.3, Secret.from_seed(s))[1] - y) ** 2)
                             for s in range(12)]) for name, d in (("raw", raw), ("kept", kept))}
    assert errors["kept"] < 0.7 * errors["raw"]
    with pytest.raises(InputError, match="quantile must lie in"):
        winsorized_scores(x, 0.5)


def test_median_cells_halve_every_cell_by_each_score_in_turn(rng):
    """The public cells of the cell fit: round j splits every cell into its lower and upper half by score
    j mod k (ties by row order), so 2^depth cells of sizes within one of each other, numbered by their path."""
    from rpwjax.pipelines.statistics import median_cells

    z = rng.normal(size=(1001, 3))
    z[:, 1] = np.round(z[:, 1])  # many ties
    parent = np.zeros(z.shape[0], np.int64)
    for depth in range(1, 6):
        cells = median_cells(z, depth)
        counts = np.bincount(cells)
        assert counts.size == 2**depth and counts.max() - counts.min() <= 1
        np.testing.assert_array_equal(cells // 2, parent)  # each cell is a half of a cell of the round before
        column = z[:, (depth - 1) % 3]
        for c in range(2 ** (depth - 1)):
            lower, upper = column[cells == 2 * c], column[cells == 2 * c + 1]
            assert lower.max() <= upper.min() and abs(lower.size - upper.size) <= 1
        parent = cells
    np.testing.assert_array_equal(median_cells(z, 0), np.zeros(z.shape[0], np.int64))
    with pytest.raises(InputError, match="scores must be"):
        median_cells(z[:, 0], 2)
    with pytest.raises(InputError, match="depth must lie in"):
        median_cells(z, 31)


def test_cell_fit_reads_each_label_in_one_cell_and_its_noise_energy_is_the_measured_one(rng, monkeypatch):
    """The cell fit is ε-DP by parallel composition: replacing one label moves the released mean of its own
    cell only (the same secret gives the same noise), by at most the width over the cell's rows. At a huge ε
    it is the weighted least squares of the exact cell means on the cells' mean design rows. The expected
    noise energy the rule compares (fit_noise_energy) is what 300 fits measure, for the cells and the sums."""
    from rpwjax.pipelines import statistics

    n = 1200
    x = rng.normal(size=(n, 2))
    y = np.clip(2.0 + 0.8 * x[:, 0] - 0.4 * x[:, 1] + 0.5 * rng.normal(size=n), LO, HI)
    design, bound = statistics.bounded_design(x)
    cells = statistics.median_cells(design[:, 1:], 2)
    released = []
    original = statistics.private_mean

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        released.append(out)
        return out

    monkeypatch.setattr(statistics, "private_mean", recording)
    statistics.private_cell_fit(design, y, LO, HI, 0.5, Secret.from_seed(3), cells=cells)
    base = np.array(released)
    counts = np.bincount(cells)
    for i in (0, 17, n - 1):
        for value in (LO, HI):
            moved = y.copy()
            moved[i] = value
            released.clear()
            statistics.private_cell_fit(design, moved, LO, HI, 0.5, Secret.from_seed(3), cells=cells)
            changed = np.flatnonzero(np.array(released) != base)
            assert set(changed.tolist()) <= {int(cells[i])}
            assert np.all(np.abs(np.array(released) - base) <= (HI - LO) / counts + 1e-12)
    monkeypatch.undo()
    # a huge ε: the weighted least squares of the exact cell means (weights n_c², the inverse noise variances)
    theta, centre = statistics.private_cell_fit(design, y, LO, HI, 1e5, Secret.from_seed(0), cells=cells)
    z = np.stack([np.bincount(cells, weights=design[:, j]) for j in range(3)], 1) / counts[:, None]
    exact = np.bincount(cells, weights=y) / counts
    w = counts.astype(float) ** 2
    expected = np.linalg.solve(z.T @ (z * w[:, None]), z.T @ (w * (exact - centre)))
    np.testing.assert_allclose(theta, expected, atol=1e-4)
    # the noise energy in the centred predictions, as measured over 300 secrets, for either fit
    centred = design - design.mean(axis=0)
    for fit, kwargs in ((statistics.private_cell_fit, {"cells": cells}), (statistics.private_linear_fit, {"bound": bound})):
        thetas = np.array([fit(design, y, LO, HI, 0.5, Secret.from_seed(100 + s), **kwargs)[0] for s in range(300)])
        spread = thetas - thetas.mean(axis=0)
        measured = np.mean(np.sum((spread @ centred.T) ** 2, axis=1))
        expected = statistics.fit_noise_energy(design, HI - LO, bound, 0.5, cells=kwargs.get("cells"))
        assert 0.8 < measured / expected < 1.25, (fit.__name__, measured, expected)
        # ... and the fit's own estimate of the labels' mean without its ridge, which the fallback weighs by its
        # variance: centred on the labels' mean, with that variance (nearly one Laplace coordinate, so a wider
        # band: the sample variance of 300 draws errs by about 13%)
        estimates = np.array([statistics.fit_mean_estimate(design, t, HI - LO, bound, 0.5, cells=kwargs.get("cells"))
                              for t in thetas])
        expected = estimates[0, 1]
        assert np.all(estimates[:, 1] == expected)  # public numbers: the same for every draw
        assert 0.7 < np.var(estimates[:, 0], ddof=1) / expected < 1.4, (fit.__name__, estimates[:, 0].var(), expected)
        bias = estimates[:, 0].mean() - (y.mean() - centre)
        assert abs(bias) < 4 * math.sqrt(expected / 300) + 0.002 * (HI - LO), (fit.__name__, bias, expected)
    with pytest.raises(InputError, match="cells must"):
        statistics.private_cell_fit(design, y, LO, HI, 0.5, Secret.from_seed(0), cells=cells[:-1])
    with pytest.raises(InputError, match="without gaps"):
        statistics.private_cell_fit(design, y, LO, HI, 0.5, Secret.from_seed(0), cells=2 * cells)


def test_step_4_fits_on_cells_where_they_halve_the_noise_and_their_centres_err_less(rng):
    """Few components, few rows, a small ε (Crime at ε = 0.05): the sums' noise grows with the L1 bound B of the
    design's rows, a cell mean's does not, so the cells' noise energy is well under half and step 4 picks
    them; over 12 secrets their centres err less. With more than rule.cell_components components the sums are
    kept whatever the energies (no cells are formed). auto records the choice."""
    from rpwjax.pipelines import statistics

    x, y, design, bound, p = _one_feature(rng, 0.05, 0.4, 0.6)
    choice, cells = feature_aware.linear_fit_choice(design, bound, HI - LO, p.statistics_epsilon)
    assert p.branch == "denoised" and choice.estimator == "cells" and choice.cells == 2 == cells.max() + 1
    assert choice.noise_cells <= RULE.cell_noise_ratio * choice.noise_sums

    def error(estimator, seed):
        rule = dataclasses.replace(RULE, cell_noise_ratio=0.0 if estimator == "sums" else np.inf)
        prior, _, _, fit = _feature_prior(design, bound, y, p, Secret.from_seed(seed).for_epsilon(0.05), rule)
        assert fit["estimator"] == estimator
        return np.mean((prior.centres - y) ** 2)

    errors = {e: np.mean([error(e, s) for s in range(12)]) for e in ("sums", "cells")}
    assert errors["cells"] < 0.8 * errors["sums"]
    _, record = auto.auto_labels(x, y, LO, HI, 0.05, secret=Secret.from_seed(5))
    assert record["auto"]["plan"]["fit"] == choice.to_json()
    wide = rng.normal(size=(y.size, 8))
    design, bound = auto.afforded_design(wide, 4.0)
    assert design.shape[1] - 1 == RULE.components > RULE.cell_components
    choice, cells = feature_aware.linear_fit_choice(design, bound, HI - LO, 0.05)
    assert choice.estimator == "sums" and choice.cells is None and choice.noise_cells is None
    assert choice.noise_sums == statistics.fit_noise_energy(design, HI - LO, bound, 0.05)
    assert cells is None


def test_step_1_affords_as_many_components_as_the_fit_can_pay_for(rng):
    """Step 1's design: the most principal components (up to rule.components) whose fit is affordable at ε/2, each
    count with its own L1 bound; more ε never buys fewer; none affordable keeps them all (branch calibrated)."""
    from rpwjax.pipelines.statistics import bounded_design, principal_scores, winsorized_scores

    x = rng.normal(size=(1600, 12)) @ rng.normal(size=(12, 12))
    scores = winsorized_scores(principal_scores(x, RULE.components), RULE.score_quantile)
    counts = []
    for eps in (0.01, 0.05, 0.1, 0.2, 0.4, 2.0):
        design, bound = auto.afforded_design(x, eps)
        k = design.shape[1] - 1
        counts.append(k)
        expected, expected_bound = bounded_design(scores[:, :k])  # the first k components, winsorized, bounded
        np.testing.assert_allclose(design, expected, rtol=1e-12, atol=1e-12)
        assert bound == pytest.approx(expected_bound, rel=1e-12)
        again, again_bound = auto.afforded_design(None, eps, scores=principal_scores(x, RULE.components))
        np.testing.assert_array_equal(again, design)  # one SVD for several ε (reproduce.auto_plans) is the same
        assert again_bound == bound
        rho = feature_aware.relative_coefficient_noise(x.shape[0], k, bound, eps / 2)
        if rho <= RULE.afford_rho:
            if k < RULE.components:  # one more component would not be affordable
                _, wider = bounded_design(scores[:, :k + 1])
                assert feature_aware.relative_coefficient_noise(x.shape[0], k + 1, wider, eps / 2) > RULE.afford_rho
            assert auto.plan(eps, x.shape[0], k, bound, 1.0).branch != "calibrated"
        else:  # not even one component: the full design, and step 1 sends the data to the calibrated branch
            assert k == RULE.components and all(
                feature_aware.relative_coefficient_noise(x.shape[0], j, bounded_design(scores[:, :j])[1], eps / 2)
                > RULE.afford_rho for j in range(1, RULE.components + 1))
            assert auto.plan(eps, x.shape[0], k, bound, 1.0).branch == "calibrated"
    assert counts[0] == RULE.components and counts[-1] == RULE.components  # none affordable; all affordable
    assert counts[1:] == sorted(counts[1:]) and len(set(counts[1:-1]) - {RULE.components}) >= 2
    # auto records the count it used
    y = np.clip(1.0 + 0.2 * (x[:, 0] - x[:, 0].mean()) / x[:, 0].std() + 0.3 * rng.normal(size=1600), LO, HI)
    _, record = auto.auto_labels(x, y, LO, HI, 0.05, secret=Secret.from_seed(2))
    assert record["auto"]["plan"]["components"] == counts[1] < RULE.components


@pytest.mark.parametrize("rows, eps, branch", slow_unless(
    [(400, 0.05, "calibrated"), (1500, 0.05, "denoised"), (1500, 0.5, "denoised"), (6000, 4.0, "unbiased")],
    fast=[(1500, 0.5, "denoised")]))
def test_auto_accounting_branch_and_one_release_per_label(rows, eps, branch, rng, histogram_epsilons):
    x, y = _data(rng, rows)
    labels, record = auto.auto_labels(x, y, LO, HI, eps, secret=Secret.from_seed(11))
    plan = record["auto"]["plan"]
    design, bound = auto.afforded_design(x, eps)
    public = auto.plan(eps, rows, design.shape[1] - 1, bound, HI - LO).to_json()  # steps 1 to 3: step 4 unset
    step_4 = {k for k, v in public.items() if v is None and plan[k] is not None}
    assert {k: v for k, v in plan.items() if k not in step_4} == {k: v for k, v in public.items() if k not in step_4}
    # the level anchor: on the denoised branch with censored row priors (the default rule's share)
    anchored = branch == "denoised" and plan["row_prior"] == "censored" and RULE.level_anchor_share > 0
    assert step_4 == ({"fit", "mechanism_epsilon"} | {"denoised": {"calibration"}, "unbiased": {"groups"}}[branch]
                      | ({"anchor"} if anchored else set()) if branch != "calibrated" else set())
    assert plan["branch"] == branch and record["per_label_epsilon"] == record["epsilon"] == eps
    assert record["pipeline"] == "auto"
    account = Accounting.from_json(record)
    releases = [s for s in account.spends if s.purpose == "release"]
    # every label leaves once, through the release path, with the plan's ε₂ less what a calibration and the
    # level anchor took
    eps_c = sum(spends(record, "slope"))
    assert spends(record, "slope") == ([eps_c] if eps_c > 0 else [])
    eps_a = RULE.level_anchor_share * eps if anchored else 0.0
    assert spends(record, "level-anchor") == ([eps_a] if anchored else [])
    assert (plan["anchor"] or {}).get("epsilon", 0.0) == eps_a
    for s in releases:
        assert s.epsilon == pytest.approx(plan["release_epsilon"] - eps_c - eps_a, abs=1e-15)
        assert plan["mechanism_epsilon"] == (s.epsilon if branch != "calibrated" else None)
    if branch == "unbiased":  # one release per centre group, over that group's rows
        groups = account.part_sizes["centre-groups"]
        assert [s.rows for s in releases] == [(("centre-groups", g),) for g in groups] and sum(groups.values()) == rows
    else:
        assert [s.rows for s in releases] == [()]
    if branch == "denoised":
        calibration = record["auto"]["plan"]["calibration"]
        assert calibration["epsilon"] == eps_c in (0.0, RULE.calibration_share * eps)
        assert calibration["below"] >= RULE.calibrate_below  # the noise law's quantile can only raise it
        assert (eps_c > 0) <= (calibration["signal_to_noise"] < calibration["below"])
        assert record["row_prior"] == plan["row_prior"]  # the release uses the row prior the plan names
    else:
        assert eps_c == 0.0
    if branch == "calibrated":
        # half of ε₁ on the histogram, half on the mean, the rest on the release
        assert spends(record, "histogram") == spends(record, "mean") == pytest.approx([eps / 4])
        assert spends(record, "linear-fit") == spends(record, "cell-mean") == []
        assert histogram_epsilons == pytest.approx([eps / 4])  # what the noise was drawn with
    else:
        cells = [s for s in account.spends if s.purpose == "cell-mean"]
        assert (cells != []) == (record["auto"]["plan"]["fit"]["estimator"] == "cells")
        if cells:  # one mean per cell, each over its own cell's rows at ε_s: parallel composition
            assert [s.rows for s in cells] == [(("cells", c),) for c in account.part_sizes["cells"]]
            assert {s.epsilon for s in cells} == {plan["statistics_epsilon"]} and spends(record, "linear-fit") == []
        else:
            assert spends(record, "linear-fit") == [plan["statistics_epsilon"]]
        assert spends(record, "residual-histogram") == pytest.approx([plan["residual_histogram_epsilon"]], abs=1e-15)
        assert histogram_epsilons == spends(record, "residual-histogram")  # what the noise was drawn with
        assert spends(record, "mean") == []
    assert plan["statistics_epsilon"] + plan["residual_histogram_epsilon"] + plan["release_epsilon"] == \
        pytest.approx(eps, abs=1e-12)
    assert labels.shape == y.shape and np.all(np.isfinite(labels))
    assert record["denoised"] == (branch != "unbiased")
    if branch != "unbiased":
        assert np.all((labels >= LO) & (labels <= HI))


def test_auto_unbiased_branch_is_eps2_private_and_unbiased_for_the_clipped_residual(rng, monkeypatch):
    calls, real = [], auto.unbiased_residual_release

    def recording(params, residual_range, centres, labels, secret, **kwargs):
        out = real(params, residual_range, centres, labels, secret, **kwargs)
        calls.append((params, tuple(residual_range), np.asarray(centres), np.asarray(labels), out))
        return out

    monkeypatch.setattr(auto, "unbiased_residual_release", recording)
    x, y = _data(rng, 20_000)
    labels, record = auto.auto_labels(x, y, LO, HI, 4.0, secret=Secret.from_seed(12))
    eps2 = record["auto"]["plan"]["release_epsilon"]
    assert record["auto"]["plan"]["branch"] == "unbiased" and len(calls) == record["groups"] == RULE.groups
    assert sum(c[2].size for c in calls) == y.size
    grid = np.linspace(LO, HI, 201)
    errors, variances = [], []
    for params, (c_lo, c_hi), centres, ys, (out, noisy) in calls:
        # each group's range lies where the residual of a label in the range can lie (or is the 5% minimum)
        assert c_lo >= LO - centres.max() - 1e-12 or c_hi - c_lo <= 0.05 * (HI - LO) + 1e-12
        assert c_hi <= HI - centres.min() + 1e-12 or c_hi - c_lo <= 0.05 * (HI - LO) + 1e-12
        # exact privacy: for a fixed output, the density over every label of the range moves by at most ε₂
        with jax.enable_x64(True):
            for o in noisy[:3]:
                z = np.clip(grid - centres[0], c_lo, c_hi)
                logp = np.asarray(params.log_density(jnp.full(grid.shape, o), jnp.asarray(z)))
                assert np.all(np.isfinite(logp)) and logp.max() - logp.min() <= eps2 + 1e-9
            z = np.clip(ys - centres, c_lo, c_hi)
            variances.append(np.asarray(params.mse(jnp.asarray(z))))
        errors.append(out - (centres + z))
    # released labels are unbiased for centre + clipped residual: the mean error within 4 standard errors
    errors, variances = np.concatenate(errors), np.concatenate(variances)
    assert abs(errors.mean()) < 4 * np.sqrt(variances.sum()) / errors.size


def test_private_slope_moves_by_at_most_one_label_and_recovers_the_slope(rng, monkeypatch):
    """The slope's one statistic: replacing one label moves the integer sum by at most R + 1 (what its discrete
    Laplace noise of rate ε/(R + 1) is calibrated to); with a large ε the estimate is the exact IV slope."""
    from rpwjax.pipelines import statistics

    a = rng.standard_t(3, size=3000)
    y = np.clip(2.5 + 0.6 * a + rng.normal(size=a.size), LO, HI)
    kappa = np.quantile(np.abs(a), RULE.slope_clip_quantile)
    w = np.clip(a, -kappa, kappa)
    exact = float(w @ (y - 2.5) / (w @ a))
    got = [statistics.private_slope(a, y, LO, HI, 50.0, Secret.from_seed(s), centre=2.5) for s in range(3)]
    assert got == pytest.approx([exact] * 3, abs=1e-3) and 0.5 < exact < 0.7
    monkeypatch.setattr(statistics, "discrete_laplace", lambda rate, stream: 0)
    unit = (HI - LO) * kappa / statistics.STATISTIC_RESOLUTION
    scale = float(w @ a) / unit

    def total(labels):
        return statistics.private_slope(a, labels, LO, HI, 1.0, Secret.from_seed(0), centre=2.5) * scale

    base = total(y)
    for i in np.argsort(-np.abs(a))[:5].tolist() + [0, 1]:  # the rows of largest weight, and two others
        for value in (LO, HI, 1.234):
            moved = y.copy()
            moved[i] = value
            assert abs(total(moved) - base) <= statistics.STATISTIC_RESOLUTION + 1 + 1e-3
    with pytest.raises(InputError, match="direction is zero"):
        statistics.private_slope(np.zeros(a.size), y, LO, HI, 1.0, Secret.from_seed(0), centre=2.5)
    with pytest.raises(InputError, match="direction is zero"):
        statistics.slope_noise(np.zeros(a.size), HI - LO, 1.0)
    with pytest.raises(InputError, match="centre must lie in the range"):
        statistics.private_slope(a, y, LO, HI, 1.0, Secret.from_seed(0), centre=7.0)


def test_slope_noise_is_the_spread_of_the_private_slope(rng):
    """slope_noise, computed from the direction and public numbers, is the standard deviation of private_slope
    over secrets (the labels fixed, so all the spread is the noise): within [0.85, 1.15] over 400 draws."""
    from rpwjax.pipelines import statistics

    a = rng.standard_t(3, size=2000)
    y = np.clip(2.5 + 0.6 * a + rng.normal(size=a.size), LO, HI)
    draws = [statistics.private_slope(a, y, LO, HI, 0.2, Secret.from_seed(s), centre=2.5) for s in range(400)]
    expected = statistics.slope_noise(a, HI - LO, 0.2)
    assert 0.85 < np.std(draws) / expected < 1.15
    assert statistics.slope_noise(a, HI - LO, 0.4) == pytest.approx(expected / 2)


def test_clipped_slope_error_is_the_monte_carlo_error_and_guards_only_hopeless_slopes(rng):
    """clipped_slope_error, in closed form, matches 10⁶ Laplace draws clipped to [0, 1]. The guard skips a slope
    only when its noise is at least SLOPE_NOISE_BELOW and it errs more than the fit kept as it is: never for a
    readable slope, never for a pure-noise fit (ratio <= 0: even a slope that noisy, clipped, halves the error),
    and for a good fit (ratio 3) with a slope of noise 2."""
    for alpha, noise in ((0.5, 1.3), (0.78, 0.28), (0.0, 1.0), (1.0, 3.0), (0.3, 0.05)):
        draws = np.clip(alpha + rng.laplace(0.0, noise / np.sqrt(2), 1_000_000), 0.0, 1.0)
        assert feature_aware.clipped_slope_error(alpha, noise) == pytest.approx(np.mean((draws - alpha) ** 2), rel=0.01)
    assert feature_aware.clipped_slope_error(0.4, 0.0) == 0.0
    assert feature_aware.slope_is_worth_it(3.0, 0.99 * RULE.slope_noise_below)  # readable: calibrated
    assert not feature_aware.slope_is_worth_it(3.0, 2.0)
    assert feature_aware.slope_is_worth_it(0.0, 5.0) and feature_aware.slope_is_worth_it(-0.7, 5.0)
    assert feature_aware.clipped_slope_error(0.75, 2.0) > 0.25 ** 2


def test_calibration_is_skipped_where_its_slope_is_too_noisy_to_help(rng, monkeypatch):
    """1,600 rows at ε = 0.1, a fit whose ratio is often below rule.calibrate_below: the slope's noise at ε_c
    (slope_noise) is then wider than [0, 1]. The slope is paid for exactly when slope_is_worth_it says so; where
    it is not (a slope that noisy, clipped, errs more than keeping the fit), nothing is paid, the slope stays
    1, the release keeps the plan's ε₂, and the record holds the slope's noise."""
    x, y, design, bound, p = _one_feature(rng, 0.1, 0.25, 0.8)
    assert p.branch == "denoised" and p.unbiased_noise_ratio < RULE.uninformative_release
    paid = spy(monkeypatch, feature_aware, "private_slope", lambda a, k: float(a[4]))
    skipped = 0
    for seed in range(12):
        before = len(paid)
        prior, eps2, calibration, _ = _feature_prior(design, bound, y, p, Secret.from_seed(seed).for_epsilon(0.1))
        if calibration["signal_to_noise"] >= calibration["below"]:
            assert calibration["slope_noise"] is None and len(paid) == before
            continue
        worth = feature_aware.slope_is_worth_it(calibration["signal_to_noise"], calibration["slope_noise"])
        assert (len(paid) == before + 1) == worth
        if not worth:
            skipped += 1
            assert calibration["slope_noise"] >= RULE.slope_noise_below
            assert calibration["epsilon"] == 0.0 and calibration["slope"] == 1.0
            assert eps2 == pytest.approx(p.release_epsilon - _anchor_epsilon(p), abs=1e-15)
    assert skipped >= 3


@pytest.mark.parametrize("estimator", ["sums", "cells"])
def test_the_noise_law_of_the_fits_energy_is_its_own(rng, estimator):
    """fit_noise_ratio_quantile is the law of E/N for the released fit itself: with labels independent of the
    features (and centred on the range's middle, so the intercept carries nothing), about a tenth of 300 real
    ε-DP fits, each with its own secret, have E/N above the law's 0.9 quantile and about half above its
    median (binomial bounds of about 3.5 standard deviations). The law is heavy-tailed: its 0.999 quantile is
    many times its mean of 1."""
    from rpwjax.pipelines.statistics import (fit_noise_ratio_quantile, fit_signal_to_noise, median_cells,
                                             private_cell_fit, private_linear_fit)

    n, eps = 2000, 0.05
    x = rng.normal(size=(n, 8 if estimator == "sums" else 2))
    y = LO + (HI - LO) * rng.uniform(size=n)
    design, bound = public_design(x, x.shape[1])
    cells = median_cells(design[:, 1:], design.shape[1] - 1) if estimator == "cells" else None
    law = {q: fit_noise_ratio_quantile(design, HI - LO, bound, eps, q, cells=cells) for q in (0.5, 0.9, 0.999)}
    assert law[0.5] < 1.0 < law[0.9] and law[0.999] > 4.0
    assert fit_noise_ratio_quantile(design, HI - LO, bound, eps, 0.9, cells=cells) == law[0.9]  # a fixed public seed
    ratios = []
    for seed in range(300):
        secret = Secret.from_seed(seed)
        if cells is None:
            theta, _ = private_linear_fit(design, y, LO, HI, eps, secret, bound=bound)
        else:
            theta, _ = private_cell_fit(design, y, LO, HI, eps, secret, cells=cells)
        ratios.append(fit_signal_to_noise(design, theta, HI - LO, bound, eps, cells=cells) + 1.0)
    above = {q: np.mean(np.array(ratios) > law[q]) for q in (0.5, 0.9)}
    assert 0.40 <= above[0.5] <= 0.60 and 0.045 <= above[0.9] <= 0.16, above
    with pytest.raises(InputError, match="quantile"):
        fit_noise_ratio_quantile(design, HI - LO, bound, eps, 1.0, cells=cells)


def test_the_calibration_fires_below_the_noise_laws_quantile(rng, monkeypatch):
    """Step 4's trigger: a fit whose ratio lies above the fixed rule.calibrate_below but where noise alone could
    have put its energy (below calibration_threshold: the noise law's rule.calibrate_noise_quantile quantile less
    1) is calibrated; one above the threshold is kept; with the quantile at 0 the fixed ratio alone decides.
    The plan records the threshold."""
    x, y = _data(rng, 4000)
    design, bound = public_design(x, RULE.components)
    p = auto.plan(0.1, y.size, design.shape[1] - 1, bound, HI - LO)
    assert p.branch == "denoised"
    fit, cells = feature_aware.linear_fit_choice(design, bound, HI - LO, p.statistics_epsilon)
    below = feature_aware.calibration_threshold(design, bound, HI - LO, p.statistics_epsilon,
                                                feature_aware.fit_cells_of(fit, cells))
    assert below > RULE.calibrate_below + 1.0  # heavy tails: the 0.999 quantile of E/N is well above 5
    fixed = dataclasses.replace(RULE, calibrate_noise_quantile=0.0)
    assert feature_aware.calibration_threshold(design, bound, HI - LO, p.statistics_epsilon, None, fixed) == \
        RULE.calibrate_below
    for ratio, rule, paid in ((0.5 * (RULE.calibrate_below + below), RULE, True), (below + 1.0, RULE, False),
                              (0.5 * (RULE.calibrate_below + below), fixed, False), (1.0, fixed, True)):
        monkeypatch.setattr(feature_aware, "fit_signal_to_noise", lambda *a, ratio=ratio, **k: ratio)
        _, eps2, calibration, _ = _feature_prior(design, bound, y, p, Secret.from_seed(3).for_epsilon(0.1), rule)
        assert calibration["signal_to_noise"] == ratio
        assert calibration["below"] == pytest.approx(below if rule is RULE else RULE.calibrate_below)
        assert (calibration["epsilon"] > 0) == paid, (ratio, rule.calibrate_noise_quantile)
        assert eps2 == pytest.approx(p.release_epsilon - (RULE.calibration_share * 0.1 if paid else 0.0)
                                     - _anchor_epsilon(p), abs=1e-15)
    with pytest.raises(InputError, match="calibrate_noise_quantile"):
        dataclasses.replace(RULE, calibrate_noise_quantile=1.0)


def test_calibration_pulls_a_noise_fit_towards_a_constant_and_leaves_a_good_fit_alone(rng, monkeypatch):
    """Step 4 (denoised): where the features say nothing about the label, the private fit's signal-to-noise
    ratio is about 0, the calibration is paid for, and the centres err less than the uncalibrated fit's;
    where the fit is well measured, nothing is paid and the centres are the fit's."""
    from rpwjax.pipelines.statistics import fit_signal_to_noise

    x = rng.normal(size=(6000, 4))
    y = np.clip(LO + rng.exponential(1.0, size=x.shape[0]), LO, HI)  # features independent of the label
    design, bound = public_design(x, RULE.components)
    p = auto.plan(0.1, y.size, design.shape[1] - 1, bound, HI - LO)
    assert p.branch == "denoised"

    def centres_error(seed, rule):
        prior, eps2, calibration, _ = _feature_prior(design, bound, y, p, Secret.from_seed(seed).for_epsilon(0.1),
                                                     rule)
        return float(np.mean((y - prior.centres) ** 2) - y.var()), eps2, calibration  # the error a constant adds

    never = dataclasses.replace(RULE, calibrate_below=-np.inf, calibrate_noise_quantile=0.0)
    ratios, calibrated, plain = [], [], []
    for seed in range(8):
        error, eps2, calibration = centres_error(seed, RULE)
        ratios.append(calibration["signal_to_noise"])
        if calibration["epsilon"] > 0:
            assert eps2 == pytest.approx(p.release_epsilon - RULE.calibration_share * 0.1 - _anchor_epsilon(p),
                                         abs=1e-15)
            assert 0.0 <= calibration["slope"] <= 1.0
            calibrated.append(error)
            plain.append(centres_error(seed, never)[0])
    assert abs(np.mean(ratios)) < 1.5 and len(calibrated) >= 6
    assert np.mean(calibrated) < 0.5 * np.mean(plain)
    # a well-measured fit: a large ratio, no calibration, the release keeps the plan's ε₂ (the level anchor off:
    # it would shift the centres and take its own share)
    x, y = _data(rng, 20_000)
    design, bound = public_design(x, RULE.components)
    p = auto.plan(0.5, y.size, design.shape[1] - 1, bound, HI - LO)
    prior, eps2, calibration, _ = _feature_prior(design, bound, y, p, Secret.from_seed(1).for_epsilon(0.5),
                                                 dataclasses.replace(RULE, level_anchor_share=0.0))
    assert p.branch == "denoised" and calibration["signal_to_noise"] > 10 * calibration["below"]
    assert calibration == {"signal_to_noise": calibration["signal_to_noise"], "epsilon": 0.0, "slope": 1.0,
                           "slope_noise": None, "below": calibration["below"]}
    assert eps2 == p.release_epsilon
    theta, m = linear_prior.linear_centres(design, bound, y, LO, HI, p.statistics_epsilon,
                                              Secret.from_seed(1).for_epsilon(0.5))
    np.testing.assert_array_equal(prior.centres, m)
    assert fit_signal_to_noise(design, theta, HI - LO, bound, p.statistics_epsilon) == calibration["signal_to_noise"]
    # features that never vary: the centres are a constant, there is nothing to calibrate and nothing is paid
    _, record = auto.auto_labels(np.ones((y.size, 2)), y, LO, HI, 0.3, secret=Secret.from_seed(4))
    assert record["auto"]["plan"]["branch"] == "denoised"
    assert record["auto"]["plan"]["calibration"] == {"signal_to_noise": None, "epsilon": 0.0, "slope": 1.0, "slope_noise": None,
                                                     "below": None}


def test_clipping_error_is_the_integral_under_the_histogram(rng):
    edges = np.linspace(-2.0, 2.0, 41)
    mass = rng.dirichlet(np.ones(40))
    bins = rng.choice(40, size=400_000, p=mass)
    r = rng.uniform(edges[bins], edges[bins + 1])
    for c_lo, c_hi, support in ((-0.73, 0.43, None), (-0.05, 1.33, (-0.93, 1.47)), (0.2, 0.2, (-1.61, 0.87)),
                                (-3.0, 3.0, None)):
        kept = r if support is None else r[(r >= support[0]) & (r <= support[1])]
        expected = np.mean((np.clip(kept, c_lo, c_hi) - kept) ** 2)
        got = residuals.clipping_error(edges, mass, c_lo, c_hi, support)
        assert got == pytest.approx(expected, rel=0.02, abs=1e-12)
    assert residuals.clipping_error(edges, mass, -2.0, 2.0) == 0.0


@pytest.mark.slow
def test_auto_clips_residuals_less_as_epsilon_grows(rng, monkeypatch):
    """Step 4 (unbiased): each group's clip quantile is the cheapest of rule.clip_quantiles in bias² + variance, so
    the 2% clip of moderate ε gives way to wider ranges where the release's noise is small, and the released
    labels get closer to the raw ones than with the 2% clip kept at every ε (heavy-tailed residuals, as in
    real tables, where the clip's bias is what is left at large ε)."""
    x = rng.normal(size=(20_000, 4))
    y = np.clip(2.0 + 0.9 * x[:, 0] - 0.5 * x[:, 1] + 0.3 * rng.standard_t(2, size=x.shape[0]), LO, HI)

    def run(eps, rule=RULE):
        labels, record = auto.auto_labels(x, y, LO, HI, eps, secret=Secret.from_seed(31), rule=rule)
        assert record["auto"]["plan"]["branch"] == "unbiased"
        return [g["clip_quantile"] for g in record["release"]], float(np.mean((labels - y) ** 2))

    low, _ = run(2.0)
    high, error = run(64.0)
    assert set(low) == {0.02} and max(high) < 0.02
    fixed, fixed_error = run(64.0, dataclasses.replace(RULE, clip_quantiles=(0.02,)))
    assert set(fixed) == {0.02} and error < 0.7 * fixed_error


def test_denoised_release_reads_the_residual_model_as_censored_at_the_range(monkeypatch):
    """Zero-inflated labels (70% at the bottom of [0, 20], a heavy tail): most centres sit near 0, where the
    truncated prior (residual histogram shifted and cut to the range) moves its mass up and the posterior mean
    with it. The censored prior (y = clip(m + r)) keeps that mass at 0: the labels' mean lies at least twice as
    close to the true mean and their error is lower. Auto's denoised branch uses the censored one."""
    rng = np.random.default_rng(0)
    n = 4000
    x = rng.normal(size=(n, 4))
    y = np.clip(np.where(rng.random(n) < 0.7, 0.0, rng.exponential(3.0, n) * np.exp(0.4 * x[:, 0])), 0.0, 20.0)
    design, bound = public_design(x, 4)
    s = Secret.from_seed(7).for_epsilon(1.0)
    prior = linear_prior.linear_residual_prior(design, bound, y, 0.0, 20.0, 0.4, 0.1, s)
    out = {c: linear_prior.release_around(prior, y, 0.0, 20.0, 0.5, s, "rpwithprior", levels=RULE.levels,
                                          row_prior="censored" if c else "truncated")[0] for c in (False, True)}
    bias = {c: abs(float(out[c].mean() - y.mean())) for c in out}
    error = {c: float(np.mean((out[c] - y) ** 2)) for c in out}
    assert bias[True] < 0.5 * bias[False] and error[True] < 0.9 * error[False]
    calls = spy(monkeypatch, linear_prior, "censored_priors", lambda a, k: a[2].size)
    _, record = auto.auto_labels(x, y, 0.0, 20.0, 0.5, secret=Secret.from_seed(8))
    # one call, with the rounded centres' levels (a row's prior is its level's, not built again per row)
    assert record["auto"]["plan"]["branch"] == "denoised" and len(calls) == 1 and 1 < calls[0] <= RULE.levels + 1


def test_mean_matched_row_priors_keep_the_centre_as_their_mean():
    """A residual law fitted far from 0 and wide (what a Laplace fit to a histogram with n·ε₁ ≈ 8 can give):
    the censored row priors' means miss the centres by more than a unit of a range of 5. The mean-matched
    priors centre the law and narrow it until each prior's mean is its centre to within half a grid bin; a
    centred narrow law in the middle of the range needs no narrowing and gives the censored priors themselves."""
    edges = np.linspace(-5.0, 5.0, 65)
    mass = residuals._laplace_masses(edges, np.array([1.5]), np.array([2.0]))[0]
    centres = np.array([0.0, 0.3, 1.0, 2.5, 4.2, 5.0])
    matched = residuals.mean_matched_priors(edges, mass, centres, LO, HI)
    censored = residuals.censored_priors(edges, mass, centres, LO, HI)
    middle = 0.5 * (matched.left + matched.right)
    np.testing.assert_allclose(matched.mass.sum(axis=1), 1.0)
    assert np.all(np.abs(np.sum(matched.mass * middle, axis=1) - centres) <= 0.5 * (HI - LO) / 64 + 1e-12)
    assert np.max(np.abs(np.sum(censored.mass * middle, axis=1) - centres)) > 1.0
    spread = np.sum(matched.mass > 1e-9, axis=1)
    # inside the range: narrowed, not a point; at an end of the range only a point mass has the end as its mean
    assert np.all(spread[1:-1] > 1) and spread[0] == spread[-1] == 1
    narrow = residuals._laplace_masses(edges, np.array([0.0]), np.array([0.2]))[0]
    inner = np.array([2.0, 2.5, 3.1])
    np.testing.assert_allclose(residuals.mean_matched_priors(edges, narrow, inner, LO, HI).mass,
                               residuals.censored_priors(edges, narrow, inner, LO, HI).mass, atol=1e-12)


def test_an_uninformative_release_keeps_the_labels_on_the_centres(rng):
    """1,600 rows at ε = 0.05 (Crime's size): the release's ε₂ cannot inform a model (Q >= 1), so the plan gives
    70% of ε to the fit and names mean-matched row priors. The labels then sit close to their priors' means.
    Given a residual law fitted 1.5 off 0 and wide (a noisy histogram's), censored priors move every label's
    mean by about that; mean-matched ones keep the labels' mean within 0.1 of the centres' and err less."""
    x, y, design, bound, p = _one_feature(rng, 0.05, 0.4, 0.6)
    assert p.branch == "denoised" and p.row_prior == "mean-matched"
    s = Secret.from_seed(3).for_epsilon(0.05)
    fitted, eps2, _, _ = _feature_prior(design, bound, y, p, s)
    edges = np.linspace(-(HI - LO), HI - LO, 65)
    bad = dataclasses.replace(fitted, edges=edges,
                              mass=residuals._laplace_masses(edges, np.array([1.5]), np.array([2.0]))[0])
    out = {mm: linear_prior.release_around(bad, y, LO, HI, eps2, s, "rpwithprior", levels=RULE.levels,
                                           row_prior="mean-matched" if mm else "censored")[0] for mm in (False, True)}
    shift = {mm: abs(float(out[mm].mean() - fitted.centres.mean())) for mm in out}
    assert shift[True] < 0.1 < 1.0 < shift[False]
    assert np.mean((out[True] - y) ** 2) < 0.5 * np.mean((out[False] - y) ** 2)
    labels, record = auto.auto_labels(x, y, LO, HI, 0.05, secret=Secret.from_seed(3))
    fit = spends(record, "linear-fit") + spends(record, "cell-mean")[:1]  # the cells: one ε, parallel
    assert record["row_prior"] == "mean-matched" and fit == [p.statistics_epsilon]


def test_an_unreadable_residual_histogram_falls_back_to_a_private_mean_and_mean_matched_priors(rng, monkeypatch):
    """1,600 rows at ε = 0.15 (Q < 1: the release can inform a model): even 4 residual bins would hold
    1600·0.015/2/4 = 3 rows per unit of noise scale, fewer than the rule's 4, so the histogram cannot be told
    from its noise. Step 3 says so in the plan (public: ``explain`` shows it) and keeps the usual split; step 4
    pays fallback_mean_share of ε₁ for a private mean of the labels, combines it with the fit's own mean by
    their known noise variances, moves the centres' mean there, releases the histogram with the rest and gives
    every row a prior whose mean is its centre. With the fallback off, or with rows enough to read the
    histogram, the plan and the account are as before."""
    x, y, design, bound, p = _one_feature(rng, 0.15, 0.4, 0.6)
    eps1 = p.residual_histogram_epsilon
    assert p.branch == "denoised" and p.unbiased_noise_ratio < RULE.uninformative_release
    assert p.row_prior == "mean-matched" and p.fallback.to_json() == {
        "reason": "unreadable-histogram", "rows_per_noise_per_bin": pytest.approx(1600 * eps1 / 8, rel=1e-12),
        "threshold": RULE.rows_per_noise_per_bin, "mean_epsilon": pytest.approx(RULE.fallback_mean_share * eps1),
        "fit_mean_noise": None, "private_mean_noise": None, "private_mean_weight": None}  # step 4 sets these
    assert auto.explain(x, y.size, LO, HI, 0.15)["plan"]["fallback"] == p.fallback.to_json()
    off = dataclasses.replace(RULE, unreadable_histogram_fallback=False, level_anchor_share=0.0)  # (no anchor: the
    # censored priors it gives would buy their own mean)
    before = auto.plan(0.15, y.size, design.shape[1] - 1, bound, HI - LO, rule=off)
    assert before.fallback is None and before.row_prior == "censored"
    assert dataclasses.replace(before, row_prior="mean-matched", fallback=p.fallback) == p  # nothing else moves
    assert auto.plan(0.15, 6_000, design.shape[1] - 1, bound, HI - LO).fallback is None  # 11 rows per noise scale

    means, placed = [], []
    real_mean, real_place = feature_aware.private_mean, feature_aware.fallback_mean
    monkeypatch.setattr(feature_aware, "private_mean", lambda *a, **k: means.append(real_mean(*a, **k)) or means[-1])
    monkeypatch.setattr(feature_aware, "fallback_mean", lambda *a, **k: placed.append(real_place(*a, **k)) or placed[-1])
    prior, planned = feature_aware.feature_aware_prior(design, bound, y, LO, HI, p, Secret.from_seed(3).for_epsilon(0.15))
    eps2 = planned.mechanism_epsilon
    # the same fit and calibration without the fallback, then one shift to the placed mean (and the clip)
    unshifted, _, _, _ = _feature_prior(design, bound, y, before, Secret.from_seed(3).for_epsilon(0.15), off)
    assert len(means) == 1 and len(placed) == 1
    filled, target = placed[0]
    assert planned.fallback == filled
    shift = min(max(target, LO), HI) - np.mean(unshifted.centres)
    np.testing.assert_allclose(prior.centres, np.clip(unshifted.centres + shift, LO, HI), rtol=0, atol=1e-12)
    # the private mean's noise is √2·W/(n·ε); the weights are inverse to the two variances; "private" alone is
    # the fallback as it was first written
    v_private = 2 * ((HI - LO) / (y.size * filled.mean_epsilon)) ** 2
    assert filled.private_mean_noise == pytest.approx(math.sqrt(v_private), rel=1e-12)
    v_fit = filled.fit_mean_noise ** 2
    assert filled.private_mean_weight == pytest.approx(v_fit / (v_fit + v_private), rel=1e-12)
    assert 0 < filled.private_mean_weight < 1
    own = (target - filled.private_mean_weight * means[0]) / (1 - filled.private_mean_weight)
    alone = dataclasses.replace(RULE, fallback_mean_weighting="private")
    filled_alone, target_alone = real_place(design, np.zeros(design.shape[1]), bound, HI - LO, p.statistics_epsilon,
                                            None, p.fallback, means[0], y.size, 0.5 * (LO + HI), alone)
    assert target_alone == means[0] and filled_alone.private_mean_weight == 1.0
    assert abs(own - np.mean(y)) < 5 * filled.fit_mean_noise  # the fit's own mean estimates the labels' mean
    # a design column that is zero on every row (a constant feature's score): the fit's mean is still read
    flat = np.concatenate([design, np.zeros((design.shape[0], 1))], axis=1)
    filled_flat, target_flat = real_place(flat, np.zeros(flat.shape[1]), bound, HI - LO, p.statistics_epsilon, None,
                                          p.fallback, means[0], y.size, 0.5 * (LO + HI), RULE)
    assert math.isfinite(target_flat) and 0 < filled_flat.private_mean_weight < 1
    with pytest.raises(InputError, match="fallback_mean_weighting"):  # a rule with an unknown weighting is refused
        dataclasses.replace(RULE, fallback_mean_weighting="median")
    assert eps2 == p.release_epsilon or eps2 == pytest.approx(p.release_epsilon - RULE.calibration_share * 0.15)
    labels, record = auto.auto_labels(x, y, LO, HI, 0.15, secret=Secret.from_seed(3))
    assert record["row_prior"] == "mean-matched" and record["auto"]["plan"]["fallback"] == filled.to_json()
    assert spends(record, "fallback-mean") == pytest.approx([RULE.fallback_mean_share * eps1], rel=1e-12)
    assert spends(record, "residual-histogram") == pytest.approx([(1 - RULE.fallback_mean_share) * eps1], rel=1e-12)
    np.testing.assert_allclose(Accounting.from_json(record).per_row()[0], 0.15, rtol=1e-12)  # every row: ε
    _, unchanged = auto.auto_labels(x, y, LO, HI, 0.15, secret=Secret.from_seed(3), rule=off)
    assert unchanged["row_prior"] == "censored" and not spends(unchanged, "fallback-mean")
    assert unchanged["auto"]["plan"]["fallback"] is None


def test_the_level_anchor_moves_the_row_priors_mean_to_a_mean_with_known_noise(rng, monkeypatch):
    """Denoised with censored row priors (20,000 rows at ε = 0.3: the histogram is readable, Q < 1): with
    ``level_anchor_share`` the rule takes that share of ε from the release for a private mean of the labels,
    combines it with the fit's own mean by their known noise variances, and moves every centre by one shift so
    that the censored row priors (on the release's rounded centres) average to that target. The plan records
    the public numbers; the account adds the mean's ε and the release loses it; every row still spends ε. With
    the share 0, on a fallback and on the unbiased branch nothing is bought."""
    eps = 0.3
    anchored_rule = dataclasses.replace(RULE, level_anchor_share=0.1)
    unanchored_rule = dataclasses.replace(RULE, level_anchor_share=0.0)
    x, y, design, bound, p = _one_feature(rng, eps, 0.4, 0.6, n=20_000)
    assert p.branch == "denoised" and p.row_prior == "censored" and p.fallback is None
    targets, real = [], feature_aware.combined_mean
    monkeypatch.setattr(feature_aware, "combined_mean", lambda *a, **k: targets.append(real(*a, **k)) or targets[-1])
    s = Secret.from_seed(5).for_epsilon(eps)
    prior, planned = feature_aware.feature_aware_prior(design, bound, y, LO, HI, p, s, anchored_rule)
    plain, plain_plan = feature_aware.feature_aware_prior(design, bound, y, LO, HI, p, s, unanchored_rule)
    assert len(targets) == 1 and plain_plan.anchor is None
    target, v_fit, v_private, weight = targets[0]
    anchor = planned.anchor
    assert anchor.epsilon == pytest.approx(0.1 * eps, rel=1e-12)
    assert anchor.private_mean_noise == pytest.approx(math.sqrt(2) * (HI - LO) / (y.size * 0.1 * eps), rel=1e-12)
    assert anchor.private_mean_noise ** 2 == pytest.approx(v_private, rel=1e-12)
    assert anchor.fit_mean_noise ** 2 == pytest.approx(v_fit, rel=1e-12)
    assert weight == pytest.approx(v_fit / (v_fit + v_private), rel=1e-12) and 0 < weight < 1
    assert planned.mechanism_epsilon == pytest.approx(plain_plan.mechanism_epsilon - 0.1 * eps, rel=1e-12)
    assert abs(target - y.mean()) < 5 * math.sqrt(1 / (1 / v_fit + 1 / v_private))
    # one shift for every row (the clip aside), and the rounded centres' censored priors average to the target
    np.testing.assert_array_equal(prior.edges, plain.edges)
    np.testing.assert_array_equal(prior.mass, plain.mass)
    inside = (prior.centres > LO) & (prior.centres < HI)
    shift = prior.centres[inside] - plain.centres[inside]
    assert np.ptp(shift) < 1e-9 and inside.mean() > 0.5
    step = (HI - LO) / RULE.levels
    rounded = np.clip(LO + step * np.rint((prior.centres - LO) / step), LO, HI)
    priors = residuals.censored_priors(prior.edges, prior.mass, rounded, LO, HI)
    means = np.sum(np.asarray(priors.mass) * 0.5 * (np.asarray(priors.left) + np.asarray(priors.right)), axis=-1)
    assert np.mean(means) == pytest.approx(target, abs=2 * step)
    # the record: the mean's ε is spent once, and each row's total is ε
    labels, record = auto.auto_labels(x, y, LO, HI, eps, secret=Secret.from_seed(5), rule=anchored_rule)
    assert record["auto"]["plan"]["anchor"] == anchor.to_json()
    assert spends(record, "level-anchor") == pytest.approx([0.1 * eps], rel=1e-12)
    np.testing.assert_allclose(Accounting.from_json(record).per_row()[0], eps, rtol=1e-12)
    _, unchanged = auto.auto_labels(x, y, LO, HI, eps, secret=Secret.from_seed(5), rule=unanchored_rule)
    assert unchanged["auto"]["plan"]["anchor"] is None and not spends(unchanged, "level-anchor")
    # a fallback (too few rows to read the histogram) buys its own mean; the unbiased branch none
    x_few, y_few, design_few, bound_few, p_few = _one_feature(rng, 0.15, 0.4, 0.6)
    assert p_few.fallback is not None
    _, few_plan = feature_aware.feature_aware_prior(design_few, bound_few, y_few, LO, HI, p_few, s, anchored_rule)
    assert few_plan.anchor is None
    _, unbiased_plan = feature_aware.feature_aware_prior(design, bound, y, LO, HI,
                                                         dataclasses.replace(p, branch="unbiased"), s, anchored_rule)
    assert unbiased_plan.anchor is None
    for bad in (-0.1, 1.0):
        with pytest.raises(InputError, match="level_anchor_share"):
            dataclasses.replace(RULE, level_anchor_share=bad)


@pytest.mark.slow
def test_centre_levels_give_the_exact_intervals_of_the_rounded_centres(rng, monkeypatch):
    x, y = _data(rng, 3000)
    design, bound = public_design(x, 8)
    s = Secret.from_seed(3).for_epsilon(1.0)
    prior = linear_prior.linear_residual_prior(design, bound, y, LO, HI, 0.4, 0.1, s)
    captured = {}
    real = linear_prior.release

    def recording(params, secret, labels, **kwargs):
        captured["params"] = params
        return real(params, secret, labels, **kwargs)

    monkeypatch.setattr(linear_prior, "release", recording)
    linear_prior.release_around(prior, y, LO, HI, 0.5, s, "rpwithprior", levels=64)
    step = (HI - LO) / 64
    rounded = np.clip(LO + step * np.rint((prior.centres - LO) / step), LO, HI)
    assert np.unique(rounded).size <= 65 < prior.centres.size
    zeta = float(captured["params"].zeta[0])
    direct = fit_rpwithprior_per_row(residuals.shifted_priors(prior.edges, prior.mass, rounded, LO, HI), zeta, 0.5)
    np.testing.assert_array_equal(np.asarray(captured["params"].a1), np.asarray(direct.a1))
    np.testing.assert_array_equal(np.asarray(captured["params"].a2), np.asarray(direct.a2))


@pytest.mark.parametrize("mechanism, eps, components", slow_unless(
    [("rr-on-bins", 2.0, 4), ("unbiased", 2.0, 4), ("rr-on-bins", 0.02, 1), ("rr-on-bins", 0.01, None)],
    fast=[("rr-on-bins", 2.0, 4)]), ids=["rr-on-bins", "unbiased", "rr-on-bins-one-component", "rr-on-bins-no-features"])
def test_feature_prior_baselines_spend_autos_budget_and_release_each_label_once(mechanism, eps, components, rng,
                                                                                monkeypatch, histogram_epsilons):
    """At ε = 2 auto's plan on all 4 components; at 0.02 only one is affordable (the design auto uses); at 0.01 none
    is (auto goes to ``calibrated``, the comparison keeps its own 5% fit and half of ε for the histogram)."""
    released, real = [], feature_prior.release

    def recording(params, secret, labels, **kwargs):
        out = real(params, secret, labels, **kwargs)
        released.append((params, np.size(labels), out))
        return out

    monkeypatch.setattr(feature_prior, "release", recording)
    x, y = _data(rng, 4000)
    labels, record = pipeline(f"{mechanism}+feature-prior").run(x, y, LO, HI, eps, secret=Secret.from_seed(2))
    design, bound = auto.afforded_design(x, eps)
    p = auto.plan(eps, y.size, design.shape[1] - 1, bound, HI - LO)
    assert p.branch == ("calibrated" if components is None else "denoised" if eps < 1 else "unbiased")
    assert (record["components"], record["l1_bound"]) == (design.shape[1] - 1, bound)  # auto's design, every branch
    fit = spends(record, "linear-fit") + spends(record, "cell-mean")[:1]  # the cells' means: one ε, parallel
    eps_c = sum(spends(record, "slope"))
    if components is None:
        assert fit == [0.05 * eps] and eps_c == 0.0
        assert histogram_epsilons == pytest.approx([RULE.calibrated_prior_share * eps], abs=1e-15)
        eps2 = eps - fit[0] - RULE.calibrated_prior_share * eps
    else:
        assert design.shape[1] - 1 == components
        assert fit == [p.statistics_epsilon]
        assert histogram_epsilons == pytest.approx([p.residual_histogram_epsilon], abs=1e-15)
        eps2 = p.release_epsilon - eps_c  # auto's calibration of the fit, when it is made
    assert spends(record, "residual-histogram") == pytest.approx(histogram_epsilons, abs=1e-15)
    assert spends(record, "release") == pytest.approx([eps2] * record["groups"], abs=1e-12)
    assert fit[0] + spends(record, "residual-histogram")[0] + eps_c + eps2 == pytest.approx(eps, abs=1e-12)
    # the plan published with the release is the split it spent, on every branch (the calibrated one included)
    published = record["auto"]["plan"]
    assert published["statistics_epsilon"] == pytest.approx(fit[0], abs=1e-15)
    assert published["residual_histogram_epsilon"] == pytest.approx(spends(record, "residual-histogram")[0], abs=1e-15)
    assert published["release_epsilon"] == pytest.approx(eps_c + eps2, abs=1e-12)
    assert published["mechanism_epsilon"] == pytest.approx(eps2, abs=1e-12)
    assert sum(size for _, size, _ in released) == y.size and len(released) == record["groups"]
    grid = np.linspace(LO, HI, 201)
    for params, _, out in released:
        assert float(np.asarray(params.epsilon).reshape(-1)[0]) == pytest.approx(eps2, abs=1e-12)
        with jax.enable_x64(True):
            for o in out[:2]:
                logp = np.asarray(params.log_density(jnp.full(grid.shape, o), jnp.asarray(grid)))
                assert np.all(np.isfinite(logp)) and logp.max() - logp.min() <= eps2 + 1e-9
    assert labels.shape == y.shape and np.all(np.isfinite(labels))
    with pytest.raises(InputError, match="mechanism"):
        feature_prior.feature_prior_labels(x, y, LO, HI, 1.0, secret=Secret.from_seed(2), mechanism="laplace")


@pytest.mark.long
@pytest.mark.slow
def test_curves_on_a_users_file_reports_auto_next_to_the_baselines(tmp_path, rng, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rpwjax import cli
    from rpwjax.experiments.sweeps import read_rows

    x, y = _data(rng, 1500)
    path = tmp_path / "mine.parquet"
    pq.write_table(pa.table({"f0": x[:, 0], "f1": x[:, 1], "f2": x[:, 2], "f3": x[:, 3], "target": y}), path)
    rc = cli.main(["curves", "--data", str(path), "--label-column", "target", "--range", "0", "5",
                   "--mechanisms", "unbiased", "laplace", "--variants", "auto", "--epsilon", "1", "--seeds", "1",
                   "--epochs", "2", "--out", str(tmp_path / "out"), "--quiet"])
    assert rc == 0
    rows = read_rows(tmp_path / "out" / "results.csv")
    assert {r["mechanism"] for r in rows} >= {"auto", "unbiased", "laplace"}
    assert all(np.isfinite(r["test_mse"]) for r in rows)
    # --validation scores on held-out training rows: other numbers, same rows of the table
    rc = cli.main(["curves", "--data", str(path), "--label-column", "target", "--range", "0", "5",
                   "--mechanisms", "unbiased", "--variants", "auto", "--epsilon", "1", "--seeds", "1",
                   "--epochs", "2", "--validation", "--out", str(tmp_path / "val"), "--quiet"])
    assert rc == 0
    val = {r["mechanism"]: r["test_mse"] for r in read_rows(tmp_path / "val" / "results.csv")}
    test = {r["mechanism"]: r["test_mse"] for r in rows}
    assert set(val) == {"auto", "unbiased", "non-private"} and val["auto"] != test["auto"]
    # --validation-seed picks another held-out quarter (another fold); without --validation it is refused
    rc = cli.main(["curves", "--data", str(path), "--label-column", "target", "--range", "0", "5",
                   "--mechanisms", "unbiased", "--variants", "auto-unbiased", "--epsilon", "1", "--seeds", "1",
                   "--epochs", "2", "--validation", "--validation-seed", "11", "--out", str(tmp_path / "val11"),
                   "--quiet"])
    assert rc == 0
    other = {r["mechanism"]: r["test_mse"] for r in read_rows(tmp_path / "val11" / "results.csv")}
    assert set(other) == {"auto-unbiased", "unbiased", "non-private"} and other["unbiased"] != val["unbiased"]
    # --split-seed holds out other test rows (recorded in every row); with --validation, a fold of that split
    for extra, name in ((["--split-seed", "3"], "split3"), (["--split-seed", "3", "--validation"], "split3val")):
        rc = cli.main(["curves", "--data", str(path), "--label-column", "target", "--range", "0", "5",
                       "--mechanisms", "unbiased", "--variants", "auto", "--epsilon", "1", "--seeds", "1",
                       "--epochs", "2", *extra, "--out", str(tmp_path / name), "--quiet"])
        assert rc == 0
        got = read_rows(tmp_path / name / "results.csv")
        assert {r["split_seed"] for r in got} == {3} and {r["mechanism"] for r in got} == {"auto", "unbiased",
                                                                                            "non-private"}
        assert all(np.isfinite(r["test_mse"]) for r in got)
        assert {r["mechanism"]: r["test_mse"] for r in got}["auto"] not in (test["auto"], val["auto"])
    for extra, why in ((["--validation-seed", "3"], "does nothing without --validation"),
                       (["--split-seed", "-1"], "--split-seed must be an integer from 0 to 9223372036854775807, got --split-seed=-1"),
                       (["--validation", "--validation-seed", "-1"], "--validation-seed must be an integer from 0 to 9223372036854775807, got --validation-seed=-1")):
        rc = cli.main(["curves", "--data", str(path), "--label-column", "target", "--range", "0", "5",
                       "--mechanisms", "unbiased", "--epsilon", "1", "--out", str(tmp_path / "refused"), *extra])
        assert rc == 2 and why in capsys.readouterr().err
        assert not (tmp_path / "refused").exists()


def test_validation_split_never_holds_a_test_row():
    from rpwjax.experiments.datasets import load_dataset, train_test_split, validation_split

    split = train_test_split(load_dataset("crime"), seed=0)
    val = validation_split(split)
    assert np.intersect1d(val.train_index, split.test_index).size == 0
    assert np.intersect1d(val.test_index, split.test_index).size == 0
    assert np.array_equal(np.sort(np.concatenate([val.train_index, val.test_index])), np.sort(split.train_index))
    assert val.y_test.size == split.y_train.size // 4
    # another seed holds out another quarter of the same training rows
    other = validation_split(split, seed=11)
    assert np.array_equal(np.sort(np.concatenate([other.train_index, other.test_index])), np.sort(split.train_index))
    assert not np.array_equal(np.sort(other.test_index), np.sort(val.test_index))
    lookup = dict(zip(split.train_index, split.y_train))
    assert all(lookup[i] == y for i, y in zip(val.test_index, val.y_test))
    with pytest.raises(InputError, match="fraction"):
        validation_split(split, fraction=1.0)


# --------------------------------------------------------------------------- a user's table: features on purpose


def _id_table(path, rng, n=400):
    """A CSV with a zip code (leading zeros), an id, a 20-digit user id, text, a feature with gaps and one without."""
    lines = ["zip,row_id,user_id,city,age,x,y"]
    for i in range(n):
        age = "" if i % 13 == 0 else str(20 + i % 47)
        lines.append(f"0{2100 + i % 40},{i * 7 + 3},{12345678901234567000 + i},c{i % 5},{age},{rng.normal():.6f},"
                     f"{rng.uniform(LO, HI):.4f}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_privatize_table_leaves_identifiers_out_and_fills_gaps_and_curves_chooses_alike(tmp_path, rng, capsys):
    from rpwjax import cli
    from rpwjax.experiments.datasets import load_table
    from helpers import fixed_key, run

    src = _id_table(tmp_path / "t.csv", rng)
    key = fixed_key(tmp_path / "key")
    out = tmp_path / "o.csv"
    code, _, err = run(["privatize-table", src, "-o", out, "--label-column", "y", "--range", LO, HI, "--epsilon", "1",
                        "--key-file", key], capsys)
    assert code == 0, err
    side = __import__("json").loads((tmp_path / "o.csv.json").read_text())
    features = side["features"]
    assert features["used"] == ["age", "x"] and side["feature_columns"] == ["age", "x", "age_missing"]
    reasons = {r["column"]: r["reason"] for r in features["left_out"]}
    assert "leading zeros" in reasons["zip"] and "'02100'" in reasons["zip"]
    assert reasons["row_id"] == "integers all distinct: an identifier"
    assert "too long for float64" in reasons["user_id"] and "not numeric" in reasons["city"]
    [filled] = features["imputed"]
    observed = [20 + i % 47 for i in range(400) if i % 13]
    assert filled == {"column": "age", "missing": 31, "fill": "median of the observed values",
                      "fill_value": float(np.median(observed)), "indicator": "age_missing"}
    # said on stderr, one line each (used, left out, filled); --quiet says nothing
    said = [line for line in err.splitlines() if "features" in line]
    assert said[0] == "rpwjax privatize-table: features: using 2 column(s): age, x", err
    assert "left out 4 column(s): zip (leading zeros" in said[1] and "row_id (integers all distinct" in said[1]
    assert "age has 31 missing value(s): filled with the median" in said[2] and "age_missing" in said[2]
    code, _, err = run(["privatize-table", src, "-o", out, "--label-column", "y", "--range", LO, HI, "--epsilon", "1",
                        "--key-file", key, "--overwrite", "--quiet"], capsys)
    assert code == 0 and "features" not in err, err
    # curves --data reads the same table the same way (one shared function)
    lines = []
    data = load_table(src, "y", LO, HI, report=lines.append)
    assert data.feature_names == tuple(side["feature_columns"]) and lines[0].endswith("using 2 column(s): age, x")
    # --features and --exclude choose on purpose
    code, _, err = run(["privatize-table", src, "-o", out, "--label-column", "y", "--range", LO, HI, "--epsilon", "1",
                        "--key-file", key, "--overwrite", "--features", "x", "zip", "--quiet"], capsys)
    assert code == 0, err
    side = __import__("json").loads((tmp_path / "o.csv.json").read_text())
    assert side["features"]["used"] == ["zip", "x"] and side["features"]["chosen_by"] == "--features"
    code, _, err = run(["privatize-table", src, "-o", out, "--label-column", "y", "--range", LO, HI, "--epsilon", "1",
                        "--key-file", key, "--overwrite", "--exclude", "age", "--quiet"], capsys)
    assert code == 0, err
    side = __import__("json").loads((tmp_path / "o.csv.json").read_text())
    assert side["features"]["used"] == ["x"] and {"column": "age", "reason": "--exclude"} in side["features"]["left_out"]
    assert load_table(src, "y", LO, HI, exclude=["age"], report=lines.append).feature_names == ("x",)


def test_the_rule_is_one_frozen_object_that_reaches_the_decisions_the_sidecar_and_explain(rng, tmp_path, capsys):
    """Every number of the rule is a field of one frozen AutoRule: a rule passed in moves the decision it
    names; the sidecar records the rule and the whole plan; ``privatize-table --explain`` prints the rule and
    the public part of the plan (the one a real run starts from) and writes, reads and spends nothing; the
    fair comparison follows the public feature-aware functions, not auto's module."""
    import json

    import pyarrow as pa
    import pyarrow.csv as pacsv

    from rpwjax.pipelines.table import privatize_table
    from helpers import run

    with pytest.raises(dataclasses.FrozenInstanceError):
        RULE.afford_rho = 1.0  # type: ignore[misc]
    assert json.loads(json.dumps(RULE.to_json())) == RULE.to_json()
    x, y = _data(rng, 1500)
    public = auto.public_plan(x, y.size, LO, HI, 0.5)
    strict = dataclasses.replace(RULE, afford_rho=1e-6)  # no component affordable: the calibrated branch
    assert public.branch == "denoised" and auto.public_plan(x, y.size, LO, HI, 0.5, rule=strict).branch == "calibrated"
    assert not hasattr(feature_prior, "auto")  # the baseline imports the feature-aware prior, not auto

    src = tmp_path / "t.csv"
    pacsv.write_csv(pa.table({**{f"x{j}": x[:, j] for j in range(x.shape[1])}, "value": y}), src)
    out = tmp_path / "o.csv"
    code, shown, err = run(["privatize-table", src, "-o", out, "--label-column", "value", "--range", LO, HI,
                            "--epsilon", "0.5", "--explain", "--key-file", tmp_path / "no.key"], capsys)
    assert code == 0, err
    shown = json.loads(shown)
    assert shown["rule"] == RULE.to_json() and shown["rows"] == y.size
    assert shown["not_shown"] == ["fit", "calibration", "mechanism_epsilon", "groups", "anchor"]
    assert not set(shown["not_shown"]) & set(shown["plan"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]  # no output, no sidecar, no key, no ledger
    sidecar = privatize_table(src, out, label_column="value", lo=LO, hi=HI, epsilon=0.5, secret=Secret.from_seed(3))
    trace = sidecar["accounting"]["auto"]
    assert trace["rule"] == shown["rule"]
    assert {k: trace["plan"][k] for k in shown["plan"]} == shown["plan"]  # the labels did not move steps 1 to 3
    assert trace["plan"]["fit"]["estimator"] in ("sums", "cells") and trace["plan"]["calibration"] is not None
    released = [s["epsilon"] for s in sidecar["accounting"]["spends"] if s["purpose"] == "release"]
    assert released == [trace["plan"]["mechanism_epsilon"]]  # the plan's ε₂ is what the release spent
    code, _, err = run(["privatize-table", src, "-o", tmp_path / "p.csv", "--label-column", "value", "--range", LO,
                        HI, "--epsilon", "0.5", "--explain", "--pipeline", "linear-prior"], capsys)
    assert code != 0 and "--explain shows the auto rule's plan" in err and not (tmp_path / "p.csv").exists()


def test_explain_needs_no_output_and_a_release_needs_one(tmp_path, rng, capsys):
    import json

    import pyarrow as pa
    import pyarrow.csv as pacsv

    from helpers import run

    x, y = _data(rng, 300)
    src = tmp_path / "t.csv"
    pacsv.write_csv(pa.table({**{f"x{j}": x[:, j] for j in range(x.shape[1])}, "value": y}), src)
    args = ["privatize-table", src, "--label-column", "value", "--range", LO, HI, "--epsilon", "0.5"]
    code, shown, err = run([*args, "--explain"], capsys)
    assert code == 0, err
    assert json.loads(shown)["rule"] == RULE.to_json()
    code, _, err = run(args, capsys)
    assert code != 0 and "-o/--output" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]
