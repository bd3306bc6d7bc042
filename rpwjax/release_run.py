"""One release of a command: the secret bound to it, and its ledger record, charged even when the run fails.

:class:`ReleaseRun` is what the commands share: the secret bound to the
release (:func:`bind_release`), the ledger record (:mod:`rpwjax.ledger`),
checked before any work and appended just before the outputs appear. A run
that fails (an error, or SIGINT/SIGTERM) after a private draw that later work
reads (a statistic, a histogram, a pipeline's first release) is charged what
its draws spent (:meth:`ReleaseRun.charged`): its error, its message and the
progress shown so far can depend on what it drew. Before its first draw the
run writes a pending line with its claim, so that a run killed outright
afterwards (its statistics shown, or a part file of released labels left on
disk) is charged too.
"""

from __future__ import annotations

import contextlib
import secrets
import warnings

from rpwjax import draws, interrupts, ledger
from rpwjax.errors import InputError
from rpwjax.keys import Secret, canonical_json, check_release_id, check_secret, default_release_id, key_fingerprint


def bind_release(secret: Secret, release_id=None, **identity) -> Secret:
    """``secret`` bound to one release: ``release_id`` (default :func:`default_release_id`) and ``identity``.

    A secret already bound (by a caller that made the release) is returned as
    it is; giving it another release id is an error.
    """
    check_secret(secret)
    if secret.release_id is not None:
        if release_id is not None and check_release_id(release_id) != secret.release_id:
            raise InputError(f"the secret is already bound to release {secret.release_id}, got release_id={release_id!r}")
        return secret
    rid = default_release_id(secret) if release_id is None else check_release_id(release_id)
    return secret.for_release(rid, **identity)



CHARGE_PATIENCE = 10.0  # seconds a failed run waits for a ledger another run holds, signals waiting meanwhile


class ReleaseRun:
    """One release of a command: the secret bound to it, and its ledger record.

    Bind first (``secret`` is what every draw of the release derives from),
    then ``start(epsilon, delta)`` once the release's privacy cost is known
    and before anything is written: it checks the ledger (a reused release
    id, a ``budget`` the release would pass). ``finish(rows)`` checks again
    and appends the record, holding the ledger's lock, just before the
    outputs appear; it returns the fields the sidecar gets, and sets ``line``,
    the line to print (None when the input is new to the ledger).
    """

    def __init__(self, *, secret: Secret, command: str, input_path, label_column, settings: dict,
                 release_id=None, row_offset: int = 0, ledger_file=None, key_file=None, budget=None,
                 what: str = "input file", identity_settings="same", row_offset_given: bool = False, report=None):
        self.root = check_secret(secret)
        self.report = report  # prints a line (the command line's stderr); None: warnings
        if self.root.release_id is not None:
            raise InputError("a command's release starts from the unbound secret (a key file or OS entropy)")
        self.budget = ledger.check_budget(budget)
        # the release's identity: a --params release keys on the parameters alone (release() adds their digest),
        # as release_file and the Dask path do, so the three give the same labels for one release id
        identity = dict(command=command, label_column=label_column,
                        settings=settings if identity_settings == "same" else identity_settings)
        source = ledger.input_record(input_path, what)
        if release_id is None and self.root.reproducible:
            # an integer seed (experiments) reproduces a run: its id follows from the seed, the input and the settings
            release_id = self.root.digest("release-id/" + canonical_json(dict(identity, input=source["sha256"],
                                                                               row_offset=row_offset)))[:16].hex()
        self.secret = bind_release(self.root, release_id, **identity)
        self.ledger = ledger.ledger_path(ledger_file, key_file)
        if release_id is not None and not self.root.reproducible and not row_offset_given:
            ledger.check_known_release(self.ledger, self.secret.release_id)
        self._fields = dict(identity, settings=settings, input=source, row_offset=row_offset)
        self.record = None
        self.line = None
        self._hold = None  # the ExitStack of recording(), while its block runs
        self._appended = None  # the ledger line finish() appended, until the outputs are in place
        self._charge_line = None  # once a failed run's line is appended (charged()): the line that says so
        self._said = False  # ... printed
        self._pending = None  # the pending line, once appended before the run's first draw
        self._created = False  # whether the pending line created the ledger file
        self._expected_rows = None  # the rows the release will cover, when read before its first draw
        self.run_token = secrets.token_hex(8)  # ties the run's lines together (a pending line to its last)

    @property
    def release_id(self) -> str:
        return self.secret.release_id

    def fit_secret(self) -> Secret:
        """The secret of a fit of this run's own labels (its private histogram).

        Keyed by the rows the fit reads: the first shard of a release (row offset 0) fits from
        ``secret.child("fit")``; another shard (``--row-offset``) from a key of its offset and its
        input's SHA-256 too. So shards of one release never share histogram noise (their difference
        would cancel it), and a reproduction, the same input at the same offset, refits with the same."""
        offset = int(self._fields["row_offset"])
        if offset == 0:
            return self.secret.child("fit")
        return self.secret.child("fit", offset, int(self._fields["input"]["sha256"][:16], 16))

    @contextlib.contextmanager
    def recording(self):
        """The block that writes the release's outputs and calls :meth:`finish` just before they appear.

        From the ledger append in :meth:`finish` to the end of the block a SIGINT or SIGTERM waits (it then
        ends the run with the outputs and the record both in place), and an error after the append (an
        output that cannot be renamed into place) withdraws the record again (:func:`rpwjax.ledger.withdraw`):
        the ledger records only releases that left the program."""
        with contextlib.ExitStack() as stack:
            self._hold = stack
            try:
                yield self
            except BaseException:
                if self._appended is not None:
                    # the error that stopped the outputs is the one to report; a ledger that cannot be appended to
                    # keeps the line (it then counts a release that did not leave: the total stays an upper bound)
                    with contextlib.suppress(OSError, InputError):
                        ledger.withdraw(self.ledger, self.record, created=self._created)
                        self._pending = None  # withdrawn with the record: the run's lines go together
                    self._appended = None
                raise
            finally:
                self._hold = None

    @contextlib.contextmanager
    def charged(self):
        """The block of the run's private work (from its first label read to its outputs in place).

        A run that ends inside it by an error or a signal after a private draw that later work reads
        (:func:`rpwjax.draws.read_later`), with no line of its own left in the ledger, is charged: a line marked
        ``"failed": true`` with the ε and δ its draws spent (:func:`rpwjax.draws.spent`, the ε at most what
        :meth:`start` claimed) and no rows, and one line says so. Its rerun under the same release id (the
        same draws) counts once, at the larger ε. No budget refuses the line: the draws were made (a
        ``--budget`` refusal comes before any draw, from :meth:`start` or the pending line; one at the final
        append, after a concurrent run, is charged like any failure).

        A run killed outright (SIGKILL, the kernel's OOM killer, a crash) runs nothing afterwards: so before
        its first draw, the run appends a pending line (:meth:`_write_pending`) with its claim, which its last
        line (the release, or the failure's charge) resolves; a failure that is not charged withdraws it
        (:func:`rpwjax.ledger.withdraw`). One the run never resolved counts at the claim (:mod:`rpwjax.ledger`)."""
        with draws.collecting(first_read=self._write_pending) as made:
            take_off = interrupts.on_stop(lambda: self._charge_failure(made, stopping=True))
            try:
                yield self
            except BaseException:
                line = self._charge_failure(made)
                if line:
                    self._said = True
                    self._say(line)
                raise
            finally:
                take_off()

    def _say(self, line: str):
        if self.report is not None:
            self.report(line)
        else:
            warnings.warn(line, RuntimeWarning, stacklevel=4)

    def _charge_failure(self, made: dict, stopping: bool = False) -> str | None:
        """Append the failed run's line (see :meth:`charged`); the line to print, or None when nothing is charged.
        A stopping run (``stopping``) does not wait on the ledger's lock, which its own thread may hold; a stop
        that comes while the line is written waits for it, and then prints the line that says so."""
        if self._charge_line is not None:
            return None if self._said else self._charge_line
        if self._appended is not None:
            return None  # the release is in
        if not draws.read_later(made):  # nothing drawn that the failure could reflect, nor left (its outputs are gone)
            if self._pending is not None:
                with contextlib.suppress(OSError, InputError):  # a pending line left in overcharges, never under
                    ledger.withdraw(self.ledger, self.record, created=self._created, wait=False,
                                    patience=1.0 if stopping else CHARGE_PATIENCE)
                self._pending = None
            return None
        claim = None if self.record is None else self.record["epsilon"]
        epsilon, delta = draws.spent(made, claim)
        base = self.record or ledger.new_record(release_id=self.release_id, rows=None, epsilon=0.0, delta=0.0,
                                                key_fingerprint=key_fingerprint(self.root),
                                                reproducible_seed=self.root.reproducible, run=self.run_token,
                                                **self._fields)
        record = dict(base, rows=None, epsilon=epsilon, delta=delta, failed=True)
        record.pop("accounting", None)
        record.pop("released_sha256", None)
        record.pop("pending", None)
        def append():
            status = ledger.commit(self.ledger, record, wait=False, patience=1.0 if stopping else CHARGE_PATIENCE)
            self._charge_line = (
                f"ledger {str(self.ledger)}: this run failed after drawing private values, which its failure can "
                f"reflect: charged epsilon {epsilon:g}" + (f", delta {delta:g}" if delta else "")
                + f" (release {self.release_id}); {ledger.input_name(record)} has now spent epsilon "
                f"{status['epsilon_total']:g} in {status['releases']} releases (basic composition)")

        try:
            if stopping:  # on the stopping thread, maybe inside the main thread's own ledger lock: a second at most
                append()
            else:  # a signal meanwhile waits until the line is in (interrupts.held), then stops the run
                with interrupts.held():
                    append()
        except (OSError, InputError) as err:
            if self._pending is not None:  # its pending line stays: the run counts at its claim, no less
                return (f"warning: ledger {str(self.ledger)}: this run failed after drawing private values (epsilon "
                        f"{epsilon:g}), and its line could not be written ({err}); its pending line charges it the "
                        f"claim, epsilon {self.record['epsilon']:g} (release {self.release_id})")
            return (f"warning: ledger {str(self.ledger)}: this run failed after drawing private values (epsilon "
                    f"{epsilon:g}) and could not be charged ({err}); add it to the input's total yourself")
        return self._charge_line

    def expect_rows(self, rows: int):
        """The rows the release will cover, known before its first draw (the labels read first): its pending
        line records them, so that a killed run's id is refused over all of them on other input. A release
        that streams its file (``privatize --params``) does not know them: its pending line holds its first
        row only."""
        self._expected_rows = int(rows)

    def _write_pending(self) -> bool:
        """Append the pending line (the claim, the rows when known (:meth:`expect_rows`), ``"pending": true``)
        before the run's first draw
        (:func:`rpwjax.draws.collecting`); True once it is in (False before :meth:`start`, when the claim is
        not known: a draw then, on another thread of the process, is another run's). It is checked like the
        release (a reused id, ``--budget``, which a concurrent run may have moved since :meth:`start`): a
        refusal stops the run before that draw. A signal meanwhile waits until the line is in; a ledger that
        another run holds for longer than ``CHARGE_PATIENCE`` is an error (nothing drawn)."""
        if self._pending is not None:
            return True
        if self.record is None:
            return False
        record = dict(self.record, rows=self._expected_rows, pending=True)
        for key in ("accounting", "released_sha256"):
            record.pop(key, None)
        with interrupts.held():
            created = not self.ledger.exists()
            self._pending = ledger.commit(self.ledger, record, self.budget, wait=False,
                                          patience=CHARGE_PATIENCE)["line"]
            self._created = created
        return True

    def start(self, epsilon: float, delta: float = 0.0, **extra) -> "ReleaseRun":
        self.record = ledger.new_record(release_id=self.release_id, rows=None, epsilon=epsilon, delta=delta,
                                        key_fingerprint=key_fingerprint(self.root),
                                        reproducible_seed=self.root.reproducible, run=self.run_token,
                                        **self._fields, **extra)
        ledger.precheck(self.ledger, self.record, self.budget)
        return self

    def finish(self, rows: int, accounting: dict | None = None, released_sha256: str | None = None) -> dict:
        """Commit the record for ``rows``; ``accounting`` (a serialized :class:`rpwjax.accounting.Accounting`,
        e.g. a pipeline's record) goes into it (:func:`rpwjax.ledger.account_fields`). ``released_sha256``, the
        digest of what the release put out (:class:`rpwjax.ledger.ReleasedDigest`), lets the ledger refuse a claimed
        reproduction that released other values."""
        self.record.update(rows=int(rows))
        if released_sha256 is not None:
            self.record["released_sha256"] = str(released_sha256)
        if accounting is not None:
            self.record["accounting"] = ledger.account_fields(self.record, accounting)
        if self._hold is not None:  # from the append until the outputs are in place, a signal waits
            self._hold.enter_context(interrupts.held())
        status = ledger.commit(self.ledger, self.record, self.budget)
        self._appended = status["line"]
        self.line = ledger.status_line(self.ledger, self.record, status)
        fields = {"release_id": self.release_id, "row_offset": self.record["row_offset"], "rows": int(rows),
                  "ledger": {"file": str(self.ledger), "epsilon_total_on_input": status["epsilon_total"],
                             "delta_total_on_input": status["delta_total"],
                             "releases_of_input": status["releases"]}}
        return fields
