"""Files in and out: label files, CSV/Parquet tables in chunks, atomic writes.

Reading (:class:`TableSource`):

* **CSV** is parsed by pyarrow with every column as raw text (no type
  inference, no null values), so a column other than the label can never fail
  a run, wherever an odd value sits. Only the label column is parsed, as
  float64. The file must decode in its encoding (UTF-8 unless ``encoding``
  says otherwise). Read blocks are ``CSV_BLOCK_BYTES`` (4 MiB); a longer row
  makes the block 4x larger, up to ``CSV_MAX_BLOCK_BYTES`` (256 MiB), and a
  row longer than that is refused.
* CSV into CSV writes the input's own bytes back with only the label fields
  replaced: :class:`RawCsvRows` cuts the raw bytes into pyarrow's rows with a
  vectorized tokenizer and checks them against pyarrow's parse (the header's
  names, every row's field count, the label text), so every other field, the
  header, quotes (optional ones included), line terminators, blank lines and
  a UTF-8 byte-order mark come out as they went in. Where the check fails, or
  the encoding is not ASCII-compatible (UTF-16, ...), the rows from there on
  are rendered from pyarrow's values instead (:class:`CsvOut`): the same
  values, each field quoted only where the dialect requires it, in the same
  encoding and line terminator.
* **Parquet** columns other than the label keep their schema and values.
* Every error about a row names the 1-based **data row** (the header is not a
  data row) and, for CSV and text files, the 1-based **physical line** where
  that row starts (blank lines and line breaks inside quoted fields counted),
  for any position in the file and any chunk size. The line is found on the
  error path by a second, quote-aware pass over the file (Python's ``csv``
  module with the same dialect), so finding it costs one read of the file up
  to that row.

Writing: outputs go to temporary files beside their targets and are renamed
into place only after the whole run succeeded (:func:`atomic_outputs`); a
failure, ``SIGINT`` or ``SIGTERM`` removes the temporary files and any
directory the run created, and leaves an existing output untouched.
"""

from __future__ import annotations

import codecs
import dataclasses
import contextlib
import csv
import errno
import gzip
import io as pyio
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from rpwjax import interrupts
from rpwjax.errors import InputError, check_label_rows, one_line, show_value

TABLE_SUFFIXES = (".csv", ".parquet")
LABEL_SUFFIXES = TABLE_SUFFIXES + (".txt",)

CSV_BLOCK_BYTES = 1 << 22  # bytes per CSV read block: peak memory does not grow with the file
CSV_MAX_BLOCK_BYTES = 1 << 28  # a longer row grows the block 4x at a time up to this (256 MiB); longer is refused
MAX_CHUNK_ROWS = 1 << 22  # --chunk-rows lies in [1, MAX_CHUNK_ROWS]
MAX_GLOBAL_ROWS = 1 << 63  # every global row index (row offset + row) lies in [0, 2^63): it never wraps
_TXT_DELIMITER = "\x1f"  # a text label file has one field per line: split on a character a number never holds
_UTF8_BOM = b"\xef\xbb\xbf"


def file_kind(path, allowed=TABLE_SUFFIXES, what="file") -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in allowed:
        raise InputError(f"{what} must end in {', '.join(allowed)}, got {str(path)!r}")
    return suffix


def _check_exists(path, what="input file"):
    if Path(path).is_dir():
        raise InputError(f"{what} {str(path)!r} is a directory: give a file")
    if not Path(path).is_file():
        raise InputError(f"{what} not found: {str(path)!r}")


def normalize_encoding(encoding) -> str:
    """The Python codec name of ``encoding`` (default UTF-8); an unknown name is bad input."""
    if encoding is None:
        return "utf-8"
    try:
        return codecs.lookup(str(encoding)).name
    except LookupError:
        raise InputError(f"unknown encoding {str(encoding)!r}: give a Python codec name such as utf-8, latin-1 "
                         "or cp1252") from None


def _first_bad(arr, op) -> int:
    """Index of the first element of ``arr`` on which ``op`` raises (``op`` raised on all of ``arr``)."""
    lo, hi = 0, len(arr)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            op(arr.slice(lo, mid - lo))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            hi = mid
        else:
            lo = mid
    return lo


def is_number_type(typ) -> bool:
    """Integer, floating point or decimal: a column whose values read as float64 (decimals to the nearest)."""
    return pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)


def _to_text(arr) -> pa.Array:
    return pc.cast(arr, pa.string())


class TableSource:
    """An input table (CSV, Parquet, or a text label file) opened for streaming.

    ``names`` are the column names (a text file: ``["label"]``),
    ``label_index`` the position of ``label_column`` (refused if missing or
    repeated). :meth:`batches` yields ``(first_row, batch)`` with ``first_row``
    the 1-based data row of the batch's first row; :meth:`labels` parses a
    batch's labels; :meth:`where` names a data row the way a user finds it.
    """

    def __init__(self, path, label_column=None, *, encoding=None, what="input file", allowed=TABLE_SUFFIXES,
                 delimiter=None, kind=None):
        self.path = str(path)
        self.kind = kind or file_kind(path, allowed, what)
        _check_exists(path, what)
        self.what = what
        self._lines: dict[int, int | None] = {}
        self.size = os.path.getsize(self.path)  # bytes on disk: the total of a CSV's progress bar
        self.bytes_read = 0  # bytes of the file read so far by the last pass (CSV and text)
        if self.kind == ".parquet":
            if encoding is not None:
                raise InputError(f"--encoding applies to CSV and text files, not to the Parquet file {self.path!r}")
            self._open_parquet()
        else:
            self.encoding = normalize_encoding(encoding)
            self.encoding_name = str(encoding) if encoding is not None else "utf-8"
            self.text = self.kind == ".txt"
            self.delimiter = _TXT_DELIMITER if self.text else (delimiter or ",")
            self._block_bytes = CSV_BLOCK_BYTES  # grows (up to CSV_MAX_BLOCK_BYTES) when a row does not fit
            self._header_rows = 0 if self.text else 1
            self._open_csv()
        if label_column is None and self.text:
            label_column = "label"
        self.label_column = label_column
        self.label_index = None
        if label_column is None:
            return
        hits = [i for i, name in enumerate(self.names) if name == label_column]
        if not hits:
            raise InputError(f"label column {label_column!r} not found in {self.path!r}; columns are {self.names}")
        if len(hits) > 1:
            raise InputError(f"label column {label_column!r} appears {len(hits)} times in the header of "
                             f"{self.path!r} (columns {', '.join(str(i + 1) for i in hits)}): rename all but one")
        self.label_index = hits[0]

    @property
    def label_type(self) -> str | None:
        """How the labels were read, for a sidecar, where they are not stored as float64 or as CSV text:
        e.g. ``"decimal128(12, 2) read as float64"`` (None otherwise)."""
        if self.kind != ".parquet" or self.label_index is None:
            return None
        typ = self.schema.field(self.label_index).type
        return None if typ == pa.float64() else f"{typ} read as float64"

    # ------------------------------------------------------------------ opening
    def _open_parquet(self):
        try:
            with pq.ParquetFile(self.path) as pf:
                self.schema = pf.schema_arrow
                self.num_rows = pf.metadata.num_rows
        except (pa.ArrowException, ValueError) as err:
            raise InputError(f"could not read {self.path!r} as Parquet: {one_line(err)}") from None
        self.names = list(self.schema.names)
        self.text = False

    def _raw_head(self, size=1 << 16) -> bytes:
        opener = gzip.open if self.path.lower().endswith(".gz") else open
        with opener(self.path, "rb") as f:
            return f.read(size)

    def _open_csv(self):
        head = self._raw_head()
        self.bom = self.encoding == "utf-8" and head.startswith(_UTF8_BOM)
        text = codecs.getincrementaldecoder(self.encoding)(errors="replace").decode(head)
        self.newline = "\n"
        for i, ch in enumerate(text):
            if ch in "\r\n":
                self.newline = "\r\n" if text[i:i + 2] == "\r\n" else ch
                break
        self.ncols = None
        self.names = None
        with self._reader({}) as reader:  # the column count, from pyarrow's own parse of the first row
            self.ncols = len(reader.schema.names)
        self._raw.close()
        with self._reader(self._text_types()) as reader:
            first = self._next(reader, 0)
        self._raw.close()
        if first is None or first.num_rows == 0:
            raise InputError(f"{self.what} {self.path!r} is empty")
        if self.text:
            if self.ncols != 1:
                self._failure(None, 0)
            self.names = ["label"]
            return
        names = []
        for i in range(self.ncols):
            raw = first.column(i)[0].as_py()
            try:
                names.append(raw.decode("utf-8"))
            except UnicodeDecodeError as err:
                raise InputError(self._decode_message(raw[err.start], f"header field {i + 1}", self._where_pa(0))) \
                    from None
        self.names = names

    def _text_types(self):
        return {f"f{i}": pa.binary() for i in range(self.ncols)}

    def _reader(self, column_types, include_columns=None):
        """pyarrow's streaming reader; a first row longer than the read block retries with a larger block."""
        while True:
            read = pacsv.ReadOptions(
                autogenerate_column_names=True,  # the header is row 0, read as text like every other row
                # no threaded read-ahead: it queues blocks without bound and peak memory would grow with the file
                use_threads=False,
                block_size=self._block_bytes,
                encoding="utf8" if self.encoding == "utf-8" else self.encoding,
            )
            parse = pacsv.ParseOptions(delimiter=self.delimiter, quote_char=False if self.text else '"',
                                       newlines_in_values=not self.text)
            convert = pacsv.ConvertOptions(column_types=column_types, strings_can_be_null=False,
                                           quoted_strings_can_be_null=False, include_columns=include_columns or [])
            # opened here (not by path) so that the bytes read so far can be told: progress in bytes of the file
            self._raw = pa.OSFile(self.path)
            stream = pa.CompressedInputStream(self._raw, "gzip") if self.path.lower().endswith(".gz") else self._raw
            try:
                return pacsv.open_csv(stream, read_options=read, parse_options=parse, convert_options=convert)
            except (pa.ArrowInvalid, UnicodeError) as err:
                self._raw.close()
                if not self._grow_block(err):
                    self._failure(err, 0)

    def _grow_block(self, err) -> bool:
        """A row did not fit the read block: use a 4x larger one (up to CSV_MAX_BLOCK_BYTES); False at the bound."""
        if "straddling" not in str(err) or self._block_bytes >= CSV_MAX_BLOCK_BYTES:
            return False
        self._block_bytes = min(4 * self._block_bytes, CSV_MAX_BLOCK_BYTES)
        return True

    def _next(self, reader, pa_row):
        try:
            return reader.read_next_batch()
        except StopIteration:
            return None
        except (pa.ArrowInvalid, UnicodeError) as err:
            self._failure(err, pa_row)

    def _pa_batches(self, column_types, include_columns=None):
        """``(pa_row, batch)``: pyarrow's batches in file order, ``pa_row`` the parsed rows before (header included).

        A row longer than the read block reopens the file with a larger block
        and skips the rows already yielded, so every row comes exactly once.
        """
        done = 0  # rows yielded so far
        while True:
            reader = self._reader(column_types, include_columns)
            seen = 0  # rows this reader has parsed
            try:
                while True:
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        return
                    except (pa.ArrowInvalid, UnicodeError) as err:
                        if not self._grow_block(err):
                            self._failure(err, seen)
                        break  # reopen with the larger block
                    n = batch.num_rows
                    self.bytes_read = self._raw.tell()
                    if seen + n > done:
                        yield done, batch.slice(done - seen) if seen < done else batch
                        done = seen + n
                    seen += n
            finally:
                reader.close()
                self._raw.close()

    # ------------------------------------------------------------------ streaming
    def batches(self, chunk_rows: int, *, label_only: bool = False):
        """``(first_row, batch)`` of at most ``chunk_rows`` rows, in file order.

        CSV batches hold every column as raw bytes (``f0``, ``f1``, ...), the
        header removed; with ``label_only`` only the label column.
        """
        if self.kind == ".parquet":
            yield from self._parquet_batches(chunk_rows, label_only)
            return
        include = [f"f{self.label_index}"] if label_only else None
        types = {f"f{self.label_index}": pa.binary()} if label_only else self._text_types()
        for pa_row, batch in self._pa_batches(types, include):
            skip = max(0, self._header_rows - pa_row)
            first = pa_row + skip - self._header_rows + 1
            if skip:
                batch = batch.slice(skip)
            # blocks are yielded as read (split when larger than chunk_rows): the output does not
            # depend on where chunks start, so nothing is re-joined
            for offset in range(0, batch.num_rows, chunk_rows):
                yield first + offset, batch.slice(offset, chunk_rows)

    def _parquet_batches(self, chunk_rows, label_only):
        first = 1
        # pre-buffering reads whole column chunks ahead and keeps them: streaming reads with a
        # bounded buffer keep peak memory flat for files of any size
        with pq.ParquetFile(self.path, pre_buffer=False, buffer_size=1 << 22) as pf:
            it = pf.iter_batches(batch_size=chunk_rows, columns=[self.label_column] if label_only else None)
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    return
                except (pa.ArrowException, ValueError) as err:
                    raise InputError(f"could not read {self.path!r} as Parquet at or after data row {first}: "
                                     f"{one_line(err)}") from None
                yield first, batch
                first += batch.num_rows

    def labels(self, batch, first_row: int) -> np.ndarray:
        """The batch's labels as float64 (not yet checked for finiteness or range)."""
        if self.kind == ".parquet":
            column = batch.column(batch.schema.get_field_index(self.label_column))
            if not (is_number_type(column.type) or pa.types.is_null(column.type)):
                raise InputError(f"label column {self.label_column!r} of {self.path!r} must be numeric, "
                                 f"got type {column.type}")
            if pa.types.is_decimal(column.type):  # money and the like: read as float64 (the sidecar says so)
                column = pc.cast(column, pa.float64(), safe=False)
            if column.null_count:
                i = int(np.flatnonzero(np.asarray(column.is_null()))[0])
                raise InputError(f"missing label in column {self.label_column!r} at {self.where(first_row + i)}")
            return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
        raw = batch.column(batch.schema.get_field_index(f"f{self.label_index}"))
        try:
            text = _to_text(raw)
        except pa.ArrowInvalid:
            i = _first_bad(raw, _to_text)
            self._raise_decode(raw[i].as_py(), self.label_column, first_row + i)
        text = pc.utf8_trim_whitespace(text)  # as pyarrow's own number parsing does
        empty = pc.equal(pc.utf8_length(text), 0)
        if pc.any(empty).as_py():
            i = int(np.flatnonzero(empty.to_numpy(zero_copy_only=False))[0])
            raise InputError(f"missing label in column {self.label_column!r} (an empty field) at "
                             f"{self.where(first_row + i)}")
        cast = lambda a: pc.cast(a, pa.float64())  # noqa: E731
        try:
            y = cast(text)
        except pa.ArrowInvalid:
            i = _first_bad(text, cast)
            raise InputError(f"label {show_value(text[i].as_py())} in column {self.label_column!r} is not a number, "
                             f"at {self.where(first_row + i)}") from None
        return np.asarray(y.to_numpy(zero_copy_only=False), dtype=np.float64)

    def columns(self, batch, first_row: int, out_kind: str) -> list:
        """The batch's columns for a writer of ``out_kind`` (the label's slot is ``None``).

        CSV: every other column as validated text, byte for byte as read.
        Parquet into Parquet: the columns as stored; into CSV: rendered as text.
        """
        out = []
        for i in range(batch.num_columns):
            if i == self.label_index:
                out.append(None)
                continue
            col = batch.column(i)
            if self.kind != ".parquet":
                try:
                    col = _to_text(col)
                except pa.ArrowInvalid:
                    j = _first_bad(col, _to_text)
                    self._raise_decode(col[j].as_py(), self.names[i], first_row + j)
            elif out_kind == ".csv":
                col = _render_text(col, self.names[i])
            out.append(col)
        return out

    # ------------------------------------------------------------------ naming rows
    def where(self, row: int) -> str:
        """``data row R (line L) of 'FILE'``: 1-based data row and, for CSV/text, the physical line it starts on."""
        if self.kind == ".parquet":
            return f"data row {row} of {self.path!r}"
        return f"data row {row} ({self._line_text(row - 1 + self._header_rows)}) of {self.path!r}"

    def _where_pa(self, pa_row: int) -> str:
        line = self._line_text(pa_row)
        if pa_row < self._header_rows:
            return f"the header ({line}) of {self.path!r}"
        return f"data row {pa_row - self._header_rows + 1} ({line}) of {self.path!r}"

    def _line_text(self, pa_row: int) -> str:
        if pa_row not in self._lines:
            self._lines[pa_row] = next((line for index, line, _ in self._scan() if index == pa_row), None)
        line = self._lines[pa_row]
        return "line unknown" if line is None else f"line {line}"

    def _scan(self):
        """``(row, first line, fields)`` for every row pyarrow parses (blank lines skipped, as it does).

        Undecodable bytes come back as lone surrogates (``surrogateescape``).
        """
        opener = gzip.open if self.path.lower().endswith(".gz") else open
        limit = csv.field_size_limit()
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
        try:
            with opener(self.path, "rt", encoding=self.encoding, errors="surrogateescape", newline="") as f:
                if self.text:
                    reader = csv.reader(f, delimiter=self.delimiter, quoting=csv.QUOTE_NONE)
                else:
                    reader = csv.reader(f, delimiter=self.delimiter, quotechar='"', doublequote=True, strict=False)
                previous, index = 0, 0
                while True:
                    try:
                        fields = next(reader)
                    except StopIteration:
                        return
                    except csv.Error as err:
                        raise InputError(f"{self.path!r} is not valid CSV at line {reader.line_num}: {err}") from None
                    start, previous = previous + 1, reader.line_num
                    if not fields:
                        continue
                    if index == 0 and self.bom and fields[0].startswith("\ufeff"):
                        fields[0] = fields[0][1:]
                    yield index, start, fields
                    index += 1
        finally:
            csv.field_size_limit(limit)

    # ------------------------------------------------------------------ failures
    def _decode_message(self, byte: int, column: str, where: str) -> str:
        hint = (" (if the file is in another encoding, give it with --encoding, e.g. --encoding latin-1)"
                if self.encoding == "utf-8" else "")
        return f"{self.path!r} is not valid {self.encoding_name}: byte 0x{byte:02x} in {column} at {where}{hint}"

    def _raise_decode(self, raw: bytes, column: str, row: int):
        try:
            raw.decode("utf-8")
            byte = raw[0] if raw else 0
        except UnicodeDecodeError as err:
            byte = raw[err.start]
        raise InputError(self._decode_message(byte, f"column {column!r}", self.where(row)))

    def _failure(self, err, pa_row: int):
        """pyarrow could not parse the file at or after ``pa_row``: name the first bad row and line."""
        expected = self.ncols
        names = self.names
        for index, line, fields in self._scan():
            for j, field in enumerate(fields):
                bad = next((ch for ch in field if "\udc80" <= ch <= "\udcff"), None)
                if bad is not None:
                    if index < self._header_rows:
                        name = f"header field {j + 1}"
                    else:
                        name = f"column {names[j]!r}" if names and j < len(names) else f"field {j + 1}"
                    self._lines[index] = line
                    raise InputError(self._decode_message(ord(bad) - 0xDC00, name, self._where_pa(index)))
            if names is None and index < self._header_rows:
                names = fields
            if expected is None:
                expected = len(fields)
            elif len(fields) != expected:
                self._lines[index] = line
                if self.text:
                    raise InputError(f"{self._where_pa(index)} holds {show_value(_TXT_DELIMITER.join(fields))}: "
                                     "a text label file holds one number per line")
                hint = ("; a quoted field in it runs across line breaks: is a closing quote missing?"
                        if any("\n" in f or "\r" in f for f in fields) else "")
                raise InputError(f"{self._where_pa(index)} has {len(fields)} fields, the header has {expected}{hint}")
        if err is None:
            raise InputError(f"could not read {self.path!r}")
        message = one_line(err)
        row = max(1, pa_row - self._header_rows + 1)  # the first data row of the block that failed
        if "Empty CSV file" in message:
            raise InputError(f"{self.what} {self.path!r} is empty")
        if "straddling" in message:
            raise InputError(f"a row of {self.path!r} at or after data row {row} is longer than the "
                             f"{_size_text(self._block_bytes)} read block, the largest allowed")
        raise InputError(f"could not parse {self.path!r} at or after data row {row}: {message}")


def _size_text(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} byte"


def _render_text(col, name):
    """A non-text column as CSV text (Parquet into CSV); nulls become empty fields."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return col.fill_null("")
    try:
        return pc.cast(col, pa.string()).fill_null("")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise InputError(f"column {name!r} of type {col.type} cannot be written to CSV: write Parquet instead") \
            from None


# --------------------------------------------------------------------------- labels


def read_labels(path, label_column: str | None = None, *, encoding=None, check=None, bar=None) -> np.ndarray:
    """All labels of a label file: CSV/Parquet (``label_column``) or text (one number per line).

    ``check=(lo, hi, clip)`` also checks every label is finite and (unless
    ``clip``) inside ``[lo, hi]``; every error names the data row and line.
    ``bar`` (:func:`progress_bar`) moves on as the file is read.
    """
    kind = file_kind(path, LABEL_SUFFIXES, "labels file")
    if kind == ".txt" and label_column is not None:
        raise InputError(f"--label-column applies to CSV and Parquet label files, not to the text file {str(path)!r}")
    if kind != ".txt" and not label_column:
        raise InputError("--label-column is required for CSV and Parquet label files")
    source = TableSource(path, label_column, encoding=encoding, what="labels file", allowed=LABEL_SUFFIXES)
    parts = []
    for first, batch in source.batches(MAX_CHUNK_ROWS, label_only=True):
        y = source.labels(batch, first)
        if check is not None:
            lo, hi, clip = check
            check_label_rows(y, lo, hi, clip=clip, first_row=first, where=source.where, column=source.label_column)
        parts.append(y)
        advance(bar, source, y.size)
    if not parts or sum(p.size for p in parts) == 0:
        raise InputError(f"labels file {str(path)!r} has no rows: need at least one label")
    return np.concatenate(parts)


# --------------------------------------------------------------------------- whole CSV tables (in memory)


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


@contextlib.contextmanager
def progress_bar(source: "TableSource", desc: str, *, enabled: bool = True):
    """A tqdm bar (stderr) over one pass of ``source``, with its total and the time left: rows for Parquet,
    bytes of the file for CSV and text (:func:`advance` moves it). Full when the pass ends; an error or
    interrupt leaves one line on stderr, not a bar."""
    if source.kind == ".parquet":
        bar = tqdm(total=source.num_rows, unit="rows", unit_scale=True, desc=desc, disable=not enabled)
    else:
        bar = tqdm(total=source.size, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, disable=not enabled)
    try:
        yield bar
        if bar.total and not bar.disable:
            bar.update(bar.total - bar.n)
    except BaseException:
        bar.leave = False
        raise
    finally:
        bar.close()


def advance(bar, source: "TableSource", rows: int):
    """Move ``bar`` (:func:`progress_bar`, or None) on by a batch of ``rows`` rows of ``source``."""
    if bar is None or bar.disable:
        return
    if bar.unit == "B":
        bar.update(max(0, min(source.bytes_read, bar.total or source.bytes_read) - bar.n))
    else:
        bar.update(rows)


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


# --------------------------------------------------------------------------- CSV rows as raw bytes

_QUOTE, _CR, _LF = 0x22, 0x0D, 0x0A
_OTHER, _QUOTE_CHAR, _DELIMITER, _LINE_BREAK = 0, 1, 2, 3  # byte classes of the tokenizer


def _ascii_compatible(encoding: str) -> bool:
    """Whether every byte below 0x80 of ``encoding`` is that ASCII character, wherever it appears.

    True for UTF-8, ASCII, Latin-1 and the single-byte codecs whose lower half
    is ASCII (cp1252, iso8859-15, koi8-r, ...). False for UTF-16/32, multi-byte
    and stateful codecs (a quote or comma byte can be part of a character
    there) and EBCDIC.
    """
    if encoding in ("utf-8", "ascii", "iso8859-1"):
        return True
    decode = codecs.lookup(encoding).decode
    module = sys.modules.get(type(getattr(decode, "__self__", None)).__module__)
    table = getattr(module, "decoding_table", None)  # the single-byte charmap codecs of the standard library
    return isinstance(table, str) and len(table) == 256 and table[:128] == "".join(map(chr, range(128)))


def _valid_utf8(data) -> bool:
    offsets = np.array([0, len(data)], np.int32)
    arr = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


class RawCsvRows:
    """A CSV file's raw bytes cut into the rows pyarrow parses, in step with :meth:`TableSource.batches`.

    A tokenizer vectorized with NumPy over each read block follows pyarrow's
    parser: a quote opens a quoted field only at the start of a field; inside
    one a doubled quote is a quote and a single one closes it; anywhere else a
    quote is an ordinary character. Unquoted delimiters end fields, unquoted
    CR, LF or CRLF end rows, empty lines are skipped. (Every quote run is
    first taken to toggle "inside quotes"; an odd run that follows an
    ordinary character where that puts it outside quotes is a run of
    ordinary characters, and each such run flips the parity after it.)

    :attr:`header` is the header row's bytes (with a UTF-8 byte-order mark
    and any blank lines before it); :meth:`take` gives the bytes of the next
    ``n`` data rows (their line breaks and any blank lines before them
    included) and each row's label field span. It checks that the rows agree
    with pyarrow's parse: the header's fields are the column names, every row
    has the header's field count, and the label fields' text (without their
    quotes) is pyarrow's label column byte for byte. On any disagreement, or
    in an encoding that is not ASCII-compatible (UTF-16, ...), :attr:`ok` is
    false and :meth:`take` gives ``None`` from then on: the writer renders
    the remaining rows from pyarrow's values.
    """

    def __init__(self, source):
        self.header = None
        self.ok = (not source.text and _ascii_compatible(source.encoding) and len(source.delimiter) == 1
                   and ord(source.delimiter) < 0x80 and source.delimiter not in '"\r\n')
        if not self.ok:
            return
        self._ncols, self._label = source.ncols, source.label_index
        self._lut = np.zeros(256, np.uint8)
        self._lut[_QUOTE] = _QUOTE_CHAR
        self._lut[ord(source.delimiter)] = _DELIMITER
        self._lut[[_CR, _LF]] = _LINE_BREAK
        self._specials = (ord(source.delimiter), _CR, _LF)
        opener = gzip.open if source.path.lower().endswith(".gz") else open
        self._file = opener(source.path, "rb")
        self._buf = np.empty(0, np.uint8)
        self._eof = False
        self._pos = 0  # start of the bytes not yet taken
        self._tail = 0  # start of the bytes not yet tokenized: always the start of a row
        self._rows = np.empty((3, 0), np.int64)  # per row: label start, label end, end (after its line break)
        self._next = 0  # the first row of _rows not yet taken
        if source.bom:
            self._tail = len(_UTF8_BOM)  # pyarrow skips the mark; it stays in the header's bytes
        if not self._rows_ready(1):
            self._fail()
            return
        end = int(self._rows[2, 0])
        header = bytes(self._buf[:end])
        self._pos, self._next = end, 1
        text = header[len(_UTF8_BOM):] if source.bom else header
        reader = csv.reader(pyio.StringIO(text.decode(source.encoding, errors="replace"), newline=""),
                            delimiter=source.delimiter, quotechar='"', doublequote=True, strict=False)
        fields = next((row for row in reader if row), None)
        if fields != source.names:
            self._fail()
            return
        self.header = header

    def take(self, n: int, labels: pa.Array):
        """``(data, start, end)``: the next ``n`` rows' bytes and their label fields ``data[start[i]:end[i]]``.

        ``labels`` is pyarrow's label column of the same rows (raw bytes).
        ``None`` if the rows cannot be shown to agree with it.
        """
        spans = self._take(n)
        if spans is None or not self._labels_agree(*spans, labels):
            return self._fail()
        return spans

    def _take(self, n: int):
        if not self.ok or not self._rows_ready(n):
            return self._fail()
        rows = self._rows[:, self._next:self._next + n]
        self._next += n
        start = self._pos
        self._pos = int(rows[2, -1]) if n else start
        return self._buf[start:self._pos], rows[0] - start, rows[1] - start

    def rest(self):
        """What follows the last row if it is blank lines only (written back as they are), else b""."""
        if not self.ok:
            return b""
        parts = [bytes(self._buf[self._pos:])]
        while not self._eof and not parts[-1].strip(b"\r\n"):
            self._read(keep=False)
            parts.append(bytes(self._buf))
        self._fail()
        data = b"".join(parts)
        return data if not data.strip(b"\r\n") else b""

    def close(self):
        self._fail()

    # ------------------------------------------------------------------ internals
    def _fail(self):
        if self.ok:
            self._file.close()
        self.ok = False
        self._buf = self._rows = None
        return None

    def _rows_ready(self, n: int) -> bool:
        while self._rows.shape[1] - self._next < n:
            if self._eof or not self._read():
                return False
        return True

    def _read(self, keep=True) -> bool:
        """Read on (at least a block, more while one row grows longer) and tokenize; False on a disagreement."""
        size = max(CSV_BLOCK_BYTES, 2 * (len(self._buf) - self._tail))
        chunk = self._file.read(size)
        self._eof = not chunk
        if not keep:
            self._buf = np.frombuffer(chunk, np.uint8)
            return True
        shift = self._pos
        self._buf = np.concatenate([self._buf[shift:], np.frombuffer(chunk, np.uint8)])
        self._rows = self._rows[:, self._next:] - shift
        self._next, self._pos, self._tail = 0, 0, self._tail - shift
        return self._tokenize()

    def _tokenize(self) -> bool:
        buf, t = self._buf, self._tail
        limit = len(buf)
        if not self._eof and limit > t and buf[limit - 1] == _CR:
            limit -= 1  # an LF may follow: the row's end is known once it is read
        seg = buf[t:limit]
        if len(seg) == 0:
            return True
        special = seg == _QUOTE
        scratch = np.empty_like(special)
        for byte in self._specials:
            special |= np.equal(seg, byte, out=scratch)
        pos = np.flatnonzero(special)
        del special, scratch
        kind = self._lut[seg[pos]]
        is_quote = kind == _QUOTE_CHAR
        quotes = int(np.count_nonzero(is_quote))
        if quotes:
            qpos = pos[is_quote]
            run = np.flatnonzero(np.concatenate([[True], qpos[1:] != qpos[:-1] + 1]))  # first quote of each run
            run_pos = qpos[run]
            odd = (np.diff(run, append=quotes) & 1) == 1
            after_char = np.zeros(len(run), bool)  # the byte before the run is an ordinary character
            inner = run_pos > 0
            after_char[inner] = self._lut[seg[run_pos[inner] - 1]] == _OTHER
            # Such an odd run is literal when the quotes before it leave us outside quotes. Counting every
            # quote, that parity is run & 1; each literal run flips it for everything after, so the literal
            # runs are the candidates where that parity changes, starting from "inside".
            cand = odd & after_char
            parity = run[cand] & 1
            literal = run_pos[cand][parity != np.concatenate([[1], parity[:-1]])]
            inside = np.cumsum(is_quote, dtype=np.uint8)  # quotes up to here, mod 256: the parity is kept
            if len(literal):
                inside += (np.searchsorted(literal, pos) & 1).astype(np.uint8)
            inside |= is_quote  # bit 0 clear: a delimiter or line break outside quotes
            bound = (inside & 1) == 0
            bounds, breaks = pos[bound], kind[bound] == _LINE_BREAK
        else:
            bounds, breaks = pos, kind == _LINE_BREAK
        line_ends = np.flatnonzero(breaks)  # indices into bounds
        if self._eof:  # the last row may end without a line break, or inside a quote that never closes
            last = int(bounds[line_ends[-1]]) if len(line_ends) else -1
            if last < len(seg) - 1:
                bounds = np.append(bounds, len(seg))
                line_ends = np.append(line_ends, len(bounds) - 1)
        if len(line_ends) == 0:
            return True
        self._tail = min(t + int(bounds[line_ends[-1]]) + 1, len(buf))
        stops = bounds[line_ends]
        first = np.concatenate([[0], line_ends[:-1] + 1])  # each row's first bound
        starts = np.concatenate([[0], stops[:-1] + 1])
        full = stops > starts  # an empty line is no row
        if not full.all():
            first, starts, stops, line_ends = first[full], starts[full], stops[full], line_ends[full]
            if len(stops) == 0:
                return True
        if np.any(line_ends - first + 1 != self._ncols):
            return False  # pyarrow reads another field count: not the same rows
        rows = np.empty((3, len(stops)), np.int64)
        np.add(bounds[first + self._label], t, out=rows[1])  # the label field's end
        if self._label:
            np.add(bounds[first + self._label - 1], t + 1, out=rows[0])
        else:
            np.add(starts, t, out=rows[0])
        last = len(seg) - 1
        at = np.minimum(stops, last)
        crlf = (seg[at] == _CR) & (seg[np.minimum(stops + 1, last)] == _LF) & (stops < last)  # CRLF: both bytes
        np.add(np.minimum(stops + 1, len(seg)) + crlf, t, out=rows[2])  # the row's end, after its line break
        self._rows = np.concatenate([self._rows, rows], axis=1) if self._rows.shape[1] > self._next else rows
        if self._rows is rows:
            self._next = 0
        return True

    @staticmethod
    def _labels_agree(data, start, end, labels) -> bool:
        lens = end - start
        if len(lens) == 0:
            return len(labels) == 0
        if len(labels) != len(lens) or np.any(lens <= 0):
            return False
        total = int(lens.sum())
        got = data[np.repeat(start - (np.cumsum(lens) - lens), lens) + np.arange(total)]
        quoted = data[start] == _QUOTE
        is_quote = got == _QUOTE
        if int(np.count_nonzero(is_quote)) != 2 * int(np.count_nonzero(quoted)):
            return False
        if not np.all(data[end[quoted] - 1] == _QUOTE):
            return False
        bufs = labels.buffers()
        offsets = np.frombuffer(bufs[1], np.int32)[labels.offset: labels.offset + len(labels) + 1]
        if not np.array_equal(np.diff(offsets), lens - 2 * quoted):
            return False
        want = np.frombuffer(bufs[2], np.uint8)[offsets[0]:offsets[-1]] if bufs[2] is not None else got[:0]
        return np.array_equal(got[~is_quote], want)


# --------------------------------------------------------------------------- writing


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
            self._file.write(_UTF8_BOM)
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
            if spans is not None and source.encoding == "utf-8" and not _valid_utf8(spans[0]):
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


# --------------------------------------------------------------------------- atomic outputs

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


def _commit(temps, targets):
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
def atomic_outputs(*targets):
    """Temporary paths beside ``targets``, renamed onto them together only on success.

    An existing target is replaced, unless it is a key file (:func:`is_key_file`: never); the command
    line refuses existing outputs before any work unless ``--overwrite`` (:func:`check_outputs`).
    On any failure (an exception, ``KeyboardInterrupt``) the temporary files
    and the directories created for them are removed and existing targets are
    left as they were; both are registered with :mod:`rpwjax.interrupts`, so
    that the command line's SIGINT or SIGTERM removes them too.
    """
    targets = [Path(t) for t in targets]
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
            _commit(temps, targets)
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
    _check_exists(path, "params file")
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"params file {str(path)!r} is not valid JSON: {err}") from None
