"""Typed CSV tables: each column's type inferred from ALL of its values (:class:`TextColumnType`).

:func:`read_csv_table` reads a whole CSV into memory typed that way;
:func:`csv_column_types` gives the types in one streamed pass (what a CSV
column is written as in Parquet).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from rpwjax.io.source import MAX_CHUNK_ROWS, TableSource, advance

MAX_SIGNIFICANT_DIGITS = 17  # float64 holds every number of at most 17 significant digits to its nearest double
_LEADING_ZERO = r"^[+-]?0[0-9]"  # "02134", "007": a code (zip, account), not a quantity; "0" and "0.5" are numbers
_CSV_DEFAULTS = pacsv.ConvertOptions()
_NULLS = pa.array(_CSV_DEFAULTS.null_values)
_TRUE, _FALSE = pa.array(_CSV_DEFAULTS.true_values), pa.array(_CSV_DEFAULTS.false_values)
_NUMBER_TYPES = (pa.int64(), pa.bool_(), pa.float64())  # pyarrow's inference order after null


def _significant_digits(text: pa.Array) -> pa.Array:
    """Significant digits of number texts: the mantissa's digits less leading and trailing zeros."""
    mantissa = pc.replace_substring_regex(text, r"[eE].*$", "")
    digits = pc.replace_substring_regex(mantissa, r"[^0-9]", "")
    return pc.utf8_length(pc.utf8_rtrim(pc.utf8_ltrim(digits, "0"), "0"))


class TextColumnType:
    """The type of a CSV column of text, inferred from ALL its values, chunk by chunk (:meth:`update`).

    pyarrow's order: null (every value is a null spelling), int64, bool (its true/false spellings only), float64,
    else the text itself. Two exceptions keep a column that would be numeric as text, where a number would
    lose what the text says (:attr:`text_reason` says why): a value with a leading zero (``02134``: a code such
    as a zip code, whose zeros a number drops) and a number with more than :data:`MAX_SIGNIFICANT_DIGITS`
    significant digits (``12345678901234567890``: float64 cannot hold it).
    """

    def __init__(self):
        self.candidates = list(_NUMBER_TYPES)
        self.values = 0  # non-null values seen
        self.text_reason = None

    def update(self, text: pa.Array) -> "TextColumnType":
        if not self.candidates:
            return self
        nulls = pc.is_in(text, value_set=_NULLS)
        masked = pc.if_else(nulls, pa.scalar(None, pa.string()), pc.utf8_trim_whitespace(text))
        count = len(text) - pc.sum(nulls.cast(pa.int64())).as_py() if len(text) else 0
        if not count:
            return self
        self.values += count
        kept = []
        for typ in self.candidates:
            if typ == pa.bool_():
                spelled = pc.or_(pc.is_in(masked, value_set=_TRUE), pc.is_in(masked, value_set=_FALSE))
                ok = pc.all(pc.or_(spelled, nulls)).as_py()
            else:
                try:
                    pc.cast(masked, typ)
                    ok = True
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    ok = False
            if ok:
                kept.append(typ)
        self.candidates = kept
        if not any(t != pa.bool_() for t in kept):
            return self
        zeros = pc.match_substring_regex(masked, _LEADING_ZERO)
        if pc.any(zeros).as_py():
            value = masked.filter(zeros)[0].as_py()
            self._keep_text(f"leading zeros (e.g. {value!r}): a code, not a quantity")
            return self
        digits = _significant_digits(masked)
        long = pc.greater(digits, MAX_SIGNIFICANT_DIGITS)
        if pc.any(long).as_py():
            value = masked.filter(long)[0].as_py()
            self._keep_text(f"numbers too long for float64 (e.g. {value!r}: more than {MAX_SIGNIFICANT_DIGITS} "
                            "significant digits)")
        return self

    def _keep_text(self, reason):
        self.candidates = []
        self.text_reason = reason

    @property
    def type(self) -> pa.DataType:
        if self.candidates and not self.values:
            return pa.null()
        return self.candidates[0] if self.candidates else pa.string()

    def field(self, name) -> pa.Field:
        """The column's field; a text column kept so by a reason carries it as metadata ``rpwjax_text_reason``."""
        meta = {"rpwjax_text_reason": self.text_reason} if self.text_reason else None
        return pa.field(name, self.type, metadata=meta)


def typed_text(text: pa.Array, typ: pa.DataType) -> pa.Array:
    """CSV text as ``typ`` (from :class:`TextColumnType`): null spellings become nulls, numbers are trimmed."""
    if pa.types.is_string(typ):
        return text
    if pa.types.is_null(typ):
        return pa.nulls(len(text))
    nulls = pc.is_in(text, value_set=_NULLS)
    masked = pc.if_else(nulls, pa.scalar(None, pa.string()), pc.utf8_trim_whitespace(text))
    if pa.types.is_boolean(typ):
        return pc.if_else(nulls, pa.scalar(None, pa.bool_()), pc.is_in(masked, value_set=_TRUE))
    return pc.cast(masked, typ)


def _infer(text: pa.Array) -> tuple[pa.Array, TextColumnType]:
    """One CSV column typed from ALL its values (:class:`TextColumnType`)."""
    kind = TextColumnType().update(text)
    return typed_text(text, kind.type), kind


def csv_column_types(source: "TableSource", *, chunk_rows: int = MAX_CHUNK_ROWS, bar=None) -> list:
    """Every column's :class:`TextColumnType` over the whole CSV ``source`` (one pass, streamed; the label's is
    None): what a CSV column is written as in Parquet."""
    kinds = [None if i == source.label_index else TextColumnType() for i in range(len(source.names))]
    for first, batch in source.batches(chunk_rows):
        for kind, col in zip(kinds, source.columns(batch, first, ".csv")):
            if kind is not None:
                kind.update(col)
        advance(bar, source, batch.num_rows)
    return kinds


def read_csv_table(path, *, encoding=None, delimiter=None, what="input file", bar=None) -> pa.Table:
    """A whole CSV (or TSV, optionally gzipped) table, each column's type inferred from all of its values.

    Unlike block-wise inference, a value far down a column can only change
    that column's type, never fail the read (:class:`TextColumnType`: a column kept as text for a reason
    carries it in its field's metadata). Each column's text is freed once it is typed.
    """
    source = TableSource(path, encoding=encoding, what=what, delimiter=delimiter, kind=".csv")
    parts = [[] for _ in source.names]
    for first, batch in source.batches(MAX_CHUNK_ROWS):
        for i, col in enumerate(source.columns(batch, first, ".csv")):
            parts[i].append(col)
        advance(bar, source, batch.num_rows)
    columns, fields = [], []
    for i, name in enumerate(source.names):
        text = pa.chunked_array(parts[i], pa.string()).combine_chunks() if parts[i] else pa.array([], pa.string())
        parts[i] = None
        column, kind = _infer(text)
        del text
        columns.append(column)
        fields.append(kind.field(name))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))
