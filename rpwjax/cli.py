"""The ``rpwjax`` command line: it parses arguments, calls the library and prints.

Errors print one line on stderr naming the problem and the value: exit 2 for
bad input (including a bad command line), 1 for I/O errors. ``SIGINT`` and
``SIGTERM`` stop a run at any moment with one line and exit 130 and 143
(:mod:`rpwjax.interrupts`, installed before anything heavy is imported).
Nothing half-written is left behind (:func:`rpwjax.io.atomic_outputs`).
Warnings are printed as one line each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import warnings
from pathlib import Path

from rpwjax import __version__, interrupts

MAX_BINS = 1024  # --bins lies in [1, MAX_BINS]: RR-on-Bins' fit grows with the square of the bins

EXIT_INPUT = 2
EXIT_IO = 1
EXIT_SIGNAL = interrupts.EXIT_CODES


class _Parser(argparse.ArgumentParser):
    # a value like "-1e6", "-2.5E-3" or "-inf" (e.g. after --range) is a negative number, not an option: argparse's
    # own pattern knows only "-1" and "-1.5"
    NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-inf(inity)?$", re.IGNORECASE)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = self.NEGATIVE_NUMBER

    def error(self, message):  # one line, exit 2, like every other bad input
        if message.startswith("the following arguments are required") and "--range" in message:
            message += " (the label range is public input, never read from the labels)"
        self.exit(EXIT_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_fit_options(p: argparse.ArgumentParser, *, many_epsilons: bool, required: bool):
    from rpwjax.api import DEFAULT_BINS, MECHANISMS

    p.add_argument("--mechanism", choices=list(MECHANISMS), required=required, help="mechanism to fit")
    p.add_argument(
        "--epsilon", type=float, nargs="+" if many_epsilons else None, required=required,
        help="total privacy budget" + (" (one or more values)" if many_epsilons else ""),
    )
    p.add_argument("--zeta", default=None, help="RPWithPrior window half-width (label units) or 'auto' (default)")
    p.add_argument("--objective", choices=["neighborhood", "inside", "debiased"], default=None,
                   help="RPWithPrior interval objective (default neighborhood; debiased: the label MSE after debiasing)")
    p.add_argument("--prior", choices=["private", "empirical"], default=None,
                   help="private (default): Hist_eps, epsilon_1 for a noisy histogram; empirical: the known-prior "
                        "setting (all of epsilon to the mechanism, private only if that prior is public)")
    p.add_argument("--prior-epsilon", type=float, default=None,
                   help="epsilon_1 spent on the private histogram (default 0.1*epsilon)")
    p.add_argument("--bins", type=int, default=None,
                   help=f"bins of the private histogram, 1 to {MAX_BINS} (default {DEFAULT_BINS})")
    p.add_argument("--delta", type=float, default=None, help="delta of the Gaussian mechanism (default 1e-5)")
    p.add_argument("--calibration", choices=["analytic", "classic"], default=None,
                   help="Gaussian sigma: analytic (default) or classic (the paper's)")
    p.add_argument("--clip", action="store_true", help="clip labels outside the range instead of refusing them")


def _mechanism_options(args) -> dict:
    opts = {}
    if args.mechanism == "rpwithprior":
        zeta = "auto" if args.zeta is None else args.zeta
        opts["zeta"] = zeta if zeta == "auto" else _float(zeta, "zeta")
        opts["objective"] = args.objective or "neighborhood"
    if args.mechanism == "gaussian":
        if args.delta is not None:
            opts["delta"] = args.delta
        if args.calibration is not None:
            opts["calibration"] = args.calibration
    return opts


def _float(text, name):
    from rpwjax.errors import InputError

    try:
        return float(text)
    except ValueError:
        raise InputError(f"{name} must be a number or 'auto', got {name}={text!r}") from None


def _add_secret_options(p: argparse.ArgumentParser, what: str):
    p.add_argument("--key-file", default=None,
                   help=f"256-bit secret from `rpwjax keygen` for the {what} (default: fresh OS entropy); "
                        "the same key file and row offsets reproduce the output bit for bit")
    p.add_argument("--seed", type=int, default=None,
                   help="EXPERIMENTS ONLY: an integer seed instead of a secret (guessable; the sidecar says "
                        "\"reproducible_seed\": true, not for production)")
    p.add_argument("--release-id", default=None, metavar="ID",
                   help="reproduce the release with this id (from its sidecar or params), or privatize another shard "
                        "of it (other rows, --row-offset); default: a fresh 128-bit id, so that no two releases share "
                        "randomness")
    p.add_argument("--ledger", default=None, metavar="FILE",
                   help="the release ledger to append to (default: KEYFILE.ledger.jsonl beside --key-file, else "
                        "$RPWJAX_LEDGER, else ~/.local/share/rpwjax/ledger.jsonl); `rpwjax ledger` prints its totals")
    p.add_argument("--budget", type=float, default=None, metavar="E",
                   help="refuse, before writing anything, a release that would take this input's total epsilon in "
                        "the ledger past E")


def _check_bins(bins, name="--bins"):
    from rpwjax.errors import check_integer

    if bins is not None:
        check_integer(bins, name, 1, MAX_BINS)


def _check_fit_options(args, *, spend_prior: bool):
    """Refuse fit options that would do nothing for this mechanism and prior (instead of ignoring them)."""
    from rpwjax.api import MECHANISMS
    from rpwjax.errors import InputError

    _check_bins(args.bins)
    _check_prior_epsilon(args)
    mechanism = args.mechanism
    for flag, value, owner in (("--zeta", args.zeta, "rpwithprior"), ("--objective", args.objective, "rpwithprior"),
                               ("--delta", args.delta, "gaussian"), ("--calibration", args.calibration, "gaussian")):
        if value is not None and mechanism != owner:
            raise InputError(f"{flag} {value} does nothing for --mechanism {mechanism} (it applies to {owner} only)")
    uses_prior = MECHANISMS[mechanism].uses_prior or spend_prior
    if (args.prior or "private") == "empirical":
        if args.bins is not None:
            raise InputError(f"--bins {args.bins} does nothing under --prior empirical (no histogram is built): "
                             "drop it or use --prior private")
    elif not uses_prior:
        for flag, value in (("--prior", args.prior), ("--bins", args.bins), ("--prior-epsilon", args.prior_epsilon)):
            if value is not None:
                raise InputError(f"{flag} {value} does nothing for --mechanism {mechanism}: it uses no prior and "
                                 "spends nothing on one (with privatize --denoise posterior it does)")


def _add_feature_options(p: argparse.ArgumentParser, prefix: str = ""):
    p.add_argument("--features", nargs="+", default=None, metavar="COL",
                   help=prefix + "use exactly these columns as features (default: every numeric column but the label "
                        "and those that look like identifiers: leading zeros, numbers too long for float64, integers "
                        "all distinct; missing values are filled with the column's median plus a 0/1 indicator)")
    p.add_argument("--exclude", nargs="+", default=None, metavar="COL",
                   help=prefix + "never use these columns as features")


def _add_encoding_option(p: argparse.ArgumentParser):
    p.add_argument("--encoding", default=None,
                   help="text encoding of a CSV or text input (default utf-8; a CSV output is written in the same "
                        "encoding), e.g. latin-1 or cp1252")


def _secret(args):
    from rpwjax.keys import resolve_secret

    secret = resolve_secret(args.key_file, args.seed)
    if args.seed is not None:  # never unnoticed: the sidecar says so too
        print(f"rpwjax {args.command}: warning: reproducible seed: not for production (--seed {args.seed} is for "
              "experiments; a release takes --key-file or fresh OS entropy)", file=sys.stderr)
    return secret


def _release_run(args, command: str, input_path, label_column, settings: dict, row_offset: int = 0,
                 what: str = "input file", identity_settings="same"):
    """The command's release: its secret bound to a release id, and its ledger record (rpwjax.privatize.ReleaseRun)."""
    from rpwjax.privatize import ReleaseRun

    return ReleaseRun(secret=_secret(args), command=command, input_path=input_path, label_column=label_column,
                      settings=settings, release_id=args.release_id, row_offset=row_offset, ledger_file=args.ledger,
                      key_file=args.key_file, budget=args.budget, what=what, identity_settings=identity_settings)


def _fit_settings(args) -> dict:
    """What fixes a fit (for the release identity and the ledger): every fit option as given."""
    keys = ("mechanism", "epsilon", "range", "zeta", "objective", "prior", "prior_epsilon", "bins", "delta",
            "calibration", "clip")
    return {k: getattr(args, k, None) for k in keys}


def _reporter(command: str):
    """Print a line of what a command chose (e.g. its feature columns) on stderr, named by the command."""
    return lambda line: print(f"rpwjax {command}: {line}", file=sys.stderr)


def _print_ledger_line(command: str, line):
    if line:
        print(f"rpwjax {command}: {line}", file=sys.stderr)


def _fit(args, labels, epsilon, secret):
    from rpwjax.api import DEFAULT_BINS, fit

    return fit(
        args.mechanism,
        labels,
        range=tuple(args.range),
        epsilon=epsilon,
        prior=args.prior or "private",
        prior_epsilon=args.prior_epsilon,
        bins=DEFAULT_BINS if args.bins is None else args.bins,
        secret=secret,
        clip=args.clip,
        spend_prior=getattr(args, "denoise", "none") == "posterior",
        **_mechanism_options(args),
    )


def cmd_fit(args) -> int:
    from rpwjax import io
    from rpwjax.api import records_total
    from rpwjax.errors import InputError, check_range
    from rpwjax.ledger import ledger_path

    _check_fit_options(args, spend_prior=False)
    if args.prior == "empirical" and (args.save or args.json) and not args.prior_is_public:
        output = " and ".join(flag for flag, given in (("--save", args.save), ("--json", args.json)) if given)
        raise InputError(
            f"--prior empirical with {output} publishes functions of the raw labels (the parameters and label_mse "
            "under their empirical distribution): private only if that prior is public. Say so with "
            "--prior-is-public, or use --prior private (the default)")
    if args.prior_is_public and args.prior != "empirical":
        raise InputError("--prior-is-public does nothing without --prior empirical")
    if args.save:  # before the labels are read
        io.check_outputs([args.save], overwrite=args.overwrite,
                         inputs=[args.labels, args.key_file, ledger_path(args.ledger, args.key_file)])
    elif args.overwrite:
        raise InputError("--overwrite does nothing without --save (fit writes no other file)")
    lo, hi = check_range(*args.range)
    run = _release_run(args, "fit", args.labels, args.label_column, _fit_settings(args), what="labels file")
    labels = io.read_labels(args.labels, args.label_column, encoding=args.encoding, check=(lo, hi, args.clip))
    secret = run.secret
    result = _fit(args, labels, args.epsilon if len(args.epsilon) > 1 else args.epsilon[0], secret.child("fit"))
    records = result.records()
    # what leaves a fit is its private histogram(s): epsilon_1 per epsilon, spent on these labels
    run.start(sum(float(r["epsilon_prior"]) for r in records), mechanism=args.mechanism)
    for r in records:
        r.update(_seed_fields(secret), release_id=run.release_id)
    if len(records) > 1:
        total = records_total(records)
        for r in records:
            r["all_records"] = total
    if args.save:
        if len(records) != 1:
            raise InputError(f"--save writes exactly one fit: give one --epsilon, got {len(records)}")
        from rpwjax.audit.verify import check_record

        # parameters privatize would refuse are not saved: the same checks privatize runs on a params file
        problems = check_record(records[0], stop_early=True)[1]["problems"]
        if problems:
            raise InputError(f"--save: these parameters cannot be released: {problems[0]}")
    run.finish(labels.size)
    if args.save:
        io.write_json(args.save, records[0])
    if args.json:  # JSON Lines, as every --json: one object per epsilon
        for r in records:
            print(json.dumps(r))
        if len(records) > 1:
            print(f"rpwjax fit: {records[0]['all_records']['note']}", file=sys.stderr)
    else:
        for r in records:
            p = r["params"]
            extra = ""
            if r["mechanism"] == "rpwithprior":
                extra = f" A1={p['A1']:.6g} A2={p['A2']:.6g} zeta={p['zeta']:.6g} preservation={p['preservation']:.4f}"
            print(
                f"{r['mechanism']} epsilon={r['epsilon']:g} (prior {r['epsilon_prior']:g} + mechanism "
                f"{r['epsilon_mechanism']:g}, delta={r['delta']:g}) label_mse={r['label_mse']:.6g}{extra}"
            )
        if len(records) > 1:
            print(records[0]["all_records"]["note"])
    _print_ledger_line("fit", run.line)
    return 0


def _check_prior_epsilon(args):
    from rpwjax.errors import InputError

    if (args.prior or "private") == "empirical" and args.prior_epsilon is not None:
        raise InputError(f"--prior-epsilon {args.prior_epsilon:g} does nothing under --prior empirical (nothing is "
                         "spent on a known prior): drop it or use --prior private")


def _seed_fields(secret) -> dict:
    return {"reproducible_seed": True, "seed_note": "integer seed: not for production"} if secret.reproducible else {}


def cmd_keygen(args) -> int:
    from rpwjax.keys import write_key_file

    try:
        with interrupts.held():  # a signal never leaves half a key: it waits, then removes the whole one
            path = write_key_file(args.output)
            interrupts.register(path)
    except OSError as err:  # a read-only file system, a directory we may not write: name the file and the reason
        raise OSError(f"cannot write the key file {str(args.output)!r}: {err.strerror or err}") from None
    print(f"wrote a 256-bit secret to {path} (keep it secret: with it anyone can undo the noise)")
    interrupts.unregister(path)
    return 0


def cmd_privatize(args) -> int:
    from rpwjax import io
    from rpwjax.errors import InputError, check_range
    from rpwjax.ledger import file_sha256, ledger_path
    from rpwjax.privatize import check_chunk_rows, check_row_offset, load_release_params, privatize_file

    check_chunk_rows(args.chunk_rows)
    check_row_offset(args.row_offset)
    io.file_kind(args.input, what="input file")
    io.file_kind(args.output, what="output file")
    # the output and its sidecar, before anything is read or fitted (the ledger too: it is appended, never replaced)
    io.check_outputs([args.output, str(args.output) + ".json"], overwrite=args.overwrite,
                     inputs=[args.input, args.params, args.key_file, ledger_path(args.ledger, args.key_file)])
    if args.range is not None:
        check_range(*args.range)  # before it joins the release's identity
    # post-processing is not part of a release's identity (one release may be written raw and denoised), except
    # posterior denoising of an inline fit, which makes a prior-free mechanism's fit spend epsilon_1 on a histogram
    settings = dict(_fit_settings(args), spend_prior=args.denoise == "posterior" and not args.params,
                    params=None if not args.params else file_sha256(args.params, "params file"))
    run = _release_run(args, "privatize", args.input, args.label_column, settings, row_offset=args.row_offset,
                       identity_settings=None if args.params else "same")
    secret = run.secret
    prior = None
    if args.denoise == "debias" and args.mechanism is not None:
        _check_debias(args.mechanism)  # before any fit
    if args.params:
        if args.mechanism is not None or args.epsilon is not None:
            raise InputError("give either --params or fit options (--mechanism/--epsilon), not both")
        for flag in ("zeta", "objective", "prior", "prior_epsilon", "bins", "delta", "calibration"):
            if getattr(args, flag) is not None:
                raise InputError(f"--{flag.replace('_', '-')} {getattr(args, flag)} does nothing with --params: the "
                                 "params file fixes the fit (refit with `rpwjax fit` to change it)")
        params, record, prior = load_release_params(args.params, prior_is_public=args.prior_is_public,
                                                    range=args.range)
        # the labels of this file pay epsilon_2; the fit's histogram is in the ledger under the fit's input
        run.start(float(record["epsilon_mechanism"]), float(record.get("delta") or 0.0), mechanism=record["mechanism"],
                  params_release_id=record.get("release_id"))
    else:
        if args.mechanism is None or args.epsilon is None:
            raise InputError("privatize needs --params PARAMS.json, or --mechanism and --epsilon to fit")
        if args.range is None:
            raise InputError("--range LO HI is required to fit: the label range is public input")
        _check_fit_options(args, spend_prior=args.denoise == "posterior")
        if args.prior == "empirical" and not args.prior_is_public:
            raise InputError(
                "--prior empirical makes the parameters functions of the raw labels: the release is private only if "
                "that prior is public. Say so with --prior-is-public, or use --prior private (the default)")
        if args.prior_is_public and args.prior != "empirical":
            raise InputError("--prior-is-public does nothing without --prior empirical")
        lo, hi = check_range(*args.range)
        run.start(float(args.epsilon), mechanism=args.mechanism)  # delta (Gaussian) is the fit's, set below
        source = io.TableSource(args.input, args.label_column, encoding=args.encoding)
        with io.progress_bar(source, "read labels", enabled=not args.quiet) as bar:
            labels = io.read_labels(args.input, args.label_column, encoding=args.encoding, check=(lo, hi, args.clip),
                                    bar=bar)
        # the histogram noise (if any) and the release draw from independent keys derived from the secret
        result = _fit(args, labels, args.epsilon, secret.child("fit"))
        params, record = result.params, result.records()[0]
        prior = result.prior_for(0)
        run.record["delta"] = float(record["delta"])
    postprocess = postprocess_name = postprocess_range = None
    if args.denoise == "debias":
        from rpwjax.posterior import debias, debias_record

        _check_debias(params.name)
        coefficients = debias_record(params)
        record = dict(record, debias=coefficients)
        postprocess = lambda noisy: debias(params, noisy)  # noqa: E731
        postprocess_name, postprocess_range = "debias", coefficients["range"]
    if args.denoise == "posterior":
        from rpwjax.posterior import posterior_mean

        if prior is None:
            raise InputError(
                "--denoise posterior needs the prior the fit used: a params file saves it only for a private "
                "histogram (fit with --prior private; for laplace, gaussian and staircase privatize without "
                "--params, which then spends epsilon_1 on the histogram), or privatize without --params to fit inline"
            )
        posterior_mean(params, prior, [params.lo])  # fail before any output if this pair has no posterior
        postprocess = lambda noisy: posterior_mean(params, prior, noisy)  # noqa: E731
        # a posterior mean lies in the range
        postprocess_name, postprocess_range = "posterior-mean", (params.lo, params.hi)
    if record.get("prior", {}).get("kind") in ("empirical", "histogram"):  # no accounted release behind the prior
        record = dict(record, prior_is_public="asserted by the user (--prior-is-public): the guarantee holds only if "
                                              "the prior is public")
    privatize_file(
        args.input,
        args.output,
        label_column=args.label_column,
        params=params,
        secret=secret,  # the release draws from secret.child("release"); an inline fit from secret.child("fit")
        record=record,
        chunk_rows=args.chunk_rows,
        clip=args.clip,
        progress=not args.quiet,
        row_offset=args.row_offset,
        postprocess=postprocess,
        postprocess_name=postprocess_name,
        postprocess_range=postprocess_range,
        encoding=args.encoding,
        before_commit=run.finish,
    )
    _print_ledger_line("privatize", run.line)
    return 0


def _check_sweep_outputs(out_dir, overwrite):
    """A sweep writes DIR/results.csv and DIR/*_curves.png: refused over an earlier sweep's unless --overwrite."""
    from rpwjax import io
    from rpwjax.errors import InputError

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {str(out)!r} is a file: give a directory")
    io.check_outputs([out / "results.csv", *sorted(out.glob("*_curves.png"))], overwrite=overwrite)


DEBIAS_REFUSALS = {
    "laplace": "it adds zero-mean noise to clip(y, lo, hi), so its release is already unbiased for the clipped label "
               "(up to the public clamp of its output range): there is nothing to debias",
    "gaussian": "it adds zero-mean noise to clip(y, lo, hi), so its release is already unbiased for the clipped label "
                "(up to the public clamp of its output range): there is nothing to debias",
    "staircase": "it adds zero-mean noise to clip(y, lo, hi), so its release is already unbiased for the clipped "
                 "label (up to the public clamp of its output range): there is nothing to debias",
    "unbiased": "its release is unbiased for the label by construction: there is nothing to debias",
    "rr-on-bins": "it has no closed-form debiasing: its outputs are the bins' representatives, so E[released | y] "
                  "depends on y only through its bin",
}


def _check_debias(mechanism: str):
    """``--denoise debias`` is RPWithPrior's (y~ - b)/a; every other mechanism is refused, saying why."""
    from rpwjax.errors import InputError

    if mechanism != "rpwithprior":
        raise InputError(f"--denoise debias applies to --mechanism rpwithprior only, got {mechanism}: "
                         f"{DEBIAS_REFUSALS[mechanism]}")


def _sweep(split, config, out_dir, quiet) -> int:
    from pathlib import Path

    from rpwjax.experiments.sweeps import format_table, run_sweep, summarize, write_rows
    from rpwjax.experiments.plots import plot_curves

    rows = run_sweep(split, config, progress=not quiet)
    out = Path(out_dir)
    write_rows(rows, out / "results.csv")
    paths = plot_curves(rows, out)
    print(format_table(summarize(rows)))
    print(f"results: {out / 'results.csv'}")
    for p in paths:
        print(f"plot: {p}")
    return 0


def cmd_curves(args) -> int:
    from rpwjax.experiments.datasets import (VALIDATION_SEED, load_dataset, load_table, train_test_split,
                                             validation_split)
    from rpwjax.errors import InputError, check_integer
    from rpwjax.experiments.sweeps import PAPER_EPSILONS, SweepConfig

    if (args.dataset is None) == (args.data is None):
        raise InputError("give exactly one of --dataset NAME or --data FILE")
    _check_sweep_outputs(args.out, args.overwrite)
    if args.validation_seed is not None:  # checked before any data is read
        if not args.validation:
            raise InputError("--validation-seed does nothing without --validation")
        check_integer(args.validation_seed, "--validation-seed", 0, 2**63 - 1)
    if args.data is not None:
        if args.label_column is None or args.range is None:
            raise InputError("--data needs --label-column COL and --range LO HI (the range is public input)")
        _check_bins(args.bins)
        dataset = load_table(args.data, args.label_column, args.range[0], args.range[1], clip=args.clip,
                             features=args.features, exclude=args.exclude,
                             report=(lambda line: None) if args.quiet else _reporter("curves"))
    else:
        for flag in ("features", "exclude"):
            if getattr(args, flag) is not None:
                raise InputError(f"--{flag} applies to --data (a bundled data set's features are fixed)")
        _check_bins(args.bins)
        dataset = load_dataset(args.dataset)
    config = SweepConfig(
        mechanisms=tuple(args.mechanisms) if args.mechanisms else SweepConfig.mechanisms,
        epsilons=tuple(args.epsilon) if args.epsilon else PAPER_EPSILONS,
        seeds=args.seeds,
        first_seed=args.first_seed,
        epochs=args.epochs,
        prior=args.prior,
        prior_epsilon=args.prior_epsilon,
        bins=args.bins,
        denoise=tuple(args.denoise or ()),
        variants=tuple(args.variants or ()),
        configs=tuple(dict.fromkeys(args.config)),
    )
    split = train_test_split(dataset, seed=0)
    if args.validation:
        split = validation_split(split, seed=VALIDATION_SEED if args.validation_seed is None else args.validation_seed)
    return _sweep(split, config, args.out, args.quiet)


def _pipeline_names() -> list[str]:
    from rpwjax.pipelines import ALIASES, PIPELINES

    return list(PIPELINES) + list(ALIASES)


def cmd_privatize_table(args) -> int:
    from rpwjax import io
    from rpwjax.errors import check_range
    from rpwjax.ledger import ledger_path
    from rpwjax.pipelines.table import explain_table, privatize_table

    if args.explain:  # public numbers only: nothing read from a key, spent, recorded or written
        print(json.dumps(explain_table(args.input, label_column=args.label_column, lo=args.range[0], hi=args.range[1],
                                       epsilon=args.epsilon, pipeline=args.pipeline, encoding=args.encoding,
                                       features=args.features, exclude=args.exclude), indent=2))
        return 0
    io.check_outputs([args.output, str(args.output) + ".json"], overwrite=args.overwrite,
                     inputs=[args.input, args.key_file, ledger_path(args.ledger, args.key_file)])
    check_range(*args.range)
    # the same identity privatize_table binds an unbound secret to, so that the Python call reproduces this release
    settings = {"pipeline": args.pipeline, "epsilon": float(args.epsilon), "range": [float(v) for v in args.range],
                "epochs": args.epochs, "clip": args.clip}
    run = _release_run(args, "privatize-table", args.input, args.label_column, settings)
    run.start(float(args.epsilon), pipeline=args.pipeline)  # a pipeline's delta, if any, is set from its accounting
    sidecar = privatize_table(args.input, args.output, label_column=args.label_column, lo=args.range[0],
                              hi=args.range[1], epsilon=args.epsilon, pipeline=args.pipeline, secret=run.secret,
                              clip=args.clip, encoding=args.encoding, epochs=args.epochs, before_commit=run.finish,
                              features=args.features, exclude=args.exclude, progress=not args.quiet,
                              report=None if args.quiet else _reporter("privatize-table"))
    _print_ledger_line("privatize-table", run.line)
    print(f"{args.pipeline}: {sidecar['rows']} labels privatized at epsilon={float(args.epsilon):g} "
          f"(per label, total) -> {args.output}")
    return 0


def cmd_ledger(args) -> int:
    """Print each (input, label column) of a ledger: its releases and the total epsilon and delta."""
    from rpwjax.errors import InputError
    from rpwjax.ledger import ledger_path, read, summaries

    if args.key_file is not None and args.ledger is not None:
        raise InputError("give either --key-file (its ledger lies beside it) or --ledger FILE, not both")
    path = ledger_path(args.ledger, args.key_file)
    if not path.exists():
        raise InputError(f"ledger {str(path)!r} does not exist: no release has been recorded there")
    groups = summaries(read(path))
    if args.json:
        for g in groups:
            print(json.dumps(g, sort_keys=True))
        return 0
    print(f"ledger {path}: {len(groups)} inputs")
    for g in groups:
        delta = f", delta {g['delta_total']:g}" if g["delta_total"] else ""
        print(f"\n{g['input']} (label {g['label_column']!r}, sha256 {g['input_sha256'][:12]}...): "
              f"epsilon {g['epsilon_total']:g}{delta} in {len(g['releases'])} releases (basic composition)")
        for r in g["releases"]:
            print(f"  {r['time']}  {r['command']:<15} {r['mechanism'] or '':<12} epsilon {r['epsilon']:<8g} "
                  f"rows {r['rows']} from {r['row_offset']}  release {r['release_id']}")
    return 0


def cmd_bench(args) -> int:
    """Run the benchmarks; exit code 1 if any case failed (its error is in results.json)."""
    from rpwjax import io
    from rpwjax.bench.plans import FAMILIES, PLANS
    from rpwjax.bench.report import run_plan, summary
    from rpwjax.errors import InputError, check_integer

    if args.repeats is not None:
        check_integer(args.repeats, "--repeats")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {str(out)!r} is a file: give a directory")
    plots = [] if args.no_plots else [out / f"{family}.png" for family in (args.only or FAMILIES)]
    io.check_outputs([out / "results.json", *plots], overwrite=args.overwrite)
    plan = PLANS[args.plan or ("quick" if args.quick else "full")]
    results = run_plan(plan, args.out, cache_dir=args.cache, families=args.only, repeats=args.repeats,
                       plots=not args.no_plots, progress=not args.quiet)
    print(summary(results))
    print(f"wrote {Path(args.out) / 'results.json'}")
    return 1 if results["errors"] else 0


def cmd_audit(args) -> int:
    """Print the audit table (or JSON lines) and every problem; 0 iff every check passes."""
    from rpwjax.audit import checks, verify
    from rpwjax.errors import InputError

    if args.params is not None:
        if args.mechanism is not None or args.epsilon is not None:
            raise InputError("give either --params FILE or --mechanism/--epsilon, not both: a saved fit states its own "
                             "mechanism and epsilon")
        out = verify.audit_params_file(args.params, samples=args.samples, seed=args.seed, audit_seed=args.audit_seed)
        report, record = out["report"], out["record"]
        if args.json:
            obj = report.to_json() if report is not None else {"mechanism": record["mechanism"]}
            obj.update(params_file=str(args.params), record_pass=record["pass"], record_problems=record["problems"],
                       verified=record, key_check_pass=out["keys"]["pass"], errors=out["broken"],
                       audit_seed=out["audit_seed"], **{"pass": out["pass"]})
            print(json.dumps(obj))
            return 0 if out["pass"] else 1
        if report is not None:
            print(checks.format_table([report]))
        print("\n" + checks.legend(args.samples, out["keys"], out["audit_seed"]))
        print("\n".join(checks.record_lines(args.params, record)))
        reports = [report] if report is not None else []
    else:
        out = checks.run_audit(args.mechanism, args.epsilon, samples=args.samples, seed=args.seed,
                               audit_seed=args.audit_seed)
        reports = out["reports"]
        if args.json:
            for r in reports:
                obj = r.to_json()
                obj["key_check_pass"] = out["keys"]["pass"]
                obj["pass"] = obj["pass"] and out["keys"]["pass"]
                print(json.dumps(obj))
            for line in out["broken"]:
                print(json.dumps({"error": line, "audit_seed": out["audit_seed"], "pass": False}))
            return 0 if out["pass"] else 1
        if reports:
            print(checks.format_table(reports))
        print("\n" + checks.legend(args.samples, out["keys"], out["audit_seed"]))
    for line in checks.problem_lines(reports, out["keys"], out["broken"]):
        print(line)
    return 0 if out["pass"] else 1


def cmd_reproduce(args) -> int:
    from rpwjax.experiments.reproduce import auto_report, beyond_report, run_jobs, write_verdict

    if not args.report_only:
        for name, seconds in run_jobs(args.out, args.only):
            print(f"{name}: {seconds:.0f} s")
    print(write_verdict(args.out))
    print(beyond_report(args.out))
    print(auto_report(args.out))
    return 0


def cmd_demo(args) -> int:
    from rpwjax.experiments.datasets import load_dataset, train_test_split
    from rpwjax.experiments.sweeps import SweepConfig

    _check_sweep_outputs(args.out, args.overwrite)
    config = SweepConfig(epsilons=(0.1, 0.5, 1.0, 2.0, 8.0), seeds=3, epochs=20)
    print("rpwjax demo: all six mechanisms on bundled California Housing, eps in {0.1, 0.5, 1, 2, 8}, "
          f"3 seeds, 20 epochs, private histogram prior (eps1 = 0.1 eps, {config.bins} bins)")
    return _sweep(train_test_split(load_dataset("california"), seed=0), config, args.out, args.quiet)


def build_parser() -> argparse.ArgumentParser:
    from rpwjax.io import MAX_CHUNK_ROWS
    from rpwjax.privatize import DEFAULT_CHUNK_ROWS
    from rpwjax.priors import DEFAULT_BINS

    parser = _Parser(prog="rpwjax", description="Label differential privacy for regression, in JAX.")
    parser.add_argument("--version", action="version", version=f"rpwjax {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("fit", help="fit a mechanism to a label file and report it (with its privacy accounting)")
    p.add_argument("--labels", required=True, help="CSV, Parquet, or text file (one number per line)")
    p.add_argument("--label-column", default=None, help="label column (CSV/Parquet)")
    _add_encoding_option(p)
    p.add_argument("--range", nargs=2, type=float, metavar=("LO", "HI"), required=True, help="public label range")
    _add_fit_options(p, many_epsilons=True, required=True)
    _add_secret_options(p, "private histogram's noise")
    p.add_argument("--save", default=None, help="write the fit (exactly one epsilon) to this JSON file")
    p.add_argument("--json", action="store_true", help="print JSON Lines, one object per epsilon")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --save file (never a key file)")
    p.add_argument("--prior-is-public", action="store_true",
                   help="with --prior empirical and --save or --json (which publish functions of the raw labels): "
                        "the user vouches that the labels' empirical distribution is public; without it they are "
                        "refused. The plain printout is for the operator's terminal and needs no flag")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("keygen", help="write a fresh 256-bit secret (64 hex characters) for --key-file")
    p.add_argument("-o", "--output", required=True, help="the key file to create (refuses to overwrite; mode 0600)")
    p.set_defaults(func=cmd_keygen)

    p = sub.add_parser("privatize", help="replace a file's label column by private labels")
    p.add_argument("input", help="input .csv or .parquet")
    p.add_argument("-o", "--output", required=True, help="output .csv or .parquet (OUTPUT.json gets the parameters)")
    p.add_argument("--label-column", required=True)
    _add_encoding_option(p)
    _add_secret_options(p, "release (and the histogram when fitting inline)")
    p.add_argument("--prior-is-public", action="store_true",
                   help="with --prior empirical (or a params file fitted on one): the user vouches that the labels' "
                        "empirical distribution is public; without it such a release is refused")
    p.add_argument("--params", default=None, help="a params JSON from `rpwjax fit --save` (no refit)")
    p.add_argument("--range", nargs=2, type=float, metavar=("LO", "HI"), help="public label range")
    p.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS,
                   help=f"rows per chunk, 1 to {MAX_CHUNK_ROWS} (default {DEFAULT_CHUNK_ROWS}; output does not "
                        "depend on it)")
    p.add_argument("--denoise", choices=["none", "posterior", "debias"], default="none",
                   help="posterior: write E[Y | private label] under the fit's prior; debias (rpwithprior only): write "
                        "(y~ - b)/a, unbiased for clip(y, A1, A2) (both post-processing, no privacy cost)")
    p.add_argument("--row-offset", type=int, default=0,
                   help="global index of the first row, when INPUT is one shard of a larger data set (default 0); "
                        "offset + rows must not pass 2^63")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing OUTPUT and OUTPUT.json (never a key file)")
    _add_fit_options(p, many_epsilons=False, required=False)
    p.set_defaults(func=cmd_privatize)

    p = sub.add_parser("privatize-table",
                       help="feature-aware private labels for a table (in memory): linear-prior, two-stage, ...")
    p.add_argument("input", help="input .csv or .parquet: numeric feature columns and the label column")
    p.add_argument("-o", "--output", required=True, help="output .csv or .parquet (OUTPUT.json gets the accounting)")
    p.add_argument("--label-column", required=True)
    p.add_argument("--range", nargs=2, type=float, metavar=("LO", "HI"), required=True, help="public label range")
    p.add_argument("--epsilon", type=float, required=True, help="total epsilon per label")
    _add_encoding_option(p)
    _add_secret_options(p, "pipeline (split, statistics, histograms and release)")
    p.add_argument("--pipeline", choices=_pipeline_names(), default="auto",
                   help="default auto: a written rule picks the release and its settings (rpwjax.pipelines.auto)")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs of the two-stage pipelines' stage models (default 50)")
    p.add_argument("--clip", action="store_true", help="clip labels outside --range instead of refusing them")
    _add_feature_options(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars and no report of the feature columns")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing OUTPUT and OUTPUT.json (never a key file)")
    p.add_argument("--explain", action="store_true",
                   help="print the auto rule and the decisions it takes from public numbers (features, rows, "
                        "epsilon, range) as JSON, and stop: no label released, no epsilon spent, OUTPUT not "
                        "written (step 4's decisions read private statistics: they are in a real run's sidecar)")
    p.set_defaults(func=cmd_privatize_table)

    p = sub.add_parser("ledger", help="what each input has spent: the releases in a ledger and their total epsilon")
    p.add_argument("--key-file", default=None, help="the key file whose ledger (KEYFILE.ledger.jsonl) to read")
    p.add_argument("--ledger", default=None, metavar="FILE",
                   help="the ledger file (default: $RPWJAX_LEDGER, else ~/.local/share/rpwjax/ledger.jsonl)")
    p.add_argument("--json", action="store_true",
                   help="JSON Lines: one object per (input, label column) with input, label_column, releases, "
                        "epsilon_total, delta_total")
    p.set_defaults(func=cmd_ledger)

    from rpwjax.api import MECHANISMS, PRIORS
    from rpwjax.experiments.datasets import DATASETS
    from rpwjax.experiments.sweeps import VARIANTS

    p = sub.add_parser("curves", help="privacy-utility sweep: train MLPs on privatized labels, plot test MSE against epsilon")
    p.add_argument("--dataset", choices=list(DATASETS), default=None)
    p.add_argument("--data", default=None, help="your own .csv/.parquet (numeric feature columns + label column)")
    _add_feature_options(p, "with --data: ")
    p.add_argument("--label-column", default=None)
    p.add_argument("--range", nargs=2, type=float, metavar=("LO", "HI"), help="public label range (with --data)")
    p.add_argument("--mechanisms", nargs="+", choices=list(MECHANISMS), default=None, help="default: all six")
    p.add_argument("--epsilon", type=float, nargs="+", default=None, help="default: the paper's ten values")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0, metavar="N",
                   help="seeds N .. N + SEEDS - 1 (default 0); fresh seeds give an independent replicate of a sweep")
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--prior", choices=list(PRIORS), default="private", help="default private (Hist_eps)")
    p.add_argument("--prior-epsilon", type=float, default=None, help="epsilon_1 (default 0.1*epsilon)")
    p.add_argument("--bins", type=int, default=DEFAULT_BINS, help=f"1 to {MAX_BINS} (default {DEFAULT_BINS})")
    p.add_argument("--clip", action="store_true", help="clip labels outside --range")
    p.add_argument("--denoise", nargs="+", choices=[*MECHANISMS, "debias"], default=None, metavar="NAME",
                   help="also evaluate these mechanisms after posterior denoising (rows NAME+posterior); debias: "
                        "the default RPWithPrior fit's release debiased, (y~ - b)/a (rows rpwithprior+debias)")
    p.add_argument("--config", nargs="+", choices=["default", "paper"], default=["default"],
                   help="default, and/or paper: RPWithPrior as the authors' code runs it (zeta 0.7 on california, "
                        "0.4 on crime, capped at (A2-A1)/2; objective inside; epsilon_1 0.017 / epsilon/3)")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=None, metavar="NAME",
                   help="also run these beyond-the-paper pipelines: " + ", ".join(VARIANTS))
    p.add_argument("--validation", action="store_true",
                   help="score on a held-out quarter of the TRAINING rows instead of the test rows (for tuning a "
                        "pipeline or a rule without reading a test row)")
    p.add_argument("--validation-seed", type=int, default=None, metavar="N",
                   help="with --validation: which quarter is held out (the seed of the re-split; default 777). "
                        "Several seeds give several validation folds")
    p.add_argument("--out", required=True, help="output directory (results.csv and plots)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the results.csv and plots of an earlier sweep in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_curves)

    from rpwjax.bench.plans import FAMILIES, PLANS

    p = sub.add_parser("bench", help="runtime benchmarks against baselines and the hardware floor: results.json, plots")
    p.add_argument("--quick", action="store_true",
                   help="smaller sizes and fewer repeats (every family and mechanism; about 2 minutes on 2 cores)")
    p.add_argument("--out", required=True, help="directory for results.json and the plots")
    p.add_argument("--cache", default=None,
                   help="directory for generated input files (default $RPWJAX_BENCH_CACHE or ~/.cache/rpwjax/bench)")
    p.add_argument("--only", nargs="+", choices=FAMILIES, default=None, metavar="FAMILY",
                   help=f"run only these families: {', '.join(FAMILIES)}")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per case (default: by plan)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the results.json and plots of an earlier run in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--plan", choices=tuple(PLANS), default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_bench)

    from rpwjax.audit.checks import DEFAULT_EPSILON, DEFAULT_SAMPLES

    p = sub.add_parser("audit", help="check each mechanism's privacy guarantee exactly and by sampling")
    p.add_argument("--mechanism", default=None, help="mechanism to audit, or 'all' (default)")
    p.add_argument("--epsilon", type=float, nargs="+", default=None,
                   help=f"one or more epsilons to fit and audit (default {DEFAULT_EPSILON:g})")
    p.add_argument("--params", default=None, metavar="FILE",
                   help="audit a saved fit (`rpwjax fit --save`, or the OUTPUT.json sidecar of `rpwjax privatize`) "
                        "instead of fitting the example prior: its record is "
                        "verified (rpwjax.audit.verify: fields agree, guarantee recomputed from the parameters) and its "
                        "parameters get the exact, realized and empirical checks against the epsilon and delta the "
                        "file states")
    p.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                   help=f"outputs sampled per label (default {DEFAULT_SAMPLES})")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0; the audit has nothing to hide)")
    p.add_argument("--audit-seed", type=int, default=None, metavar="N",
                   help="seed of the realized check's fresh random labels (default: a new one from OS entropy on "
                        "every run, printed with the results; give it back to reproduce a run's labels)")
    p.add_argument("--json", action="store_true", help="print one JSON object per (mechanism, epsilon), one per line")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("reproduce", help="regenerate every committed sweep into plots/ (about 2 hours on 2 cores)")
    p.add_argument("--out", default="plots", help="the folder of figures and their tidy CSVs (default plots)")
    p.add_argument("--only", nargs="+", default=None, metavar="JOB",
                   help="run only these jobs (names as in plots/logs/times.txt); the report is redrawn either way")
    p.add_argument("--report-only", action="store_true",
                   help="only redraw the verdict, the beyond-the-paper figures and the target table from the committed rows")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("demo", help="a reduced sweep on bundled California Housing: table and plot (a few minutes)")
    p.add_argument("--out", default="rpwjax-demo", help="output directory (default rpwjax-demo)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the results.csv and plots of an earlier demo in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_demo)
    return parser


def _show_warning(command):
    def show(message, category, filename, lineno, file=None, line=None):
        from rpwjax.errors import one_line

        print(f"rpwjax {command}: warning: {one_line(message)}", file=sys.stderr if file is None else file)

    return show


def main(argv=None) -> int:
    # first of all (the parser imports JAX): from here on SIGINT and SIGTERM end the run with one line
    words = sys.argv[1:] if argv is None else [str(a) for a in argv]
    uninstall = interrupts.install("rpwjax" + (f" {words[0]}" if words and not words[0].startswith("-") else ""))
    try:
        return _main(argv)
    finally:
        uninstall()


def _main(argv) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a bad command line (one line, exit 2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_INPUT)
    import pyarrow as pa

    from rpwjax.errors import InputError, one_line

    command = args.command
    interrupts.set_label(f"rpwjax {command}")
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning(command)
            return args.func(args)
    except KeyboardInterrupt:  # where the handlers are not installed (a thread other than the main one)
        print(f"rpwjax {command}: interrupted by SIGINT; unfinished outputs were removed", file=sys.stderr)
        return EXIT_SIGNAL[signal.SIGINT]
    except InputError as err:
        print(f"rpwjax {command}: error: {one_line(err)}", file=sys.stderr)
        return EXIT_INPUT
    except UnicodeError as err:  # a text file that does not decode is bad input
        print(f"rpwjax {command}: error: {one_line(err)} (give the file's encoding with --encoding)", file=sys.stderr)
        return EXIT_INPUT
    except (OSError, pa.ArrowException) as err:
        print(f"rpwjax {command}: error: {one_line(err)}", file=sys.stderr)
        return EXIT_IO
    except Exception as err:  # noqa: BLE001 - the contract is one line on stderr, never a traceback
        if os.environ.get("RPWJAX_DEBUG"):
            raise
        print(f"rpwjax {command}: internal error: {type(err).__name__}: {one_line(err)} (set RPWJAX_DEBUG=1 for a "
              "traceback)", file=sys.stderr)
        return 1
    finally:
        interrupts.set_label("rpwjax")


if __name__ == "__main__":
    sys.exit(main())
