r"""The linear prior (:func:`linear_prior_labels`, no split): an ε_s-DP linear
model from exact integer noise on Xᵀy over public, clipped principal components
(:func:`private_linear_fit`) centres every row's prior; then a residual prior
(ε₁), a per-row exact RPWithPrior interval (ε₂) and denoising. Each label is
read by the three releases: ε_s + ε₁ + ε₂ = ε (sequential composition).
"""

from __future__ import annotations

import numpy as np

from rpwjax.errors import InputError, check_epsilon, check_labels, check_range
from rpwjax.keys import Secret, check_secret
from rpwjax.mechanisms.rpwithprior import choose_zeta, fit_rpwithprior_per_row
from rpwjax.pipelines.residuals import residual_histogram, shifted_priors
from rpwjax.pipelines.statistics import private_linear_fit, public_design
from rpwjax.posterior import posterior_mean_per_row
from rpwjax.priors import histogram_prior
from rpwjax.release_path import release, sidecar_fields

def linear_prior_labels(features, labels, lo, hi, epsilon, *, secret: Secret, stats_fraction: float = 0.4,
                        prior_fraction: float = 0.1, components: int = 8, residual_bins: int = 32):
    """Private labels whose per-row prior is centred on a private linear model (no split).

    Every label is read three times: by the sufficient statistic Xᵀy of a linear
    model (ε_s = ``stats_fraction``·ε), by a residual histogram around that
    model (ε₁ = ``prior_fraction``·ε), and by its own RPWithPrior output with
    a per-row exact interval (ε₂ = ε - ε_s - ε₁), which is then denoised under
    the row's prior. Sequential composition: ε per label. Returns
    ``(labels, record)``.
    """
    lo, hi = check_range(lo, hi)
    eps = float(check_epsilon(epsilon))
    if not (0 < stats_fraction and 0 < prior_fraction and stats_fraction + prior_fraction < 1):
        raise InputError(f"need stats_fraction, prior_fraction > 0 with a sum < 1, got {stats_fraction}, {prior_fraction}")
    y = check_labels(labels, lo, hi)
    x = np.asarray(features, np.float64)
    if x.ndim != 2 or x.shape[0] != y.size:
        raise InputError(f"features must be (n, d) with one row per label, got shape {x.shape}")
    secret = check_secret(secret).for_epsilon(eps)
    eps_s, eps1 = stats_fraction * eps, prior_fraction * eps
    eps2 = eps - eps_s - eps1
    design, bound = public_design(x, components)
    theta, centre = private_linear_fit(design, y, lo, hi, eps_s, secret.child("statistics"), bound=bound)
    m = np.clip(design @ theta + centre, lo, hi)
    edges, mass = residual_histogram(y - m, hi - lo, eps1, bins=residual_bins, secret=secret.child("residual-histogram"))
    zeta = float(choose_zeta(histogram_prior(edges, mass), eps2)[0])
    priors = shifted_priors(edges, mass, m, lo, hi)
    params = fit_rpwithprior_per_row(priors, zeta, eps2)
    noisy = release(params, secret.child("release"), y)
    record = {"pipeline": "linear-prior", "epsilon": eps, "rows": int(y.size),
              "statistics_epsilon": eps_s, "residual_histogram_epsilon": eps1, "mechanism": "rpwithprior",
              "mechanism_epsilon": eps2, "components": int(design.shape[1] - 1), "l1_bound": bound, "zeta": zeta,
              "per_label_epsilon": eps, "release": sidecar_fields(params)}
    return posterior_mean_per_row(params, priors, noisy), record
