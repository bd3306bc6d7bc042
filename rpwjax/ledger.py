"""The release ledger: what a secret's releases have spent on each input, across runs.

A release is private on its own; two releases of the same labels spend the
sum of their ε (basic composition), and only a record that outlives a run
can show that sum. Every ``rpwjax fit``, ``privatize`` and ``privatize-table``
appends one JSON line to a ledger file (and a pending line before its first
draw; see below): the release id, the time, the input
(its name, size and SHA-256 of its bytes), the label column, the rows and
row offset, the mechanism or pipeline, ε and δ, a digest of the settings,
and a fingerprint of the secret that reveals nothing about it
(:func:`rpwjax.keys.key_fingerprint`). A pipeline's release also stores its
account (:class:`rpwjax.accounting.Accounting`: the claimed ε and δ, which
are the line's, and each entry's purpose, ε, δ and rows; :func:`account_fields`).
No label, statistic or key material is written.

Which file (:func:`ledger_path`): ``--ledger FILE`` if given, else
``KEYFILE.ledger.jsonl`` beside the key file, else ``$RPWJAX_LEDGER``, else
``$XDG_DATA_HOME/rpwjax/ledger.jsonl`` (``~/.local/share/rpwjax/ledger.jsonl``).

Totals (:func:`summaries`) are per (input content, label column): the sum of
ε and δ over distinct release ids; a release reproduced with its own id, on
the same input, rows and settings, releases nothing new and counts once. A
run that failed after a private draw has a line marked ``"failed": true``
with what its draws spent (:mod:`rpwjax.release_run`); a release id counts at
the largest ε and δ of its lines.

Before its first private draw, a run appends a line marked ``"pending":
true`` with its claimed ε and δ and its ``run`` token, and its last line (the
release, or the failure's charge) carries the same token; a run that fails
with nothing of its draws left, or whose outputs could not be put in place
after its line, appends a line that withdraws its lines (append-only: a
crash meanwhile loses no other run's line). A pending line
that no later line of its run resolves is a run that was killed outright
(SIGKILL, the kernel's OOM killer, a crash) or is still running: it counts at
its claim, and over the rows it recorded (else its first row) for the
reuse refusal below.
:func:`read` leaves out the lines withdrawn and the pending lines already
resolved. A
release id reused on the same input with other settings or rows, or on other
input over rows it already covered, is refused: it would reuse randomness.

Appending is atomic and safe under concurrent runs: each check and append
holds an exclusive ``flock`` on the ledger file, and a record is one
``write`` of one line to a file opened for appending, flushed and synced.
Only an append creates the file (and its folder): the check before any work
reads a ledger that does not exist yet as empty, so a run that fails or is
refused leaves no ledger behind.

The ledger cannot see releases made elsewhere: with another key file or
ledger, on another machine, of a copy of the input whose bytes differ, or
through the Python API below :func:`commit`.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import math
import os
import time
from pathlib import Path

import numpy as np

from rpwjax.accounting import Accounting
from rpwjax.errors import InputError
from rpwjax.io.atomic import uncreatable
from rpwjax.keys import canonical_json

LEDGER_ENV = "RPWJAX_LEDGER"
LEDGER_SUFFIX = ".ledger.jsonl"
FORMAT_VERSION = 1
_LOCK_TRIES = 20  # a lock that is not waited for is tried this often a second (a stopping run must not wait on itself)


def ledger_path(ledger=None, key_file=None) -> Path:
    """The ledger file of a run (see the module docstring for the order)."""
    if ledger is not None:
        return Path(ledger)
    if key_file is not None:
        return Path(str(key_file) + LEDGER_SUFFIX)
    env = os.environ.get(LEDGER_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "rpwjax" / "ledger.jsonl"


def file_sha256(path, what: str = "input file") -> str:
    """SHA-256 (hex) of a file's bytes."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        raise InputError(f"{what} {str(p)!r} not found") from None
    except IsADirectoryError:
        raise InputError(f"{what} {str(p)!r} is a directory: give a file") from None
    except OSError as err:
        raise InputError(f"{what} {str(p)!r} cannot be read ({err.strerror or err})") from None


def input_record(path, what: str = "input file") -> dict:
    """Name, absolute path, size and SHA-256 of an input file's bytes (how the ledger knows an input again)."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{what} {str(p)!r} is a directory: give a file")
    if not p.is_file():
        raise InputError(f"{what} not found: {str(p)!r}")
    digest = file_sha256(p, what)
    return {"name": p.name, "path": str(p.resolve()), "size": p.stat().st_size, "sha256": digest}


def settings_digest(settings: dict) -> str:
    """SHA-256 of a release's settings (mechanism or pipeline, options, parameters), canonical JSON."""
    return hashlib.sha256(canonical_json(settings).encode()).hexdigest()


def new_record(*, release_id: str, command: str, input: dict, label_column, rows, row_offset: int,
               epsilon: float, delta: float, settings: dict, key_fingerprint: str, reproducible_seed: bool,
               **extra) -> dict:
    """One ledger line (``rows`` may be None before the input is read: the pre-check does not need it)."""
    return {
        "format_version": FORMAT_VERSION,
        "release_id": release_id,
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "input": input,
        "label_column": label_column,
        "rows": None if rows is None else int(rows),
        "row_offset": int(row_offset),
        "epsilon": float(epsilon),
        "delta": float(delta),
        "settings": settings_digest(settings),
        "key_fingerprint": key_fingerprint,
        "reproducible_seed": bool(reproducible_seed),
        **extra,
    }


def account_fields(record: dict, accounting: dict) -> dict:
    """The ledger's copy of a release's serialized account (:meth:`rpwjax.accounting.Accounting.to_json`): its
    totals, rows and entries (no sensitivity or noise text). Refused (RuntimeError) unless the account claims
    the ε and δ of the ledger ``record``, which the totals add up."""
    account = Accounting.from_json(accounting)
    if (account.epsilon, account.delta) != (float(record["epsilon"]), float(record["delta"])):
        raise RuntimeError(f"the release's account claims epsilon {account.epsilon:g}, delta {account.delta:g}; "
                           f"the ledger line {record['epsilon']:g}, {record['delta']:g}")
    return {"epsilon": account.epsilon, "delta": account.delta, "rows": account.rows,
            "spends": [{k: v for k, v in s.to_json().items() if k not in ("sensitivity", "mechanism")}
                       for s in account.spends]}


def _group(record) -> tuple:
    return (record["input"]["sha256"], record["label_column"])


def _partial(record: dict) -> bool:
    """Whether a line is not a release that left the program: a failed run's charge, or a pending line."""
    return bool(record.get("failed") or record.get("pending"))


def _same_release(a: dict, b: dict) -> bool:
    """Whether two lines are one release (the same randomness on the same labels). A failed run's line charges
    what it drew, less than the claim, and a pending line precedes the ε a fit settles: they match their
    release at any ε."""
    keys = ("command", "label_column", "row_offset", "settings", "key_fingerprint")
    keys += () if _partial(a) or _partial(b) else ("epsilon",)
    return all(a[k] == b[k] for k in keys) and a["input"]["sha256"] == b["input"]["sha256"] and (
        a["rows"] is None or b["rows"] is None or a["rows"] == b["rows"])


class ReleasedDigest:
    """SHA-256 of released values as float64, fed in row order (chunk by chunk): the ledger's check that a
    reproduction released the same values (:func:`commit`). The values leave the program
    anyway, so their digest tells nothing more."""

    def __init__(self):
        self._hash = hashlib.sha256()

    def update(self, values) -> None:
        self._hash.update(np.ascontiguousarray(np.asarray(values, dtype="<f8")).tobytes())

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    @classmethod
    def of(cls, values) -> str:
        digest = cls()
        digest.update(values)
        return digest.hexdigest()


def _check_same_output(earlier: dict, record: dict):
    """A reproduction must release what the recorded release did: both records' ``released_sha256`` (the
    digest of the released values, when both have one) must agree. Otherwise the same id, key, input and
    settings gave other values (the input was read otherwise, or the program changed), and those values came
    from the same randomness as the recorded ones: refused, so the two never both leave the program."""
    a, b = earlier.get("released_sha256"), record.get("released_sha256")
    if a is not None and b is not None and a != b:
        raise InputError(
            f"release id {record['release_id']} was recorded ({earlier['command']} at {earlier['time']}) with other "
            "released values: the same id, key, input and settings gave other "
            "labels (the input was read differently or the program changed), so this is no reproduction, and it "
            "would release with the same randomness; nothing was written. Drop --release-id for a new release")


def _covered(record: dict) -> int | None:
    """The rows a line covers from its offset: its rows (a pending line's: those its run read before its first
    draw); a pending line that does not know them (a streamed release that may have put out some rows before
    it was killed), its first row; None before the rows are known (the pre-check)."""
    if record["rows"] is None:
        return 1 if record.get("pending") else None
    return record["rows"]


def _overlap(a: dict, b: dict) -> bool:
    rows_a, rows_b = _covered(a), _covered(b)
    if rows_a is None or rows_b is None:
        return False  # rows not read yet (the pre-check): the commit, which knows them, decides
    return a["row_offset"] < b["row_offset"] + rows_b and b["row_offset"] < a["row_offset"] + rows_a


def _is_record(value) -> bool:
    """Whether a parsed line looks like a ledger record (:func:`new_record`)."""
    return (isinstance(value, dict) and "format_version" in value and "release_id" in value
            and isinstance(value.get("input"), dict) and "sha256" in value["input"])


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _record_problem(record: dict) -> str | None:
    """What makes a line that looks like a ledger record unusable (None if nothing): every field the totals,
    the budget and the reproduction check read must be there with its type; ε and δ finite and >= 0 (a nan
    would pass every --budget, a negative value lower the total)."""
    for key in ("epsilon", "delta"):
        value = record.get(key)
        if not (_number(value) and math.isfinite(value) and value >= 0):
            return f"{key} must be a finite number >= 0, got {key}={value!r}"
    for key in ("release_id", "command", "time", "settings", "key_fingerprint"):
        if not isinstance(record.get(key), str):
            return f"{key} must be a string, got {key}={record.get(key)!r}"
    if "label_column" not in record or not (record["label_column"] is None or isinstance(record["label_column"], str)):
        return f"label_column must be a string or null, got label_column={record.get('label_column')!r}"
    if not (isinstance(record["input"].get("sha256"), str) and isinstance(record["input"].get("name"), str)):
        return "input must have a name and a sha256"
    offset, rows = record.get("row_offset"), record.get("rows")
    if not (isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0):
        return f"row_offset must be an integer >= 0, got row_offset={offset!r}"
    if not (rows is None or (isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0)):
        return f"rows must be an integer >= 0, got rows={rows!r}"
    for key in ("failed", "pending", "withdrawn"):
        if not isinstance(record.get(key, False), bool):
            return f"{key} must be true or false, got {key}={record.get(key)!r}"
    needs_run = record.get("pending") or record.get("withdrawn")
    if not isinstance(record.get("run", ""), str) or (needs_run and not record.get("run")):
        return f"run must be a string (a pending or withdrawing line's is required), got run={record.get('run')!r}"
    return None


def resolved(records) -> list[dict]:
    """``records`` less the lines a later line of their run withdraws (:func:`withdraw`), the withdrawing
    lines themselves, and the pending lines that a later line of their run (its release, or its failure's
    charge) resolves."""
    kept = []
    for r in records:
        if r.get("withdrawn"):
            kept = [q for q in kept if q.get("run") != r["run"]]
        else:
            kept.append(r)
    ended = {r["run"] for r in kept if r.get("run") and not r.get("pending")}
    return [r for r in kept if not (r.get("pending") and r["run"] in ended)]


def read(path, *, every_line: bool = False) -> list[dict]:
    """The records of a ledger file (none if it does not exist), less the lines withdrawn and the pending lines
    already resolved (:func:`resolved`; ``every_line``: all of them); a damaged line is an error naming it, and
    a file whose first line is no ledger record (another file given as the ledger) is refused as no ledger."""
    p = Path(path)
    if not p.exists():
        return []
    if p.is_dir():
        raise InputError(f"ledger {str(p)!r} is a directory: give a file name")
    out = []
    try:
        f = open(p, "rb")
    except FileNotFoundError:  # removed since the check above
        return []
    except OSError as err:
        raise InputError(f"ledger {str(p)!r} cannot be read ({err.strerror or err})") from None
    with f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                record = None
            if _is_record(record):
                problem = _record_problem(record)
                if problem is not None:
                    raise InputError(f"ledger {str(p)!r} line {number} is damaged: {problem}; repair or move it "
                                     "(its totals and --budget cannot be trusted)")
                out.append(record)
                continue
            if not out:
                raise InputError(f"ledger {str(p)!r} is not an rpwjax ledger: its first line is not a ledger record "
                                 "(a JSON line of a release); give another --ledger FILE, or a new name for a new "
                                 "ledger")
            raise InputError(f"ledger {str(p)!r} line {number} is not a ledger record: the ledger is damaged; "
                             "repair or move it")
    return out if every_line else resolved(out)


def summaries(records) -> list[dict]:
    """One summary per (input content, label column): its releases and the totals under basic composition.

    The lines of one release id are one release (a reproduction releases nothing new); it counts at the
    largest ε and δ of its lines (a failed run's line charges its draws, its rerun under that id the claim; a
    pending line not resolved, its claim). Pending lines already resolved are left out."""
    groups: dict[tuple, dict] = {}
    for r in resolved(records):
        g = groups.setdefault(_group(r), {"input": r["input"]["name"], "input_sha256": r["input"]["sha256"],
                                          "label_column": r["label_column"], "releases": [],
                                          "epsilon_total": 0.0, "delta_total": 0.0})
        entry = {k: r[k] for k in ("release_id", "time", "command", "epsilon", "delta", "rows", "row_offset")
                 if k in r} | {"name": r["input"]["name"], "mechanism": r.get("mechanism") or r.get("pipeline"),
                               "failed": bool(r.get("failed")), "pending": bool(r.get("pending"))}
        same = next((q for q in g["releases"] if q["release_id"] == r["release_id"]), None)
        if same is None:
            g["releases"].append(entry)
        else:  # shown as its first line that left the program, else as its line of the largest ε; counted at
            # the largest ε and δ of its lines
            partial = lambda q: q["failed"] or q["pending"]  # noqa: E731
            if partial(same) and (not partial(entry) or entry["epsilon"] > same["epsilon"]):
                shown = entry
            else:
                shown = dict(same)
            same.update(shown, epsilon=max(same["epsilon"], entry["epsilon"]),
                        delta=max(same["delta"], entry["delta"]))
    for g in groups.values():
        g["epsilon_total"] = float(sum(float(q["epsilon"]) for q in g["releases"]))
        g["delta_total"] = float(sum(float(q["delta"]) for q in g["releases"]))
    return list(groups.values())


def _check(records, record, budget) -> dict:
    """The running total with ``record`` added; InputError if it reuses a release id or passes ``budget``. The
    run's own pending line (its ``run`` token) is not counted: ``record`` resolves it."""
    if record.get("run"):
        records = [r for r in records if not (r.get("pending") and r.get("run") == record["run"])]
    rid = record["release_id"]
    reproduced = False
    for r in records:
        if r["release_id"] != rid:
            continue
        if _same_release(r, record):
            _check_same_output(r, record)
            reproduced = True
            continue
        same_input = _group(r) == _group(record)
        if same_input or _overlap(r, record):
            what = "the same input with other settings, rows or key" if same_input else \
                f"rows {r['row_offset']} .. {r['row_offset'] + (r['rows'] or 1) - 1} of {r['input']['name']!r}"
            raise InputError(
                f"release id {rid} was already used for {what} ({r['command']} at {r['time']}): reusing it would "
                "release with the same randomness. Give --release-id only to reproduce that release exactly or for "
                "another shard (other rows) of it; drop --release-id for a new release")
    group = [r for r in records if _group(r) == _group(record)]
    before = summaries(group)[0] if group else None
    after = summaries(group + [record])[0]
    total, delta_total = after["epsilon_total"], after["delta_total"]
    spent = total - (before["epsilon_total"] if before else 0.0)
    if budget is not None and total > float(budget) * (1 + 1e-12):
        raise InputError(
            f"--budget {float(budget):g}: this release (epsilon {spent:g}) would take input "
            f"{input_name(record)[6:]} to a total epsilon of {total:g} "
            f"(already spent {total - spent:g} in {len(before['releases']) if before else 0} releases); nothing was "
            "written")
    # a reproduction adds nothing; the rerun of a failed run under its id adds what the failed line did not charge
    return {"previous_releases": len(before["releases"]) if before else 0, "releases": len(after["releases"]),
            "epsilon_total": total, "delta_total": delta_total,
            "reproduced": reproduced and spent <= 0 and delta_total <= (before["delta_total"] if before else 0.0)}


def check_budget(budget):
    """``budget`` as a positive float (or None)."""
    if budget is None:
        return None
    b = float(budget)
    if not b > 0 or b != b or b == float("inf"):
        raise InputError(f"--budget must be a positive finite epsilon, got --budget={budget!r}")
    return b


def _cannot_open(path: Path, err) -> InputError:
    return InputError(f"ledger {str(path)!r} cannot be opened ({getattr(err, 'strerror', None) or err}): give a "
                      "writable --ledger FILE")


@contextlib.contextmanager
def _locked(path: Path, *, create: bool = True, wait: bool = True, patience: float = 1.0):
    """The ledger file opened for appending and locked (``flock``, exclusive) for the block; the fd, or None when
    the file does not exist and not ``create`` (then nothing is created: no file, no folder). Without ``wait``,
    a lock held elsewhere for more than ``patience`` seconds is an :class:`InputError`."""
    if path.is_dir():
        raise InputError(f"ledger {str(path)!r} is a directory: give a file name")
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError as err:
        if create:
            raise _cannot_open(path, err) from None
        _check_creatable(path)
        yield None
        return
    except OSError as err:
        raise _cannot_open(path, err) from None
    try:
        tries = 1 if wait else max(1, int(patience * _LOCK_TRIES))
        for _ in range(tries):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                time.sleep(1.0 / _LOCK_TRIES)
        else:
            raise InputError(f"ledger {str(path)!r} stayed locked (by another run, or by this one when it was "
                             f"stopped) for {patience:g} s")
        if not _still_there(fd, path):  # removed while we waited (withdraw removed a ledger of one run): reopen
            os.close(fd)
            fd = None
            with _locked(path, create=create, wait=wait, patience=patience) as again:
                yield again
            return
        yield fd
    finally:
        if fd is not None:
            os.close(fd)  # closing releases the lock


def _still_there(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open at ``fd`` (:func:`withdraw` removes a ledger that held one run
    only)."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    there = os.fstat(fd)
    return (here.st_ino, here.st_dev) == (there.st_ino, there.st_dev)


def _check_creatable(path: Path):
    """Refuse a ledger that :func:`commit` could not create, without creating anything."""
    problem = uncreatable(path)
    if problem:
        raise _cannot_open(path, problem)


def check_known_release(path, release_id: str) -> None:
    """Refuse a release id given back that ``path``'s ledger never recorded, unless the run says which rows it
    covers (``privatize --row-offset``, the caller's to check): two runs under one id at the same rows draw the
    same noise, and only a ledger that saw both can refuse the second (e.g. a shard privatized on another
    machine that forgot its offset, whose output minus the first shard's would be the labels' difference)."""
    path = Path(path)
    with _locked(path, create=False) as fd:
        records = [] if fd is None else read(path)
    if any(r["release_id"] == release_id for r in records):
        return
    raise InputError(
        f"release id {release_id} is not in the ledger {str(path)!r}: give an id back only to reproduce a release "
        "this ledger recorded (--ledger FILE: the ledger that did), or, with privatize, for another shard of it with "
        "--row-offset N, the global index of the shard's first row. Shards must cover disjoint rows: two at the "
        "same rows draw the same noise, and the difference of their outputs would reveal the difference of their "
        "labels. Drop --release-id for a new release; nothing was written")


def precheck(path, record: dict, budget=None) -> dict:
    """Before any work: refuse a release the ledger would refuse (reused id, budget). Writes nothing: a ledger
    that does not exist yet reads as empty and is not created (only :func:`commit` creates it)."""
    path = Path(path)
    with _locked(path, create=False) as fd:
        return _check([] if fd is None else read(path), record, budget)


def commit(path, record: dict, budget=None, *, wait: bool = True, patience: float = 1.0) -> dict:
    """Check again and append ``record``, holding the ledger's lock (concurrent runs see each other). The
    status's ``line`` is the appended line. ``wait``, ``patience``: see :func:`_locked`."""
    path = Path(path)
    line = (json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode()
    with _locked(path, wait=wait, patience=patience) as fd:
        status = _check(read(path), record, budget)
        os.write(fd, line)
        os.fsync(fd)
    return dict(status, line=line)


def withdraw(path, record: dict, *, created: bool = False, wait: bool = True, patience: float = 1.0):
    """Append a line that withdraws every earlier line of ``record``'s run (its ``run`` token): a release
    whose outputs could not be put in place after all, or a pending line of a run that failed with nothing of
    its draws left. The ledger records only releases that left the program, and stays append-only: a stop or
    a crash meanwhile loses no other run's line. A ledger this run ``created`` that holds nothing but its own
    lines is removed instead (a failed run leaves no new file; runs waiting on its lock open the path again,
    :func:`_locked`). ``wait``, ``patience``: see :func:`_locked`."""
    path = Path(path)
    line = dict(record, epsilon=0.0, delta=0.0, rows=None, withdrawn=True)
    for key in ("pending", "failed", "accounting", "released_sha256"):
        line.pop(key, None)
    data = (json.dumps(line, sort_keys=True, allow_nan=False) + "\n").encode()
    with _locked(path, create=False, wait=wait, patience=patience) as fd:
        if fd is None:
            return
        if created and path.is_file() and not path.is_symlink() and all(
                r.get("run") == record["run"] for r in read(path, every_line=True)):
            os.unlink(path)
            return
        os.write(fd, data)
        os.fsync(fd)


def input_name(record) -> str:
    column = "" if record["label_column"] is None else f" (label {record['label_column']!r})"
    return f"input {record['input']['name']!r}{column}"


def status_line(path, record: dict, status: dict) -> str | None:
    """The line a release prints when it adds to an input already in the ledger (None otherwise)."""
    if status["reproduced"]:
        return (f"ledger {str(path)}: release {record['release_id']} reproduced; {input_name(record)} stays at "
                f"epsilon {status['epsilon_total']:g}")
    if not status["previous_releases"] or (not record["epsilon"] and not record["delta"]):
        return None
    return (f"ledger {str(path)}: {input_name(record)} has now spent "
            f"epsilon {status['epsilon_total']:g}"
            + (f", delta {status['delta_total']:g}" if status["delta_total"] else "")
            + f" in {status['releases']} releases (basic composition)")


def report_lines(ledger=None, key_file=None, *, as_json: bool = False) -> list[str]:
    """Each (input, label column) of a ledger: its releases and the total epsilon and delta, as lines to print
    (``as_json``: one JSON object per line)."""
    if key_file is not None and ledger is not None:
        raise InputError("give either --key-file (its ledger lies beside it) or --ledger FILE, not both")
    path = ledger_path(ledger, key_file)
    if not path.exists():
        raise InputError(f"ledger {str(path)!r} does not exist: no release has been recorded there")
    groups = summaries(read(path))
    if as_json:
        return [json.dumps(g, sort_keys=True) for g in groups]
    lines = [f"ledger {path}: {len(groups)} inputs"]
    for g in groups:
        delta = f", delta {g['delta_total']:g}" if g["delta_total"] else ""
        lines.append(f"\n{g['input']} (label {g['label_column']!r}, sha256 {g['input_sha256'][:12]}...): "
                     f"epsilon {g['epsilon_total']:g}{delta} in {len(g['releases'])} releases (basic composition)")
        for r in g["releases"]:
            lines.append(f"  {r['time']}  {r['command']:<15} {r['mechanism'] or '':<12} epsilon {r['epsilon']:<8g} "
                         f"rows {r['rows']} from {r['row_offset']}  release {r['release_id']}"
                         + ("  (failed after private draws: charged what they spent)" if r["failed"] else "")
                         + ("  (did not finish, or still running: charged its claim)" if r["pending"] else ""))
    return lines
