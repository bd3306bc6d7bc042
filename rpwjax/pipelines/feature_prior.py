r"""The fair comparison: a baseline mechanism given the same feature-aware prior as ``auto``.

``auto`` (:mod:`rpwjax.pipelines.auto`) knows more than the paper's baselines: a private linear model and a
residual histogram around it. To measure how much of its advantage is that side information,
:func:`feature_prior_labels` gives it to RR-on-Bins or Unbiased: the same plan and the same two releases, with
the same calibration of the fit (:func:`rpwjax.pipelines.feature_aware.plan` and
:func:`~rpwjax.pipelines.feature_aware.feature_aware_prior` under the same
:class:`~rpwjax.pipelines.rule.AutoRule`, recorded), then the mechanism fitted with what is left, ε₂, to the
rows' priors. It depends on those public functions only: a change to auto's release does not change it.

A mechanism fit per row is an LP (Unbiased) or a partition search (RR-on-Bins) per row, so rows are grouped by
their centre m(x) into the rule's public quantile groups (:func:`~rpwjax.pipelines.residuals.centre_groups`; a
function of the released model and the public features) and each group gets the mechanism fitted to the prior
auto's release gives a row at the group's median centre, y = clip(m + r) on the range
(:func:`~rpwjax.pipelines.residuals.censored_priors`, or mean-matched where the plan says so,
:func:`~rpwjax.pipelines.residuals.mean_matched_priors`), with a :data:`UNIFORM_SHARE` share of the uniform
density so that no part of the range has zero mass (:data:`RETRY_SHARE` when the solver fails on the first, and
the uniform density alone when it fails on that too).
Each label is released once, by its group's parameters: ε_s + ε₁ + ε_c + ε₂ = ε (ε_c = 0 unless the fit is
calibrated).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rpwjax.accounting import Accounting, parts_of, record_fields
from rpwjax.errors import InputError, check_epsilon, check_labels, check_range
from rpwjax.keys import Secret, check_secret
from rpwjax.mechanisms import entry
from rpwjax.mechanisms.unbiased_lp import UnsolvedLPError
from rpwjax.pipelines.feature_aware import afforded_design, feature_aware_prior, plan
from rpwjax.pipelines.linear_prior import check_features, linear_residual_prior, row_prior_builder
from rpwjax.pipelines.residuals import centre_groups
from rpwjax.pipelines.rule import DEFAULT_RULE, AutoRule
from rpwjax.priors import DEFAULT_BINS, Prior
from rpwjax.release_path import release, sidecar_fields

MECHANISMS = ("rr-on-bins", "unbiased")
UNIFORM_SHARE = 1e-6
RETRY_SHARE = 1e-2  # when the mechanism's solver fails on a group's prior, it is refitted with this uniform share


def feature_prior_labels(features, labels, lo, hi, epsilon, *, secret: Secret, mechanism: str, bins: int = DEFAULT_BINS,
                         rule: AutoRule = DEFAULT_RULE):
    """``mechanism`` (RR-on-Bins or Unbiased) with the feature-aware prior of ``auto`` under ``rule``:
    ``(labels, record)``; ``record["auto"]`` holds the rule and the plan the prior followed. ``bins`` is
    not read (the registry passes it to every pipeline)."""
    if mechanism not in MECHANISMS:
        raise InputError(f"mechanism must be one of {', '.join(MECHANISMS)}, got mechanism={mechanism!r}")
    lo, hi = check_range(lo, hi)
    eps = float(check_epsilon(epsilon))
    y = check_labels(labels, lo, hi)
    x = check_features(features, y)
    check_secret(secret)
    design, bound = afforded_design(x, eps, rule=rule)
    p = plan(eps, y.size, design.shape[1] - 1, bound, hi - lo, rule=rule)
    s = secret.child(f"feature-prior-{mechanism}").for_epsilon(eps)
    accounting = Accounting(y.size, eps)
    if p.branch == "calibrated":
        # auto releases these labels without the features; the comparison still fits a small private linear
        # model on them (rule.comparison_statistics_share of ε), so that its mechanism is fitted per centre group
        # as on the other branches, and takes auto's prior share for the residual histogram around it
        eps_s, eps1 = rule.comparison_statistics_share * eps, rule.calibrated_prior_share * eps
        eps2 = eps - eps_s - eps1
        # the plan recorded is the split spent here (auto's calibrated plan spends nothing on statistics)
        p = dataclasses.replace(p, statistics_epsilon=eps_s, residual_histogram_epsilon=eps1,
                                release_epsilon=eps - eps_s - eps1, mechanism_epsilon=eps2)
        prior = linear_residual_prior(design, bound, y, lo, hi, eps_s, eps1, s, residual_bins=rule.residual_bins,
                                      rule=rule, accounting=accounting)
    else:  # auto's own prior, its calibration step included
        prior, p = feature_aware_prior(design, bound, y, lo, hi, p, s, rule, accounting=accounting)
        eps2 = p.mechanism_epsilon
    out = np.empty(y.size)
    fields = []
    fit = entry(mechanism).fit
    row_priors = row_prior_builder(p.row_prior or "censored", rule)  # as auto's release (censored where none named)
    groups = centre_groups(prior.centres, rule.groups)
    accounting.partition("centre-groups", parts_of(groups, y.size))
    for g, rows in groups:
        shifted = row_priors(prior.edges, prior.mass, np.median(prior.centres[rows])[None], lo, hi)
        left, right, mass = (np.asarray(v, np.float64)[0] for v in (shifted.left, shifted.right, shifted.mass))
        width = right - left
        uniform = np.where(width > 0, width / (hi - lo), 0.0)
        keep = width > 0
        for share in (UNIFORM_SHARE, RETRY_SHARE, 1.0):  # 1.0: uniform on the group's bins, no histogram mass,
            # the flattest prior there is; a failure there too is an error
            mixed = (1 - share) * mass + share * uniform / uniform.sum()
            g_prior = Prior(left[keep], right[keep], mixed[keep] / mixed[keep].sum(), lo, hi, False, "feature-aware")
            try:
                params, _ = fit(g_prior, eps2)
                break
            except (RuntimeError, UnsolvedLPError):  # the solver gave up on a very peaked prior at a tiny ε:
                # flatten it a little
                if share == 1.0:
                    raise
        out[rows] = release(params, s.child("release", int(g)), y[rows],
                            accounting=accounting.within("centre-groups", g))
        fields.append({"group": int(g), "rows": int(rows.size), **sidecar_fields(params)})
    record = {"pipeline": f"{mechanism}+feature-prior", "mechanism": mechanism, "components": prior.components,
              "l1_bound": prior.l1_bound, "groups": len(fields), "denoised": False, "release": fields,
              "auto": {"rule": rule.to_json(), "plan": p.to_json()}, **record_fields(accounting)}
    return out, record
