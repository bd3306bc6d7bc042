"""Feature tables: a user's CSV or Parquet table in memory, as public features and private labels.

What ``rpwjax privatize-table`` and ``rpwjax curves --data`` read (one
function, :func:`read_feature_table`, so both choose the same features).

Which columns are features (:func:`choose_features`) is decided on purpose:

* ``features`` (``--features COL ...``): exactly these columns;
  ``exclude`` (``--exclude COL ...``): every usable column but these. A
  column that is not in the table or the label column is refused, naming
  it; so is giving both (``--exclude`` would do nothing).
* Otherwise every numeric column (integer, floating point, decimal, boolean)
  other than the label, except the columns that look like identifiers or
  codes rather than quantities: text with leading zeros (``02134``: a zip
  code; CSV only, such a column is read as text,
  :class:`rpwjax.io.csv_types.TextColumnType`), numbers too long for float64 (more than
  17 significant digits in CSV text, integers beyond 2^53), and integer
  columns whose values are all distinct (ids; from :data:`ID_MIN_ROWS` rows
  on, below which any column may be). Text and other types are not used.
  Every column left out is named with its reason.
* A feature with missing values (empty, a null spelling, NaN or ±inf) is
  kept: its missing entries are filled with the median of its observed
  values, and a 0/1 indicator column ``COL_missing`` (1 where it was
  missing) joins the features. Both read only the features, which are
  public under label-DP.

The choice (:class:`FeatureChoice`) is recorded in the sidecar and said in
one line each for the columns used, left out and filled.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rpwjax.errors import InputError, one_line, show_value
from rpwjax.io.csv_types import read_csv_table, typed_text
from rpwjax.io.source import TableSource, check_exists, file_kind, is_number_type, progress_bar

ID_MIN_ROWS = 10  # an integer column whose values are all distinct is an id from this many rows on
MAX_EXACT_INTEGER = 2**53  # float64 holds every integer up to this exactly
TEXT_REASON = "rpwjax_text_reason"  # field metadata of a CSV column kept as text (rpwjax.io.csv_types.TextColumnType)


@dataclasses.dataclass(frozen=True)
class FeatureChoice:
    """Which columns are features, which were left out and why, which were filled.

    ``used``: input columns, in table order; ``left_out``: ``(column, reason)``;
    ``imputed``: one dict per filled feature (``column``, ``missing``, ``fill``,
    ``fill_value``, ``indicator``); ``chosen_by``: ``"rule"``, ``"--features"``
    or ``"--exclude"``.
    """

    used: tuple[str, ...]
    left_out: tuple[tuple[str, str], ...]
    imputed: tuple[dict, ...]
    chosen_by: str

    @property
    def columns(self) -> tuple[str, ...]:
        """The feature matrix's columns: the used ones, then each filled feature's indicator."""
        return self.used + tuple(i["indicator"] for i in self.imputed)

    def record(self) -> dict:
        return {"chosen_by": self.chosen_by, "used": list(self.used),
                "left_out": [{"column": c, "reason": r} for c, r in self.left_out],
                "imputed": [dict(i) for i in self.imputed], "columns": list(self.columns)}

    def lines(self) -> list[str]:
        """What was chosen, one line each for the used, left out and filled columns (the last two if any)."""
        how = {"rule": "", "--features": " (--features)", "--exclude": " (--exclude)"}[self.chosen_by]
        out = [f"features{how}: using {len(self.used)} column(s): {', '.join(self.used)}"]
        if self.left_out:
            out.append(f"features: left out {len(self.left_out)} column(s): "
                       + "; ".join(f"{c} ({r})" for c, r in self.left_out))
        for i in self.imputed:
            out.append(f"features: {i['column']} has {i['missing']} missing value(s): filled with the median of its "
                       f"observed values ({i['fill_value']:.6g}), with the 0/1 indicator column {i['indicator']}")
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class FeatureTable:
    """A user's table as features (float32, (n, d), public) and raw labels (float64, (n,), unchecked)."""

    features: np.ndarray
    labels: np.ndarray
    choice: FeatureChoice
    label_type: str | None = None  # how the labels were read, where not float64 (e.g. a Parquet decimal)
    column_types: tuple | None = None  # CSV: every column's type, inferred from all its values (for a Parquet output)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self.choice.columns

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(self.choice.lines()[1:])


def check_feature_options(features, exclude):
    """Refuse ``--features`` with ``--exclude``: the features are then exactly the columns ``--features`` names,
    so ``--exclude`` would do nothing. Checked before any file is read (no columns needed)."""
    if features is not None and exclude is not None:
        raise InputError(f"--exclude {' '.join(map(str, exclude))} does nothing with --features "
                         f"{' '.join(map(str, features))}: --features uses exactly the columns it names (give one of "
                         "the two)")


def _names_check(names, label_column, features, exclude):
    check_feature_options(features, exclude)
    for flag, given in (("--features", features), ("--exclude", exclude)):
        if given is None:
            continue
        if not given:
            raise InputError(f"{flag} needs at least one column name")
        unknown = [c for c in given if c not in names]
        if unknown:
            raise InputError(f"{flag} names column(s) not in the table: {', '.join(map(repr, unknown))}; columns "
                             f"are {', '.join(names)}")
        twice = sorted({c for c in given if given.count(c) > 1})
        if twice:
            raise InputError(f"{flag} names {', '.join(map(repr, twice))} more than once")
        if label_column in given:
            raise InputError(f"{flag} names the label column {label_column!r}: the label is private and never a "
                             "feature" + (" (it is never used as one: drop it from --exclude)" if flag == "--exclude"
                                          else ""))


def _as_numbers(column: pa.ChunkedArray, name: str, forced: bool):
    """``(values float64 with NaN where missing, None)`` or ``(None, reason)`` for a column that is not a number."""
    typ = column.type
    if pa.types.is_null(typ):
        return None, "no values (every entry missing)"
    if pa.types.is_boolean(typ) or is_number_type(typ):
        return column.cast(pa.float64(), safe=False).fill_null(np.nan).to_numpy(), None
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        if not forced:
            return None, "not numeric (text)"
        text = pc.utf8_trim_whitespace(column)
        empty = pc.equal(pc.utf8_length(text), 0)
        text = pc.if_else(empty, pa.scalar(None, pa.string()), text)
        try:
            return pc.cast(text, pa.float64()).fill_null(np.nan).to_numpy(), None
        except pa.ArrowInvalid:
            bad = next(v for v in text.to_pylist() if v is not None and not _is_number(v))
            raise InputError(f"--features {name}: column {name!r} is not numeric: it holds {show_value(bad)}") \
                from None
    if forced:
        raise InputError(f"--features {name}: column {name!r} is not numeric: it has type {typ}")
    return None, f"not numeric (type {typ})"


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _looks_like_an_id(column: pa.ChunkedArray, values: np.ndarray) -> str | None:
    """Why an integer column is an identifier rather than a quantity (None if it is not)."""
    if not pa.types.is_integer(column.type):
        return None
    observed = column.drop_null()
    if len(observed) == 0:
        return None
    big = pc.greater(pc.abs(observed.cast(pa.float64(), safe=False)), float(MAX_EXACT_INTEGER))
    if pc.any(big).as_py():
        value = observed.filter(big)[0].as_py()
        return f"integers too large for float64 (e.g. {value}: beyond 2^53)"
    if len(observed) >= ID_MIN_ROWS and pc.count_distinct(observed).as_py() == len(observed):
        return "integers all distinct: an identifier"
    return None


def _indicator_name(column: str, taken: set) -> str:
    name = f"{column}_missing"
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def choose_features(table: pa.Table, label_column: str, *, features=None, exclude=None):
    """The features of ``table``: ``(matrix float32 (n, d), FeatureChoice)`` (see the module docstring); each
    chosen column standardized in float64 before its float32 copy (:func:`standardized_column`), the missing-value
    indicators 0/1.

    ``features``/``exclude``: column names (``--features``/``--exclude``). Reads the features only (public);
    the label column is never read here. Refuses a table with no feature left, naming what was left out.
    """
    names = list(table.column_names)
    features = None if features is None else list(features)
    exclude = None if exclude is None else list(exclude)
    _names_check(names, label_column, features, exclude)
    n = table.num_rows
    chosen_by = "--features" if features is not None else "--exclude" if exclude is not None else "rule"
    taken = set(names)
    used, left_out, imputed, columns, indicators = [], [], [], [], []
    for i, name in enumerate(names):
        if name == label_column:
            continue
        if features is not None and name not in features:
            left_out.append((name, "not in --features"))
            continue
        if exclude is not None and name in exclude:
            left_out.append((name, "--exclude"))
            continue
        if names.count(name) > 1:
            if features is not None:
                raise InputError(f"--features {name}: the column name {name!r} appears {names.count(name)} times")
            if names.index(name) == i:  # the name once, not once per copy
                left_out.append((name, f"the name appears {names.count(name)} times"))
            continue
        column = table.column(i)
        forced = features is not None
        field = table.schema.field(i)
        values, reason = _as_numbers(column, name, forced)
        if values is None:
            meta = field.metadata or {}
            reason = meta.get(TEXT_REASON.encode(), b"").decode() or reason
            left_out.append((name, reason))
            continue
        if not forced:
            reason = _looks_like_an_id(column, values)
            if reason is not None:
                left_out.append((name, reason))
                continue
        missing = ~np.isfinite(values)
        count = int(missing.sum())
        if count == n:
            if forced:
                raise InputError(f"--features {name}: column {name!r} has no observed value (every entry missing)")
            left_out.append((name, "no values (every entry missing)"))
            continue
        if count:
            fill = float(np.median(values[~missing]))  # a function of the public features only
            values = np.where(missing, fill, values)
            indicator = _indicator_name(name, taken)
            imputed.append({"column": name, "missing": count, "fill": "median of the observed values",
                            "fill_value": fill, "indicator": indicator})
            indicators.append(missing)
        used.append(name)
        columns.append(standardized_column(values))
        del values
    choice = FeatureChoice(tuple(used), tuple(left_out), tuple(imputed), chosen_by)
    if not columns:
        said = "; ".join(f"{c} ({r})" for c, r in left_out)
        raise InputError(f"the table has no usable numeric feature column besides {label_column!r}"
                         + (f": left out {said}" if said else "") + " (choose columns with --features)")
    matrix = np.empty((n, len(columns) + len(indicators)), np.float32)
    for j, col in enumerate(columns + indicators):
        matrix[:, j] = col
    return matrix, choice


def standardized_column(values) -> np.ndarray:
    """A feature column centred and scaled in float64 (mean 0, standard deviation 1; a constant column 0), then
    float32: a column with a large offset (a timestamp) or magnitude (1e39) keeps its spread, which a float32
    copy of its raw values would round away or overflow. Public features only. Scaled by the largest distance
    from the median first, so that no square overflows float64."""
    v = np.asarray(values, np.float64)
    d = v - np.median(v)
    top = float(np.max(np.abs(d)))
    if not top > 0:
        return np.zeros(v.shape, np.float32)
    d = d / top
    d -= d.mean()
    scale = float(d.std())
    return (d / scale if scale > 0 else d).astype(np.float32)


def read_table(path, *, encoding=None, bar=None) -> pa.Table:
    """A whole CSV or Parquet table (the same suffix rules as every other input); CSV columns typed from ALL their
    values (:func:`rpwjax.io.csv_types.read_csv_table`)."""
    kind = file_kind(path, what="input file")
    check_exists(path)
    if kind == ".csv":
        return read_csv_table(path, encoding=encoding, bar=bar)
    if encoding is not None:
        raise InputError(f"--encoding applies to CSV and text files, not to the Parquet file {str(path)!r}")
    try:
        table = pq.read_table(path, pre_buffer=False)
    except (pa.ArrowException, OSError) as err:
        raise InputError(f"could not read {str(path)!r} as Parquet: {one_line(err)}") from None
    if bar is not None:
        bar.update(table.num_rows)
    return table


def _not_numeric(column: pa.ChunkedArray, label_column: str, source: TableSource) -> str:
    """Why a label column is not numeric, as ``rpwjax privatize`` says it: in a CSV, its first missing label or
    label that is not a number, named as written with its data row and line; otherwise its type, with the file."""
    if source.kind == ".csv" and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        for row, value in enumerate(column.to_pylist(), start=1):  # the error path only: one pass in Python
            text = "" if value is None else value.strip()
            if not text:
                return f"missing label in column {label_column!r} (an empty field) at {source.where(row)}"
            if not _is_number(text):
                return f"label {show_value(value)} in column {label_column!r} is not a number, at {source.where(row)}"
    return f"label column {label_column!r} of {source.path!r} must be numeric, got type {column.type}"


def read_feature_table(path, label_column: str, *, encoding=None, features=None, exclude=None,
                       progress: bool = False, desc: str = "read table") -> FeatureTable:
    """A whole CSV or Parquet table as features (:func:`choose_features`) and labels (float64, unchecked).

    The label column must be numeric (integer, floating point, or decimal: read as float64, ``label_type``
    says so); the caller checks its values against the public range. ``progress``: a bar on stderr while
    the file is read. The table is freed before this returns: what stays is the float32 features.
    """
    check_feature_options(features, exclude)  # before the file is read
    source = TableSource(path, label_column, encoding=encoding)
    with progress_bar(source, desc, enabled=progress) as bar:
        table = read_table(path, encoding=encoding, bar=bar)
    if table.num_rows == 0:
        raise InputError(f"{str(path)!r} has no rows")
    column = table.column(source.label_index)
    label_type = column.type
    if (table.schema.field(source.label_index).metadata or {}).get(TEXT_REASON.encode()):
        # CSV numbers kept as text for the features' sake (leading zeros, many digits) are labels all the same
        column, label_type = typed_text(column, pa.float64()), pa.float64()
    if not is_number_type(label_type):
        raise InputError(_not_numeric(column, label_column, source))
    labels = column.cast(pa.float64(), safe=False).fill_null(np.nan).to_numpy()
    del column
    matrix, choice = choose_features(table, label_column, features=features, exclude=exclude)
    types = tuple(table.schema.types)
    del table
    pa.default_memory_pool().release_unused()
    if source.kind == ".csv":
        return FeatureTable(matrix, np.asarray(labels, np.float64), choice, None, types)
    described = None if label_type == pa.float64() else f"{label_type} read as float64"
    return FeatureTable(matrix, np.asarray(labels, np.float64), choice, described)


__all__ = ["FeatureChoice", "FeatureTable", "ID_MIN_ROWS", "check_feature_options", "choose_features",
           "read_feature_table", "read_table"]
