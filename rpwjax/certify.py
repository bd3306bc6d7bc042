r"""Certification: every release runs the realized check on its exact parameters before anything is released.

:func:`rpwjax.release_path.release` calls :func:`certify` first, so inline
fits, ``--params`` files, every pipeline's per-row and per-group parameters,
the Dask path and the Python ``rpwjax.release`` are all checked: the
*realized* probability of every output cell of the shipped release
(:mod:`rpwjax.realized`, exact by bisection on the uniform index) at the
range ends, every label breakpoint and its float neighbours and a grid of
labels, against ε + :func:`rpwjax.realized.tolerance` (ε), i.e. min(1e-6, 1e-3·ε) (δ for
the Gaussian). A release that fails raises :class:`~rpwjax.errors.InputError`
with one line naming the mechanism, ε and the range; nothing is written.

**Cost.** Results are cached per process, keyed by a SHA-256 digest of the
exact parameters (every leaf's float64 bytes, the static fields), the release
specification (grid, range) and the identity of the sampler's code, so a file
released in chunks is checked once, and a pipeline's groups once per distinct
parameter set.

**Per-row parameters** (RPWithPrior with one interval per row, the feature-aware
pipelines): the distinct parameter sets are found first. Up to
:data:`FULL_CHECK_SETS` of them each get the realized check. With more, the
shipped RPWithPrior sampler has a closed-form bound on its realized log ratio
(:meth:`rpwjax.mechanisms.rpwithprior.RPWithPrior.realized_ratio_bound`: a
float64 error analysis of its inverse CDF, counted against the smallest output
cell), evaluated for every row, and the realized check still runs on the sets
of the narrowest and the widest interval. Rows whose bound does not hold (and
any other mechanism or sampler) get the realized check per distinct set.

**What cannot be certified is refused, consistently over ε.** A pure mechanism
with ε below :data:`~rpwjax.grid.MIN_EPSILON` (1.14e-10) is refused: holding its rounding within 0.1%
of ε would need more than 2^46 uniforms in every cell. One
with ε above :data:`~rpwjax.grid.MAX_EPSILON` = ln(2^52 / 2^23) is
refused by :func:`rpwjax.sampling.spec` before any check:
there some output has less than e^-ε the probability of another output,
fewer than :data:`~rpwjax.grid.MIN_CELL_COUNT` of the 2^52 uniforms, too
few for integer counts to certify a ratio. Below it the release specification
(:func:`rpwjax.sampling.spec`) and the realized check decide.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib

import jax
import numpy as np

from rpwjax import realized
from rpwjax.errors import InputError
from rpwjax.mechanisms.base import Mechanism
from rpwjax.sampling import params_digest, range_text, spec

FULL_CHECK_SETS = 8  # per-row parameters with at most this many distinct sets: the realized check on each

_results: dict = {}  # key -> realized check result (pass or fail), this process only
_suspended = contextvars.ContextVar("rpwjax_certify_suspended", default=False)


@contextlib.contextmanager
def suspended():
    """Release without certification inside this block: for the audit only, which measures a release that may
    be broken and reports what it finds instead of refusing it."""
    token = _suspended.set(True)
    try:
        yield
    finally:
        _suspended.reset(token)


def digest(params: Mechanism, output_spec: dict | None = None, parameters: str | None = None) -> str:
    """SHA-256 (hex) of the exact parameters (:func:`rpwjax.sampling.params_digest`, or ``parameters`` when the
    caller has it) and the release spec."""
    h = hashlib.sha256((parameters or params_digest(params)).encode())
    if output_spec is not None:
        h.update(repr(output_spec["grid"]).encode())
        for k in ("low", "high"):
            a = np.ascontiguousarray(np.asarray(output_spec[k], np.float64))
            h.update(repr(a.shape).encode())
            h.update(a.tobytes())
    return h.hexdigest()


def _key(params: Mechanism, output_spec: dict, parameters: str | None = None) -> tuple:
    cls = type(params)
    # the code is part of the key: a sampler replaced at run time (a test's broken one) is checked afresh
    code = tuple(getattr(cls, name, None) for name in ("sample_from_uniform", "translated", "release_spec"))
    return (*code, digest(params, output_spec, parameters))


def where(params: Mechanism) -> str:
    return f"{params.name}: epsilon={float(np.max(params.epsilon)):g} on the range {range_text(params)}"


def realized_result(params: Mechanism, output_spec: dict | None = None) -> dict:
    """The realized check (:func:`rpwjax.realized.check`) of unbatched ``params`` with ``output_spec``
    (default ``spec(params)``), cached by :func:`digest`."""
    s = spec(params) if output_spec is None else output_spec
    key = _key(params, s)
    if key not in _results:
        _results[key] = realized.check(params, output_spec=s)
    return _results[key]


def _refuse(params, reason: str):
    raise InputError(f"{where(params)} cannot be certified for a float64 release: {reason}")


def _check_set(params: Mechanism, output_spec: dict):
    result = realized_result(params, output_spec)
    if not result["pass"]:
        _refuse(params, "the realized check fails: " + "; ".join(result["problems"]))


def _row(params: Mechanism, output_spec: dict, i: int):
    """Row ``i`` of per-row parameters and its part of the release spec."""
    row = jax.tree_util.tree_map(lambda leaf: np.asarray(leaf)[i] if np.ndim(leaf) else leaf, params)
    pick = lambda v: np.asarray(v, np.float64)[i] if np.ndim(v) else np.asarray(v, np.float64)  # noqa: E731
    return row, {"grid": output_spec["grid"], "low": pick(output_spec["low"]), "high": pick(output_spec["high"])}


def _certify_rows(params: Mechanism, output_spec: dict):
    n = int(np.shape(params.epsilon)[0])
    columns = [np.broadcast_to(np.asarray(leaf, np.float64), (n,)) for leaf in jax.tree_util.tree_leaves(params)]
    columns += [np.broadcast_to(np.asarray(output_spec[k], np.float64), (n,)) for k in ("low", "high")]
    _, first = np.unique(np.stack(columns, axis=1), axis=0, return_index=True)
    todo = list(first)
    bound_fn = getattr(params, "realized_ratio_bound", None)
    if len(first) > FULL_CHECK_SETS and bound_fn is not None:
        bound = np.broadcast_to(np.asarray(bound_fn(output_spec["grid"], output_spec["low"], output_spec["high"]),
                                           np.float64), (n,))
        eps = np.broadcast_to(np.asarray(params.epsilon, np.float64), (n,))
        held = bound[first] <= eps[first] + realized.tolerance(eps[first])  # NaN (no bound for this row): not held
        width = np.broadcast_to(np.asarray(output_spec["high"], np.float64) -
                                np.asarray(output_spec["low"], np.float64), (n,))[first]
        todo = [i for i, ok in zip(first, held) if not ok]
        todo += [first[int(np.argmin(width))], first[int(np.argmax(width))]]  # the bound's cross-check
    for i in dict.fromkeys(int(i) for i in todo):
        _check_set(*_row(params, output_spec, i))


def certify(params: Mechanism, output_spec: dict | None = None, parameters: str | None = None) -> None:
    """Refuse (:class:`InputError`, one line naming mechanism, ε and range) unless the release of ``params`` with
    ``output_spec`` (default ``spec(params)``) passes the realized check; cached, see the module docstring.
    ``parameters`` is ``params_digest(params)`` when the caller computed it."""
    if _suspended.get():
        return
    if not isinstance(params, Mechanism):
        raise InputError(f"release needs fitted rpwjax mechanism parameters, got {type(params).__name__}")
    s = spec(params) if output_spec is None else output_spec
    key = _key(params, s, parameters)
    if _results.get(key, {}).get("pass"):
        return
    if np.ndim(params.epsilon) == 1:
        _certify_rows(params, s)
        _results[key] = {"pass": True, "problems": [], "per_row": True}
    else:
        _check_set(params, s)
