"""A CSV file's own bytes cut into pyarrow's rows (:class:`RawCsvRows`), for CSV into CSV.

CSV into CSV writes the input's own bytes back with only the label fields
replaced: :class:`RawCsvRows` cuts the raw bytes into pyarrow's rows with a
vectorized tokenizer and checks them against pyarrow's parse (the header's
names, every row's field count, the label text), so every other field, the
header, quotes (optional ones included), line terminators, blank lines and a
UTF-8 byte-order mark come out as they went in. Where the check fails, or the
encoding is not ASCII-compatible (UTF-16, ...), the rows from there on are
rendered from pyarrow's values instead (:class:`rpwjax.io.writers.CsvOut`):
the same values, each field quoted only where the dialect requires it, in the
same encoding and line terminator.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io as pyio
import sys

import numpy as np
import pyarrow as pa

from rpwjax.io import source as table_source
from rpwjax.io.source import UTF8_BOM

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


def valid_utf8(data) -> bool:
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
            self._tail = len(UTF8_BOM)  # pyarrow skips the mark; it stays in the header's bytes
        if not self._rows_ready(1):
            self._fail()
            return
        end = int(self._rows[2, 0])
        header = bytes(self._buf[:end])
        self._pos, self._next = end, 1
        text = header[len(UTF8_BOM):] if source.bom else header
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
        # the block size is the source reader's, read at call time: one setting for both readers
        size = max(table_source.CSV_BLOCK_BYTES, 2 * (len(self._buf) - self._tail))
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
