"""Secrets and the keys derived from them.

A :class:`Secret` is 256 bits: fresh OS entropy (:meth:`Secret.from_entropy`,
the default everywhere), or a key file written by ``rpwjax keygen`` (64 hex
characters, :meth:`Secret.from_file`). Every random key the package uses is
derived from it with SHA-256, separately for each *release*, each *purpose*
(``"labels"``, ``"histogram"``, ...) and each index, so

* one key file serves many releases without two of them sharing randomness:
  every draw is keyed by the release's identity (:meth:`Secret.for_release`:
  a release id of at least 128 bits, fresh from OS entropy by default, and
  the release's mechanism, parameters, ε, label column and stage), and a
  secret not yet bound to a release is bound to a fresh one before anything
  is drawn from it (:func:`bound`);
* every uniform comes from a 256-bit ChaCha20 key (:meth:`Secret.stream_key`,
  :mod:`rpwjax.stream`), every integer-noise bit from SHA-256 over 256 bits;
* the same secret, the same release id and the same row offsets give
  bit-identical outputs, which is what lets shards of one release privatized
  on different machines concatenate to the single-run output.

Integer seeds survive only for experiments (:meth:`Secret.from_seed`): such a
secret says so (``reproducible``), and every record made with it is marked
``"reproducible_seed": true`` and "not for production". Key material is never
written to a sidecar, a params file, a log line or an error message
(``repr`` and ``str`` hide it).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets as _secrets
import struct
import warnings
from pathlib import Path

import numpy as np

from rpwjax.errors import InputError

SECRET_BYTES = 32
KEY_FILE_HEX = 2 * SECRET_BYTES
RELEASE_ID_BYTES = 16  # a fresh release id: 128 bits of OS entropy, 32 hex characters
_DOMAIN = b"rpwjax/v2/"


class Secret:
    """256 bits of secret key material (hidden from ``repr``) and the keys derived from it."""

    __slots__ = ("_material", "reproducible", "release_id")

    def __init__(self, material: bytes, *, reproducible: bool = False, release_id: str | None = None):
        if not isinstance(material, (bytes, bytearray)) or len(material) != SECRET_BYTES:
            raise InputError(f"a secret must be {SECRET_BYTES} bytes")
        self._material = bytes(material)
        self.reproducible = bool(reproducible)
        self.release_id = release_id  # set by for_release: the release every key of this secret belongs to

    # -- where secrets come from ---------------------------------------------------
    @classmethod
    def from_entropy(cls) -> "Secret":
        """256 bits from the operating system's CSPRNG (``secrets.token_bytes``)."""
        return cls(_secrets.token_bytes(SECRET_BYTES))

    @classmethod
    def from_hex(cls, text: str, *, source: str = "key") -> "Secret":
        """64 hex characters (surrounding whitespace ignored); the message never echoes the text."""
        t = text.strip()
        if len(t) != KEY_FILE_HEX or any(c not in "0123456789abcdefABCDEF" for c in t):
            raise InputError(
                f"{source} must hold exactly {KEY_FILE_HEX} hex characters (256 bits, as `rpwjax keygen` writes), "
                f"got {len(t)} characters{'' if all(c in '0123456789abcdefABCDEF' for c in t) else ' with non-hex ones'}"
            )
        material = bytes.fromhex(t)
        _check_strength(material, source)
        return cls(material)

    @classmethod
    def from_file(cls, path) -> "Secret":
        """The secret of a key file written by ``rpwjax keygen``."""
        p = Path(path)
        if _looks_like_key(str(path)) and not p.is_file():
            # e.g. `--key-file "$(cat KEYFILE)"`: the argument is the secret itself, never echo it
            raise InputError(f"the key file argument looks like key material ({KEY_FILE_HEX} hex characters), "
                             "not a path: give the path of the file `rpwjax keygen -o KEYFILE` wrote")
        try:
            text = p.read_text(encoding="ascii")
        except FileNotFoundError:
            raise InputError(f"key file {str(p)!r} does not exist (make one with `rpwjax keygen -o {p}`)") from None
        except UnicodeDecodeError:
            raise InputError(f"key file {str(p)!r} is not ASCII hex text") from None
        except IsADirectoryError:
            raise InputError(f"key file {str(p)!r} is a directory") from None
        except OSError as err:  # e.g. permission denied: name the file and the reason, nothing else
            raise InputError(f"key file {str(p)!r} cannot be read ({err.strerror or type(err).__name__})") from None
        secret = cls.from_hex(text, source=f"key file {str(p)!r}")
        mode = p.stat().st_mode & 0o777
        if os.name == "posix" and mode & 0o077:  # as ssh does: a secret others can read is no secret
            warnings.warn(f"key file {str(p)!r} is readable or writable by group or others (mode {mode:04o}): anyone "
                          f"who reads it can undo the noise; restrict it with chmod 600 {str(p)!r}", stacklevel=2)
        return secret

    @classmethod
    def from_seed(cls, seed: int) -> "Secret":
        """EXPERIMENTS ONLY: a secret expanded from an integer seed (anyone can try every small seed)."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InputError(f"seed must be a non-negative integer, got seed={seed!r}")
        seed = int(seed)
        raw = seed.to_bytes(max(1, (seed.bit_length() + 7) // 8), "big")
        return cls(hashlib.sha256(_DOMAIN + b"seed/" + raw).digest(), reproducible=True)

    def __repr__(self) -> str:
        bound_to = f", release {self.release_id}" if self.release_id else ""
        return f"Secret(<hidden>{', reproducible seed' if self.reproducible else ''}{bound_to})"

    __str__ = __repr__

    def __reduce__(self):  # pickling (e.g. to Dask workers) keeps the material in memory only
        return (_restore, (self._material, self.reproducible, self.release_id))

    def hex(self) -> str:
        """The key file text. Only :func:`write_key_file` should call this."""
        return self._material.hex()

    # -- derivation ----------------------------------------------------------------
    def _digest(self, purpose: str, index: tuple[int, ...]) -> bytes:
        if not isinstance(purpose, str) or not purpose:
            raise InputError(f"purpose must be a non-empty string, got purpose={purpose!r}")
        tag = purpose.encode()
        h = hashlib.sha256(_DOMAIN + self._material)
        h.update(struct.pack(">I", len(tag)) + tag)
        for i in index:
            i = int(i)
            if i < 0 or i >= 1 << 64:
                raise InputError(f"key index must be in [0, 2^64), got {i}")
            h.update(struct.pack(">Q", i))
        return h.digest()

    def digest(self, purpose: str, *index: int) -> bytes:
        """256 derived bits for ``purpose`` and ``index`` (e.g. to seed an exact bit stream)."""
        return self._digest("digest/" + purpose, tuple(index))

    def child(self, purpose: str, *index: int) -> "Secret":
        """An independent 256-bit secret for a sub-task (e.g. one ε of a sweep, one stage of a pipeline).

        A child belongs to the same release as its parent (``release_id`` is kept)."""
        return Secret(self._digest("child/" + purpose, tuple(index)), reproducible=self.reproducible,
                      release_id=self.release_id)

    def for_release(self, release_id: str, **identity) -> "Secret":
        """The secret of one release: SHA-256 of this secret, ``release_id`` and ``identity``.

        ``identity`` names what makes the release what it is (e.g. the
        command, the label column, the pipeline); values must be JSON
        (strings, numbers, lists, dicts). Two releases share randomness only
        if they have the same secret, the same release id and the same
        identity. The release path adds the mechanism, a digest of the exact
        parameters and the purpose of each draw (:meth:`stream_key`).
        """
        rid = check_release_id(release_id)
        if rid in self._material.hex():
            # e.g. `--release-id "$(cat KEYFILE)"`: an id is public (every sidecar and ledger line carries it)
            raise InputError("the release id is (part of) the secret's key material: a release id is public, written "
                             "to every sidecar and ledger line; give back the release_id a sidecar records")
        tag = "release/" + rid + "/" + canonical_json(identity)
        return Secret(self._digest(tag, ()), reproducible=self.reproducible, release_id=rid)

    def stream_key(self, purpose: str, *index: int) -> np.ndarray:
        """The 256-bit ChaCha20 key (8 uint32 words, little-endian) of ``purpose`` and ``index``."""
        return np.frombuffer(self._digest("stream/" + purpose, tuple(index)), dtype="<u4").astype(np.uint32)

    def for_epsilon(self, epsilon: float, purpose: str = "epsilon") -> "Secret":
        """The child secret of one ε value: ``child(purpose, epsilon_index(ε))``, keyed by the value's
        float64 bits (not by its position in a grid), so one ε of a sweep can be rerun alone."""
        return self.child(purpose, epsilon_index(epsilon))


def epsilon_index(epsilon: float) -> int:
    """The key index of an ε value: its float64 bits (every per-ε key of the package is derived with it)."""
    return int(np.asarray(float(epsilon), np.float64).view(np.uint64))


def check_secret(secret) -> Secret:
    """``secret`` if it is a :class:`Secret`, else an InputError saying how to get one."""
    if not isinstance(secret, Secret):
        raise InputError("secret must be an rpwjax.keys.Secret (Secret.from_file(KEYFILE) or Secret.from_entropy()), "
                         f"got {type(secret).__name__}")
    return secret


MIN_DISTINCT_BYTES = 8  # a key's 32 bytes take at least this many distinct values


def _check_strength(material: bytes, source: str):
    """Refuse key material whose bytes take fewer than :data:`MIN_DISTINCT_BYTES` distinct values.

    32 bytes from a CSPRNG take about 30 distinct values; fewer than 8 happens with probability below
    2^-120, so such a key (all zeros, a repeated pattern) was typed or made up, not drawn.
    """
    distinct = len(set(material))
    if distinct < MIN_DISTINCT_BYTES:
        raise InputError(f"{source} is not a strong secret: its {len(material)} bytes take only {distinct} distinct "
                         "value(s) (all zeros or a repeated pattern); a key file must come from `rpwjax keygen` or "
                         "an equally strong source")


def _looks_like_key(text: str) -> bool:
    """Whether ``text`` is itself 64 hex characters (a secret, not a path)."""
    t = text.strip()
    return len(t) == KEY_FILE_HEX and all(c in "0123456789abcdefABCDEF" for c in t)


def _restore(material, reproducible, release_id=None):
    return Secret(material, reproducible=reproducible, release_id=release_id)


def canonical_json(value) -> str:
    """``value`` as JSON with sorted keys and no spaces: the same identity always hashes the same."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as err:
        raise InputError(f"a release identity must be finite JSON values, got {value!r} ({err})") from None


def new_release_id() -> str:
    """A fresh release id: 128 bits from the operating system's CSPRNG, as 32 hex characters."""
    return _secrets.token_hex(RELEASE_ID_BYTES)


def check_release_id(release_id) -> str:
    """``release_id`` if it is 32 to 64 lowercase or uppercase hex characters (128 to 256 bits), in lowercase."""
    if not isinstance(release_id, str):
        raise InputError(f"a release id must be a string of 32 to 64 hex characters, got {type(release_id).__name__}")
    t = release_id.strip()
    if not (2 * RELEASE_ID_BYTES <= len(t) <= KEY_FILE_HEX) or any(c not in "0123456789abcdefABCDEF" for c in t):
        raise InputError(f"release id (--release-id) must be 32 to 64 hex characters (at least 128 bits, as a fresh "
                         f"release writes in its sidecar), got {release_id!r}")
    return t.lower()


def bound(secret: Secret) -> Secret:
    """``secret`` if it already belongs to a release, else ``secret`` bound to a new one.

    The new release id is fresh OS entropy, so two draws from the same key
    file never share randomness unless the caller bound both to the same
    release on purpose. An experiments-only integer seed derives the id from
    the seed instead, so that experiments stay reproducible.
    """
    secret = check_secret(secret)
    if secret.release_id is not None:
        return secret
    return secret.for_release(default_release_id(secret))


def default_release_id(secret: Secret) -> str:
    """A new release's id: fresh OS entropy, or (experiments-only integer seed) derived from the seed."""
    return secret.digest("release-id")[:RELEASE_ID_BYTES].hex() if secret.reproducible else new_release_id()


def write_key_file(path) -> Path:
    """Write a fresh 256-bit secret as 64 hex characters (file mode 0600); refuses to overwrite."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"key file {str(p)!r} is a directory: give a file name for the new key (e.g. "
                         f"{str(p / 'rpwjax.key')!r})")
    if p.exists() or p.is_symlink():
        raise InputError(f"key file {str(p)!r} already exists: refusing to overwrite a secret")
    made = []  # folders created for the key (owner-only, as the key is), removed again if it cannot be written
    for folder in reversed((p.parent, *p.parent.parents)):
        if not folder.exists():
            folder.mkdir(mode=0o700)  # an OSError here is an I/O error (exit 1)
            made.append(folder)
    secret = Secret.from_entropy()
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # an OSError here is an I/O error (exit 1)
    except BaseException:
        for folder in reversed(made):
            folder.rmdir()
        raise
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(secret.hex() + "\n")
    return p


def resolve_secret(key_file=None, seed=None) -> Secret:
    """The secret of a run: a key file, else (experiments only) an integer seed, else OS entropy."""
    if key_file is not None and seed is not None:
        raise InputError("give either --key-file or --seed, not both")
    if key_file is not None:
        return Secret.from_file(key_file)
    if seed is not None:
        return Secret.from_seed(seed)
    return Secret.from_entropy()


def secret_record(secret: Secret) -> dict:
    """What a sidecar says about the randomness (never the key itself)."""
    if secret.reproducible:
        return {"reproducible_seed": True, "randomness": "integer seed: reproducible, not for production"}
    return {"reproducible_seed": False,
            "randomness": "256-bit secret (OS entropy or key file); SHA-256 keys per release, ChaCha20 uniforms"}


def key_fingerprint(secret: Secret) -> str:
    """16 hex characters that identify a secret in a ledger and reveal nothing about it (a SHA-256 tag of it)."""
    return secret._digest("fingerprint", ()).hex()[:16]
