"""Atomic outputs: nothing half-written is ever left behind, and nothing is replaced by mistake.

Outputs go to temporary files beside their targets and are renamed into
place only after the whole run succeeded (:func:`atomic_outputs`); a
failure, ``SIGINT`` or ``SIGTERM`` removes the temporary files and any
directory the run created, and leaves an existing output untouched.
:func:`check_outputs` refuses, before any work, an output that is an input,
a directory, a key file, or (without ``overwrite``) an existing file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path

from rpwjax import interrupts
from rpwjax.errors import InputError, one_line
from rpwjax.io.source import check_exists

_KEY_FILE_BYTES = 64  # a key file (``rpwjax keygen``): exactly 64 hex characters and an optional line end
_HEX = frozenset(b"0123456789abcdefABCDEF")


def is_key_file(path) -> bool:
    """Whether ``path`` is a file holding exactly 64 hex characters (and an optional newline): a secret."""
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        head = f.read(_KEY_FILE_BYTES + 3)
    for end in (b"\r\n", b"\n", b""):
        if head.endswith(end) and len(head) == _KEY_FILE_BYTES + len(end):
            return all(c in _HEX for c in head[:_KEY_FILE_BYTES])
    return False


def _refuse_key_file(path: Path):
    """Nothing replaces a key file, with or without ``--overwrite``."""
    try:
        key = is_key_file(path)
    except OSError as err:  # it cannot be read, so it cannot be told apart from a key file
        raise InputError(f"output {str(path)!r} exists and cannot be read ({err.strerror or err}): refusing to "
                         "replace it") from None
    if key:
        raise InputError(f"refusing to overwrite {str(path)!r}: it is a key file (64 hex characters, as `rpwjax "
                         "keygen` writes), and a secret is never replaced, with or without --overwrite")


def check_outputs(outputs, *, overwrite: bool = False, inputs=()):
    """Refuse, before any work starts, outputs that would replace something.

    An output that is one of ``inputs``, a directory or a key file is always
    refused; an existing file unless ``overwrite`` (``--overwrite``). The
    message names the file.
    """
    sources = [Path(i) for i in inputs if i is not None]
    for out in map(Path, outputs):
        if out.is_dir():
            raise InputError(f"output {str(out)!r} is a directory: give a file name")
        exists = out.exists() or out.is_symlink()
        if exists:
            _refuse_key_file(out)
        for src in sources:
            if out.resolve() == src.resolve() or (out.is_file() and src.is_file() and out.samefile(src)):
                raise InputError(f"output must differ from input (it would overwrite it), got {str(out)!r} for both")
        if exists:
            if not overwrite:
                raise InputError(f"output {str(out)!r} already exists: give --overwrite to replace it")
        # refused before any work: the run would otherwise find it out only when its results are done
        problem = uncreatable(out)
        if problem:
            raise InputError(f"output {str(out)!r} cannot be written: {problem}")


def uncreatable(path) -> str | None:
    """Why ``path`` could not be created (its nearest existing ancestor is not a writable folder), or None;
    creates nothing."""
    parent = Path(path).absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{str(parent)!r} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"folder {str(parent)!r} is not writable"
    return None


def _temp_beside(target: Path) -> Path:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    except OSError as err:
        raise OSError(f"cannot write {str(target)!r}: {err.strerror or err}") from None
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
    return Path(tmp)


def _make_parents(directory: Path) -> list[Path]:
    """Create ``directory`` and its missing parents; return the ones created, outermost first."""
    missing = []
    d = directory
    while not d.exists() and d != d.parent:
        missing.append(d)
        d = d.parent
    created = []
    try:
        for d in reversed(missing):
            d.mkdir()
            created.append(d)
    except OSError as err:
        _remove_dirs(created)
        raise OSError(f"cannot create the output directory {str(d)!r}: {err.strerror or err}") from None
    return created


def _remove_dirs(created):
    for d in reversed(created):
        with contextlib.suppress(OSError):
            d.rmdir()


def _commit(temps, targets, remove=()):
    with interrupts.held():  # a signal waits until every output is in place, or none is
        backups, done = [], []
        try:
            for tmp, target in zip(temps, targets):
                if target.exists():
                    _refuse_key_file(target)  # checked again here: it may have become one since the run started
                    backup = _temp_beside(target)
                    os.replace(target, backup)
                    backups.append((backup, target))
                os.replace(tmp, target)
                done.append(target)
            # files of an earlier run that this one does not replace: moved aside like a replaced target, so
            # that a failure puts them back and success deletes them with the other backups
            for path in remove:
                if path in targets or path.is_dir() or not (path.exists() or path.is_symlink()):
                    continue
                _refuse_key_file(path)
                backup = _temp_beside(path)
                os.replace(path, backup)
                backups.append((backup, path))
        except BaseException:
            for target in done:
                with contextlib.suppress(OSError):
                    os.unlink(target)
            for backup, target in backups:
                with contextlib.suppress(OSError):
                    os.replace(backup, target)
            raise
        for backup, _ in backups:
            with contextlib.suppress(OSError):
                os.unlink(backup)


@contextlib.contextmanager
def atomic_outputs(*targets, remove=()):
    """Temporary paths beside ``targets``, renamed onto them together only on success.

    An existing target is replaced, unless it is a key file (:func:`is_key_file`: never); the command
    line refuses existing outputs before any work unless ``--overwrite`` (:func:`check_outputs`).
    ``remove`` names files (of an earlier run) that the same commit deletes once every target is in place:
    on a failure they stay as they were. A directory, a path that is also a target, or one that does not
    exist is skipped; a key file is refused as a target is.
    On any failure (an exception, ``KeyboardInterrupt``) the temporary files
    and the directories created for them are removed and existing targets are
    left as they were; both are registered with :mod:`rpwjax.interrupts`, so
    that the command line's SIGINT or SIGTERM removes them too.
    """
    targets = [Path(t) for t in targets]
    remove = [Path(r) for r in remove]
    for t in targets:
        if t.is_dir():
            raise InputError(f"output {str(t)!r} is a directory: give a file name")
        if t.exists():
            _refuse_key_file(t)
    created = []
    temps = []

    def clean():
        with interrupts.held():
            for tmp in temps:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            _remove_dirs(created)
            interrupts.unregister(*temps, directories=created)

    try:
        for t in targets:
            with interrupts.held():  # no signal between creating a file and registering it
                made = _make_parents(t.parent)
                created += made
                interrupts.register(directories=made)
                temps.append(_temp_beside(t))
                interrupts.register(temps[-1])
        yield tuple(temps)
        with interrupts.held():
            _commit(temps, targets, remove)
            interrupts.unregister(*temps, directories=created)
    except OSError as err:
        clean()
        raise _write_error(err, temps, targets) from None
    except BaseException:
        clean()
        raise


_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}  # a full disk, a quota, a size limit


def _write_error(err: OSError, temps, targets) -> OSError:
    """``err`` with the file it concerns named by its target, not its temporary name (or not at all)."""
    named = [t for tmp, t in zip(temps, targets) if str(tmp) in f"{err.filename} {err}"]
    if not named and err.errno not in _WRITE_ERRNOS:
        return err  # not about writing the outputs (e.g. reading the input)
    names = " and ".join(repr(str(t)) for t in (named or targets))
    out = OSError(f"cannot write {names}: {err.strerror or one_line(err)}")
    out.errno = err.errno
    return out


@contextlib.contextmanager
def atomic_path(target):
    """Yield a temporary path beside ``target``; rename it onto ``target`` only on success."""
    with atomic_outputs(target) as (tmp,):
        yield tmp


def write_json(path, obj):
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2) + "\n")


def read_json(path):
    check_exists(path, "params file")
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"params file {str(path)!r} is not valid JSON: {err}") from None
