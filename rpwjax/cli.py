"""The ``rpwjax`` command line: it parses arguments, calls the library and prints.

Errors print one line on stderr naming the problem and the value: exit 2 for
bad input (including a bad command line), 1 for I/O errors. ``SIGINT`` and
``SIGTERM`` stop a run at any moment with one line and exit 130 and 143
(:mod:`rpwjax.interrupts`, installed before anything heavy is imported).
Nothing half-written is left behind (:func:`rpwjax.io.atomic.atomic_outputs`).
Warnings are printed as one line each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import traceback
import warnings
from pathlib import Path

from rpwjax import __version__, interrupts

EXIT_INPUT = 2
EXIT_IO = 1
EXIT_SIGNAL = interrupts.EXIT_CODES


def _shown(value) -> str:
    """An option's value in a message: a float as short as it reads back (1.0 as 1), anything else as text."""
    if isinstance(value, list):
        return " ".join(_shown(v) for v in value)
    if isinstance(value, float):
        short = format(value, "g")
        return short if float(short) == value else repr(value)
    return str(value)


class _StoreOnce(argparse.Action):
    """argparse's plain store, except that an option taking one value (or a fixed number, like ``--range LO HI``)
    refuses to be given twice: argparse would keep the last silently, so ``--epsilon 1 --epsilon 2`` spent 2 and
    ``--label-column y --label-column a`` privatized ``a``. Options taking a list (nargs '+' or '*') store as before.
    """

    def __call__(self, parser, namespace, values, option_string=None):
        once = bool(self.option_strings) and (self.nargs is None or isinstance(self.nargs, int))
        if once:
            given = parser.given_options  # this parse's (reset by _Parser.parse_known_args): {dest: value}
            if self.dest in given:
                raise argparse.ArgumentError(self, f"given twice ({_shown(given[self.dest])} and {_shown(values)}): "
                                                   "give it once")
            given[self.dest] = values
        setattr(namespace, self.dest, values)


_FLOAT_DIGITS = re.compile(r"[1-9]")


def _float_as_typed(text: str) -> float:
    """``float(text)`` for the command line, refusing a finite number that float64 cannot hold, named as typed:
    ``1e400`` would read as inf and ``1e-400`` as 0.0, and the later checks would name inf or 0.0, a value the
    user never gave. ``inf``, ``nan`` and zeros written as such are left to those checks."""
    value = float(text)  # a ValueError: argparse says "invalid float value: 'TEXT'"
    mantissa = text.strip().lower().split("e")[0]
    if math.isinf(value) and "inf" not in mantissa:
        raise argparse.ArgumentTypeError(f"{text!r} lies outside float64's range (it would read as {value!r})")
    if value == 0 and _FLOAT_DIGITS.search(mantissa):
        raise argparse.ArgumentTypeError(f"{text!r} lies below float64's smallest positive number 5e-324 (it would "
                                         "read as 0.0)")
    return value


class _Parser(argparse.ArgumentParser):
    # a value like "-1e6", "-2.5E-3" or "-inf" (e.g. after --range) is a negative number, not an option: argparse's
    # own pattern knows only "-1" and "-1.5"
    NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-inf(inity)?$", re.IGNORECASE)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = self.NEGATIVE_NUMBER
        # every parser of the command line (subparsers are made by this class too): each store option refuses a
        # repeat, and each float option a number float64 cannot hold
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)
        self.register("type", float, _float_as_typed)
        self.given_options = {}

    def parse_known_args(self, args=None, namespace=None):
        self.given_options = {}  # the options given so far in this parse (_StoreOnce)
        return super().parse_known_args(args, namespace)

    def error(self, message):  # one line, exit 2, like every other bad input
        if message.startswith("the following arguments are required") and "--range" in message:
            message += " (the label range is public input, never read from the labels)"
        self.exit(EXIT_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_fit_options(p: argparse.ArgumentParser, *, many_epsilons: bool, required: bool):
    from rpwjax.api import DEFAULT_BINS, MAX_BINS, MECHANISMS

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


def _add_secret_options(p: argparse.ArgumentParser, what: str, shards: bool = False):
    offset = " and --row-offset" if shards else ""
    p.add_argument("--key-file", default=None,
                   help=f"256-bit secret from `rpwjax keygen` for the {what} (default: fresh OS entropy); each run "
                        f"is a new release with a fresh --release-id: the same key file with a release's id{offset} "
                        "reproduces that release bit for bit")
    p.add_argument("--seed", type=int, default=None,
                   help="EXPERIMENTS ONLY: an integer seed instead of a secret (guessable; the sidecar says "
                        "\"reproducible_seed\": true, not for production)")
    p.add_argument("--release-id", default=None, metavar="ID",
                   help="reproduce the release with this id (from its sidecar or params"
                        + ("), or privatize another shard of it (other rows, --row-offset)" if shards else
                           ", and its --key-file)") + "; default: a fresh 128-bit id, so that no two releases share "
                        "randomness")
    p.add_argument("--ledger", default=None, metavar="FILE",
                   help="the release ledger to append to (default: KEYFILE.ledger.jsonl beside --key-file, else "
                        "$RPWJAX_LEDGER, else ~/.local/share/rpwjax/ledger.jsonl); `rpwjax ledger` prints its totals")
    p.add_argument("--budget", type=float, default=None, metavar="E",
                   help="refuse, before writing anything, a release that would take this input's total epsilon in "
                        "the ledger past E")


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


def _reporter(command: str):
    """Print a line of what a command chose (e.g. its feature columns) on stderr, named by the command."""
    return lambda line: print(f"rpwjax {command}: {line}", file=sys.stderr)


def _print_ledger_line(command: str, line):
    if line:
        print(f"rpwjax {command}: {line}", file=sys.stderr)


_FIT_OPTIONS = ("mechanism", "epsilon", "range", "zeta", "objective", "prior", "prior_epsilon", "bins", "delta",
                "calibration", "clip")
_SECRET_OPTIONS = dict(key_file="key_file", seed="seed", release_id="release_id", ledger="ledger", budget="budget")


def _fit_options(args):
    """The fit options as given on the command line (rpwjax.api.FitOptions)."""
    from rpwjax.api import FitOptions

    return FitOptions(**{k: getattr(args, k, None) for k in _FIT_OPTIONS})


def _secret_options(args, ledger="ledger") -> dict:
    """--key-file, --seed, --release-id, --ledger and --budget as keyword arguments (the ledger's under ``ledger``)."""
    return {ledger if k == "ledger" else k: getattr(args, v) for k, v in _SECRET_OPTIONS.items()}


def cmd_fit(args) -> int:
    from rpwjax.privatize import fit_file

    records, line = fit_file(args.labels, _fit_options(args), label_column=args.label_column, encoding=args.encoding,
                             save=args.save, publish=args.json, overwrite=args.overwrite,
                             prior_is_public=args.prior_is_public, report=_reporter("fit"),
                             **_secret_options(args, ledger="ledger_file"))
    if args.json:  # JSON Lines, as every --json: one object per epsilon
        for r in records:
            print(json.dumps(r))
        if len(records) > 1:
            print(f"rpwjax fit: {records[0]['all_records']['note']}", file=sys.stderr)
    else:
        for r in records:
            print(_fit_line(r))
        if len(records) > 1:
            print(records[0]["all_records"]["note"])
    _print_ledger_line("fit", line)
    return 0


def _fit_line(r: dict) -> str:
    """One fit record in words."""
    p = r["params"]
    extra = ""
    if r["mechanism"] == "rpwithprior":
        extra = f" A1={p['A1']:.6g} A2={p['A2']:.6g} zeta={p['zeta']:.6g} preservation={p['preservation']:.4f}"
    return (f"{r['mechanism']} epsilon={r['epsilon']:g} (prior {r['epsilon_prior']:g} + mechanism "
            f"{r['epsilon_mechanism']:g}, delta={r['delta']:g}) label_mse={r['label_mse']:.6g}{extra}")


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
    from rpwjax.privatize import privatize_file

    fit = {k: getattr(args, k) for k in _FIT_OPTIONS}
    privatize_file(args.input, args.output, label_column=args.label_column, params=args.params, **fit,
                   prior_is_public=args.prior_is_public, denoise=args.denoise, chunk_rows=args.chunk_rows,
                   row_offset=args.row_offset, encoding=args.encoding, overwrite=args.overwrite,
                   progress=not args.quiet, report=_reporter("privatize"), **_secret_options(args))
    return 0


def cmd_curves(args) -> int:
    from rpwjax.errors import InputError
    from rpwjax.experiments.curves import curves_split, sweep_to
    from rpwjax.experiments.sweeps import PAPER_EPSILONS, SweepConfig

    config = SweepConfig(
        mechanisms=tuple(args.mechanisms) if args.mechanisms else SweepConfig.mechanisms,
        epsilons=tuple(args.epsilon) if args.epsilon else PAPER_EPSILONS, seeds=args.seeds,
        first_seed=args.first_seed, epochs=args.epochs, prior=args.prior, prior_epsilon=args.prior_epsilon,
        bins=args.bins, denoise=tuple(args.denoise or ()), variants=tuple(args.variants or ()),
        configs=tuple(dict.fromkeys(args.config)),
    ).validate()  # every option checked before the data is read
    if args.data is not None and "paper" in config.configs:
        raise InputError("--config paper is the paper's setting for its bundled data sets (california, crime), "
                         "not for a --data table")
    split = curves_split(dataset=args.dataset, data=args.data, label_column=args.label_column, range=args.range,
                         features=args.features, exclude=args.exclude, clip=args.clip, bins=args.bins,
                         validation=args.validation, validation_seed=args.validation_seed,
                         split_seed=args.split_seed, out_dir=args.out,
                         overwrite=args.overwrite, report=None if args.quiet else _reporter("curves"))
    if split.y_test.size < 30:  # even with --quiet: the table reads as if its digits meant something
        print(f"rpwjax curves: warning: only {split.y_test.size} test rows: each test MSE is an average over that "
              "few labels, and its digits mean little", file=sys.stderr)
    print("\n".join(sweep_to(split, config, args.out, progress=not args.quiet, overwrite=args.overwrite)))
    if args.data is not None:  # with the results (an error stays one line); even with --quiet
        print("rpwjax curves: warning: an experiment, not a release: test and label MSE are measured against the "
              "true labels, a non-private model may join them, and the noise comes from integer seeds, so "
              "results.csv and the plots are not private (publish them only where the labels may be)",
              file=sys.stderr)
    return 0


def _pipeline_names() -> list[str]:
    from rpwjax.pipelines import ALIASES, PIPELINES

    return list(PIPELINES) + list(ALIASES)


def cmd_privatize_table(args) -> int:
    from rpwjax.pipelines.table import explain_table, privatize_table_file
    from rpwjax.tables import check_feature_options

    check_feature_options(args.features, args.exclude)  # before anything is read or recorded
    if args.explain:  # public numbers only: nothing read from a key, spent, recorded or written
        print(json.dumps(explain_table(args.input, label_column=args.label_column, lo=args.range[0], hi=args.range[1],
                                       epsilon=args.epsilon, pipeline=args.pipeline, encoding=args.encoding,
                                       features=args.features, exclude=args.exclude), indent=2))
        return 0
    sidecar, line = privatize_table_file(
        args.input, args.output, label_column=args.label_column, range=args.range, epsilon=args.epsilon,
        pipeline=args.pipeline, epochs=args.epochs, clip=args.clip, features=args.features, exclude=args.exclude,
        encoding=args.encoding, overwrite=args.overwrite, progress=not args.quiet,
        report=None if args.quiet else _reporter("privatize-table"), warn=_reporter("privatize-table"),
        **_secret_options(args))
    _print_ledger_line("privatize-table", line)
    print(f"{args.pipeline}: {sidecar['rows']} labels privatized at epsilon={float(args.epsilon):g} "
          f"(per label, total) -> {args.output}")
    return 0


def cmd_ledger(args) -> int:
    """Print each (input, label column) of a ledger: its releases and the total epsilon and delta."""
    from rpwjax.ledger import report_lines

    for line in report_lines(args.ledger, args.key_file, as_json=args.json):
        print(line)
    return 0


def cmd_bench(args) -> int:
    """Run the benchmarks; exit code 1 if any case failed (its error is in results.json)."""
    from rpwjax.bench.report import run_bench, summary

    results = run_bench(args.plan or ("quick" if args.quick else "full"), args.out, cache_dir=args.cache,
                        families=args.only, repeats=args.repeats, plots=not args.no_plots, progress=not args.quiet,
                        overwrite=args.overwrite)
    print(summary(results))
    print(f"wrote {Path(args.out) / 'results.json'}")
    return 1 if results["errors"] else 0


def cmd_audit(args) -> int:
    """Print the audit table (or JSON lines) and every problem; 0 iff every check passes."""
    from rpwjax.audit.command import audit_lines

    lines, passed = audit_lines(mechanism=args.mechanism, epsilon=args.epsilon, params=args.params,
                                samples=args.samples, seed=args.seed, audit_seed=args.audit_seed, as_json=args.json)
    for line in lines:
        print(line)
    return 0 if passed else 1


def cmd_reproduce(args) -> int:
    from rpwjax.experiments.reproduce import auto_report, beyond_report, run_jobs, write_verdict
    from rpwjax.errors import InputError

    if args.report_only and not (Path(args.out) / "california" / "results.csv").is_file():
        raise InputError(f"--out {str(args.out)!r} holds no committed sweeps to report on (no california/results.csv): "
                         "give the folder `rpwjax reproduce` wrote, e.g. the repository's plots")
    if not args.report_only:
        for name, seconds in run_jobs(args.out, args.only):
            print(f"{name}: {seconds:.0f} s")
    print(write_verdict(args.out))
    print(beyond_report(args.out))
    print(auto_report(args.out))
    return 0


def cmd_demo(args) -> int:
    from rpwjax.experiments.curves import DEMO_CONFIG, check_sweep_outputs, sweep_to
    from rpwjax.experiments.datasets import load_dataset, train_test_split
    from rpwjax.experiments.sweeps import SweepConfig

    check_sweep_outputs(args.out, args.overwrite)
    config = SweepConfig(**DEMO_CONFIG)
    print("rpwjax demo: all six mechanisms on bundled California Housing, eps in {0.1, 0.5, 1, 2, 8}, "
          f"3 seeds, 20 epochs, private histogram prior (eps1 = 0.1 eps, {config.bins} bins)")
    split = train_test_split(load_dataset("california"), seed=0)
    print("\n".join(sweep_to(split, config, args.out, progress=not args.quiet, overwrite=args.overwrite)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from rpwjax.io.source import MAX_CHUNK_ROWS
    from rpwjax.privatize import DEFAULT_CHUNK_ROWS
    from rpwjax.api import MAX_BINS
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
    _add_secret_options(p, "release (and the histogram when fitting inline)", shards=True)
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
    p.add_argument("--row-offset", type=int, default=None,
                   help="global index of the first row, when INPUT is one shard of a larger data set (default 0); "
                        "offset + rows must not pass 2^63. Needed with a --release-id this ledger has not recorded "
                        "(a shard made elsewhere): shards must cover disjoint rows")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing OUTPUT and OUTPUT.json (never a key file)")
    _add_fit_options(p, many_epsilons=False, required=False)
    p.set_defaults(func=cmd_privatize)

    p = sub.add_parser("privatize-table",
                       help="feature-aware private labels for a table (in memory): linear-prior, two-stage, ...")
    p.add_argument("input", help="input .csv or .parquet: numeric feature columns and the label column")
    p.add_argument("-o", "--output", help="output .csv or .parquet (OUTPUT.json gets the accounting); required "
                                          "unless --explain")
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
    p.add_argument("--data", default=None, help="your own .csv/.parquet (numeric feature columns + label column); "
                   "the results are measured on its true labels and are not private")
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
    p.add_argument("--split-seed", type=int, default=0, metavar="N",
                   help="the seed of the 80/20 train/test split (default 0, the split of the committed sweeps); "
                        "another seed holds out other test rows")
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
                   help="smaller sizes and fewer repeats (every family and mechanism; a few minutes on 2 cores)")
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

    from rpwjax.audit.checks import DEFAULT_EPSILON
    from rpwjax.audit.empirical import DEFAULT_SAMPLES

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

    p = sub.add_parser("reproduce", help="regenerate every committed sweep into plots/, replacing its files there "
                       "(51 jobs, about 20 hours on 2 cores; per-job times in plots/logs/times.txt)")
    p.add_argument("--out", default="plots", help="the folder of figures and their tidy CSVs (default plots)")
    p.add_argument("--only", nargs="+", default=None, metavar="JOB",
                   help="run only these jobs, e.g. crime, beyond-california, auto-split-1-crime (an unknown name is "
                        "refused with the list of all 51); the report is redrawn either way")
    p.add_argument("--report-only", action="store_true",
                   help="only redraw the verdict, the beyond-the-paper figures and the target table from the committed "
                        "rows (replacing those files in --out)")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("demo", help="a reduced sweep on bundled California Housing: table and plot (about two minutes on 2 "
                       "cores)")
    p.add_argument("--out", default="rpwjax-demo", help="output directory (default rpwjax-demo)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the results.csv and plots of an earlier demo in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_demo)
    return parser


# NumPy's floating-point warnings ("overflow encountered in divide", ...): an intermediate that went to inf or NaN
_NUMPY_FLOAT_WARNING = re.compile(r"^(overflow|underflow|divide by zero|invalid value) encountered in ")


def _show_warning(command, held: list):
    """Print each warning as one line; NumPy's floating-point warnings go to ``held`` instead: the checks after the
    arithmetic turn such a value into a named error (e.g. epsilon too small for the range), whose one line must
    stand alone, so they are printed only once the command has returned without an error."""
    def show(message, category, filename, lineno, file=None, line=None):
        from rpwjax.errors import one_line

        text = f"rpwjax {command}: warning: {one_line(message)}"
        if issubclass(category, RuntimeWarning) and _NUMPY_FLOAT_WARNING.match(str(message)):
            held.append(text)
        else:
            print(text, file=sys.stderr if file is None else file)

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
    held: list[str] = []
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning(command, held)
            code = args.func(args)
        for line in held:  # no error to stand alone: the floating-point warnings are worth a look
            print(line, file=sys.stderr)
        return code
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


def entry(argv=None):
    """The ``rpwjax`` command: :func:`main`, then stdout and stderr flushed and the process ended with its code.

    It ends with ``os._exit``, skipping the interpreter's teardown: after the work is done, that teardown
    can still abort natively (exit -6) while native worker threads are alive (pyarrow's CPU pool, started
    by any threaded read, and XLA's), turning a finished run into a failed one. Nothing is lost by skipping
    it: when :func:`main` returns, every output has been written, closed and renamed into place, the
    stream workers are idle, and no atexit hook of the package holds data.
    """
    try:
        code = main(argv)
    except SystemExit as exc:  # main returns its codes; a command that calls sys.exit still ends here
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - RPWJAX_DEBUG re-raises: the traceback, then exit 1
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (rpwjax ... | head): nothing left to deliver
            pass
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    entry()
