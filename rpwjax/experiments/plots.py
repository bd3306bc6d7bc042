"""Privacy-utility plots (matplotlib's object API: no pyplot, no global backend)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from rpwjax.io.atomic import atomic_outputs
from rpwjax.mechanisms import MECHANISMS
from rpwjax.experiments.sweeps import (NON_PRIVATE, mechanism_label, mechanism_order, series_name, settings_of, split_of,
                                       splits_of, summarize, write_rows_at)


PLOT_SUFFIX = "_curves.png"  # every plot :func:`curve_plots` names ends so, and no other file it writes does
PLOT_PATTERN = f"*{PLOT_SUFFIX}"


def plot_curves(rows: list[dict], out_dir, *, csv_path=None, replace: bool = False) -> list[Path]:
    """Draw :func:`curve_plots` into ``out_dir`` (and, with ``csv_path``, write ``rows`` there as CSV), all
    together or none: each goes to a temporary file and all are renamed into place at the end
    (:func:`rpwjax.io.atomic.atomic_outputs`), so an error, SIGINT or SIGTERM leaves no new file or folder
    and earlier files as they were. With ``replace`` (``--overwrite``) the folder then holds this run's plots
    only: the files of ``out_dir`` named like a plot of :func:`curve_plots` (:data:`PLOT_PATTERN`) that this
    run does not draw are deleted in the same commit, once everything new is in place; no other file is
    touched. Returns the plots' paths."""
    plots = curve_plots(rows, out_dir)
    csv = [] if csv_path is None else [csv_path]
    drawn = {path for path, _ in plots}
    stale = sorted(p for p in Path(out_dir).glob(PLOT_PATTERN) if p not in drawn) if replace else []
    with atomic_outputs(*csv, *(path for path, _ in plots), remove=stale) as temps:
        if csv:
            write_rows_at(rows, temps[0])
        for (_, draw), tmp in zip(plots, temps[len(csv):]):
            draw().savefig(tmp, format="png", dpi=120)  # a temporary name ends in .part: the format is given
    return [path for path, _ in plots]


def curve_plots(rows: list[dict], out_dir) -> list[tuple[Path, Callable[[], Figure]]]:
    """The plots of ``rows`` as (path in ``out_dir``, function drawing its figure); nothing is drawn or written.

    Per data set (and prior setting, when a data set has several): test MSE against ε (log axes, ±1 std
    band, non-private floor) and label MSE against ε; one line per mechanism and config."""
    out_dir = Path(out_dir)
    summary = summarize(rows)
    plots = []
    panels = [(d, k, prior) for d in sorted({s["dataset"] for s in summary}) for k in splits_of(summary, d)
              for prior in settings_of(summary, d)]
    for dataset, split, prior in panels:
        # one figure per data set, split seed and prior setting (rows of different settings are never mixed)
        sub = [s for s in summary if s["dataset"] == dataset and (s.get("prior") or "private") == prior
               and split_of(s) == split]
        if not sub:
            continue
        several = len(settings_of(summary, dataset)) > 1
        splits = len(splits_of(summary, dataset)) > 1  # named only when one file holds several splits
        stem = f"{dataset}_{prior}" if several else dataset
        path = out_dir / (f"{stem}_split{split}{PLOT_SUFFIX}" if splits else f"{stem}{PLOT_SUFFIX}")
        plots.append((path, functools.partial(_figure, sub, dataset, split, prior, several, splits)))
    return plots


def _figure(sub, dataset, split, prior, several: bool, splits: bool) -> Figure:
    """One panel's figure: the summary rows ``sub`` of one data set, split seed and prior setting."""
    fig = Figure(figsize=(12, 4.8))
    ax_test, ax_label = fig.subplots(1, 2)
    mechs = mechanism_order(series_name(s) for s in sub if s["mechanism"] != NON_PRIVATE)
    colors = matplotlib.colormaps["tab20" if len(mechs) > 10 else "tab10"]
    lowest = np.inf
    for index, m in enumerate(mechs):
        cells = sorted((s for s in sub if series_name(s) == m), key=lambda s: s["epsilon"])
        e = np.array([c["epsilon"] for c in cells])
        mean = np.array([c["test_mse_mean"] for c in cells])
        std = np.array([c["test_mse_std"] for c in cells])
        lowest = min(lowest, float(mean.min()))
        style = {"linewidth": 2.4} if m == "rpwithprior" else {"linewidth": 1.4}
        style["color"] = colors(index % colors.N)
        if m not in MECHANISMS:  # beyond-the-paper variants and other configs: dashed
            style["linestyle"] = "--"
        (line,) = ax_test.plot(e, mean, marker="o", markersize=3, label=mechanism_label(m), **style)
        ax_test.fill_between(e, np.maximum(mean - std, 1e-12), mean + std, color=line.get_color(), alpha=0.18)
        ax_label.plot(e, [c["label_mse_mean"] for c in cells], marker="o", markersize=3,
                      label=mechanism_label(m), **style)
    floor = [s for s in sub if s["mechanism"] == NON_PRIVATE]
    if floor:
        lowest = min(lowest, floor[0]["test_mse_mean"])
    if np.isfinite(lowest):  # a ±std band reaching below zero must not stretch the log axis
        ax_test.set_ylim(bottom=0.5 * lowest)
    if floor:
        ax_test.axhline(floor[0]["test_mse_mean"], color="black", linestyle="--", linewidth=1, label="non-private MLP")
    for ax, title in ((ax_test, "test MSE of the trained MLP"), (ax_label, "label MSE E[(Ỹ − Y)²] on train labels")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("ε (total, incl. prior)")
        ax.set_title(f"{dataset}{f' ({prior} prior)' if several else ''}{f', split {split}' if splits else ''}: {title}")
        ax.grid(True, which="both", alpha=0.3)
    ax_test.legend(fontsize=8)
    fig.tight_layout()
    return fig
