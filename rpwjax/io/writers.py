"""Writers of a table with its label column replaced: :class:`CsvOut`, :class:`ParquetOut`,
:func:`open_writer`, and :func:`copy_with_labels`, which streams a source through them.
"""

from __future__ import annotations

import codecs

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rpwjax.errors import InputError
from rpwjax.io.csv_types import TextColumnType, csv_column_types, typed_text
from rpwjax.io.raw_csv import RawCsvRows, valid_utf8
from rpwjax.io.source import UTF8_BOM, TableSource, advance


def _quote_pattern(delimiter: str) -> str:
    special = "".join("\\" + ch if ch in "]\\^-" else ch for ch in delimiter)
    return "[" + special + '"\r\n]'


def _quoted(arr, pattern):
    """``arr`` with the fields that need it quoted (delimiter, quote or line break inside), quotes doubled."""
    needs = pc.match_substring_regex(arr, pattern)
    if not pc.any(needs).as_py():
        return arr
    quoted = pc.binary_join_element_wise('"', pc.replace_substring(arr, '"', '""'), '"', "")
    return pc.if_else(needs, quoted, arr)


def _string_bytes(arr):
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], np.int32)[arr.offset: arr.offset + len(arr) + 1]
    if bufs[2] is None or offsets[-1] == offsets[0]:
        return b""
    return memoryview(bufs[2])[offsets[0]: offsets[-1]]


class CsvOut:
    """CSV writer whose non-label fields come out byte for byte as they went in.

    :meth:`write_raw` writes a CSV input's own bytes with only the label
    fields replaced (quotes, line breaks and blank lines as they were);
    :meth:`write` renders rows from their values (Parquet input, or the CSV
    rows :class:`RawCsvRows` could not match to pyarrow's parse): a field is
    quoted only when the dialect requires it (it holds the delimiter, a quote
    or a line break), with quotes doubled. The label is written as the
    shortest float64 text that reads back to the same number, unquoted.
    """

    def __init__(self, path, names, label_index, *, delimiter=",", newline="\n", encoding="utf-8", bom=False,
                 header=None):
        self._file = open(path, "wb")
        self._pattern = _quote_pattern(delimiter)
        self.delimiter, self.newline, self.label_index = delimiter, newline, label_index
        self._encoder = None if encoding == "utf-8" else codecs.getincrementalencoder(encoding)()
        if header is not None:  # the input's own header bytes (byte-order mark included)
            self._file.write(header)
            return
        if bom:
            self._file.write(UTF8_BOM)
        header = pa.array(list(names), pa.string())
        self._emit(self.delimiter.join(_quoted(header, self._pattern).to_pylist()) + newline)

    def _emit(self, data):
        if isinstance(data, str):
            data = data.encode("utf-8")
        if self._encoder is not None:
            data = self._encoder.encode(bytes(data).decode("utf-8"))
        self._file.write(data)

    def write(self, columns, labels):
        fields = [_label_text(labels) if col is None else _quoted(col, self._pattern) for col in columns]
        lines = pc.binary_join_element_wise(*fields, self.delimiter) if len(fields) > 1 else fields[0]
        lines = pc.binary_join_element_wise(lines, "", self.newline)
        self._emit(_string_bytes(lines))

    def write_raw(self, data, start, end, labels):
        """``data`` (the input's bytes, in its encoding) with each ``data[start[i]:end[i]]`` replaced by label i."""
        n = len(start)
        if n == 0:
            self._file.write(data)
            return
        lens = end - start
        before = np.cumsum(lens) - lens  # label bytes removed before each row's label
        keep = np.ones(len(data), bool)
        keep[np.repeat(start - before, lens) + np.arange(int(lens.sum()))] = False
        kept = data[keep]
        # the pieces between labels, as one binary array over the kept bytes
        offsets = np.empty(n + 2, np.int64)
        offsets[0], offsets[1:-1], offsets[-1] = 0, start - before, len(kept)
        pieces = pa.Array.from_buffers(pa.binary(), n + 1, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                             pa.py_buffer(kept)])
        text = _label_text(labels).view(pa.binary())
        rows = pc.binary_join_element_wise(pieces.slice(0, n), text, pa.scalar(b"", pa.binary()))
        self._file.write(_string_bytes(rows))
        self._file.write(memoryview(kept)[int(offsets[n]):])

    def write_bytes(self, data):
        self._file.write(data)

    def close(self):
        if self._encoder is not None:
            self._file.write(self._encoder.encode("", final=True))
        self._file.close()


def _label_text(labels):
    return pc.cast(pa.array(labels, pa.float64()), pa.string())


class ParquetOut:
    """Parquet writer; ``text_types``: a CSV input's column types (:class:`TextColumnType`), its text cast to them."""

    def __init__(self, path, schema: pa.Schema, label_index: int, text_types=None):
        self.schema, self.label_index, self.text_types = schema, label_index, text_types
        self._writer = pq.ParquetWriter(path, schema)

    def write(self, columns, labels):
        arrays = list(columns)
        if self.text_types is not None:
            for i, typ in enumerate(self.text_types):
                if i != self.label_index and not pa.types.is_string(typ):
                    try:
                        arrays[i] = typed_text(arrays[i], typ)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                        raise InputError(f"column {self.schema.names[i]!r} no longer reads as {typ}: the input "
                                         "changed while it was read") from None
        arrays[self.label_index] = pa.array(labels, pa.float64())
        self._writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self.schema))

    def close(self):
        self._writer.close()


def open_writer(source: TableSource, path, out_kind: str, *, header=None, types=None):
    """A writer for ``source``'s columns with its label column replaced by float64 labels.

    ``header``: a CSV input's own header bytes, written as they are (else the header is rendered).
    ``types``: CSV into Parquet, each column's :class:`TextColumnType` (:func:`csv_column_types`): numbers are
    written as numbers, text as text.
    """
    label = source.label_index
    if out_kind == ".csv":
        if source.kind == ".parquet":
            return CsvOut(path, source.names, label)
        return CsvOut(path, source.names, label, delimiter=source.delimiter, newline=source.newline,
                      encoding=source.encoding, bom=source.bom, header=header)
    if source.kind == ".parquet":
        field = source.schema.field(label)
        schema = source.schema.set(label, pa.field(field.name, pa.float64()))
    else:
        if len(set(source.names)) != len(source.names):
            dup = next(n for n in source.names if source.names.count(n) > 1)
            raise InputError(f"column name {dup!r} appears more than once in {source.path!r}: Parquet output needs "
                             "distinct names (write CSV instead)")
        text_types = [pa.float64() if i == label else pa.string() if types is None
                      else types[i].type if isinstance(types[i], TextColumnType) else types[i]
                      for i in range(len(source.names))]
        schema = pa.schema([pa.field(n, t) for n, t in zip(source.names, text_types)])
        return ParquetOut(path, schema, label, text_types)
    return ParquetOut(path, schema, label)


def copy_with_labels(source: TableSource, path, out_kind: str, new_labels, *, chunk_rows: int, bar=None,
                     types=None) -> int:
    """Stream ``source`` to ``path`` with the label column replaced by ``new_labels(first_row, labels)``.

    CSV into CSV writes the input's own bytes with only the label fields
    replaced (:class:`RawCsvRows`, :meth:`CsvOut.write_raw`); rows it cannot
    match to pyarrow's parse are rendered from their values instead.
    CSV into Parquet writes each column as the type of ALL its values (``types``, from
    :func:`csv_column_types`; computed here, in a pass of its own, when not given).
    ``bar`` (:func:`progress_bar`) moves on with each batch. Returns the number of data rows written.
    """
    if source.kind != ".parquet" and out_kind == ".parquet" and types is None:
        types = csv_column_types(source, chunk_rows=chunk_rows)
    writer = None
    rows = 0
    raw = RawCsvRows(source) if source.kind == ".csv" and out_kind == ".csv" else None
    try:
        for first, batch in source.batches(chunk_rows):
            y = source.labels(batch, first)
            out = np.asarray(new_labels(first, y), dtype=np.float64)
            spans = raw.take(batch.num_rows, batch.column(source.label_index)) if raw is not None else None
            if spans is not None and source.encoding == "utf-8" and not valid_utf8(spans[0]):
                source.columns(batch, first, out_kind)  # names the column, row and byte that do not decode
            if writer is None:
                writer = open_writer(source, path, out_kind, header=raw.header if raw is not None else None,
                                     types=types)
            if spans is not None:
                writer.write_raw(*spans, out)
            else:
                writer.write(source.columns(batch, first, out_kind), out)
            rows += batch.num_rows
            advance(bar, source, batch.num_rows)
            del batch, out, y, spans
            pa.default_memory_pool().release_unused()  # keep peak memory flat on long files
        if raw is not None and writer is not None:
            writer.write_bytes(raw.rest())  # blank lines after the last row, as they were
    finally:
        if raw is not None:
            raw.close()
        if writer is not None:
            writer.close()
    return rows
