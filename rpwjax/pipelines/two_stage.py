r"""The two-stage pipeline (one ε; every label is privatized exactly once):

1. Split the training rows at random (public randomness, independent of
   the labels) into part A (``fraction`` of the rows) and part B.
2. Stage 1, part A: a private histogram of A's labels (ε₁ = ``prior_fraction``·ε,
   integer counts plus exact discrete Laplace noise, projected onto the public row count,
   :func:`project_counts`)
   and the ``stage1`` mechanism with ε₂ = ε - ε₁. A model m₁ is trained on
   A's private labels, early-stopped on a public 20% of A's rows against
   their private labels (:func:`stage_model_predictions`; post-processing).
3. Stage 2, part B: the residuals r = y - m₁(x) of B (m₁ clipped to the
   range, so r lies in the public [-(hi-lo), hi-lo]) are released once as a
   histogram with exact discrete Laplace noise of rate ε₁/2; the residual prior h is its projected masses when
   a public rule says the release is reliable, else a Laplace density fitted
   to the noisy counts (:func:`residual_histogram`).
   Row i of B gets the prior π_i(y) ∝ h(y - m₁(x_i)) restricted to
   [lo, hi]: the residual prior shifted to the model's prediction.
   ``stage2="rpwithprior"``: m₁(x_i) is first rounded to one of ``levels`` + 1
   public levels across [lo, hi] (post-processing), and each row gets its
   level's interval [A1_i, A2_i], the exact optimum of neighbourhood
   preservation under π_i (the Dinkelbach search of
   :mod:`rpwjax.mechanisms.interval_search`, vmapped over the levels; one
   search and one release certificate per level, not per row), ζ chosen by
   ``zeta="auto"`` on the residual histogram, ε₂ = ε - ε₁; the output is
   then denoised to E_{π_i}[Y | Ỹ = ỹ] (exact, closed form).
   ``stage2="unbiased"``: the optimal unbiased randomizer for the residual,
   fitted once on the residual range [c_lo, c_hi] (the 2% and 98% quantiles
   of the private residual histogram), applied to clip(y - m₁(x), c_lo, c_hi)
   and shifted back by m₁(x): E[Ỹ | y] = m₁(x) + clip(y - m₁(x), c_lo, c_hi),
   so labels are unbiased except beyond the residual range, with noise scaled
   to the residual range instead of the whole range.
4. With ``stage2="rpwithprior"``, part A is denoised by cross-fitting: a model
   m₂ trained on B's denoised labels centres the residual histogram on A's
   rows, and A's stage-1 outputs are replaced by their exact posterior means
   under those priors (m₂ never saw A's labels, so A's own noise is not fed
   back into its prior). With ``stage2="unbiased"`` part A keeps its
   unbiased stage-1 outputs.
5. The final model trains on all rows' labels.

Accounting. A label in A is read by A's histogram (ε₁) and by its stage-1
output (ε₂): ε. A label in B is read by the residual histogram (ε₁, which
depends on m₁, itself a function of A's private outputs only: adaptive
composition) and by its stage-2 output (ε₂): ε. A and B are disjoint, so
changing one label changes one part's releases only (parallel composition).
Models, intervals, ζ and denoising are functions of private releases and
public features: post-processing. Total: ε-label-DP. Stage-1 models are
fitted on privatized labels only.

See :mod:`rpwjax.pipelines` for why a feature-aware prior helps.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rpwjax.accounting import Accounting, record_fields
from rpwjax.errors import InputError, check_epsilon, check_integer, check_labels, check_range
from rpwjax.keys import Secret
from rpwjax.mechanisms import entry
from rpwjax.mechanisms.rpwithprior import choose_zeta
from rpwjax.sampling import check_release_epsilon
from rpwjax.pipelines.linear_prior import release_on_levels
from rpwjax.pipelines.residuals import (residual_histogram, shifted_priors, unbiased_residual_fit,
                                       unbiased_residual_release)
from rpwjax.pipelines.rule import DEFAULT_RULE
from rpwjax.posterior import posterior_mean, posterior_mean_per_row
from rpwjax.priors import DEFAULT_BINS, Prior, histogram_prior, private_histogram
from rpwjax.release_path import release, sidecar_fields
from rpwjax.training import predict_many, target_scale, train_many

# the pipelines' histograms: projected onto the public row count, noise keyed by purpose "counts" under a
# per-stage child secret (each pipeline derives one child secret per ε first)
_PROJECTED = {"projection": "project", "purpose": "counts", "keyed_by_epsilon": False}


STAGE1 = ("unbiased", "rpwithprior", "rr-on-bins", "laplace", "staircase")


STAGE2 = ("rpwithprior", "unbiased")



@dataclasses.dataclass(frozen=True)
class TwoStageConfig:
    """Settings of the two-stage pipeline (see the module docstring)."""

    stage1: str = "unbiased"
    stage2: str = "rpwithprior"
    fraction: float = 0.5  # share of the training rows in part A
    prior_fraction: float = 0.1  # ε₁/ε in each stage
    bins: int = DEFAULT_BINS  # stage-1 private histogram
    residual_bins: int = DEFAULT_BINS
    holdout: float = 0.2  # share of a stage's rows whose private labels pick the stage model's epoch (0: none)
    levels: int = DEFAULT_RULE.levels  # stage 2 rounds m1 to levels + 1 public levels across the range
    # the stage models learn the labels mapped from the public [lo, hi] onto [0, 1], so that labels in any
    # units train alike (a user's table); False keeps the raw labels of the committed sweeps
    scale_targets: bool = False

    def validate(self):
        if self.stage1 not in STAGE1:
            raise InputError(f"stage1 must be one of {', '.join(STAGE1)}, got stage1={self.stage1!r}")
        if self.stage2 not in STAGE2:
            raise InputError(f"stage2 must be one of {', '.join(STAGE2)}, got stage2={self.stage2!r}")
        if not 0 < self.fraction < 1:
            raise InputError(f"fraction must be in (0, 1), got fraction={self.fraction!r}")
        if not 0 <= self.holdout < 1:
            raise InputError(f"holdout must be in [0, 1), got holdout={self.holdout!r}")
        if not 0 < self.prior_fraction < 1:
            raise InputError(f"prior_fraction must be in (0, 1), got prior_fraction={self.prior_fraction!r}")
        for name in ("bins", "residual_bins", "levels"):
            check_integer(getattr(self, name), name, 2)
        return self


class TwoStageRun:
    """One run of the pipeline for one ε, in phases, so that a caller can train many runs' models at once.

    ``run = TwoStageRun(y, lo, hi, epsilon, secret, config)``; then
    ``run.stage1_rows`` / ``run.stage1_targets`` -> train m₁ -> ``run.stage2(pred_m1)`` (predictions
    for ALL rows) -> ``run.cross_rows`` / ``run.cross_targets`` -> train m₂ (skipped when
    ``run.needs_cross`` is False) -> ``run.finish(pred_m2)`` -> ``run.labels`` (all rows) and ``run.record``.
    """

    def __init__(self, labels, lo, hi, epsilon, secret: Secret, config: TwoStageConfig = TwoStageConfig()):
        self.config = config.validate()
        self.lo, self.hi = check_range(lo, hi)
        self.epsilon = float(check_epsilon(epsilon))
        self._y = check_labels(labels, self.lo, self.hi)
        n = self._y.size
        n_a = int(round(config.fraction * n))
        if n_a < 2 or n - n_a < 2:
            raise InputError(f"cannot split {n} rows into two parts with fraction={config.fraction!r}")
        if not isinstance(secret, Secret):
            raise InputError(f"secret must be an rpwjax.keys.Secret, got {type(secret).__name__}")
        # the split is independent of the labels (and of ε, so runs at several ε share it)
        order = np.random.default_rng(int.from_bytes(secret.digest("split"), "big")).permutation(n)
        self.part_a, self.part_b = np.sort(order[:n_a]), np.sort(order[n_a:])
        # the account: partition "split", part 0 is A and part 1 is B (each part's releases read its rows only)
        self.accounting = Accounting(n, self.epsilon)
        split = np.zeros(n, np.int64)
        split[self.part_b] = 1
        self.accounting.partition("split", split)
        self._secret = secret.for_epsilon(self.epsilon)
        self.eps1 = config.prior_fraction * self.epsilon
        self.eps2 = self.epsilon - self.eps1
        # each stage's release at an ε no float64 release can certify is refused now, before any draw
        stage1_eps = self.eps2 if entry(config.stage1).uses_prior else self.epsilon
        for stage, eps in ((config.stage1, stage1_eps), (config.stage2, self.eps2)):
            check_release_epsilon(entry(stage).params, eps, f"[{self.lo:.17g}, {self.hi:.17g}]")
        self._stage1()

    # stage 1 ----------------------------------------------------------------
    def _stage1(self):
        cfg = self.config
        y_a = self._y[self.part_a]
        row = entry(cfg.stage1)
        fit_fn, uses_prior = row.fit, row.uses_prior
        if uses_prior:
            prior = private_histogram(y_a, self.lo, self.hi, self.eps1, bins=cfg.bins,
                                      secret=self._secret.child("stage1-histogram"), **_PROJECTED,
                                      accounting=self.accounting.within("split", 0))
            eps_mech = self.eps2
        else:  # a prior-free mechanism gets all of ε on part A
            prior, eps_mech = None, self.epsilon
        options = {"zeta": "auto"} if cfg.stage1 == "rpwithprior" else {}
        params, _ = fit_fn(prior if prior is not None else Prior(
            np.array([self.lo]), np.array([self.hi]), np.array([1.0]), self.lo, self.hi, False, "none"), eps_mech, **options)
        self.stage1_params, self.stage1_epsilon = params, eps_mech
        self.global_prior = prior
        noisy = release(params, self._secret.child("stage1"), y_a, accounting=self.accounting.within("split", 0))
        self.stage1_outputs = noisy
        # m1 learns from the private outputs; RPWithPrior's are denoised under the global prior first
        if cfg.stage1 == "rpwithprior":
            self.stage1_targets = posterior_mean(params, prior, noisy)
        else:
            self.stage1_targets = noisy

    @property
    def stage1_rows(self):
        return self.part_a

    # stage 2 ----------------------------------------------------------------
    def stage2(self, predictions):
        cfg = self.config
        width = self.hi - self.lo
        m1 = np.clip(np.asarray(predictions, np.float64), self.lo, self.hi)
        b = self.part_b
        y_b = self._y[b]
        part_b = self.accounting.within("split", 1)
        self.residual_edges, self.residual_mass = residual_histogram(
            y_b - m1[b], width, self.eps1, bins=cfg.residual_bins, secret=self._secret.child("residual-histogram"),
            accounting=part_b)
        if cfg.stage2 == "rpwithprior":
            residual_prior = histogram_prior(self.residual_edges, self.residual_mass)
            self.zeta = float(choose_zeta(residual_prior, self.eps2)[0])
            # m1 rounded to the public levels: one interval search and one certificate per level, not per row
            self.labels_b, self.stage2_params, self.stage2_outputs = release_on_levels(
                lambda c: shifted_priors(self.residual_edges, self.residual_mass, c, self.lo, self.hi,
                                         self.global_prior),
                m1[b], y_b, self.lo, self.hi, self.zeta, self.eps2, self._secret.child("stage2"), cfg.levels,
                accounting=part_b)
        else:
            params, (c_lo, c_hi), _ = unbiased_residual_fit(self.residual_edges, self.residual_mass, width, self.eps2)
            self.labels_b, noisy = unbiased_residual_release(params, (c_lo, c_hi), m1[b], y_b,
                                                             self._secret.child("stage2"), accounting=part_b)
            self.residual_range = (c_lo, c_hi)
            self.stage2_params, self.stage2_outputs = params, noisy
            self.zeta = None
        return self

    @property
    def needs_cross(self) -> bool:
        return self.config.stage2 == "rpwithprior" and self.config.stage1 in ("rpwithprior", "rr-on-bins", "unbiased")

    @property
    def cross_rows(self):
        return self.part_b

    @property
    def cross_targets(self):
        return self.labels_b

    def finish(self, predictions=None):
        if self.needs_cross:
            m2 = np.clip(np.asarray(predictions, np.float64), self.lo, self.hi)
            priors = shifted_priors(self.residual_edges, self.residual_mass, m2[self.part_a], self.lo, self.hi,
                                    self.global_prior)
            labels_a = posterior_mean_per_row(self.stage1_params, priors, self.stage1_outputs)
        else:
            labels_a = self.stage1_outputs
        labels = np.empty(self._y.size)
        labels[self.part_a] = labels_a
        labels[self.part_b] = self.labels_b
        self.labels = labels
        return self

    @property
    def record(self) -> dict:
        """The settings per part and the account (JSON-ready): its entries read part A or part B of the
        partition "split"."""
        cfg = self.config
        return {
            "pipeline": "two-stage",
            "range": [self.lo, self.hi],
            "part_a": {"rows": int(self.part_a.size), "mechanism": cfg.stage1, "bins": cfg.bins},
            "part_b": {"rows": int(self.part_b.size), "mechanism": cfg.stage2, "residual_bins": cfg.residual_bins,
                       "zeta": self.zeta, **({"levels": cfg.levels + 1} if cfg.stage2 == "rpwithprior" else {})},
            "denoised": cfg.stage2 == "rpwithprior",
            "release": {"part_a": sidecar_fields(self.stage1_params),
                        "part_b": sidecar_fields(self.stage2_params)},
            **record_fields(self.accounting),
        }


def stage_model_predictions(features, rows, targets, seeds, *, epochs: int = 50, holdout: float = 0.2,
                            split_seed: int = 0, target_range=None) -> np.ndarray:
    """Train one stage model per target row on ``features[rows]``; predictions for ALL rows, (M, n).

    The stage models learn from private labels only (mapped from ``target_range`` onto [0, 1] when it is
    given, the predictions mapped back). With ``holdout > 0`` a
    public random share of ``rows`` is held out and each model keeps the epoch
    with the smallest squared error against the held-out *private* labels
    (post-processing: early stopping costs no privacy).
    """
    x = np.asarray(features, np.float32)
    rows = np.asarray(rows)
    # target_range=(lo, hi): the models learn (t - lo)/(hi - lo), mapped back after (an affine map, public)
    lo, width = target_scale(target_range)
    targets = np.atleast_2d(((np.asarray(targets, np.float64) - lo) / width).astype(np.float32))
    validation = None
    fit_rows = np.arange(rows.size)
    if holdout > 0:
        order = np.random.default_rng(split_seed).permutation(rows.size)
        n_val = int(round(holdout * rows.size))
        if 0 < n_val < rows.size:
            val, fit_rows = np.sort(order[:n_val]), np.sort(order[n_val:])
            validation = (x[rows[val]], targets[:, val])
    params = train_many(x[rows[fit_rows]], targets[:, fit_rows], np.asarray(seeds), epochs=epochs, validation=validation)
    predictions = predict_many(params, x)
    return predictions if target_range is None else lo + width * predictions.astype(np.float64)


def train_runs(runs: list[TwoStageRun], features, *, epochs: int = 50, model_seed: int = 0,
               split_seed: int = 0) -> list[TwoStageRun]:
    """Drive runs that share one A/B split through both stages, their stage models trained together.

    Stage-1 models get seeds ``model_seed + 1`` and hold-out split ``split_seed + 1``; the cross-fitted
    models ``+ 2``. Returns the finished runs (``.labels``, ``.record``).
    """
    x = np.asarray(features, np.float32)
    first = runs[0]
    if any(not np.array_equal(r.part_a, first.part_a) for r in runs[1:]):
        raise InputError("runs trained together must share their A/B split (the same seed)")
    if x.ndim != 2 or x.shape[0] != first.part_a.size + first.part_b.size:
        raise InputError(f"features must be (n, d) with one row per label, got shape {x.shape}")
    holdout = first.config.holdout

    def predict(rows, targets, offset):
        return stage_model_predictions(x, rows, np.stack(targets), np.full(len(targets), model_seed + offset),
                                       epochs=epochs, holdout=holdout, split_seed=split_seed + offset,
                                       target_range=(first.lo, first.hi) if first.config.scale_targets else None)

    for run, pred in zip(runs, predict(first.stage1_rows, [r.stage1_targets for r in runs], 1)):
        run.stage2(pred)
    preds = predict(first.cross_rows, [r.cross_targets for r in runs], 2) if first.needs_cross else [None] * len(runs)
    for run, pred in zip(runs, preds):
        run.finish(pred)
    return runs


def two_stage_labels(features, labels, lo, hi, epsilon, *, secret: Secret, config: TwoStageConfig = TwoStageConfig(),
                     epochs: int = 50) -> TwoStageRun:
    """Run the whole pipeline for one ε; ``.labels`` are the private training labels, ``.record`` the accounting.

    ``secret`` drives the split, the noise and the stage models' initialisation.
    """
    run = TwoStageRun(labels, lo, hi, epsilon, secret, config)
    model_seed = int.from_bytes(secret.digest("models")[:4], "big") >> 1
    return train_runs([run], features, epochs=epochs, model_seed=model_seed, split_seed=model_seed)[0]
