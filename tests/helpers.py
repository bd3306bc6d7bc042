"""Helpers shared by the tests: the command-line runner, fixed key files, and fast/slow parameter lists."""

import numpy as np
import pytest

from rpwjax import cli


def run(argv, capsys):
    """``rpwjax ARGV`` in process: (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def fixed_key(path, seed=0):
    """Write a key file with a fixed 256-bit secret drawn from ``seed`` and return its path.

    Tests read outputs statistically, so every run must see the same noise: a
    key from ``rpwjax keygen`` (OS entropy) would make them pass or fail by
    chance. The keygen command itself is tested in tests/test_keys.py.
    """
    path.write_text(bytes(np.random.default_rng(seed).integers(0, 256, 32, dtype=np.uint8)).hex() + "\n")
    path.chmod(0o600)
    return path


def csv_rows(data: bytes, delimiter=b","):
    """pyarrow's CSV rules, one byte at a time: ``[(field spans, row end after its line break, values)]``.

    A quote opens a quoted field only at the start of a field; inside it a
    doubled quote is a quote and a single one closes it (what follows up to the
    delimiter belongs to the field); anywhere else a quote is an ordinary
    character. Unquoted CR, LF or CRLF end a row; empty lines are no rows; a
    quote still open at the end of the file ends there. The reference the
    tests hold rpwjax's vectorized tokenizer and its output to.
    """
    quote, delim = 0x22, delimiter[0]
    rows, i, n = [], 0, len(data)
    while i < n:
        if data[i] in b"\r\n":  # an empty line
            i += 2 if data[i:i + 2] == b"\r\n" else 1
            continue
        spans, values = [], []
        while True:
            start, value = i, bytearray()
            if i < n and data[i] == quote:
                i += 1
                while i < n:
                    c = data[i]
                    i += 1
                    if c != quote:
                        value.append(c)
                    elif i < n and data[i] == quote:
                        value.append(quote)
                        i += 1
                    else:
                        break
            while i < n and data[i] != delim and data[i] not in b"\r\n":
                value.append(data[i])
                i += 1
            spans.append((start, i))
            values.append(bytes(value))
            if i < n and data[i] == delim:
                i += 1
                continue
            if data[i:i + 2] == b"\r\n":
                i += 1
            i = min(i + 1, n)
            break
        rows.append((spans, i, values))
    return rows


def without_field(data: bytes, column: int, skip_rows=1) -> bytes:
    """``data`` with field ``column`` of every row after the first ``skip_rows`` (the header) cut out."""
    bom = b"\xef\xbb\xbf" if data.startswith(b"\xef\xbb\xbf") else b""  # before the first field, as pyarrow reads it
    data = data[len(bom):]
    pieces, previous = [bom], 0
    for spans, _, _ in csv_rows(data)[skip_rows:]:
        start, end = spans[column]
        pieces.append(data[previous:start])
        previous = end
    pieces.append(data[previous:])
    return b"".join(pieces)
def slow_unless(values, fast, ids=None):
    """``values`` as pytest params, every one not in ``fast`` marked ``slow``: the fast subset
    (``pytest -m "not slow"``) keeps one representative of a table, the full suite runs all of it.
    Tuples are unpacked into several arguments; ``ids`` names the params (default: pytest's own)."""
    out = []
    for i, v in enumerate(values):
        args = v if isinstance(v, tuple) else (v,)
        marks = () if v in fast else (pytest.mark.slow,)
        out.append(pytest.param(*args, marks=marks, id=None if ids is None else ids[i]))
    return out


def spy(monkeypatch, module, name, pick):
    """Replace ``module.name`` by a wrapper that records ``pick(args, kwargs)`` of every call; returns the list."""
    seen, real = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        seen.append(pick(args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return seen


def spends(record, purpose):
    """The ε of the entries of a pipeline record's account (``record["spends"]``) for ``purpose``, in order."""
    return [s["epsilon"] for s in record["spends"] if s["purpose"] == purpose]


def json_lines(text):
    """The objects of JSON Lines output (every ``--json`` prints one object per line, nothing else)."""
    import json

    lines = text.splitlines()
    assert lines and all(line.startswith("{") and line.endswith("}") for line in lines), text
    return [json.loads(line) for line in lines]
