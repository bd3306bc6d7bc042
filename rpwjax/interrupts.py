"""SIGINT and SIGTERM end a command-line run at once, with one line, leaving nothing behind.

The handler never raises into the program. An exception raised by a signal
handler surfaces wherever the main thread happens to be: inside a garbage
collector callback (JAX registers one) it is printed as "Exception ignored"
and lost, so the run went on and released its output; and unwinding it while
pyarrow's reader and XLA's threads were still running ended, at interpreter
exit, in a segmentation fault. Instead, :func:`stop` removes the temporary
outputs and directories registered here (:func:`rpwjax.io.atomic.atomic_outputs`
registers each as it creates it), writes one line on stderr and ends the
process with ``os._exit`` (130 for SIGINT, 143 for SIGTERM), skipping an
interpreter teardown that could crash.

Two paths reach :func:`stop`, whichever runs first: the Python handler (on
the main thread, between two bytecodes) and a watcher thread woken through
``signal.set_wakeup_fd`` (it runs while the main thread sits in a long call
into XLA or pyarrow that releases the GIL, e.g. compiling). Work that must
not be cut in half (renaming outputs into place, creating a temporary file
and registering it) runs under :func:`held`: a signal arriving inside waits
for it to end.

Nothing here imports more than the standard library, so :func:`install` runs
before the heavy imports (JAX, pyarrow) and covers them too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}

_lock = threading.RLock()  # held by held() sections and by stop()
_holders: dict[int, int] = {}  # thread id -> depth of held() sections it is in
_deferred: list[int] = []  # a signal that arrived while the main thread was inside held()
_temps: dict[str, None] = {}  # temporary outputs to remove, in order
_dirs: dict[str, None] = {}  # directories created for them (removed if empty, innermost first)
_state = {"label": "rpwjax", "stopping": False, "installed": False}
_on_stop: dict[int, object] = {}  # what a stop runs first (rpwjax.release_run charges a failed run), in order


def register(*paths, directories=()):
    """Temporary files (and directories created for them) that a stop must remove."""
    with _lock:
        _temps.update(dict.fromkeys(map(str, paths)))
        _dirs.update(dict.fromkeys(map(str, directories)))


def unregister(*paths, directories=()):
    """Files (directories) that are no longer temporary: renamed into place, or already removed."""
    with _lock:
        for p in map(str, paths):
            _temps.pop(p, None)
        for d in map(str, directories):
            _dirs.pop(d, None)


def on_stop(hook):
    """Run ``hook()`` when a stop ends the run, before its line (a str it returns is printed first); returns a
    function that takes it off. A hook must not wait on a lock the stopped thread may hold: it runs on
    whichever thread stops the run, maybe inside the main thread's work; its exceptions are ignored."""
    with _lock:
        _on_stop[id(hook)] = hook
    return lambda: _on_stop.pop(id(hook), None)


@contextlib.contextmanager
def held():
    """A section a signal does not cut: a stop waits until it ends."""
    me = threading.get_ident()
    with _lock:
        _holders[me] = _holders.get(me, 0) + 1
        try:
            yield
        finally:
            _holders[me] -= 1
            if not _holders[me]:
                del _holders[me]
    if _deferred and me == threading.main_thread().ident and me not in _holders:
        stop(_deferred[0])


def stop(signum: int):
    """Remove every registered temporary output, print one line, and end the process (130 or 143)."""
    with _lock:
        _state["stopping"] = True
        for p in reversed(list(_temps)):
            with contextlib.suppress(OSError):
                os.unlink(p)
        for d in sorted(_dirs, key=len, reverse=True):  # innermost first
            with contextlib.suppress(OSError):
                os.rmdir(d)
        said = []
        for hook in list(_on_stop.values()):
            try:
                said.append(hook())
            except Exception:  # noqa: BLE001 - the run ends with its one line whatever a hook does
                pass
        name = signal.Signals(signum).name
        line = "".join(f"{s}\n" for s in said if isinstance(s, str))
        line += f"{_state['label']}: interrupted by {name}; unfinished outputs were removed\n"
        with contextlib.suppress(OSError):
            # os.write, not print: the main thread may be inside a write to sys.stderr right now; a progress bar
            # on a terminal is cleared first, so that the run ends with this one line, and elsewhere (a log
            # file) the line starts on a line of its own after the bar's last state
            start = "\r\x1b[2K" if os.isatty(2) else "\n" if _bar_showing() else ""
            os.write(2, (start + line).encode())
        os._exit(EXIT_CODES.get(signum, 128 + signum))


def _bar_showing() -> bool:
    """Whether a progress bar (tqdm) is on screen, its last state without a line end."""
    try:  # a bar exists only if tqdm was imported: nothing to import here
        bars = getattr(getattr(sys.modules.get("tqdm.std"), "tqdm", None), "_instances", ())
        return any(not getattr(bar, "disable", True) for bar in list(bars))
    except Exception:  # noqa: BLE001 - a stop never fails for a progress bar
        return False


def _handler(signum, frame):
    if _state["stopping"]:
        return
    if threading.main_thread().ident in _holders:  # the main thread is inside held(): it stops when that ends
        if not _deferred:
            _deferred.append(signum)
        return
    stop(signum)


def _watch(fd: int):
    while True:
        try:
            data = os.read(fd, 1)
        except OSError:
            return
        if not data:  # the write end was closed: the run is over
            return
        if data[0] in EXIT_CODES:
            stop(data[0])


def install(label: str = "rpwjax"):
    """Install the handlers for SIGINT and SIGTERM (main thread only); returns a function that undoes it.

    ``label`` starts the line printed on a stop (see :func:`set_label`).
    """
    if threading.current_thread() is not threading.main_thread() or _state["installed"]:
        return lambda: None
    _state.update(label=label, stopping=False, installed=True)
    _deferred.clear()
    previous = {s: signal.signal(s, _handler) for s in EXIT_CODES}
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        old_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter
        old_fd = None
    watcher = threading.Thread(target=_watch, args=(read_end,), name="rpwjax-signals", daemon=True)
    watcher.start()

    def uninstall():
        if old_fd is not None:
            signal.set_wakeup_fd(old_fd)
        os.close(write_end)  # the watcher reads the end of the pipe and returns
        watcher.join(timeout=5)
        os.close(read_end)
        for s, h in previous.items():
            signal.signal(s, h)
        _state["installed"] = False

    return uninstall


def set_label(label: str):
    """What the line printed on a stop starts with, e.g. ``rpwjax privatize``."""
    _state["label"] = label
