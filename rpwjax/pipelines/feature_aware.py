r"""The feature-aware prior of the ``auto`` rule, steps 1 to 3 and step 4's first two releases: the public design,
the plan (branch and budget split) and the private linear fit with the residual histogram around it.

``auto`` (:mod:`rpwjax.pipelines.auto`) releases the labels under this prior; the fair comparison
(:mod:`rpwjax.pipelines.feature_prior`) gives the same prior to other mechanisms. Both call the public
functions here with an :class:`~rpwjax.pipelines.rule.AutoRule`, so a change to auto's release leaves the
comparison as it is, and a change to the prior changes both. The rule in words: docs/auto.md.

ρ(ε_s) = 2√2·B·√(k+1)/(ε_s·n) (:func:`relative_coefficient_noise`) is the ε_s-DP linear fit's coefficient
noise (standard deviation about √2·W·B/(ε_s·n)) over a coefficient's scale for a label of range W on k + 1
unit-variance columns (W/(2√(k+1))). Q = σ²_U(ε)·12/n (:func:`uniform_unbiased_variance`) is the noise a
model trained on n unbiased labels must average away, relative to a label's spread in the range (W²/12).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from rpwjax.accounting import Accounting
from rpwjax.errors import check_choice
from rpwjax.keys import Secret
from rpwjax.mechanisms import entry
from rpwjax.pipelines.linear_prior import (LinearResidualPrior, centre_levels, level_index, linear_centres,
                                          residual_prior_around)
from rpwjax.pipelines.residuals import censored_priors
from rpwjax.pipelines.rule import (BRANCHES, DEFAULT_RULE, AutoPlan, AutoRule, Calibration, Fallback, FitChoice,
                                   LevelAnchor)
from rpwjax.pipelines.statistics import (bounded_design, fit_mean_estimate, fit_noise_energy, fit_noise_ratio_quantile,
                                         fit_signal_to_noise, median_cells, principal_scores, private_mean,
                                         private_cell_fit, private_slope, slope_noise, winsorized_scores)
from rpwjax.priors import histogram_prior


def relative_coefficient_noise(rows: int, components: int, l1_bound: float, eps_s: float) -> float:
    """ρ(ε_s) = 2√2·B·√(k+1)/(ε_s·n): the linear fit's coefficient noise over a coefficient's scale."""
    return 2 * math.sqrt(2) * l1_bound * math.sqrt(components + 1) / (eps_s * rows)


def afforded_design(features, epsilon: float, *, scores=None, rule: AutoRule = DEFAULT_RULE):
    """Step 1's design: ``(design, bound)`` with the most principal components, up to ``rule.components``, whose
    linear fit can be afforded, ρ(``rule.afford_share``·ε) <= ``rule.afford_rho``. Every score is first clipped
    to its ``rule.score_quantile`` quantiles (:func:`~rpwjax.pipelines.statistics.winsorized_scores`: a
    heavy-tailed score keeps its spread in the bulk of the rows), and each count k has its own public L1 bound
    B_k (fewer components: a smaller B and fewer coefficients to pay for). When not even one component can be
    afforded, the design with all of them (step 1 then sends the data to ``calibrated``). Public features, ε
    and n only. ``scores``: the features' ``principal_scores(features, rule.components)`` when the caller
    already has them (one SVD for several ε); ``features`` is then not read."""
    scores = principal_scores(features, rule.components) if scores is None else np.asarray(scores, np.float64)
    scores = winsorized_scores(scores, rule.score_quantile)
    rows, most = scores.shape
    full = bounded_design(scores, rule.l1_bound_quantile)
    for k in range(most, 0, -1):
        design, bound = full if k == most else bounded_design(scores[:, :k], rule.l1_bound_quantile)
        if relative_coefficient_noise(rows, k, bound, rule.afford_share * float(epsilon)) <= rule.afford_rho:
            return design, bound
    return full


@functools.lru_cache(maxsize=256)
def uniform_unbiased_variance(epsilon: float, bins: int = DEFAULT_RULE.uniform_prior_bins) -> float:
    """Label variance of the Unbiased mechanism fitted to the uniform prior on [0, 1] at ``epsilon`` (scale by
    W² for a range of width W): a public number."""
    _, info = entry("unbiased").fit(histogram_prior(np.linspace(0.0, 1.0, bins + 1), np.full(bins, 1.0 / bins)),
                                    float(epsilon))
    return float(np.asarray(info["label_mse"]).reshape(-1)[0])


def plan(epsilon: float, rows: int, components: int, l1_bound: float, width: float,
         branch: str | None = None, rule: AutoRule = DEFAULT_RULE) -> AutoPlan:
    """Steps 1 to 3 of the rule, on public numbers: the branch and the budget split. ``branch`` fixes step 2
    (validation of the rule only).

    Step 1: ρ(afford_share·ε) above ``afford_rho``: branch ``calibrated`` (no features). Step 2: Q below
    ``unbiased_below``: ``unbiased``, else ``denoised``. Step 3: ``denoised`` gives the fit ε_s =
    ``statistics_share``·ε (``statistics_share_noisy``·ε where ρ at that share exceeds ``noisy_fit_rho``: the
    denoised labels lean on the fit) and the residual histogram ``histogram_share``·ε; where Q >=
    ``uninformative_release`` the release cannot inform a model even of the labels' mean, so the fit gets
    ``uninformative_statistics_share``·ε and the row priors are mean-matched; below that, where the residual
    histogram cannot be read (:func:`unreadable_histogram`), the split is the usual one, the row priors are
    mean-matched and the plan records the fallback (step 4 then buys a private mean). ``unbiased`` gives the fit
    the ε_s that brings ρ to ``target_rho``, held within ``unbiased_statistics_shares`` of ε, and the histogram
    ``unbiased_histogram_share``·ε: the centres only narrow the residual range, and the release's noise falls
    steeply with its ε. The release gets the rest."""
    if branch is not None:
        check_choice(branch, "branch", BRANCHES)
    eps = float(epsilon)
    rho = functools.partial(relative_coefficient_noise, rows, components, l1_bound)
    head = (eps, rows, components, l1_bound, width, rho(rule.afford_share * eps))
    if head[-1] > rule.afford_rho:
        eps1 = rule.calibrated_prior_share * eps
        return AutoPlan(*head, math.nan, "calibrated", 0.0, eps1, eps - eps1, branch)
    q = uniform_unbiased_variance(eps, rule.uniform_prior_bins) * 12 / rows  # σ²/(n·W²/12), W = 1
    if branch == "denoised" or (branch is None and q >= rule.unbiased_below):
        eps1 = rule.histogram_share * eps
        if q >= rule.uninformative_release:
            eps_s = rule.uninformative_statistics_share * eps
            return AutoPlan(*head, q, "denoised", eps_s, eps1, eps - eps_s - eps1, branch, "mean-matched")
        noisy = rho(rule.statistics_share * eps) > rule.noisy_fit_rho
        eps_s = (rule.statistics_share_noisy if noisy else rule.statistics_share) * eps
        fallback = unreadable_histogram(rows, eps1, rule)
        return AutoPlan(*head, q, "denoised", eps_s, eps1, eps - eps_s - eps1, branch,
                        "censored" if fallback is None else "mean-matched", fallback=fallback)
    low, high = rule.unbiased_statistics_shares
    eps_s = float(np.clip(rho(1.0) / rule.target_rho, low * eps, high * eps))  # ρ(ε_s) = ρ(1)/ε_s
    eps1 = rule.unbiased_histogram_share * eps
    return AutoPlan(*head, q, "unbiased", eps_s, eps1, eps - eps_s - eps1, branch)


def unreadable_histogram(rows: int, eps1: float, rule: AutoRule = DEFAULT_RULE) -> Fallback | None:
    """Step 3's fallback on the denoised branch (public numbers only): a :class:`~rpwjax.pipelines.rule.Fallback`
    when ``rule.unreadable_histogram_fallback`` is on and the residual histogram, even on its fewest bins
    (``rule.fewest_residual_bins``), would hold fewer than ``rule.rows_per_noise_per_bin`` rows per unit of
    noise scale per bin (rows·ε₁/2/bins: the histogram's own threshold for halving its bins, which it can no
    longer meet); else None. Such a histogram cannot be told from its noise: a Laplace law fitted to it can
    sit up to ``rule.laplace_location_span``·W off the residuals, and censored row priors would move every
    label's mean with it. The fallback keeps each prior's mean at the row's centre and moves the centres' mean
    to a private mean of the labels (``mean_epsilon``, a ``rule.fallback_mean_share`` of ε₁): both have noise
    known in advance."""
    readable = rows * eps1 / 2 / rule.fewest_residual_bins
    if not rule.unreadable_histogram_fallback or readable >= rule.rows_per_noise_per_bin:
        return None
    return Fallback("unreadable-histogram", float(readable), float(rule.rows_per_noise_per_bin),
                    float(rule.fallback_mean_share * eps1))


def linear_fit_choice(design, bound: float, width: float, eps_s: float,
                      rule: AutoRule = DEFAULT_RULE) -> tuple[FitChoice, np.ndarray | None]:
    """Step 4's choice of the ε_s-DP linear fit, on public numbers: the sums Xᵀ(y - c)
    (:func:`~rpwjax.pipelines.statistics.private_linear_fit`) or the labels' means in 2^k public cells
    (:func:`~rpwjax.pipelines.statistics.private_cell_fit` on :func:`~rpwjax.pipelines.statistics.median_cells`
    of the design's k scores, depth k). Each fit's noise puts a known expected energy into the centred
    predictions (:func:`~rpwjax.pipelines.statistics.fit_noise_energy`); the cells are chosen when theirs is at
    most ``rule.cell_noise_ratio`` of the sums'. A cell mean's noise does not grow with the L1 bound, the sums'
    does; but the cells see the design only through their mean rows, a coarser view (a bias the noise energies
    do not count), hence the ratio below 1, and only with at most ``rule.cell_components`` components (with
    more, no cells are formed). Returns the choice and the cell of each row (None without cells)."""
    k = design.shape[1] - 1
    sums = fit_noise_energy(design, width, bound, eps_s, prior_scale=rule.prior_scale)
    if k > rule.cell_components:
        return FitChoice("sums", None, sums, None), None
    cells = median_cells(design[:, 1:], k)
    by_cells = fit_noise_energy(design, width, bound, eps_s, cells=cells, prior_scale=rule.prior_scale)
    estimator = "cells" if by_cells <= rule.cell_noise_ratio * sums else "sums"
    return FitChoice(estimator, int(cells.max()) + 1, sums, by_cells), cells


def clipped_slope_error(alpha: float, noise: float) -> float:
    """E[(clip(α + X, 0, 1) - α)²] for X Laplace with standard deviation ``noise`` (scale b = noise/√2), α in
    [0, 1]: the error of a slope estimated with that noise and clipped to [0, 1], in closed form (below -α the
    clip leaves α², above 1 - α it leaves (1 - α)², in between X²)."""
    a = float(np.clip(alpha, 0.0, 1.0))
    b = float(noise) / math.sqrt(2.0)
    if not b > 0:
        return 0.0

    def inside(t):  # ∫_0^t x² e^{-x/b}/(2b) dx
        u = t / b
        return 0.5 * b * b * (2.0 - math.exp(-u) * (u * u + 2.0 * u + 2.0))

    tails = a * a * 0.5 * math.exp(-a / b) + (1 - a) ** 2 * 0.5 * math.exp(-(1 - a) / b)
    return tails + inside(a) + inside(1 - a)


def slope_is_worth_it(signal_to_noise: float, noise: float, rule: AutoRule = DEFAULT_RULE) -> bool:
    """Step 4's guard on the calibration: is a slope with noise of standard deviation ``noise`` worth its ε_c?

    The fit's ratio r says how much the slope should shrink the fit, to about α = r/(1 + r) (clipped to [0, 1]):
    kept as it is, the fit errs by (1 - α)² (in units of the centred predictions' energy), calibrated by
    :func:`clipped_slope_error`. Only a slope at least as noisy as ``rule.slope_noise_below`` may be skipped,
    and only when it is expected to err more than the fit kept as it is: the ratio is itself noisy, and less
    noisy slopes help more often than this comparison says. A pure-noise fit (α = 0) is always calibrated:
    even a very noisy slope, clipped, errs less than keeping the fit. Public numbers only."""
    if noise < rule.slope_noise_below:
        return True
    alpha = float(np.clip(signal_to_noise / (1 + signal_to_noise), 0.0, 1.0)) if signal_to_noise > -1 else 0.0
    return clipped_slope_error(alpha, noise) <= (1 - alpha) ** 2


def fit_cells_of(fit: FitChoice, cells):
    """The cells the released fit was computed on (None for the sums' fit)."""
    return cells if fit.estimator == "cells" else None


def calibration_threshold(design, bound: float, width: float, eps_s: float, cells,
                          rule: AutoRule = DEFAULT_RULE) -> float:
    """Step 4's trigger of the calibration, a signal-to-noise ratio: the fit is calibrated below it. The larger
    of ``rule.calibrate_below`` and q - 1, q the ``rule.calibrate_noise_quantile`` quantile of E/N when the fit
    is pure noise (:func:`~rpwjax.pipelines.statistics.fit_noise_ratio_quantile`; the ratio is E/N - 1): the
    fit's Laplace noise is heavy-tailed, and a fixed ratio is crossed by noise alone in about 1% of fits,
    which then go uncalibrated however little they predict. Infinite for a design with no column that varies
    (nothing to weigh; the ratio is infinite too). Public numbers only."""
    if rule.calibrate_noise_quantile <= 0:
        return float(rule.calibrate_below)
    q = fit_noise_ratio_quantile(design, width, bound, eps_s, rule.calibrate_noise_quantile, cells=cells,
                                 prior_scale=rule.prior_scale)
    return max(float(rule.calibrate_below), q - 1.0)


def feature_aware_prior(design, bound, y, lo, hi, p: AutoPlan, secret: Secret,
                        rule: AutoRule = DEFAULT_RULE, *,
                        accounting: Accounting | None = None) -> tuple[LinearResidualPrior, AutoPlan]:
    """Step 4's first releases, the feature-aware prior: ``(prior, plan)``, the plan with step 4's ``fit``,
    ``calibration`` and ``mechanism_epsilon`` set. ``p`` must not be on the calibrated branch.

    The ε_s-DP linear fit (:func:`linear_fit_choice`) gives centres m(x), clipped to the range. On the
    ``denoised`` branch, whose labels lean on the centres, a fit that may be mostly noise is calibrated: its
    signal-to-noise ratio, read off the released fit (post-processing), below :func:`calibration_threshold` moves
    ε_c = ``rule.calibration_share``·ε from the release to an ε_c-DP slope α of the labels on the centred
    centres m - m̄ (:func:`~rpwjax.pipelines.statistics.private_slope`), and the centres become m̄ + α(m - m̄),
    α clipped to [0, 1]: the fit kept where it predicts, pulled to a constant where it does not; unless the
    slope is too noisy to help (:func:`slope_is_worth_it` on
    :func:`~rpwjax.pipelines.statistics.slope_noise`, public numbers and the released centres), then nothing
    is paid. Where the plan names a fallback (:func:`unreadable_histogram`), its ``mean_epsilon`` (a share of ε₁)
    buys an ε-DP mean of the labels (:func:`~rpwjax.pipelines.statistics.private_mean`, purpose
    "fallback-mean") and the centres are moved, all by one shift, so that their mean is that mean combined with
    the fit's own by their known noise variances (:func:`fallback_mean`; then clipped to the range): the
    labels' overall level then rests on statistics whose noise is known in advance, not on the unreadable
    histogram's location. Then the ε₁-DP residual histogram around the centres (with what is
    left of ε₁). With censored row priors and ``rule.level_anchor_share`` above 0, that share of ε (ε_a, taken
    from the release) buys an ε_a-DP mean of the labels (purpose "level-anchor"), combined with the fit's own by
    their known noise variances (:func:`combined_mean`), and the centres are moved, all by one shift, until
    the censored row priors average to it (:func:`anchored_centres`): the labels' level then rests on
    statistics whose noise is known in advance, not on the histogram's location and noisy tails. Spent:
    ε_s + ε₁ + ε_c + ε_a; the release gets ``plan.mechanism_epsilon`` = ε - ε_s - ε₁ - ε_c - ε_a. Every
    release is recorded in ``accounting``, if given."""
    width, eps_s = hi - lo, p.statistics_epsilon
    fit, cells = linear_fit_choice(design, bound, width, eps_s, rule)
    if fit.estimator == "cells":
        theta, centre = private_cell_fit(design, y, lo, hi, eps_s, secret.child("statistics"), cells=cells,
                                         prior_scale=rule.prior_scale, accounting=accounting)
        m = np.clip(design @ theta + centre, lo, hi)
    else:
        theta, m = linear_centres(design, bound, y, lo, hi, eps_s, secret, rule, accounting=accounting)
    calibration = None
    if p.branch == "denoised":
        noise = fit.noise_cells if fit.estimator == "cells" else fit.noise_sums  # the ratio's denominator
        snr = fit_signal_to_noise(design, theta, width, bound, eps_s, noise=noise, prior_scale=rule.prior_scale)
        below = calibration_threshold(design, bound, width, eps_s, fit_cells_of(fit, cells), rule)
        calibration = Calibration(snr if math.isfinite(snr) else None, 0.0, 1.0, None,
                                  below if math.isfinite(below) else None)
        mean = float(np.mean(m))
        eps_c = rule.calibration_share * p.epsilon
        if snr < below and np.ptp(m) > 0:
            noise_c = slope_noise(m - mean, width, eps_c, clip_quantile=rule.slope_clip_quantile)
            calibration = dataclasses.replace(calibration, slope_noise=noise_c)
            if slope_is_worth_it(snr, noise_c, rule):
                raw = private_slope(m - mean, y, lo, hi, eps_c, secret.child("calibration"), centre=mean,
                                    clip_quantile=rule.slope_clip_quantile, accounting=accounting)
                alpha = float(np.clip(raw, 0.0, 1.0))
                m = mean + alpha * (m - mean)
                calibration = dataclasses.replace(calibration, epsilon=eps_c, slope=alpha)
    eps1 = p.residual_histogram_epsilon
    fallback = p.fallback
    fit_cells = fit_cells_of(fit, cells)
    if fallback is not None and fallback.mean_epsilon > 0:
        mean = private_mean(y, lo, hi, fallback.mean_epsilon, secret.child("fallback-mean"), accounting=accounting,
                            purpose="fallback-mean")
        fallback, mean = fallback_mean(design, theta, bound, width, eps_s, fit_cells, fallback, mean, y.size,
                                       0.5 * (lo + hi), rule)
        m = np.clip(m + (min(max(mean, lo), hi) - float(np.mean(m))), lo, hi)  # one shift for every row
        eps1 = eps1 - fallback.mean_epsilon
    anchor = target = None
    if p.branch == "denoised" and p.row_prior == "censored" and rule.level_anchor_share > 0:
        eps_a = rule.level_anchor_share * p.epsilon
        mean = private_mean(y, lo, hi, eps_a, secret.child("level-anchor"), accounting=accounting,
                            purpose="level-anchor")
        target, v_fit, v_private, weight = combined_mean(design, theta, bound, width, eps_s, fit_cells, mean, eps_a,
                                                         y.size, 0.5 * (lo + hi), rule)
        anchor = LevelAnchor(float(eps_a), math.sqrt(v_fit), math.sqrt(v_private), weight)
    prior = residual_prior_around(m, design, bound, y, lo, hi, eps1, secret,
                                  residual_bins=rule.residual_bins, rule=rule, accounting=accounting)
    if anchor is not None:
        prior = dataclasses.replace(prior, centres=anchored_centres(prior, lo, hi, target, rule))
    spent = (calibration.epsilon if calibration else 0.0) + (anchor.epsilon if anchor else 0.0)
    mechanism_epsilon = p.release_epsilon - spent if spent else p.release_epsilon
    return prior, dataclasses.replace(p, fit=fit, calibration=calibration, mechanism_epsilon=mechanism_epsilon,
                                      fallback=fallback, anchor=anchor)


def combined_mean(design, theta, bound: float, width: float, eps_s: float, cells, private: float, mean_epsilon: float,
                  rows: int, centre: float, rule: AutoRule = DEFAULT_RULE) -> tuple[float, float, float, float]:
    """The labels' mean from the two released estimates of it, ``(mean, v_fit, v_private, weight)``.

    The fit's own estimate, refitted without its ridge so that the labels do not pull it towards the range's
    middle (:func:`~rpwjax.pipelines.statistics.fit_mean_estimate`: variance ``v_fit`` from ε_s and the design;
    ``cells``: the fit was the cell fit), and the ``private`` mean bought with ``mean_epsilon`` (sensitivity W/n:
    variance ``v_private`` = 2·(W/(n·ε))²). With ``rule.fallback_mean_weighting`` "inverse-variance" they are
    combined with weights inverse to their variances, the least noisy unbiased combination; "private": the
    private mean alone (``weight`` is the private mean's). Post-processing of released statistics and public
    numbers."""
    own, v_fit = fit_mean_estimate(design, theta, width, bound, eps_s, cells=cells, prior_scale=rule.prior_scale)
    v_private = 2.0 * (width / (rows * mean_epsilon)) ** 2
    if rule.fallback_mean_weighting == "private" or not (math.isfinite(own) and math.isfinite(v_fit)):
        weight = 1.0  # (a fit whose mean cannot be read, e.g. an ill-conditioned design, is not weighed)
    else:  # "inverse-variance" (AutoRule checks the name)
        weight = v_fit / (v_fit + v_private)
    mean = private if weight == 1.0 else weight * private + (1.0 - weight) * (own + centre)
    return mean, v_fit, v_private, weight


def anchored_centres(prior: LinearResidualPrior, lo: float, hi: float, target: float,
                     rule: AutoRule = DEFAULT_RULE) -> np.ndarray:
    """The centres m moved by one shift δ, clip(m + δ, lo, hi), with δ such that the censored row priors'
    mean over the rows (:func:`~rpwjax.pipelines.residuals.censored_priors` on the centres rounded to
    ``rule.levels`` + 1 levels, as the release rounds them) is ``target`` (clipped to the range). Found by
    bisection: that mean does not decrease as δ grows. Post-processing."""
    lo, hi = float(lo), float(hi)
    m = np.asarray(prior.centres, np.float64)
    target = min(max(float(target), lo), hi)
    count = int(rule.levels)
    priors = censored_priors(prior.edges, prior.mass, centre_levels(count, lo, hi), lo, hi)  # each level's, once
    mass = np.asarray(priors.mass)
    means = np.sum(mass * 0.5 * (np.asarray(priors.left) + np.asarray(priors.right)), axis=-1) / mass.sum(-1)

    def level_mean(delta: float) -> float:  # rows counted per level: O(n), no sort
        return float(np.bincount(level_index(m + delta, count, lo, hi), minlength=count + 1) @ means) / m.size

    low, high = lo - float(m.max()), hi - float(m.min())  # beyond these every centre is at an end of the range
    for _ in range(60):
        mid = 0.5 * (low + high)
        if level_mean(mid) < target:
            low = mid
        else:
            high = mid
    return np.clip(m + 0.5 * (low + high), lo, hi)


def fallback_mean(design, theta, bound: float, width: float, eps_s: float, cells, fallback: Fallback,
                  private: float, rows: int, centre: float, rule: AutoRule = DEFAULT_RULE) -> tuple[Fallback, float]:
    """Step 4 of the fallback: where the centres' mean goes, ``(fallback, mean)``, the fallback with its noise
    numbers set.

    Two released statistics estimate the labels' mean, each with noise known before anything is released: the
    fit's own, refitted without its ridge so that the labels do not pull it towards the range's middle
    (:func:`~rpwjax.pipelines.statistics.fit_mean_estimate`: its variance follows from ε_s and the design;
    ``cells``: the fit was the cell fit), and the ``private`` mean bought with ``fallback.mean_epsilon``
    (sensitivity W/n: variance 2·(W/(n·ε))²). With ``rule.fallback_mean_weighting`` "inverse-variance" they are
    combined with weights inverse to their variances, the least noisy unbiased combination (a fit whose sums
    average many rows can be far steadier than a mean bought with half of a small ε₁, and a fit of few rows
    the reverse); "private": the private mean alone. Post-processing of released statistics and public
    numbers."""
    mean, v_fit, v_private, weight = combined_mean(design, theta, bound, width, eps_s, cells, private,
                                                   fallback.mean_epsilon, rows, centre, rule)
    return dataclasses.replace(fallback, fit_mean_noise=math.sqrt(v_fit), private_mean_noise=math.sqrt(v_private),
                               private_mean_weight=weight), mean
