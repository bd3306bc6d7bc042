"""Apply a fitted mechanism to labels: arrays, and whole files streamed in chunks.

Work is sharded over all JAX devices block by block; since a block's
randomness depends only on its index, the output does not depend on the
number of devices either.

Randomness is tied to the GLOBAL row index, not to how the rows are chunked:
rows are grouped in fixed blocks of :data:`BLOCK_ROWS`; block ``b`` samples
with ``fold_in(key, b)`` and every mechanism draws per-element randomness, so
row ``i`` always sees the same random numbers. The same seed therefore gives
bit-identical output for any ``chunk_rows``.

The seed is a secret: with it and the parameters anyone can undo the noise.
It is never written to the sidecar file.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from . import io
from .base import Mechanism
from .errors import InputError, check_labels

BLOCK_ROWS = 1 << 16
DEFAULT_CHUNK_ROWS = 1 << 20
GRID_BITS = 24  # output grid step = 2**(floor(log2(hi - lo)) - GRID_BITS)


def output_grid(params: Mechanism) -> float | None:
    """The public grid step continuous outputs are snapped to (None for discrete outputs).

    A power of two, so grid points are exact in float64: rounding to it
    erases the low-order bits of the floating-point sample, which could
    otherwise carry information about the true label beyond what the ideal
    real-valued mechanism reveals. Snapping is post-processing: it costs no
    privacy.
    """
    if params.discrete:
        return None
    return float(2.0 ** (np.floor(np.log2(params.hi - params.lo)) - GRID_BITS))


@partial(jax.jit, static_argnames=("num_blocks", "grid"))
def _sample_blocks(params, key, first_block, y_blocks, num_blocks, grid):
    keys = jax.vmap(lambda b: jax.random.fold_in(key, b))(first_block + jnp.arange(num_blocks))
    out = jax.vmap(params.sample)(keys, y_blocks)
    if grid is not None:
        out = jnp.round(out / grid) * grid
    return out


def privatize_array(params: Mechanism, key, labels, *, start: int = 0) -> np.ndarray:
    """Noisy labels for ``labels`` sitting at global rows ``start ...`` (float64, any chunking).

    Continuous outputs are snapped to :func:`output_grid`.
    """
    y = np.asarray(labels, dtype=np.float64).ravel()
    offset = start % BLOCK_ROWS
    devices = jax.local_devices()  # multi-host: each process shards its own rows over its own devices
    num_blocks = -(-(offset + y.size) // BLOCK_ROWS)
    num_blocks = -(-num_blocks // len(devices)) * len(devices)  # whole blocks on every device
    padded = np.full(num_blocks * BLOCK_ROWS, params.lo, dtype=np.float64)
    padded[offset : offset + y.size] = y
    with jax.enable_x64(True):
        blocks = padded.reshape(num_blocks, BLOCK_ROWS)
        if len(devices) > 1:
            # blocks are independent (each has its own key), so sharding them over
            # devices changes where a block is computed, never what it computes
            mesh = jax.sharding.Mesh(np.array(devices), ("blocks",))
            blocks = jax.device_put(blocks, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("blocks")))
        out = _sample_blocks(params, key, start // BLOCK_ROWS, blocks, num_blocks=num_blocks, grid=output_grid(params))
        out = np.asarray(out).reshape(-1)
    return out[offset : offset + y.size]


def privatize_file(
    input_path,
    output_path,
    *,
    label_column: str,
    params: Mechanism,
    key,
    record: dict,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    clip: bool = False,
    progress: bool = True,
    row_offset: int = 0,
    postprocess=None,
    postprocess_name: str | None = None,
) -> dict:
    """Stream ``input_path`` to ``output_path`` with the label column privatized.

    Every column is kept in order; the label column is replaced by float64
    noisy labels. ``row_offset`` is the global index of the file's first row
    when the file is one shard of a larger data set (shards privatized on
    different machines then match a single run over the whole data).
    ``postprocess`` (e.g. posterior denoising) maps the private labels of each
    chunk before they are written; it must be a function of the private
    labels and public quantities only. ``output_path.json`` receives ``record`` plus the row count.
    Both files appear only if the whole file succeeded.
    """
    in_kind = io.file_kind(input_path, what="input file")
    out_kind = io.file_kind(output_path, what="output file")
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
                    noisy = privatize_array(params, key, y, start=int(row_offset) + rows)
                    if postprocess is not None:
                        noisy = np.asarray(postprocess(noisy), dtype=np.float64)
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
        sidecar = dict(record, rows=rows, label_column=label_column, output_grid=output_grid(params),
                       postprocessing=postprocess_name)
        io.write_json(str(output_path) + ".json", sidecar)
    return sidecar
