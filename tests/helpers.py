"""Helpers shared by the tests: the command-line runner, and fast/slow parameter lists."""

import pytest

from rpwjax import cli


def run(argv, capsys):
    """``rpwjax ARGV`` in process: (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


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
