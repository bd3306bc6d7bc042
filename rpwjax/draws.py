"""Which private draws a run has made: what a run that fails afterwards has spent.

Every private draw of the package passes one of two places: a noise stream
(:class:`rpwjax.noise.BitStream`, behind every private statistic and
histogram) and a label release (:func:`rpwjax.release_path.release`). Each
notes itself here (:func:`note`) with its ε and δ and the identity of its
randomness. A command's :class:`rpwjax.release_run.ReleaseRun` collects the
notes while its work runs (:func:`collecting`); when the work fails after a
draw that later computation reads (:func:`read_later`: a statistic, or a
release a pipeline goes on from), its error, its message and the progress
shown so far can depend on what was drawn, so the run is charged what its
draws spent (:func:`spent`) instead of nothing. A file release's own values
go only to the output: a failure after them alone (a bad row further on, a
full disk) is not charged, as nothing it shows depends on them.

A draw is noted under the identity of its randomness: drawing it again with
the same key (a histogram shared by several ε of one fit, a file released in
chunks) is the same draw and counts once. The collectors are process-wide,
not per thread, so that a draw made on another thread is not missed: with
two runs in one process at once, each is charged the other's draws too (an
overcharge, never an undercharge). A stop (:mod:`rpwjax.interrupts`) may read
the notes from a signal handler on the very thread that is noting one, so
reading takes no lock, only a copy of the notes made in one step.

A block may also ask to hear of its first draw before that draw is made
(``collecting(first_read=...)``): the run then writes a line to its ledger
first, so that a run killed outright afterwards (SIGKILL, the kernel's OOM
killer, a crash), which runs no code of its own, is still charged, whatever
its draws had reached (a statistic, or a part file of released labels).
"""

from __future__ import annotations

import contextlib
import math
import threading

_lock = threading.Lock()
_collectors: dict[int, dict] = {}  # id of a collecting block -> {identity: (epsilon, delta, to_output)}
_first_read: dict[int, tuple] = {}  # id of a collecting block -> (its hook, its thread), until the hook is done


@contextlib.contextmanager
def collecting(first_read=None):
    """A block whose draws are collected: yields the dict of ``identity -> (ε, δ, to_output)`` they fill.

    ``first_read()``, if given, is called before the block's first draw is noted or made (on the thread that
    draws it), and again before later draws until it returns True: the run's write-ahead ledger line
    (:meth:`rpwjax.release_run.ReleaseRun.charged`). An exception from it stops that draw when the draw is on
    the block's own thread; a draw on another thread (maybe another run's, in the same process) goes on, and
    the hook is tried again at the next draw."""
    draws: dict = {}
    with _lock:
        _collectors[id(draws)] = draws
        if first_read is not None:
            _first_read[id(draws)] = (first_read, threading.get_ident())
    try:
        yield draws
    finally:
        with _lock:
            _collectors.pop(id(draws), None)
            _first_read.pop(id(draws), None)


def active() -> bool:
    """Whether some block collects draws (a caller may skip building an identity otherwise)."""
    return bool(_collectors)


def note(identity: bytes, epsilon: float, delta: float = 0.0, *, to_output: bool = False) -> None:
    """Note one private draw: ``identity`` names its randomness, (``epsilon``, ``delta``) its cost.
    ``to_output``: its values go only to an output file (a file release), nothing computed later reads them."""
    epsilon, delta = float(epsilon), float(delta)
    if not (math.isfinite(epsilon) and epsilon >= 0 and 0 <= delta <= 1):
        raise ValueError(f"a draw costs a finite epsilon >= 0 and a delta in [0, 1], got {epsilon!r}, {delta!r}")
    with _lock:
        hooks = list(_first_read.items())
    me = threading.get_ident()
    for key, (hook, owner) in hooks:  # outside the lock: a hook writes a file, and may raise (then nothing is drawn)
        try:
            done = hook()
        except Exception:
            if me == owner:
                raise
            continue  # another block's refusal is its own: tried again at the next draw
        if done:
            with _lock:
                _first_read.pop(key, None)
    with _lock:
        for draws in _collectors.values():
            draws.setdefault(bytes(identity), (epsilon, delta, bool(to_output)))


def read_later(draws: dict) -> bool:
    """Whether some draw feeds later computation (a statistic, a release a pipeline goes on from): only then can
    a failure reflect what was drawn. A file release's values go to the output alone; a failure after them
    (a bad row further on, a full disk) does not depend on them."""
    return any(not to_output for _, _, to_output in tuple(draws.values()))


def spent(draws: dict, claim: float | None = None) -> tuple[float, float]:
    """What ``draws`` cost under basic composition, each read by every label: the sums of their ε and δ, the
    ε capped at ``claim`` (the run's claimed ε, which its draws never pass; draws over disjoint rows compose
    in parallel, so the sum alone can exceed it). δ is not capped: a run's claimed δ may be set only later."""
    made = tuple(draws.values())  # one step under the GIL: a stop on another thread may read while draws arrive
    eps = sum(e for e, _, _ in made)
    if claim is not None:
        eps = min(eps, float(claim))
    return eps, min(1.0, sum(d for _, d, _ in made))
