"""Files in and out: label files, CSV/Parquet tables in chunks, atomic writes.

Nothing is written half: outputs go to a temporary file in the target's
directory and are renamed into place only after the whole run succeeded.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from .errors import InputError

TABLE_SUFFIXES = (".csv", ".parquet")
LABEL_SUFFIXES = TABLE_SUFFIXES + (".txt",)


def file_kind(path, allowed=TABLE_SUFFIXES, what="file") -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in allowed:
        raise InputError(f"{what} must end in {', '.join(allowed)}, got {str(path)!r}")
    return suffix


def _check_exists(path):
    if not Path(path).is_file():
        raise InputError(f"input file not found: {str(path)!r}")


def _label_array(column, name: str) -> np.ndarray:
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_null(column.type)):
        raise InputError(f"label column {name!r} must be numeric, got type {column.type}")
    if column.null_count:
        first = int(np.flatnonzero(np.asarray(column.is_null()))[0])
        raise InputError(f"label column {name!r} has a missing value at row {first}")
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)


def read_labels(path, label_column: str | None = None) -> np.ndarray:
    """All labels of a label file: CSV/Parquet (``label_column``) or text (one number per line)."""
    kind = file_kind(path, LABEL_SUFFIXES, "labels file")
    _check_exists(path)
    if kind == ".txt":
        try:
            table = pacsv.read_csv(
                path,
                read_options=pacsv.ReadOptions(column_names=["label"]),
                convert_options=pacsv.ConvertOptions(column_types={"label": pa.float64()}),
            )
        except pa.ArrowInvalid as err:
            raise InputError(f"labels file {str(path)!r} must hold one number per line: {err}") from None
        column = table.column("label")
        name = "label"
    else:
        if not label_column:
            raise InputError("--label-column is required for CSV and Parquet label files")
        table = _read_columns(path, kind, [label_column])
        column, name = table.column(label_column), label_column
    if len(column) == 0:
        raise InputError(f"labels file {str(path)!r} is empty: need at least one label")
    return _label_array(column.combine_chunks() if hasattr(column, "combine_chunks") else column, name)


def _read_columns(path, kind, columns):
    names = table_columns(path)
    missing = [c for c in columns if c not in names]
    if missing:
        raise InputError(f"label column {missing[0]!r} not found in {str(path)!r}; columns are {names}")
    if kind == ".parquet":
        return pq.read_table(path, columns=columns)
    return pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(include_columns=columns))


def table_columns(path) -> list[str]:
    kind = file_kind(path)
    _check_exists(path)
    if kind == ".parquet":
        return list(pq.ParquetFile(path).schema_arrow.names)
    with pacsv.open_csv(path) as reader:
        return list(reader.schema.names)


def count_rows(path) -> int | None:
    """Row count where it is cheap (Parquet metadata); None for CSV."""
    if file_kind(path) == ".parquet":
        return pq.ParquetFile(path).metadata.num_rows
    return None


def iter_batches(path, label_column: str, chunk_rows: int):
    """Record batches of at most ``chunk_rows`` rows, in file order (CSV: label column read as float64)."""
    kind = file_kind(path, what="input file")
    _check_exists(path)
    if label_column not in table_columns(path):
        raise InputError(f"label column {label_column!r} not found in {str(path)!r}; columns are {table_columns(path)}")
    if kind == ".parquet":
        # pre-buffering reads whole column chunks ahead and keeps them: streaming
        # reads with a bounded buffer keep peak memory flat for files of any size
        with pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 22) as reader:
            yield from reader.iter_batches(batch_size=chunk_rows)
        return
    reader = pacsv.open_csv(
        path,
        # no threaded read-ahead: it queues blocks without bound and peak memory
        # would grow with the file
        read_options=pacsv.ReadOptions(block_size=1 << 22, use_threads=False),
        convert_options=pacsv.ConvertOptions(column_types={label_column: pa.float64()}),
    )
    with reader:
        # CSV blocks are yielded as read (split when larger than chunk_rows): the
        # output does not depend on where chunks start, so nothing is re-joined
        for batch in reader:
            for offset in range(0, batch.num_rows, chunk_rows):
                yield batch.slice(offset, chunk_rows)


@contextlib.contextmanager
def atomic_path(target):
    """Yield a temporary path beside ``target``; rename it onto ``target`` only on success."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class TableWriter:
    """Streaming CSV or Parquet writer keyed on the output's extension."""

    def __init__(self, path, schema: pa.Schema, kind: str):
        self.kind = kind
        if kind == ".parquet":
            self._writer = pq.ParquetWriter(path, schema)
        else:
            self._writer = pacsv.CSVWriter(path, schema)

    def write(self, batch: pa.RecordBatch):
        if self.kind == ".parquet":
            self._writer.write_batch(batch)
        else:
            self._writer.write(batch)

    def close(self):
        self._writer.close()


def write_json(path, obj):
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2) + "\n")


def read_json(path):
    _check_exists(path)
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"params file {str(path)!r} is not valid JSON: {err}") from None
