r"""The fair comparison: a baseline mechanism given the same feature-aware prior as ``auto``.

``auto`` (:mod:`rpwjax.pipelines.auto`) knows more than the paper's baselines:
a private linear model and a residual histogram around it. To measure how
much of its advantage is that side information, :func:`feature_prior_labels`
gives it to RR-on-Bins or Unbiased: the same plan and the same two releases
(ε_s for the linear fit, ε₁ for the residual histogram; identical budget
split, :func:`rpwjax.pipelines.auto.plan`, and the same calibration of the fit,
:func:`rpwjax.pipelines.auto.feature_aware_prior`), then the mechanism fitted with
ε₂ to the rows' priors. A mechanism fit per row is an LP (Unbiased) or a
partition search (RR-on-Bins) per row, so rows are grouped by their centre
m(x) into auto's public quantile groups (:func:`~rpwjax.pipelines.residuals.centre_groups`) (a function of the released
model and the public features) and each group gets the mechanism fitted to
the prior auto's release gives a row at the group's median centre, y = clip(m + r) on the
range (:func:`~rpwjax.pipelines.residuals.censored_priors`, or mean-matched where auto's plan says so,
:func:`~rpwjax.pipelines.residuals.mean_matched_priors`; with a 1e-6 share of the uniform density, so that no part of the
range has zero mass; 1e-2 when the solver fails on the first). Each label is released once, by its group's
parameters: ε_s + ε₁ + ε_c + ε₂ = ε (ε_c = 0 unless the fit is calibrated).
"""

from __future__ import annotations

import numpy as np

from rpwjax.accounting import Accounting, parts_of, record_fields
from rpwjax.errors import InputError, check_epsilon, check_labels, check_range
from rpwjax.keys import Secret, check_secret
from rpwjax.mechanisms import entry
from rpwjax.pipelines import auto
from rpwjax.pipelines.linear_prior import check_features, linear_residual_prior, row_prior_builder
from rpwjax.pipelines.residuals import centre_groups
from rpwjax.priors import DEFAULT_BINS, Prior
from rpwjax.release_path import release, sidecar_fields

MECHANISMS = ("rr-on-bins", "unbiased")
UNIFORM_SHARE = 1e-6
RETRY_SHARE = 1e-2  # when the mechanism's solver fails on a group's prior, it is refitted with this uniform share


def feature_prior_labels(features, labels, lo, hi, epsilon, *, secret: Secret, mechanism: str, bins: int = DEFAULT_BINS):
    """``mechanism`` (RR-on-Bins or Unbiased) with the feature-aware prior of ``auto``: ``(labels, record)``."""
    if mechanism not in MECHANISMS:
        raise InputError(f"mechanism must be one of {', '.join(MECHANISMS)}, got mechanism={mechanism!r}")
    lo, hi = check_range(lo, hi)
    eps = float(check_epsilon(epsilon))
    y = check_labels(labels, lo, hi)
    x = check_features(features, y)
    check_secret(secret)
    design, bound = auto.afforded_design(x, eps)
    p = auto.plan(eps, y.size, design.shape[1] - 1, bound, hi - lo)
    s = secret.child(f"feature-prior-{mechanism}").for_epsilon(eps)
    accounting = Accounting(y.size, eps)
    if p.branch == "calibrated":  # auto would not use the features here: neither does the comparison
        eps_s, eps1 = 0.05 * eps, auto.CALIBRATED_PRIOR_FRACTION * eps
        eps2 = eps - eps_s - eps1
        prior = linear_residual_prior(design, bound, y, lo, hi, eps_s, eps1, s, residual_bins=auto.RESIDUAL_BINS,
                                      accounting=accounting)
    else:  # auto's own prior, its calibration step included
        prior, eps2, _ = auto.feature_aware_prior(design, bound, y, lo, hi, p, s, accounting=accounting)
    out = np.empty(y.size)
    fields = []
    fit = entry(mechanism).fit
    row_priors = row_prior_builder(p.row_prior or "censored")  # as auto's release (censored where no plan names one)
    groups = centre_groups(prior.centres, auto.GROUPS)
    accounting.partition("centre-groups", parts_of(groups, y.size))
    for g, rows in groups:
        shifted = row_priors(prior.edges, prior.mass, np.median(prior.centres[rows])[None], lo, hi)
        left, right, mass = (np.asarray(v, np.float64)[0] for v in (shifted.left, shifted.right, shifted.mass))
        width = right - left
        uniform = np.where(width > 0, width / (hi - lo), 0.0)
        keep = width > 0
        for share in (UNIFORM_SHARE, RETRY_SHARE):
            mixed = (1 - share) * mass + share * uniform / uniform.sum()
            g_prior = Prior(left[keep], right[keep], mixed[keep] / mixed[keep].sum(), lo, hi, False, "feature-aware")
            try:
                params, _ = fit(g_prior, eps2)
                break
            except RuntimeError:  # the solver gave up on a very peaked prior at a tiny ε: flatten it a little
                if share == RETRY_SHARE:
                    raise
        out[rows] = release(params, s.child("release", int(g)), y[rows],
                            accounting=accounting.within("centre-groups", g))
        fields.append({"group": int(g), "rows": int(rows.size), **sidecar_fields(params)})
    record = {"pipeline": f"{mechanism}+feature-prior", "mechanism": mechanism, "components": prior.components,
              "l1_bound": prior.l1_bound, "groups": len(fields), "denoised": False, "release": fields,
              **record_fields(accounting)}
    return out, record
