"""Private statistics the pipelines centre their priors on: a mean and a linear model, each with exact
integer noise (rounded to public levels, then discrete Laplace), and the public feature design."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from rpwjax.accounting import Accounting, account
from rpwjax.errors import InputError, check_epsilon, check_labels, check_range
from rpwjax.keys import Secret, check_secret
from rpwjax.noise import BitStream, discrete_laplace
from rpwjax.pipelines.rule import DEFAULT_RULE

MEAN_RESOLUTION = 1 << 20  # labels are rounded to (hi - lo) / this before the private sum


def private_mean(labels, lo, hi, epsilon, secret: Secret, *, accounting: Accounting | None = None,
                 purpose: str = "mean") -> float:
    """ε-DP mean of labels in the public [lo, hi], clipped to [lo, hi]; exact integer noise.

    Each label is rounded to one of R + 1 levels q_i = round(R (y_i - lo)/(hi - lo)) (R =
    :data:`MEAN_RESOLUTION`), so replacing one label moves the integer sum Σ q_i by at most R;
    discrete Laplace noise of rate ε/R makes the sum ε-DP. Noise scale (hi - lo)/(n ε) as for the
    continuous Laplace mean; rounding moves the mean by at most (hi - lo)/(2R). ``accounting``, if given, gets
    the entry (``purpose``) over the rows it was given.
    """
    lo, hi = check_range(lo, hi)
    eps = float(check_epsilon(epsilon))
    check_secret(secret)
    y = check_labels(labels, lo, hi)
    if account(accounting) is not None:
        accounting.spend(purpose, eps, sensitivity=f"{MEAN_RESOLUTION} on the integer sum of the labels at "
                         f"{MEAN_RESOLUTION} + 1 levels of the range",
                         mechanism=f"discrete Laplace of rate epsilon/{MEAN_RESOLUTION} on that sum")
    q = np.rint(MEAN_RESOLUTION * (y - lo) / (hi - lo)).astype(np.int64)
    z = discrete_laplace(Fraction(eps) / MEAN_RESOLUTION, BitStream(secret, "mean", epsilon=eps))
    total = int(q.sum()) + z
    return float(np.clip(lo + (hi - lo) * total / (MEAN_RESOLUTION * y.size), lo, hi))


def public_design(features, components: int = DEFAULT_RULE.components):
    """Public transform of the features: top principal components scaled to unit variance, an intercept, and
    every row's L1 norm clipped to a quantile of the norms (features are public under label-DP).
    ``(design, bound)``: :func:`bounded_design` of :func:`principal_scores`."""
    return bounded_design(principal_scores(features, components))


def principal_scores(features, components: int = DEFAULT_RULE.components):
    """The features' top ``components`` principal component scores (columns centred), each scaled to unit
    variance (a constant score is left at zero): (n, k), k = min(components, number of columns)."""
    x = np.asarray(features, np.float64)
    x = x - x.mean(axis=0)
    k = int(min(components, x.shape[1]))
    vt = np.linalg.svd(x, full_matrices=False)[2]
    return _unit_variance(x @ vt[:k].T)


def _unit_variance(z):
    """Columns of ``z`` divided by their standard deviation (a constant column is left as it is)."""
    scale = z.std(axis=0)
    return z / np.where(scale > 0, scale, 1.0)


def winsorized_scores(scores, quantile: float):
    """Each column of ``scores`` clipped to its own ``quantile`` and 1 - ``quantile`` quantiles, then centred and
    scaled to unit variance again (a column left constant stays at zero). Public features only.

    A score whose variance comes from a few extreme rows (a heavy-tailed feature) is otherwise left with
    almost no spread in the bulk of the rows once :func:`bounded_design` shrinks the rows of large L1 norm,
    which are those same rows: its column in the bounded design then carries little signal and a nearly
    singular direction of XᵀX, along which the private fit's noise is amplified. Clipped first, it keeps the
    bulk's spread and the bound no longer falls on it."""
    z = np.asarray(scores, np.float64)
    q = float(quantile)
    if not 0.0 <= q < 0.5:
        raise InputError(f"quantile must lie in [0, 0.5), got quantile={quantile!r}")
    if q > 0:
        z = np.clip(z, np.quantile(z, q, axis=0), np.quantile(z, 1 - q, axis=0))
    return _unit_variance(z - z.mean(axis=0))


def bounded_design(scores, quantile: float = DEFAULT_RULE.l1_bound_quantile):
    """An intercept and the ``scores``, every row's L1 norm clipped to the ``quantile`` quantile of the norms:
    ``(design, bound)``, bound that quantile (the public L1 bound of the private fits' sensitivity)."""
    z = np.asarray(scores, np.float64)
    design = np.concatenate([np.ones((z.shape[0], 1)), z], axis=1)
    norms = np.abs(design).sum(axis=1)
    bound = float(np.quantile(norms, quantile))
    design = design * np.minimum(1.0, bound / norms)[:, None]
    return design, bound


STATISTIC_RESOLUTION = 1 << 20  # terms of X^T(y - c) are rounded to (hi - lo)·bound / this


def private_linear_fit(design, labels, lo, hi, epsilon, secret: Secret, *, bound: float,
                       accounting: Accounting | None = None, prior_scale: float = DEFAULT_RULE.prior_scale):
    """ε-DP least squares with public features: only Xᵀ(y - c) reads the labels (c the range midpoint).

    Replacing one label changes Xᵀy by x_i (y - y'), |y - y'| <= hi - lo and ||x_i||₁ <= ``bound``:
    L1 sensitivity (hi - lo)·bound. Released exactly in integers: every term x_ij (y_i - c) is rounded
    to a multiple of (hi - lo)·bound/R (R = :data:`STATISTIC_RESOLUTION`), so one label moves the d
    integer sums by at most R + d in L1, and discrete Laplace noise of rate ε/(R + d) per coordinate
    makes them ε-DP (noise scale b = (hi - lo)·bound/ε up to a factor 1 + d/R). XᵀX is public. The ridge
    λ = 2b²/(τ² n), τ = ``prior_scale``·(hi - lo), is the posterior mean for coefficients of prior scale τ under
    noise of variance 2b² (a rule on public numbers: the noise is known, the labels are not read).
    Returns θ (predict with ``design @ θ + c``). ``accounting``, if given, gets the entry "linear-fit"."""
    eps, lo, hi, y, design = _fit_inputs(design, labels, lo, hi, epsilon, secret)
    norms = np.abs(design).sum(axis=1)
    if np.any(norms > bound * (1 + 1e-12)):
        raise InputError(f"every design row must have L1 norm <= bound={bound!r}, got {float(norms.max())!r}")
    if account(accounting) is not None:
        d = design.shape[1]
        accounting.spend("linear-fit", eps, sensitivity=f"{STATISTIC_RESOLUTION} + {d} in L1 on the {d} integer "
                         f"sums of X^T(y - c) (unit (hi - lo)·{bound:g}/{STATISTIC_RESOLUTION}): L1 bound {bound:g}",
                         mechanism=f"discrete Laplace of rate epsilon/({STATISTIC_RESOLUTION} + {d}) per sum")
    centre = 0.5 * (lo + hi)
    unit = (hi - lo) * bound / STATISTIC_RESOLUTION
    noisy = _noisy_sums(design, y, centre, unit, eps, BitStream(secret, "statistics", epsilon=eps))
    d = design.shape[1]
    _, ridge = _fit_noise(d, y.size, hi - lo, bound, eps, prior_scale)
    gram = design.T @ design + ridge * np.eye(d)
    return np.linalg.solve(gram, noisy.astype(np.float64) * unit), centre


def _fit_inputs(design, labels, lo, hi, epsilon, secret):
    """The checked inputs of a private linear fit: ``(ε, lo, hi, labels, design)``, one design row per label."""
    eps = float(check_epsilon(epsilon))
    lo, hi = check_range(lo, hi)
    check_secret(secret)
    y = check_labels(labels, lo, hi)
    design = np.asarray(design, np.float64)
    if design.ndim != 2 or design.shape[0] != y.size:
        raise InputError(f"design must be (n, d) with one row per label, got shape {design.shape}")
    return eps, lo, hi, y, design


def _noisy_sums(weights, y, centre, unit, eps, stream):
    """ε-DP integer sums Σ_i w_ij (y_i - centre), one per column j of ``weights`` (n, d): every term rounded to a
    multiple of ``unit``, which the caller picks so that one label moves a column's unrounded sum by at most
    R·unit in L1 over the columns (R = :data:`STATISTIC_RESOLUTION`); rounding adds at most 1 per column, so
    discrete Laplace noise of rate ε/(R + d) per column makes the d sums ε-DP."""
    terms = np.rint(weights * (y - centre)[:, None] / unit).astype(np.int64)
    d = weights.shape[1]
    rate = Fraction(eps) / (STATISTIC_RESOLUTION + d)
    return terms.sum(axis=0) + np.array([discrete_laplace(rate, stream) for _ in range(d)], np.int64)


def _fit_noise(d: int, rows: int, width: float, bound: float, eps: float, prior_scale: float):
    """The linear fit's noise scale b per coordinate of Xᵀ(y - c) (variance about 2b²) and its ridge λ for
    coefficients of prior scale ``prior_scale``·width."""
    b = width * bound / eps * (1 + d / STATISTIC_RESOLUTION)
    return b, 2 * b**2 / ((prior_scale * width) ** 2 * rows)


def _fit_covariance_parts(design, width: float, bound: float, epsilon: float, cells, prior_scale: float):
    """The ε-DP linear fit's ridged Gram matrix G and the noise covariance of Gθ, ``(G, middle)``, so that
    Cov(θ) = G⁻¹·middle·G⁻¹: for :func:`private_linear_fit` G = XᵀX + λI and middle the scalar 2b² (Gθ is the
    noisy Xᵀ(y - c), each sum's noise of variance 2b²); for :func:`private_cell_fit` G = ZᵀΩZ + I/τ² and
    middle = ZᵀΩZ (Gθ is ZᵀΩ(m̃ - c))."""
    rows, d = design.shape
    if cells is None:
        b, ridge = _fit_noise(d, rows, float(width), float(bound), float(epsilon), prior_scale)
        return design.T @ design + ridge * np.eye(d), 2 * b**2
    z, weight, _ = _cell_system(design, cells, float(width), float(epsilon))
    information = z.T @ (z * weight[:, None])
    return information + np.eye(d) / (prior_scale * float(width)) ** 2, information


def fit_noise_energy(design, width: float, bound: float, epsilon: float, *, cells=None,
                     prior_scale: float = DEFAULT_RULE.prior_scale) -> float:
    """The expected energy N that an ε-DP linear fit's noise alone puts into the centred predictions X̄θ (X̄ the
    design with its columns centred): tr(Cov(θ)·X̄ᵀX̄). Public numbers only (the design, the range's width,
    the bound, ε, the cells).

    ``cells=None``: :func:`private_linear_fit`, Cov(θ) = 2b²·G⁻², G = XᵀX + λI (b and λ of that function).
    ``cells`` (a cell index per row): :func:`private_cell_fit`, Cov(θ) = A⁻¹ZᵀΩZA⁻¹ with its Z, Ω and A.
    ``prior_scale``: the fits' (their ridge's prior scale over the width)."""
    design = np.asarray(design, np.float64)
    centred = design - design.mean(axis=0)
    gram, middle = _fit_covariance_parts(design, width, bound, epsilon, cells, prior_scale)
    inverse = np.linalg.inv(gram)
    if cells is None:
        return middle * float(np.trace(inverse @ (centred.T @ centred) @ inverse))
    return float(np.trace(inverse @ middle @ inverse @ (centred.T @ centred)))


NOISE_LAW_DRAWS = 100_000  # draws of the fit's noise behind fit_noise_ratio_quantile ...
NOISE_LAW_SEED = 20261206  # ... from a fixed, public seed: a numerical integral of a public law, not a release


def fit_noise_ratio_quantile(design, width: float, bound: float, epsilon: float, quantile: float, *, cells=None,
                             prior_scale: float = DEFAULT_RULE.prior_scale,
                             draws: int = NOISE_LAW_DRAWS) -> float:
    """The ``quantile`` quantile of E/N when the fit is pure noise: E = ‖X̄θ‖² the energy of the ε-DP linear
    fit's centred predictions, N its expectation under noise alone (:func:`fit_noise_energy`). Public numbers
    only (the design, the range's width, the bound, ε, the cells): it reads no label.

    The fit's noise is Laplace, so E/N is heavy-tailed: one large draw in one coordinate can carry many
    times N (its 0.999 quantile is 7 to 20 where its mean is 1). With the labels independent of the
    features, θ is a linear map of independent Laplace draws: G⁻¹ξ for :func:`private_linear_fit` (ξ the
    d sums' noise, variance 2b² each), G⁻¹ZᵀΩη for :func:`private_cell_fit` (η the C cell means' noise,
    variance 1/Ω_c each), G the ridged Gram matrix of :func:`fit_noise_energy` (the clip of the predictions to
    the range and the rounding of the sums are left out, as N leaves them out). The quantile is taken over
    ``draws`` draws of those coordinates from a fixed public seed (:data:`NOISE_LAW_SEED`), so the same inputs
    give the same number."""
    if not 0.0 < float(quantile) < 1.0:
        raise InputError(f"quantile must lie in (0, 1), got quantile={quantile!r}")
    design = np.asarray(design, np.float64)
    centred = design - design.mean(axis=0)
    gram, middle = _fit_covariance_parts(design, width, bound, epsilon, cells, prior_scale)
    if cells is None:
        coordinates = np.linalg.inv(gram)  # θ = G⁻¹ξ
        scale = np.full(design.shape[1], math.sqrt(middle / 2.0))
    else:
        z, weight, _ = _cell_system(design, cells, float(width), float(epsilon))
        coordinates = np.linalg.solve(gram, z.T * weight[None, :])  # θ = G⁻¹ZᵀΩη
        scale = np.sqrt(0.5 / weight)
    mapped = coordinates * scale[None, :]  # θ per unit Laplace draw of each coordinate
    form = mapped.T @ (centred.T @ centred) @ mapped  # E = uᵀ·form·u, u i.i.d. Laplace of scale 1
    expected = 2.0 * float(np.trace(form))  # E[u_i²] = 2
    if not expected > 0:
        return math.inf
    u = np.random.default_rng(NOISE_LAW_SEED).laplace(size=(int(draws), form.shape[0]))
    energy = np.einsum("ij,jk,ik->i", u, form, u)
    return float(np.quantile(energy, float(quantile)) / expected)


def fit_mean_estimate(design, theta, width: float, bound: float, epsilon: float, *, cells=None,
                      prior_scale: float = DEFAULT_RULE.prior_scale) -> tuple[float, float]:
    """The labels' mean as the released ε-DP linear fit estimates it, without its ridge, and that estimate's
    noise variance: ``(mean - c, variance)``, c the range's midpoint the fit is centred on.

    The fits shrink θ towards 0 (a ridge: :func:`private_linear_fit`'s λ, :func:`private_cell_fit`'s prior),
    which pulls the mean of their predictions towards c by a share that depends on the labels. The released
    statistic the ridge was applied to is recovered from θ (post-processing: G·θ, G the public ridged Gram
    matrix, is the noisy Xᵀ(y - c) or ZᵀΩ(m̃ - c)) and refitted without the ridge, θ₀ = G₀⁻¹Gθ; the mean of
    those predictions, x̄ᵀθ₀ (x̄ the design's mean row), is the least-squares fit's, whose residuals average
    to zero: the labels' mean less c up to the rows the L1 bound shrank (for the cells, whose sizes differ
    by at most one, the mean of the cell means). Its noise variance is x̄ᵀG₀⁻¹ Cov(Gθ) G₀⁻¹x̄: 2b²‖G₀⁻¹x̄‖²
    for the sums, x̄ᵀ(ZᵀΩZ)⁻¹x̄ for the cells. Public numbers and the released θ only."""
    design = np.asarray(design, np.float64)
    mean_row = design.mean(axis=0)
    gram, middle = _fit_covariance_parts(design, width, bound, epsilon, cells, prior_scale)
    released = gram @ np.asarray(theta, np.float64)
    plain = design.T @ design if cells is None else middle
    try:
        direction = np.linalg.solve(plain, mean_row)
    except np.linalg.LinAlgError:  # a design column that is zero on every row (a constant feature's score)
        direction = np.linalg.lstsq(plain, mean_row, rcond=None)[0]
    if cells is None:
        return float(direction @ released), float(middle * (direction @ direction))
    return float(direction @ released), float(direction @ mean_row)


def fit_signal_to_noise(design, theta, width: float, bound: float, epsilon: float, *, cells=None,
                        noise: float | None = None, prior_scale: float = DEFAULT_RULE.prior_scale) -> float:
    """How far the ε-DP linear fit's predictions stand above its own noise: (‖X̄θ‖² - N)/N, X̄ the design with
    its columns centred and N the expected energy the fit's noise alone puts into the centred predictions
    (:func:`fit_noise_energy`; ``cells``: the fit was :func:`private_cell_fit`'s on those cells; ``noise``: that
    energy, when the caller has computed it already).

    An estimate of the signal's energy over the noise's: about 0 when the features say nothing about the
    label, large when the fit is well measured; infinite when the design has no column that varies (the
    predictions are a constant, there is nothing to weigh). A function of the released θ and public numbers
    only (post-processing): it reads no label."""
    design = np.asarray(design, np.float64)
    if noise is None:
        noise = fit_noise_energy(design, width, bound, epsilon, cells=cells, prior_scale=prior_scale)
    centred = design - design.mean(axis=0)
    if not noise > 0:
        return math.inf
    predictions = centred @ np.asarray(theta, np.float64)
    return float((predictions @ predictions - noise) / noise)


def _slope_weights(a, quantile: float):
    """:func:`private_slope`'s clip κ (the ``quantile`` quantile of |a|) and weights w = a clipped to ±κ (public:
    the direction only)."""
    kappa = float(np.quantile(np.abs(a), quantile))
    if not kappa > 0:
        kappa = float(np.max(np.abs(a)))
    if not kappa > 0:
        raise InputError("direction is zero on every row: there is no slope to estimate")
    return kappa, np.clip(a, -kappa, kappa)


def slope_noise(direction, width: float, epsilon: float, *,
                clip_quantile: float = DEFAULT_RULE.slope_clip_quantile) -> float:
    """The standard deviation of the noise :func:`private_slope` adds to its slope on ``direction`` at ``epsilon``
    for a range of width ``width``: the sum's discrete Laplace noise (scale about κ·width/ε, variance
    2(κ·width/ε)²) over Σ w·a. Public numbers and the direction only: it reads no label."""
    a = np.asarray(direction, np.float64)
    kappa, w = _slope_weights(a, clip_quantile)
    return math.sqrt(2.0) * kappa * float(width) / float(check_epsilon(epsilon)) / abs(float(w @ a))


def private_slope(direction, labels, lo, hi, epsilon, secret: Secret, *, centre: float,
                  accounting: Accounting | None = None,
                  clip_quantile: float = DEFAULT_RULE.slope_clip_quantile) -> float:
    """ε-DP slope α of the labels on a public direction a (one number per row): y ≈ centre + α·a.

    Only Σ w_i (y_i - centre) reads the labels, with public weights w = a clipped to ±κ (κ the
    ``clip_quantile`` quantile of |a|; the clip bounds the sensitivity): replacing one label moves
    it by at most κ·(hi - lo). Exact integer noise as in :func:`private_linear_fit` (the same integer sums):
    every term is rounded to a multiple of κ·(hi - lo)/R, so one label moves the integer sum by at most
    R + 1, and discrete Laplace noise of rate ε/(R + 1) makes it ε-DP. Returns the instrumental-variable estimate
    (noisy Σ w (y - centre))/Σ w·a, unclipped. ``centre`` must lie in [lo, hi]; a has to be nonzero
    somewhere (the caller has nothing to calibrate otherwise). ``accounting``, if given, gets the entry "slope"."""
    eps = float(check_epsilon(epsilon))
    lo, hi = check_range(lo, hi)
    check_secret(secret)
    y = check_labels(labels, lo, hi)
    a = np.asarray(direction, np.float64)
    if a.shape != y.shape or not np.all(np.isfinite(a)):
        raise InputError(f"direction must be finite with one value per label, got shape {a.shape}")
    if not lo <= centre <= hi:
        raise InputError(f"centre must lie in the range [{lo}, {hi}], got centre={centre!r}")
    kappa, w = _slope_weights(a, clip_quantile)
    if account(accounting) is not None:
        accounting.spend("slope", eps, sensitivity=f"{STATISTIC_RESOLUTION} + 1 on the integer sum of w·(y - centre) "
                         f"(unit (hi - lo)·{kappa:g}/{STATISTIC_RESOLUTION}, weights clipped to ±{kappa:g})",
                         mechanism=f"discrete Laplace of rate epsilon/({STATISTIC_RESOLUTION} + 1)")
    unit = (hi - lo) * kappa / STATISTIC_RESOLUTION
    total = int(_noisy_sums(w[:, None], y, centre, unit, eps, BitStream(secret, "slope", epsilon=eps))[0])
    return float(total * unit / float(w @ a))


def median_cells(scores, depth: int):
    """Public cells of the rows: ``depth`` rounds of median splits (a k-d tree). Round j sorts every cell's rows
    by column j mod k of ``scores`` (ties by row order) and splits the cell into its lower and upper half, so
    the up to 2^depth cells are of about equal size. Features only: returns one cell index per row, 0 to C - 1."""
    z = np.asarray(scores, np.float64)
    if z.ndim != 2 or z.shape[1] < 1:
        raise InputError(f"scores must be (n, k) with k >= 1, got shape {z.shape}")
    rows, k = z.shape
    depth = int(depth)
    if not 0 <= depth <= 30:
        raise InputError(f"depth must lie in [0, 30], got depth={depth!r}")
    cell = np.zeros(rows, np.int64)
    rank = np.empty((rows, min(k, depth)), np.int64)  # each score's rank among the rows, ties by row order
    for j in range(rank.shape[1]):
        rank[np.argsort(z[:, j], kind="stable"), j] = np.arange(rows)
    position = np.arange(rows)
    for level in range(depth):
        order = np.argsort(cell * rows + rank[:, level % k])  # by cell, then by the score within it
        ranked = cell[order]
        count = np.bincount(ranked)
        first = np.cumsum(count) - count  # where each cell's rows start in that order
        cell[order] = 2 * ranked + (position - first[ranked] >= count[ranked] // 2)
    count = np.bincount(cell, minlength=1 << depth)
    if np.all(count > 0):
        return cell
    return (np.cumsum(count > 0) - 1)[cell]  # number the cells that hold rows 0 to C - 1, in order


def _cell_system(design, cells, width: float, epsilon: float):
    """The cells' mean design rows Z (C, d), the precision Ω of each released cell mean (its noise has variance
    2·(width/(ε·n_c))², :func:`private_mean`) and the counts n_c."""
    cells = np.asarray(cells)
    if cells.shape != (design.shape[0],) or cells.size == 0 or cells.min() < 0:
        raise InputError(f"cells must give one index >= 0 per design row, got shape {cells.shape}")
    count = np.bincount(cells).astype(np.float64)
    if np.any(count == 0):
        raise InputError(f"cells must number their cells 0 to C - 1 without gaps, got {int(np.sum(count == 0))} empty")
    z = np.stack([np.bincount(cells, weights=design[:, j]) for j in range(design.shape[1])], axis=1) / count[:, None]
    return z, (epsilon * count / width) ** 2 / 2, count


def private_cell_fit(design, labels, lo, hi, epsilon, secret: Secret, *, cells, accounting: Accounting | None = None,
                     prior_scale: float = DEFAULT_RULE.prior_scale):
    """ε-DP linear fit from the labels' means in public cells of the rows (parallel composition).

    Every row lies in one cell (``cells``, e.g. :func:`median_cells` of the design's scores), so the C cell
    means, each an ε-DP :func:`private_mean` (child secret ``("cell", c)``; exact integer noise, scale
    (hi - lo)/(ε·n_c)), are together ε-DP: replacing one label changes one of them. θ is then post-processing:
    the posterior mean of the coefficients of y - c on the cells' mean design rows Z under the cell means'
    noise (precision Ω_c = (ε·n_c/(hi - lo))²/2) and the prior scale τ = ``prior_scale``·(hi - lo) of
    :func:`private_linear_fit`: θ = (ZᵀΩZ + I/τ²)⁻¹ZᵀΩ(m̃ - c). No L1 bound enters: a cell mean's
    sensitivity, (hi - lo)/n_c, does not depend on the features, and the coefficients do not share one
    budget as the sums of :func:`private_linear_fit` do. ``cells`` must be a function of the public features
    only. Returns (θ, c) as :func:`private_linear_fit` does (predict with ``design @ θ + c``). ``accounting``, if
    given, gets the partition "cells" and one entry "cell-mean" per cell, over that cell's rows."""
    eps, lo, hi, y, design = _fit_inputs(design, labels, lo, hi, epsilon, secret)
    z, weight, count = _cell_system(design, cells, hi - lo, eps)
    order = np.argsort(np.asarray(cells), kind="stable")
    groups = np.split(y[order], np.cumsum(count.astype(np.int64))[:-1])
    centre = 0.5 * (lo + hi)
    if account(accounting) is not None:
        accounting.partition("cells", np.asarray(cells))
    means = np.array([private_mean(g, lo, hi, eps, secret.child("cell", c), purpose="cell-mean",
                                   accounting=None if accounting is None else accounting.within("cells", c))
                      for c, g in enumerate(groups)])
    information = z.T @ (z * weight[:, None]) + np.eye(z.shape[1]) / (prior_scale * (hi - lo)) ** 2
    return np.linalg.solve(information, z.T @ (weight * (means - centre))), centre
