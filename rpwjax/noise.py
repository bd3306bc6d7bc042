r"""Exact integer noise for counts: the discrete Laplace mechanism, sampled without floating point.

Counts are released as ``count + Z`` with :math:`P(Z = z) \propto e^{-|z|\varepsilon/2}`
on the integers (replace-one neighbours change two counts by one each: the
L1 sensitivity is 2, so the vector of noisy counts is ε-DP). The sampler is
the one of Canonne, Kamath and Steinke ("The Discrete Gaussian for
Differential Privacy", NeurIPS 2020, Algorithms 1 and 2): it uses only
exact rational arithmetic (Python integers and :class:`fractions.Fraction`;
ε is a float, hence an exact dyadic rational) and uniform integers, so the
released integers have exactly the ideal distribution. Nothing here is a
floating-point sampler, and there is no tail to truncate.

Random integers come from a deterministic bit generator: SHA-256 in counter
mode over a :class:`~rpwjax.keys.Secret` (so a key file reproduces the noise
and OS entropy makes it unguessable).

The sampler's one limit is its output type: a draw is an int64 (added to an
int64 count), so it must stay below :data:`MAX_NOISE` = 2^62 in magnitude.
A rate r gives P(|Z| >= MAX_NOISE) <= 2·e^(-r·MAX_NOISE); below :data:`MIN_RATE`
that could pass 2^-:data:`TAIL_BITS`, so such a rate (an ε too small for
this sampler) is refused before anything is drawn (:func:`min_epsilon`,
:func:`check_noise_epsilon`).
"""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction

import numpy as np

from rpwjax import draws
from rpwjax.errors import InputError, check_epsilon
from rpwjax.keys import Secret, bound

MAX_NOISE = 1 << 62  # |Z| below this: an int64 count (< 2^62) plus the noise cannot overflow
TAIL_BITS = 64  # a draw reaches MAX_NOISE with probability at most 2^-TAIL_BITS
# the smallest rate with 2·exp(-rate·MAX_NOISE) <= 2^-TAIL_BITS
MIN_RATE = (TAIL_BITS + 1) * math.log(2) / MAX_NOISE * (1 + 1e-12)


def min_epsilon(divisor=1) -> float:
    """The smallest ε whose noise of rate ε/``divisor`` the sampler accepts (:data:`MIN_RATE` · ``divisor``)."""
    return float(MIN_RATE * divisor)


def check_noise_epsilon(epsilon, name: str = "epsilon", divisor=1, what: str = "") -> float:
    """``epsilon`` (checked by :func:`rpwjax.errors.check_epsilon`) as a float, refused unless its noise of rate
    ε/``divisor`` is one the exact sampler can draw: the error names the value and the smallest accepted one."""
    eps = check_epsilon(epsilon, name)
    small = eps < min_epsilon(divisor)
    if np.any(small):
        value = float(np.asarray(eps)[small].ravel()[0]) if np.ndim(eps) else float(eps)
        raise InputError(
            f"{name} is too small for the exact integer noise sampler{what}, got {name}={value!r}: the smallest "
            f"accepted is {min_epsilon(divisor):.3g} (below it, its discrete Laplace noise may not fit in an int64)")
    return eps


class BitStream:
    """Uniform random integers from SHA-256(secret material, counter)."""

    def __init__(self, secret: Secret, purpose: str, *index: int, epsilon: float):
        """The noise stream of one private draw at ``epsilon`` (noted: :mod:`rpwjax.draws`)."""
        # an unbound secret gets a fresh release: the same key file never repeats a noise draw by accident
        self._material = bound(secret).digest(purpose, *index)
        draws.note(b"noise/" + self._material, epsilon)
        self._counter = 0
        self._pool = 0
        self._bits = 0

    def _refill(self):
        block = hashlib.sha256(self._material + self._counter.to_bytes(8, "big")).digest()
        self._counter += 1
        self._pool = (self._pool << 256) | int.from_bytes(block, "big")
        self._bits += 256

    def bits(self, k: int) -> int:
        while self._bits < k:
            self._refill()
        self._bits -= k
        out = self._pool >> self._bits
        self._pool &= (1 << self._bits) - 1
        return out

    def below(self, n: int) -> int:
        """Uniform on {0, ..., n - 1} (rejection sampling: exact)."""
        k = (n - 1).bit_length()
        while True:
            v = self.bits(k) if k else 0
            if v < n:
                return v

    def bernoulli(self, p: Fraction) -> bool:
        """True with probability ``p`` (a rational in [0, 1]), exactly."""
        return self.below(p.denominator) < p.numerator


def bernoulli_exp(gamma: Fraction, rng: BitStream) -> bool:
    """True with probability exp(-gamma), gamma >= 0 rational (CKS 2020, Algorithm 1)."""
    while gamma > 1:
        if not bernoulli_exp(Fraction(1), rng):
            return False
        gamma -= 1
    k = 1
    while rng.bernoulli(gamma / k):
        k += 1
    return k % 2 == 1


def discrete_laplace(rate: Fraction, rng: BitStream) -> int:
    """One draw of Z with P(Z = z) ∝ exp(-rate·|z|) on the integers (CKS 2020, Algorithm 2)."""
    if rate < MIN_RATE:
        raise InputError(f"the exact integer noise sampler needs a rate of at least {MIN_RATE:.3g} (its draws must "
                         f"stay below 2^62 to be int64), got rate {float(rate):.3g}: epsilon is too small")
    s, t = rate.numerator, rate.denominator  # exp(-|z| s / t)
    while True:
        u = rng.below(t)
        if not bernoulli_exp(Fraction(u, t), rng):
            continue
        v = 0
        while bernoulli_exp(Fraction(1), rng):
            v += 1
        y = (u + t * v) // s
        negative = rng.bits(1) == 1
        if negative and y == 0:
            continue
        if y >= MAX_NOISE:  # probability at most 2^-TAIL_BITS at MIN_RATE: refuse rather than overflow an int64
            raise RuntimeError(f"a discrete Laplace draw of rate {float(rate):.3g} reached 2^62")
        return -y if negative else y


def noisy_counts(counts, epsilon: float, secret: Secret, purpose: str, *index: int) -> np.ndarray:
    """``counts`` (integers) plus independent discrete Laplace noise of rate ε/2 each: an ε-DP release
    of a histogram under replace-one neighbours. Returns int64 noisy counts (may be negative)."""
    eps = float(check_noise_epsilon(epsilon, divisor=2))
    rate = Fraction(eps) / 2
    rng = BitStream(secret, purpose, *index, epsilon=eps)
    c = np.asarray(counts, np.int64).ravel()
    noise = np.array([discrete_laplace(rate, rng) for _ in range(c.size)], np.int64)
    return (c + noise).reshape(np.shape(counts))  # add in the flat order, then restore the shape
