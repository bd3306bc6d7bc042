r"""The one release path: every private label that leaves the package is made here.

A *release* is the float64 numbers a user publishes, not the mechanism on
paper. :func:`release` turns labels into released values in four fixed steps:

1. **One uniform per label, from 52 random bits**: ``u = (k + 1/2)·2^-52`` with
   ``k`` the top 52 bits of a 64-bit ChaCha20 word (:func:`rpwjax.sampling.uniforms_of_words`,
   :mod:`rpwjax.stream`; on CPU the words come from OpenSSL on the host, on accelerators
   the device computes them, the same bits either way), so ``u`` takes exactly ``N = 2^52`` equally likely
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
every output cell holds at least :func:`~rpwjax.grid.cell_count` (ε) uniforms
at every label (half that at the two ends; 2^23, more for a pure ε below about 1e-3): then integer
rounding of the realized probabilities moves a log ratio by at most about 2^-21 (measured up to 1.5e-7)
and by under ε/2000, inside the certificate's tolerance of min(1e-6, 1e-3·ε)
(:func:`rpwjax.realized.tolerance`).

The sampling kernels (``Mechanism.sample``) are *not* releases: they draw
their own uniforms and neither snap nor clamp; they serve tests and
benchmarks.
"""

from __future__ import annotations

import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from rpwjax import certify, draws
from rpwjax.accounting import Accounting, account
from rpwjax.errors import InputError, as_labels, check_labels
from rpwjax.keys import Secret, bound
from rpwjax.mechanisms.base import Mechanism
from rpwjax.sampling import block_uniforms, params_digest, released_values, spec, uniforms_of_words
from rpwjax.stream import BLOCK_ROWS, block_counters, host_words

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


SEQUENTIAL_BLOCKS = 16  # from this many blocks on, a single CPU device may take them one at a time


def _sequential(devices, num_blocks: int, params: Mechanism) -> bool:
    """Whether blocks go through one device one after another (``lax.map``) rather than side by side (``vmap``).

    Only for a mechanism that asks for it (:attr:`~rpwjax.mechanisms.base.Mechanism.release_by_block`: an
    inverse CDF that searches per-row tables, whose intermediates would otherwise be materialized for every
    row of every block at once) on a single CPU device; elementwise inverse CDFs compile to one loop over all
    blocks that XLA spreads over the cores, about twice as fast on 2 cores. A few blocks gain nothing from it
    and the loop takes longer to compile, so small releases stay side by side. The values are the same either
    way: each block's computation depends only on its own stream words and labels.
    """
    return (params.release_by_block and len(devices) == 1 and devices[0].platform == "cpu"
            and num_blocks >= SEQUENTIAL_BLOCKS)


def host_stream(devices) -> bool:
    """Whether a release reads its stream words from the host (OpenSSL, :func:`rpwjax.stream.host_words`) rather
    than computing them on the devices: when every device is a CPU (the same bits either way)."""
    return all(d.platform == "cpu" for d in devices)


_STREAM_THREADS = os.cpu_count() or 1
_pool: ThreadPoolExecutor | None = None


def _forget_pool():
    global _pool
    _pool = None


# a forked child has none of the parent's threads: it starts its own pool (else its work would wait forever)
os.register_at_fork(after_in_child=_forget_pool)


def _stream_pool() -> ThreadPoolExecutor:
    """The threads that write host stream words (OpenSSL releases the GIL, so parts of a stream run in parallel)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_STREAM_THREADS, thread_name_prefix="rpwjax-stream")
    return _pool


def _start_stream(key, first_block: int, num_blocks: int, devices, reuse: bool = False):
    """Start making :func:`stream_inputs`; returns the function that waits for them. Host words are written by
    the stream threads, one part per thread, while the caller goes on (it lays out the labels meanwhile).
    ``reuse``: write them into this thread's reused buffer (:func:`_buffer`; a release, which is done with them
    when it returns)."""
    counters = block_counters(first_block, num_blocks)
    if not host_stream(devices):
        return lambda: (counters, None)
    size = num_blocks * BLOCK_ROWS
    words = _buffer("words", size, np.uint64) if reuse else _aligned_empty(size, np.uint64)
    pool = _stream_pool()
    edges = np.linspace(0, num_blocks, min(_STREAM_THREADS, num_blocks) + 1).round().astype(int)
    futures = [pool.submit(host_words, key, (first_block + a) * BLOCK_ROWS, (b - a) * BLOCK_ROWS,
                           words[a * BLOCK_ROWS : b * BLOCK_ROWS])
               for a, b in zip(edges[:-1], edges[1:]) if b > a]

    def wait():
        for future in futures:
            future.result()
        return counters, words.reshape(num_blocks, BLOCK_ROWS)
    return wait


def stream_inputs(key, first_block: int, num_blocks: int, devices):
    """(counters, words) of release blocks ``first_block ..``: the ChaCha counters of each block, and the blocks'
    stream words as a (num_blocks, BLOCK_ROWS) uint64 array when they come from the host (:func:`host_stream`),
    else None (the device computes them from the counters)."""
    return _start_stream(key, first_block, num_blocks, devices)()


def stream_uniforms(key, counter, words):
    """Step 1 for one release block: the uniforms of its host stream ``words``, or, when those are None, of the
    words the device computes from ``key`` and the block's ``counter`` (:func:`stream_inputs`)."""
    return block_uniforms(key, counter) if words is None else uniforms_of_words(words)


@partial(jax.jit, static_argnames=("grid", "per_row", "sequential"))
def _release_blocks(params, low, high, key, counters, words, y_blocks, label_range, grid, per_row,
                    sequential=False):
    """(released blocks, whether every label is inside ``label_range`` = [lo, hi]: finite and in range).

    ``words``: the blocks' stream words from the host, or None to compute them from ``key`` and ``counters``
    (:func:`stream_inputs`). The range check rides in the same pass as the release so that a good file is read
    once; a caller discards the output when the flag is false.
    """
    inside = jnp.all((y_blocks >= label_range[0]) & (y_blocks <= label_range[1]))  # NaN compares false

    if per_row:  # per-row parameters and ranges are blocked like the labels
        def one(xs):
            p, lo_, hi_, counter, w, y = xs
            return released_values(p, grid, lo_, hi_, stream_uniforms(key, counter, w), y)
        xs = (params, low, high, counters, words, y_blocks)
    else:
        def one(xs):
            counter, w, y = xs
            return released_values(params, grid, low, high, stream_uniforms(key, counter, w), y)
        xs = (counters, words, y_blocks)
    return map_blocks(one, xs, sequential), inside


def map_blocks(one, xs, sequential: bool):
    """``one`` over the leading (block) axis of ``xs``: one block at a time when ``sequential`` (see
    :func:`_sequential`), else side by side; the same values either way."""
    # batch_size=1: each step runs the vectorized block computation on one block (the unbatched body, a
    # block's rows one scalar at a time, did not finish in minutes on two blocks)
    return lax.map(one, xs, batch_size=1) if sequential else jax.vmap(one)(xs)


def _aligned_empty(size: int, dtype=np.float64) -> np.ndarray:
    """A zeroed array of ``size`` 8-byte items (float64 or uint64) in its own anonymous memory map.

    Page-aligned, so the CPU device uses it in place (``device_put`` without a copy). And with the kernel's
    default pages: NumPy asks for transparent huge pages for large arrays, and on a machine whose memory is
    fragmented the kernel then compacts memory on the first write, which stalled one release in five by
    about 0.1 s per 1e7 labels (the pages of a map are faulted in steadily instead).
    """
    return np.frombuffer(mmap.mmap(-1, max(1, size) * 8), dtype=dtype, count=size)


_REUSED_ROWS = 1 << 24  # releases up to this many rows (128 MiB a buffer) reuse their host buffers
_local = threading.local()


def _buffer(name: str, size: int, dtype) -> np.ndarray:
    """A host buffer of ``size`` items that this thread's releases reuse, one per ``name``, up to
    :data:`_REUSED_ROWS` items (larger ones are fresh maps). Writing into fresh memory faults in every page,
    which took 20-40% of a 1e7-label release; a release is done with its buffers when it returns (its output
    is the device's own array), so the next one may overwrite them."""
    if size > _REUSED_ROWS:
        return _aligned_empty(size, dtype)
    cached = getattr(_local, name, None)
    if cached is None or cached.size < size or cached.dtype != dtype:
        cached = _aligned_empty(size, dtype)
        setattr(_local, name, cached)
    return cached[:size]


def _blocks(values, offset, num_blocks, fill, reuse: str | None = None):
    """``values`` placed at ``offset`` in whole blocks, the rest ``fill`` (the padding is released and dropped);
    ``reuse``: in this thread's reused buffer of that name (:func:`_buffer`)."""
    size = num_blocks * BLOCK_ROWS
    padded = _aligned_empty(size) if reuse is None else _buffer(reuse, size, np.float64)
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
            output_spec: dict | None = None, clip: bool = False, accounting: Accounting | None = None,
            to_output: bool = False) -> np.ndarray:
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
    was given (:func:`release_spend`), once the labels are checked. ``to_output``: the values go only to an
    output file, no later computation reads them (noted so: :func:`rpwjax.draws.note`).

    Each thread keeps the host buffers of its releases (labels and stream words, 16 bytes a row, releases of
    up to 2^24 rows) for its next release (:func:`_buffer`).
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
    if draws.active():  # a release is a private draw: a run that fails after it is charged (rpwjax.draws)
        draws.note(secret.digest("release-draw/" + purpose + "/" + params.name + "/" + parameters),
                   *release_cost(params), to_output=to_output)
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
    stream = _start_stream(key, start // BLOCK_ROWS, num_blocks, devices, reuse=True)
    with jax.enable_x64(True):
        blocks = _blocks(y, offset, num_blocks, float(np.min(params.lo)), reuse="labels")
        low, high = s["low"], s["high"]
        if per_row:
            params = jax.tree_util.tree_map(
                lambda leaf: _blocks(np.broadcast_to(np.asarray(leaf, np.float64), y.shape), offset, num_blocks,
                                     float(np.ravel(leaf)[0])), params)
            low = _blocks(np.broadcast_to(low, y.shape), offset, num_blocks, float(np.min(low)))
            high = _blocks(np.broadcast_to(high, y.shape), offset, num_blocks, float(np.max(high)))
        counters, words = stream()
        if len(devices) > 1:
            # blocks are independent (each has its own key), so sharding them over devices
            # changes where a block is computed, never what it computes
            mesh = jax.sharding.Mesh(np.array(devices), ("blocks",))
            sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("blocks"))
            blocks = jax.device_put(blocks, sharding)
            if words is not None:
                words = jax.device_put(words, sharding)
        out, inside = _release_blocks(params, low, high, key, counters, words, blocks,
                                      np.asarray(label_range, np.float64), grid=s["grid"], per_row=per_row,
                                      sequential=_sequential(devices, num_blocks, params))
        out = np.asarray(out, np.float64).reshape(-1)
    return out[offset : offset + y.size], bool(inside)


def release_cost(params: Mechanism) -> tuple[float, float]:
    """(ε, δ) of one release with ``params``: its largest over the rows (a per-row fit holds one ε, the check is
    on the largest)."""
    delta = 0.0 if params.pure else float(np.max(getattr(params, "delta", 0.0)))
    return float(np.max(params.epsilon)), delta


def release_spend(accounting: Accounting, params: Mechanism):
    """Record one release of every label of ``accounting``'s rows with ``params`` (:func:`release_cost`)."""
    epsilon, delta = release_cost(params)
    return accounting.spend("release", epsilon, delta=delta,
                            sensitivity="one label, anywhere in the public range", mechanism=params.name)


def release_grid(params: Mechanism, secret: Secret, labels, *, purpose: str = "labels") -> np.ndarray:
    """:func:`release` for every ε of a batched fit: (E, n), ε ``e`` released with ``secret.for_epsilon(e, purpose)``."""
    eps = np.atleast_1d(np.asarray(params.epsilon, np.float64))
    if params.batch_shape == ():
        return release(params, secret.for_epsilon(eps[0], purpose), labels)[None, :]
    return np.stack([release(params[i], secret.for_epsilon(e, purpose), labels) for i, e in enumerate(eps)])
