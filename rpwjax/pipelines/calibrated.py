r"""The mean-calibrated prior (for small ε, where the histogram is mostly
noise): half of ε₁ buys a private histogram, the other half a private mean
(integer sum of the labels rounded to 2^20 public levels plus exact discrete Laplace noise:
replace-one sensitivity (hi - lo)/n, scale (hi - lo)/(n ε₁/2)); the
histogram is then exponentially tilted, m_j ∝ h_j e^{λ c_j}, until its mean
equals the private mean (post-processing). At small ε a denoised label is
close to the prior mean, so the prior mean is what the model learns; a
private mean is far more accurate than the mean of a noisy histogram.
"""

from __future__ import annotations

import numpy as np

from rpwjax.accounting import Accounting, record_fields
from rpwjax.errors import InputError, check_epsilon, check_labels, check_range
from rpwjax.keys import Secret, check_secret
from rpwjax.mechanisms.rpwithprior import RPWithPrior, fit_rpwithprior
from rpwjax.sampling import check_release_epsilon
from rpwjax.pipelines.statistics import private_mean
from rpwjax.posterior import posterior_mean
from rpwjax.priors import DEFAULT_BINS, Prior, private_histogram
from rpwjax.release_path import release, sidecar_fields

# the pipelines' histograms: projected onto the public row count, noise keyed by purpose "counts" under a
# per-stage child secret (each pipeline derives one child secret per ε first)
_PROJECTED = {"projection": "project", "purpose": "counts", "keyed_by_epsilon": False}


def _tilt_to_mean(left, right, mass, target):
    """Exponential tilt m_j ∝ mass_j e^{λ c_j} whose mean (uniform within bins) equals ``target``."""
    centres = 0.5 * (left + right)
    keep = mass > 0
    if keep.sum() < 2:
        return mass
    target = float(np.clip(target, centres[keep].min() + 1e-9, centres[keep].max() - 1e-9))
    scale = max(right[-1] - left[0], 1e-12)

    def mean_at(lam):
        logw = np.where(keep, np.log(np.where(keep, mass, 1.0)) + lam * centres / scale, -np.inf)
        w = np.exp(logw - logw.max())
        return float(np.sum(w * centres) / w.sum()), w / w.sum()

    lo_l, hi_l = -1.0, 1.0
    while mean_at(lo_l)[0] > target:
        lo_l *= 2
    while mean_at(hi_l)[0] < target:
        hi_l *= 2
    for _ in range(100):
        mid = 0.5 * (lo_l + hi_l)
        if mean_at(mid)[0] < target:
            lo_l = mid
        else:
            hi_l = mid
    return mean_at(0.5 * (lo_l + hi_l))[1]


def calibrated_prior(labels, lo, hi, epsilon_prior, *, bins: int, secret: Secret,
                     accounting: Accounting | None = None) -> Prior:
    """ε₁-DP prior: a private histogram (ε₁/2) tilted to a private mean (ε₁/2), both recorded in ``accounting``,
    if given."""
    eps1 = float(check_epsilon(epsilon_prior, "epsilon_prior"))
    hist = private_histogram(labels, lo, hi, eps1 / 2, bins=bins, secret=secret.child("histogram"), **_PROJECTED,
                             accounting=accounting)
    mean = private_mean(labels, lo, hi, eps1 / 2, secret.child("mean"), accounting=accounting)
    left, right, mass = (np.asarray(v, np.float64) for v in (hist.left, hist.right, hist.mass))
    return Prior(left, right, _tilt_to_mean(left, right, mass, mean), hist.lo, hist.hi, False, "calibrated-histogram")


def calibrated_denoised(labels, lo, hi, epsilon, *, secret: Secret, prior_fraction: float = 0.5, bins: int = DEFAULT_BINS,
                        accounting: Accounting | None = None):
    """RPWithPrior (ζ auto) fitted to the mean-calibrated prior, outputs denoised under that prior.

    Spends ε₁ = ``prior_fraction``·ε on the prior (half histogram, half mean)
    and ε₂ = ε - ε₁ on the mechanism. Returns ``(denoised labels, record)``. Every release is recorded in
    ``accounting`` (a caller's, for the labels given; a new one for ε over them otherwise).
    """
    lo, hi = check_range(lo, hi)
    eps = float(check_epsilon(epsilon))
    if not 0 < prior_fraction < 1:
        raise InputError(f"prior_fraction must be in (0, 1), got prior_fraction={prior_fraction!r}")
    y = check_labels(labels, lo, hi)
    secret = check_secret(secret).for_epsilon(eps)
    eps1 = prior_fraction * eps
    # a release at an ε no float64 release can certify is refused now, before the prior is drawn
    check_release_epsilon(RPWithPrior, eps - eps1, f"[{lo:.17g}, {hi:.17g}]")
    accounting = Accounting(y.size, eps) if accounting is None else accounting
    prior = calibrated_prior(y, lo, hi, eps1, bins=bins, secret=secret.child("prior"), accounting=accounting)
    params, _ = fit_rpwithprior(prior, eps - eps1, zeta="auto")
    noisy = release(params, secret.child("release"), y, accounting=accounting)
    record = {"pipeline": "calibrated-posterior", "mechanism": "rpwithprior", "bins": bins,
              "params": params.to_json(), "release": sidecar_fields(params), **record_fields(accounting)}
    return posterior_mean(params, prior, noisy), record
