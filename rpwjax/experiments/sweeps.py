"""Privacy-utility sweeps: privatize train labels, train many MLPs at once, score.

One sweep = data set x mechanisms x ε grid x seeds. Each mechanism is fitted
over the whole ε grid in one vmapped call; every (mechanism, ε, seed) draws
its own noisy copy of the training labels; then ALL models train together in
one vmapped training run (:func:`rpwjax.training.train_many`), in slices of
at most ``max_models``. Test MSE is measured on the TRUE test labels.

Reproducibility: randomness derives from (seed, mechanism, ε value), never
from a position in a grid, so rerunning one cell of a committed sweep (one
mechanism, one ε, the same seeds) gives the same noisy labels and the same
models, up to float32 rounding of the batched training.
Seeds here are public on purpose (reproducible research); for real releases
the noise seed must be secret.
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from tqdm.auto import tqdm

from rpwjax import api
from rpwjax.experiments.datasets import Split
from rpwjax.errors import InputError, check_epsilon, check_integer
from rpwjax.io.atomic import atomic_path
from rpwjax.keys import Secret
from rpwjax.pipelines import PIPELINES
from rpwjax.pipelines.two_stage import TwoStageRun, train_runs
from rpwjax.posterior import debias, posterior_mean
from rpwjax.release_path import release_grid
from rpwjax.training import target_scale, test_mse_many, train_many

PAPER_EPSILONS = (0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 4.0, 8.0)
NON_PRIVATE = "non-private"
COLUMNS = ("dataset", "mechanism", "prior", "config", "epsilon", "seed", "test_mse", "label_mse", "fit_seconds",
           "sample_seconds", "split_seed")
# split_seed: the seed of the train/test split the row was scored on (rpwjax curves --split-seed; CSVs written
# before the column existed were all scored on split 0)
# mechanism options used by sweeps (documented in the README)
SWEEP_OPTIONS = {"rpwithprior": {"zeta": "auto"}, "gaussian": {"delta": 1e-5, "calibration": "analytic"}}
CONFIGS = ("default", "paper")
# config "paper": RPWithPrior as the authors' released code runs it, per data set: a fixed ζ (reduced to
# (A2 - A1)/2 when the chosen interval is narrower), the paper's interval objective, and ε₁ for the private
# histogram (a number, or a fraction of ε)
PAPER_CONFIG = {
    "california": {"zeta": 0.7, "prior_epsilon": 0.017},
    "crime": {"zeta": 0.4, "prior_fraction": 1.0 / 3.0},
}
DEBIAS = "debias"  # SweepConfig.denoise entry: rows "rpwithprior+debias" (the default fit's release, debiased)


MAX_SEED = 2**31 - 1  # the largest seed of a model (a JAX key from an int32)


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    mechanisms: tuple[str, ...] = tuple(api.MECHANISMS)
    epsilons: tuple[float, ...] = PAPER_EPSILONS
    seeds: int = 3
    first_seed: int = 0  # seeds first_seed .. first_seed + seeds - 1 (fresh ones: an independent replicate)
    epochs: int = 50
    prior: str = "private"
    prior_epsilon: float | None = None
    bins: int = api.DEFAULT_BINS
    max_models: int = 360
    include_floor: bool = True  # also train the non-private MLP on the true labels
    denoise: tuple[str, ...] = ()  # mechanisms also evaluated after posterior denoising ("NAME+posterior"), or DEBIAS
    variants: tuple[str, ...] = ()  # beyond-the-paper pipelines (see VARIANTS)
    configs: tuple[str, ...] = ("default",)  # "paper": RPWithPrior as in PAPER_CONFIG (rows with config "paper")

    def validate(self):
        # a value given twice would write its rows twice, and the summaries would count the copies as seeds
        for flag, values in (("--mechanisms", self.mechanisms), ("--epsilon", self.epsilons),
                             ("--variants", self.variants), ("--denoise", self.denoise), ("--config", self.configs)):
            seen = [v for i, v in enumerate(values) if v in values[:i]]
            if seen:
                raise InputError(f"{flag} names {seen[0]!r} twice: give each value once")
        if self.prior != "private" and self.prior_epsilon is not None:
            raise InputError(f"--prior-epsilon {self.prior_epsilon} does nothing under --prior {self.prior}: no "
                             "private histogram is drawn")
        for m in self.mechanisms:
            if m not in api.MECHANISMS:
                raise InputError(f"mechanism must be one of {', '.join(api.MECHANISMS)}, got mechanism={m!r}")
        check_epsilon(np.asarray(self.epsilons, np.float64), "--epsilon")
        for name in ("seeds", "epochs", "max_models", "bins"):
            check_integer(getattr(self, name), name, flag=None if name == "max_models" else f"--{name}")
        # the models' seeds first_seed .. first_seed + seeds - 1 seed JAX keys: int32
        check_integer(self.first_seed, "first_seed", 0, MAX_SEED + 1 - int(self.seeds), flag="--first-seed")
        for v in self.variants:
            if v not in VARIANTS:
                raise InputError(f"variant must be one of {', '.join(VARIANTS)}, got variant={v!r}")
        if self.prior not in api.PRIORS:
            raise InputError(f"prior must be one of {', '.join(api.PRIORS)}, got prior={self.prior!r}")
        for d in self.denoise:
            if d not in api.MECHANISMS and d != DEBIAS:
                raise InputError(f"denoise must name mechanisms or {DEBIAS!r}, got denoise={d!r}")
        for c in self.configs:
            if c not in CONFIGS:
                raise InputError(f"config must be one of {', '.join(CONFIGS)}, got config={c!r}")
        if "default" not in self.configs and set(self.mechanisms) - {"rpwithprior"}:
            raise InputError("config 'paper' is defined for rpwithprior only: run the other mechanisms under "
                             "config 'default' too, or give --mechanisms rpwithprior")
        return self

    def seed_range(self) -> range:
        """The sweep's seeds: ``first_seed`` .. ``first_seed + seeds - 1``."""
        return range(int(self.first_seed), int(self.first_seed) + int(self.seeds))

    def fit_settings(self, dataset: str, mechanism: str, config: str, eps: np.ndarray) -> dict:
        """Keyword arguments of :func:`rpwjax.api.fit` for one mechanism under one config."""
        settings = dict(prior=self.prior, prior_epsilon=self.prior_epsilon, bins=self.bins,
                        **SWEEP_OPTIONS.get(mechanism, {}))
        if config == "paper":
            if dataset not in PAPER_CONFIG:
                raise InputError(f"config 'paper' is defined for the data sets {', '.join(PAPER_CONFIG)}, "
                                 f"got {dataset!r}")
            paper = PAPER_CONFIG[dataset]
            settings.update(zeta=paper["zeta"], objective="inside", shrink_zeta=True)
            if self.prior == "private":
                settings["prior_epsilon"] = paper.get("prior_epsilon", paper.get("prior_fraction", 0.0) * eps)
        return settings

    def mechanism_configs(self, mechanism: str) -> tuple[str, ...]:
        """The configs a mechanism runs under ("paper" is RPWithPrior's only)."""
        return tuple(c for c in self.configs if c == "default" or mechanism == "rpwithprior")


# beyond-the-paper pipelines: the registry's names (rpwjax.pipelines.PIPELINES)
VARIANTS = PIPELINES


def _variant_jobs(split: Split, config: SweepConfig, name: str, eps: np.ndarray, bar=None) -> list[tuple]:
    """(name, ε, seed, labels, label mse, seconds per label set, 0) for every ε and seed of a variant."""
    y = split.y_train
    jobs = []
    row = PIPELINES[name]
    for seed in config.seed_range():
        start = time.perf_counter()
        secret = Secret.from_seed(30_000 + seed)
        if row.kind == "two-stage":
            cfg = row.two_stage_config(config.bins, split.scaled_targets)
            runs = [TwoStageRun(y, split.lo, split.hi, e, secret, cfg) for e in eps]
            # every run of this seed shares the A/B split, so their stage models train together
            runs = train_runs(runs, split.x_train, epochs=config.epochs, model_seed=40_000 + 10 * seed,
                              split_seed=50_000 + 10 * seed)
            labels = [run.labels for run in runs]
        else:
            labels = [row.run(split.x_train, y, split.lo, split.hi, e, secret=secret, bins=config.bins,
                              scale_targets=split.scaled_targets)[0] for e in eps]
        seconds = (time.perf_counter() - start) / eps.size
        for e, lab in zip(eps, labels):
            jobs.append((name, float(e), seed, np.asarray(lab, np.float64), float(np.mean((lab - y) ** 2)), seconds,
                         0.0))
        # a pipeline's releases are compiled for its rows' own ranges and shapes, so a seed's compiled code is
        # rarely used again: dropping it keeps a long sweep's memory (and mapped code) flat
        jax.clear_caches()
        if bar is not None:
            bar.update(1)
    return jobs


def _mechanism_index(name: str) -> int:
    return list(api.MECHANISMS).index(name)


def privatize_grid(fit: api.FitResult, seed: int, mechanism: str, labels) -> np.ndarray:
    """Released copies of ``labels`` for every ε of ``fit`` through the release path: (E, n) float64.

    The secret is expanded from (seed, mechanism) (experiments only: public, reproducible seeds), and
    each ε is released with its own key derived from the ε value.
    """
    return release_grid(fit.params, Secret.from_seed(seed).child("sweep", _mechanism_index(mechanism)), labels)


def run_sweep(split: Split, config: SweepConfig, *, progress: bool = True) -> list[dict]:
    """All cells of the sweep as tidy rows (see :data:`COLUMNS`), non-private floor included."""
    config.validate()
    eps = np.asarray(config.epsilons, np.float64)
    y = split.y_train
    jobs = []  # (mechanism, epsilon, seed, noisy labels, label mse, fit s, sample s, config)
    runs = [(mech, c) for mech in config.mechanisms for c in config.mechanism_configs(mech)]
    if DEBIAS in config.denoise:
        runs.append((DEBIAS, "default"))
    fits_per_run = config.seeds if config.prior == "private" else 1
    total_fits = len(runs) * fits_per_run + len(config.variants) * config.seeds
    with tqdm(total=total_fits, desc=f"{split.name}: fit+privatize", disable=not progress, unit="fit") as bar:
        for mech, cfg in runs:
            settings = config.fit_settings(split.name, "rpwithprior" if mech == DEBIAS else mech, cfg, eps)
            # DEBIAS: the default RPWithPrior fit, its released labels debiased: (ỹ - b)/a (post-processing of the
            # same release as the plain rows of this seed, so the two rows are a paired comparison)
            fit = None
            for seed in config.seed_range():
                if fit is None or config.prior == "private":
                    start = time.perf_counter()
                    try:
                        fit = api.fit("rpwithprior" if mech == DEBIAS else mech, y, range=(split.lo, split.hi),
                                      epsilon=eps, seed=10_000 + seed, **settings)
                    except InputError as err:  # name the sweep's ε, not only the mechanism's share of it
                        raise InputError(
                            f"{mech} on {split.name} at --epsilon {' '.join(f'{e:g}' for e in eps)} (with "
                            f"--prior private the mechanism gets each ε less its prior's share): {err}") from None
                    fit_seconds = (time.perf_counter() - start) / eps.size
                    bar.update(1)
                start = time.perf_counter()
                noisy = privatize_grid(fit, seed, "rpwithprior" if mech == DEBIAS else mech, y)
                name = mech
                if mech == DEBIAS:
                    noisy, name = debias(fit.params, noisy), f"rpwithprior+{DEBIAS}"
                sample_seconds = (time.perf_counter() - start) / eps.size
                label_mse = np.mean((noisy.astype(np.float64) - y) ** 2, axis=1)
                for i, e in enumerate(eps):
                    jobs.append((name, float(e), seed, noisy[i], float(label_mse[i]), fit_seconds, sample_seconds, cfg))
                if mech in config.denoise and mech != DEBIAS and cfg == "default":
                    if fit.prior_used is None or fit.prior_used.kind == "none":
                        # a prior-free mechanism: the denoised rows pay for their own prior (ε₁) like the others
                        fit = api.fit(mech, y, range=(split.lo, split.hi), epsilon=eps, seed=10_000 + seed,
                                      spend_prior=True, **settings)
                        noisy = privatize_grid(fit, seed, mech, y)
                    for i, e in enumerate(eps):
                        start = time.perf_counter()
                        clean = posterior_mean(fit.params[i], fit.prior_for(i), noisy[i]).astype(np.float32)
                        seconds = sample_seconds + time.perf_counter() - start
                        mse_i = float(np.mean((clean.astype(np.float64) - y) ** 2))
                        jobs.append((f"{mech}+posterior", float(e), seed, clean, mse_i, fit_seconds, seconds, cfg))
        for name in config.variants:
            jobs.extend(job + ("default",) for job in _variant_jobs(split, config, name, eps, bar))
    # the floor: the same network on the true labels
    for seed in config.seed_range() if config.include_floor else ():
        jobs.append((NON_PRIVATE, math.inf, seed, np.asarray(y, np.float64), 0.0, 0.0, 0.0, "default"))

    rows = []
    slices = range(0, len(jobs), config.max_models)
    with tqdm(total=len(slices) * config.epochs, desc=f"{split.name}: train {len(jobs)} models",
              disable=not progress, unit="epoch") as bar:
        for lo in slices:
            part = jobs[lo : lo + config.max_models]
            targets = np.stack([j[3] for j in part]).astype(np.float64)
            seeds = np.array([j[2] for j in part])
            # a user's table: the networks learn labels mapped from the public range onto [0, 1] (affine,
            # public), and the test MSE is mapped back to the labels' units, exactly (a factor width²)
            lo, width = target_scale((split.lo, split.hi) if split.scaled_targets else None)
            params = train_many(split.x_train, (targets - lo) / width, seeds, epochs=config.epochs,
                                on_epoch=lambda: bar.update(1))
            mse = test_mse_many(params, split.x_test, (split.y_test - lo) / width) * width ** 2
            for job, m in zip(part, mse):
                rows.append(dict(zip(COLUMNS, (split.name, job[0], config.prior, job[7], job[1], job[2], float(m),
                                               job[4], job[5], job[6], int(split.split_seed)))))
    return rows


def _setting(row: dict) -> tuple[str, str]:
    """(prior, config) of a row; rows written before those columns existed are the private-prior default."""
    return row.get("prior") or "private", row.get("config") or "default"


def split_of(row: dict) -> int:
    """The train/test split seed of a row or summary cell; rows written before the column existed are split 0."""
    return int(row.get("split_seed") or 0)


def summarize(rows: list[dict]) -> list[dict]:
    """Mean and std over seeds of test and label MSE, per (dataset, split seed, prior, config, mechanism, ε).

    Rows that differ in the train/test split, the prior setting or the config are never averaged together.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], split_of(r), *_setting(r), r["mechanism"], r["epsilon"]), []).append(r)
    out = []
    for (dataset, split, prior, cfg, mech, eps), rs in sorted(groups.items(), key=lambda kv: kv[0]):
        t = np.array([r["test_mse"] for r in rs])
        lm = np.array([r["label_mse"] for r in rs])
        out.append({
            "dataset": dataset, "split_seed": split, "prior": prior, "config": cfg, "mechanism": mech, "epsilon": eps,
            "seeds": len(rs),
            "test_mse_mean": float(t.mean()), "test_mse_std": float(t.std(ddof=1)) if len(rs) > 1 else 0.0,
            "test_mse_min": float(t.min()), "test_mse_max": float(t.max()),
            "label_mse_mean": float(lm.mean()),
        })
    return out


def series_name(s: dict) -> str:
    """The name of a summary cell's series in tables and plots: the mechanism, with its config unless default."""
    cfg = s.get("config") or "default"
    return s["mechanism"] if cfg == "default" else f"{s['mechanism']} [{cfg}]"


def settings_of(summary: list[dict], dataset: str) -> list[str]:
    """The prior settings present for a data set (one table or plot each)."""
    return sorted({s.get("prior") or "private" for s in summary if s["dataset"] == dataset})


def splits_of(summary: list[dict], dataset: str) -> list[int]:
    """The train/test split seeds present for a data set (one table or plot each)."""
    return sorted({split_of(s) for s in summary if s["dataset"] == dataset})


def mechanism_order(names) -> list[str]:
    """Registry order (RPWithPrior first), variants such as ``NAME+posterior`` or ``NAME [paper]`` after their
    mechanism."""
    registry = list(api.MECHANISMS)

    def rank(name):
        base = name.split(" ")[0].split("+")[0]
        return (registry.index(base) if base in registry else len(registry), name)

    return sorted(dict.fromkeys(names), key=rank)


def mechanism_label(name: str) -> str:
    """Legend/table name; the Gaussian is only (ε, δ)-DP and says so."""
    if name == "gaussian":
        return f"gaussian ((ε,δ)-DP, δ={SWEEP_OPTIONS['gaussian']['delta']:g})"
    return name


def format_table(summary: list[dict]) -> str:
    """A plain-text table per (data set, train/test split seed, prior setting): rows = ε, columns = mechanisms
    (a config other than the default in brackets), cells = mean ± std test MSE; best per row marked *. Each
    table's header names the split seed its rows were scored on."""
    lines = []
    for dataset, split, prior in ((d, k, p) for d in sorted({s["dataset"] for s in summary})
                                  for k in splits_of(summary, d) for p in settings_of(summary, d)):
        sub = [s for s in summary if s["dataset"] == dataset and (s.get("prior") or "private") == prior
               and split_of(s) == split]
        if not sub:
            continue
        floor = [s for s in sub if s["mechanism"] == NON_PRIVATE]
        mechs = mechanism_order(series_name(s) for s in sub if s["mechanism"] != NON_PRIVATE)
        epsilons = sorted({s["epsilon"] for s in sub if s["mechanism"] != NON_PRIVATE})
        lines.append(f"{dataset} ({prior} prior): test MSE (mean ± std over seeds) on split seed {split}; "
                     "* = best at that ε")
        if floor:
            lines.append(f"  non-private floor: {floor[0]['test_mse_mean']:.4g} ± {floor[0]['test_mse_std']:.2g}")
        header = ["epsilon"] + [mechanism_label(m) for m in mechs]
        table = [header]
        for e in epsilons:
            cells = {series_name(s): s for s in sub if s["epsilon"] == e}
            best = min((cells[m]["test_mse_mean"] for m in mechs if m in cells), default=None)
            row = [f"{e:g}"]
            for m in mechs:
                c = cells.get(m)
                if c is None:
                    row.append("-")
                    continue
                mark = "*" if c["test_mse_mean"] == best else " "
                row.append(f"{c['test_mse_mean']:.4g} ± {c['test_mse_std']:.2g}{mark}")
            table.append(row)
        widths = [max(len(r[i]) for r in table) for i in range(len(header))]
        for r in table:
            lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)))
        lines.append("")
    return "\n".join(lines)


def target_table(summary: list[dict], *, max_epsilon: float = 2.0) -> list[dict]:
    """Per data set, train/test split seed, prior setting and ε <= ``max_epsilon``: the best of the six mechanisms
    (any config) against the best rpwjax variant (any other row: ``NAME+posterior``, the two-stage pipelines,
    ...), with the margin."""
    out = []
    for dataset, split, prior in ((d, k, p) for d in sorted({s["dataset"] for s in summary})
                                  for k in splits_of(summary, d) for p in settings_of(summary, d)):
        sub = [s for s in summary if s["dataset"] == dataset and s["mechanism"] != NON_PRIVATE
               and (s.get("prior") or "private") == prior and split_of(s) == split]
        for e in sorted({s["epsilon"] for s in sub}):
            if e > max_epsilon:
                continue
            cells = [s for s in sub if s["epsilon"] == e]
            base = [s for s in cells if s["mechanism"] in api.MECHANISMS]
            ours = [s for s in cells if s["mechanism"] not in api.MECHANISMS]
            if not base or not ours:
                continue
            b = min(base, key=lambda s: s["test_mse_mean"])
            v = min(ours, key=lambda s: s["test_mse_mean"])
            out.append({
                "dataset": dataset, "split_seed": split, "prior": prior, "epsilon": e,
                "baseline": series_name(b), "baseline_mse": b["test_mse_mean"], "baseline_std": b["test_mse_std"],
                "variant": series_name(v), "variant_mse": v["test_mse_mean"], "variant_std": v["test_mse_std"],
                "margin": (b["test_mse_mean"] - v["test_mse_mean"]) / b["test_mse_mean"],
                "met": v["test_mse_mean"] < b["test_mse_mean"],
            })
    return out


def format_target_table(table: list[dict]) -> str:
    """Markdown: one row per (data set, ε), margin = relative improvement of the best variant."""
    lines = ["| data set | ε | best of the six (paper setting) | best rpwjax variant | margin | met |",
             "|---|---|---|---|---|---|"]
    for t in table:
        where = t["dataset"] if t.get("prior", "private") == "private" else f"{t['dataset']} ({t['prior']} prior)"
        if split_of(t):  # split 0 (every committed sweep) unnamed, so the committed tables read as before
            where += f", split seed {split_of(t)}"
        lines.append(
            f"| {where} | {t['epsilon']:g} | {mechanism_label(t['baseline'])} {t['baseline_mse']:.4g} ± "
            f"{t['baseline_std']:.2g} | {t['variant']} {t['variant_mse']:.4g} ± {t['variant_std']:.2g} | "
            f"{100 * t['margin']:+.1f}% | {'yes' if t['met'] else '**no**'} |")
    return "\n".join(lines)


def write_rows(rows: list[dict], path) -> None:
    """Tidy results as CSV (atomic); a row read from a CSV older than the split_seed column is written as split 0."""
    with atomic_path(path) as tmp:
        write_rows_at(rows, tmp)


def write_rows_at(rows: list[dict], path) -> None:
    """Tidy results as CSV, straight to ``path`` (a temporary path of :func:`rpwjax.io.atomic.atomic_outputs`)."""
    table = pa.table({c: [split_of(r) if c == "split_seed" else r[c] for r in rows] for c in COLUMNS})
    pacsv.write_csv(table, path)


def read_rows(path) -> list[dict]:
    return pacsv.read_csv(path).to_pylist()
