r"""The one release path: every private label that leaves the package is made here.

A *release* is the float64 numbers a user publishes, not the mechanism on
paper. :func:`release` turns labels into released values in four fixed steps:

1. **One uniform per label, from 52 random bits**: ``u = (k + 1/2)·2^-52`` with
   ``k`` the top 52 bits of a 64-bit ChaCha12 word (:func:`rpwjax.sampling.uniform_from_index`,
   :mod:`rpwjax.stream`), so ``u`` takes exactly ``N = 2^52`` equally likely
   values in (0, 1), none of them 0 or 1. The word of global row ``i`` depends
   only on ``i`` and a 256-bit key, derived from the secret
   (:class:`rpwjax.keys.Secret`) by SHA-256 of the release it belongs to
   (:func:`rpwjax.keys.bound`: its release id and identity), the purpose, the
   mechanism and a digest of its exact parameters
   (:func:`rpwjax.sampling.params_digest`).
   So two releases, two ε, two stages or two parameter sets never share a
   uniform, even under one key file.
2. **The mechanism's inverse CDF**, ``x = params.sample_from_uniform(u, y)``,
   in float64 (inside ``jax.enable_x64``). Every shipped sampler is
   non-decreasing in ``u`` for each label.
3. **Snap to the public grid** ``h`` (a power of two, so ``round(x/h)·h`` is
   exact), continuous outputs only.
4. **Clamp to the public output range** ``[a, b]`` (grid points; for the
   additive mechanisms, whose support is unbounded, ``[lo - T, hi + T]``).

Steps 2-4 are :func:`rpwjax.sampling.released_values`. Because they are
monotone in ``u``, the set of the ``N`` uniforms that produce a given
released value is an interval of ``k``; its length divided by ``N`` is the
*realized* probability of that value, which :mod:`rpwjax.realized` computes
exactly (by bisection on ``k``) and :mod:`rpwjax.certify` checks against ε
before every release. The grid and the clamp are chosen from public
quantities only (the parameters: ε, the range, the noise scale, the fitted
interval) by :meth:`~rpwjax.mechanisms.base.Mechanism.release_spec`, so that
every output cell holds at least :data:`~rpwjax.grid.MIN_CELL_COUNT` uniforms
at every label: then integer rounding of the realized probabilities moves a
log ratio by less than 1e-7.

The sampling kernels (``Mechanism.sample``) are *not* releases: they draw
their own uniforms and neither snap nor clamp; they serve tests and
benchmarks.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from rpwjax import certify
from rpwjax.accounting import Accounting, account
from rpwjax.errors import InputError, as_labels, check_labels
from rpwjax.keys import Secret, bound
from rpwjax.mechanisms.base import Mechanism
from rpwjax.sampling import block_uniforms, params_digest, released_values, spec
from rpwjax.stream import BLOCK_ROWS, block_counters

_specs: dict = {}  # (release_spec's code, params_digest) -> spec: a spec is a pure function of both


def _cached_spec(params: Mechanism, parameters: str) -> dict:
    """:func:`spec` of ``params``, computed once per process for each parameter set (its digest ``parameters``)."""
    key = (type(params).release_spec, parameters)
    if key not in _specs:
        _specs[key] = spec(params)
    return _specs[key]


def sidecar_fields(params: Mechanism) -> dict:
    """``output_grid`` and ``output_range`` = [a, b] for a sidecar (every released value lies in it)."""
    s = spec(params)
    return {"output_grid": s["grid"], "output_range": [float(np.min(s["low"])), float(np.max(s["high"]))]}


SEQUENTIAL_BLOCKS = 16  # from this many blocks on, a single CPU device takes them one at a time


def _sequential(devices, num_blocks: int = SEQUENTIAL_BLOCKS) -> bool:
    """Whether blocks go through one device one after another (``lax.map``) rather than side by side (``vmap``).

    On a single CPU device a block at a time keeps its working set (a block of labels, uniforms and
    intermediates) in cache, and a mechanism with a search per row (Unbiased) does not materialize it for every
    row of every block at once; accelerators and several devices take the blocks side by side. A few blocks
    gain nothing from it and the loop takes longer to compile, so small releases stay side by side. The values
    are the same either way: each block's computation depends only on its own counter and labels.
    """
    return len(devices) == 1 and devices[0].platform == "cpu" and num_blocks >= SEQUENTIAL_BLOCKS


@partial(jax.jit, static_argnames=("grid", "per_row", "sequential"))
def _release_blocks(params, low, high, key, counters, y_blocks, label_range, grid, per_row, sequential=False):
    """(released blocks, whether every label is inside ``label_range`` = [lo, hi]: finite and in range).

    The range check rides in the same pass as the release so that a good file is read once; a caller
    discards the output when the flag is false.
    """
    inside = jnp.all((y_blocks >= label_range[0]) & (y_blocks <= label_range[1]))  # NaN compares false
    if per_row:  # per-row parameters and ranges are blocked like the labels
        def one(xs):
            p, lo_, hi_, counter, y = xs
            return released_values(p, grid, lo_, hi_, block_uniforms(key, counter), y)
        xs = (params, low, high, counters, y_blocks)
    else:
        def one(xs):
            counter, y = xs
            return released_values(params, grid, low, high, block_uniforms(key, counter), y)
        xs = (counters, y_blocks)
    return map_blocks(one, xs, sequential), inside


def map_blocks(one, xs, sequential: bool):
    """``one`` over the leading (block) axis of ``xs``: one block at a time when ``sequential`` (see
    :func:`_sequential`), else side by side; the same values either way."""
    # batch_size=1: each step runs the vectorized block computation on one block (the unbatched body, a
    # block's rows one scalar at a time, did not finish in minutes on two blocks)
    return lax.map(one, xs, batch_size=1) if sequential else jax.vmap(one)(xs)


def _aligned_empty(size: int) -> np.ndarray:
    """An uninitialized float64 array whose data starts on a 64-byte boundary: the CPU device can then use it
    in place (``device_put`` without a copy)."""
    raw = np.empty(size * 8 + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + size * 8].view(np.float64)


def _blocks(values, offset, num_blocks, fill):
    """``values`` placed at ``offset`` in whole blocks, the rest ``fill`` (the padding is released and dropped)."""
    padded = _aligned_empty(num_blocks * BLOCK_ROWS)
    padded[:offset] = fill
    padded[offset : offset + values.size] = values
    padded[offset + values.size :] = fill
    return padded.reshape(num_blocks, BLOCK_ROWS)


def _per_row(params: Mechanism, n: int) -> bool:
    """Whether ``params`` carries one parameter set per row (the pipelines' per-row intervals)."""
    shape = np.shape(params.epsilon)
    if shape == ():
        return False
    if shape == (n,) and not params.discrete:
        return True
    raise InputError(f"release needs parameters for one epsilon (or, continuous only, one per row), got "
                     f"epsilon of shape {shape} for {n} labels")


def release(params: Mechanism, secret: Secret, labels, *, start: int = 0, purpose: str = "labels",
            output_spec: dict | None = None, clip: bool = False, accounting: Accounting | None = None) -> np.ndarray:
    """Released values for ``labels`` at global rows ``start, start + 1, ...`` (float64).

    Row ``i`` always gets the same uniform for the same secret (bound to a
    release: :meth:`rpwjax.keys.Secret.for_release`), purpose and parameters,
    whatever the chunking, the device count or the shard offsets, so shards
    concatenate to the single-run output. A secret not bound to a release is
    bound to a fresh one (:func:`rpwjax.keys.bound`): two calls then never
    share randomness. Labels must be finite and inside
    the public range ``[params.lo, params.hi]`` (an :class:`InputError` naming
    the first bad label and its index otherwise), or ``clip=True`` clips those
    outside it (no privacy cost); ``params`` holds one ε, with scalar
    leaves or one leaf value per row. ``output_spec`` is ``spec(params)``,
    when a caller releasing many chunks with the same parameters computed it
    once. ``accounting``, if given, gets the entry "release" over the rows it
    was given (:func:`release_spend`), once the labels are checked.
    """
    if not isinstance(secret, Secret):
        raise InputError(f"release needs an rpwjax.keys.Secret, got {type(secret).__name__}")
    secret = bound(secret)
    start = int(start)
    if start < 0:
        raise InputError(f"start must be a non-negative row index, got start={start}")
    y = as_labels(labels)
    if y.size == 0:
        return y
    per_row = _per_row(params, y.size)
    parameters = params_digest(params)
    s = _cached_spec(params, parameters) if output_spec is None else output_spec
    # the realized check on these exact parameters (cached), or InputError: nothing released
    certify.certify(params, s, parameters)
    lo, hi = float(np.min(params.lo)), float(np.max(params.hi))
    out, inside = _release_labels(params, parameters, s, secret, y, start, purpose, per_row, (lo, hi))
    if not inside:
        # the kernel found a label outside [lo, hi] or not finite: name it (InputError), or clip and redo
        y = check_labels(y, lo, hi, clip=clip)
        out, _ = _release_labels(params, parameters, s, secret, y, start, purpose, per_row, (lo, hi))
    if account(accounting) is not None:
        release_spend(accounting, params)
    return out


def _release_labels(params, parameters, s, secret, y, start, purpose, per_row, label_range):
    """(released values of ``y`` at rows ``start, ...``, whether every label was inside ``label_range``)."""
    offset = start % BLOCK_ROWS
    devices = jax.local_devices()  # multi-host: each process shards its own rows over its own devices
    num_blocks = -(-(offset + y.size) // BLOCK_ROWS)
    num_blocks = -(-num_blocks // len(devices)) * len(devices)  # whole blocks on every device
    key = secret.stream_key(purpose + "/" + params.name + "/" + parameters)
    counters = block_counters(start // BLOCK_ROWS, num_blocks)
    with jax.enable_x64(True):
        blocks = _blocks(y, offset, num_blocks, float(np.min(params.lo)))
        low, high = s["low"], s["high"]
        if per_row:
            params = jax.tree_util.tree_map(
                lambda leaf: _blocks(np.broadcast_to(np.asarray(leaf, np.float64), y.shape), offset, num_blocks,
                                     float(np.ravel(leaf)[0])), params)
            low = _blocks(np.broadcast_to(low, y.shape), offset, num_blocks, float(np.min(low)))
            high = _blocks(np.broadcast_to(high, y.shape), offset, num_blocks, float(np.max(high)))
        if len(devices) > 1:
            # blocks are independent (each has its own key), so sharding them over devices
            # changes where a block is computed, never what it computes
            mesh = jax.sharding.Mesh(np.array(devices), ("blocks",))
            blocks = jax.device_put(blocks, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("blocks")))
        out, inside = _release_blocks(params, low, high, key, counters, blocks, np.asarray(label_range, np.float64),
                                      grid=s["grid"], per_row=per_row,
                                      sequential=_sequential(devices, num_blocks))
        out = np.asarray(out, np.float64).reshape(-1)
    return out[offset : offset + y.size], bool(inside)


def release_spend(accounting: Accounting, params: Mechanism):
    """Record one release of every label of ``accounting``'s rows with ``params`` (its largest ε and δ over the
    rows: a per-row fit holds one ε, the check is on the largest)."""
    delta = 0.0 if params.pure else float(np.max(getattr(params, "delta", 0.0)))
    return accounting.spend("release", float(np.max(params.epsilon)), delta=delta,
                            sensitivity="one label, anywhere in the public range", mechanism=params.name)


def release_grid(params: Mechanism, secret: Secret, labels, *, purpose: str = "labels") -> np.ndarray:
    """:func:`release` for every ε of a batched fit: (E, n), ε ``e`` released with ``secret.for_epsilon(e, purpose)``."""
    eps = np.atleast_1d(np.asarray(params.epsilon, np.float64))
    if params.batch_shape == ():
        return release(params, secret.for_epsilon(eps[0], purpose), labels)[None, :]
    return np.stack([release(params[i], secret.for_epsilon(e, purpose), labels) for i, e in enumerate(eps)])
