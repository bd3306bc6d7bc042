"""Label files and input tables opened for streaming: :class:`TableSource` and :func:`read_labels`.

* **CSV** is parsed by pyarrow with every column as raw text (no type
  inference, no null values), so a column other than the label can never fail
  a run, wherever an odd value sits. Only the label column is parsed, as
  float64. The file must decode in its encoding (UTF-8 unless ``encoding``
  says otherwise). Read blocks are ``CSV_BLOCK_BYTES`` (4 MiB); a longer row
  makes the block 4x larger, up to ``CSV_MAX_BLOCK_BYTES`` (256 MiB), and a
  row longer than that is refused.
* **Parquet** columns other than the label keep their schema and values.
* Every error about a row names the 1-based **data row** (the header is not a
  data row) and, for CSV and text files, the 1-based **physical line** where
  that row starts (blank lines and line breaks inside quoted fields counted),
  for any position in the file and any chunk size. The line is found on the
  error path by a second, quote-aware pass over the file (Python's ``csv``
  module with the same dialect), so finding it costs one read of the file up
  to that row.

:func:`progress_bar` and :func:`advance` show one pass over a source.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import gzip
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from rpwjax.errors import InputError, check_label_rows, one_line, show_value

TABLE_SUFFIXES = (".csv", ".parquet")
LABEL_SUFFIXES = TABLE_SUFFIXES + (".txt",)

CSV_BLOCK_BYTES = 1 << 22  # bytes per CSV read block: peak memory does not grow with the file
CSV_MAX_BLOCK_BYTES = 1 << 28  # a longer row grows the block 4x at a time up to this (256 MiB); longer is refused
MAX_CHUNK_ROWS = 1 << 22  # --chunk-rows lies in [1, MAX_CHUNK_ROWS]
MAX_GLOBAL_ROWS = 1 << 63  # every global row index (row offset + row) lies in [0, 2^63): it never wraps
_TXT_DELIMITER = "\x1f"  # a text label file has one field per line: split on a character a number never holds
UTF8_BOM = b"\xef\xbb\xbf"


def file_kind(path, allowed=TABLE_SUFFIXES, what="file") -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in allowed:
        raise InputError(f"{what} must end in {', '.join(allowed)}, got {str(path)!r}")
    return suffix


def check_exists(path, what="input file"):
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
        check_exists(path, what)
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
        self.bom = self.encoding == "utf-8" and head.startswith(UTF8_BOM)
        try:
            text = codecs.getincrementaldecoder(self.encoding)(errors="replace").decode(head)
        except UnicodeError as err:  # not a byte error (those are replaced): e.g. UTF-16 without a BOM
            raise self._undecodable(err) from None
        self.newline = "\n"
        for i, ch in enumerate(text):
            if ch in "\r\n":
                self.newline = "\r\n" if text[i:i + 2] == "\r\n" else ch
                break
        self.ncols = None
        self.names = None
        with self._reader({}) as reader:  # the column count, from pyarrow's own parse of the first row
            self.ncols = len(reader.schema.names)
        self._release_stream()
        with self._reader(self._text_types()) as reader:
            first = self._next(reader, 0)
        self._release_stream()
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
                self._release_stream()
                if not self._grow_block(err):
                    self._failure(err, 0)

    def _release_stream(self):
        """Let go of the file a reader was given, without closing its descriptor here.

        pyarrow's streaming CSV reader reads blocks ahead on its I/O thread, and
        closing the reader does not wait for a read already queued. Closing the
        file from here could let that read run on the descriptor number after
        the next ``open`` reused it: it would consume bytes of the next reader
        of this file (a header found mid-file, or rows skipped). pyarrow closes
        the descriptor when its last reference to the file goes, so no read
        can outlive it.
        """
        self._raw = None

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
                del reader
                self._release_stream()

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
        values = np.asarray(y.to_numpy(zero_copy_only=False), dtype=np.float64)
        self._check_overflow(values, text, first_row)
        return values

    def _check_overflow(self, values, text, first_row: int):
        """Refuse a label whose text is a finite number too large for float64 (e.g. ``1e400``, which parses as
        inf), naming the text as given: the later finiteness check only sees the parsed inf. Only the batch's
        first non-finite label is looked at (errors name the first bad row); one written as nan, inf or
        infinity is left to that check."""
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size == 0 or not np.isinf(values[bad[0]]):
            return
        i = int(bad[0])
        given = text[i].as_py()
        if given.lstrip("+-").lower() not in ("inf", "infinity"):
            raise InputError(f"label {show_value(given)} in column {self.label_column!r} lies outside float64's "
                             f"range (it would read as {float(values[i])!r}), at {self.where(first_row + i)}")

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
        except UnicodeError as err:  # a codec that refuses the file as a whole (undecodable bytes are escaped)
            raise self._undecodable(err) from None
        finally:
            csv.field_size_limit(limit)

    # ------------------------------------------------------------------ failures
    def _undecodable(self, err) -> InputError:
        """The file cannot be read in its encoding at all (not one bad byte: e.g. ``--encoding utf-16`` on a
        file without a byte order mark), naming the file and the encoding."""
        return InputError(f"{self.what} {self.path!r} cannot be read as {self.encoding_name}: {one_line(err)} "
                          "(give the file's encoding with --encoding)")

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
