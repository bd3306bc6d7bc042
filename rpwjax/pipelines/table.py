"""A user's table in, a table out: the feature-aware pipelines on a file (``rpwjax privatize-table``).

The table is read in memory (the pipelines train models on all rows). Every
label is checked first (errors name the data row and line), the features are
chosen (:func:`rpwjax.tables.choose_features`: ``features``/``exclude``, or
the numeric columns that do not look like identifiers; missing values
filled) and standardized with their own statistics (features are public
under label-DP), the pipeline of the registry runs once, and the output keeps
every other column as it came in (:func:`rpwjax.io.writers.copy_with_labels`; CSV
into Parquet: each column as the type of all its values); the sidecar
``OUTPUT.json`` carries the accounting and the feature choice. Nothing is
written unless the whole run succeeds.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from rpwjax.io.atomic import atomic_outputs, check_outputs
from rpwjax.io.source import TableSource, file_kind, progress_bar, read_labels
from rpwjax.io.writers import copy_with_labels
from rpwjax import noise
from rpwjax.errors import InputError, check_epsilon, check_integer, check_range
from rpwjax.keys import Secret, secret_record
from rpwjax.pipelines import auto
from rpwjax.pipelines import pipeline as lookup
from rpwjax.ledger import ledger_path
from rpwjax.ledger import ReleasedDigest
from rpwjax.privatize import bind_release, open_release
from rpwjax.tables import read_feature_table, standardized_column

DEFAULT_EPOCHS = 50
# An early refusal, before any label is read: a pipeline's exact integer noise has rate epsilon·share/R, R = 2^20
# the resolution of its private sums (rpwjax.pipelines.statistics) and share the part of epsilon one release gets
# (0.05 the smallest measured over the registry; 1/32 assumed here), so epsilon below noise.min_epsilon(R·32)
# (about 3.3e-10) cannot be drawn. A smaller share is still refused, later, by the sampler itself
# (rpwjax.noise.discrete_laplace), as an input error before anything is written.
SAMPLER_DIVISOR = (1 << 20) * 32


def check_pipeline_epsilon(epsilon) -> float:
    """``epsilon`` of a pipeline, positive and finite and large enough for its exact noise sampler (checked before
    any work: a pipeline releases statistics with :func:`rpwjax.noise.discrete_laplace` at a share of it)."""
    return float(noise.check_noise_epsilon(epsilon, divisor=SAMPLER_DIVISOR,
                                           what=" of the pipeline's private statistics (a share of epsilon each)"))


def standardized(features) -> np.ndarray:
    """Features centred and scaled by their own mean and standard deviation (constant columns: 0), float32:
    :func:`rpwjax.tables.standardized_column` of each column (the chosen columns already are; the 0/1
    missing-value indicators become so). Column by column: peak memory is the float32 matrix and one float64
    column."""
    x = np.asarray(features)
    out = np.empty(x.shape, np.float32)
    for j in range(x.shape[1]):
        out[:, j] = standardized_column(x[:, j])
    return out


WRITE_CHUNK_ROWS = 1 << 18  # rows per batch of the write (the labels are known: the output does not depend on it)


def _give_back_memory():
    """Hand memory freed by the last step back to the system (glibc keeps freed blocks in its arenas, pyarrow in its
    pool), so that one step's peak does not stay resident under the next."""
    import ctypes
    import gc

    gc.collect()

    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


class _Steps:
    """The run's steps on stderr: each pass over the file is a bar of its own named ``[i/N] step`` (one bar at a time,
    so that an error leaves its one line and no bar); the pipeline's steps are one bar, its postfix the step."""

    def __init__(self, count: int, enabled: bool):
        self.count, self.enabled, self.done = count, enabled, 0

    def desc(self, name: str) -> str:
        _give_back_memory()
        self.done += 1
        return f"[{self.done}/{self.count}] {name}"

    @contextlib.contextmanager
    def pipeline(self, name: str, steps: int):
        """A bar over the pipeline's ``steps``; yields ``step(name)`` for :meth:`rpwjax.pipelines.Pipeline.run`."""
        bar = tqdm(total=steps, desc=self.desc(name), unit="step", disable=not self.enabled,
                   bar_format="{desc}: {n_fmt}/{total_fmt} steps [{elapsed}] {postfix}")
        started = []

        def step(what):
            _give_back_memory()
            if started:
                bar.update(1)
            started.append(what)
            bar.set_postfix_str(what)

        try:
            yield step
            bar.update(bar.total - bar.n)
        except BaseException:
            bar.leave = False
            raise
        finally:
            bar.close()


def release_settings(pipeline: str, epsilon, range, epochs, clip: bool, features=None, exclude=None,
                     encoding=None) -> dict:
    """The settings that make a ``privatize-table`` release what it is (its identity and its ledger digest).

    The feature columns asked for (``features`` / ``exclude``) and the encoding join only when given, so a
    release on the default choice keeps the identity it always had, and one on other features is another
    release: its noise is independent, and giving its id back is refused as other settings, not taken for a
    reproduction."""
    settings = {"pipeline": pipeline, "epsilon": float(epsilon), "range": [float(v) for v in range],
                "epochs": epochs, "clip": clip}
    for name, value in (("features", features), ("exclude", exclude)):
        if value is not None:
            settings[name] = [str(v) for v in value]
    if encoding is not None:
        settings["encoding"] = str(encoding)
    return settings


def privatize_table(input_path, output_path, *, label_column: str, lo: float, hi: float, epsilon: float,
                    pipeline: str = "auto", secret: Secret, clip: bool = False, encoding=None,
                    epochs: int | None = None, release_id: str | None = None, before_commit=None,
                    features=None, exclude=None, progress: bool = False, report=None, rows_read=None) -> dict:
    """Privatize ``label_column`` of a CSV/Parquet table with a registry pipeline; returns the sidecar.

    ``epochs`` (stage-model epochs) is refused for a pipeline that trains no stage model. Every draw of
    the pipeline comes from ``secret`` bound to one release (``release_id``, fresh by default, unless
    ``secret`` is already bound; the sidecar records it). ``before_commit(rows, accounting, released_sha256)``, if
    given, runs once the output is complete and before it appears, with the pipeline's record (its serialized
    account, :class:`rpwjax.accounting.Accounting`) and the digest of the released labels
    (:class:`rpwjax.ledger.ReleasedDigest`); the dict it returns joins the sidecar. ``features`` /
    ``exclude``: the feature columns on purpose (:func:`rpwjax.tables.choose_features`). ``progress``: bars
    on stderr for each step (reading, the pipeline's steps, writing). ``report(line)``, if given, receives
    the feature choice in words.
    """
    row = lookup(pipeline)
    eps = check_pipeline_epsilon(epsilon)
    lo, hi = check_range(lo, hi)
    secret = bind_release(secret, release_id, command="privatize-table", label_column=label_column,
                          settings=release_settings(pipeline, eps, (lo, hi), epochs, clip, features, exclude, encoding))
    kind = file_kind(output_path, what="output file")
    file_kind(input_path, what="input file")
    if Path(input_path).resolve() == Path(output_path).resolve():
        raise InputError(f"output must not overwrite the input, got {str(output_path)!r}")
    if epochs is not None and not row.trains_models:
        raise InputError(f"--epochs {epochs} does nothing for --pipeline {pipeline} (it trains no stage "
                         "model; the two-stage pipelines do)")
    epochs = DEFAULT_EPOCHS if epochs is None else epochs
    epochs = check_integer(epochs, "epochs")
    source = TableSource(input_path, label_column, encoding=encoding)
    steps = _Steps(4, progress)
    # every label checked first, so that errors name the data row and line
    with progress_bar(source, steps.desc("read labels"), enabled=progress) as bar:
        y = read_labels(input_path, label_column, encoding=encoding, check=(lo, hi, clip), bar=bar)
    if clip:
        y = np.clip(y, lo, hi)  # what every mechanism does first: no privacy cost
    table = read_feature_table(input_path, label_column, encoding=encoding, features=features, exclude=exclude,
                               progress=progress, desc=steps.desc("read table"))
    if table.labels.size != y.size:
        raise InputError(f"{str(input_path)!r} changed while it was read ({y.size} rows, then {table.labels.size})")
    if rows_read is not None:  # before any draw: the rows the release will cover (the ledger's pending line)
        rows_read(y.size)
    if report is not None:
        for line in table.choice.lines():
            report(line)
    x = standardized(table.features)
    choice, label_type, schema_types = table.choice, table.label_type, table.column_types
    del table  # what stays is the standardized float32 features and the labels
    with steps.pipeline(f"pipeline {pipeline}", pipeline_steps(row)) as step:
        labels, record = row.run(x, y, lo, hi, eps, secret=secret, epochs=int(epochs), step=step,
                                 scale_targets=True)  # a user's table: its labels in any units
    del x
    labels = np.asarray(labels, dtype=np.float64)
    if labels.shape != y.shape or not np.all(np.isfinite(labels)):
        raise RuntimeError("the pipeline produced labels of the wrong shape or non-finite labels")
    sidecar = {
        "format_version": 1, "pipeline": pipeline, "rows": int(y.size),
        "feature_columns": list(choice.columns), "features": choice.record(), "label_column": label_column,
        **({"label_type": label_type} if label_type else {}),
        "postprocessing": row.postprocessing,
        "accounting": record,
        **secret_record(secret),
        "release_id": secret.release_id, "row_offset": 0,
    }
    dump = lambda obj: json.dumps(obj, indent=2, allow_nan=False,  # noqa: E731
                                  default=lambda v: v.item() if hasattr(v, "item") else str(v)) + "\n"
    dump(sidecar)  # fail before writing
    out = Path(output_path)
    with atomic_outputs(out, out.with_name(out.name + ".json")) as (tmp, tmp_json):
        with progress_bar(source, steps.desc("write"), enabled=progress) as bar:
            rows = copy_with_labels(source, tmp, kind, lambda first, part: labels[first - 1: first - 1 + part.size],
                                       chunk_rows=WRITE_CHUNK_ROWS, bar=bar, types=schema_types)
        if rows != y.size:
            raise InputError(f"{str(input_path)!r} changed while it was read ({y.size} rows, then {rows})")
        if before_commit is not None:
            sidecar.update(before_commit(rows, record, ReleasedDigest.of(labels)))
        tmp_json.write_text(dump(sidecar))
    return sidecar


def pipeline_steps(row) -> int:
    """How many steps ``row.run`` reports (``auto``: design, statistics, release; the others: one)."""
    return 3 if row.kind == "auto" else 1


def privatize_table_file(input_path, output_path, *, label_column: str, range, epsilon: float, pipeline: str = "auto",
                         epochs: int | None = None, clip: bool = False, features=None, exclude=None, encoding=None,
                         key_file=None, seed=None, release_id=None, ledger=None, budget=None, overwrite: bool = False,
                         progress: bool = False, report=None, warn=None) -> tuple[dict, str | None]:
    """What ``rpwjax privatize-table`` does: :func:`privatize_table` as one recorded release.

    The outputs are checked before any work, the secret comes from
    ``key_file`` (or the experiments-only ``seed``, which ``warn`` reports),
    and the release is recorded in the ledger (``budget`` checked) before the
    outputs appear. Returns the sidecar and the ledger's status line.
    """
    if output_path is None:
        raise InputError("privatize-table needs -o/--output OUTPUT (only --explain runs without one)")
    check_outputs([output_path, str(output_path) + ".json"], overwrite=overwrite,
                  inputs=[input_path, key_file, ledger_path(ledger, key_file)])
    check_range(*range)
    check_pipeline_epsilon(epsilon)  # before it joins the release's identity, and before any work
    # the same identity privatize_table binds an unbound secret to, so that the Python call reproduces this release
    settings = release_settings(pipeline, epsilon, range, epochs, clip, features, exclude, encoding)
    run = open_release(command="privatize-table", input_path=input_path, label_column=label_column,
                       settings=settings, key_file=key_file, seed=seed, release_id=release_id, ledger_file=ledger,
                       budget=budget, report=warn)
    run.start(float(epsilon), pipeline=pipeline)  # a pipeline's delta, if any, is set from its accounting
    # the ledger records the release once its outputs are in place, or charges a run that fails after a draw
    with run.charged(), run.recording():
        sidecar = privatize_table(input_path, output_path, label_column=label_column, lo=range[0], hi=range[1],
                                  epsilon=epsilon, pipeline=pipeline, secret=run.secret, clip=clip, encoding=encoding,
                                  epochs=epochs, before_commit=run.finish, features=features, exclude=exclude,
                                  progress=progress, report=report, rows_read=run.expect_rows)
    return sidecar, run.line


def explain_table(input_path, *, label_column: str, lo: float, hi: float, epsilon: float, pipeline: str = "auto",
                  encoding=None, features=None, exclude=None) -> dict:
    """What ``privatize_table`` with an ``auto`` pipeline would decide before it reads a label: the rule and the
    public part of its plan (:func:`rpwjax.pipelines.auto.explain`), on the features chosen and standardized as
    a run would. Public inputs only (the features, the row count, ε and the range): no label is read beyond
    its column's type, nothing is spent, nothing is written, no key is needed. Step 4's decisions read the
    labels through paid releases, so they appear only in a real run's sidecar."""
    row = lookup(pipeline)
    if row.kind != "auto":
        raise InputError(f"--explain shows the auto rule's plan; --pipeline {pipeline} follows no such rule")
    eps = float(check_epsilon(epsilon))
    lo, hi = check_range(lo, hi)
    table = read_feature_table(input_path, label_column, encoding=encoding, features=features, exclude=exclude)
    x, choice = standardized(table.features), table.choice
    del table
    return {"pipeline": pipeline, "rows": int(x.shape[0]), "feature_columns": list(choice.columns),
            **auto.explain(x, x.shape[0], lo, hi, eps, branch=row.settings.get("branch"))}
