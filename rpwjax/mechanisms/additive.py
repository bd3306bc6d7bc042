r"""Additive-noise baselines: Laplace, Gaussian and the staircase mechanism.

Each adds label-independent noise :math:`X` to the clipped label,

.. math::
   \tilde y = \mathrm{clip}(y, lo, hi) + X, \qquad \Delta = hi - lo,

and leaves the output unbounded (clipping it afterwards would be
post-processing, but would change the density, the bias and the MSE reported
here). Since :math:`|\mathrm{clip}(y) - \mathrm{clip}(y')| \le \Delta`, a noise
density :math:`f` with :math:`f(x) \le e^{\varepsilon} f(x + d)` for all
:math:`|d| \le \Delta` gives ε-label-DP.

* :class:`Laplace`: :math:`X \sim \mathrm{Lap}(\Delta/\varepsilon)`, pure ε-DP.
* :class:`Gaussian`: :math:`X \sim N(0, \sigma^2)`, **(ε, δ)-DP only, not pure
  ε-DP**. σ from the analytic Gaussian mechanism (Balle & Wang, "Improving
  the Gaussian Mechanism for Differential Privacy", ICML 2018) or the classic
  bound (Dwork & Roth 2014, Thm. A.1).
* :class:`Staircase`: the staircase mechanism (Geng & Viswanath, "The Optimal
  Noise-Adding Mechanism in Differential Privacy", IEEE Trans. Inf. Theory
  2016), pure ε-DP and MSE-optimal among additive noises for large ε.

Bias and MSE are relative to the TRUE label: ``bias(y) = clip(y) - y`` (the
noise is symmetric) and ``mse(y) = bias(y)² + Var[X]``; both are constant
inside ``[lo, hi]``, so ``breakpoints() = (lo, hi)`` makes ``label_mse`` exact.

Sampling: every sampler is an inverse CDF of ONE uniform per label
(:meth:`sample_from_uniform`), non-decreasing in the uniform. Released labels
never come from it directly: :func:`rpwjax.release_path.release` draws the
uniform from 52 random bits, snaps the output to a public power-of-two grid
and clamps it to a public range ``[lo - T, hi + T]`` (:meth:`release_spec`),
so that the realized probability of every released value is known exactly
and its ratio between labels is audited (:mod:`rpwjax.audit.checks`). The textbook
float samplers' weaknesses (Mironov, CCS 2012: label-dependent sets of
reachable floats, tails cut at the uniform's resolution) are what the grid
and the clamp remove.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize, special

from rpwjax.errors import InputError, format_value, check_choice, check_epsilon, check_range
from rpwjax.grid import MAX_CELLS, UNIFORM_COUNT, cell_count, pow2_at_least
from rpwjax.mechanisms.base import Mechanism, params_dataclass

CALIBRATIONS = ("analytic", "classic")
GAMMA_RULES = ("mse", "l1")


def _as_float(y):
    y = jnp.asarray(y)
    return y if jnp.issubdtype(y.dtype, jnp.floating) else y.astype(jnp.float32)


def _grid(epsilon):
    """Validated ε as a 1-d grid, and whether the caller gave a scalar."""
    eps = check_epsilon(epsilon)
    return np.atleast_1d(eps), eps.ndim == 0


def _unbatch(params, info, scalar):
    if scalar:
        return params[0], {k: v[0] for k, v in info.items()}
    return params, info


def _prior_range(prior):
    return check_range(prior.lo, prior.hi)


def _traced(*leaves) -> bool:
    """Whether any of ``leaves`` is a tracer (inside jit/vmap), where only jnp can compute with it."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in leaves)


class _Additive(Mechanism):
    """Shared parts of ``clip(y) + X`` with symmetric noise X of variance ``noise_variance()``.

    ``noise_variance()`` is a float64 numpy value when the parameters are concrete (the host computations
    of :meth:`release_spec` need it: at a tiny ε it passes float32's range long before float64's), and a jnp
    value of the leaves' dtype when they are traced; :meth:`mse` and :meth:`variance` cast it to the labels'
    dtype either way.
    """

    def noise_log_density(self, x):  # pragma: no cover - interface
        raise NotImplementedError

    def noise_cdf(self, x):  # pragma: no cover - interface
        raise NotImplementedError

    def noise_variance(self):  # pragma: no cover - interface
        raise NotImplementedError

    def clipped(self, y):
        return jnp.clip(_as_float(y), self.lo, self.hi)

    def log_density(self, y_tilde, y):
        y_tilde = _as_float(y_tilde)
        return self.noise_log_density(y_tilde - self.clipped(jnp.asarray(y, y_tilde.dtype)))

    def cdf(self, y_tilde, y):
        """P(Ỹ <= ỹ | y), exact."""
        y_tilde = _as_float(y_tilde)
        return self.noise_cdf(y_tilde - self.clipped(jnp.asarray(y, y_tilde.dtype)))

    def bias(self, y):
        y = _as_float(y)
        return self.clipped(y) - y

    def mse(self, y):
        y = _as_float(y)
        return self.bias(y) ** 2 + jnp.asarray(self.noise_variance(), y.dtype)

    def variance(self, y):
        y = _as_float(y)
        return jnp.broadcast_to(jnp.asarray(self.noise_variance(), y.dtype), y.shape)

    def breakpoints(self):
        return (self.lo, self.hi)

    def _tail_distance(self, threshold: float) -> float:
        """The largest d >= 0 with noise log density at d >= ``threshold`` (-inf if none); density non-increasing in |x|."""
        with jax.enable_x64(True):
            f = lambda d: float(self.noise_log_density(jnp.float64(d)))  # noqa: E731
            if f(0.0) < threshold:
                return -np.inf
            step = float(np.sqrt(self.noise_variance())) + (self.hi - self.lo)
            low, high = 0.0, step
            while f(high) >= threshold:
                low, high = high, 2 * high
            for _ in range(80):
                mid = 0.5 * (low + high)
                if f(mid) >= threshold:
                    low = mid
                else:
                    high = mid
        return low

    def release_spec(self) -> dict:
        r"""Grid h and clamp range [a, b] ⊇ [lo - T, hi + T] rounded inwards to the grid, from public parameters.

        h starts at the largest power of two <= std(X)/16 (its rounding adds at
        most h²/12 <= Var[X]/3072 to the label MSE). T is the largest margin at
        which every full output cell still holds M = :func:`rpwjax.grid.cell_count` (ε) of the 2^52
        uniforms at every label: with D = Δ + T the farthest distance between a
        label and an unclamped output, N·h·f(D) >= M, f the noise
        density. h is doubled while T < 0 or the range has more than
        ``MAX_CELLS`` cells.
        """
        width = self.hi - self.lo
        std = float(np.sqrt(np.asarray(self.noise_variance(), np.float64)))
        h = pow2_at_least(std / 16)
        if h > std / 16:
            h /= 2
        need = cell_count(self.epsilon, self.pure)
        for _ in range(200):
            distance = self._tail_distance(float(np.log(need / (UNIFORM_COUNT * h))))
            margin = distance - width
            if margin >= 0 and (width + 2 * margin) / h <= MAX_CELLS:
                break
            h *= 2
        else:  # at a very large ε the noise is too narrow for any float64 grid to keep every cell's mass
            raise InputError(f"epsilon is too large: no public grid keeps {need:g} of the 2^52 uniforms in "
                             "every output cell")
        return {"grid": h, "low": np.ceil((self.lo - margin) / h) * h, "high": np.floor((self.hi + margin) / h) * h}


# --------------------------------------------------------------------------- Laplace


@params_dataclass(static=("lo", "hi"))
class Laplace(_Additive):
    r"""Laplace mechanism: :math:`\tilde y = \mathrm{clip}(y) + X`, density of X
    :math:`\frac{1}{2s} e^{-|x|/s}` with scale :math:`s = \Delta/\varepsilon`.

    Pure ε-DP: :math:`|x| - |x + d| \le |d| \le \Delta`. Var[X] = 2s².
    """

    epsilon: jax.Array
    scale: jax.Array
    lo: float
    hi: float

    name = "laplace"

    def noise_log_density(self, x):
        s = jnp.asarray(self.scale, x.dtype)
        return -jnp.log(2 * s) - jnp.abs(x) / s

    def noise_cdf(self, x):
        s = jnp.asarray(self.scale, x.dtype)
        tail = 0.5 * jnp.exp(-jnp.abs(x) / s)
        return jnp.where(x < 0, tail, 1 - tail)

    def noise_variance(self):
        if _traced(self.scale):
            return 2 * jnp.asarray(self.scale) ** 2
        with np.errstate(over="ignore"):  # inf past float64's range: release_spec then refuses ε as too small
            return 2 * np.asarray(self.scale, np.float64) ** 2

    def sample_from_uniform(self, u, y):
        """Inverse CDF at u in (0, 1): X = s·log(2u) below 1/2, -s·log(2(1 - u)) above (monotone in u)."""
        y = _as_float(y)
        u = jnp.asarray(u, y.dtype)
        s = jnp.asarray(self.scale, y.dtype)
        below = u < 0.5
        # one log per label (where() would evaluate both branches' logs); the same float64 values as
        # s·log(2u) and (-s)·log(2(1 - u))
        x = jnp.where(below, s, -s) * jnp.log(jnp.where(below, 2 * u, 2 * (1 - u)))
        return self.clipped(y) + x

    @classmethod
    def from_json(cls, fields: dict):
        params = super().from_json(fields)
        check_range(params.lo, params.hi)
        eps = check_epsilon(params.epsilon)
        # a hand-edited scale below Δ/ε would silently weaken the guarantee
        if np.any(np.asarray(params.scale) < (params.hi - params.lo) / eps * (1 - 1e-12)):
            raise InputError(
                f"Laplace scale must be at least (hi - lo)/epsilon, got scale={format_value(params.scale)} "
                f"for epsilon={format_value(eps)} and range=({params.lo!r}, {params.hi!r})"
            )
        return params


def fit_laplace(prior, epsilon):
    """Laplace with scale Δ/ε; the prior only supplies the public range (any batch shape).

    Returns ``(Laplace, {})``, with a leading ε axis when ``epsilon`` is 1-d.
    """
    grid, scalar = _grid(epsilon)
    lo, hi = _prior_range(prior)
    params = Laplace(grid, (hi - lo) / grid, lo, hi)
    return _unbatch(params, {}, scalar)


# --------------------------------------------------------------------------- Gaussian


def gaussian_delta(sigma, epsilon, width):
    r"""The exact δ of ``clip(y) + N(0, σ²)`` at ε (Balle & Wang 2018, Thm. 8), in float64 numpy.

    .. math::
       \delta(\sigma) = \Phi\Big(\frac{\Delta}{2\sigma} - \frac{\varepsilon\sigma}{\Delta}\Big)
       - e^{\varepsilon}\,\Phi\Big(-\frac{\Delta}{2\sigma} - \frac{\varepsilon\sigma}{\Delta}\Big)
    """
    return np.exp(_log_gaussian_delta(np.asarray(sigma, np.float64), np.asarray(epsilon, np.float64), float(width)))


def _log_gaussian_delta(sigma, epsilon, width):
    # In logs: for large ε the second term is e^ε times a tiny Φ, and for small
    # ε the two terms nearly cancel; log_ndtr keeps both accurate.
    a = width / (2 * sigma)
    b = epsilon * sigma / width
    first = special.log_ndtr(a - b)
    ratio = epsilon + special.log_ndtr(-a - b) - first  # log(second / first) < 0
    ratio = np.minimum(ratio, -np.finfo(np.float64).tiny)
    with np.errstate(divide="ignore", invalid="ignore"):  # np.where computes both branches; each is used where exact
        log1m = np.where(ratio > -np.log(2), np.log(-np.expm1(ratio)), np.log1p(-np.exp(ratio)))
    return first + log1m


def analytic_gaussian_sigma(epsilon: float, delta: float, width: float) -> float:
    """The smallest σ whose exact δ(σ) at ε is at most ``delta`` (Balle & Wang 2018, Alg. 1).

    δ(σ) decreases from 1 to 0 in σ; the root of log δ(σ) = log δ is found in
    log σ by Brent's method, then nudged up until the condition holds in
    floating point, so the returned σ is never (numerically) too small.
    """
    eps, log_target = float(epsilon), np.log(delta)

    def excess(log_sigma):
        return float(_log_gaussian_delta(np.exp(log_sigma), eps, width)) - log_target

    start = np.log(np.sqrt(2 * np.log(1.25 / delta)) * width / eps)
    if not np.isfinite(start):  # σ ≈ Δ/ε passes float64's range: no noise of that spread can be released
        raise InputError(f"epsilon={float(epsilon)!r} is too small for gaussian on a range of width {width!r}: its noise "
                         "scale (about width/epsilon) is beyond float64")
    lower, upper = start, start
    while excess(lower) <= 0:
        lower -= 1.0
    while excess(upper) > 0:
        upper += 1.0
    root = optimize.brentq(excess, lower, upper, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    sigma = np.exp(root)
    for _ in range(64):
        if excess(np.log(sigma)) <= 0:
            break
        sigma = np.nextafter(sigma, np.inf) * (1 + 1e-15)
    return float(sigma)


def classic_gaussian_sigma(epsilon, delta, width):
    """σ = √(2 ln(1.25/δ))·Δ/ε (Dwork & Roth 2014, Thm. A.1; proven for ε < 1 only)."""
    return np.sqrt(2 * np.log(1.25 / delta)) * width / np.asarray(epsilon, np.float64)


def _check_delta(delta) -> float:
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise InputError(f"delta must be a number in (0, 1), got delta={delta!r}") from None
    if not (0 < d < 1):  # also rejects NaN
        raise InputError(f"delta must be in (0, 1), got delta={d!r}")
    return d


@params_dataclass(static=("lo", "hi", "calibration"))
class Gaussian(_Additive):
    r"""Gaussian mechanism: :math:`\tilde y = \mathrm{clip}(y) + N(0, \sigma^2)`.

    **(ε, δ)-DP, NOT pure ε-DP**: the ratio of two Gaussian densities is
    unbounded, so for every σ some outputs have privacy loss above ε; δ bounds
    the probability of that event. ``calibration="analytic"`` is the smallest
    σ that satisfies the exact condition (Balle & Wang 2018):

    .. math::
       \Phi\Big(\frac{\Delta}{2\sigma} - \frac{\varepsilon\sigma}{\Delta}\Big)
       - e^{\varepsilon}\Phi\Big(-\frac{\Delta}{2\sigma} - \frac{\varepsilon\sigma}{\Delta}\Big) \le \delta;

    ``"classic"`` is σ = √(2 ln(1.25/δ))·Δ/ε, proven only for ε < 1.
    """

    epsilon: jax.Array
    delta: jax.Array
    sigma: jax.Array
    lo: float
    hi: float
    calibration: str = "analytic"

    name = "gaussian"
    pure = False

    def noise_log_density(self, x):
        s = jnp.asarray(self.sigma, x.dtype)
        return -0.5 * jnp.log(2 * jnp.pi * s**2) - 0.5 * (x / s) ** 2

    def noise_cdf(self, x):
        return jax.scipy.special.ndtr(x / jnp.asarray(self.sigma, x.dtype))

    def noise_variance(self):
        return jnp.asarray(self.sigma) ** 2

    def sample_from_uniform(self, u, y):
        """Inverse CDF at u in (0, 1): X = σ·Φ⁻¹(u) (``ndtri``; monotone in u)."""
        y = _as_float(y)
        u = jnp.asarray(u, y.dtype)
        return self.clipped(y) + jnp.asarray(self.sigma, y.dtype) * jax.scipy.special.ndtri(u)

    @classmethod
    def from_json(cls, fields: dict):
        params = super().from_json(fields)
        lo, hi = check_range(params.lo, params.hi)
        check_choice(params.calibration, "calibration", CALIBRATIONS)
        eps = check_epsilon(params.epsilon)
        for d in np.ravel(params.delta):
            _check_delta(d)
        sigma = np.asarray(params.sigma)
        # a hand-edited σ must still meet the (ε, δ) condition it claims
        if params.calibration == "classic":
            ok = sigma >= classic_gaussian_sigma(eps, params.delta, hi - lo) * (1 - 1e-12)
        else:
            ok = (sigma > 0) & (gaussian_delta(np.maximum(sigma, 1e-300), eps, hi - lo) <= params.delta * (1 + 1e-9))
        if not np.all(ok):
            raise InputError(
                f"Gaussian sigma={format_value(sigma)} is too small for epsilon={format_value(eps)}, delta={format_value(params.delta)} "
                f"({params.calibration} calibration) on range=({lo!r}, {hi!r})"
            )
        return params


GAUSSIAN_DEFAULT_DELTA = 1e-5  # the Gaussian mechanism's δ when none is given


def fit_gaussian(prior, epsilon, *, delta=GAUSSIAN_DEFAULT_DELTA, calibration: str = "analytic"):
    """Gaussian noise calibrated to (ε, δ); the prior only supplies the public range.

    Args:
      prior: any object with the public ``lo``, ``hi`` (a batched prior is fine).
      epsilon: scalar or 1-d grid.
      delta: δ in (0, 1), shared by the grid (the paper used 1e-4 with ``"classic"``).
      calibration: ``"analytic"`` (Balle & Wang 2018, default) or ``"classic"``.

    Returns:
      ``(Gaussian, info)``; with ``"classic"``, ``info["classic_valid"]`` says
      per ε whether ε < 1, where the classic bound is proven.
    """
    grid, scalar = _grid(epsilon)
    d = _check_delta(delta)
    check_choice(calibration, "calibration", CALIBRATIONS)
    lo, hi = _prior_range(prior)
    width = hi - lo
    if calibration == "analytic":
        # per-ε 1-d root finding in scipy: cheap next to anything that trains a model
        sigma = np.array([analytic_gaussian_sigma(e, d, width) for e in grid])
        info = {}
    else:
        sigma = classic_gaussian_sigma(grid, d, width)
        info = {"classic_valid": grid < 1}
    params = Gaussian(grid, np.full_like(grid, d), sigma, lo, hi, calibration)
    return _unbatch(params, info, scalar)


# --------------------------------------------------------------------------- staircase


def staircase_optimal_gamma(epsilon):
    r"""The γ minimising E[X²] (Geng & Viswanath 2016, Thm. 7), with b = e^{-ε}:

    .. math::
       \gamma^* = -\frac{b}{1-b} + \frac{(b - 2b^2 + 2b^4 - b^5)^{1/3}}{2^{1/3}(1-b)^2}
               = \frac{b(1 + 2b)}{2(c^2 + cb + b^2)}, \qquad c = \Big(\frac{b(1+b)}{2}\Big)^{1/3}.

    The second form follows from b - 2b² + 2b⁴ - b⁵ = b(1+b)(1-b)³ and
    c³ - b³ = b(1-b)(1+2b)/2; it has no cancellation as ε → 0 (γ* → 1/2) and
    is divided through by c² so that ε → ∞ gives γ* ≈ (b/2)^{1/3} → 0 without 0/0.
    Traceable (jnp).
    """
    eps = jnp.asarray(epsilon)
    b = jnp.exp(-eps)
    # r = b / c and b / c² written with b^{1/3} = e^{-ε/3} so nothing underflows first
    two_over = 2 / (1 + b)
    b_over_c2 = jnp.exp(-eps / 3) * two_over ** (2 / 3)
    b_over_c = jnp.exp(-2 * eps / 3) * two_over ** (1 / 3)
    return b_over_c2 * (1 + 2 * b) / (2 * (1 + b_over_c + b_over_c**2))


def staircase_l1_gamma(epsilon):
    """The γ minimising E|X|: 1/(1 + e^{ε/2}) (Geng & Viswanath 2016)."""
    return jax.nn.sigmoid(-jnp.asarray(epsilon) / 2)


def staircase_noise_mse(epsilon, gamma, width):
    r"""E[X²] of the staircase noise in closed form (traceable):

    .. math::
       E[X^2] = \frac{\Delta^2 (1-b)}{3(\gamma + (1-\gamma)b)}\Big[3S_2(\gamma + b(1-\gamma))
       + 3S_1(\gamma^2 + b(1-\gamma^2)) + S_0(\gamma^3 + b(1-\gamma^3))\Big]

    with :math:`S_j = \sum_k k^j b^k`: :math:`S_0 = 1/(1-b)`, :math:`S_1 = b/(1-b)^2`,
    :math:`S_2 = b(1+b)/(1-b)^3` (from integrating x² over every step).
    """
    return _staircase_noise_mse(jnp, jnp.asarray(epsilon), jnp.asarray(gamma), width)


def staircase_noise_mse64(epsilon, gamma, width):
    """:func:`staircase_noise_mse` of concrete values in float64 numpy, whatever JAX's default dtype (inf
    where E[X²] passes float64's range, at an ε too small for the range)."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return _staircase_noise_mse(np, np.asarray(epsilon, np.float64), np.asarray(gamma, np.float64),
                                    np.float64(width))


def _staircase_noise_mse(xp, eps, g, width):
    """The closed form of :func:`staircase_noise_mse` with the array module ``xp`` (jnp or np).

    The leading 1 - b is multiplied into the bracket, (1-b)S_j, and r = b/(1-b) is divided by 1 - b once
    more rather than 1 - b cubed: at a tiny ε, (1-b)³ ≈ ε³ would underflow to a subnormal or zero (an
    inaccurate or infinite variance) long before the variance itself, about 2Δ²/ε², leaves the float range."""
    b = xp.exp(-eps)
    one_minus_b = -xp.expm1(-eps)
    r = b / one_minus_b  # (1-b)S_1; (1-b)S_0 = 1 and (1-b)S_2 = r(1+b)/(1-b)
    bracket = (3 * (r * (1 + b) / one_minus_b) * (g + b * (1 - g)) + 3 * r * (g**2 + b * (1 - g**2))
               + (g**3 + b * (1 - g**3)))
    return width**2 / (3 * (g + (1 - g) * b)) * bracket


@params_dataclass(static=("lo", "hi", "gamma_rule"))
class Staircase(_Additive):
    r"""Staircase mechanism (Geng & Viswanath 2016) with sensitivity Δ = hi - lo.

    With :math:`b = e^{-\varepsilon}`, :math:`k \in \{0, 1, \dots\}` and
    :math:`a = \frac{1-b}{2\Delta(\gamma + (1-\gamma)b)}`, the noise density is

    .. math::
       f(x) = \begin{cases} a\,b^k & |x| \in [k\Delta, (k+\gamma)\Delta) \\
       a\,b^{k+1} & |x| \in [(k+\gamma)\Delta, (k+1)\Delta). \end{cases}

    A shift by at most Δ moves x by at most one step, so the density changes by
    a factor of at most b⁻¹ = e^ε: pure ε-DP. E[X] = 0 and E[X²] is
    :func:`staircase_noise_mse`. ``gamma_rule`` records how γ was chosen
    (``"mse"``, ``"l1"`` or ``"given"``).
    """

    epsilon: jax.Array
    gamma: jax.Array
    lo: float
    hi: float
    gamma_rule: str = "mse"

    name = "staircase"

    def _cast(self, dtype):
        return jnp.asarray(self.epsilon, dtype), jnp.asarray(self.gamma, dtype), jnp.asarray(self.hi - self.lo, dtype)

    def _step(self, x):
        """(k, fraction in the step, whether in the upper part) of |x|/Δ."""
        eps, gamma, width = self._cast(x.dtype)
        z = jnp.abs(x) / width
        k = jnp.floor(z)
        frac = z - k
        return k, frac, frac >= gamma

    def noise_log_density(self, x):
        # exactly on a step edge the value follows the rounding of ỹ - clip(y) (a null set)
        eps, gamma, width = self._cast(x.dtype)
        k, _, upper = self._step(x)
        b = jnp.exp(-eps)
        log_a = jnp.log(-jnp.expm1(-eps)) - jnp.log(2 * width) - jnp.log(gamma + (1 - gamma) * b)
        return log_a - eps * (k + upper)

    def noise_cdf(self, x):
        eps, gamma, width = self._cast(x.dtype)
        k, frac, _ = self._step(x)
        b = jnp.exp(-eps)
        a_width = -jnp.expm1(-eps) / (2 * (gamma + (1 - gamma) * b))
        # mass of (0, |x|]: k whole steps (each side of a step k holds (1-b)b^k/2) plus the partial step
        half = 0.5 * -jnp.expm1(-eps * k) + a_width * jnp.exp(-eps * k) * (
            jnp.minimum(frac, gamma) + b * jnp.maximum(frac - gamma, 0)
        )
        return 0.5 + jnp.sign(x) * half

    def noise_variance(self):
        if _traced(self.epsilon, self.gamma):
            return staircase_noise_mse(self.epsilon, self.gamma, self.hi - self.lo)
        return staircase_noise_mse64(self.epsilon, self.gamma, self.hi - self.lo)

    def sample_from_uniform(self, u, y):
        r"""Inverse CDF at u in (0, 1) (monotone in u): the sign from u < 1/2, then |X| from its survival w.

        w = 2u (negative side) or 2(1 - u) (positive side) is P(|X| >= |x|).
        Since P(|X| >= kΔ) = b^k, the step is k = ⌊-log(w)/ε⌋, and inside it
        the survival is :math:`b^k (1 - (1-b) C(z))` with
        :math:`C(z) = (\min(z, γ) + b \max(z - γ, 0)) / (γ + (1-γ) b)` the share
        of the step's mass below kΔ + zΔ; solving for z gives |X| = Δ(k + z).
        """
        y = _as_float(y)
        u = jnp.asarray(u, y.dtype)
        eps, gamma, width = self._cast(y.dtype)
        w = jnp.where(u < 0.5, 2 * u, 2 * (1 - u))
        k = jnp.floor(-jnp.log(w) / eps)
        b = jnp.exp(-eps)
        r = w * jnp.exp(eps * k)  # in (b, 1] up to rounding
        c = jnp.clip((1 - r) / -jnp.expm1(-eps), 0.0, 1.0)
        m = c * (gamma + (1 - gamma) * b)
        z = jnp.where(m <= gamma, m, gamma + (m - gamma) / b)
        magnitude = width * (k + jnp.minimum(z, 1.0))
        return self.clipped(y) + jnp.where(u < 0.5, -magnitude, magnitude)

    @classmethod
    def from_json(cls, fields: dict):
        params = super().from_json(fields)
        check_range(params.lo, params.hi)
        check_epsilon(params.epsilon)
        check_choice(params.gamma_rule, "gamma_rule", (*GAMMA_RULES, "given"))
        g = np.asarray(params.gamma)
        if not np.all((g > 0) & (g < 1)):
            raise InputError(f"gamma must be in (0, 1), got gamma={format_value(g)}")
        return params


@partial(jax.jit, static_argnames=("rule",))
def _staircase_gammas(epsilon, rule):
    one = staircase_optimal_gamma if rule == "mse" else staircase_l1_gamma
    return jax.vmap(one)(epsilon)


def fit_staircase(prior, epsilon, *, gamma="mse"):
    """Staircase noise with sensitivity hi - lo; the prior only supplies the public range.

    Args:
      prior: any object with the public ``lo``, ``hi`` (a batched prior is fine).
      epsilon: scalar or 1-d grid.
      gamma: ``"mse"`` (minimise E[X²], default), ``"l1"`` (minimise E|X|),
        or a number in (0, 1) used for every ε.

    Returns ``(Staircase, {})``, with a leading ε axis when ``epsilon`` is 1-d.
    """
    grid, scalar = _grid(epsilon)
    lo, hi = _prior_range(prior)
    if isinstance(gamma, str):
        check_choice(gamma, "gamma", GAMMA_RULES)
        with jax.enable_x64(True):
            gammas = np.asarray(_staircase_gammas(jnp.asarray(grid), gamma))
        rule = gamma
    else:
        try:
            g = float(gamma) if not isinstance(gamma, bool) else np.nan
        except (TypeError, ValueError):
            g = np.nan
        if not (0 < g < 1):
            raise InputError(f"gamma must be 'mse', 'l1' or a number in (0, 1), got gamma={gamma!r}")
        gammas, rule = np.full_like(grid, g), "given"
    params = Staircase(grid, gammas, lo, hi, rule)
    return _unbatch(params, {}, scalar)
