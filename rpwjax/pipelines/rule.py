r"""The ``auto`` rule as data: every number the rule decides with (:class:`AutoRule`), and the decisions it made
(:class:`AutoPlan`).

The rule reads public quantities (ε, the number of rows n, the public features, the public range [lo, hi] of
width W) and private statistics it pays for inside the same ε. Steps 1 to 3 (design, branch, budget split:
:func:`plan`) read public quantities only; step 4's decisions (how the linear fit is released, whether it is
calibrated, each unbiased group's clip) read released statistics. The steps in words, and the history of
every number: docs/auto.md.

This module imports no pipeline module: the statistics and residual functions take their numbers from an :class:`AutoRule`
(their defaults are :data:`DEFAULT_RULE`'s), so that a rule passed to :func:`rpwjax.pipelines.auto.auto_labels`
reaches every decision.
"""

from __future__ import annotations

import dataclasses
import math


from rpwjax.errors import InputError
from rpwjax.priors import DEFAULT_BINS

FALLBACK_MEAN_WEIGHTINGS = ("inverse-variance", "private")  # AutoRule.fallback_mean_weighting
BRANCHES = ("denoised", "unbiased")  # the outcomes of step 2 a caller may fix (validation of the rule)


@dataclasses.dataclass(frozen=True)
class AutoRule:
    """Every number of the ``auto`` rule, each with where it comes from.

    "Validation" names the committed run in plots/auto/ that set or checked the number (its account in
    docs/auto.md, "Validation history"); "set from the variant sweeps" means docs/beyond-the-paper.md,
    sections 4 and 5 (plots/beyond/), before the judged sweep was run; "derivation" means the number follows
    from the quantity it bounds, not from a run."""

    # ---- step 1: the public design (features and n only)
    components: int = 8
    # the most principal components the design keeps; set from the variant sweeps (linear-prior's 8 components),
    # the count below it by plots/auto/components-validation/
    score_quantile: float = 0.01
    # every principal score clipped to its q and 1 - q quantiles before the bound; plots/auto/validation/ (rerun
    # with the clip; a 2.5% clip was worse on RAND HIE, docs/auto.md "Step 1's score clip")
    l1_bound_quantile: float = 0.95
    # the public L1 row bound B is this quantile of the design rows' L1 norms (rows above it are shrunk);
    # set from the variant sweeps (docs/beyond-the-paper.md section 4, "Public design")
    afford_rho: float = 0.5
    # k components are affordable when ρ(afford_share·ε) is at most this; set from the variant sweeps, kept by
    # plots/auto/components-validation/ (the component count added no constant)
    afford_share: float = 0.5
    # derivation: ε/2 is the largest share step 3 gives the fit on an informative release (statistics_share_noisy)

    # ---- step 2: unbiased or denoised labels (public)
    unbiased_below: float = 0.001
    # unbiased labels when Q = σ²_U(ε)·12/n is below this; plots/auto/validation.md (the crossover of forced
    # denoised and forced unbiased on five folds of California and Crime)
    uniform_prior_bins: int = DEFAULT_BINS
    # σ²_U(ε) is the Unbiased mechanism's label variance on the uniform prior of this many bins (a computed number)

    # ---- step 3: the budget split (public)
    calibrated_prior_share: float = 0.5
    # branch calibrated (no features): ε₁ of the mean-calibrated prior; set from the variant sweeps (section 3)
    statistics_share: float = 0.4
    # denoised: ε_s = 0.4·ε ...
    statistics_share_noisy: float = 0.5
    # ... or 0.5·ε where ρ(statistics_share·ε) > noisy_fit_rho; both set from the variant sweeps (section 5)
    noisy_fit_rho: float = 0.15
    # the threshold of the line above
    histogram_share: float = 0.1
    # denoised: ε₁ of the residual histogram; set from the variant sweeps (section 5)
    uninformative_release: float = 1.0
    # derivation: Q >= 1 means that averaging all n released labels leaves noise as large as a label's spread;
    # not tuned (plots/auto/uninformative-validation/ checked it)
    uninformative_statistics_share: float = 0.7
    # ... then ε_s; plots/auto/uninformative-validation/ (centres' error 0.7·ε against 0.5·ε, docs/auto.md)
    unreadable_histogram_fallback: bool = True
    # denoised, Q below uninformative_release: where even the fewest residual bins (fewest_residual_bins) would
    # hold fewer than rows_per_noise_per_bin rows per unit of noise scale, rows·ε₁/2/bins (the threshold the
    # histogram's own bin count uses, so no new number), the histogram cannot be told from its noise and its
    # location is not read: the row priors are mean-matched (their mean the fit's centre, whose noise energy
    # is known before the release: FitChoice). False: the censored row priors as before this fallback.
    # plots/auto/fallback-validation/ (docs/auto.md, "Step 3's fallback")
    fallback_mean_share: float = 0.5
    # ... and this share of ε₁ buys a private mean of the labels that the centres' mean is moved to (exact
    # integer noise, sensitivity W/n: its error, standard deviation √2·W/(n·share·ε₁), is known in advance,
    # where the histogram's location is not); the histogram gets the rest, for its shape. Derivation: the
    # mean-calibrated prior's split of its ε₁ (rpwjax.pipelines.calibrated: half a histogram, half a mean);
    # not tuned
    fallback_mean_weighting: str = "inverse-variance"
    # ... and the centres' mean is moved to the combination of the two estimates of the labels' mean that the
    # fallback holds, each with its noise variance known in advance: the fit's own (the mean of its predictions
    # refitted without the ridge, statistics.fit_mean_estimate) and the private mean's (2·(W/(n·mean_epsilon))²),
    # weighted by their inverse variances (the weights that minimise the combined noise of two unbiased
    # estimates; derivation, not tuned). plots/auto/fallback-mean-validation/ checked it (docs/auto.md, "The
    # fallback's mean, on fresh folds of Crime"). "private": the private mean alone, as before
    level_anchor_share: float = 0.1
    # denoised with censored row priors (Q below uninformative_release, no fallback): this share of ε, taken from
    # the release, buys a private mean of the labels, and every centre is moved by one shift so that the row
    # priors' mean over the rows is that mean combined with the fit's own (fallback_mean_weighting's inverse
    # variances). The labels' level then rests on statistics whose noise is known in advance, not on the
    # residual histogram's location and noisy tails. 0: none. plots/auto/level-anchor-validation/ (0.1·ε against
    # 0.05·ε and half of ε₁ on split 0's training labels first; docs/auto.md "The level anchor, on fresh folds")
    target_rho: float = 0.1
    # unbiased: ε_s brings ρ down to this ...
    unbiased_statistics_shares: tuple[float, float] = (0.05, 0.1)
    # ... held within these shares of ε; set from the variant sweeps (section 5)
    unbiased_histogram_share: float = 0.05
    # unbiased: ε₁; set from the variant sweeps (section 5): at least 85% of ε goes to the release

    # ---- step 4: the linear fit (released statistics and public numbers)
    prior_scale: float = 0.25
    # derivation: the fits' ridge is the posterior mean for coefficients of prior scale τ = prior_scale·W
    # (a label's deviation from the range's middle is at most W/2; τ = W/4 is half of that)
    cell_components: int = 3
    # the fit from 2^k cell means only with at most this many components; plots/auto/cells-validation/uncapped/
    cell_noise_ratio: float = 0.5
    # ... and only when its noise energy is at most this of the sums'; plots/auto/cells-validation/
    calibrate_below: float = 4.0
    # denoised: below this signal-to-noise ratio the fit's slope is calibrated ...
    calibrate_noise_quantile: float = 0.999
    # ... and wherever the fit's energy E/N lies below this quantile of E/N under pure noise
    # (statistics.fit_noise_ratio_quantile: the law of the fit's own Laplace noise, public): a fit is left
    # unchecked only where noise alone would reach its energy less than once in 1,000 fits. Derivation, not
    # tuned: the fixed ratio 4 above was crossed by noise alone in about 1% of fits. Validated with the level
    # anchor on three fresh folds, plots/auto/calibration-trigger-validation/ (docs/auto.md, "The calibration's
    # trigger, on fresh folds"); 0: the fixed ratio alone ...
    calibration_share: float = 0.1
    # ... with this share of ε, taken from the release; plots/auto/calibration-validation/ (set on the fit's
    # in-sample error first; 0.05·ε was worse)
    slope_noise_below: float = 1.0
    # derivation: the width of [0, 1], which the slope is clipped to; only a slope noisier than that may be
    # skipped; plots/auto/uninformative-validation/ (a guard at 1/(1 + ratio) was worse at ε = 0.3)
    slope_clip_quantile: float = 0.95
    # the slope's weights are the direction clipped at this quantile of its magnitudes (the sensitivity's bound),
    # as the design's L1 bound is

    # ---- step 4: the residual histogram (released with ε₁)
    residual_bins: int = DEFAULT_BINS
    # the most bins of the released histogram: the library's histogram prior (rpwjax.priors.DEFAULT_BINS) ...
    residual_resolution: int = 2
    # ... and the prior it gives has residual_resolution·residual_bins bins (derivation: a residual range of 2W
    # at twice the bins keeps a bin W/residual_bins wide, as the label histogram's)
    fewest_residual_bins: int = 4
    # (the least the halving below goes to)
    rows_per_noise_per_bin: float = 4.0
    # the bins are halved (down to fewest_residual_bins) until each holds at least this many rows per unit of
    # noise scale (rows·ε/2/bins); not tuned on any run: a bin whose count is not several noise scales says little
    reliable_noise: float = 0.1
    # derivation: the bins are the prior when the histogram's relative L2 noise √(8·bins)/(ε·n) is at most this
    # (docs/beyond-the-paper.md section 2), else a Laplace density fitted to them:
    laplace_locations: int = 81
    # ... its location on this many points ...
    laplace_location_span: float = 0.5
    # ... across ±span·W ...
    laplace_scales: int = 60
    # ... its scale on this many points ...
    laplace_scale_span: tuple[float, float] = (0.003, 1.0)
    # ... geometric across span·W. Not tuned on any run: locations W/80 apart (five to a bin of the 32-bin
    # histogram over ±W), scales from a spike (0.003·W) to a flat law (W)

    # ---- step 4: the release
    levels: int = 1024
    # denoised: centres rounded to levels + 1 public levels (one interval search each); derivation: a step of
    # W/1024 is a sixteenth of a row prior's bin (W/64 with the default bins), so no prior moves by a bin
    narrowing: float = 0.9
    # (the ratio of successive factors, and the count of them:)
    narrowing_steps: int = 64
    # mean-matched row priors: the residual law narrowed by narrowing^j, j < narrowing_steps (then 0) until the
    # prior's mean is the row's centre; derivation: 0.9^63 ≈ 0.001, a point mass on the grid
    groups: int = 8
    # unbiased: public groups of rows by their centre, each with its own residual range; set from the variant
    # sweeps (section 5)
    clip_quantiles: tuple[float, ...] = (0.02, 0.01, 0.005, 0.002, 0.001, 0.0)
    # unbiased: the candidate clips of a group's residuals (2% from the variant sweeps; the smaller ones for large
    # ε, where the clip's bias is what is left: docs/auto.md "Very large ε")
    narrowest_range: float = 0.05
    # unbiased: a group's residual range is at least this share of W (the Unbiased LP needs a usable range)

    # ---- the fair comparison only (rpwjax.pipelines.feature_prior), on the calibrated branch
    comparison_statistics_share: float = 0.05
    # auto uses no features there; the comparison still groups rows by centres, from a fit with this share of ε
    # (not tuned on any run: the smallest share the rule gives a fit elsewhere, the unbiased branch's)

    def __post_init__(self):
        if not 0.0 <= self.calibrate_noise_quantile < 1.0:
            raise InputError(f"calibrate_noise_quantile must be in [0, 1), got {self.calibrate_noise_quantile!r}")
        if not 0.0 <= self.level_anchor_share < 1.0:
            raise InputError(f"level_anchor_share must be in [0, 1), got {self.level_anchor_share!r}")
        if self.fallback_mean_weighting not in FALLBACK_MEAN_WEIGHTINGS:
            raise InputError(f"fallback_mean_weighting must be one of {FALLBACK_MEAN_WEIGHTINGS}, got "
                             f"{self.fallback_mean_weighting!r}")

    def to_json(self) -> dict:
        """Every field, tuples as lists."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}


DEFAULT_RULE = AutoRule()


@dataclasses.dataclass(frozen=True)
class FitChoice:
    """Step 4: how the ε_s-DP linear fit was released, from public numbers. ``noise_sums`` / ``noise_cells``: the
    expected energy each fit's noise puts into the centred predictions (``noise_cells`` None when no cells
    were formed: more than ``rule.cell_components`` components)."""

    estimator: str  # "sums" | "cells"
    cells: int | None
    noise_sums: float
    noise_cells: float | None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Step 4, branch denoised: the released fit's signal-to-noise ratio (None when infinite: a constant design),
    the slope's noise (None where the ratio called for no slope), ε_c spent and the slope α applied (1: none).
    ``below``: the ratio below which the slope is called for, the larger of ``rule.calibrate_below`` and the
    pure-noise law's ``rule.calibrate_noise_quantile`` quantile of E/N less 1 (None for a constant design)."""

    signal_to_noise: float | None
    epsilon: float
    slope: float
    slope_noise: float | None
    below: float | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class GroupClip:
    """Step 4, branch unbiased: one centre group's rows, residual range and the clip quantile it was chosen at."""

    group: int
    rows: int
    residual_range: tuple[float, float]
    clip_quantile: float

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "residual_range": list(self.residual_range)}


@dataclasses.dataclass(frozen=True)
class Fallback:
    """Step 3, branch denoised: the release fell back to row priors whose mean is the fit's centre
    (``row_prior`` "mean-matched"), because the residual histogram cannot be told from its noise. ``reason``:
    "unreadable-histogram"; ``rows_per_noise_per_bin``: rows·ε₁/2/bins at the fewest bins, below
    ``threshold`` (the rule's ``rows_per_noise_per_bin``); ``mean_epsilon``: the part of ε₁ that buys the
    private mean (the histogram gets ε₁ less it; 0: none bought). Step 4 sets the last three: the noise
    standard deviations of the two estimates of the labels' mean the centres' mean is placed by, and the
    private mean's weight (the rule's ``fallback_mean_weighting``). Public numbers only."""

    reason: str
    rows_per_noise_per_bin: float
    threshold: float
    mean_epsilon: float
    fit_mean_noise: float | None = None  # step 4: the standard deviation of the fit's own mean by its noise ...
    private_mean_noise: float | None = None  # ... and of the private mean (both public numbers) ...
    private_mean_weight: float | None = None  # ... and the private mean's weight in the centres' mean (1: alone)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class LevelAnchor:
    """Step 4, branch denoised with censored row priors: the labels' level anchored (``rule.level_anchor_share``).
    ``epsilon``: what the private mean cost (taken from the release); the noise standard deviations of the fit's
    own mean and of the private mean, and the private mean's weight in the target (the rule's
    ``fallback_mean_weighting``). Public numbers only."""

    epsilon: float
    fit_mean_noise: float
    private_mean_noise: float
    private_mean_weight: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class AutoPlan:
    """Every decision of the rule. Steps 1 to 3 (public numbers only) are set by :func:`plan`; step 4's fields
    (None until then, and on the calibrated branch) by the releases that read private statistics."""

    epsilon: float
    rows: int
    components: int
    l1_bound: float
    width: float
    rho_at_half: float  # ρ(afford_share·ε)
    unbiased_noise_ratio: float  # Q of step 2 (nan on the calibrated branch)
    branch: str  # "calibrated" | "denoised" | "unbiased"
    statistics_epsilon: float
    residual_histogram_epsilon: float
    release_epsilon: float  # ε - ε_s - ε₁; the release gets this less mechanism ε_c
    forced_branch: str | None = None  # step 2 fixed by the caller (validation of the rule), else None
    row_prior: str | None = None  # denoised: "censored", or "mean-matched" where the release is uninformative
    # or where the residual histogram cannot be read (fallback)
    fit: FitChoice | None = None  # step 4
    calibration: Calibration | None = None  # step 4, denoised only
    mechanism_epsilon: float | None = None  # step 4: what the release got (release_epsilon - ε_c - ε_a)
    groups: tuple[GroupClip, ...] | None = None  # step 4, unbiased only
    fallback: Fallback | None = None  # step 3, denoised: why the row priors fell back to mean-matched, else None
    anchor: LevelAnchor | None = None  # step 4, denoised with censored row priors: the level anchored, else None

    def to_json(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and math.isnan(v):
                v = None
            elif isinstance(v, (FitChoice, Calibration, Fallback, LevelAnchor)):
                v = v.to_json()
            elif isinstance(v, tuple):
                v = [g.to_json() for g in v]
            out[f.name] = v
        return out
