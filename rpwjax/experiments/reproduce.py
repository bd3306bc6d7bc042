"""Every committed sweep, regenerated from the code: ``rpwjax reproduce [--out plots]``.

Each job is one ``rpwjax curves`` run (same arguments a reader can run
alone), written into its own folder of ``plots/``: the tidy ``results.csv``
beside the figure drawn from it. The paper's two settings: ``plots/DATASET/``
(unknown prior: a private histogram costs ε₁) and ``plots/known-prior/DATASET/``
(the prior assumed public), each with RPWithPrior in the default and the
paper's configuration and debiased. The combined beyond-the-paper report
(:func:`beyond_report`) then draws the paper-setting rows and the
beyond-the-paper rows together, writes the rows it drew beside each figure,
and writes the target table. Each job runs in its own process; its output goes to
``plots/logs/NAME.txt`` and its wall time to ``plots/logs/times.txt``
(about 44 minutes on 2 CPU cores for the paper-setting and beyond jobs; 20-46 minutes each for the
three auto jobs and 28-47 each for their replicate on fresh seeds, the longer times two jobs at a time;
24 more for the ten validation folds of auto's step 2; and auto against the six on the train/test splits
7-9 that no rule change was made after and on splits 1-6 (seen before the rule's later changes, rerun on the
frozen rule), 11-57 minutes per split and data set, two to six processes at a time;
:func:`auto_report` then writes ``auto/target.md``, ``auto/validation.md``, ``fresh-seeds/auto/target.md``,
``auto-splits/split-K/target.md`` and one summary per group of splits (:data:`SPLIT_SUMMARIES`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from rpwjax.errors import InputError
from rpwjax.experiments.datasets import load_dataset, train_test_split, validation_split
from rpwjax.experiments.plots import plot_curves
from rpwjax.experiments.sweeps import (NON_PRIVATE, format_target_table, read_rows, series_name, summarize,
                                       target_table)
from rpwjax.mechanisms import MECHANISMS
from rpwjax.pipelines import auto
from rpwjax.pipelines.statistics import principal_scores

LOW_EPSILONS = ("0.05", "0.1", "0.3", "0.5", "0.8", "1", "1.5", "2")
BEYOND_VARIANTS = ("rpwithprior+calibrated", "two-stage", "two-stage-rpwithprior", "two-stage-unbiased", "linear-prior")
DATASETS = ("crime", "california")
MAX_BEYOND_EPSILON = 2.0
AUTO_VARIANTS = ("auto", "rr-on-bins+feature-prior", "unbiased+feature-prior")
FRESH = "fresh-seeds"  # the judged auto sweeps' replicate on fresh seeds: FRESH/auto/DATASET (a tree like auto/'s)
FRESH_DATASETS = ("crime", "california")
AUTO_DATASETS = ("crime", "california", "randhie")
SPLITS = "auto-splits"  # the judged auto sweeps on unseen splits: SPLITS/split-K/DATASET
UNSEEN_SPLITS = (7, 8, 9)  # train/test split seeds never used while the rule was set, nor seen before its last change
UNSEEN_FIRST_SEED = 90  # ... run on seeds 90-94, never used by a validation fold or an earlier sweep (a secret
# draws the same noise, in units of its scale, on every split: seeds 0-4 had been seen on splits 1-6)
# the first judged splits (seeds 0-4), seen before the rule's last changes and rerun on the frozen rule, in the
# two groups they were first judged in: 1-3 (the README shows their whole table) and 4-6 (their counts)
RERUN_SPLITS = ((1, 2, 3), (4, 5, 6))
# each group of splits and its summary: the judged one, then the rerun ones
SPLIT_SUMMARIES = ((UNSEEN_SPLITS, "summary.md"), (RERUN_SPLITS[0], "summary-splits-1-3.md"),
                   (RERUN_SPLITS[1], "summary-splits-4-6.md"))
# splits seen before the rule's last changes, which were made after they had been seen (seeds 0-4)
EARLIER_SPLITS = tuple(sorted(k for chosen, _ in SPLIT_SUMMARIES[1:] for k in chosen))
# step 2 of auto's rule checked on validation folds only (held-out quarters of the training rows; no test row)
VALIDATION_SEEDS = (777, 11, 22, 33, 44)
VALIDATION_EPSILONS = {"crime": ("0.8", "1.5", "2", "4"), "california": ("0.5", "0.8", "1", "1.5")}


@dataclasses.dataclass(frozen=True)
class Job:
    """One committed sweep: ``rpwjax curves ARGS --out OUT/FOLDER``."""

    name: str
    folder: str
    args: tuple[str, ...]

    def argv(self, out: Path) -> list[str]:
        return ["curves", *self.args, "--out", str(out / self.folder), "--quiet", "--overwrite"]  # it replaces its files


def _jobs() -> list[Job]:
    # the paper's two settings, each with the default and the paper's configuration and the debiased rows
    jobs = [Job(d, d, ("--dataset", d, "--seeds", "3", "--config", "default", "paper", "--denoise", "debias"))
            for d in DATASETS]
    jobs += [Job(f"{d}-known-prior", f"known-prior/{d}", ("--dataset", d, "--seeds", "3", "--prior", "empirical",
                                                            "--config", "default", "paper", "--denoise", "debias"))
             for d in DATASETS]
    jobs += [Job(f"posterior-{d}", f"posterior-denoising/{d}",
                 ("--dataset", d, "--mechanisms", "rpwithprior", "rr-on-bins", "unbiased",
                  "--denoise", "rpwithprior", "rr-on-bins", "unbiased", "--epsilon", *LOW_EPSILONS, "--seeds", "3"))
             for d in DATASETS]
    jobs += [Job(f"beyond-{d}", f"beyond/{d}", ("--dataset", d, "--mechanisms", "rpwithprior", "--variants",
                                                 *BEYOND_VARIANTS, "--epsilon", *LOW_EPSILONS, "--seeds", "3"))
             for d in DATASETS]
    # the auto pipeline against the six (default configuration) and the fair comparison, five seeds, every ε
    jobs += [Job(f"auto-{d}", f"auto/{d}", ("--dataset", d, "--variants", *AUTO_VARIANTS, "--seeds", "5"))
             for d in AUTO_DATASETS]
    # the judged auto sweeps again on seeds 5-9, never used by any validation fold or earlier sweep
    jobs += [Job(f"auto-fresh-{d}", f"{FRESH}/auto/{d}", ("--dataset", d, "--variants", *AUTO_VARIANTS, "--seeds", "5",
                                                       "--first-seed", "5"))
             for d in FRESH_DATASETS]
    # auto against the six on train/test splits 7-9, whose test rows no rule change was ever made after (on
    # fresh seeds), and on splits 1-6, seen before the rule's later changes (rerun on the frozen rule)
    jobs += [Job(f"auto-split-{k}-{d}", f"{SPLITS}/split-{k}/{d}",
                 ("--dataset", d, "--variants", "auto", "--seeds", "5",
                  *(("--first-seed", str(UNSEEN_FIRST_SEED)) if k in UNSEEN_SPLITS else ()), "--split-seed", str(k)))
             for k in (*UNSEEN_SPLITS, *EARLIER_SPLITS) for d in AUTO_DATASETS]
    # auto's step 2 with each outcome forced, on five validation folds (the evidence for AutoRule.unbiased_below)
    jobs += [Job(f"auto-validation-{d}-{s}", f"auto/validation/{d}/seed-{s}",
                 ("--dataset", d, "--mechanisms", "unbiased", "--variants", "auto-denoised", "auto-unbiased",
                  "--validation", "--validation-seed", str(s), "--epsilon", *VALIDATION_EPSILONS[d], "--seeds", "3"))
             for d in VALIDATION_EPSILONS for s in VALIDATION_SEEDS]
    jobs.append(Job("beyond-california-5-seeds", "beyond/california-5-seeds",
                    ("--dataset", "california", "--mechanisms", "unbiased", "--variants", "two-stage-unbiased",
                     "--epsilon", "1", "1.5", "2", "--seeds", "5")))
    return jobs


JOBS: tuple[Job, ...] = tuple(_jobs())


def run_jobs(out, only=None) -> list[tuple[str, float]]:
    """Run the jobs (all, or those named in ``only``) into ``out``; returns (name, seconds) per job.

    Each job runs in a fresh process (``python -m rpwjax.cli curves ...``): one process running job after
    job keeps the compiled code of all of them mapped until LLVM can map no more (a run of the ten
    validation folds ended that way).
    """
    import subprocess
    import sys

    out = Path(out)
    names = [j.name for j in JOBS]
    for name in only or ():
        if name not in names:
            raise InputError(f"job must be one of {', '.join(names)}, got {name!r}")
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    times = []
    for job in JOBS:
        if only and job.name not in only:
            continue
        start = time.perf_counter()
        with open(logs / f"{job.name}.txt", "w") as log:
            code = subprocess.run([sys.executable, "-m", "rpwjax.cli", *job.argv(out)], stdout=log,
                                  stderr=subprocess.STDOUT).returncode
        if code != 0:
            raise RuntimeError(f"job {job.name} failed with exit code {code} (see {logs / (job.name + '.txt')})")
        seconds = time.perf_counter() - start
        times.append((job.name, seconds))
        with open(logs / "times.txt", "a") as f:
            f.write(f"{job.name}: {seconds:.0f} s\n")
    return times


def beyond_report(out) -> str:
    """The beyond-the-paper figures and target table from the committed rows in ``out``.

    The paper-setting sweep (``DATASET/results.csv``) and the beyond sweep
    (``beyond/DATASET/results.csv``) use the same protocol, split and seeds;
    the beyond sweep reruns plain RPWithPrior, and its rows must match the
    committed ones (a check that the two runs are comparable). Writes
    ``beyond/DATASET/DATASET_curves.png`` with the rows it was drawn from
    beside it (``beyond/DATASET/curves.csv``) and ``beyond/target.md``;
    returns the table.
    """
    out = Path(out)
    combined = []
    for dataset in ("california", "crime"):
        paper = [r for r in read_rows(out / dataset / "results.csv")
                 if r["epsilon"] <= MAX_BEYOND_EPSILON or r["mechanism"] == "non-private"]
        beyond = read_rows(out / "beyond" / dataset / "results.csv")
        plain = lambda r: r["mechanism"] == "rpwithprior" and r.get("config", "default") == "default"  # noqa: E731
        committed = {(r["epsilon"], r["seed"]): r for r in paper if plain(r)}
        for r in beyond:
            if plain(r):
                c = committed[(r["epsilon"], r["seed"])]
                if not np.isclose(r["label_mse"], c["label_mse"], rtol=1e-9):
                    raise RuntimeError(f"{dataset}: rpwithprior eps={r['epsilon']} seed={r['seed']} differs from the "
                                       "committed paper-setting sweep: the two runs are not comparable")
        rows = paper + [r for r in beyond if r["mechanism"] not in MECHANISMS and r["mechanism"] != "non-private"]
        plot_curves(rows, out / "beyond" / dataset, csv_path=out / "beyond" / dataset / "curves.csv")
        combined += rows
    table = format_target_table(target_table(summarize(combined), max_epsilon=MAX_BEYOND_EPSILON))
    (out / "beyond" / "target.md").write_text(table + "\n")
    return table


RPWITHPRIOR_ROWS = (("rpwithprior", "default"), ("rpwithprior", "paper"), ("rpwithprior+debias", "default"))
BASELINES = ("laplace", "gaussian", "staircase", "rr-on-bins", "unbiased")
SETTINGS = (("private", "", "unknown prior (a private histogram costs ε₁)"),
            ("empirical", "known-prior", "prior assumed public (the paper's known-prior setting)"))


def _label(mechanism: str, config: str) -> str:
    return mechanism + (" [paper]" if config == "paper" else "")


def verdict_table(out) -> list[dict]:
    """Does RPWithPrior (any configuration, raw or debiased) have the lowest mean test MSE among the six?

    One row per data set, prior setting and ε, from the committed sweeps in ``out``
    (``DATASET/results.csv`` and ``known-prior/DATASET/results.csv``): the best
    RPWithPrior row, the best of the five other mechanisms, the relative margin
    (positive: RPWithPrior wins), and the verdict. A difference within one seed
    standard deviation (the larger of the two cells') is a tie.
    """
    out = Path(out)
    table = []
    for prior, folder, _ in SETTINGS:
        for dataset in ("california", "crime"):
            path = out / folder / dataset / "results.csv" if folder else out / dataset / "results.csv"
            cells = [s for s in summarize(read_rows(path)) if s["prior"] == prior]
            for eps in sorted({s["epsilon"] for s in cells if np.isfinite(s["epsilon"])}):
                at = [s for s in cells if s["epsilon"] == eps]
                ours = [s for s in at if (s["mechanism"], s["config"]) in RPWITHPRIOR_ROWS]
                theirs = [s for s in at if s["mechanism"] in BASELINES and s["config"] == "default"]
                if not ours or not theirs:
                    continue
                a = min(ours, key=lambda s: s["test_mse_mean"])
                b = min(theirs, key=lambda s: s["test_mse_mean"])
                diff = b["test_mse_mean"] - a["test_mse_mean"]
                std = max(a["test_mse_std"], b["test_mse_std"])
                verdict = "tie" if abs(diff) <= std else ("wins" if diff > 0 else "loses")
                table.append({"dataset": dataset, "prior": prior, "epsilon": eps,
                              "rpwithprior": _label(a["mechanism"], a["config"]), "rpwithprior_mse": a["test_mse_mean"],
                              "rpwithprior_std": a["test_mse_std"], "baseline": b["mechanism"],
                              "baseline_mse": b["test_mse_mean"], "baseline_std": b["test_mse_std"],
                              "margin": diff / b["test_mse_mean"], "verdict": verdict})
    return table


def format_verdict(table: list[dict]) -> str:
    """The verdict as Markdown: one table per prior setting, and the counts."""
    parts = []
    for prior, _, title in SETTINGS:
        rows = [r for r in table if r["prior"] == prior]
        if not rows:
            continue
        counts = {v: sum(r["verdict"] == v for r in rows) for v in ("wins", "tie", "loses")}
        lines = [f"**{title}**: RPWithPrior wins {counts['wins']}, ties {counts['tie']}, loses {counts['loses']} "
                 f"of {len(rows)} cells.", "",
                 "| data set | ε | best RPWithPrior | best other mechanism | margin | verdict |", "|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['dataset']} | {r['epsilon']:g} | {r['rpwithprior']} {r['rpwithprior_mse']:.4g} ± "
                         f"{r['rpwithprior_std']:.2g} | {r['baseline']} {r['baseline_mse']:.4g} ± {r['baseline_std']:.2g} | "
                         f"{100 * r['margin']:+.1f}% | {r['verdict']} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def write_verdict(out) -> str:
    """``verdict.md`` in ``out`` from the committed sweeps; returns its text."""
    text = format_verdict(verdict_table(out))
    (Path(out) / "verdict.md").write_text(text + "\n")
    return text


TABLE_ORDER = ("rpwithprior", "rpwithprior [paper]", "rpwithprior+debias", "laplace", "gaussian", "staircase",
               "rr-on-bins", "unbiased")


def markdown_tables(path, prior: str) -> str:
    """The README's tables of one sweep: per data set, test MSE mean ± std per mechanism row and ε, best in bold."""
    cells = [s for s in summarize(read_rows(path)) if s["prior"] == prior]
    parts = []
    for dataset in sorted({s["dataset"] for s in cells}):
        sub = [s for s in cells if s["dataset"] == dataset]
        floor = [s for s in sub if s["mechanism"] == NON_PRIVATE]
        present = {series_name(s) for s in sub if s["mechanism"] != NON_PRIVATE}
        series = [n for n in TABLE_ORDER if n in present] + sorted(present - set(TABLE_ORDER))
        head = f"**{dataset}**" + (f" (non-private MLP floor: {floor[0]['test_mse_mean']:.4g} ± "
                                   f"{floor[0]['test_mse_std']:.2g})" if floor else "")
        labels = [n + "†" if n == "gaussian" else n for n in series]
        lines = [head, "", "| ε | " + " | ".join(labels) + " |", "|---" * (len(series) + 1) + "|"]
        for eps in sorted({s["epsilon"] for s in sub if s["mechanism"] != NON_PRIVATE}):
            row = {series_name(s): s for s in sub if s["epsilon"] == eps and s["mechanism"] != NON_PRIVATE}
            best = min(row.values(), key=lambda s: s["test_mse_mean"])["test_mse_mean"]
            out = []
            for name in series:
                s = row.get(name)
                if s is None:
                    out.append("-")
                    continue
                text = f"{s['test_mse_mean']:.4g} ± {s['test_mse_std']:.2g}"
                out.append(f"**{text}**" if s["test_mse_mean"] == best else text)
            lines.append(f"| {eps:g} | " + " | ".join(out) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


FAIR = ("rr-on-bins+feature-prior", "unbiased+feature-prior")
AUTO_TOLERANCE = 0.02  # at ε > MAX_BEYOND_EPSILON auto may be this much worse than the best of the six


def auto_table(out, folder: str = "auto", split: int = 0) -> list[dict]:
    """``auto`` against the best of the six (default configuration) and against the fair comparison.

    One row per data set and ε from ``FOLDER/DATASET/results.csv`` in ``out`` (one sweep: same split, seeds
    and MLP for every row; ``split`` is the train/test split seed the sweep was run on). For ε <= 2 the
    target is met when auto's mean test MSE is lower than the best of the six by more than one seed standard
    deviation (the larger of the two cells'); for larger ε when auto is at most 2% worse. ``safe``: auto
    was never the worse bet there, its mean at most the best of the six's plus one of auto's seed standard
    deviations and its seed standard deviation at most twice the best mechanism's. ``fair``: the better of
    RR-on-Bins and Unbiased given auto's feature-aware prior.
    """
    out = Path(out)
    table = []
    for dataset in AUTO_DATASETS:
        path = out / folder / dataset / "results.csv"
        if not path.exists():
            continue
        cells = summarize(read_rows(path))
        for eps in sorted({s["epsilon"] for s in cells if np.isfinite(s["epsilon"])}):
            at = {s["mechanism"]: s for s in cells if s["epsilon"] == eps and s["config"] == "default"}
            if "auto" not in at:
                continue
            a = at["auto"]
            b = min((s for m, s in at.items() if m in MECHANISMS), key=lambda s: s["test_mse_mean"])
            diff = b["test_mse_mean"] - a["test_mse_mean"]
            std = max(a["test_mse_std"], b["test_mse_std"])
            if eps <= MAX_BEYOND_EPSILON:
                met = diff > std
            else:
                met = a["test_mse_mean"] <= (1 + AUTO_TOLERANCE) * b["test_mse_mean"]
            fair = [at[m] for m in FAIR if m in at]
            f = min(fair, key=lambda s: s["test_mse_mean"]) if fair else None
            safe_mean = a["test_mse_mean"] <= b["test_mse_mean"] + a["test_mse_std"]
            safe_std = a["test_mse_std"] <= 2 * b["test_mse_std"]
            table.append({
                "dataset": dataset, "epsilon": eps, "seeds": a["seeds"], "split": split,
                "safe": bool(safe_mean and safe_std), "safe_mean": bool(safe_mean), "safe_std": bool(safe_std),
                "every_seed_better": bool(a["test_mse_max"] < b["test_mse_min"]),
                "auto_mse": a["test_mse_mean"], "auto_std": a["test_mse_std"],
                "baseline": b["mechanism"], "baseline_mse": b["test_mse_mean"], "baseline_std": b["test_mse_std"],
                "margin": diff / b["test_mse_mean"], "met": bool(met),
                "fair": f["mechanism"] if f else None, "fair_mse": f["test_mse_mean"] if f else None,
                "fair_std": f["test_mse_std"] if f else None,
                "fair_margin": (f["test_mse_mean"] - a["test_mse_mean"]) / f["test_mse_mean"] if f else None,
            })
    return table


def auto_plans(split, epsilons) -> dict:
    """The auto rule's plan for each ε on a split's training rows (public numbers only)."""
    scores = principal_scores(split.x_train, auto.DEFAULT_RULE.components)  # one SVD for every ε
    plans = {}
    for e in epsilons:
        design, bound = auto.afforded_design(None, e, scores=scores)
        plans[e] = auto.plan(e, split.y_train.size, design.shape[1] - 1, bound, split.hi - split.lo)
    return plans


def auto_branches(dataset: str, epsilons, split: int = 0) -> dict:
    """The branch the auto rule takes for each ε on a bundled data set's training rows of split seed ``split``
    (public numbers only)."""
    return {e: p.branch for e, p in auto_plans(train_test_split(load_dataset(dataset), seed=split), epsilons).items()}


def format_auto_table(table: list[dict]) -> str:
    """Markdown: per data set and ε, auto, the best of the six, the margin and the verdict, and the fair comparison."""
    lines = ["| data set | ε | auto (branch) | best of the six | margin | met | never worse | best with auto's prior "
             "| auto vs it |",
             "|---|---|---|---|---|---|---|---|---|"]
    branches = {}
    for d in sorted({t["dataset"] for t in table}):
        branches[d] = auto_branches(d, sorted({t["epsilon"] for t in table if t["dataset"] == d}),
                                    split=table[0].get("split", 0))
    for t in table:
        fair = (f"{t['fair']} {t['fair_mse']:.4g} ± {t['fair_std']:.2g} | {100 * t['fair_margin']:+.1f}%"
                if t["fair"] else "- | -")
        lines.append(
            f"| {t['dataset']} | {t['epsilon']:g} | {t['auto_mse']:.4g} ± {t['auto_std']:.2g} "
            f"({branches[t['dataset']][t['epsilon']]}) | {t['baseline']} {t['baseline_mse']:.4g} ± "
            f"{t['baseline_std']:.2g} | {100 * t['margin']:+.1f}% | {'yes' if t['met'] else '**no**'} | "
            f"{_safe_word(t)} | {fair} |")
    for d in sorted({t["dataset"] for t in table}):
        rows = [t for t in table if t["dataset"] == d]
        lines.append("")
        lines.append(f"{d}: target met in {sum(t['met'] for t in rows)} of {len(rows)} cells "
                     f"({rows[0]['seeds']} seeds); never the worse bet in {sum(t['safe'] for t in rows)} of "
                     f"{len(rows)}; auto beats the better feature-prior baseline in "
                     f"{sum((t['fair_margin'] or 0) > 0 for t in rows)} of {len(rows)}.")
    return "\n".join(lines)


def _safe_word(t: dict) -> str:
    """'yes', or why auto was the worse bet in the cell: its mean, its seed spread, or both."""
    if t["safe"]:
        return "yes"
    why = [w for w, ok in (("mean", t["safe_mean"]), ("spread", t["safe_std"])) if not ok]
    if t.get("every_seed_better"):
        why.append("every seed better than every seed of the best of the six")
    return f"**no** ({'; '.join(why)})"


def split_tables(out, splits=UNSEEN_SPLITS) -> dict[int, list[dict]]:
    """:func:`auto_table` of each of ``splits``' sweeps (``SPLITS/split-K/DATASET/results.csv`` in ``out``)."""
    return {k: t for k in splits if (t := auto_table(out, f"{SPLITS}/split-{k}", split=k))}


def format_split_summary(tables: dict[int, list[dict]]) -> str:
    """Markdown: per data set and ε, each unseen split's margin, target verdict and 'never the worse bet'
    verdict, then per data set the counts over all splits."""
    splits = sorted(tables)
    cells = {(t["dataset"], t["epsilon"], k): t for k in splits for t in tables[k]}
    keys = sorted({(d, e) for d, e, _ in cells}, key=lambda de: (AUTO_DATASETS.index(de[0]), de[1]))
    lines = ["| data set | ε | " + " | ".join(f"split {k}: margin, met, never worse" for k in splits) + " |",
             "|---|---|" + "---|" * len(splits)]
    for d, e in keys:
        parts = []
        for k in splits:
            t = cells.get((d, e, k))
            parts.append("-" if t is None else
                         f"{100 * t['margin']:+.1f}%, {'yes' if t['met'] else '**no**'}, {_safe_word(t)}")
        lines.append(f"| {d} | {e:g} | " + " | ".join(parts) + " |")
    for d in dict.fromkeys(d for d, _ in keys):
        rows = [t for (dd, _, _), t in cells.items() if dd == d]
        lines.append("")
        spread = sum(not t["safe"] and t["every_seed_better"] for t in rows)
        lines.append(f"{d}: target met in {sum(t['met'] for t in rows)} of {len(rows)} cells "
                     f"(splits {', '.join(map(str, splits))}; {rows[0]['seeds']} seeds each); never the worse bet "
                     f"in {sum(t['safe'] for t in rows)} of {len(rows)} (of the others, {spread} fail on the spread "
                     f"alone with every seed of auto better than every seed of the best of the six).")
    return "\n".join(lines)


def validation_table(out) -> list[dict]:
    """Auto's step 2 on the validation folds in ``out`` (``auto/validation/DATASET/seed-N/results.csv``).

    Per data set and ε: the rule's Q on the fold's training rows, the mean over folds (each the mean over
    its seeds) of the test MSE on the held-out quarter with the branch forced each way, in how many folds
    the unbiased branch was the better one, and the branch the rule picks there.
    """
    table = []
    for dataset in VALIDATION_EPSILONS:
        folds = {}
        for seed in VALIDATION_SEEDS:
            path = Path(out) / "auto" / "validation" / dataset / f"seed-{seed}" / "results.csv"
            if path.exists():
                folds[seed] = {(c["mechanism"], c["epsilon"]): c["test_mse_mean"] for c in summarize(read_rows(path))}
        if not folds:
            continue
        split = validation_split(train_test_split(load_dataset(dataset), seed=0))
        for e, p in auto_plans(split, sorted(float(v) for v in VALIDATION_EPSILONS[dataset])).items():
            den = np.array([f[("auto-denoised", e)] for f in folds.values()])
            unb = np.array([f[("auto-unbiased", e)] for f in folds.values()])
            table.append({"dataset": dataset, "epsilon": e, "rows": int(split.y_train.size), "folds": len(folds),
                          "q": p.unbiased_noise_ratio, "rule": p.branch, "denoised_mse": float(den.mean()),
                          "unbiased_mse": float(unb.mean()), "unbiased_wins": int((unb < den).sum())})
    return table


def format_validation_table(table: list[dict]) -> str:
    lines = [f"Step 2 of auto's rule on validation folds (held-out quarters of the training rows, never a test "
             f"row): unbiased labels when Q < {auto.DEFAULT_RULE.unbiased_below:g}. Test MSE on the held-out rows, mean over "
             f"folds of the mean over 3 seeds.", "",
             "| data set | ε | Q (fold's rows) | forced denoised | forced unbiased | unbiased better in | the rule picks |",
             "|---|---|---|---|---|---|---|"]
    for t in table:
        lines.append(f"| {t['dataset']} | {t['epsilon']:g} | {t['q']:.5f} | {t['denoised_mse']:.4g} | "
                     f"{t['unbiased_mse']:.4g} | {t['unbiased_wins']} of {t['folds']} folds | {t['rule']} |")
    return "\n".join(lines)


def auto_report(out) -> str:
    """``auto/target.md`` (and ``auto/validation.md``, and ``fresh-seeds/auto/target.md`` for the replicate on
    fresh seeds) in ``out`` from the committed auto sweeps; returns the text."""
    texts = []
    table = auto_table(out)
    if table:
        texts.append(format_auto_table(table))
        (Path(out) / "auto" / "target.md").write_text(texts[-1] + "\n")
    fresh = auto_table(Path(out) / FRESH)
    if fresh:
        texts.append(format_auto_table(fresh))
        (Path(out) / FRESH / "auto" / "target.md").write_text(texts[-1] + "\n")
    for chosen, name in SPLIT_SUMMARIES:
        splits = split_tables(out, chosen)
        for k, table in splits.items():
            (Path(out) / SPLITS / f"split-{k}" / "target.md").write_text(format_auto_table(table) + "\n")
        if splits:
            texts.append(format_split_summary(splits))
            (Path(out) / SPLITS / name).write_text(texts[-1] + "\n")
    validation = validation_table(out)
    if validation:
        texts.append(format_validation_table(validation))
        (Path(out) / "auto" / "validation.md").write_text(texts[-1] + "\n")
    return "\n\n".join(texts)
