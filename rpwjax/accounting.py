"""One privacy account per release: every private statistic and every label release it makes, as entries.

An :class:`Accounting` is opened for ``rows`` labels with the release's claimed total (ε, δ). Each private
statistic and each release appends one frozen :class:`Spend`: its purpose, ε, δ, the rows whose labels it
reads, its sensitivity and its noise. The rows are all of them, or the rows in one part of a named public
partition (a cell, a centre group, one part of a split; :meth:`Accounting.partition` holds the part of
every row), or an intersection of such parts: entries over disjoint parts compose in parallel. A row's ε is
the sum of the ε of the entries that read it (basic sequential composition), δ likewise
(:meth:`Accounting.per_row`); the release is (ε, δ)-label-DP when every row's sums stay within the claim,
which :meth:`Accounting.spend` enforces as entries arrive.

:meth:`Accounting.within` gives a view on one part: what a function records through it reads only that
part's rows, and a partition it defines is over that part's rows. The serialized account
(:meth:`Accounting.to_json`) keeps the claimed totals under ``epsilon`` and ``delta``, the entries under
``spends``, and each partition's part sizes and the part of every row (compressed, :func:`pack_parts`),
so that every row's ε can be computed from the serialized account alone (:meth:`Accounting.from_json`).
A partition is a function of the public features only: writing it reveals no label.
"""

from __future__ import annotations

import base64
import dataclasses
import math
import zlib

import numpy as np

from .errors import InputError

TOLERANCE = 1e-9  # relative slack on a row's sums against the claim (shares of ε are float products)


@dataclasses.dataclass(frozen=True)
class Spend:
    """One private statistic or release: what it is for, what it costs, whose labels it reads, and how."""

    purpose: str  # e.g. "linear-fit", "residual-histogram", "cell-mean", "release"
    epsilon: float
    delta: float
    rows: tuple = ()  # ((partition, part), ...): the rows in every one of these parts; () is every row
    sensitivity: str = ""  # of what the noise is added to, under replacing one label
    mechanism: str = ""  # the noise or mechanism

    def to_json(self) -> dict:
        return {"purpose": self.purpose, "epsilon": self.epsilon, "delta": self.delta,
                "rows": [{"partition": name, "part": part} for name, part in self.rows] or "all",
                "sensitivity": self.sensitivity, "mechanism": self.mechanism}

    @classmethod
    def from_json(cls, fields: dict) -> "Spend":
        rows = () if fields["rows"] == "all" else tuple((r["partition"], r["part"]) for r in fields["rows"])
        return cls(fields["purpose"], float(fields["epsilon"]), float(fields["delta"]), rows,
                   fields.get("sensitivity", ""), fields.get("mechanism", ""))


class Accounting:
    """The entries of one release over ``rows`` labels claimed (``epsilon``, ``delta``)-label-DP."""

    def __init__(self, rows: int, epsilon: float, delta: float = 0.0):
        self.rows, self.epsilon, self.delta = int(rows), float(epsilon), float(delta)
        self.spends: list[Spend] = []
        self.partitions: dict[str, np.ndarray | None] = {}  # name -> part of every row (None: read from JSON)
        self.part_sizes: dict[str, dict[int, int]] = {}
        self._where: tuple = ()  # a view's parts (see within)
        self._root = self
        self._running = None  # every row's (ε, δ) so far, kept as entries arrive (the check in spend)
        self._all_rows = (0.0, 0.0)  # the same while every entry reads every row: no array of one per row

    # -- views and partitions ----------------------------------------------------------------------------------
    def within(self, partition: str, part: int) -> "Accounting":
        """A view that records entries as reading only the rows in ``part`` of ``partition`` (and the view's own)."""
        if partition not in self._root.partitions:
            raise InputError(f"no partition {partition!r} in this account")
        view = object.__new__(Accounting)
        view.__dict__.update(self.__dict__)
        view._where = self._where + ((partition, int(part)),)
        return view

    def mask(self, where: tuple = None) -> np.ndarray:
        """Which rows lie in every part of ``where`` (default: this view's), a boolean array over all rows."""
        root = self._root
        inside = np.ones(root.rows, bool)
        for name, part in self._where if where is None else where:
            labels = root.partitions[name]
            if labels is None:
                raise InputError(f"partition {name!r} came from JSON without its rows: its rows are unknown")
            inside &= labels == part
        return inside

    def partition(self, name: str, parts) -> None:
        """Define the public partition ``name``: ``parts`` gives every row of this view its part (an integer >= 0).
        Rows outside the view get part -1."""
        root = self._root
        if name in root.partitions:
            raise InputError(f"partition {name!r} is defined already")
        parts = np.asarray(parts)
        if not np.issubdtype(parts.dtype, np.integer) or (parts.size and parts.min() < 0):
            raise InputError(f"a partition gives every row an integer part >= 0, got dtype {parts.dtype}")
        if self._where:
            inside = self.mask()
            if parts.shape != (int(inside.sum()),):
                raise InputError(f"partition {name!r} needs one part per row of the view, got shape {parts.shape}")
            full = np.full(root.rows, -1, parts.dtype if parts.dtype.kind == "i" else np.int64)
            full[inside] = parts
            parts = full
        elif parts.shape != (root.rows,):
            raise InputError(f"partition {name!r} needs one part per row, got shape {parts.shape}")
        root.partitions[name] = parts
        values, counts = np.unique(parts[parts >= 0], return_counts=True)
        root.part_sizes[name] = {int(v): int(c) for v, c in zip(values, counts)}

    # -- entries -----------------------------------------------------------------------------------------------
    def spend(self, purpose: str, epsilon: float, *, delta: float = 0.0, sensitivity: str = "",
              mechanism: str = "") -> Spend:
        """Record one private statistic or release reading this view's rows; refused where it would take a row
        past the claimed total."""
        epsilon, delta = float(epsilon), float(delta)
        if not (math.isfinite(epsilon) and epsilon >= 0 and 0 <= delta <= 1):
            raise InputError(f"a spend needs a finite epsilon >= 0 and a delta in [0, 1], got {epsilon!r}, {delta!r}")
        entry = Spend(purpose, epsilon, delta, self._where, sensitivity, mechanism)
        root = self._root
        if root._running is None and self._where:  # the first entry over a part: from here on, one sum per row
            root._running = np.tile(np.array([[root._all_rows[0]], [root._all_rows[1]]]), (1, root.rows))
        if root._running is None:  # every entry so far reads every row: one running sum stands for each row's
            after = None
            eps, dlt = root._all_rows[0] + epsilon, root._all_rows[1] + delta
        else:
            inside = self.mask() if self._where else slice(None)
            after = root._running[:, inside] + np.array([[epsilon], [delta]])
            eps, dlt = (float(v.max()) if v.size else 0.0 for v in after)
        if eps > root.epsilon * (1 + TOLERANCE) or dlt > root.delta * (1 + TOLERANCE):
            raise RuntimeError(f"{purpose} (epsilon {epsilon:g}, delta {delta:g}) would take a row to epsilon "
                               f"{eps:g}, delta {dlt:g}, past the claimed {root.epsilon:g}, {root.delta:g}")
        if after is None:
            root._all_rows = (eps, dlt)
        else:
            root._running[:, inside] = after
        root.spends.append(entry)
        return entry

    def per_row(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row's ε and δ: the sums over the entries that read it."""
        root = self._root
        eps, dlt = np.zeros(root.rows), np.zeros(root.rows)
        for s in root.spends:
            if s.rows:
                inside = self.mask(s.rows)
                eps[inside] += s.epsilon
                dlt[inside] += s.delta
            else:
                eps += s.epsilon
                dlt += s.delta
        return eps, dlt

    def most(self) -> tuple[float, float]:
        """The largest ε and δ any row has spent (0 for no rows)."""
        if self._root.rows == 0:
            return 0.0, 0.0
        eps, dlt = self.per_row()
        return float(eps.max()), float(dlt.max())

    def total(self, purpose: str | None = None) -> float:
        """The ε of every entry for ``purpose`` (every entry: None), summed: what one row pays for it when the
        entries read every row, the sum over the parts when they read disjoint parts."""
        return sum(s.epsilon for s in self._root.spends if purpose is None or s.purpose == purpose)

    # -- JSON ----------------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        root = self._root
        return {"epsilon": root.epsilon, "delta": root.delta, "rows": root.rows,
                "partitions": {name: {"parts": {str(k): v for k, v in sizes.items()},
                                      "rows": pack_parts(root.partitions[name])}
                               for name, sizes in root.part_sizes.items()},
                "spends": [s.to_json() for s in root.spends]}

    @classmethod
    def from_json(cls, fields: dict) -> "Accounting":
        """The account of a record or sidecar (a partition stored without its rows has them unknown)."""
        out = cls(fields["rows"], fields["epsilon"], fields.get("delta", 0.0))
        for name, part in fields.get("partitions", {}).items():
            out.partitions[name] = unpack_parts(part["rows"], out.rows) if part.get("rows") is not None else None
            out.part_sizes[name] = {int(k): int(v) for k, v in part["parts"].items()}
        out.spends = [Spend.from_json(s) for s in fields.get("spends", [])]
        return out


def pack_parts(parts) -> str | None:
    """A partition's part of every row as text: the smallest signed integer type that holds them, little
    endian, zlib-compressed, base64 (None for no partition)."""
    if parts is None:
        return None
    parts = np.asarray(parts)
    kind = next(t for t in (np.int8, np.int16, np.int32, np.int64)
                if parts.size == 0 or np.iinfo(t).max >= parts.max())
    raw = parts.astype(np.dtype(kind).newbyteorder("<")).tobytes()
    return f"{np.dtype(kind).name}:" + base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def unpack_parts(text: str, rows: int) -> np.ndarray:
    """:func:`pack_parts` undone: one part per row (int64)."""
    kind, _, data = text.partition(":")
    parts = np.frombuffer(zlib.decompress(base64.b64decode(data)), np.dtype(kind).newbyteorder("<"))
    if parts.size != rows:
        raise InputError(f"a packed partition holds {parts.size} rows, the account {rows}")
    return parts.astype(np.int64)


def parts_of(groups, rows: int) -> np.ndarray:
    """The partition that puts each row of ``rows`` in its group: ``groups`` is ``[(part, row indices), ...]``,
    disjoint and covering every row (e.g. :func:`rpwjax.pipelines.residuals.centre_groups`)."""
    parts = np.full(int(rows), -1, np.int64)
    for part, indices in groups:
        parts[indices] = int(part)
    if parts.size and parts.min() < 0:
        raise InputError(f"the groups leave {int(np.sum(parts < 0))} rows out")
    return parts


def record_fields(accounting: Accounting) -> dict:
    """A pipeline record's accounting fields: the serialized account (:meth:`Accounting.to_json`) and
    ``per_label_epsilon``, the claimed ε that every row's entries sum to."""
    return {**accounting.to_json(), "per_label_epsilon": accounting.epsilon}


def account(accounting: Accounting | None) -> Accounting | None:
    """``accounting`` checked: an :class:`Accounting` (or view) or None."""
    if accounting is not None and not isinstance(accounting, Accounting):
        raise InputError(f"accounting must be an rpwjax.accounting.Accounting, got {type(accounting).__name__}")
    return accounting
