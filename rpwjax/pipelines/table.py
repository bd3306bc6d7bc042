"""A user's table in, a table out: the feature-aware pipelines on a file (``rpwjax privatize-table``).

The table is read in memory (the pipelines train models on all rows). Every
label is checked first (errors name the data row and line), the features are
standardized with their own statistics (features are public under label-DP),
the pipeline of the registry runs once, and the output keeps every other
column as it came in (:func:`rpwjax.io.copy_with_labels`); the sidecar
``OUTPUT.json`` carries the accounting. Nothing is written unless the whole
run succeeds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rpwjax import io
from rpwjax.errors import InputError, check_epsilon, check_range
from rpwjax.keys import Secret, secret_record
from rpwjax.pipelines import pipeline as lookup

DEFAULT_EPOCHS = 50


def standardized(features) -> np.ndarray:
    """Features centred and scaled by their own mean and standard deviation (constant columns: scale 1)."""
    x = np.asarray(features, np.float64)
    scale = x.std(axis=0)
    return ((x - x.mean(axis=0)) / np.where(scale > 0, scale, 1.0)).astype(np.float32)


def privatize_table(input_path, output_path, *, label_column: str, lo: float, hi: float, epsilon: float,
                    pipeline: str = "auto", secret: Secret, clip: bool = False, encoding=None,
                    epochs: int | None = None, release_id: str | None = None, before_commit=None) -> dict:
    """Privatize ``label_column`` of a CSV/Parquet table with a registry pipeline; returns the sidecar.

    ``epochs`` (stage-model epochs) is refused for a pipeline that trains no stage model. Every draw of
    the pipeline comes from ``secret`` bound to one release (``release_id``, fresh by default, unless
    ``secret`` is already bound; the sidecar records it). ``before_commit(rows)``, if given, runs once the
    output is complete and before it appears; the dict it returns joins the sidecar.
    """
    from rpwjax.experiments.datasets import load_table
    from rpwjax.privatize import DEFAULT_CHUNK_ROWS, bind_release

    row = lookup(pipeline)
    eps = float(check_epsilon(epsilon))
    lo, hi = check_range(lo, hi)
    secret = bind_release(secret, release_id, command="privatize-table", label_column=label_column,
                          settings={"pipeline": pipeline, "epsilon": eps, "range": [lo, hi], "epochs": epochs,
                                    "clip": clip})
    kind = io.file_kind(output_path, what="output file")
    io.file_kind(input_path, what="input file")
    if Path(input_path).resolve() == Path(output_path).resolve():
        raise InputError(f"output must not overwrite the input, got {str(output_path)!r}")
    if epochs is not None and not row.trains_models:
        raise InputError(f"--epochs {epochs} does nothing for --pipeline {pipeline} (it trains no stage "
                         "model; the two-stage pipelines do)")
    epochs = DEFAULT_EPOCHS if epochs is None else epochs
    if isinstance(epochs, bool) or int(epochs) != epochs or epochs < 1:
        raise InputError(f"epochs must be a positive integer, got epochs={epochs!r}")
    source = io.TableSource(input_path, label_column, encoding=encoding)
    # every label checked first, so that errors name the data row and line
    io.read_labels(input_path, label_column, encoding=encoding, check=(lo, hi, clip))
    data = load_table(input_path, label_column, lo, hi, clip=clip, encoding=encoding)
    y = data.labels
    labels, record = row.run(standardized(data.features), y, lo, hi, eps, secret=secret, epochs=int(epochs))
    labels = np.asarray(labels, dtype=np.float64)
    if labels.shape != y.shape or not np.all(np.isfinite(labels)):
        raise RuntimeError("the pipeline produced labels of the wrong shape or non-finite labels")
    sidecar = {
        "format_version": 1, "pipeline": pipeline, "rows": int(y.size),
        "feature_columns": list(data.feature_names), "label_column": label_column,
        "postprocessing": row.postprocessing,
        "accounting": record,
        **secret_record(secret),
        "release_id": secret.release_id, "row_offset": 0,
    }
    dump = lambda obj: json.dumps(obj, indent=2, allow_nan=False,  # noqa: E731
                                  default=lambda v: v.item() if hasattr(v, "item") else str(v)) + "\n"
    dump(sidecar)  # fail before writing
    out = Path(output_path)
    with io.atomic_outputs(out, out.with_name(out.name + ".json")) as (tmp, tmp_json):
        rows = io.copy_with_labels(source, tmp, kind, lambda first, part: labels[first - 1: first - 1 + part.size],
                                   chunk_rows=DEFAULT_CHUNK_ROWS)
        if rows != y.size:
            raise InputError(f"{str(input_path)!r} changed while it was read ({y.size} rows, then {rows})")
        if before_commit is not None:
            sidecar.update(before_commit(rows))
        tmp_json.write_text(dump(sidecar))
    return sidecar
