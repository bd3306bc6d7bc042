"""Privatize whole files, streamed in chunks, through the one release path.

Every released label comes from :func:`rpwjax.release_path.release`: float64
sampling, the public grid and clamp, and per-block keys derived from the
secret, tied to the GLOBAL row index (blocks of
:data:`rpwjax.release_path.BLOCK_ROWS` rows). The same secret therefore gives
bit-identical output for any ``chunk_rows``, any number of devices and any
split into shards (``row_offset``).

A file release belongs to one release id (:func:`bind_release`: fresh OS
entropy unless given back to reproduce the release or to privatize another
shard of it); its labels are released with ``secret.child("release")`` of
the secret bound to that release (:func:`release_secret`), the derivation
:func:`rpwjax.dask.privatize_dataframe` and ``rpwjax privatize --key-file``
share, so one key file and one release id give the same output through every
entry point. The secret is never written anywhere: the sidecar gives the
release id and says whether the secret was an experiments-only integer seed.

:class:`rpwjax.release_run.ReleaseRun` is what the commands share: the
secret bound to the release, the ledger record (:mod:`rpwjax.ledger`),
checked before any work and appended just before the outputs appear, or a
charge for a run that fails after a private draw.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np

from rpwjax import certify, ledger, noise
from rpwjax.accounting import Accounting
from rpwjax.api import (DEFAULT_PRIOR_FRACTION, MECHANISMS, FitOptions, histogram_epsilons, load_params,
                        prior_from_record, records_total)
from rpwjax.audit.verify import PUBLIC_PRIOR_KINDS, check_record, verified_release
from rpwjax.mechanisms.additive import GAUSSIAN_DEFAULT_DELTA
from rpwjax.mechanisms.base import Mechanism
from rpwjax.errors import InputError, check_epsilon, check_integer, check_label_rows, check_range
from rpwjax.io import writers
from rpwjax.io.atomic import atomic_outputs, check_outputs, read_json, write_json
from rpwjax.io.csv_types import csv_column_types
from rpwjax.io.source import MAX_CHUNK_ROWS, MAX_GLOBAL_ROWS, TableSource, file_kind, progress_bar, read_labels
from rpwjax.keys import Secret, resolve_secret, secret_record
from rpwjax.ledger import file_sha256, ledger_path
from rpwjax.posterior import check_debias, debias, debias_record, posterior_mean
from rpwjax.release_path import release, sidecar_fields
from rpwjax.release_run import ReleaseRun, bind_release
from rpwjax.sampling import check_release_epsilon, spec

DEFAULT_CHUNK_ROWS = 1 << 20
RELEASE_PURPOSE = "release"


def encoding_settings(encoding) -> dict:
    """``{"encoding": ...}`` when an encoding was given, else nothing: a release's identity and ledger settings
    name the encoding its labels were read in (the same bytes read in another encoding can name another
    column), and a release without one keeps the identity it always had."""
    return {} if encoding is None else {"encoding": str(encoding)}


def release_secret(secret: Secret, release_id=None, *, label_column=None, encoding=None) -> Secret:
    """The secret a file or data frame release draws from: ``secret.child("release")`` of the bound secret.

    Kept apart from the fit's ``child("fit")`` (the private histogram of an
    inline fit), so the two never share a key. An unbound ``secret`` is bound
    to ``release_id`` (fresh by default) for a ``privatize`` of ``label_column``
    (read in ``encoding``, when given), as ``rpwjax privatize --release-id ID --params ...`` binds it.
    """
    return bind_release(secret, release_id, command="privatize", label_column=label_column,
                        settings=encoding_settings(encoding) or None).child(RELEASE_PURPOSE)


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


def check_chunk_rows(chunk_rows) -> int:
    """``chunk_rows`` as an int in [1, :data:`rpwjax.io.source.MAX_CHUNK_ROWS`]."""
    return check_integer(chunk_rows, "chunk_rows", 1, MAX_CHUNK_ROWS, flag="--chunk-rows")


def check_row_offset(row_offset, rows: int = 0) -> int:
    """``row_offset`` as an int with every global row index ``row_offset + i`` (i < rows) below 2^63."""
    row_offset = check_integer(row_offset, "row_offset", 0, MAX_GLOBAL_ROWS - 1, flag="--row-offset")
    if int(row_offset) + rows > MAX_GLOBAL_ROWS:
        raise InputError(f"row_offset (--row-offset) {int(row_offset)} plus {rows} rows passes the last global row "
                         f"index 2^63 - 1: row indices never wrap, so give a smaller offset")
    return int(row_offset)


def release_file(
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
    encoding: str | None = None,
    release_id: str | None = None,
    before_commit=None,
) -> dict:
    """Stream ``input_path`` to ``output_path`` with the label column released with given ``params``.

    The streaming half of :func:`privatize_file`, which decides the
    parameters (a fit, or a verified params file), the denoising and the
    ledger record, and calls this.

    Every column is kept in order; the label column is replaced by float64
    released labels (:func:`rpwjax.release_path.release` with :func:`release_secret` of ``secret``, e.g.
    ``Secret.from_file(KEYFILE)``). Every other column leaves exactly as it
    came in: a CSV field's bytes, quotes included (the header, line breaks
    and blank lines too), a Parquet column with its schema and values
    (:mod:`rpwjax.io`). ``encoding`` is the CSV's text encoding (default
    UTF-8; the output uses the same). ``row_offset`` is the global index of
    the file's first row when the file is one shard of a larger data set
    (shards privatized on different machines then match a single run over
    the whole data); every global row index must stay below 2^63.
    ``release_id`` reproduces a release, or privatizes another shard of it
    (default: a fresh one, unless ``secret`` is already bound to a release);
    the sidecar records it with the row offset and the row count.
    ``before_commit(rows, released_sha256)``, if given, runs once the output is complete and
    before it appears (the CLI appends the ledger record there, with the digest of the released
    values before any post-processing: :class:`rpwjax.ledger.ReleasedDigest`); the dict it returns joins the sidecar.
    ``postprocess`` (e.g. posterior denoising) maps the private labels of each
    chunk before they are written; it must be a function of the private
    labels and public quantities only. ``output_path.json`` receives ``record`` plus the row count.
    Both files appear only if the whole file succeeded; errors name the
    1-based data row (and, for CSV, the line) of the offending value.
    """
    from pathlib import Path

    out_kind = file_kind(output_path, what="output file")
    file_kind(input_path, what="input file")
    key = release_secret(secret, release_id, label_column=label_column, encoding=encoding)
    if postprocess is not None and postprocess_range is None:
        raise InputError("postprocess needs postprocess_range, the public interval its values lie in")
    chunk_rows = check_chunk_rows(chunk_rows)
    row_offset = check_row_offset(row_offset)
    if Path(input_path).resolve() == Path(output_path).resolve() or (
            Path(output_path).is_file() and Path(input_path).is_file() and Path(input_path).samefile(output_path)):
        raise InputError(f"output must differ from input, got {str(output_path)!r} for both")
    source = TableSource(input_path, label_column, encoding=encoding)
    total = source.num_rows if source.kind == ".parquet" else None
    if total is not None:
        check_row_offset(row_offset, total)
    sidecar_path = str(output_path) + ".json"
    output_spec = spec(params)  # public, the same for every chunk: computed once
    certify.certify(params, output_spec)  # before any output: the realized check of these exact parameters (cached)
    digest = ledger.ReleasedDigest()  # of the release itself, before any post-processing (not part of its identity)

    def released(first: int, y: np.ndarray) -> np.ndarray:
        check_label_rows(y, params.lo, params.hi, clip=clip, first_row=first, where=source.where,
                         column=label_column)
        if clip:
            y = np.clip(y, params.lo, params.hi)  # what every mechanism does first: no privacy cost
        start = row_offset + first - 1
        if start + y.size > MAX_GLOBAL_ROWS:
            raise InputError(f"row_offset (--row-offset) {row_offset} plus the rows of {str(input_path)!r} passes the "
                             f"last global row index 2^63 - 1 at {source.where(MAX_GLOBAL_ROWS - row_offset + 1)}")
        # its values go only to the output (rpwjax.draws: a failure after them alone is not charged)
        noisy = release(params, key, y, start=start, output_spec=output_spec, to_output=True)
        digest.update(noisy)
        if postprocess is not None:
            noisy = np.clip(np.asarray(postprocess(noisy), dtype=np.float64), *postprocess_range)
        return noisy

    types = None
    if source.kind != ".parquet" and out_kind == ".parquet":  # a pass of its own: each column's type from all values
        types = _with_bar(source, "column types", progress,
                          lambda bar: csv_column_types(source, chunk_rows=chunk_rows, bar=bar))
    with atomic_outputs(output_path, sidecar_path) as (tmp, tmp_json):
        rows = _with_bar(source, "privatize", progress,
                         lambda bar: writers.copy_with_labels(source, tmp, out_kind, released, chunk_rows=chunk_rows,
                                                         bar=bar, types=types))
        if rows == 0:
            raise InputError(f"input file {str(input_path)!r} has no rows")
        label_type = {"label_type": source.label_type} if source.label_type else {}
        sidecar = dict(record, rows=rows, label_column=label_column, **label_type,
                       **output_fields(params, postprocess_range),
                       postprocessing=postprocess_name, **randomness_record(secret, record),
                       release_id=key.release_id, row_offset=row_offset)
        if before_commit is not None:
            sidecar.update(before_commit(rows, digest.hexdigest()))
        tmp_json.write_text(json.dumps(sidecar, indent=2) + "\n")
    return sidecar


def _with_bar(source, desc: str, progress: bool, work):
    """``work(bar)`` under a progress bar over one pass of ``source`` (:func:`rpwjax.io.source.progress_bar`)."""
    with progress_bar(source, desc, enabled=progress) as bar:
        return work(bar)


def load_release_params(path, *, prior_is_public: bool = False, range=None):
    """A saved fit, ready to release with: ``(params, record, prior)``.

    Nothing in the file is taken on trust (:func:`rpwjax.audit.verify.verified_release`):
    its guarantee is recomputed from the parameters, the parameters are fitted
    again from the saved prior and options and must be what that fit gives
    (refused, naming the file and the field, otherwise), and what is released
    and published is the refit, with its accounting recomputed. A prior with
    no accounted private release behind it (``empirical``: the parameters are
    functions of the raw labels; or a ``histogram`` someone vouched for) is
    refused unless ``prior_is_public``, and the record then says the guarantee
    is conditional on that prior being public. A ``range`` that differs from
    the file's is refused. ``prior`` is the saved histogram (None when none
    was saved).
    """
    _, saved = load_params(read_json(path), name=str(path))
    params, record, verified = verified_release(saved, name=str(path))
    record = dict(record, verified=verified)
    if saved.get("release_id") is not None:  # the fit's release (its histogram), which the refit's record lacks
        record["params_release_id"] = saved["release_id"]
    prior = prior_from_record(record)
    kind = record.get("prior", {}).get("kind")
    public = kind in PUBLIC_PRIOR_KINDS
    if public and not prior_is_public:
        what = ("its parameters are functions of the raw labels" if kind == "empirical" else
                "nothing was spent on that histogram (no private release of it is accounted)")
        raise InputError(
            f"params file {str(path)!r} was fitted on prior.kind={kind!r}: {what}, so the release is private only if "
            "that prior is public. Say so with --prior-is-public, or refit with --prior private")
    if range is not None and (float(range[0]), float(range[1])) != (params.lo, params.hi):
        raise InputError(f"--range {list(range)} differs from the params file's range [{params.lo}, {params.hi}]")
    if prior_is_public and not public:
        raise InputError(f"--prior-is-public does nothing here: params file {str(path)!r} was fitted on "
                         f"prior.kind={kind!r}, not on an empirical prior or an unaccounted histogram")
    return params, record, prior


def _warn(report, message: str):
    """A warning: through ``report`` (a line printer, e.g. the command line's) when given, else :mod:`warnings`."""
    if report is None:
        warnings.warn(message, stacklevel=4)  # at the caller of the public function
    else:
        report(f"warning: {message}")


def open_release(*, command: str, input_path, label_column, settings: dict, key_file=None, seed=None,
                 secret: Secret | None = None, release_id=None, ledger_file=None, budget=None, row_offset=None,
                 what: str = "input file", identity_settings="same", report=None) -> ReleaseRun:
    """A command's :class:`ReleaseRun`: the secret (``secret``, else :func:`rpwjax.keys.resolve_secret` of
    ``key_file`` or the experiments-only ``seed``, which is never unnoticed: it warns) bound to a release id."""
    if secret is None:
        secret = resolve_secret(key_file, seed)
        if seed is not None:  # the sidecar says so too
            _warn(report, f"reproducible seed: not for production (--seed {seed} is for experiments; a release "
                          "takes --key-file or fresh OS entropy)")
    return ReleaseRun(secret=secret, command=command, input_path=input_path, label_column=label_column,
                      settings=settings, release_id=release_id, row_offset=row_offset or 0, ledger_file=ledger_file,
                      key_file=key_file, budget=budget, what=what, identity_settings=identity_settings,
                      row_offset_given=row_offset is not None, report=report)


def check_fit_epsilons(options: FitOptions, *, spend_prior: bool, released: bool = False):
    """Before any work (and before the release's identity is built from them): ``--epsilon`` and
    ``--prior-epsilon`` positive and finite, and, where the fit builds a private histogram (a mechanism that
    uses a prior, or ``spend_prior``, under ``--prior private``), its ε₁ large enough for the exact noise
    sampler (:func:`rpwjax.noise.check_noise_epsilon`: ε₁ is ``--prior-epsilon``, else 0.1·ε). A fit to be
    ``released`` (privatize, fit --save) has its mechanism's ε₂ = ε - ε₁ certifiable
    (:func:`rpwjax.sampling.check_release_epsilon`): refused now, not after its histogram is drawn."""
    if options.epsilon is not None:
        check_epsilon(options.epsilon)
    if options.prior_epsilon is not None:
        check_epsilon(options.prior_epsilon, "prior_epsilon")
    row = MECHANISMS.get(options.mechanism)
    if options.epsilon is None or row is None:
        return
    private_prior = (options.prior or "private") != "empirical" and (row.uses_prior or spend_prior)
    if private_prior and options.prior_epsilon is not None:
        noise.check_noise_epsilon(options.prior_epsilon, "prior_epsilon", divisor=2,
                                  what=" of the private histogram")
    elif private_prior:
        noise.check_noise_epsilon(options.epsilon, "epsilon", divisor=2 / DEFAULT_PRIOR_FRACTION,
                                  what=f" of the private histogram (it gets epsilon_1 = {DEFAULT_PRIOR_FRACTION:g}"
                                       "·epsilon; --prior-epsilon sets it)")
    if released and options.range is not None:
        eps = np.atleast_1d(check_epsilon(options.epsilon))
        eps1 = planned_prior_epsilons(options, spend_prior=spend_prior)
        if np.all(eps > eps1):  # a prior epsilon too large is the fit's to refuse
            lo, hi = check_range(*options.range)
            check_release_epsilon(row.params, eps - eps1, f"[{lo:.17g}, {hi:.17g}]")


def planned_prior_epsilons(options: FitOptions, *, spend_prior: bool = False) -> np.ndarray:
    """The ε₁ that ``options.fit`` spends on a private histogram for each of its ε, from the options alone
    (``--prior-epsilon``, else 0.1·ε, for a mechanism that uses a prior, or ``spend_prior``, under ``--prior
    private``; 0 otherwise), before anything is drawn."""
    eps = np.atleast_1d(check_epsilon(options.epsilon))
    row = MECHANISMS[options.mechanism]
    if (options.prior or "private") == "empirical" or not (row.uses_prior or spend_prior):
        return np.zeros_like(eps)
    if options.prior_epsilon is None:
        return DEFAULT_PRIOR_FRACTION * eps
    e1 = check_epsilon(options.prior_epsilon, "prior_epsilon")
    if e1.ndim and e1.shape != eps.shape:  # the fit's own refusal, before anything is drawn
        raise InputError(f"prior_epsilon needs one value or one per epsilon: {e1.size} values for {eps.size} "
                         "epsilons")
    return np.broadcast_to(e1, eps.shape).astype(np.float64)


def planned_histograms(options: FitOptions) -> list[float]:
    """The distinct ε₁ of the private histograms ``options.fit`` will draw (:func:`rpwjax.api.histogram_epsilons`
    of its records): the positive :func:`planned_prior_epsilons`, each once."""
    return list(dict.fromkeys(float(e) for e in planned_prior_epsilons(options) if float(e) > 0))


def _seed_fields(secret: Secret) -> dict:
    return {"reproducible_seed": True, "seed_note": "integer seed: not for production"} if secret.reproducible else {}


def fit_file(labels_path, options: FitOptions, *, label_column=None, encoding=None, save=None,
             publish: bool = False, overwrite: bool = False, prior_is_public: bool = False, key_file=None, seed=None,
             release_id=None, ledger_file=None, budget=None, report=None) -> tuple[list[dict], str | None]:
    """Fit ``options`` (one or more epsilons) to a label file: ``(records, ledger line)``.

    What leaves the fit (its private histograms) is recorded in the ledger.
    ``save`` writes the one fit (checked as privatize checks a params file);
    ``publish`` says the records are printed as JSON. Either publishes
    functions of the raw labels under an empirical prior, so that is refused
    unless ``prior_is_public``. ``report`` prints a warning line.
    """
    options.check(spend_prior=False)
    check_fit_epsilons(options, spend_prior=False, released=bool(save))
    if options.prior == "empirical" and (save or publish) and not prior_is_public:
        output = " and ".join(flag for flag, given in (("--save", save), ("--json", publish)) if given)
        raise InputError(
            f"--prior empirical with {output} publishes functions of the raw labels (the parameters and label_mse "
            "under their empirical distribution): private only if that prior is public. Say so with "
            "--prior-is-public, or use --prior private (the default)")
    if prior_is_public and options.prior != "empirical":
        raise InputError("--prior-is-public does nothing without --prior empirical")
    if save:  # before the labels are read
        check_outputs([save], overwrite=overwrite, inputs=[labels_path, key_file, ledger_path(ledger_file, key_file)])
    elif overwrite:
        raise InputError("--overwrite does nothing without --save (fit writes no other file)")
    lo, hi = check_range(*options.range)
    run = open_release(command="fit", input_path=labels_path, label_column=label_column,
                       settings=dict(options.settings(), **encoding_settings(encoding)),
                       key_file=key_file, seed=seed, release_id=release_id, ledger_file=ledger_file, budget=budget,
                       what="labels file", report=report)
    if save and np.size(options.epsilon) != 1:
        raise InputError(f"--save writes exactly one fit: give one --epsilon, got {np.size(options.epsilon)}")
    # what leaves a fit is its private histogram(s): epsilon_1 per distinct epsilon_1 (equal ones are one draw);
    # the ledger checks that claim (a reused id, --budget) before the histograms are drawn
    planned = planned_histograms(options)
    run.start(sum(planned), mechanism=options.mechanism)
    with run.charged():  # a fit that fails after drawing its histogram is charged for it
        labels = read_labels(labels_path, label_column, encoding=encoding, check=(lo, hi, options.clip))
        run.expect_rows(labels.size)
        epsilon = options.epsilon
        epsilon = epsilon[0] if not np.isscalar(epsilon) and len(epsilon) == 1 else epsilon
        records = options.fit(labels, epsilon, run.fit_secret()).records()
        histograms = histogram_epsilons(records)
        if histograms != planned:  # pragma: no cover - the plan follows the fit's own arithmetic
            raise RuntimeError(f"internal error: the fit drew histograms at epsilon_1 {histograms}, planned {planned}")
        for r in records:
            r.update(_seed_fields(run.secret), release_id=run.release_id)
        if len(records) > 1:
            total = records_total(records)
            for r in records:
                r["all_records"] = total
        if save:
            # parameters privatize would refuse are not saved: the same checks privatize runs on a params file
            problems = check_record(records[0], stop_early=True)[1]["problems"]
            if problems:
                raise InputError(f"--save: these parameters cannot be released: {problems[0]}")
        account = Accounting(labels.size, run.record["epsilon"])
        for e1 in histograms:
            fits = ", ".join(f"{float(r['epsilon']):g}" for r in records if float(r["epsilon_prior"]) == e1)
            account.spend("prior-histogram", e1, sensitivity="one label moves one count between two bins",
                          mechanism=f"the histogram's exact integer noise, fit for epsilon {fits}")
        # what the fit put out is its private histograms: their digest checks a reproduction
        private = [r["prior"].get("masses", []) for r in records if float(r["epsilon_prior"]) > 0]
        with run.recording():
            run.finish(labels.size, account.to_json(),
                       ledger.ReleasedDigest.of(np.concatenate([np.ravel(m) for m in private])) if private else None)
            if save:
                write_json(save, records[0])
    return records, run.line


def privatize_file(
    input_path,
    output_path,
    *,
    label_column: str,
    params=None,
    mechanism: str | None = None,
    epsilon: float | None = None,
    range=None,
    zeta=None,
    objective: str | None = None,
    prior: str | None = None,
    prior_epsilon: float | None = None,
    bins: int | None = None,
    delta: float | None = None,
    calibration: str | None = None,
    clip: bool = False,
    prior_is_public: bool = False,
    denoise: str = "none",
    secret: Secret | None = None,
    key_file=None,
    seed: int | None = None,
    release_id: str | None = None,
    ledger=None,
    budget: float | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    row_offset: int | None = None,
    encoding: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    report=None,
) -> dict:
    """Privatize the label column of a CSV or Parquet file: what ``rpwjax privatize`` does, from Python.

    The parameters come either from ``params``, a params file (``rpwjax fit
    --save``, verified: :func:`load_release_params`), or from a fit of the
    file's own labels (``mechanism``, ``epsilon`` and the public ``range``,
    with the fit options of :func:`rpwjax.fit`). A prior that is a function
    of the raw labels (``prior="empirical"``, or a params file fitted on one)
    is refused unless ``prior_is_public``. ``denoise`` is ``"none"``,
    ``"posterior"`` (E[Y | private label] under the fit's prior) or
    ``"debias"`` (RPWithPrior only), both post-processing. The secret is
    ``secret``, else ``key_file``, else fresh OS entropy (``seed``: an
    integer seed, experiments only). The release is recorded in the ledger
    (``ledger``, default beside ``key_file``; ``budget`` refuses a release
    that would take the input's total epsilon past it) before OUTPUT and
    OUTPUT.json appear; neither replaces an existing file unless
    ``overwrite``. Returns the sidecar (OUTPUT.json). ``report``, a line
    printer, gets warnings and the ledger's status line. A ``release_id`` the
    ledger never recorded needs ``row_offset`` (a shard made elsewhere).
    """
    options = FitOptions(mechanism=mechanism, epsilon=epsilon, range=range, zeta=zeta, objective=objective,
                         prior=prior, prior_epsilon=prior_epsilon, bins=bins, delta=delta, calibration=calibration,
                         clip=clip)
    check_chunk_rows(chunk_rows)
    if row_offset is not None:  # given: this file is a shard at that offset (None: the first, 0)
        row_offset = check_row_offset(row_offset)
    file_kind(input_path, what="input file")
    file_kind(output_path, what="output file")
    # the output and its sidecar, before anything is read or fitted (the ledger too: it is appended, never replaced)
    check_outputs([output_path, str(output_path) + ".json"], overwrite=overwrite,
                  inputs=[input_path, params, key_file, ledger_path(ledger, key_file)])
    if range is not None:
        check_range(*range)  # before it joins the release's identity
    # epsilon too (and, for an inline fit, its private histogram's share: before any work)
    if params:  # no fit here: only the values (fit options with --params are refused below)
        check_fit_epsilons(dataclasses.replace(options, mechanism=None), spend_prior=False)
    else:
        check_fit_epsilons(options, spend_prior=denoise == "posterior", released=True)
    # post-processing is not part of a release's identity (one release may be written raw and denoised), except
    # posterior denoising of an inline fit, which makes a prior-free mechanism's fit spend epsilon_1 on a histogram
    settings = dict(options.settings(), spend_prior=denoise == "posterior" and not params,
                    params=None if not params else file_sha256(params, "params file"), **encoding_settings(encoding))
    # a --params release keys on the parameters (and the encoding, when given), as release_file does
    run = open_release(command="privatize", input_path=input_path, label_column=label_column, settings=settings,
                       key_file=key_file, seed=seed, secret=secret, release_id=release_id, ledger_file=ledger,
                       budget=budget, row_offset=row_offset,
                       identity_settings=(encoding_settings(encoding) or None) if params else "same",
                       report=report)
    if denoise == "debias" and mechanism is not None:
        check_debias(mechanism)  # before any fit
    inline = not params  # the fit reads these labels (its histogram is on this release's account)
    with run.charged():  # a run that fails after its first private draw is charged for its draws
        if params:
            params, record, fit_prior = _params_release(params, options, run, prior_is_public)
        else:
            params, record, fit_prior = _inline_release(input_path, options, run, prior_is_public, denoise,
                                                        label_column=label_column, encoding=encoding, progress=progress)
        record, post = _postprocess(params, record, fit_prior, denoise)
        if record.get("prior", {}).get("kind") in ("empirical", "histogram"):  # no accounted release behind it
            record = dict(record, prior_is_public="asserted by the user (--prior-is-public): the guarantee holds only "
                                                  "if the prior is public")
        # the release draws from secret.child("release"); an inline fit from run.fit_secret()
        with run.recording():
            sidecar = release_file(input_path, output_path, label_column=label_column, params=params,
                                   secret=run.secret, record=record, chunk_rows=chunk_rows, clip=clip,
                                   progress=progress, row_offset=row_offset or 0, encoding=encoding,
                                   before_commit=lambda rows, digest: _finish(run, rows, record, digest,
                                                                              inline=inline),
                                   **post)
    if run.line and report is not None:
        report(run.line)
    return sidecar


def mechanism_account(rows: int, record: dict, *, epsilon: float, delta: float, histogram: bool) -> Accounting:
    """The account of one mechanism's release of ``rows`` labels claimed (``epsilon``, ``delta``): the fit's
    private histogram when these labels paid for it (``histogram``), then the release itself."""
    account = Accounting(rows, epsilon, delta)
    if histogram and float(record.get("epsilon_prior") or 0.0) > 0:
        account.spend("prior-histogram", float(record["epsilon_prior"]),
                      sensitivity="one label moves one count between two bins",
                      mechanism="the histogram's exact integer noise (rpwjax.priors.private_histogram)")
    account.spend("release", float(record["epsilon_mechanism"]), delta=float(record.get("delta") or 0.0),
                  sensitivity="any label replaced by any other in the public range",
                  mechanism=str(record["mechanism"]))
    return account


def _finish(run: ReleaseRun, rows: int, record: dict, released_sha256: str, *, inline: bool) -> dict:
    """Commit the run with its account (an inline fit's histogram read these labels; a params file's did not)
    and the digest of its released values; return the sidecar's fields, the account among them."""
    account = mechanism_account(rows, record, epsilon=run.record["epsilon"], delta=run.record["delta"],
                                histogram=inline).to_json()
    return dict(run.finish(rows, account, released_sha256), accounting=account)


def _params_release(path, options: FitOptions, run: ReleaseRun, prior_is_public: bool):
    """``(params, record, prior)`` of a params file, verified (:func:`load_release_params`); the run started."""
    if options.mechanism is not None or options.epsilon is not None:
        raise InputError("give either --params or fit options (--mechanism/--epsilon), not both")
    for flag in ("zeta", "objective", "prior", "prior_epsilon", "bins", "delta", "calibration"):
        if getattr(options, flag) is not None:
            raise InputError(f"--{flag.replace('_', '-')} {getattr(options, flag)} does nothing with --params: the "
                             "params file fixes the fit (refit with `rpwjax fit` to change it)")
    params, record, prior = load_release_params(path, prior_is_public=prior_is_public, range=options.range)
    # the labels of this file pay epsilon_2; the fit's histogram is in the ledger under the fit's input
    run.start(float(record["epsilon_mechanism"]), float(record.get("delta") or 0.0), mechanism=record["mechanism"],
              params_release_id=record.get("params_release_id"))
    return params, record, prior


def _inline_release(input_path, options: FitOptions, run: ReleaseRun, prior_is_public: bool, denoise: str, *,
                    label_column, encoding, progress: bool):
    """``(params, record, prior)`` of a fit of the file's own labels; the run started."""
    if options.mechanism is None or options.epsilon is None:
        raise InputError("privatize needs --params PARAMS.json, or --mechanism and --epsilon to fit")
    if options.range is None:
        raise InputError("--range LO HI is required to fit: the label range is public input")
    options.check(spend_prior=denoise == "posterior")
    if options.prior == "empirical" and not prior_is_public:
        raise InputError(
            "--prior empirical makes the parameters functions of the raw labels: the release is private only if "
            "that prior is public. Say so with --prior-is-public, or use --prior private (the default)")
    if prior_is_public and options.prior != "empirical":
        raise InputError("--prior-is-public does nothing without --prior empirical")
    lo, hi = check_range(*options.range)
    # the claim's delta (Gaussian) as planned, before any draw (the pending line carries it); the fit's, set below
    planned_delta = 0.0 if options.mechanism != "gaussian" else float(
        GAUSSIAN_DEFAULT_DELTA if options.delta is None else options.delta)
    run.start(float(options.epsilon), planned_delta, mechanism=options.mechanism)
    source = TableSource(input_path, label_column, encoding=encoding)
    with progress_bar(source, "read labels", enabled=progress) as bar:
        labels = read_labels(input_path, label_column, encoding=encoding, check=(lo, hi, options.clip), bar=bar)
    run.expect_rows(labels.size)
    # the histogram noise (if any) and the release draw from independent keys derived from the secret
    result = options.fit(labels, options.epsilon, run.fit_secret(), spend_prior=denoise == "posterior")
    record = result.records()[0]
    run.record["delta"] = float(record["delta"])
    return result.params, record, result.prior_for(0)


def _postprocess(params: Mechanism, record: dict, prior, denoise: str) -> tuple[dict, dict]:
    """The record and :func:`release_file`'s post-processing arguments for ``denoise``."""
    if denoise == "debias":
        check_debias(params.name)
        coefficients = debias_record(params)
        return dict(record, debias=coefficients), dict(postprocess=lambda noisy: debias(params, noisy),
                                                       postprocess_name="debias",
                                                       postprocess_range=coefficients["range"])
    if denoise == "posterior":
        if prior is None:
            raise InputError(
                "--denoise posterior needs the prior the fit used: a params file saves it only for a private "
                "histogram (fit with --prior private; for laplace, gaussian and staircase privatize without "
                "--params, which then spends epsilon_1 on the histogram), or privatize without --params to fit inline"
            )
        # fail before any output if this pair has no posterior: probe with a value the mechanism can put out
        probe = float(np.asarray(params.outputs, np.float64).ravel()[-1]) if params.discrete else params.lo
        posterior_mean(params, prior, [probe])
        # a posterior mean lies in the range
        return record, dict(postprocess=lambda noisy: posterior_mean(params, prior, noisy),
                            postprocess_name="posterior-mean", postprocess_range=(params.lo, params.hi))
    return record, {}
