r"""Posterior denoising: replace ỹ by E[Y | Ỹ = ỹ] under the prior the fit used.

Post-processing of a private output, so it costs no privacy (the prior is the
known prior, or the private histogram already paid for with ε₁). Among all
functions of ỹ it minimises E[(f(Ỹ) - Y)²] under that prior.

RPWithPrior (closed form, exact for point-mass and histogram priors): for ỹ in
I, p(ỹ | y) ∝ e^{-ε} + (1 - e^{-ε})·1[y ∈ S(ỹ)], where
S(ỹ) = {y : |ỹ - clip(y, A1, A2)| <= ζ} = [L, U] with L = ỹ - ζ if ỹ - ζ > A1
(else unbounded below) and U = ỹ + ζ if ỹ + ζ < A2 (else unbounded above).
Hence

.. math::
   E[Y \mid \tilde y] = \frac{e^{-\varepsilon} E[Y] + (1 - e^{-\varepsilon}) E[Y; Y \in S]}
                             {e^{-\varepsilon} + (1 - e^{-\varepsilon}) P(Y \in S)},

with P and E[Y; ·] from the prior's CDF and H(x) = E[(x - Y)_+]
(E[Y; Y <= x] = x F(x) - H(x)).

Other mechanisms, point-mass priors (exact): the weighted sum
Σ_j w_j p(ỹ | x_j) x_j / Σ_j w_j p(ỹ | x_j) from the exact log density.

Discrete-output mechanisms (RR-on-Bins, Unbiased) under a histogram prior
(exact): their pmf depends on the label only through cells bounded by
``breakpoints()``, so the prior's bins are cut there into pieces on which
p(ỹ | y) is constant; each piece enters with its mass and its mean.
Continuous baselines under a histogram prior have no closed form here and
are refused with a clear message.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from .base import Mechanism
from .errors import InputError
from .priors import Prior
from .rpwithprior import RPWithPrior

_CHUNK = 1 << 14


def _rpwithprior_posterior(params: RPWithPrior, prior: Prior, y_tilde):
    eps, zeta, a1, a2 = (jnp.asarray(v, y_tilde.dtype) for v in (params.epsilon, params.zeta, params.a1, params.a2))
    lower = jnp.where(y_tilde - zeta > a1, y_tilde - zeta, prior.lo - 1.0)
    upper = jnp.where(y_tilde + zeta < a2, y_tilde + zeta, prior.hi + 1.0)
    h = prior.partial_expectation
    below_upper = upper * prior.cdf(upper) - h(upper)  # E[Y; Y <= U]
    below_lower = lower * prior.cdf(lower, strict=True) - h(lower)  # E[Y; Y < L]
    inside_mass = prior.cdf(upper) - prior.cdf(lower, strict=True)
    inside_first = below_upper - below_lower
    mean = prior.hi - h(jnp.asarray(prior.hi, y_tilde.dtype))
    shrink = jnp.exp(-eps)
    return (shrink * mean + (1 - shrink) * inside_first) / (shrink + (1 - shrink) * inside_mass)


@jax.jit
def _discrete_posterior(params, points, log_mass, y_tilde, values=None):
    """Σ w p(ỹ|point) value / Σ w p(ỹ|point); ``values`` default to the points themselves."""
    values = points if values is None else values
    log_p = jax.vmap(lambda x: params.log_density(y_tilde, jnp.full_like(y_tilde, x)))(points)  # (k, n)
    log_w = log_p + log_mass[:, None]
    norm = logsumexp(log_w, axis=0)
    return jnp.sum(jnp.exp(log_w - norm) * values[:, None], axis=0)


def _cell_pieces(params: Mechanism, prior: Prior):
    """The prior's bins cut at the mechanism's cell boundaries: (representative point, mass, mean) per piece."""
    cuts = np.concatenate([np.asarray(prior.left), np.asarray(prior.right)]
                          + [np.ravel(np.asarray(b, np.float64)) for b in params.breakpoints()])
    cuts = np.unique(np.clip(cuts, prior.lo, prior.hi))
    with jax.enable_x64(True):
        cdf = np.asarray(prior.cdf(jnp.asarray(cuts)))
        h = np.asarray(prior.partial_expectation(jnp.asarray(cuts)))
    below = cuts * cdf - h  # E[Y; Y <= cut]
    mass = np.diff(cdf)
    first = np.diff(below)
    keep = mass > 0
    mids = 0.5 * (cuts[:-1] + cuts[1:])
    return mids[keep], mass[keep], first[keep] / mass[keep]


def _snap_to_outputs(params: Mechanism, y_tilde: np.ndarray) -> np.ndarray:
    """Discrete outputs that went through float32 come back to the mechanism's exact output values."""
    outputs = np.unique(np.asarray(params.outputs, np.float64))
    index = np.clip(np.searchsorted(outputs, y_tilde), 1, outputs.size - 1) if outputs.size > 1 else np.zeros(
        y_tilde.shape, int)
    if outputs.size > 1:
        left, right = outputs[index - 1], outputs[index]
        nearest = np.where(np.abs(y_tilde - left) <= np.abs(right - y_tilde), left, right)
    else:
        nearest = np.full(y_tilde.shape, outputs[0])
    tolerance = 1e-6 * (params.hi - params.lo) + 1e-6 * np.abs(nearest)
    far = np.abs(nearest - y_tilde) > tolerance
    if far.any():
        i = int(np.flatnonzero(far)[0])
        raise InputError(f"{float(y_tilde[i])!r} is not an output of this {params.name} fit (y_tilde[{i}])")
    return nearest


def posterior_mean(params: Mechanism, prior: Prior, y_tilde) -> np.ndarray:
    """E[Y | Ỹ = ỹ] for each ỹ (float64), under ``prior``; ``params`` unbatched."""
    if params.batch_shape != ():
        raise InputError(f"posterior_mean needs parameters for one epsilon, got batch shape {params.batch_shape}")
    if np.ndim(prior.mass) != 1:
        raise InputError("posterior_mean needs one prior (not a batch of private histograms)")
    with jax.enable_x64(True):
        yt = jnp.asarray(y_tilde, jnp.float64)
        if isinstance(params, RPWithPrior):
            return np.asarray(jax.jit(_rpwithprior_posterior)(params, prior, yt))
        if prior.discrete:
            points = values = jnp.asarray(prior.left)
            log_mass = jnp.log(jnp.asarray(prior.mass))
        elif params.discrete:
            mids, mass, means = _cell_pieces(params, prior)
            points, values, log_mass = jnp.asarray(mids), jnp.asarray(means), jnp.log(jnp.asarray(mass))
        else:
            raise InputError(
                f"posterior denoising of {params.name} needs a point-mass prior (exact sum); "
                "under a histogram prior it is exact for rpwithprior, rr-on-bins and unbiased"
            )
        flat = yt.reshape(-1)
        if params.discrete:
            flat = jnp.asarray(_snap_to_outputs(params, np.asarray(flat)))
        parts = [np.asarray(_discrete_posterior(params, points, log_mass, flat[i : i + _CHUNK], values))
                 for i in range(0, flat.size, _CHUNK)]
        return np.concatenate(parts).reshape(yt.shape) if parts else np.zeros(yt.shape)
