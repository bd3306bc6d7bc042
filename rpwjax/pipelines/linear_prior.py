r"""The linear prior (:func:`linear_prior_labels`, no split): an ε_s-DP linear
model from exact integer noise on Xᵀy over public, clipped principal components
(:func:`private_linear_fit`) centres every row's prior; then a residual prior
(ε₁) and one release per label (ε₂): a per-row exact RPWithPrior interval and
denoising, or the unbiased residual release. Each label is read by the three
releases: ε_s + ε₁ + ε₂ = ε (sequential composition).

The two steps are public functions so that :mod:`rpwjax.pipelines.auto` can
decide between the releases after the first two (post-processing):
:func:`linear_residual_prior` and :func:`release_around`.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from rpwjax.accounting import Accounting, record_fields
from rpwjax.errors import InputError, check_epsilon, check_integer, check_labels, check_range
from rpwjax.keys import Secret, check_secret
from rpwjax.mechanisms.rpwithprior import RPWithPrior, choose_zeta, fit_rpwithprior_per_row
from rpwjax.pipelines.residuals import (censored_priors, mean_matched_priors, residual_histogram, shifted_priors,
                                       unbiased_residual_fit, unbiased_residual_release)
from rpwjax.pipelines.rule import DEFAULT_RULE, AutoRule
from rpwjax.pipelines.statistics import private_linear_fit, public_design
from rpwjax.posterior import posterior_mean_per_row
from rpwjax.priors import DEFAULT_BINS, histogram_prior
from rpwjax.release_path import release, sidecar_fields
from rpwjax.sampling import check_release_epsilon

STAGE2 = ("rpwithprior", "unbiased")
LEVEL_ROW_BLOCK = 1 << 13  # rows whose priors are gathered at once (a multiple of the posterior's row chunk)


@dataclasses.dataclass(frozen=True)
class LinearResidualPrior:
    """What the first two releases give: per-row centres m (the private linear model, clipped to the range) and
    the private residual prior (``edges``, ``mass``) around them."""

    centres: np.ndarray
    edges: np.ndarray
    mass: np.ndarray
    components: int
    l1_bound: float


def linear_residual_prior(design, bound, labels, lo, hi, eps_s, eps1, secret: Secret, *,
                          residual_bins: int = DEFAULT_BINS, rule: AutoRule = DEFAULT_RULE,
                          accounting: Accounting | None = None) -> LinearResidualPrior:
    """Releases 1 and 2: the ε_s-DP linear fit (child secret "statistics") and the ε₁-DP residual histogram
    around it (child secret "residual-histogram"), their numbers ``rule``'s. ``secret`` is the pipeline's per-ε
    secret; both releases are recorded in ``accounting``, if given."""
    _, m = linear_centres(design, bound, labels, lo, hi, eps_s, secret, rule, accounting=accounting)
    return residual_prior_around(m, design, bound, labels, lo, hi, eps1, secret, residual_bins=residual_bins,
                                 rule=rule, accounting=accounting)


def linear_centres(design, bound, labels, lo, hi, eps_s, secret: Secret, rule: AutoRule = DEFAULT_RULE, *,
                   accounting: Accounting | None = None):
    """Release 1: the ε_s-DP linear fit (child secret "statistics" of the pipeline's per-ε ``secret``; its ridge's
    prior scale ``rule.prior_scale``): ``(θ, m)`` with the centres m = design·θ + c clipped to [lo, hi] (c the
    range's midpoint)."""
    theta, centre = private_linear_fit(design, labels, lo, hi, eps_s, secret.child("statistics"), bound=bound,
                                       prior_scale=rule.prior_scale, accounting=accounting)
    return theta, np.clip(design @ theta + centre, lo, hi)


def residual_prior_around(centres, design, bound, labels, lo, hi, eps1, secret: Secret, *,
                          residual_bins: int = DEFAULT_BINS, rule: AutoRule = DEFAULT_RULE,
                          accounting: Accounting | None = None) -> LinearResidualPrior:
    """Release 2: the ε₁-DP histogram of the residuals y - m (child secret "residual-histogram"; its grid and
    thresholds ``rule``'s)."""
    edges, mass = residual_histogram(labels - centres, hi - lo, eps1, bins=residual_bins,
                                     secret=secret.child("residual-histogram"), rule=rule, accounting=accounting)
    return LinearResidualPrior(centres, edges, mass, int(design.shape[1] - 1), float(bound))


def release_around(prior: LinearResidualPrior, labels, lo, hi, eps2, secret: Secret, stage2: str, *,
                   unbiased_fit=None, levels: int | None = None, row_prior: str = "truncated",
                   rule: AutoRule = DEFAULT_RULE, accounting: Accounting | None = None):
    """Release 3 (child secret "release"), once per label: ``(labels, fields)``.

    ``stage2="rpwithprior"``: RPWithPrior with a per-row exact interval under the row's prior (the residual
    prior shifted to its centre), denoised under that prior. ``stage2="unbiased"``: the unbiased residual
    release (:func:`~rpwjax.pipelines.residuals.unbiased_residual_release`), not denoised; ``unbiased_fit`` is
    the ``unbiased_residual_fit`` result when the caller has it already. ``levels`` (default ``rule.levels``):
    the centres are first rounded to ``levels`` + 1 public levels across [lo, hi] (post-processing,
    :func:`release_on_levels`), so that RPWithPrior's interval search and certificate run once per level, not
    once per row (what makes a million rows take seconds). ``row_prior``
    (:data:`ROW_PRIORS`): "truncated", the residual prior shifted to m and cut to the range
    (:func:`~rpwjax.pipelines.residuals.shifted_priors`); "censored", the law of y = clip(m + r)
    (:func:`~rpwjax.pipelines.residuals.censored_priors`); "mean-matched", the censored one with the residual
    law centred and narrowed until its mean is the row's centre
    (:func:`~rpwjax.pipelines.residuals.mean_matched_priors`, narrowed by ``rule``'s factors). The release is
    recorded in ``accounting``, if given.
    """
    if stage2 not in STAGE2:
        raise InputError(f"stage2 must be one of {', '.join(STAGE2)}, got stage2={stage2!r}")
    row_priors = row_prior_builder(row_prior, rule)
    if stage2 == "unbiased":
        params, residual_range, _ = unbiased_fit or unbiased_residual_fit(prior.edges, prior.mass, hi - lo, eps2)
        out, _ = unbiased_residual_release(params, residual_range, prior.centres, labels, secret.child("release"),
                                           accounting=accounting)
        return out, {"residual_range": list(residual_range), "denoised": False, "release": sidecar_fields(params)}
    zeta = float(choose_zeta(histogram_prior(prior.edges, prior.mass), eps2)[0])
    levels = rule.levels if levels is None else levels
    out, params, _ = release_on_levels(lambda c: row_priors(prior.edges, prior.mass, c, lo, hi), prior.centres, labels,
                                       lo, hi, zeta, eps2, secret.child("release"), levels, accounting=accounting)
    return out, {"zeta": zeta, "denoised": True, "row_prior": row_prior, "levels": levels + 1,
                 "release": sidecar_fields(params)}


def release_on_levels(priors_at, centres, labels, lo, hi, zeta, eps2, secret: Secret, levels: int, *,
                      accounting: Accounting | None = None):
    """Per-row RPWithPrior, each row's centre rounded to ``levels`` + 1 public levels: ``(denoised, params,
    outputs)``.

    ``priors_at(level_centres)`` gives the batched prior of each distinct level (post-processing of the
    centres); a row's prior, interval and certificate are its level's, so the interval search and the
    release's certificate run once per level, not once per row (at a large ε no closed-form bound certifies
    the per-row intervals and each distinct one gets the realized check). The release reads ``labels`` once
    under ``secret`` (recorded in ``accounting``, if given); the output is denoised under the row's prior.
    """
    levels = check_integer(levels, "levels", 1)
    centres = centre_levels(levels, lo, hi)[level_index(centres, levels, lo, hi)]
    unique, inverse = np.unique(centres, return_inverse=True)
    level_priors = priors_at(unique)
    fitted = fit_rpwithprior_per_row(level_priors, zeta, eps2)
    params = dataclasses.replace(fitted, epsilon=fitted.epsilon[inverse], zeta=fitted.zeta[inverse],
                                 a1=fitted.a1[inverse], a2=fitted.a2[inverse])
    noisy = release(params, secret, labels, accounting=accounting)
    # a row's prior is its level's: gathered a block of rows at a time, never (rows, bins) for every row at once
    left, right, mass = (np.asarray(v) for v in (level_priors.left, level_priors.right, level_priors.mass))
    out = np.empty(noisy.shape, np.float64)
    for i in range(0, out.size, LEVEL_ROW_BLOCK):
        rows, at = inverse[i:i + LEVEL_ROW_BLOCK], slice(i, i + LEVEL_ROW_BLOCK)
        block_params = dataclasses.replace(params, epsilon=params.epsilon[at], zeta=params.zeta[at],
                                           a1=params.a1[at], a2=params.a2[at])
        block_priors = dataclasses.replace(level_priors, left=left[rows], right=right[rows], mass=mass[rows])
        out[at] = posterior_mean_per_row(block_params, block_priors, noisy[at])
    return out, params, noisy


def centre_levels(levels: int, lo: float, hi: float) -> np.ndarray:
    """The ``levels`` + 1 public levels the denoised release rounds centres to: lo + k·(hi - lo)/levels,
    k = 0 .. levels, clipped to [lo, hi]."""
    lo, hi = float(lo), float(hi)
    return np.clip(lo + (hi - lo) / int(levels) * np.arange(int(levels) + 1), lo, hi)


def level_index(centres, levels: int, lo: float, hi: float) -> np.ndarray:
    """Each centre's nearest level of :func:`centre_levels` (its index), centres clipped to [lo, hi] first."""
    lo, hi = float(lo), float(hi)
    step = (hi - lo) / int(levels)
    index = np.rint((np.clip(np.asarray(centres, np.float64), lo, hi) - lo) / step).astype(np.int64)
    return np.clip(index, 0, int(levels))


ROW_PRIORS = ("truncated", "censored", "mean-matched")


def row_prior_builder(name: str, rule: AutoRule = DEFAULT_RULE):
    """The residuals function that builds row priors of kind ``name`` (:data:`ROW_PRIORS`), looked up when called
    (the mean-matched one narrows by ``rule``'s factors)."""
    if name not in ROW_PRIORS:
        raise InputError(f"row_prior must be one of {', '.join(ROW_PRIORS)}, got row_prior={name!r}")
    mean_matched = functools.partial(mean_matched_priors, rule=rule)
    return {"truncated": shifted_priors, "censored": censored_priors, "mean-matched": mean_matched}[name]


def check_features(features, y) -> np.ndarray:
    x = np.asarray(features, np.float64)
    if x.ndim != 2 or x.shape[0] != y.size:
        raise InputError(f"features must be (n, d) with one row per label, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise InputError("features must be finite numbers")
    return x


def linear_prior_labels(features, labels, lo, hi, epsilon, *, secret: Secret, stats_fraction: float = 0.4,
                        prior_fraction: float = 0.1, components: int = 8, residual_bins: int = DEFAULT_BINS,
                        stage2: str = "rpwithprior", levels: int = DEFAULT_RULE.levels):
    """Private labels whose per-row prior is centred on a private linear model (no split).

    Every label is read three times: by the sufficient statistic Xᵀy of a linear
    model (ε_s = ``stats_fraction``·ε), by a residual histogram around that
    model (ε₁ = ``prior_fraction``·ε), and by its own output (ε₂ = ε - ε_s - ε₁;
    :func:`release_around` with ``stage2``; RPWithPrior's centres rounded to
    ``levels`` + 1 public levels, as ``auto`` rounds them).
    Sequential composition: ε per label. Returns ``(labels, record)``.
    """
    if stage2 not in STAGE2:
        raise InputError(f"stage2 must be one of {', '.join(STAGE2)}, got stage2={stage2!r}")
    lo, hi = check_range(lo, hi)
    eps = float(check_epsilon(epsilon))
    if not (0 < stats_fraction and 0 < prior_fraction and stats_fraction + prior_fraction < 1):
        raise InputError(f"need stats_fraction, prior_fraction > 0 with a sum < 1, got {stats_fraction}, {prior_fraction}")
    y = check_labels(labels, lo, hi)
    x = check_features(features, y)
    secret = check_secret(secret).for_epsilon(eps)
    eps_s, eps1 = stats_fraction * eps, prior_fraction * eps
    eps2 = eps - eps_s - eps1
    if stage2 == "rpwithprior":  # a release at an ε no float64 release can certify: refused before any draw
        check_release_epsilon(RPWithPrior, eps2, f"[{lo:.17g}, {hi:.17g}]")
    design, bound = public_design(x, components)
    accounting = Accounting(y.size, eps)
    prior = linear_residual_prior(design, bound, y, lo, hi, eps_s, eps1, secret, residual_bins=residual_bins,
                                  accounting=accounting)
    out, fields = release_around(prior, y, lo, hi, eps2, secret, stage2, levels=levels, accounting=accounting)
    record = {"pipeline": "linear-prior", "mechanism": stage2, "components": prior.components,
              "l1_bound": prior.l1_bound, **fields, **record_fields(accounting)}
    return out, record
