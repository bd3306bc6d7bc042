r"""``auto``: one pipeline for a user's table, every setting chosen by a rule written down in advance.

The rule's numbers are one :class:`~rpwjax.pipelines.rule.AutoRule` (:data:`~rpwjax.pipelines.rule.DEFAULT_RULE`
unless a caller passes another); its decisions are one :class:`~rpwjax.pipelines.rule.AutoPlan`, recorded in the
sidecar (``record["auto"]``: the rule and the plan). Steps 1 to 3 read public numbers only (the design, the
branch, the budget split: :func:`~rpwjax.pipelines.feature_aware.plan`; :func:`explain` shows them and spends
nothing). Step 4 releases the feature-aware prior (:func:`~rpwjax.pipelines.feature_aware.feature_aware_prior`)
and then the labels: on the ``denoised`` branch RPWithPrior with a per-row exact interval under the row's prior
and the posterior mean (:func:`~rpwjax.pipelines.linear_prior.release_around`; where the plan names a
``fallback``, the residual histogram being too noisy to read, the centres are first moved to a private mean
of the labels and the row priors keep them as their means:
:func:`~rpwjax.pipelines.feature_aware.unreadable_histogram`), on the ``unbiased`` branch the Unbiased
mechanism on each centre group's clipped residuals (:func:`group_residual_range`); the ``calibrated``
branch uses no features (:func:`~rpwjax.pipelines.calibrated.calibrated_denoised`). It never reads a label
outside an accounted release and never looks at any model's error. The rule in words and the evidence behind
every number: docs/auto.md.

``branch="denoised"`` or ``"unbiased"`` fixes the outcome of step 2 and leaves every other step as it is (the
registry rows ``auto-denoised`` and ``auto-unbiased``, for comparing the branches on validation folds); the
plan records it (``forced_branch``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rpwjax.accounting import Accounting, parts_of, record_fields
from rpwjax.errors import check_epsilon, check_labels, check_range
from rpwjax.keys import Secret, check_secret
from rpwjax.pipelines.calibrated import calibrated_denoised
from rpwjax.pipelines.feature_aware import (afforded_design, feature_aware_prior, plan,
                                           uniform_unbiased_variance)
from rpwjax.pipelines.linear_prior import check_features, release_around
from rpwjax.pipelines.residuals import (centre_groups, clipping_error, residual_clip_range, unbiased_residual_fit,
                                       unbiased_residual_release)
from rpwjax.pipelines.rule import DEFAULT_RULE, AutoPlan, AutoRule, GroupClip
from rpwjax.priors import DEFAULT_BINS
from rpwjax.release_path import sidecar_fields


def clip_candidates(edges, mass, width, rule: AutoRule = DEFAULT_RULE) -> list:
    """Step 4, branch ``unbiased``: ``(q, (c_lo, c_hi))`` for each q of ``rule.clip_quantiles``, the residual
    prior's q and 1 - q quantiles (:func:`~rpwjax.pipelines.residuals.residual_clip_range`; None for q = 0)."""
    return [(q, residual_clip_range(edges, mass, width, q, rule.narrowest_range) if q > 0 else None)
            for q in rule.clip_quantiles]


def group_residual_range(edges, mass, width, centres, lo, hi, eps2, candidates=None, rule: AutoRule = DEFAULT_RULE):
    """Step 4, branch ``unbiased``, one centre group: its residual clip range and the quantile it clips at.

    The residuals of the group's labels lie in [lo - max m, hi - min m] (intersected with ±width). Each
    candidate q of ``rule.clip_quantiles`` (``candidates``: :func:`clip_candidates`, computed once for all
    groups) clips them to the residual prior's q and 1 - q quantiles inside that (q = 0: not beyond it), and
    costs an expected label error of bias² + variance: the clipping error under the residual prior restricted
    to the group's range (:func:`~rpwjax.pipelines.residuals.clipping_error`) plus an upper bound on the
    Unbiased label variance for a range that wide at ε₂ (the uniform prior's, scaled by the width²:
    :func:`~rpwjax.pipelines.feature_aware.uniform_unbiased_variance`). The cheapest candidate wins, the
    earliest in the list on ties (so a recorded q may clip nothing more than a smaller one would); a range
    narrower than ``rule.narrowest_range`` of the width is widened to that around its middle (the Unbiased
    mechanism needs a range to fit). Public numbers, the released residual prior and the group's centres
    only."""
    feasible = (max(lo - float(np.max(centres)), -width), min(hi - float(np.min(centres)), width))
    variance = uniform_unbiased_variance(eps2, rule.uniform_prior_bins)
    floor = rule.narrowest_range * width
    best = None
    for q, quantiles in candidates or clip_candidates(edges, mass, width, rule):
        if quantiles is not None:
            g_lo, g_hi = max(quantiles[0], feasible[0]), min(quantiles[1], feasible[1])
        else:
            g_lo, g_hi = feasible
        if g_hi - g_lo < floor:
            mid = 0.5 * (g_lo + g_hi)
            g_lo, g_hi = mid - floor / 2, mid + floor / 2
        cost = clipping_error(edges, mass, g_lo, g_hi, feasible) + variance * (g_hi - g_lo) ** 2
        if best is None or cost < best[0]:
            best = (cost, q, (g_lo, g_hi))
    return best[2], best[1]


def _grouped_unbiased(prior, y, lo, hi, eps2, secret: Secret, rule: AutoRule, accounting: Accounting):
    """Step 4, branch ``unbiased``: per centre group, residuals clipped to the group's range, one release each
    (recorded in ``accounting`` over the group's rows, partition "centre-groups"). Returns the labels, the
    release's record fields and each group's clip (:class:`GroupClip`)."""
    m = prior.centres
    out = np.empty(y.size)
    fields, clips = [], []
    candidates = clip_candidates(prior.edges, prior.mass, hi - lo, rule)
    groups = centre_groups(m, rule.groups)
    accounting.partition("centre-groups", parts_of(groups, y.size))
    for g, rows in groups:
        (g_lo, g_hi), q = group_residual_range(prior.edges, prior.mass, hi - lo, m[rows], lo, hi, eps2, candidates,
                                               rule)
        fit = unbiased_residual_fit(prior.edges, prior.mass, hi - lo, eps2, residual_range=(g_lo, g_hi))
        out[rows], _ = unbiased_residual_release(fit[0], fit[1], m[rows], y[rows], secret.child("release", int(g)),
                                                 accounting=accounting.within("centre-groups", g))
        clips.append(GroupClip(int(g), int(rows.size), (g_lo, g_hi), q))
        fields.append({"group": int(g), "rows": int(rows.size), "residual_range": [g_lo, g_hi], "clip_quantile": q,
                       "label_variance": float(np.asarray(fit[2]["label_mse"]).reshape(-1)[0]),
                       **sidecar_fields(fit[0])})
    return out, {"denoised": False, "groups": len(fields), "release": fields}, tuple(clips)


def public_plan(features, rows: int, lo, hi, epsilon, *, branch: str | None = None,
                rule: AutoRule = DEFAULT_RULE) -> AutoPlan:
    """Steps 1 to 3 of the rule for a table of ``rows`` rows with public ``features`` (n, d), range [lo, hi] and
    ``epsilon``: the plan :func:`auto_labels` would start from. Reads no label and spends nothing (the
    features, n, ε and the range are public)."""
    lo, hi = check_range(lo, hi)
    eps = float(check_epsilon(epsilon))
    design, bound = afforded_design(check_features(features, np.zeros(int(rows))), eps, rule=rule)
    return plan(eps, int(rows), design.shape[1] - 1, bound, hi - lo, branch, rule)


def explain(features, rows: int, lo, hi, epsilon, *, branch: str | None = None, rule: AutoRule = DEFAULT_RULE) -> dict:
    """What ``auto`` would decide before it reads a label: the rule and the public part of the plan (steps 1 to
    3, :func:`public_plan`), with ``"not_shown"`` naming step 4's decisions. Those read the labels through the
    private fit and residual histogram, so showing them would release label information that no ε accounts
    for; they are in the sidecar of a real run, where their releases are paid for."""
    p = public_plan(features, rows, lo, hi, epsilon, branch=branch, rule=rule)
    hidden = [] if p.branch == "calibrated" else ["fit", "calibration", "mechanism_epsilon", "groups", "anchor"]
    return {"rule": rule.to_json(), "plan": {k: v for k, v in p.to_json().items() if k not in hidden},
            "not_shown": hidden}


def auto_labels(features, labels, lo, hi, epsilon, *, secret: Secret, bins: int = DEFAULT_BINS, branch: str | None = None,
                step=None, rule: AutoRule = DEFAULT_RULE):
    """Private training labels by the ``auto`` rule: ``(labels, record)``; ``record["auto"]`` holds the rule
    (``rule.to_json()``) and every decision (the :class:`~rpwjax.pipelines.rule.AutoPlan`, step 4's included).

    ``branch`` fixes step 2 (``"denoised"`` or ``"unbiased"``; for validating the rule, see the module docstring).
    ``step(name)``, if given, is called as each step starts (a progress bar's). ``bins``: the calibrated branch's
    histogram.
    """
    step = step or (lambda name: None)
    lo, hi = check_range(lo, hi)
    eps = float(check_epsilon(epsilon))
    y = check_labels(labels, lo, hi)
    check_secret(secret)
    step("design (public)")
    x = check_features(features, y)
    design, bound = afforded_design(x, eps, rule=rule)
    del x
    p = plan(eps, y.size, design.shape[1] - 1, bound, hi - lo, branch, rule)
    accounting = Accounting(y.size, eps)
    if p.branch == "calibrated":
        step("calibrated release")
        out, record = calibrated_denoised(y, lo, hi, eps, secret=secret.child("auto-calibrated"),
                                          prior_fraction=rule.calibrated_prior_share, bins=bins, accounting=accounting)
        trace = {"rule": rule.to_json(), "plan": p.to_json()}
        return out, {**record, "pipeline": "auto", "denoised": True, "auto": trace, **record_fields(accounting)}
    s = secret.child("auto-linear").for_epsilon(eps)
    step("private linear fit and residual histogram")
    prior, p = feature_aware_prior(design, bound, y, lo, hi, p, s, rule, accounting=accounting)
    del design  # (rows, k + 1) float64: the release needs only the centres
    eps2 = p.mechanism_epsilon
    step(f"{p.branch} release")
    if p.branch == "unbiased":
        out, fields, clips = _grouped_unbiased(prior, y, lo, hi, eps2, s, rule, accounting)
        p = dataclasses.replace(p, groups=clips)
        mechanism = "unbiased"
    else:
        out, fields = release_around(prior, y, lo, hi, eps2, s, "rpwithprior", levels=rule.levels,
                                     row_prior=p.row_prior, rule=rule, accounting=accounting)
        mechanism = "rpwithprior"
    trace = {"rule": rule.to_json(), "plan": p.to_json()}
    record = {"pipeline": "auto", "mechanism": mechanism, "components": prior.components,
              "l1_bound": prior.l1_bound, **fields, "auto": trace, **record_fields(accounting)}
    return out, record
