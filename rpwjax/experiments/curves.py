"""The sweeps of ``rpwjax curves`` and ``rpwjax demo``: which data, which outputs, and what is written.

:func:`curves_split` picks the data (a bundled data set or the user's own
file, optionally a validation split of its training rows), refusing options
that would do nothing; :func:`sweep_to` runs a sweep into a folder
(results.csv and the plots, refused over an earlier sweep's unless
``overwrite``, which also deletes the earlier plots it does not draw again, and over its own input always:
:func:`check_sweep_outputs`;
written all together or not at all: :func:`~rpwjax.experiments.plots.plot_curves`) and returns the
lines to print.
"""

from __future__ import annotations

from pathlib import Path

from rpwjax.api import check_bins
from rpwjax.errors import InputError, check_integer
from rpwjax.experiments.datasets import (VALIDATION_SEED, Split, load_dataset, load_table, train_test_split,
                                         validation_split)
from rpwjax.experiments.plots import PLOT_PATTERN, plot_curves
from rpwjax.experiments.sweeps import SweepConfig, format_table, run_sweep, summarize
from rpwjax.io.atomic import check_outputs
from rpwjax.tables import check_feature_options

DEMO_CONFIG = dict(epsilons=(0.1, 0.5, 1.0, 2.0, 8.0), seeds=3, epochs=20)


def check_sweep_outputs(out_dir, overwrite: bool, inputs=()):
    """A sweep writes DIR/results.csv and DIR/*_curves.png: refused over an earlier sweep's unless ``overwrite``,
    and over one of its ``inputs`` (``--data``) always."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {str(out)!r} is a file: give a directory")
    check_outputs([out / "results.csv", *sorted(out.glob(PLOT_PATTERN))], overwrite=overwrite, inputs=inputs)


def curves_split(*, dataset=None, data=None, label_column=None, range=None, features=None, exclude=None,
                 clip: bool = False, bins=None, validation: bool = False, validation_seed=None, split_seed=0,
                 out_dir, overwrite: bool = False, report=None) -> Split:
    """The train/test split a curves sweep runs on (its outputs checked first); ``report`` gets the feature
    choice of a user's file in words. ``split_seed`` is the seed of the 80/20 train/test split (0: the split of
    every committed sweep); ``validation`` then splits that split's training rows again."""
    if (dataset is None) == (data is None):
        raise InputError("give exactly one of --dataset NAME or --data FILE")
    check_sweep_outputs(out_dir, overwrite, inputs=[data])
    split_seed = check_integer(split_seed, "--split-seed", 0, 2**63 - 1)  # checked before any data is read
    if validation_seed is not None:  # checked before any data is read
        if not validation:
            raise InputError("--validation-seed does nothing without --validation")
        check_integer(validation_seed, "--validation-seed", 0, 2**63 - 1)
    if data is not None:
        if label_column is None or range is None:
            raise InputError("--data needs --label-column COL and --range LO HI (the range is public input)")
        check_feature_options(features, exclude)  # before the file is read
        check_bins(bins)
        loaded = load_table(data, label_column, range[0], range[1], clip=clip, features=features, exclude=exclude,
                            report=(lambda line: None) if report is None else report)
    else:
        for flag, value in (("features", features), ("exclude", exclude)):
            if value is not None:
                raise InputError(f"--{flag} applies to --data (a bundled data set's features are fixed)")
        check_bins(bins)
        loaded = load_dataset(dataset)
    split = train_test_split(loaded, seed=split_seed)
    if validation:
        split = validation_split(split, seed=VALIDATION_SEED if validation_seed is None else validation_seed)
    return split


def sweep_to(split: Split, config: SweepConfig, out_dir, *, progress: bool = True,
             overwrite: bool = False) -> list[str]:
    """Run ``config`` on ``split``, write DIR/results.csv and the plots; the summary table and paths to print.

    With ``overwrite`` the sweep replaces an earlier one: the earlier plots this sweep does not draw again are
    deleted in the same commit (:func:`~rpwjax.experiments.plots.plot_curves`), so the folder never mixes
    the results of two sweeps."""
    rows = run_sweep(split, config, progress=progress)
    out = Path(out_dir)
    paths = plot_curves(rows, out, csv_path=out / "results.csv", replace=overwrite)
    return [format_table(summarize(rows)), f"results: {out / 'results.csv'}", *(f"plot: {p}" for p in paths)]

