"""Targets met or not, machine info, plots, and a whole plan run into ``results.json``."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import jax
import jaxlib
import numpy as np
import pyarrow
from matplotlib.figure import Figure
from tqdm.auto import tqdm

from rpwjax.bench.plans import FAMILIES, PLANS, Plan, SAMPLER_SUPPORT, SCHEMA_VERSION, SEARCH_EPSILON, SEARCH_ZETA_FRACTION, TARGETS
from rpwjax.bench.cases import build_groups, cleanup_outputs, clear_caches, default_cache_dir
from rpwjax.bench.timing import time_group
from rpwjax.errors import InputError, check_integer
from rpwjax.io.atomic import atomic_outputs, check_outputs

# --------------------------------------------------------------------------- targets


def _metric(metric: str, median_s, ratio, meta: dict):
    """A target's value from one case: its median, its ratio to the baseline, 1/ratio, or a number in its meta."""
    if metric == "median_s":
        return median_s
    if metric == "ratio":
        return ratio
    if metric == "speedup":
        return 1.0 / ratio if ratio else None
    return meta.get(metric)


def evaluate_targets(cases: list[dict]) -> dict:
    """Each target from the cases of this run; ``proxy`` when measured at another size than specified."""
    out = {}
    for t in TARGETS:
        entry = {"description": t["description"], "threshold": t["threshold"], "op": t["op"], "value": None,
                 "met": None, "size": t["size"], "measured_at_size": None, "proxy": None}
        found = [c for c in cases if c["family"] == t["family"] and c["name"] == t["case"] and c["median_s"]]
        if t["metric"] in ("ratio", "speedup"):
            found = [c for c in found if c["ratio"]]
        if not found:
            skipped = [c["skipped"] for c in cases if c["family"] == t["family"] and c["name"] == t["case"]
                       and "skipped" in c]
            entry["reason"] = f"skipped: {skipped[0]}" if skipped else "not measured in this run"
            out[t["name"]] = entry
            continue
        exact = [c for c in found if c["size"] == t["size"]]
        case = exact[0] if exact else min(found, key=lambda c: (abs(math.log(c["size"] / t["size"])), -c["size"]))
        value = _metric(t["metric"], case["median_s"], case["ratio"], case["meta"])
        proxy = case["size"] != t["size"]
        if "prior_labels" in t and case["meta"].get("prior_labels") != t["prior_labels"]:
            proxy = True
            entry["prior_labels"] = case["meta"].get("prior_labels")
        entry.update(value=value, measured_at_size=case["size"], proxy=proxy,
                     met=bool(value <= t["threshold"] if t["op"] == "<=" else value >= t["threshold"]))
        out[t["name"]] = entry
    return out


def missed_targets(family: str, name: str, size: int, meta: dict, median_s: float, ratio) -> list[str]:
    """The speed targets that name this case at its size and that its median (and ratio to its baseline,
    measured in the same run) miss, as messages; [] when it meets them or no target names it. The rule of
    :func:`evaluate_targets`, for one case (``benchmarks/``'s pytest-benchmark tests fail on these)."""
    missed = []
    for t in TARGETS:
        if (t["family"], t["case"], t["size"]) != (family, name, size):
            continue
        if "prior_labels" in t and meta.get("prior_labels") != t["prior_labels"]:
            continue
        value = _metric(t["metric"], median_s, ratio, meta)
        if value is None:
            missed.append(f"{t['name']}: no {t['metric']} measured")
        elif not (value <= t["threshold"] if t["op"] == "<=" else value >= t["threshold"]):
            missed.append(f"{t['name']}: {value:.4g} {t['op']} {t['threshold']} not met ({t['description']})")
    return missed


# --------------------------------------------------------------------------- reporting


def machine_info() -> dict:
    info = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "jax": jax.__version__,
        "jaxlib": getattr(jaxlib, "__version__", None),
        "numpy": np.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    info["pyarrow"] = pyarrow.__version__
    if hasattr(os, "getloadavg"):
        info["load_average"] = list(os.getloadavg())
    return info


def plotted_families(cases: list[dict]) -> list[str]:
    """The families :func:`plot_results` draws a figure of (those with a timed case), in order."""
    families = list(dict.fromkeys(c["family"] for c in cases))
    return [f for f in families if any(c["family"] == f and c["median_s"] for c in cases)]


def plot_results(cases: list[dict], out_dir, paths=None) -> list[str]:
    """One figure per family: time against size (log-log, baselines dashed) and, where a
    baseline exists, the ratio to it against size. Returns the file names written
    (``FAMILY.png``); ``paths`` maps a family to the path its figure is saved at instead
    (e.g. a temporary one, committed with results.json)."""
    out_dir = Path(out_dir)
    written = []
    for family in plotted_families(cases):
        rows = [c for c in cases if c["family"] == family and c["median_s"]]
        names = list(dict.fromkeys(c["name"] for c in rows))
        baselines = {c["baseline"] for c in cases if c["family"] == family and c["baseline"]}
        with_ratio = [n for n in names if any(c["ratio"] for c in rows if c["name"] == n)]
        ncols = 2 if with_ratio else 1
        fig = Figure(figsize=(6.4 * ncols, 4.4))
        axes = fig.subplots(1, ncols, squeeze=False)
        ax = axes[0, 0]
        for name in names:
            pts = sorted((c["size"], c["median_s"]) for c in rows if c["name"] == name)
            xs, ys = zip(*pts)
            style = dict(color="black", linestyle="--") if name in baselines else {}
            ax.plot(xs, ys, marker="o", label=name + (" (baseline)" if name in baselines else ""), **style)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(rows[0]["size_unit"])
        ax.set_ylabel("median seconds")
        ax.set_title(f"{family}: time")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        if with_ratio:
            ax = axes[0, 1]
            for name in with_ratio:
                pts = sorted((c["size"], c["ratio"]) for c in rows if c["name"] == name and c["ratio"])
                xs, ys = zip(*pts)
                base = next(c["baseline"] for c in rows if c["name"] == name)
                ax.plot(xs, ys, marker="o", label=f"{name} / {base}")
            ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
            for t in TARGETS:
                if t["family"] == family and t["metric"] in ("ratio", "speedup"):
                    level = t["threshold"] if t["metric"] == "ratio" else 1.0 / t["threshold"]
                    ax.axhline(level, color="red", linestyle=":", linewidth=1,
                               label=f"target for {t['case']} at {t['size']:g}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(rows[0]["size_unit"])
            ax.set_ylabel("ratio to baseline (same run)")
            ax.set_title(f"{family}: ratio to baseline")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        name = f"{family}.png"
        fig.savefig(out_dir / name if paths is None else paths[family], dpi=110, format="png")
        written.append(name)
    return written


def run_bench(plan_name: str, out_dir, *, cache_dir=None, families=None, repeats=None, plots: bool = True,
              progress: bool = True, overwrite: bool = False) -> dict:
    """What ``rpwjax bench`` runs: :func:`run_plan` of the plan named ``plan_name``, its outputs (results.json
    and a plot per family) refused over an earlier run's unless ``overwrite``, before any case runs."""
    if repeats is not None:
        check_integer(repeats, "--repeats")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {str(out)!r} is a file: give a directory")
    # every family's plot, not only this run's: an earlier run's set is replaced as a whole (run_plan removes
    # the plots this run does not draw), so it needs --overwrite
    check_outputs([out / "results.json", *(out / f"{family}.png" for family in FAMILIES)], overwrite=overwrite)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if cache.exists() and not cache.is_dir():
        raise InputError(f"--cache {str(cache)!r} is a file: give a directory (generated inputs are kept there)")
    return run_plan(PLANS[plan_name], out_dir, cache_dir=cache_dir, families=families, repeats=repeats, plots=plots,
                    progress=progress)


def run_plan(plan: Plan, out_dir, *, cache_dir=None, families=None, repeats=None, plots=True,
             progress: bool = True, groups=None, budget_s: float | None = None, checkpoint: bool = False) -> dict:
    """Run every case of ``plan``; write ``out_dir/results.json`` (+ plots); return the results.

    By default results.json and the plots are written together at the end, or not at all: a run that
    fails or is interrupted leaves no new file and an earlier run's files as they were. With
    ``checkpoint`` (the device script, whose machine may be taken back mid-run) results.json is
    rewritten after every group instead (``"complete": false`` until the last), so a run cut short
    keeps what it measured. ``groups`` replaces the plan's group order; a group that would start
    after ``budget_s`` seconds is not run and is listed in ``skipped``.
    """
    out_dir = Path(out_dir)
    if checkpoint:
        out_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    groups = build_groups(plan, cache_dir, families) if groups is None else groups
    started = time.perf_counter()
    cases, not_run = [], []
    path = out_dir / "results.json"
    bar = tqdm(total=sum(len(g.members) for g in groups), unit="case", desc="bench", disable=not progress)
    with bar:
        for g in groups:
            elapsed = time.perf_counter() - started
            if budget_s is not None and elapsed > budget_s:
                not_run.append(f"{g.family}:*:{g.size}: not started, time budget spent ({elapsed:.0f} s > {budget_s:.0f} s)")
                bar.update(len(g.members))
                continue
            bar.set_postfix_str(f"{g.family} size={g.size}")
            cases.extend(time_group(g, plan, repeats, bar))
            clear_caches(everything=False)
            if g.family in ("privatize", "privatize-table"):
                cleanup_outputs(cache_dir)
            if checkpoint:
                _write(path, _results(plan, cases, not_run, started, repeats, cache_dir, complete=False))
    clear_caches()
    results = _results(plan, cases, not_run, started, repeats, cache_dir, complete=True)
    families_drawn = plotted_families(cases) if plots else []
    figures = [out_dir / f"{family}.png" for family in families_drawn]
    stale = [out_dir / f"{family}.png" for family in FAMILIES if family not in families_drawn]  # an earlier run's
    with atomic_outputs(path, *figures, remove=stale) as (tmp, *tmp_figures):
        if plots:
            results["plots"] = plot_results(cases, out_dir, paths=dict(zip(families_drawn, tmp_figures)))
        _write(tmp, results)
    return results


def _write(path: Path, results: dict):
    path.write_text(json.dumps(results, indent=2) + "\n")


def _results(plan: Plan, cases, not_run, started, repeats, cache_dir, *, complete: bool) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "plan": plan.name,
        "complete": complete,
        "machine": machine_info(),
        "elapsed_s": time.perf_counter() - started,
        "settings": {"repeats": repeats or plan.repeats, "slow_repeats": repeats or plan.slow_repeats,
                     "min_sample_s": plan.min_sample_s, "search_epsilon": SEARCH_EPSILON,
                     "search_zeta_fraction": SEARCH_ZETA_FRACTION, "sampler_support": SAMPLER_SUPPORT,
                     "cache_dir": str(cache_dir)},
        "cases": cases,
        "targets": evaluate_targets(cases),
        "errors": [f"{c['family']}:{c['name']}:{c['size']}: {c['error']}" for c in cases if "error" in c],
        "skipped": [f"{c['family']}:{c['name']}:{c['size']}: {c['skipped']}" for c in cases if "skipped" in c]
        + list(not_run),
        "plots": [],
    }


SUMMARY_FAMILIES = ("privatize-table", "peers")  # families without a target whose ratios the summary prints


def comparison_lines(cases: list[dict], families=SUMMARY_FAMILIES) -> list[str]:
    """One line per case with a baseline in ``families``: its median, the baseline's, and the ratio."""
    lines = []
    for c in cases:
        if c["family"] not in families or not c["baseline"]:
            continue
        head = f"  {c['family']} {c['size_unit']}={c['size']}: {c['name']}"
        if not (c["median_s"] and c["baseline_median_s"]):
            lines.append(f"{head}: not measured")
            continue
        choice = f" [{c['meta']['branch']}, {c['meta']['release']}]" if c["meta"].get("release") else ""
        memory = f", peak RSS {c['meta']['peak_rss_mb']:.0f} MiB" if c["meta"].get("peak_rss_mb") else ""
        lines.append(f"{head}{choice} {c['median_s']:.4g} s, {c['baseline']} {c['baseline_median_s']:.4g} s, "
                     f"ratio {c['ratio']:.4g} (medians of {c['repeats']}){memory}")
    return lines


def summary(results: dict) -> str:
    lines = [f"rpwjax bench ({results['plan']}, {results['machine']['backend']}, "
             f"{results['machine']['cpu_count']} CPUs, load {results['machine'].get('load_average')}): "
             f"{len(results['cases'])} cases in {results['elapsed_s']:.0f} s"]
    for name, t in results["targets"].items():
        if t["value"] is None:
            lines.append(f"  {name}: not measured")
            continue
        flag = "met" if t["met"] else "NOT MET"
        at = f" (at size {t['measured_at_size']}, spec {t['size']})" if t["proxy"] else ""
        lines.append(f"  {name}: {t['value']:.4g} {t['op']} {t['threshold']:g}: {flag}{at}")
    lines.extend(comparison_lines(results["cases"]))
    for e in results["errors"]:
        lines.append(f"  ERROR {e}")
    for e in results.get("skipped", []):
        lines.append(f"  skipped {e}")
    return "\n".join(lines)


