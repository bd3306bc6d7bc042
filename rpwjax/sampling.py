"""Steps 1-4 of a release for given uniforms, and the release specification: what the release path and its
certification share.

:func:`uniform_from_index` is step 1 (one of the ``2^52`` uniforms), :func:`released_values` steps 2-4 (the
mechanism's inverse CDF, the snap to the public grid, the clamp to the public range) and :func:`spec` the public
grid and range of a parameter set. :func:`rpwjax.release_path.release` runs them on ChaCha20 uniforms;
:mod:`rpwjax.realized` runs them on every uniform index to compute realized probabilities exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from rpwjax.errors import InputError
from rpwjax.grid import MAX_EPSILON, MIN_EPSILON, UNIFORM_BITS, float_step, origin
from rpwjax.keys import canonical_json
from rpwjax.mechanisms.base import Mechanism
from rpwjax.stream import block_bits


def uniform_from_index(k):
    """``(k + 1/2)·2^-52`` in float64 for integer ``k`` in [0, 2^52): exact, strictly inside (0, 1)."""
    return (jnp.asarray(k).astype(jnp.float64) + 0.5) * (2.0 ** -UNIFORM_BITS)


def uniforms_of_words(words):
    """Step 1 of a release: the uniform of each row's 64-bit stream word, from its top 52 bits (needs
    ``jax.enable_x64``)."""
    return uniform_from_index(jnp.asarray(words, jnp.uint64) >> jnp.uint64(64 - UNIFORM_BITS))


def block_uniforms(key, block_counter):
    """The release path's uniforms of one block of :data:`rpwjax.stream.BLOCK_ROWS` rows, the stream computed on
    the device (:func:`rpwjax.stream.block_bits`; needs ``jax.enable_x64``)."""
    return uniforms_of_words(block_bits(key, block_counter))


def params_digest(params: Mechanism) -> str:
    """SHA-256 (hex) of a parameter set: its mechanism, static settings and every leaf's exact float64 values.

    Two parameter sets with the same digest release with the same keys; any
    difference (another ε, another interval, per-row parameters of another
    table) gives independent uniforms.
    """
    leaves, tree = _defining_tree(params)
    cls = type(params)
    h = hashlib.sha256(canonical_json({"mechanism": params.name, "class": f"{cls.__module__}.{cls.__qualname__}",
                                       "tree": tree}).encode())
    for leaf in leaves:
        a = np.ascontiguousarray(np.asarray(leaf, np.float64))
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _defining_tree(params: Mechanism):
    """(leaves, structure text) of ``params`` without its derived fields (lookup tables computed from the other
    fields, :attr:`Mechanism.derived_fields`): they add nothing to what the parameters are, so the digest, and
    every release key, is the one the parameters had before such tables existed."""
    cls = type(params)
    derived = getattr(cls, "derived_fields", ())
    if not derived:
        leaves, treedef = jax.tree_util.tree_flatten(params)
        return leaves, str(treedef)
    static = cls._static_fields
    names = [f.name for f in dataclasses.fields(params) if f.name not in derived]
    data = [n for n in names if n not in static]
    meta = tuple(getattr(params, n) for n in names if n in static)
    # the text jax gives the structure of a registered node whose children are all arrays (a test holds it to
    # jax's own text for every mechanism without derived fields)
    text = f"PyTreeDef(CustomNode({cls.__name__}[({cls!r}, {meta!r})], [{', '.join('*' for _ in data)}]))"
    return [getattr(params, n) for n in data], text


def range_text(params: Mechanism) -> str:
    return f"[{float(params.lo):.17g}, {float(params.hi):.17g}]"


def check_release_epsilon(cls: type[Mechanism], epsilon, range_: str) -> None:
    """Refuse (:class:`InputError`) the ε of a release by ``cls`` that no float64 release can certify: a pure
    mechanism's ratios above :data:`~rpwjax.grid.MAX_EPSILON` or its ε below :data:`~rpwjax.grid.MIN_EPSILON`.
    A function of ε alone: a fit checks it before it draws anything (``range_``: the range, as text)."""
    if not cls.pure:
        return
    eps = np.asarray(epsilon, np.float64)
    largest, smallest = float(np.max(eps)), float(np.min(eps))
    if not min(largest, cls.ratio_epsilon_cap) <= MAX_EPSILON:
        raise InputError(f"{cls.name}: epsilon={largest:g} on the range {range_} cannot be certified for a float64 "
                         f"release: epsilon above {MAX_EPSILON:.4g} = ln(2^52 / 2^23) leaves some output fewer than "
                         "2^23 of the 2^52 uniforms next to another, too few to certify the ratio")
    if not smallest >= MIN_EPSILON:
        raise InputError(f"{cls.name}: epsilon={smallest:g} on the range {range_} cannot be certified for a float64 "
                         f"release: epsilon is too small (below {MIN_EPSILON:.3g}, holding the realized ratio within "
                         "0.1% of epsilon needs more than 2^46 of the 2^52 uniforms in every output cell)")


def spec(params: Mechanism) -> dict:
    """The public release specification of ``params``: ``grid`` (or None) and ``low``/``high`` (arrays).

    ``low``/``high`` broadcast against the labels (per-row parameters give per-row ranges). The grid is
    never finer than float64 can represent at the range's magnitude: every grid point ``k·grid`` in
    ``[low, high]`` is an exact float64 (the mechanism's grid is coarsened to the float spacing at
    ``max(|low|, |high|)`` where it was finer, the range moved inwards onto the coarser grid).
    What cannot be released raises :class:`InputError` naming the mechanism, ε and range.
    """
    eps = float(np.max(params.epsilon))
    where = f"{params.name}: epsilon={eps:g} on the range {range_text(params)}"
    check_release_epsilon(type(params), params.epsilon, range_text(params))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        try:
            s = params.release_spec()
        except InputError as err:
            raise InputError(f"{where} cannot be certified for a float64 release: {err}") from None
        grid = None if s["grid"] is None else float(s["grid"])
        low = np.asarray(s["low"], np.float64)
        high = np.asarray(s["high"], np.float64)
        finite = bool(np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(low <= high))
        if grid is not None and finite:
            if not (np.isfinite(grid) and grid > 0):
                finite = False
            else:
                step = float_step(max(float(np.max(np.abs(low))), float(np.max(np.abs(high)))))
                if grid < step:  # finer than float64 holds there: coarsen (cells only grow), move the range inwards
                    grid = step
                    low, high = np.ceil(low / grid) * grid, np.floor(high / grid) * grid
    if not finite:
        raise InputError(f"{where} cannot be certified for a float64 release: its release range is empty or not "
                         f"finite, got [{np.min(low)}, {np.max(high)}]")
    if grid is not None and np.any(~(high - low >= 2 * grid)):
        raise InputError(f"{where} cannot be certified for a float64 release: epsilon is too large for this range "
                         f"(the public grid {grid:g} leaves fewer than three outputs)")
    return {"grid": grid, "low": low, "high": high}


def released_values(params: Mechanism, grid, low, high, u, y):
    """Steps 2-4 for given uniforms: the value released for label ``y`` and uniform ``u`` (traceable).

    A continuous mechanism is sampled, snapped and clamped relative to :func:`origin` ``o`` (the mechanism
    moved by ``-o`` samples ``y - o``; the result, a multiple of the grid, gets ``o`` back), so its rounding
    error is that of numbers of the size of the range's width, not of its magnitude; ``o`` and every grid
    point in the range are exact float64 (:func:`spec`), so adding ``o`` back is exact.
    """
    if grid is None:
        return jnp.clip(params.sample_from_uniform(u, y), low, high)
    o = origin(params, grid)
    x = params.translated(-o).sample_from_uniform(u, y - o)
    v = jnp.clip(jnp.round(x / grid) * grid, low - o, high - o) + o
    # the grid point 0 is one value: a draw just below it rounds to -0.0, which adding an origin of 0 (or -0.0,
    # for lo = -0.0) keeps, and a file would then hold -0.0 beside 0.0 where the certificate counts one cell
    return jnp.where(v == 0, jnp.zeros_like(v), v)
