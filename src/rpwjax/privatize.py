"""Privatize whole files, streamed in chunks, through the one release path.

Every released label comes from :func:`rpwjax.release_path.release`: float64
sampling, the public grid and clamp, and per-block keys derived from the
secret, tied to the GLOBAL row index (blocks of
:data:`rpwjax.release_path.BLOCK_ROWS` rows). The same secret therefore gives
bit-identical output for any ``chunk_rows``, any number of devices and any
split into shards (``row_offset``).

The labels are released with ``secret.child("release")`` (:func:`release_secret`),
the same derivation :func:`rpwjax.dask.privatize_dataframe` and ``rpwjax
privatize --key-file`` use, so one key file gives the same output through
every entry point. The secret is never written anywhere: the sidecar says
only whether it was an experiments-only integer seed.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from . import io
from .base import Mechanism
from .errors import InputError, check_labels
from .keys import Secret, secret_record
from .release_path import release, sidecar_fields

DEFAULT_CHUNK_ROWS = 1 << 20
RELEASE_PURPOSE = "release"


def release_secret(secret: Secret) -> Secret:
    """The secret a file or data frame release draws from: ``secret.child("release")``.

    Kept apart from the fit's ``secret.child("fit")`` (the private histogram of
    an inline fit), so the two never share a key.
    """
    if not isinstance(secret, Secret):
        raise InputError(f"secret must be an rpwjax.keys.Secret (e.g. Secret.from_file(KEYFILE)), "
                         f"got {type(secret).__name__}")
    return secret.child(RELEASE_PURPOSE)


def randomness_record(secret: Secret, record: dict) -> dict:
    """``reproducible_seed`` and ``randomness`` for a sidecar: an integer seed anywhere upstream
    (the release, or the fit whose ``record`` is published with it) marks the whole release."""
    out = secret_record(secret)
    if not out["reproducible_seed"] and record.get("reproducible_seed"):
        out = {"reproducible_seed": True,
               "randomness": "the fit's private histogram used an integer seed: reproducible, not for production"}
    return out


def output_fields(params: Mechanism, postprocess_range=None) -> dict:
    """``output_grid`` and ``output_range`` of what is written.

    Without post-processing they are the release's (every value on the grid,
    inside the range). A post-processing map (posterior denoising) writes
    values in ``postprocess_range`` instead, off the grid: the sidecar then
    gives ``output_grid`` null, ``output_range`` the hull of both ranges, and
    the release's own as ``release_grid``/``release_range``.
    """
    fields = sidecar_fields(params)
    if postprocess_range is None:
        return fields
    a, b = fields["output_range"]
    lo, hi = (float(v) for v in postprocess_range)
    return {"output_grid": None, "output_range": [min(a, lo), max(b, hi)],
            "release_grid": fields["output_grid"], "release_range": [a, b]}


def privatize_file(
    input_path,
    output_path,
    *,
    label_column: str,
    params: Mechanism,
    secret: Secret,
    record: dict,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    clip: bool = False,
    progress: bool = True,
    row_offset: int = 0,
    postprocess=None,
    postprocess_name: str | None = None,
    postprocess_range=None,
) -> dict:
    """Stream ``input_path`` to ``output_path`` with the label column privatized.

    Every column is kept in order; the label column is replaced by float64
    released labels (:func:`rpwjax.release_path.release` with :func:`release_secret` of ``secret``, e.g.
    ``Secret.from_file(KEYFILE)``). ``row_offset`` is the global index of the file's first row
    when the file is one shard of a larger data set (shards privatized on
    different machines then match a single run over the whole data).
    ``postprocess`` (e.g. posterior denoising) maps the private labels of each
    chunk before they are written; it must be a function of the private
    labels and public quantities only. ``output_path.json`` receives ``record`` plus the row count.
    Both files appear only if the whole file succeeded.
    """
    in_kind = io.file_kind(input_path, what="input file")
    out_kind = io.file_kind(output_path, what="output file")
    key = release_secret(secret)
    if postprocess is not None and postprocess_range is None:
        raise InputError("postprocess needs postprocess_range, the public interval its values lie in")
    if int(chunk_rows) != chunk_rows or chunk_rows < 1:
        raise InputError(f"chunk_rows must be a positive integer, got chunk_rows={chunk_rows!r}")
    if int(row_offset) != row_offset or row_offset < 0:
        raise InputError(f"row_offset must be a non-negative integer, got row_offset={row_offset!r}")
    from pathlib import Path

    if Path(input_path).resolve() == Path(output_path).resolve():
        raise InputError(f"output must differ from input, got {str(output_path)!r} for both")
    total = io.count_rows(input_path) if in_kind == ".parquet" else None
    rows = 0
    with io.atomic_path(output_path) as tmp:
        writer = None
        try:
            bar = tqdm(total=total, unit="rows", unit_scale=True, disable=not progress, desc="privatize")
            with bar:
                for batch in io.iter_batches(input_path, label_column, int(chunk_rows)):
                    index = batch.schema.get_field_index(label_column)
                    y = io._label_array(batch.column(index), label_column)
                    try:
                        y = check_labels(y, params.lo, params.hi, clip=clip, name="labels")
                    except InputError as err:
                        raise InputError(f"{err} (chunk starting at row {rows})") from None
                    noisy = release(params, key, y, start=int(row_offset) + rows)
                    if postprocess is not None:
                        noisy = np.clip(np.asarray(postprocess(noisy), dtype=np.float64), *postprocess_range)
                    batch = batch.set_column(index, pa.field(label_column, pa.float64()), pa.array(noisy))
                    if writer is None:
                        writer = io.TableWriter(tmp, batch.schema, out_kind)
                    writer.write(batch)
                    rows += batch.num_rows
                    bar.update(batch.num_rows)
                    del batch, noisy, y
                    pa.default_memory_pool().release_unused()  # keep peak memory flat on long files
        finally:
            if writer is not None:
                writer.close()
        if rows == 0:
            raise InputError(f"input file {str(input_path)!r} has no rows")
        sidecar = dict(record, rows=rows, label_column=label_column, **output_fields(params, postprocess_range),
                       postprocessing=postprocess_name, **randomness_record(secret, record))
        io.write_json(str(output_path) + ".json", sidecar)
    return sidecar
