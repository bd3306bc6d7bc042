"""The float64 release grid: how many uniforms a release draws from, and the grid helpers the mechanisms use.

Every release draws one of ``UNIFORM_COUNT = 2^52`` equally likely uniforms per label
(:func:`rpwjax.sampling.uniform_from_index`). A mechanism's
:meth:`~rpwjax.mechanisms.base.Mechanism.release_spec` picks a public grid (a power of two,
:func:`pow2_at_least`) and range so that every output cell holds at least :data:`MIN_CELL_COUNT` of
them at every label, with at most :data:`MAX_CELLS` cells.
"""

from __future__ import annotations

import numpy as np

from rpwjax.errors import InputError

UNIFORM_BITS = 52
UNIFORM_COUNT = 1 << UNIFORM_BITS  # N: the number of distinct uniforms
MIN_CELL_COUNT = 1 << 23  # uniforms that land in any full output cell, at every label (half cells at the ends: half)
MAX_CELLS = 1 << 16  # the grid is never finer than (b - a) / MAX_CELLS
# a pure mechanism above this ε has some output with under e^-ε the probability of another, fewer than
# MIN_CELL_COUNT of the N uniforms where the other has them all: its ratio cannot be certified from counts
MAX_EPSILON = float(np.log(UNIFORM_COUNT / MIN_CELL_COUNT))  # 29 ln 2 = 20.10


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
