"""The float64 release grid: how many uniforms a release draws from, and the grid helpers the mechanisms use.

Every release draws one of ``UNIFORM_COUNT = 2^52`` equally likely uniforms per label
(:func:`rpwjax.sampling.uniform_from_index`). A mechanism's
:meth:`~rpwjax.mechanisms.base.Mechanism.release_spec` picks a public grid (a power of two,
:func:`pow2_at_least`) and range so that every output cell holds at least :data:`MIN_CELL_COUNT` of
them at every label (:func:`cell_count`: more at a small ε), with at most :data:`MAX_CELLS` cells.

**Why the count grows as ε shrinks.** A cell's realized probability is an integer count of uniforms over
``N``; the float64 inverse CDF and the integer rounding move each count by a few uniforms, so a log ratio
by up to about ``4/count`` (measured up to 1.5e-7 at ``2^23``). The certificate allows
``min(1e-6, 1e-3·ε)`` (:func:`rpwjax.realized.tolerance`): relative to ε, not only absolute. So a pure
mechanism's cells hold at least ``8/(1e-3·ε)`` uniforms (:data:`COUNT_PER_EPSILON`), which keeps the
rounding under ``ε/2000``; at most :data:`MAX_CELL_COUNT`, so a pure ε below :data:`MIN_EPSILON` is refused.
"""

from __future__ import annotations

import numpy as np

from rpwjax.errors import InputError

UNIFORM_BITS = 52
UNIFORM_COUNT = 1 << UNIFORM_BITS  # N: the number of distinct uniforms
MIN_CELL_COUNT = 1 << 23  # uniforms that land in any full output cell, at every label (half cells at the ends: half)
MAX_CELLS = 1 << 16  # the grid is never finer than (b - a) / MAX_CELLS
RELATIVE_TOLERANCE = 1e-3  # a certified pure release realizes at most ε·(1 + this), and never above ε + 1e-6
COUNT_PER_EPSILON = 8 / RELATIVE_TOLERANCE  # a pure mechanism's cells hold at least this / ε uniforms
MAX_CELL_COUNT = 1 << 46  # ... and never need more than this (at most 64 cells of the 2^52 uniforms)
# below this ε a pure mechanism would need more than MAX_CELL_COUNT uniforms per cell: refused
MIN_EPSILON = COUNT_PER_EPSILON / MAX_CELL_COUNT  # 1.14e-10
# a pure mechanism above this ε has some output with under e^-ε the probability of another, fewer than
# MIN_CELL_COUNT of the N uniforms where the other has them all: its ratio cannot be certified from counts
MAX_EPSILON = float(np.log(UNIFORM_COUNT / MIN_CELL_COUNT))  # 29 ln 2 = 20.10


def cell_count(epsilon, pure: bool = True) -> float:
    """The uniforms every full output cell of a release at ``epsilon`` (its smallest, for per-row parameters)
    must hold at every label: :data:`MIN_CELL_COUNT`, or for a pure mechanism at a small ε the power of two
    at least ``COUNT_PER_EPSILON / ε`` (see the module docstring), at most :data:`MAX_CELL_COUNT`. An
    (ε, δ) mechanism's certificate is its realized δ, which does not scale with ε: ``MIN_CELL_COUNT``."""
    eps = float(np.min(epsilon))
    if not pure or not eps > 0:
        return float(MIN_CELL_COUNT)
    return float(min(max(MIN_CELL_COUNT, pow2_at_least(COUNT_PER_EPSILON / eps)), MAX_CELL_COUNT))


def pow2_at_least(x: float) -> float:
    """The smallest power of two >= ``x`` (``x`` > 0 and finite; a non-finite ``x``, e.g. the spread of noise whose
    variance overflowed at a tiny ε, has none: an :class:`~rpwjax.errors.InputError` saying ε is too small; nor
    has ``x`` = 0, the step of noise on a range so narrow that its spread underflowed: one saying the range is too
    narrow. The caller's refusal names ε and the range, :func:`rpwjax.certify.where`)."""
    x = float(x)
    if not np.isfinite(x):  # frexp(inf) would give 2^0: a grid of 1 for noise of infinite spread
        raise InputError(f"epsilon is too small for this range: the noise is too wide for float64 (a grid step of "
                         f"{x!r} is needed)")
    if x == 0:  # e.g. --range 0 1e-320: the noise's variance (width/ε)² is 0 in float64
        raise InputError("the range is too narrow for float64: the grid step its noise needs underflows to 0 (give "
                         "the labels in a unit that spreads them wider)")
    if x < 0:
        raise InputError(f"no power of two is at least {x!r}")
    m, e = np.frexp(x)  # x = m 2^e, 0.5 <= m < 1
    return float(np.ldexp(1.0, int(e) - (1 if m == 0.5 else 0)))


def float_step(magnitude: float) -> float:
    """The spacing of float64 at ``magnitude`` (its ulp; a power of two): a grid this coarse or coarser,
    anchored at a multiple of it, has every point up to ``magnitude`` exactly representable."""
    m = abs(float(magnitude))
    return float(np.spacing(m)) if m > 0 else 0.0


def origin(params, grid: float) -> float:
    """The public origin of a continuous release: the grid point at or below ``params.lo`` (a multiple of the grid)."""
    return float(np.floor(float(params.lo) / grid) * grid)
