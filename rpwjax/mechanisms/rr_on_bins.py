r"""RR-on-Bins (Ghazi et al., "Regression with Label Differential Privacy", ICLR 2023).

The prior lives on a finite sorted support :math:`x_1 < \dots < x_k` with
masses :math:`p_j` (the prior's points when it is discrete, else the bin
centres with the bin masses). A monotone partition of the support into
:math:`m` contiguous groups :math:`B_1, \dots, B_m` gets output values
:math:`\hat y_1, \dots, \hat y_m`; with :math:`a = e^\varepsilon` and
:math:`D = a + m - 1`, a label whose group is :math:`g` is released as

.. math::
   P(\tilde Y = \hat y_h \mid g) = \begin{cases} a / D & h = g \\ 1 / D & h \ne g. \end{cases}

Every label has the same output set and the probabilities differ by at most
the factor :math:`a`, so the mechanism is ε-DP for any partition and any
outputs. Labels off the support (a histogram prior, a new file privatized
with saved parameters) are mapped to a group by ``thresholds``: the midpoint
between the last support point of a group and the first of the next (a label
exactly on a threshold goes to the lower group).

**Objective.** Write :math:`u = a - 1`, :math:`S = \sum_j p_j x_j`,
:math:`Q = \sum_j p_j x_j^2` and :math:`P_g, S_g, Q_g` the sums of
:math:`p_j, p_j x_j, p_j x_j^2` over group :math:`g`. Collecting the terms of
each output,

.. math::
   D \cdot E[(\tilde Y - Y)^2] = \sum_h \sum_j p_j w_{jh} (\hat y_h - x_j)^2,
   \qquad w_{jh} = a \text{ if } j \in B_h \text{ else } 1,

so each :math:`\hat y_h` is a weighted least-squares fit: the weighted mean
:math:`\hat y_h = (S + u S_h) / (1 + u P_h)`, leaving
:math:`Q + u Q_h - (S + u S_h)^2 / (1 + u P_h)`. Summing over :math:`h`
(:math:`\sum_h Q_h = Q`) gives :math:`(u + m) Q - \sum_h v_h` and

.. math::
   E[(\tilde Y - Y)^2] = Q - \frac{\sum_g v_g}{u + m}, \qquad
   v_g = \frac{(S + u S_g)^2}{1 + u P_g}.

The objective is translation invariant, so the fit centres the support at
:math:`S` first; then :math:`Q` is the variance :math:`\sigma^2` and
:math:`v_g = c_g = u^2 S_g^2 / (1 + u P_g) \ge 0` (no cancellation between
large terms at large ε). Minimising the MSE is maximising the ratio

.. math::
   R(\pi) = \frac{\sum_{g \in \pi} c_g}{u + m(\pi)}, \qquad
   E[(\tilde Y - Y)^2] = \sigma^2 - R(\pi).

**Algorithm (O(k²) per step, no dimension for m).** The textbook dynamic
program over (prefix end, number of groups) is O(k² m) = O(k³). Instead
Dinkelbach's method on the ratio: for a value λ,

.. math::
   F(\lambda) = \max_\pi \Big[\sum_{g \in \pi} (c_g - \lambda)\Big] - \lambda u

is one prefix dynamic program with additive group costs
:math:`c_g - \lambda` (``best[i] = max_{j<i} best[j] + c(j, i) - λ``), O(k²)
vectorised over split points ``j`` and scanned over prefix ends ``i``. Start
at λ₀ = 0 (the single group, R = 0) and set λ ← R(π_λ) at the maximiser.
:math:`F = \max_m [B_m - \lambda (u + m)]` is convex, decreasing and piecewise
linear with at most k slopes (:math:`B_m` the best sum for m groups), and the
iteration is Newton's method on it from the left: λ increases, stays ≤ λ*,
and each step that does not stop strictly lowers m, so it ends within k
steps (three or four DPs in practice). **Exactness:** it stops when the
maximiser no longer raises λ (by more than 1e-14 σ², a rounding guard), i.e.
:math:`F(\lambda) = 0`; then every partition has
:math:`\sum c - \lambda (u + m) \le 0`, i.e. :math:`R(\pi) \le \lambda`, and λ is
attained, so λ = max R and the partition is an exact optimum over all m and
all monotone partitions at once.

**Monotone outputs.** For an optimal solution every support point of
positive mass is in the group of its nearest output (moving it out of a
group of size ≥ 2 to a strictly nearer output lowers the MSE with the
outputs held fixed; emptying a singleton group and dropping its unused
output ŷ_h does too, because the MSE never exceeds σ² ≤ E[(ŷ_h - Y)²]). Nearest-output groups
of adjacent intervals force :math:`\hat y_g \le \hat y_{g+1}`, so the fitted
outputs are non-decreasing (checked after every fit), and the optimum over
contiguous partitions is also the optimum over arbitrary ones.

Sampling uses one uniform per label; it is not hardened against
floating-point attacks on the uniform's resolution. For float64 labels the
group search starts from a guide table built once with the parameters
(:mod:`rpwjax.mechanisms.guide`), with the same result bit for bit.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from rpwjax.mechanisms import guide
from rpwjax.mechanisms.base import Mechanism, params_dataclass
from rpwjax.errors import InputError, check_epsilon
from rpwjax.priors import Prior

# Dinkelbach stops when λ rises by less than this fraction of the variance:
# after that the loss is below k times it, far under any reported digit.
_RELATIVE_TOLERANCE = 1e-14
# an optimal fit has non-decreasing outputs; allow rounding in near ties
_MONOTONE_SLACK = 1e-9


@params_dataclass(static=("lo", "hi", "guide_steps"))
class RROnBins(Mechanism):
    """Fitted RR-on-Bins over the public ``[lo, hi]``.

    ``outputs`` holds ŷ₁ ≤ … ≤ ŷ_m padded to K = ``padded_size(k)`` ≥ k (k the
    support size; padding repeats ŷ_m), ``thresholds`` the m - 1 group
    boundaries padded to K - 1 with ``hi``, and ``num_bins`` is m (a float
    leaf, so that a vmapped fit over ε has static shapes and the JSON round
    trip keeps it numeric).

    ``group_low``/``group_high`` and the static ``guide_steps`` (the guide table
    of the group search) are derived from ``thresholds`` when the parameters are
    built from concrete values; they are neither saved nor read.
    """

    epsilon: jax.Array
    outputs: jax.Array
    thresholds: jax.Array
    num_bins: jax.Array
    lo: float
    hi: float
    group_low: jax.Array | None = None
    group_high: jax.Array | None = None
    guide_steps: int = 0

    name = "rr-on-bins"
    discrete = True
    derived_fields = ("group_low", "group_high", "guide_steps")

    derived_from = ("thresholds",)
    float_fields = ("lo", "hi")

    def _derive(self):
        low, high, steps = guide.count_brackets(self.thresholds, self.lo, self.hi, "left")
        return {"group_low": low, "group_high": high, "guide_steps": steps}

    def _derived_static(self):
        return {"guide_steps": guide.steps(self.group_low, self.group_high)}

    def _count(self):
        return jnp.asarray(self.num_bins).astype(jnp.int32)

    def group(self, y):
        """Group index of each label (after clipping to [lo, hi])."""
        y = jnp.clip(jnp.asarray(y), self.lo, self.hi)
        thresholds = jnp.asarray(self.thresholds, y.dtype)
        # thresholds strictly below y; the padding (hi) is never strictly below
        if self.group_low is not None and y.dtype == jnp.float64:
            g = guide.guided_count(thresholds, self.group_low, self.group_high, self.guide_steps, self.lo, self.hi,
                                   y, "left")
        else:  # the unrolled search fuses into one pass over the labels (the default loop makes a pass per step)
            g = jnp.searchsorted(thresholds, y, side="left", method="scan_unrolled")
        return jnp.minimum(g, self._count() - 1)

    def sample_from_uniform(self, u, y):
        """Inverse CDF over the sorted outputs at ``u`` (monotone in ``u``): weight e^ε on the own group, 1 on others.

        With t = u·(e^ε + m - 1) and g the own group, the cumulative weight through
        output j is j + 1 below g and j + e^ε from g on, so the output is
        ⌊t⌋ for t < g, g for g <= t < g + e^ε, and ⌊t - e^ε⌋ + 1 after.
        """
        g = self.group(y)
        m = self._count()
        a = jnp.exp(jnp.asarray(self.epsilon, y.dtype))
        t = u * (a + (m - 1).astype(y.dtype))
        gf = g.astype(y.dtype)
        index = jnp.where(t < gf, jnp.floor(t), jnp.where(t < gf + a, gf, jnp.floor(t - a) + 1))
        index = jnp.clip(index, 0, m - 1).astype(jnp.int32)
        return jnp.asarray(self.outputs, y.dtype)[index]

    def log_density(self, y_tilde, y):
        """log pmf; outputs that coincide in value add their probabilities."""
        y_tilde = jnp.asarray(y_tilde)
        y_tilde, y = jnp.broadcast_arrays(y_tilde, jnp.asarray(y, y_tilde.dtype))
        g = self.group(y)[..., None]
        m = self._count()
        a = jnp.exp(jnp.asarray(self.epsilon, y_tilde.dtype))
        outputs = jnp.asarray(self.outputs, y_tilde.dtype)
        slot = jnp.arange(outputs.shape[-1])
        match = (y_tilde[..., None] == outputs) & (slot < m)
        weight = jnp.sum(jnp.where(match, jnp.where(slot == g, a, 1.0), 0.0), axis=-1)
        return jnp.log(weight) - jnp.log(a + (m - 1))

    def _moments(self, y):
        """(ŷ of y's group, e^ε - 1, m, mean of the outputs, Σ (ŷ_h - mean)²)."""
        y = jnp.asarray(y)
        m = self._count()
        outputs = jnp.asarray(self.outputs, y.dtype)
        valid = jnp.arange(outputs.shape[-1]) < m
        mean = jnp.sum(jnp.where(valid, outputs, 0.0)) / m
        spread = jnp.sum(jnp.where(valid, (outputs - mean) ** 2, 0.0))
        u = jnp.expm1(jnp.asarray(self.epsilon, y.dtype))
        return outputs[self.group(y)], u, m.astype(y.dtype), mean, spread

    def bias(self, y):
        r"""E[Ỹ | y] - y = (u ŷ_g + m·mean(ŷ)) / (u + m) - y."""
        own, u, m, mean, _ = self._moments(y)
        return (u * own + m * mean) / (u + m) - y

    def mse(self, y):
        r"""E[(Ỹ - y)²] = [u (ŷ_g - y)² + m (y - mean ŷ)² + Σ_h (ŷ_h - mean ŷ)²] / (u + m)."""
        own, u, m, mean, spread = self._moments(y)
        return (u * (own - y) ** 2 + m * (y - mean) ** 2 + spread) / (u + m)

    def breakpoints(self):
        # mse jumps where the group changes; the padding (hi) adds empty pieces only
        return tuple(self.thresholds[..., i] for i in range(np.shape(self.thresholds)[-1]))


# --------------------------------------------------------------------------- fitting


def _best_partition(cum_sum, cum_mass, u, lam):
    """Prefix DP for max Σ_g (c_g - λ): parents of each prefix end, m and Σ c of the best."""
    k = cum_sum.shape[0] - 1
    split = jnp.arange(k + 1)

    def step(carry, i):
        best, count, total = carry
        seg_sum = cum_sum[i] - cum_sum
        seg_mass = jnp.maximum(cum_mass[i] - cum_mass, 0.0)
        c = u * u * seg_sum * seg_sum / (1.0 + u * seg_mass)
        cand = jnp.where(split < i, best + c - lam, -jnp.inf)
        j = jnp.argmax(cand).astype(jnp.int32)
        carry = (best.at[i].set(cand[j]), count.at[i].set(count[j] + 1), total.at[i].set(total[j] + c[j]))
        return carry, j

    init = (
        jnp.full(k + 1, -jnp.inf, cum_sum.dtype).at[0].set(0.0),
        jnp.zeros(k + 1, jnp.int32),
        jnp.zeros(k + 1, cum_sum.dtype),
    )
    (_, count, total), parent = lax.scan(step, init, jnp.arange(1, k + 1))
    return parent, count[k], total[k]


def _fit_one(support, mass, epsilon, hi):
    """Exact RR-on-Bins for one (support, masses, ε): Dinkelbach over prefix DPs."""
    k = support.shape[0]
    u = jnp.expm1(epsilon)
    mean = jnp.sum(mass * support)
    centred = support - mean
    variance = jnp.sum(mass * centred**2)
    zero = jnp.zeros(1, support.dtype)
    cum_sum = jnp.concatenate([zero, jnp.cumsum(mass * centred)])
    cum_mass = jnp.concatenate([zero, jnp.cumsum(mass)])
    tolerance = _RELATIVE_TOLERANCE * variance

    def keep_going(state):
        it, _, _, _, done = state
        return (~done) & (it < k + 2)

    def improve(state):
        it, lam, parent, m, _ = state
        new_parent, new_m, total = _best_partition(cum_sum, cum_mass, u, lam)
        new_lam = total / (u + new_m)
        better = new_lam > lam + tolerance
        return (
            it + 1,
            jnp.where(better, new_lam, lam),
            jnp.where(better, new_parent, parent),
            jnp.where(better, new_m, m),
            ~better,
        )

    # λ₀ = 0 is the ratio of the single group (every parent 0: one group ending at k)
    init = (jnp.int32(0), jnp.zeros((), support.dtype), jnp.zeros(k, jnp.int32), jnp.int32(1), jnp.bool_(False))
    iterations, lam, parent, m, _ = lax.while_loop(keep_going, improve, init)

    def backtrack(_, state):
        end, is_end = state
        live = end > 0
        is_end = is_end.at[jnp.where(live, end - 1, k)].set(True, mode="drop")
        return jnp.where(live, parent[jnp.maximum(end - 1, 0)], 0), is_end

    _, is_end = lax.fori_loop(0, k, backtrack, (jnp.int32(k), jnp.zeros(k, bool)))
    group = jnp.cumsum(is_end) - is_end
    group_mass = jnp.zeros(k, support.dtype).at[group].add(mass)
    group_sum = jnp.zeros(k, support.dtype).at[group].add(mass * centred)
    outputs = mean + u * group_sum / (1.0 + u * group_mass)
    outputs = jnp.where(jnp.arange(k) < m, outputs, outputs[m - 1])
    midpoints = 0.5 * (support[:-1] + support[1:])
    slot = jnp.where(is_end[:-1], group[:-1], k)
    thresholds = jnp.full(k - 1, hi, support.dtype).at[slot].set(midpoints, mode="drop")
    return outputs, thresholds, m.astype(support.dtype), variance - lam, iterations


def padded_size(k: int) -> int:
    """Support size the fit compiles for: at least 8, at most 25% above ``k``."""
    step = max(8, 2 ** max(int(np.floor(np.log2(max(k, 1)))) - 2, 0))
    return -(-k // step) * step


def _pad_support(support, mass):
    """Append zero-mass copies of the last support point up to :func:`padded_size`.

    Neutral for the fit: a zero-mass point at x_k leaves every group sum
    unchanged, so it joins the last group (a group of its own would only add
    the penalty λ > 0). Priors of similar sizes then share one compilation.
    """
    k = support.shape[-1]
    extra = padded_size(k) - k
    if extra == 0:
        return support, mass
    last = np.repeat(support[..., -1:], extra, axis=-1)
    return np.concatenate([support, last], axis=-1), np.concatenate([mass, np.zeros_like(last)], axis=-1)


@partial(jax.jit, static_argnames=("prior_batched",))
def _fit_grid(support, mass, epsilon, hi, prior_batched):
    axis = 0 if prior_batched else None
    return jax.vmap(_fit_one, in_axes=(axis, axis, 0, None))(support, mass, epsilon, hi)


def fit_rr_on_bins(prior: Prior, epsilon):
    """Fit RR-on-Bins to ``prior`` exactly, for a scalar ε or a 1-d ε grid.

    Args:
      prior: a :class:`~rpwjax.priors.Prior`; its support is its points (empirical)
        or its bin centres (histogram). A prior with a leading axis (one private
        histogram per ε) is mapped along ε.
      epsilon: the mechanism's budget (scalar or 1-d array).

    Returns:
      ``(params, info)``: :class:`RROnBins` with a leading ε axis when
      ``epsilon`` is 1-d, and ``info`` with, per ε, ``num_bins`` (m),
      ``label_mse`` (the optimum E[(Ỹ - Y)²] over the support, equal to
      ``params.label_mse(prior)`` for a discrete prior) and ``iterations``
      (Dinkelbach steps).
    """
    if not isinstance(prior, Prior):
        raise InputError(f"prior must be an rpwjax Prior, got prior of type {type(prior).__name__}")
    eps = check_epsilon(epsilon)
    scalar = eps.ndim == 0
    eps_grid = np.atleast_1d(eps)
    mass = np.asarray(prior.mass, dtype=np.float64)
    support = np.asarray(prior.support_points(), dtype=np.float64)
    prior_batched = mass.ndim > 1
    if prior_batched and mass.shape[0] != eps_grid.size:
        raise InputError(
            f"a batched prior needs one histogram per epsilon: {mass.shape[0]} priors for {eps_grid.size} epsilons"
        )
    if not (np.all(np.isfinite(mass)) and np.all(np.isfinite(support))):
        raise InputError("prior support and masses must be finite")
    support, mass = _pad_support(support, mass)
    with jax.enable_x64(True):
        outputs, thresholds, num_bins, value, iterations = (
            np.asarray(a) for a in _fit_grid(support, mass, eps_grid, float(prior.hi), prior_batched)
        )
    count = num_bins.astype(np.int64)
    slack = _MONOTONE_SLACK * (prior.hi - prior.lo)
    for e, (row, m) in enumerate(zip(outputs, count)):
        if np.any(np.diff(row[:m]) < -slack):
            raise RuntimeError(f"internal error: RR-on-Bins outputs not increasing at epsilon={eps_grid[e]!r}: {row[:m]}")
    params = RROnBins(eps_grid, outputs, thresholds, num_bins, prior.lo, prior.hi)
    info = {"num_bins": count, "label_mse": value, "iterations": iterations.astype(np.int64)}
    if scalar:
        params = params[0]
        info = {key: v[0] for key, v in info.items()}
    return params, info
