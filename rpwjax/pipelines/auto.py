r"""``auto``: one pipeline for a user's table, every setting chosen by a rule written down in advance.

The rule reads public quantities first: ε, the number of rows n, the feature
design (its number of components k and the public L1 bound of its rows,
:func:`~rpwjax.pipelines.statistics.public_design`) and the width W of the
public range. It never reads a label outside an accounted release, and it
does not look at any model's error.

1. **Can a private linear model be afforded?** (public.) The ε_s-DP linear
   fit has coefficient noise of standard deviation about √2·W·B/(ε_s·n)
   (B the L1 bound). Its size relative to the scale of a coefficient of a
   label in a range of width W over k + 1 unit-variance columns,
   W/(2√(k+1)), is ρ(ε_s) = 2√2·B·√(k+1)/(ε_s·n). If even half of ε leaves
   ρ above :data:`AFFORD_RHO`, the features cannot be used: branch
   ``calibrated`` (a private histogram tilted to a private mean, RPWithPrior,
   posterior mean; :mod:`~rpwjax.pipelines.calibrated`).
2. **Budget split** (public), otherwise: ε_s is what brings ρ down to
   :data:`TARGET_RHO`, held within [5%, 50%] of ε; the residual histogram gets
   ε₁ = :data:`HISTOGRAM_RATE`/n, held within [2%, 10%] of ε (about what the
   histogram needs to be trusted bin by bin); the release gets the rest, ε₂.
   A statistic costs about the same absolute ε whatever ε is, so at large ε
   almost all of it goes to the release.
3. **Which release** (private statistics, post-processing of releases 1 and
   2). After the linear fit and the residual histogram (both paid inside ε),
   the unbiased residual release is fitted (no label is read) and its exact
   label variance σ_u² under the residual prior is known, as is a private
   estimate v̂ of the label variance (the variance of the linear predictions
   plus that of the residual prior). The noise a model trained on n unbiased
   labels must average out, relative to what there is to learn, is
   Q = σ_u²/(n·v̂). If Q < :data:`UNBIASED_BELOW`, the labels go out unbiased
   (m(x) + an unbiased release of the clipped residual: the model learns the
   truth, with noise it can average away); otherwise RPWithPrior with the
   per-row prior, denoised (less noise, some pull towards the linear model).

Every constant was fixed from validation runs that never read a test row
(the training rows of the bundled data sets split again) and before the
sweep that judges ``auto`` (plots/auto/). The sidecar records every quantity
the rule read, the branch and every ε spent (``record["auto"]``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from rpwjax.errors import check_epsilon, check_labels, check_range
from rpwjax.keys import Secret, check_secret
from rpwjax.pipelines.linear_prior import check_features, linear_residual_prior, release_around
from rpwjax.pipelines.residuals import unbiased_residual_fit
from rpwjax.pipelines.statistics import public_design

AFFORD_RHO = 0.5  # step 1: above this relative coefficient noise at ε_s = ε/2, the features are not used
TARGET_RHO = 0.1  # step 2: ε_s brings the relative coefficient noise down to this
STATS_SHARE = (0.05, 0.5)  # step 2: ε_s/ε held within these
HISTOGRAM_RATE = 320.0  # step 2: ε₁ = HISTOGRAM_RATE / n ...
HISTOGRAM_SHARE = (0.02, 0.1)  # ... held within these shares of ε
UNBIASED_BELOW = 0.002  # step 3: unbiased labels when σ_u²/(n·v̂) is below this
COMPONENTS = 8
RESIDUAL_BINS = 32
CALIBRATED_PRIOR_FRACTION = 0.5


@dataclasses.dataclass(frozen=True)
class AutoPlan:
    """Steps 1 and 2 of the rule: public numbers only."""

    epsilon: float
    rows: int
    components: int
    l1_bound: float
    width: float
    rho_at_half: float  # ρ with ε_s = ε/2
    branch: str  # "calibrated" | "linear"
    statistics_epsilon: float
    residual_histogram_epsilon: float
    release_epsilon: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def relative_coefficient_noise(rows: int, components: int, l1_bound: float, eps_s: float) -> float:
    """ρ(ε_s) = 2√2·B·√(k+1)/(ε_s·n): the linear fit's coefficient noise over a coefficient's scale."""
    return 2 * math.sqrt(2) * l1_bound * math.sqrt(components + 1) / (eps_s * rows)


def plan(epsilon: float, rows: int, components: int, l1_bound: float, width: float) -> AutoPlan:
    """Steps 1 and 2 of the rule (see the module docstring)."""
    eps = float(epsilon)
    rho_half = relative_coefficient_noise(rows, components, l1_bound, eps / 2)
    if rho_half > AFFORD_RHO:
        eps1 = CALIBRATED_PRIOR_FRACTION * eps
        return AutoPlan(eps, rows, components, l1_bound, width, rho_half, "calibrated", 0.0, eps1, eps - eps1)
    needed = relative_coefficient_noise(rows, components, l1_bound, 1.0) / TARGET_RHO  # ε_s with ρ = TARGET_RHO
    eps_s = float(np.clip(needed, STATS_SHARE[0] * eps, STATS_SHARE[1] * eps))
    eps1 = float(np.clip(HISTOGRAM_RATE / rows, HISTOGRAM_SHARE[0] * eps, HISTOGRAM_SHARE[1] * eps))
    return AutoPlan(eps, rows, components, l1_bound, width, rho_half, "linear", eps_s, eps1, eps - eps_s - eps1)


def auto_labels(features, labels, lo, hi, epsilon, *, secret: Secret, bins: int = 32):
    """Private training labels by the ``auto`` rule: ``(labels, record)``; ``record["auto"]`` is the rule's trace."""
    from rpwjax.pipelines.calibrated import calibrated_denoised

    lo, hi = check_range(lo, hi)
    eps = float(check_epsilon(epsilon))
    y = check_labels(labels, lo, hi)
    x = check_features(features, y)
    check_secret(secret)
    design, bound = public_design(x, COMPONENTS)
    p = plan(eps, y.size, design.shape[1] - 1, bound, hi - lo)
    trace = {"rule": "rpwjax.pipelines.auto", "plan": p.to_json()}
    if p.branch == "calibrated":
        out, record = calibrated_denoised(y, lo, hi, eps, secret=secret.child("auto-calibrated"),
                                          prior_fraction=CALIBRATED_PRIOR_FRACTION, bins=bins)
        trace["release"] = "rpwithprior (calibrated prior, denoised)"
        return out, {**record, "pipeline": "auto", "per_label_epsilon": eps, "auto": trace}
    s = secret.child("auto-linear").for_epsilon(eps)
    prior = linear_residual_prior(design, bound, y, lo, hi, p.statistics_epsilon, p.residual_histogram_epsilon, s,
                                  residual_bins=RESIDUAL_BINS)
    fit = unbiased_residual_fit(prior.edges, prior.mass, hi - lo, p.release_epsilon)
    noise = float(fit[2]["label_mse"])
    centres = 0.5 * (prior.edges[1:] + prior.edges[:-1])
    r_mean = float(np.sum(prior.mass * centres))
    variance = float(np.var(prior.centres) + np.sum(prior.mass * (centres - r_mean) ** 2)
                     + np.sum(prior.mass * np.diff(prior.edges) ** 2) / 12)
    q = noise / (y.size * max(variance, 1e-12 * (hi - lo) ** 2))
    stage2 = "unbiased" if q < UNBIASED_BELOW else "rpwithprior"
    out, fields = release_around(prior, y, lo, hi, p.release_epsilon, s, stage2, unbiased_fit=fit)
    trace.update(unbiased_label_variance=noise, label_variance_estimate=variance, q=q, release=stage2)
    record = {"pipeline": "auto", "epsilon": eps, "rows": int(y.size),
              "statistics_epsilon": p.statistics_epsilon, "residual_histogram_epsilon": p.residual_histogram_epsilon,
              "mechanism": stage2, "mechanism_epsilon": p.release_epsilon, "components": prior.components,
              "l1_bound": prior.l1_bound, "per_label_epsilon": eps, **fields, "auto": trace}
    return out, record
