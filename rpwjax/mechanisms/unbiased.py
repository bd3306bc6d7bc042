r"""The optimal unbiased randomizer (Badanidiyuru et al., "Optimal Unbiased
Randomizers for Regression with Label Differential Privacy", NeurIPS 2023).

**The mechanism.** Inputs are a finite sorted support :math:`x_1 < \dots < x_k`
with prior masses :math:`p_j` (the prior's points when it is discrete, else
its bin centres with the bin masses); outputs are a finite grid
:math:`z_1 < \dots < z_M` that reaches beyond ``[lo, hi]``. The randomizer is
a row-stochastic matrix :math:`Q` (row j = the law of Ỹ given :math:`x_j`)
solving the linear program

.. math::
   \min_Q \sum_j p_j \sum_m Q_{jm} (z_m - x_j)^2 \quad\text{s.t.}\quad
   \sum_m Q_{jm} = 1,\ \ \sum_m Q_{jm} z_m = x_j,\ \ Q \ge 0,\ \
   Q_{jm} \le e^\varepsilon Q_{j'm}\ \ \forall j, j', m.

Unbiasedness (:math:`E[\tilde Y \mid x_j] = x_j`) needs outputs outside the
range: rows for lo and hi must have means Δ = hi - lo apart while their laws
differ by at most the total variation :math:`\tanh(\varepsilon/2)`, so the
outputs must span at least :math:`\Delta \coth(\varepsilon/2)`, i.e. reach
:math:`\Delta/(e^\varepsilon - 1)` beyond each end.

The LP's reformulation, its exact solver, the output grid and how the solution is
made exactly unbiased and ε-DP are in :mod:`rpwjax.mechanisms.unbiased_lp`.

**Unbiased on the whole public range.** The support always contains lo and
hi (added as LP rows when the prior does not hold them), and a label between
two support points :math:`x_j \le y \le x_{j+1}` is released through row j
with probability :math:`w = (x_{j+1} - y)/(x_{j+1} - x_j)`, else through row
j + 1: its pmf is the mixture :math:`w Q_j + (1 - w) Q_{j+1}`, linear in y
between support points, with mean :math:`w x_j + (1 - w) x_{j+1} = y`. A
mixture of two rows of an ε-DP matrix is ε-DP against every other label
(each column stays between the column's minimum and maximum), so every label
of [lo, hi] is released unbiasedly at the same ε. ``breakpoints()`` are the
support points; ``bias``, ``mse`` and ``log_density`` follow the mixture.

**LP masses.** For a label y the expected squared error is
:math:`w V_j + (1 - w) V_{j+1} + (y - x_j)(x_{j+1} - y)` with
:math:`V_j = \sum_m Q_{jm}(z_m - x_j)^2`: the last term does not depend on Q,
so the LP's objective under a prior weights row j by
:math:`W_j = E[\phi_j(Y)]`, :math:`\phi_j` the piecewise-linear hat function
of :math:`x_j` (1 at :math:`x_j`, 0 at its neighbours). For an empirical
prior on the support that is the point's own mass (lo and hi get 0 unless
they are labels); for a histogram every bin's mass is split between the
support points around it, so lo and hi get a quarter of the end bins' mass.
``info["label_mse"]`` is the exact E[(Ỹ - Y)²] under the prior (equal to
``params.label_mse(prior)``), interpolation term included.

**Large supports.** The LP grows with k; a prior with more than
``max_support`` points (default 401) is first collapsed onto ``max_support``
equally spaced support points over the public range, ends included (a
function of the prior only, so no privacy cost); its mass enters through the
hat functions as above.

Sampling uses one uniform per label: the inverse CDF of the label's mixed pmf,
found by a binary search over :math:`w C_j + (1 - w) C_{j+1}` (C the rows'
cumulative probabilities; non-decreasing in the output index in floating
point too, so the sampler is monotone in the uniform), with no (labels ×
outputs) array. For float64 labels both searches (the label's support
interval, then the output) start from guide tables built once with the
parameters (:mod:`rpwjax.mechanisms.guide`): a few steps instead of
⌈log₂ k⌉ + ⌈log₂ M⌉, with the same result bit for bit. It is as precise as the labels' dtype (float32 cumulative sums carry
≈6e-8 absolute error, which changes tiny probabilities relatively more), and
it is not hardened against floating-point attacks on the uniform.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rpwjax.mechanisms import guide
from rpwjax.mechanisms.base import Mechanism, params_dataclass
from rpwjax.mechanisms.unbiased_lp import DEFAULT_GRID_SIZE, MAX_LP_EPSILON, solve
from rpwjax.errors import InputError, check_epsilon, check_integer, check_positive
from rpwjax.priors import Prior, cut_pieces

DEFAULT_MAX_SUPPORT = 401  # about 7 s per ε on two busy cores; 512 points take 9-12 s


@params_dataclass(static=("lo", "hi", "guide_steps"))
class Unbiased(Mechanism):
    r"""Fitted optimal unbiased randomizer over the public ``[lo, hi]``.

    ``support`` (k) are the inputs :math:`x_j`, ``outputs`` (M) the output
    values in increasing order, ``probabilities`` (k × M) the row-stochastic
    :math:`Q`. Unused output slots (so that fits over an ε grid stack) come
    first, repeat the first real output and have probability zero in every row.

    The guide tables (``support_low``/``support_high``, ``cdf_low``/``cdf_high``
    and the static ``guide_steps``) are derived from those fields when the
    parameters are built from concrete values; they only speed up the sampler
    and are neither saved nor read.
    """

    epsilon: jax.Array
    support: jax.Array
    outputs: jax.Array
    probabilities: jax.Array
    lo: float
    hi: float
    support_low: jax.Array | None = None
    support_high: jax.Array | None = None
    cdf_low: jax.Array | None = None
    cdf_high: jax.Array | None = None
    guide_steps: tuple = ()

    name = "unbiased"
    discrete = True
    ratio_epsilon_cap = MAX_LP_EPSILON  # above it the LP is solved at it (still ε-DP): its ratios are e^min(ε, cap)
    release_by_block = True  # the inverse CDF gathers from per-row tables (Mechanism.release_by_block)
    derived_fields = ("support_low", "support_high", "cdf_low", "cdf_high", "guide_steps")

    derived_from = ("support", "probabilities")
    float_fields = ("lo", "hi")

    def _derive(self):
        if np.shape(self.support)[-1] < 2:  # one support point: no interval to search for
            return {}
        support_low, support_high, support_steps = guide.count_brackets(self.support, self.lo, self.hi, "right")
        cdf_low, cdf_high, cdf_steps = guide.cdf_brackets(self.probabilities)
        return {"support_low": support_low, "support_high": support_high, "cdf_low": cdf_low,
                "cdf_high": cdf_high, "guide_steps": (support_steps, cdf_steps)}

    def _derived_static(self):
        return {"guide_steps": (guide.steps(self.support_low, self.support_high),
                                guide.steps(self.cdf_low, self.cdf_high))}

    def _guided(self, dtype) -> bool:
        return self.cdf_low is not None and jnp.dtype(dtype) == jnp.float64

    pmf_linear_in_label = True  # the pmf is linear in y between consecutive breakpoints (posterior denoising)

    def interpolation(self, y):
        """(j, j + 1, w): a label is released through row j with probability w, else row j + 1.

        With the support x sorted and containing lo and hi, x_j <= y <= x_{j+1} and
        w = (x_{j+1} - y)/(x_{j+1} - x_j), so w x_j + (1 - w) x_{j+1} = y (labels are clipped
        to [lo, hi] first). A label on a support point gets that row alone.
        """
        y = jnp.clip(jnp.asarray(y), self.lo, self.hi)
        support = jnp.asarray(self.support, y.dtype)
        k = support.shape[-1]
        if k == 1:
            zero = jnp.zeros(y.shape, jnp.int32)
            return zero, zero, jnp.ones(y.shape, y.dtype)
        if self._guided(y.dtype):
            count = guide.guided_count(support, self.support_low, self.support_high, self.guide_steps[0],
                                       self.lo, self.hi, y, "right")
        else:
            count = jnp.searchsorted(support, y, side="right")
        lower = jnp.clip(count - 1, 0, k - 2)
        left, right = support[lower], support[lower + 1]
        w = jnp.clip((right - y) / (right - left), 0.0, 1.0)
        return lower, lower + 1, w

    def sample_from_uniform(self, u, y):
        """Inverse CDF of the label's mixed pmf at ``u`` (binary search over w C_j + (1 - w) C_{j+1}; monotone)."""
        lower, upper, w = self.interpolation(y)
        probabilities = jnp.asarray(self.probabilities, y.dtype)
        size = probabilities.shape[-1]
        cdf = jnp.cumsum(probabilities, axis=-1)
        if self._guided(y.dtype):
            slot = guide.guided_inverse_cdf(cdf, self.cdf_low, self.cdf_high, self.guide_steps[1], lower, upper, w, u)
            return jnp.asarray(self.outputs, y.dtype)[slot]
        low = jnp.zeros(lower.shape, jnp.int32)
        high = jnp.full(lower.shape, size - 1, jnp.int32)
        for _ in range(max(1, math.ceil(math.log2(size)) + 1)):
            mid = (low + high) // 2
            mixed = w * cdf[lower, mid] + (1 - w) * cdf[upper, mid]
            # the last slot is always a real output: it absorbs rounding of the cumulative sums
            right = (mixed <= u) & (mid < size - 1)
            low = jnp.where(right, mid + 1, low)
            high = jnp.where(right, high, mid)
        return jnp.asarray(self.outputs, y.dtype)[low]

    def log_density(self, y_tilde, y):
        """log pmf: log(w Q[j, m] + (1 - w) Q[j + 1, m]) where ``y_tilde`` equals output m, ``-inf`` off the outputs."""
        y_tilde = jnp.asarray(y_tilde)
        y_tilde, y = jnp.broadcast_arrays(y_tilde, jnp.asarray(y, y_tilde.dtype))
        outputs = jnp.asarray(self.outputs, y_tilde.dtype)
        # the padding repeats the first output before it, so the last equal slot is the real one
        slot = jnp.searchsorted(outputs, y_tilde, side="right") - 1
        index = jnp.maximum(slot, 0)
        lower, upper, w = self.interpolation(y)
        q = jnp.asarray(self.probabilities, y_tilde.dtype)
        prob = w * q[lower, index] + (1 - w) * q[upper, index]
        hit = (slot >= 0) & (outputs[index] == y_tilde) & (prob > 0)
        return jnp.where(hit, jnp.log(jnp.where(hit, prob, 1.0)), -jnp.inf)

    def _row_moments(self, dtype):
        """Mean and variance of every row: (k,), (k,)."""
        q = jnp.asarray(self.probabilities, dtype)
        z = jnp.asarray(self.outputs, dtype)
        mean = jnp.sum(q * z, axis=-1)
        var = jnp.sum(q * (z - mean[..., None]) ** 2, axis=-1)
        return mean, var

    def bias(self, y):
        r"""E[Ỹ | y] - y = w E[row j] + (1 - w) E[row j + 1] - y: zero on [lo, hi] up to rounding."""
        y = jnp.asarray(y)
        mean, _ = self._row_moments(y.dtype)
        lower, upper, w = self.interpolation(y)
        return w * mean[lower] + (1 - w) * mean[upper] - y

    def mse(self, y):
        r"""E[(Ỹ - y)²] = w (Var_j + (E_j - y)²) + (1 - w) (Var_{j+1} + (E_{j+1} - y)²)."""
        y = jnp.asarray(y)
        mean, var = self._row_moments(y.dtype)
        lower, upper, w = self.interpolation(y)
        return w * (var[lower] + (mean[lower] - y) ** 2) + (1 - w) * (var[upper] + (mean[upper] - y) ** 2)

    def breakpoints(self):
        support = self.support
        return tuple(support[..., i] for i in range(np.shape(support)[-1]))


# --------------------------------------------------------------------------- fitting


def hat_moments(support, left, right, mass):
    r"""(W0, W1, W2), each (k,): :math:`W_n[j] = E[\phi_j(Y) (Y - x_j)^n]` under a prior of bins.

    :math:`\phi_j` is the hat function of support point :math:`x_j` (the weight with which
    :class:`Unbiased` releases a label through row j). Exact: the prior is cut at the
    support points, and on each uniform piece the moments are polynomials of its centre
    and half-width (no large-offset cancellation: everything is relative to a support point).
    """
    x = np.asarray(support, np.float64)
    k = x.size
    a, b, m = cut_pieces(*(np.asarray(v, np.float64).ravel() for v in (left, right, mass)), x)
    out = np.zeros((3, k))
    if k == 1:
        c, h = 0.5 * (a + b) - x[0], 0.5 * (b - a)
        for n, moment in enumerate((np.ones_like(c), c, c * c + h * h / 3)):
            out[n, 0] = np.sum(m * moment)
        return tuple(out)
    j = np.clip(np.searchsorted(x, 0.5 * (a + b), side="right") - 1, 0, k - 2)
    gap = x[j + 1] - x[j]
    h = 0.5 * (b - a)

    def moments(origin):  # E[t^n], n = 0..3, t = Y - origin, Y uniform on the piece
        c = 0.5 * (a + b) - origin
        return (np.ones_like(c), c, c * c + h * h / 3, c * (c * c + h * h))

    t = moments(x[j])  # row j: weight (gap - t)/gap
    for n in range(3):
        np.add.at(out[n], j, m * (gap * t[n] - t[n + 1]) / gap)
    t = moments(x[j + 1])  # row j + 1: weight (t + gap)/gap
    for n in range(3):
        np.add.at(out[n], j + 1, m * (t[n + 1] + gap * t[n]) / gap)
    return tuple(out)


def _support_of(prior: Prior, max_support: int):
    """Support rows (lo and hi included) per prior (a leading ε axis kept), and whether they were collapsed."""
    points = np.asarray(prior.support_points(), np.float64)
    mass = np.asarray(prior.mass, np.float64)
    if not (np.all(np.isfinite(points)) and np.all(np.isfinite(mass))):
        raise InputError("prior support and masses must be finite")
    lo, hi = float(prior.lo), float(prior.hi)
    collapsed = points.shape[-1] > max_support
    rows = points.reshape(-1, points.shape[-1])
    if collapsed:
        supports = [np.linspace(lo, hi, max_support)] * rows.shape[0]
    else:
        for row in rows:
            if np.any(np.diff(row) <= 0):
                raise InputError("prior support points must be strictly increasing")
        supports = [np.unique(np.concatenate([[lo], np.clip(row, lo, hi), [hi]])) for row in rows]
    if len({s.size for s in supports}) > 1:
        raise InputError("a batched prior needs the same support points for every epsilon")
    support = np.stack(supports)
    return (support[0] if points.ndim == 1 else support), collapsed


def fit_unbiased(
    prior: Prior,
    epsilon,
    *,
    grid_size: int = DEFAULT_GRID_SIZE,
    extension=None,
    max_support: int = DEFAULT_MAX_SUPPORT,
):
    r"""Fit the optimal unbiased randomizer to ``prior`` for a scalar ε or a 1-d ε grid.

    One LP per ε, over the support of the prior (its points, or its bin centres)
    with lo and hi added, its rows weighted by the prior's hat-function masses, solved exactly on the output grid by restricted master + pricing with HiGHS
    (see :mod:`rpwjax.mechanisms.unbiased_lp`).

    Args:
      prior: a :class:`~rpwjax.priors.Prior`; a prior with a leading axis (one
        private histogram per ε) is mapped along ε.
      epsilon: the mechanism's budget (scalar or 1-d array).
      grid_size: number of candidate outputs (equally spaced, at least 9).
      extension: reach of the output grid beyond each end of the range, in units
        of Δ = hi - lo; default ``1.5/(e^ε - 1) + 1`` (widened automatically when
        outputs farther out would pay).
      max_support: priors with more support points are collapsed onto this many
        equally spaced support points over ``[lo, hi]`` (ends included) first.

    Returns:
      ``(params, info)``: :class:`Unbiased` with a leading ε axis when ``epsilon``
      is 1-d, and ``info`` with, per ε: ``label_mse`` (the exact E[(Ỹ - Y)²]
      under the prior, equal to ``params.label_mse(prior)``), ``num_outputs`` (outputs with mass, at most 2k),
      ``optimality_gap`` (certified bound on the relative distance to the grid
      LP's optimum), ``lp_solves``, ``support_size`` (k after any collapsing),
      ``epsilon_lp`` (min(ε, 12); the LP was solved at this minus ``lp_margin``, 1e-8 unless HiGHS's
      solution needed a retry at 1e-6 or 1e-4), ``extension`` (the
      output grid's final reach, units of Δ) and ``collapsed`` (whether the prior
      was collapsed onto ``max_support`` points).
    """
    if not isinstance(prior, Prior):
        raise InputError(f"prior must be an rpwjax Prior, got prior of type {type(prior).__name__}")
    eps = check_epsilon(epsilon)
    grid_size = check_integer(grid_size, "grid_size", 9)
    if extension is not None:
        extension = check_positive(extension, "extension")
    max_support = check_integer(max_support, "max_support", 2)
    scalar = eps.ndim == 0
    eps_grid = np.atleast_1d(eps)
    support, collapsed = _support_of(prior, int(max_support))
    mass = np.asarray(prior.mass, np.float64)
    batched = mass.ndim > 1
    if batched and mass.shape[0] != eps_grid.size:
        raise InputError(
            f"a batched prior needs one histogram per epsilon: {mass.shape[0]} priors for {eps_grid.size} epsilons"
        )
    if np.any(mass.sum(axis=-1) <= 0):
        raise InputError("prior masses must not all be zero")
    lo, hi = float(prior.lo), float(prior.hi)
    width = hi - lo
    fits = []
    for e, eps_value in enumerate(eps_grid):
        x = support[e] if batched else support
        leaves = [np.asarray(v, np.float64) for v in (prior.left, prior.right, prior.mass)]
        if batched:
            leaves = [v[e] for v in leaves]
        leaves[2] = leaves[2] / leaves[2].sum()
        moments = hat_moments(x, *leaves)  # the LP weights rows by E[hat_j(Y)] (module docstring)
        outputs, q, solved = solve((x - lo) / width, moments[0], float(eps_value), grid_size, extension)
        fits.append((lo + width * outputs, q, solved, x, moments))
    size = max(f[1].shape[1] for f in fits)
    outputs_all, q_all, info_rows = [], [], []
    for outputs, q, solved, x, (w0, w1, w2) in fits:
        pad = size - outputs.size
        outputs_all.append(np.concatenate([np.full(pad, outputs[0]), outputs]))
        q_all.append(np.concatenate([np.zeros((q.shape[0], pad)), q], axis=1))
        # E[(Ỹ - Y)²] = Σ_j E[hat_j(Y) E_j[(Z - Y)²]], with E_j[(Z - Y)²] = r2_j - 2 t r1_j + t², t = Y - x_j
        d = outputs[None, :] - x[:, None]
        r1, r2 = np.sum(q * d, axis=1), np.sum(q * d * d, axis=1)
        value = float(np.sum(w0 * r2 - 2 * w1 * r1 + w2))
        info_rows.append(
            dict(
                label_mse=value,
                num_outputs=outputs.size,
                optimality_gap=solved["gap"],
                lp_solves=solved["solves"],
                support_size=x.size,
                epsilon_lp=solved["epsilon_lp"],
                lp_margin=solved["lp_margin"],
                extension=solved["extension"],
            )
        )
    params = Unbiased(
        eps_grid.copy(),
        np.stack([f[3] for f in fits]),
        np.stack(outputs_all),
        np.stack(q_all),
        lo,
        hi,
    )
    info = {key: np.array([row[key] for row in info_rows]) for key in info_rows[0]}
    info["collapsed"] = np.full(eps_grid.shape, collapsed)
    if scalar:
        params = params[0]
        info = {key: v[0] for key, v in info.items()}
    return params, info
