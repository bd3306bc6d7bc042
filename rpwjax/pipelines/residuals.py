"""Residual priors: an ε-DP histogram of residuals around a model, and the per-row priors it centres on
each row's prediction (post-processing of that one release)."""

from __future__ import annotations

import math

import numpy as np

from rpwjax.errors import check_epsilon
from rpwjax.keys import Secret
from rpwjax.mechanisms import entry
from rpwjax.accounting import Accounting, account
from rpwjax.priors import Prior, histogram_prior, histogram_release, histogram_spend, project_counts
from rpwjax.pipelines.rule import DEFAULT_RULE, AutoRule
from rpwjax.release_path import release


def _laplace_masses(edges, location, scale):
    """Masses of Laplace(location, scale) on bins ``edges`` (broadcast over leading axes), renormalised."""
    z = (edges - location[..., None]) / scale[..., None]
    cdf = np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0)), 1 - 0.5 * np.exp(-np.maximum(z, 0)))
    m = np.diff(cdf, axis=-1)
    return m / m.sum(axis=-1, keepdims=True)


def histogram_is_reliable(rows: int, epsilon: float, bins: int,
                          tolerance: float = DEFAULT_RULE.reliable_noise) -> bool:
    """Public rule: the noise (discrete Laplace, rate ε/2: scale about 2/ε) of a ``bins``-bin histogram of ``rows`` counts has relative
    L2 size sqrt(8·bins)/(ε·rows); trust the bins themselves when it is at most ``tolerance``."""
    return math.sqrt(8 * bins) / (epsilon * rows) <= tolerance


def release_bins(rows: int, epsilon: float, most: int, rule: AutoRule = DEFAULT_RULE) -> int:
    """Public rule for the residual release: the largest power of two <= ``most`` (at least
    ``rule.fewest_residual_bins``) with rows·ε/2/bins >= ``rule.rows_per_noise_per_bin`` (rows per unit of the
    noise scale 2/ε, per bin)."""
    k = rule.fewest_residual_bins
    while k * 2 <= most and rows * epsilon / 2 / (k * 2) >= rule.rows_per_noise_per_bin:
        k *= 2
    return k


def residual_histogram(residuals, width, epsilon, *, bins: int, secret: Secret, rule: AutoRule = DEFAULT_RULE,
                       accounting: Accounting | None = None):
    """ε-DP residual prior over the public [-width, width]: (edges, masses).

    One release: a noisy histogram of the residuals (:func:`rpwjax.priors.histogram_release`) on at most ``bins``
    bins (:func:`release_bins`). When it is reliable (:func:`histogram_is_reliable`, a rule on public numbers)
    its projected masses are the prior; otherwise a Laplace(μ, s) density is
    fitted to the noisy counts over a grid of (μ, s) (two
    parameters from all the bins: the noise averages out; least absolute
    deviations, the maximum-likelihood fit under Laplace noise) and its masses
    are the prior. Either way the prior is given on ``rule.residual_resolution``·``bins`` bins. The grid and
    every threshold are ``rule``'s. Post-processing of the one release, so the cost is ε: ``accounting``, if
    given, gets the entry "residual-histogram" over the rows it was given.
    """
    eps = float(check_epsilon(epsilon))
    r = np.asarray(residuals, np.float64)
    resolution = rule.residual_resolution
    fine = np.linspace(-width, width, int(bins) * resolution + 1)
    bins = release_bins(r.size, eps, int(bins), rule)
    edges = np.linspace(-width, width, bins + 1)
    if account(accounting) is not None:
        histogram_spend(accounting, "residual-histogram", eps, bins)
    noisy = histogram_release(r, edges, eps, secret)
    if histogram_is_reliable(r.size, eps, bins, rule.reliable_noise) and fine.size - 1 == bins * resolution:
        c = project_counts(noisy, r.size)
        mass = c / c.sum() if c.sum() > 0 else np.full(c.size, 1.0 / c.size)
        return fine, np.repeat(mass / resolution, resolution)
    span = rule.laplace_location_span
    locations = width * np.linspace(-span, span, rule.laplace_locations)
    scales = width * np.geomspace(*rule.laplace_scale_span, rule.laplace_scales)
    loc, sc = (g.ravel() for g in np.meshgrid(locations, scales, indexing="ij"))
    expected = r.size * _laplace_masses(edges, loc, sc)
    best = int(np.argmin(np.sum(np.abs(expected - noisy[None]), axis=1)))
    return fine, _laplace_masses(fine, loc[best : best + 1], sc[best : best + 1])[0]


def shifted_priors(edges, mass, centres, lo, hi, fallback: Prior | None = None) -> Prior:
    """Row i: the residual histogram shifted by ``centres[i]``, restricted to [lo, hi] (a batched Prior, (n, bins)).

    A row whose shifted histogram has no mass inside [lo, hi] takes ``fallback``
    (which must have as many bins), or the uniform prior.
    """
    edges = np.asarray(edges, np.float64)
    mass = np.asarray(mass, np.float64)
    c = np.asarray(centres, np.float64)[:, None]
    left = np.clip(edges[:-1][None] + c, lo, hi)
    right = np.clip(edges[1:][None] + c, lo, hi)
    m = mass[None] * (right - left) / (edges[1:] - edges[:-1])[None]
    total = m.sum(axis=1, keepdims=True)
    m = np.where(total > 0, m / np.where(total > 0, total, 1.0), 0.0)
    empty = total[:, 0] <= 0
    if empty.any():
        if fallback is not None and np.shape(fallback.mass)[-1] == mass.size:
            fl, fr, fm = (np.asarray(v, np.float64) for v in (fallback.left, fallback.right, fallback.mass))
        else:
            grid = np.linspace(lo, hi, mass.size + 1)
            fl, fr, fm = grid[:-1], grid[1:], np.full(mass.size, 1.0 / mass.size)
        left[empty], right[empty], m[empty] = fl, fr, fm
    return Prior(left, right, m, float(lo), float(hi), False, "feature-aware")


def censored_priors(edges, mass, centres, lo, hi) -> Prior:
    """Row i: the prior of y = clip(m_i + r, lo, hi), r from the residual histogram (uniform within its bins), on a
    public grid over [lo, hi] with as many bins as the histogram (a batched Prior, (n, bins), post-processing).

    The censored reading of the residual model: a residual that would take the label below lo (above hi) puts
    it at lo (hi), in the first (last) bin, as it does for labels clipped to the range, and zero-inflated labels
    whose spike sits at an end of the range. :func:`shifted_priors` instead drops that mass and renormalises
    (a truncated model): for a row whose centre is near an end of the range it moves the prior's mass away
    from that end, and with it the posterior mean. Every row's prior has mass 1: nothing is left empty.
    """
    edges = np.asarray(edges, np.float64)
    mass = np.asarray(mass, np.float64)
    c = np.asarray(centres, np.float64)
    lo, hi = float(lo), float(hi)
    if not (edges[0] <= lo - c.max() + 1e-12 * (hi - lo) and hi - c.min() <= edges[-1] + 1e-12 * (hi - lo)):
        raise ValueError(f"the residual histogram must cover [lo - m, hi - m] for every centre m: it spans "
                         f"[{edges[0]:g}, {edges[-1]:g}], the centres [{c.min():g}, {c.max():g}] in "
                         f"[lo, hi] = [{lo:g}, {hi:g}] need [{lo - c.max():g}, {hi - c.min():g}]")
    grid = np.linspace(lo, hi, mass.size + 1)
    return _grid_prior(_censored(np.interp(grid[None, :] - c[:, None], edges, _cdf(mass))), lo, hi)


def _cdf(mass):
    """The histogram's CDF at its edges (0 first, 1 last)."""
    cdf = np.concatenate([[0.0], np.cumsum(mass)])
    return cdf / cdf[-1]


def _censored(below):
    """Bin masses (rows, bins) from a law's CDF at the range's grid points (rows, bins + 1), censored at the
    range: all that lies below lo goes to the first bin, all above hi to the last."""
    below[..., 0], below[..., -1] = 0.0, 1.0
    m = np.maximum(np.diff(below, axis=-1), 0.0)
    return m / m.sum(axis=-1, keepdims=True)


def _grid_prior(masses, lo, hi) -> Prior:
    """A batched feature-aware Prior with ``masses`` (rows, bins) on the public grid of [lo, hi]."""
    grid = np.linspace(lo, hi, masses.shape[-1] + 1)
    shape = masses.shape
    return Prior(np.broadcast_to(grid[:-1], shape).copy(), np.broadcast_to(grid[1:], shape).copy(), masses, lo, hi,
                 False, "feature-aware")


def mean_matched_priors(edges, mass, centres, lo, hi, rule: AutoRule = DEFAULT_RULE) -> Prior:
    """Row i: the prior of y = clip(m_i + λ_i·(r - r̄), lo, hi), r from the residual histogram (uniform within its
    bins) and r̄ its mean, on the public grid of :func:`censored_priors`: the residual law centred on 0 and
    narrowed by λ_i, the largest of 1, ν, ν², ... (ν = ``rule.narrowing``, ``rule.narrowing_steps`` of them,
    then 0) for which the prior's mean is m_i to within half a bin of that grid (a point mass at m_i, λ = 0,
    always is). Post-processing.

    For a release that cannot move a label far from its prior's mean (auto's step 3 says when): the labels
    are then close to the priors' means, and a model trained on them learns those means. The centres are the
    private model's predictions of the label's mean; :func:`censored_priors` adds to them the residual law's
    location and what censoring a wide law at the range's ends does, both mostly noise when the residual
    histogram was released with a tiny ε. This prior keeps the centre as its mean and takes from the
    histogram only its shape, as wide as that allows."""
    edges = np.asarray(edges, np.float64)
    mass = np.asarray(mass, np.float64)
    c = np.asarray(centres, np.float64)
    lo, hi = float(lo), float(hi)
    cdf = _cdf(mass)
    mids = 0.5 * (edges[1:] + edges[:-1])
    shifted = edges - float(mids @ (mass / mass.sum()))  # the residual law centred on its mean
    grid = np.linspace(lo, hi, mass.size + 1)
    middle = 0.5 * (grid[1:] + grid[:-1])
    factors = np.concatenate([rule.narrowing ** np.arange(rule.narrowing_steps), [0.0]])  # widest first
    out = np.empty((c.size, mass.size))
    for i, m in enumerate(c):
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (grid[None, :] - m) / factors[:, None]  # (candidates, grid): the grid in residual units
        t = np.where(np.isnan(t), 0.0, t)  # λ = 0 at a grid point equal to m
        p = _censored(np.interp(t, shifted, cdf))  # censored as in censored_priors
        ok = np.abs(p @ middle - m) <= 0.5 * (hi - lo) / mass.size + 1e-12 * (hi - lo)
        out[i] = p[int(np.argmax(ok))]
    return _grid_prior(out, lo, hi)


def centre_groups(centres, groups: int = DEFAULT_RULE.groups) -> list[tuple[int, np.ndarray]]:
    """Rows grouped by their centre m(x) into ``groups`` quantile groups (a function of released values and
    public features: post-processing): ``(group number, row indices)`` of the non-empty groups, lowest
    centres first (tied centres can leave a group empty; the numbers keep their quantile's place)."""
    m = np.asarray(centres, np.float64)
    cuts = np.quantile(m, np.linspace(0, 1, int(groups) + 1)[1:-1])
    group = np.searchsorted(cuts, m, side="right")
    return [(int(g), np.flatnonzero(group == g)) for g in np.unique(group)]


def residual_clip_range(edges, mass, width, quantile: float = DEFAULT_RULE.clip_quantiles[0],
                        narrowest: float = DEFAULT_RULE.narrowest_range):
    """The public-by-post-processing residual range [c_lo, c_hi] of the unbiased residual release: the
    ``quantile`` and 1 - ``quantile`` quantiles of the residual prior, widened to at least ±``narrowest``·width."""
    cdf = np.concatenate([[0.0], np.cumsum(mass)])
    c_lo = float(np.interp(quantile, cdf, edges))
    c_hi = float(np.interp(1 - quantile, cdf, edges))
    return min(c_lo, -narrowest * width), max(c_hi, narrowest * width)


def clipping_error(edges, mass, c_lo, c_hi, support=None):
    """E[(clip(R, c_lo, c_hi) - R)²] for R from the residual prior (``edges`` strictly increasing, ``mass``;
    uniform within a bin), restricted to ``support`` = (s_lo, s_hi) (where the residuals can lie) and
    renormalised there; c_lo <= c_hi."""
    if not c_lo <= c_hi:
        raise ValueError(f"need c_lo <= c_hi, got {c_lo!r} > {c_hi!r}")
    edges = np.asarray(edges, np.float64)
    mass = np.asarray(mass, np.float64)
    a, b = edges[:-1], edges[1:]
    if support is not None:
        a2, b2 = np.clip(a, *support), np.clip(b, *support)
        mass = mass * (b2 - a2) / (b - a)
        a, b = a2, b2
    total = mass.sum()
    if total <= 0:
        return 0.0
    width = np.where(b > a, b - a, 1.0)

    def beyond(start, end, c):  # ∫ over [start, end] ∩ [c, ∞) of (r - c)² dr
        s = np.maximum(start, c)
        return np.where(end > s, ((end - c) ** 3 - (s - c) ** 3) / 3, 0.0)

    above = beyond(a, b, c_hi)
    below = beyond(-b, -a, -c_lo)
    per_bin = np.where(b > a, (above + below) / width, 0.0)
    return float(np.sum(mass * per_bin) / total)


def unbiased_residual_fit(edges, mass, width, epsilon, residual_range=None):
    """The optimal unbiased randomizer for residuals clipped to ``residual_range`` (default
    :func:`residual_clip_range`), fitted on the residual prior restricted to that range:
    ``(params, (c_lo, c_hi), info)`` (``info["label_mse"]`` is its exact E[(Ỹ - R)²] under that prior)."""
    c_lo, c_hi = residual_range if residual_range is not None else residual_clip_range(edges, mass, width)
    clipped = np.clip(edges, c_lo, c_hi)
    inner = clipped[1:] > clipped[:-1]
    masses = mass * (clipped[1:] - clipped[:-1]) / np.diff(edges)
    kept = np.concatenate([clipped[:-1][inner], clipped[1:][inner][-1:]])
    prior = histogram_prior(kept, masses[inner] + 1e-12)
    params, info = entry("unbiased").fit(prior, epsilon)
    return params, (c_lo, c_hi), info


def unbiased_residual_release(params, residual_range, centres, labels, secret: Secret, *,
                              accounting: Accounting | None = None):
    """``(centres + Ỹ, Ỹ)`` where Ỹ is the unbiased release of clip(y - centre, c_lo, c_hi): labels unbiased for
    ``centres + clip(y - centres)``, noise scaled to the residual range. One release per label (recorded in
    ``accounting``, if given, by :func:`rpwjax.release_path.release`)."""
    c_lo, c_hi = residual_range
    z = np.clip(np.asarray(labels, np.float64) - centres, c_lo, c_hi)
    noisy = release(params, secret, z, accounting=accounting)
    return centres + noisy, noisy
