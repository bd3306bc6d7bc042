"""Input validation at the public boundary.

Every check raises :class:`InputError` (a ``ValueError``) whose message names
the problem and the offending value, e.g.
``epsilon must be positive and finite, got epsilon=-1.0``.
Validation runs on concrete (host) values before anything is traced, so the
jit-compiled kernels never see bad input.
"""

from __future__ import annotations

import numbers

import numpy as np


class InputError(ValueError):
    """Bad input: the message names the problem and the value."""


def format_value(value) -> str:
    arr = np.asarray(value)
    if arr.ndim == 0:
        return repr(arr.item())
    return np.array2string(arr, threshold=6, precision=6)


def check_epsilon(epsilon, name: str = "epsilon") -> np.ndarray:
    """Return ``epsilon`` as a float64 array (0-d or 1-d), each value finite and > 0.

    Only numbers count: a string such as ``"1"`` (or a list of them), a boolean or ``None`` is refused, not
    converted.
    """
    try:
        raw = np.asarray(epsilon)
    except (TypeError, ValueError):
        raw = None
    if raw is None or raw.dtype.kind not in "iuf":  # integers and floats only: not text, bool or objects
        raise InputError(f"{name} must be a number or a list of numbers, got {name}={epsilon!r}")
    arr = raw.astype(np.float64)
    if arr.ndim > 1:
        raise InputError(f"{name} must be a scalar or a 1-d grid, got shape {arr.shape}")
    if arr.size == 0:
        raise InputError(f"{name} must not be empty, got {name}=[]")
    bad = ~np.isfinite(arr) | (arr <= 0)
    if bad.any():
        raise InputError(f"{name} must be positive and finite, got {name}={format_value(arr[bad].ravel()[0])}")
    return arr


def check_positive(value, name: str) -> float:
    """A single finite positive float (used for zeta, delta scales, bins...)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number, got {name}={value!r}") from None
    if not np.isfinite(v) or v <= 0:
        raise InputError(f"{name} must be positive and finite, got {name}={v!r}")
    return v


def check_integer(value, name: str, minimum: int = 1, maximum: int | None = None, *, flag: str | None = None) -> int:
    """``value`` as an int: an integer (a Python or NumPy integer, or a float with no fractional part; never a
    bool or a string) from ``minimum`` to ``maximum`` (inclusive; no upper bound when None). Anything else is an
    :class:`InputError` naming ``name`` (and the command-line ``flag`` that sets it), the bounds and the value."""
    whole = None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        whole = int(value)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer():
        whole = int(value)  # 3.0 (NaN and ±inf are not integers)
    if whole is None or whole < minimum or (maximum is not None and whole > maximum):
        bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise InputError(f"{name}{f' ({flag})' if flag else ''} must be an integer {bounds}, got {name}={value!r}")
    return whole


def check_range(lo, hi) -> tuple[float, float]:
    """The public label range: finite floats with lo < hi and a finite width hi - lo."""
    try:
        lo_f, hi_f = float(lo), float(hi)
    except (TypeError, ValueError):
        raise InputError(f"range must be two numbers, got range=({lo!r}, {hi!r})") from None
    if not (np.isfinite(lo_f) and np.isfinite(hi_f)):
        raise InputError(f"range must be finite, got range=({lo_f!r}, {hi_f!r})")
    if not lo_f < hi_f:
        raise InputError(f"range needs lo < hi, got lo={lo_f!r}, hi={hi_f!r}")
    if not np.isfinite(hi_f - lo_f):  # every mechanism and histogram divides by the width
        raise InputError(f"range is too wide: its width hi - lo is not finite in float64, got range=({lo_f!r}, "
                         f"{hi_f!r})")
    return lo_f, hi_f


def as_labels(labels, name: str = "labels") -> np.ndarray:
    """Labels as a 1-d float64 array (possibly empty), or an InputError when they are not numbers."""
    try:
        return np.asarray(labels, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise InputError(f"{name} must be numeric, got a value that is not a number") from None


def check_labels(labels, lo: float, hi: float, *, clip: bool = False, name: str = "labels") -> np.ndarray:
    """Labels as a 1-d float64 array: non-empty, finite, inside [lo, hi].

    Labels outside the public range are an error unless ``clip=True``, in
    which case they are clipped (clipping is what every mechanism does first,
    so it costs no privacy; refusing by default catches a wrong range).
    """
    y = as_labels(labels, name)
    if y.size == 0:
        raise InputError(f"{name} are empty: need at least one label")
    if lo <= y.min() and y.max() <= hi:  # two reductions, no temporaries: finite and inside (NaN compares false)
        return y
    finite = np.isfinite(y)
    if not finite.all():
        i = int(np.flatnonzero(~finite)[0])
        raise InputError(f"{name} must be finite, got {name}[{i}]={float(y[i])!r}")
    if clip:
        return np.clip(y, lo, hi)
    outside = (y < lo) | (y > hi)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise InputError(
            f"{name} must lie in the public range [{lo!r}, {hi!r}], got {name}[{i}]={float(y[i])!r} "
            f"({int(outside.sum())} labels outside; pass clip=True / --clip to clip them)"
        )
    return y


def check_choice(value, name: str, choices) -> str:
    if value not in choices:
        raise InputError(f"{name} must be one of {', '.join(map(str, choices))}, got {name}={value!r}")
    return value


def one_line(text) -> str:
    """``text`` (e.g. an exception) on one line: line breaks shown as ``\\n``."""
    return str(text).replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\r")


def show_value(value, limit: int = 60) -> str:
    """``repr`` of a value from a file, at most ``limit`` characters of it."""
    if isinstance(value, (bytes, str)) and len(value) > limit:
        return repr(value[:limit]) + f"... ({len(value)} characters)"
    return repr(value)


def check_label_rows(y, lo: float, hi: float, *, clip: bool, first_row: int, where, column: str) -> np.ndarray:
    """Check one chunk of a file's labels; errors name the file's data row (``where(row)``).

    ``y[i]`` is data row ``first_row + i`` (1-based). Non-finite labels are
    always an error; labels outside ``[lo, hi]`` unless ``clip``.
    """
    y = np.asarray(y, dtype=np.float64)
    finite = np.isfinite(y)
    if not finite.all():
        i = int(np.flatnonzero(~finite)[0])
        raise InputError(f"label {float(y[i])!r} in column {column!r} is not a finite number, at "
                         f"{where(first_row + i)}")
    if not clip:
        outside = (y < lo) | (y > hi)
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            raise InputError(
                f"label {float(y[i])!r} in column {column!r} lies outside the public range [{lo!r}, {hi!r}], at "
                f"{where(first_row + i)} (pass --clip to clip labels outside the range)")
    return y
