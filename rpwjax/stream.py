r"""ChaCha20 in counter mode: the bits behind every released label.

Each released label takes one 64-bit word of a keystream keyed by 256 bits
(:meth:`rpwjax.keys.Secret.stream_key`, derived from the secret and the
release's identity). The keystream is the ChaCha20 block function of
RFC 8439 (20 rounds) with a 64-bit block counter in words 12-13 and words
14-15 zero, and **global row** ``i`` **takes the little-endian 64-bit word at
byte** ``8i`` of that keystream (ChaCha block ``i div 8``, 32-bit words
``2(i mod 8)`` (low half) and ``2(i mod 8) + 1`` (high half)):

* the key has 256 bits, so recovering it from outputs (an adversary who knows
  every other label of a release and tries keys offline) costs 2^256 work,
  not the 2^64 of one threefry2x32 key;
* a word's value depends only on (key, global row index), so chunking,
  sharding over devices, row offsets and where the stream is computed never
  change a label.

**Two implementations, one stream.** On CPU the release reads the keystream
from OpenSSL's ChaCha20 through the ``cryptography`` package
(:func:`host_words`): SIMD code that writes 1e7 words in about 25 ms on one
core, where the same block function compiled by XLA for the CPU takes several
times longer (XLA emits one loop per output word, each recomputing the
rounds). On accelerators the device computes it (:func:`block_bits`,
:func:`chacha_block`). Both are checked bit for bit against each other and
against RFC 8439's test vectors in the tests.
"""

from __future__ import annotations

import sys

import jax.numpy as jnp
import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from jax import lax

BLOCK_ROWS = 1 << 16  # rows of one release block (the unit of padding and of device sharding)
WORDS_PER_CHACHA_BLOCK = 8  # 64-bit words per 512-bit ChaCha block
BLOCK_WORDS = BLOCK_ROWS // WORDS_PER_CHACHA_BLOCK  # ChaCha blocks per release block
ROUNDS = 20  # ChaCha20, RFC 8439's block function (what OpenSSL computes)
_CONSTANTS = np.frombuffer(b"expand 32-byte k", dtype="<u4")
_COUNTER_SPAN = 1 << 32  # ChaCha blocks before the low counter word wraps: one host call never crosses it
_HOST_CHUNK = 1 << 20  # bytes of keystream per OpenSSL call (a zero buffer of this size is encrypted)
_ZEROS = memoryview(bytes(_HOST_CHUNK))


def _rotl(x, n: int):
    return (x << jnp.uint32(n)) | (x >> jnp.uint32(32 - n))


def _quarter_round(s, a, b, c, d):
    s[a] = s[a] + s[b]
    s[d] = _rotl(s[d] ^ s[a], 16)
    s[c] = s[c] + s[d]
    s[b] = _rotl(s[b] ^ s[c], 12)
    s[a] = s[a] + s[b]
    s[d] = _rotl(s[d] ^ s[a], 8)
    s[c] = s[c] + s[d]
    s[b] = _rotl(s[b] ^ s[c], 7)


def chacha_block(key, counter_low, counter_high, nonce=(0, 0), rounds: int = ROUNDS):
    """The 16 output words (a list of uint32 arrays) of the ChaCha blocks (``rounds`` rounds) at the given counters.

    ``key``: 8 uint32 words (little-endian key bytes); ``counter_low``,
    ``counter_high``: uint32 arrays of one shape (words 12 and 13);
    ``nonce``: words 14 and 15.
    """
    key = jnp.asarray(key, jnp.uint32)
    counter_low = jnp.asarray(counter_low, jnp.uint32)
    shape = counter_low.shape
    counter_high = jnp.broadcast_to(jnp.asarray(counter_high, jnp.uint32), shape)
    init = ([jnp.full(shape, c, jnp.uint32) for c in _CONSTANTS]
            + [jnp.broadcast_to(key[i], shape) for i in range(8)]
            + [counter_low, counter_high]
            + [jnp.full(shape, n, jnp.uint32) for n in nonce])
    s = list(init)
    for _ in range(rounds // 2):
        _quarter_round(s, 0, 4, 8, 12)
        _quarter_round(s, 1, 5, 9, 13)
        _quarter_round(s, 2, 6, 10, 14)
        _quarter_round(s, 3, 7, 11, 15)
        _quarter_round(s, 0, 5, 10, 15)
        _quarter_round(s, 1, 6, 11, 12)
        _quarter_round(s, 2, 7, 8, 13)
        _quarter_round(s, 3, 4, 9, 14)
    return [x + x0 for x, x0 in zip(s, init)]


def block_bits(key, block_counter, rounds: int = ROUNDS):
    """The 64-bit words of one release block, computed on the device: uint64 array of :data:`BLOCK_ROWS`
    (needs ``jax.enable_x64``).

    ``block_counter`` = (low, high) uint32 words of ``b·BLOCK_WORDS`` for release
    block ``b`` (its low 13 bits are zero, so adding the ChaCha block number
    within the release block never carries). Row ``r`` of the block gets ChaCha
    block ``b·BLOCK_WORDS + r div 8``, word pair ``r mod 8``: the same bits as
    :func:`host_words`.
    """
    j = jnp.arange(BLOCK_WORDS, dtype=jnp.uint32)
    words = chacha_block(key, block_counter[0] | j, block_counter[1], rounds=rounds)
    pairs = [words[2 * w].astype(jnp.uint64) | (words[2 * w + 1].astype(jnp.uint64) << jnp.uint64(32))
             for w in range(WORDS_PER_CHACHA_BLOCK)]
    # word pair w of every ChaCha block, then interleaved to keystream order. The barrier keeps the interleave a
    # copy of its own: fused into the block function (jnp.stack(pairs, axis=1)) it exhausts XLA's memory when
    # compiling
    by_pair = lax.optimization_barrier(jnp.concatenate(pairs))
    return by_pair.reshape(WORDS_PER_CHACHA_BLOCK, BLOCK_WORDS).T.reshape(-1)


def host_words(key, first_row: int, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The 64-bit words of global rows ``first_row .. first_row + n - 1``, computed on the host by OpenSSL's
    ChaCha20 (uint64, written into ``out`` when given).

    ``key``: 8 uint32 words (little-endian key bytes); ``first_row`` and ``n``
    multiples of 8 (whole ChaCha blocks; release blocks always are). The
    bits are those of :func:`block_bits`.
    """
    first_row, n = int(first_row), int(n)
    if first_row % WORDS_PER_CHACHA_BLOCK or n % WORDS_PER_CHACHA_BLOCK or first_row < 0 or n < 0:
        raise ValueError(f"host_words needs whole ChaCha blocks, got first_row={first_row}, n={n}")
    if out is None:
        out = np.empty(n, np.uint64)
    if out.dtype != np.uint64 or out.shape != (n,) or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous uint64 array of {n} words")
    key_bytes = np.asarray(key, np.uint32).astype("<u4").tobytes()
    view = memoryview(out).cast("B")
    block = first_row // WORDS_PER_CHACHA_BLOCK
    end = block + n // WORDS_PER_CHACHA_BLOCK
    pos = 0
    while block < end:
        # one cipher per span of the low counter word: OpenSSL's counter is 32 bits (words 13-15 are its nonce)
        stop = min(end, (block // _COUNTER_SPAN + 1) * _COUNTER_SPAN)
        nonce = block.to_bytes(8, "little") + bytes(8)
        encryptor = Cipher(algorithms.ChaCha20(key_bytes, nonce), mode=None).encryptor()
        last = pos + (stop - block) * 64
        while pos < last:
            size = min(_HOST_CHUNK, last - pos)
            encryptor.update_into(_ZEROS[:size], view[pos : pos + size])  # zeros XOR keystream = keystream
            pos += size
        block = stop
    if sys.byteorder != "little":  # the keystream's words are little-endian
        out.byteswap(inplace=True)
    return out


def block_counters(first_block: int, count: int) -> np.ndarray:
    """(count, 2) uint32: the ChaCha counter words of release blocks ``first_block .. first_block + count - 1``."""
    base = (np.arange(count, dtype=np.uint64) + np.uint64(first_block)) * np.uint64(BLOCK_WORDS)
    return np.stack([(base & np.uint64(0xFFFFFFFF)).astype(np.uint32), (base >> np.uint64(32)).astype(np.uint32)],
                    axis=1)
