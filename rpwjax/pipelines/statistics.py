"""Private statistics the pipelines centre their priors on: a mean and a linear model, each with exact
integer noise (rounded to public levels, then discrete Laplace), and the public feature design."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from rpwjax.errors import InputError, check_epsilon, check_labels, check_range
from rpwjax.keys import Secret, check_secret
from rpwjax.noise import BitStream, discrete_laplace

MEAN_RESOLUTION = 1 << 20  # labels are rounded to (hi - lo) / this before the private sum


def private_mean(labels, lo, hi, epsilon, secret: Secret) -> float:
    """ε-DP mean of labels in the public [lo, hi], clipped to [lo, hi]; exact integer noise.

    Each label is rounded to one of R + 1 levels q_i = round(R (y_i - lo)/(hi - lo)) (R =
    :data:`MEAN_RESOLUTION`), so replacing one label moves the integer sum Σ q_i by at most R;
    discrete Laplace noise of rate ε/R makes the sum ε-DP. Noise scale (hi - lo)/(n ε) as for the
    continuous Laplace mean; rounding moves the mean by at most (hi - lo)/(2R).
    """
    lo, hi = check_range(lo, hi)
    eps = float(check_epsilon(epsilon))
    check_secret(secret)
    y = check_labels(labels, lo, hi)
    q = np.rint(MEAN_RESOLUTION * (y - lo) / (hi - lo)).astype(np.int64)
    z = discrete_laplace(Fraction(eps) / MEAN_RESOLUTION, BitStream(secret, "mean"))
    total = int(q.sum()) + z
    return float(np.clip(lo + (hi - lo) * total / (MEAN_RESOLUTION * y.size), lo, hi))


def public_design(features, components: int = 8):
    """Public transform of the features: top principal components scaled to unit variance, an intercept, and
    every row's L1 norm clipped to the 95th percentile of the norms (features are public under label-DP)."""
    x = np.asarray(features, np.float64)
    x = x - x.mean(axis=0)
    k = int(min(components, x.shape[1]))
    _, s, vt = np.linalg.svd(x, full_matrices=False)
    z = x @ vt[:k].T
    scale = z.std(axis=0)
    z = z / np.where(scale > 0, scale, 1.0)
    design = np.concatenate([np.ones((x.shape[0], 1)), z], axis=1)
    norms = np.abs(design).sum(axis=1)
    bound = float(np.quantile(norms, 0.95))
    design = design * np.minimum(1.0, bound / norms)[:, None]
    return design, bound


STATISTIC_RESOLUTION = 1 << 20  # terms of X^T(y - c) are rounded to (hi - lo)·bound / this


def private_linear_fit(design, labels, lo, hi, epsilon, secret: Secret, *, bound: float):
    """ε-DP least squares with public features: only Xᵀ(y - c) reads the labels (c the range midpoint).

    Replacing one label changes Xᵀy by x_i (y - y'), |y - y'| <= hi - lo and ||x_i||₁ <= ``bound``:
    L1 sensitivity (hi - lo)·bound. Released exactly in integers: every term x_ij (y_i - c) is rounded
    to a multiple of (hi - lo)·bound/R (R = :data:`STATISTIC_RESOLUTION`), so one label moves the d
    integer sums by at most R + d in L1, and discrete Laplace noise of rate ε/(R + d) per coordinate
    makes them ε-DP (noise scale b = (hi - lo)·bound/ε up to a factor 1 + d/R). XᵀX is public. The ridge
    λ = 2b²/(τ² n), τ = (hi - lo)/4, is the posterior mean for coefficients of prior scale τ under
    noise of variance 2b² (a rule on public numbers: the noise is known, the labels are not read).
    Returns θ (predict with ``design @ θ + c``)."""
    eps = float(check_epsilon(epsilon))
    lo, hi = check_range(lo, hi)
    check_secret(secret)
    y = check_labels(labels, lo, hi)
    design = np.asarray(design, np.float64)
    if design.ndim != 2 or design.shape[0] != y.size:
        raise InputError(f"design must be (n, d) with one row per label, got shape {design.shape}")
    norms = np.abs(design).sum(axis=1)
    if np.any(norms > bound * (1 + 1e-12)):
        raise InputError(f"every design row must have L1 norm <= bound={bound!r}, got {float(norms.max())!r}")
    centre = 0.5 * (lo + hi)
    unit = (hi - lo) * bound / STATISTIC_RESOLUTION
    terms = np.rint(design * (y - centre)[:, None] / unit).astype(np.int64)
    d = design.shape[1]
    rate = Fraction(eps) / (STATISTIC_RESOLUTION + d)
    stream = BitStream(secret, "statistics")
    noisy = terms.sum(axis=0) + np.array([discrete_laplace(rate, stream) for _ in range(d)], np.int64)
    b = (hi - lo) * bound / eps * (1 + d / STATISTIC_RESOLUTION)
    ridge = 2 * b**2 / (((hi - lo) / 4) ** 2 * y.size)
    gram = design.T @ design + ridge * np.eye(d)
    return np.linalg.solve(gram, noisy.astype(np.float64) * unit), centre
