r"""ChaCha12 in counter mode, in JAX: the bits behind every released label.

Each released label takes one 64-bit word of a keystream keyed by 256 bits
(:meth:`rpwjax.keys.Secret.stream_key`, derived from the secret and the
release's identity). The keystream is the ChaCha block function (Bernstein,
"ChaCha, a variant of Salsa20", 2008; RFC 8439 specifies it with 20 rounds)
with :data:`ROUNDS` = 12 rounds, a 64-bit block counter in words 12-13 and
words 14-15 zero:

* the key has 256 bits, so recovering it from outputs (an adversary who knows
  every other label of a release and tries keys offline) costs 2^256 work,
  not the 2^64 of one threefry2x32 key;
* a word's value depends only on (key, global row index), so chunking,
  sharding over devices and row offsets never change a label.

Row ``r`` of a release block of :data:`BLOCK_ROWS` rows (block ``b``) reads
ChaCha block ``b·BLOCK_WORDS + (r mod BLOCK_WORDS)``, 64-bit word
``r div BLOCK_WORDS`` of its eight (``BLOCK_WORDS = BLOCK_ROWS / 8``): the
eight words of one ChaCha block go to rows ``BLOCK_WORDS`` apart, which keeps
every array operation elementwise (no transpose). The block function is
checked against RFC 8439's test vector (20 rounds) and the published 8-, 12-
and 20-round keystreams of the all-zero key in the tests.

**Why 12 rounds.** The best published attacks on ChaCha reach 7 rounds;
12 rounds is the margin of the ChaCha12 generators in wide use (the default
CSPRNG of Rust's ``rand``), at 12/20 of ChaCha20's arithmetic: what keeps
every continuous release within 2x of ``jax.random.uniform`` (the
benchmark's ``sampling`` family measures the ratio in every run).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

BLOCK_ROWS = 1 << 16  # rows of one release block (the unit of padding and of device sharding)
WORDS_PER_CHACHA_BLOCK = 8  # 64-bit words per 512-bit ChaCha block
BLOCK_WORDS = BLOCK_ROWS // WORDS_PER_CHACHA_BLOCK  # ChaCha blocks per release block
ROUNDS = 12  # ChaCha12: see the module docstring
_CONSTANTS = np.frombuffer(b"expand 32-byte k", dtype="<u4")


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
    """The 64-bit words of one release block: uint64 array of :data:`BLOCK_ROWS` (needs ``jax.enable_x64``).

    ``block_counter`` = (low, high) uint32 words of ``b·BLOCK_WORDS`` for release
    block ``b`` (its low 13 bits are zero, so adding the row's ChaCha block
    number within the release block never carries).
    """
    j = jnp.arange(BLOCK_WORDS, dtype=jnp.uint32)
    words = chacha_block(key, block_counter[0] | j, block_counter[1], rounds=rounds)
    pairs = [(words[2 * w].astype(jnp.uint64) << jnp.uint64(32)) | words[2 * w + 1].astype(jnp.uint64)
             for w in range(WORDS_PER_CHACHA_BLOCK)]
    return jnp.concatenate(pairs)


def block_counters(first_block: int, count: int) -> np.ndarray:
    """(count, 2) uint32: the ChaCha counter words of release blocks ``first_block .. first_block + count - 1``."""
    base = (np.arange(count, dtype=np.uint64) + np.uint64(first_block)) * np.uint64(BLOCK_WORDS)
    return np.stack([(base & np.uint64(0xFFFFFFFF)).astype(np.uint32), (base >> np.uint64(32)).astype(np.uint32)],
                    axis=1)
