r"""Beyond the paper: feature-aware priors, and the pipelines that use them.

Why. A prior that ignores the features is the same for every label, so the
best any randomizer (or posterior denoising) can do with it is to pull every
label towards the same place. The features are public under label-DP: a
model trained on privatized labels predicts where each label probably lies,
and a prior centred there lets the mechanism spend its budget on a narrow
window around the truth.

The rooms:

* :mod:`~rpwjax.pipelines.auto`: the recommended one (the default of
  ``rpwjax privatize-table``): a written rule on public quantities and
  paid-for private statistics picks the release and every setting.
* :mod:`~rpwjax.pipelines.two_stage`: split the rows; stage 1 privatizes part A
  under a private histogram and trains a model on it; stage 2 privatizes part
  B under residual priors centred on that model (two variants of stage 2).
* :mod:`~rpwjax.pipelines.linear_prior`: no split; a private linear model
  centres every row's prior.
* :mod:`~rpwjax.pipelines.feature_prior`: the fair comparison, RR-on-Bins
  or Unbiased given ``auto``'s feature-aware prior.
* :mod:`~rpwjax.pipelines.calibrated`: no features; a private histogram tilted
  to a private mean.
* :mod:`~rpwjax.pipelines.residuals` and :mod:`~rpwjax.pipelines.statistics`:
  the private releases they share (residual histograms, a private mean, a
  private linear fit). Every histogram is the one ``Hist_ε`` release of
  :func:`rpwjax.priors.histogram_release`; every per-ε key comes from
  :meth:`rpwjax.keys.Secret.for_epsilon`; every label leaves through
  :func:`rpwjax.release`.
* :mod:`~rpwjax.pipelines.table`: a user's table in, a table out (``rpwjax
  privatize-table``).

:data:`PIPELINES` is the one registry (the CLI, the sweeps and the table
runner read it). The full design and accounting: docs/beyond-the-paper.md.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Mapping

import numpy as np

from rpwjax.errors import InputError
from rpwjax.keys import Secret
from rpwjax.pipelines.auto import auto_labels
from rpwjax.pipelines.calibrated import calibrated_denoised
from rpwjax.pipelines.feature_prior import feature_prior_labels
from rpwjax.pipelines.linear_prior import linear_prior_labels
from rpwjax.pipelines.two_stage import TwoStageConfig, two_stage_labels
from rpwjax.priors import DEFAULT_BINS


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """One row of the registry: a pipeline kind with fixed settings."""

    name: str
    kind: str  # "auto" | "two-stage" | "linear-prior" | "calibrated" | "feature-prior"
    settings: Mapping
    postprocessing: str  # after the release: "posterior-mean" | "none" | "by-rule" (auto: record["denoised"])

    @property
    def trains_models(self) -> bool:
        """Whether the pipeline trains stage models on private labels (then ``epochs`` applies)."""
        return self.kind == "two-stage"

    def two_stage_config(self, bins: int = DEFAULT_BINS, scale_targets: bool = False):
        if self.kind != "two-stage":
            raise InputError(f"pipeline {self.name!r} is not a two-stage pipeline")
        return TwoStageConfig(bins=bins, scale_targets=scale_targets, **self.settings)

    def run(self, features, labels, lo, hi, epsilon, *, secret: Secret, epochs: int = 50, bins: int = DEFAULT_BINS,
            step=None, scale_targets: bool = False):
        """Private training labels for one ε: ``(labels, record)`` (the record is the accounting).

        ``step(name)``, if given, is called as each step of the pipeline starts (``auto``'s steps; the
        others are one step). ``scale_targets``: a pipeline's stage models learn the labels mapped from the
        public [lo, hi] onto [0, 1] (a user's table; the bundled sets' sweeps keep raw labels)."""
        if self.kind == "auto":
            return auto_labels(features, labels, lo, hi, epsilon, secret=secret, bins=bins, step=step,
                               **self.settings)
        if self.kind == "feature-prior":
            return feature_prior_labels(features, labels, lo, hi, epsilon, secret=secret, bins=bins, **self.settings)
        if self.kind == "linear-prior":
            return linear_prior_labels(features, labels, lo, hi, epsilon, secret=secret, **self.settings)
        if self.kind == "calibrated":
            return calibrated_denoised(labels, lo, hi, epsilon, secret=secret, bins=bins, **self.settings)

        run = two_stage_labels(features, labels, lo, hi, epsilon, secret=secret,
                               config=self.two_stage_config(bins, scale_targets), epochs=epochs)
        return np.asarray(run.labels, np.float64), run.record


def _row(name, kind, postprocessing="posterior-mean", **settings) -> Pipeline:
    return Pipeline(name, kind, MappingProxyType(dict(settings)), postprocessing)


PIPELINES: dict[str, Pipeline] = {
    p.name: p
    for p in (
        _row("auto", "auto", "by-rule"),
        # auto with step 2 of its rule fixed: for validating the rule (rpwjax.pipelines.auto), not a recommendation
        _row("auto-denoised", "auto", "by-rule", branch="denoised"),
        _row("auto-unbiased", "auto", "by-rule", branch="unbiased"),
        _row("rpwithprior+calibrated", "calibrated", prior_fraction=0.5),
        _row("linear-prior", "linear-prior", stats_fraction=0.4, prior_fraction=0.1),
        _row("two-stage", "two-stage", stage1="unbiased", stage2="rpwithprior", fraction=0.5),
        _row("two-stage-rpwithprior", "two-stage", stage1="rpwithprior", stage2="rpwithprior", fraction=0.5),
        _row("two-stage-unbiased", "two-stage", "none", stage1="unbiased", stage2="unbiased", fraction=0.3),
        _row("rr-on-bins+feature-prior", "feature-prior", "none", mechanism="rr-on-bins"),
        _row("unbiased+feature-prior", "feature-prior", "none", mechanism="unbiased"),
    )
}
ALIASES = {"calibrated": "rpwithprior+calibrated"}  # the name privatize-table has always accepted


def pipeline(name: str) -> Pipeline:
    """The registry row of ``name`` (or of an alias)."""
    key = ALIASES.get(name, name)
    if key not in PIPELINES:
        raise InputError(f"pipeline must be one of {', '.join(list(PIPELINES) + list(ALIASES))}, got {name!r}")
    return PIPELINES[key]


__all__ = ["ALIASES", "PIPELINES", "Pipeline", "pipeline"]
