r"""Beyond the paper: feature-aware priors, the two-stage pipeline and a mean-calibrated prior.

Why. A prior that ignores the features is the same for every label, so the
best any randomizer (or posterior denoising) can do with it is to pull every
label towards the same place. The features are public under label-DP: a
model trained on privatized labels predicts where each label probably lies,
and a prior centred there lets the mechanism spend its budget on a narrow
window around the truth.

The two-stage pipeline (one ε; every label is privatized exactly once):

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
   ``stage2="rpwithprior"``: each row gets its own interval [A1_i, A2_i],
   the exact optimum of neighbourhood preservation under π_i (the Dinkelbach
   search of :mod:`rpwjax.mechanisms.interval_search`, vmapped over rows), ζ chosen by
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

The mean-calibrated prior (for small ε, where the histogram is mostly
noise): half of ε₁ buys a private histogram, the other half a private mean
(integer sum of the labels rounded to 2^20 public levels plus exact discrete Laplace noise:
replace-one sensitivity (hi - lo)/n, scale (hi - lo)/(n ε₁/2)); the
histogram is then exponentially tilted, m_j ∝ h_j e^{λ c_j}, until its mean
equals the private mean (post-processing). At small ε a denoised label is
close to the prior mean, so the prior mean is what the model learns; a
private mean is far more accurate than the mean of a noisy histogram.

The linear prior (:func:`linear_prior_labels`, no split): an ε_s-DP linear
model from exact integer noise on Xᵀy over public, clipped principal components
(:func:`private_linear_fit`) centres every row's prior; then a residual prior
(ε₁), a per-row exact RPWithPrior interval (ε₂) and denoising. Each label is
read by the three releases: ε_s + ε₁ + ε₂ = ε (sequential composition).
The full design and accounting: docs/beyond-the-paper.md.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from rpwjax import api
from rpwjax.mechanisms import interval_search
from rpwjax.errors import InputError, check_epsilon, check_labels, check_range
from rpwjax.keys import Secret
from rpwjax.noise import BitStream, discrete_laplace
from rpwjax.noise import noisy_counts as _exact_noisy_counts
from rpwjax.release_path import epsilon_index, release, sidecar_fields
from rpwjax.posterior import _rpwithprior_posterior, _snap_to_outputs
from rpwjax.priors import Prior, histogram_prior
from rpwjax.mechanisms.rpwithprior import RPWithPrior, choose_zeta

__all__ = [
    "TwoStageConfig",
    "TwoStageRun",
    "calibrated_prior",
    "per_example_intervals",
    "posterior_mean_per_example",
    "private_mean",
    "residual_histogram",
    "shifted_priors",
    "stage_model_predictions",
    "train_runs",
    "two_stage_labels",
]

_CHUNK = 2048


def _check_secret(secret) -> Secret:
    if not isinstance(secret, Secret):
        raise InputError(f"secret must be an rpwjax.keys.Secret (Secret.from_file(KEYFILE)), got {type(secret).__name__}")
    return secret


STAGE1 = ("unbiased", "rpwithprior", "rr-on-bins", "laplace", "staircase")
STAGE2 = ("rpwithprior", "unbiased")
RESIDUAL_QUANTILE = 0.02


# --------------------------------------------------------------------------- private estimates


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
    _check_secret(secret)
    y = check_labels(labels, lo, hi)
    q = np.rint(MEAN_RESOLUTION * (y - lo) / (hi - lo)).astype(np.int64)
    from fractions import Fraction

    z = discrete_laplace(Fraction(eps) / MEAN_RESOLUTION, BitStream(secret, "mean"))
    total = int(q.sum()) + z
    return float(np.clip(lo + (hi - lo) * total / (MEAN_RESOLUTION * y.size), lo, hi))


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


def calibrated_prior(labels, lo, hi, epsilon_prior, *, bins: int, secret: Secret) -> Prior:
    """ε₁-DP prior: a private histogram (ε₁/2) tilted to a private mean (ε₁/2)."""
    eps1 = float(check_epsilon(epsilon_prior, "epsilon_prior"))
    hist = private_histogram_projected(labels, lo, hi, eps1 / 2, bins=bins, secret=secret.child("histogram"))
    mean = private_mean(labels, lo, hi, eps1 / 2, secret.child("mean"))
    left, right, mass = (np.asarray(v, np.float64) for v in (hist.left, hist.right, hist.mass))
    return Prior(left, right, _tilt_to_mean(left, right, mass, mean), hist.lo, hist.hi, False, "calibrated-histogram")


def project_counts(noisy, total: float) -> np.ndarray:
    """Least-squares post-processing of noisy counts whose true total is public:
    the closest (L2) c >= 0 with sum(c) = total, i.e. c = max(noisy - tau, 0) for one shift tau.

    Plain clipping at zero keeps the positive noise of every empty bin, a floor
    of spurious mass spread over the whole range; the projection removes it.
    """
    v = np.asarray(noisy, np.float64)
    total = float(total)
    if total <= 0:
        return np.full(v.size, 0.0)
    u = np.sort(v)[::-1]
    cum = np.cumsum(u) - total
    k = np.arange(1, v.size + 1)
    rho = np.nonzero(u - cum / k > 0)[0][-1]
    tau = cum[rho] / (rho + 1)
    return np.maximum(v - tau, 0.0)


def noisy_counts(values, edges, epsilon, secret: Secret) -> np.ndarray:
    """The ε-DP release: counts over public ``edges`` (values clipped to them) plus exact discrete Laplace
    noise of rate ε/2 (:func:`rpwjax.noise.noisy_counts`; replace-one neighbours change two counts by one)."""
    eps = float(check_epsilon(epsilon))
    edges = np.asarray(edges, np.float64)
    v = np.clip(np.asarray(values, np.float64), edges[0], edges[-1])
    counts, _ = np.histogram(v, bins=edges)  # the only thing read from the labels
    return _exact_noisy_counts(counts, eps, secret, "counts").astype(np.float64)


def noisy_histogram(values, edges, epsilon, secret: Secret) -> np.ndarray:
    """ε-DP histogram masses over public ``edges``: :func:`noisy_counts` projected onto the public total."""
    c = project_counts(noisy_counts(values, edges, epsilon, secret), np.size(values))
    return c / c.sum() if c.sum() > 0 else np.full(c.size, 1.0 / c.size)


def private_histogram_projected(labels, lo, hi, epsilon, *, bins: int, secret: Secret) -> Prior:
    """``Hist_ε`` with the projection post-processing (:func:`project_counts`) instead of clip-and-normalise."""
    lo, hi = check_range(lo, hi)
    y = check_labels(labels, lo, hi)
    edges = np.linspace(lo, hi, int(bins) + 1)
    return Prior(edges[:-1], edges[1:], noisy_histogram(y, edges, epsilon, secret), lo, hi, False, "private-histogram")


def _laplace_masses(edges, location, scale):
    """Masses of Laplace(location, scale) on bins ``edges`` (broadcast over leading axes), renormalised."""
    z = (edges - location[..., None]) / scale[..., None]
    cdf = np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0)), 1 - 0.5 * np.exp(-np.maximum(z, 0)))
    m = np.diff(cdf, axis=-1)
    return m / m.sum(axis=-1, keepdims=True)


def histogram_is_reliable(rows: int, epsilon: float, bins: int, tolerance: float = 0.1) -> bool:
    """Public rule: the noise (discrete Laplace, rate ε/2: scale about 2/ε) of a ``bins``-bin histogram of ``rows`` counts has relative
    L2 size sqrt(8·bins)/(ε·rows); trust the bins themselves when it is at most ``tolerance``."""
    return math.sqrt(8 * bins) / (epsilon * rows) <= tolerance


def release_bins(rows: int, epsilon: float, most: int) -> int:
    """Public rule for the residual release: the largest power of two <= ``most`` (at least 4) with about
    eight or more rows per unit of noise scale per bin (rows·ε/2/bins >= 4)."""
    k = 4
    while k * 2 <= most and rows * epsilon / 2 / (k * 2) >= 4:
        k *= 2
    return k


def residual_histogram(residuals, width, epsilon, *, bins: int, secret: Secret, resolution: int = 2):
    """ε-DP residual prior over the public [-width, width]: (edges, masses).

    One release: a ``bins``-bin noisy histogram of the residuals (:func:`noisy_counts`). When
    it is reliable (:func:`histogram_is_reliable`, a rule on public numbers)
    its projected masses are the prior; otherwise a Laplace(μ, s) density is
    fitted to the noisy counts over a grid of (μ, s) (two
    parameters from all the bins: the noise averages out; least absolute
    deviations, the maximum-likelihood fit under Laplace noise) and its masses
    are the prior. Either way the prior is given on ``resolution``·``bins`` bins.
    Post-processing of the one release, so the cost is ε.
    """
    eps = float(check_epsilon(epsilon))
    r = np.asarray(residuals, np.float64)
    fine = np.linspace(-width, width, int(bins) * resolution + 1)
    bins = release_bins(r.size, eps, int(bins))
    edges = np.linspace(-width, width, bins + 1)
    noisy = noisy_counts(r, edges, eps, secret)
    if histogram_is_reliable(r.size, eps, bins) and fine.size - 1 == bins * resolution:
        c = project_counts(noisy, r.size)
        mass = c / c.sum() if c.sum() > 0 else np.full(c.size, 1.0 / c.size)
        return fine, np.repeat(mass / resolution, resolution)
    locations = width * np.linspace(-0.5, 0.5, 81)
    scales = width * np.geomspace(0.003, 1.0, 60)
    loc, sc = (g.ravel() for g in np.meshgrid(locations, scales, indexing="ij"))
    expected = r.size * _laplace_masses(edges, loc, sc)
    best = int(np.argmin(np.sum(np.abs(expected - noisy[None]), axis=1)))
    return fine, _laplace_masses(fine, loc[best : best + 1], sc[best : best + 1])[0]


def shifted_priors(edges, mass, centres, lo, hi, fallback: Prior | None = None) -> Prior:
    """Row i: the residual histogram shifted by ``centres[i]``, restricted to [lo, hi] (a batched Prior, (n, bins)).

    A row whose shifted histogram has no mass inside [lo, hi] takes ``fallback``
    (which must have as many bins), or the uniform prior.
    """
    edges = np.asarray(edges, np.float64)
    mass = np.asarray(mass, np.float64)
    c = np.asarray(centres, np.float64)[:, None]
    left = np.clip(edges[:-1][None] + c, lo, hi)
    right = np.clip(edges[1:][None] + c, lo, hi)
    m = mass[None] * (right - left) / (edges[1:] - edges[:-1])[None]
    total = m.sum(axis=1, keepdims=True)
    m = np.where(total > 0, m / np.where(total > 0, total, 1.0), 0.0)
    empty = total[:, 0] <= 0
    if empty.any():
        if fallback is not None and np.shape(fallback.mass)[-1] == mass.size:
            fl, fr, fm = (np.asarray(v, np.float64) for v in (fallback.left, fallback.right, fallback.mass))
        else:
            grid = np.linspace(lo, hi, mass.size + 1)
            fl, fr, fm = grid[:-1], grid[1:], np.full(mass.size, 1.0 / mass.size)
        left[empty], right[empty], m[empty] = fl, fr, fm
    return Prior(left, right, m, float(lo), float(hi), False, "feature-aware")


def _rows(prior: Prior, start: int, stop: int) -> Prior:
    return jax.tree_util.tree_map(lambda v: jnp.asarray(v)[start:stop], prior)


@jax.jit
def _intervals(priors, zeta, epsilon):
    def one(p):
        tables = interval_search.make_tables(p, zeta, "neighborhood")
        a, b, _ = interval_search.search(tables, p, zeta, "neighborhood", epsilon)
        return a, b

    return jax.vmap(one)(priors)


def per_example_intervals(priors: Prior, zeta: float, epsilon: float) -> RPWithPrior:
    """RPWithPrior with one exact interval per row of a batched prior (shared ζ and ε): params batched over rows."""
    n = int(np.shape(priors.mass)[0])
    a1, a2 = [], []
    with jax.enable_x64(True):
        for i in range(0, n, _CHUNK):
            a, b = _intervals(_rows(priors, i, i + _CHUNK), jnp.float64(zeta), jnp.float64(epsilon))
            a1.append(np.asarray(a))
            a2.append(np.asarray(b))
    a1 = np.concatenate(a1) if a1 else np.zeros(0)
    a2 = np.concatenate(a2) if a2 else np.zeros(0)
    return RPWithPrior(np.full(n, float(epsilon)), np.full(n, float(zeta)), a1, a2, priors.lo, priors.hi)


@jax.jit
def _rp_posterior_rows(params, priors, y_tilde):
    return jax.vmap(_rpwithprior_posterior)(params, priors, y_tilde)


def _discrete_posterior_rows(params, priors, y_tilde, cuts, mids):
    cdf = jax.vmap(lambda p: p.cdf(cuts))(priors)
    h = jax.vmap(lambda p: p.partial_expectation(cuts))(priors)
    below = cuts[None] * cdf - h  # E[Y; Y <= cut] per row
    mass = jnp.clip(jnp.diff(cdf, axis=1), 0.0, None)
    first = jnp.diff(below, axis=1)
    has = mass > 0
    mean = jnp.where(has, first / jnp.where(has, mass, 1.0), mids[None])
    log_p = params.log_density(y_tilde[:, None], jnp.broadcast_to(mids[None], mass.shape))
    log_w = jnp.where(has, log_p + jnp.log(jnp.where(has, mass, 1.0)), -jnp.inf)
    w = jnp.exp(log_w - jnp.max(log_w, axis=1, keepdims=True))
    return jnp.sum(w * mean, axis=1) / jnp.sum(w, axis=1)


_discrete_posterior_rows_jit = jax.jit(_discrete_posterior_rows)


def posterior_mean_per_example(params, priors: Prior, y_tilde) -> np.ndarray:
    """E_{π_i}[Y | Ỹ = ỹ_i] with one prior per row (a batched histogram Prior), exact.

    RPWithPrior: ``params`` batched over rows (one interval each) or one fit
    shared by all rows; closed form. RR-on-Bins and Unbiased (one shared fit):
    their pmf is constant in y between consecutive ``breakpoints()``, so each
    row's prior enters through its mass and mean on those cells.
    """
    y = np.asarray(y_tilde, np.float64).reshape(-1)
    n = y.size
    if np.shape(priors.mass)[0] != n:
        raise InputError(f"one prior per row is needed: {np.shape(priors.mass)[0]} priors for {n} outputs")
    out = []
    with jax.enable_x64(True):
        if isinstance(params, RPWithPrior):
            if params.batch_shape == ():
                params = jax.tree_util.tree_map(lambda v: jnp.full((n,), v, jnp.float64), params)
            for i in range(0, n, _CHUNK):
                p = jax.tree_util.tree_map(lambda v: jnp.asarray(v, jnp.float64)[i : i + _CHUNK], params)
                out.append(np.asarray(_rp_posterior_rows(p, _rows(priors, i, i + _CHUNK), jnp.asarray(y[i : i + _CHUNK]))))
        elif params.discrete:
            if params.batch_shape != ():
                raise InputError("a discrete mechanism needs one shared fit (unbatched parameters)")
            lo, hi = priors.lo, priors.hi
            bps = [np.ravel(np.asarray(b, np.float64)) for b in params.breakpoints()]
            cuts = np.unique(np.clip(np.concatenate([[lo, hi], *bps]), lo, hi))
            mids = jnp.asarray(0.5 * (cuts[:-1] + cuts[1:]))
            snapped = _snap_to_outputs(params, y)
            for i in range(0, n, _CHUNK):
                out.append(np.asarray(_discrete_posterior_rows_jit(
                    params, _rows(priors, i, i + _CHUNK), jnp.asarray(snapped[i : i + _CHUNK]), jnp.asarray(cuts), mids)))
        else:
            raise InputError(f"per-row posterior denoising supports rpwithprior, rr-on-bins and unbiased, got {params.name}")
    return np.concatenate(out) if out else np.zeros(0)


# --------------------------------------------------------------------------- the two-stage pipeline


@dataclasses.dataclass(frozen=True)
class TwoStageConfig:
    """Settings of the two-stage pipeline (see the module docstring)."""

    stage1: str = "unbiased"
    stage2: str = "rpwithprior"
    fraction: float = 0.5  # share of the training rows in part A
    prior_fraction: float = 0.1  # ε₁/ε in each stage
    bins: int = 32  # stage-1 private histogram
    residual_bins: int = 32
    holdout: float = 0.2  # share of a stage's rows whose private labels pick the stage model's epoch (0: none)

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
        for name in ("bins", "residual_bins"):
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v < 2:
                raise InputError(f"{name} must be an integer >= 2, got {name}={v!r}")
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
        self._secret = secret.child("epsilon", epsilon_index(self.epsilon))
        self.eps1 = config.prior_fraction * self.epsilon
        self.eps2 = self.epsilon - self.eps1
        self._stage1()

    # stage 1 ----------------------------------------------------------------
    def _stage1(self):
        cfg = self.config
        y_a = self._y[self.part_a]
        fit_fn, _, uses_prior = api._entry(cfg.stage1)
        if uses_prior:
            prior = private_histogram_projected(y_a, self.lo, self.hi, self.eps1, bins=cfg.bins,
                                                secret=self._secret.child("stage1-histogram"))
            eps_mech = self.eps2
        else:  # a prior-free mechanism gets all of ε on part A
            prior, eps_mech = None, self.epsilon
        options = {"zeta": "auto"} if cfg.stage1 == "rpwithprior" else {}
        params, _ = fit_fn(prior if prior is not None else Prior(
            np.array([self.lo]), np.array([self.hi]), np.array([1.0]), self.lo, self.hi, False, "none"), eps_mech, **options)
        self.stage1_params, self.stage1_epsilon = params, eps_mech
        self.global_prior = prior
        noisy = release(params, self._secret.child("stage1"), y_a)
        self.stage1_outputs = noisy
        # m1 learns from the private outputs; RPWithPrior's are denoised under the global prior first
        if cfg.stage1 == "rpwithprior":
            from rpwjax.posterior import posterior_mean

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
        self.residual_edges, self.residual_mass = residual_histogram(
            y_b - m1[b], width, self.eps1, bins=cfg.residual_bins, secret=self._secret.child("residual-histogram"))
        if cfg.stage2 == "rpwithprior":
            residual_prior = histogram_prior(self.residual_edges, self.residual_mass)
            self.zeta = float(choose_zeta(residual_prior, self.eps2)[0])
            priors = shifted_priors(self.residual_edges, self.residual_mass, m1[b], self.lo, self.hi, self.global_prior)
            params = per_example_intervals(priors, self.zeta, self.eps2)
            noisy = release(params, self._secret.child("stage2"), y_b)
            self.stage2_params, self.stage2_outputs = params, noisy
            self.labels_b = posterior_mean_per_example(params, priors, noisy)
        else:
            cdf = np.concatenate([[0.0], np.cumsum(self.residual_mass)])
            c_lo = float(np.interp(RESIDUAL_QUANTILE, cdf, self.residual_edges))
            c_hi = float(np.interp(1 - RESIDUAL_QUANTILE, cdf, self.residual_edges))
            c_lo, c_hi = min(c_lo, -0.05 * width), max(c_hi, 0.05 * width)
            clipped = np.clip(self.residual_edges, c_lo, c_hi)
            inner = clipped[1:] > clipped[:-1]
            masses = self.residual_mass * (clipped[1:] - clipped[:-1]) / np.diff(self.residual_edges)
            edges = np.concatenate([clipped[:-1][inner], clipped[1:][inner][-1:]])
            prior = histogram_prior(edges, masses[inner] + 1e-12)
            params, _ = api._entry("unbiased")[0](prior, self.eps2)
            z = np.clip(y_b - m1[b], c_lo, c_hi)
            noisy = release(params, self._secret.child("stage2"), z)
            self.residual_range = (c_lo, c_hi)
            self.stage2_params, self.stage2_outputs = params, noisy
            self.labels_b = m1[b] + noisy
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
            labels_a = posterior_mean_per_example(self.stage1_params, priors, self.stage1_outputs)
        else:
            labels_a = self.stage1_outputs
        labels = np.empty(self._y.size)
        labels[self.part_a] = labels_a
        labels[self.part_b] = self.labels_b
        self.labels = labels
        return self

    @property
    def record(self) -> dict:
        """The accounting: per part, what was spent on what (JSON-ready)."""
        cfg = self.config
        return {
            "pipeline": "two-stage",
            "epsilon": self.epsilon,
            "range": [self.lo, self.hi],
            "part_a": {"rows": int(self.part_a.size),
                       "prior_histogram_epsilon": self.epsilon - self.stage1_epsilon,
                       "mechanism": cfg.stage1, "mechanism_epsilon": self.stage1_epsilon, "bins": cfg.bins},
            "part_b": {"rows": int(self.part_b.size), "residual_histogram_epsilon": self.eps1,
                       "mechanism": cfg.stage2, "mechanism_epsilon": self.eps2, "residual_bins": cfg.residual_bins,
                       "zeta": self.zeta},
            "per_label_epsilon": self.epsilon,
            "denoised": cfg.stage2 == "rpwithprior",
            "release": {"part_a": sidecar_fields(self.stage1_params),
                        "part_b": sidecar_fields(self.stage2_params)},
        }


def stage_model_predictions(features, rows, targets, seeds, *, epochs: int = 50, holdout: float = 0.2,
                            split_seed: int = 0) -> np.ndarray:
    """Train one stage model per target row on ``features[rows]``; predictions for ALL rows, (M, n).

    The stage models learn from private labels only. With ``holdout > 0`` a
    public random share of ``rows`` is held out and each model keeps the epoch
    with the smallest squared error against the held-out *private* labels
    (post-processing: early stopping costs no privacy).
    """
    from rpwjax.experiments.training import predict_many, train_many

    x = np.asarray(features, np.float32)
    rows = np.asarray(rows)
    targets = np.atleast_2d(np.asarray(targets, np.float32))
    validation = None
    fit_rows = np.arange(rows.size)
    if holdout > 0:
        order = np.random.default_rng(split_seed).permutation(rows.size)
        n_val = int(round(holdout * rows.size))
        if 0 < n_val < rows.size:
            val, fit_rows = np.sort(order[:n_val]), np.sort(order[n_val:])
            validation = (x[rows[val]], targets[:, val])
    params = train_many(x[rows[fit_rows]], targets[:, fit_rows], np.asarray(seeds), epochs=epochs, validation=validation)
    return predict_many(params, x)


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
                                       epochs=epochs, holdout=holdout, split_seed=split_seed + offset)

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


# --------------------------------------------------------------------------- denoising under the calibrated prior


def calibrated_denoised(labels, lo, hi, epsilon, *, secret: Secret, prior_fraction: float = 0.5, bins: int = 32):
    """RPWithPrior (ζ auto) fitted to the mean-calibrated prior, outputs denoised under that prior.

    Spends ε₁ = ``prior_fraction``·ε on the prior (half histogram, half mean)
    and ε₂ = ε - ε₁ on the mechanism. Returns ``(denoised labels, record)``.
    """
    from rpwjax.posterior import posterior_mean
    from rpwjax.mechanisms.rpwithprior import fit_rpwithprior

    lo, hi = check_range(lo, hi)
    eps = float(check_epsilon(epsilon))
    if not 0 < prior_fraction < 1:
        raise InputError(f"prior_fraction must be in (0, 1), got prior_fraction={prior_fraction!r}")
    y = check_labels(labels, lo, hi)
    secret = _check_secret(secret).child("epsilon", epsilon_index(eps))
    eps1 = prior_fraction * eps
    prior = calibrated_prior(y, lo, hi, eps1, bins=bins, secret=secret.child("prior"))
    params, _ = fit_rpwithprior(prior, eps - eps1, zeta="auto")
    noisy = release(params, secret.child("release"), y)
    record = {"pipeline": "calibrated-posterior", "epsilon": eps, "prior_epsilon": eps1,
              "mechanism": "rpwithprior", "mechanism_epsilon": eps - eps1, "bins": bins,
              "params": params.to_json(), "release": sidecar_fields(params)}
    return posterior_mean(params, prior, noisy), record


# --------------------------------------------------------------------------- a private linear model as the prior's centre


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
    _check_secret(secret)
    y = check_labels(labels, lo, hi)
    design = np.asarray(design, np.float64)
    if design.ndim != 2 or design.shape[0] != y.size:
        raise InputError(f"design must be (n, d) with one row per label, got shape {design.shape}")
    norms = np.abs(design).sum(axis=1)
    if np.any(norms > bound * (1 + 1e-12)):
        raise InputError(f"every design row must have L1 norm <= bound={bound!r}, got {float(norms.max())!r}")
    centre = 0.5 * (lo + hi)
    from fractions import Fraction

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
    secret = _check_secret(secret).child("epsilon", epsilon_index(eps))
    eps_s, eps1 = stats_fraction * eps, prior_fraction * eps
    eps2 = eps - eps_s - eps1
    design, bound = public_design(x, components)
    theta, centre = private_linear_fit(design, y, lo, hi, eps_s, secret.child("statistics"), bound=bound)
    m = np.clip(design @ theta + centre, lo, hi)
    edges, mass = residual_histogram(y - m, hi - lo, eps1, bins=residual_bins, secret=secret.child("residual-histogram"))
    zeta = float(choose_zeta(histogram_prior(edges, mass), eps2)[0])
    priors = shifted_priors(edges, mass, m, lo, hi)
    params = per_example_intervals(priors, zeta, eps2)
    noisy = release(params, secret.child("release"), y)
    record = {"pipeline": "linear-prior", "epsilon": eps, "rows": int(y.size),
              "statistics_epsilon": eps_s, "residual_histogram_epsilon": eps1, "mechanism": "rpwithprior",
              "mechanism_epsilon": eps2, "components": int(design.shape[1] - 1), "l1_bound": bound, "zeta": zeta,
              "per_label_epsilon": eps, "release": sidecar_fields(params)}
    return posterior_mean_per_example(params, priors, noisy), record
