r"""Runtime benchmarks: ``rpwjax bench [--quick] --out DIR``.

One table of cases serves both runners: this module's own timing loop (the
``rpwjax bench`` command, which writes ``DIR/results.json`` and plots) and the
pytest-benchmark suite in ``benchmarks/`` (which wraps the same cases with the
``benchmark`` fixture). A case is a :class:`Member` of a :class:`Group`; a
group is one (family, size) point, and its members are timed *interleaved*
(repeat r of every member, then repeat r + 1, ...) so that a case and its
baseline see the same machine state. Every ratio is ``median(case) /
median(baseline)`` from the same group of the same run.

Families and what they measure (sizes per plan in :data:`PLANS`):

* ``sampling`` (size: labels n): the release path
  (:func:`rpwjax.release_path.release`: float64, grid, clamp, hash-derived block
  keys, host array in and out) for every registered mechanism, against the
  floor ``jax.random.uniform`` of n float64 values on the device (a one-draw
  sampler cannot beat it).
* ``search-labels`` (size: labels): the exact interval search
  (``fit_rpwithprior`` with a fixed ζ, one ε) on an empirical prior of
  continuous labels (every label distinct) and of Criteo-shaped zero-inflated
  labels.
* ``search-histogram`` (size: bins k): the same search on a k-bin histogram
  prior, both objectives, next to the paper's O(k³) loop
  (:mod:`rpwjax.mechanisms.reference_algorithm1`) on the ``"inside"`` objective.
* ``search-epsilons`` (size: number of ε): the fixed-ζ fit vmapped over an ε
  grid, on one large continuous prior.
* ``fit-support`` (size: support points k): ``fit_rr_on_bins`` and
  ``fit_unbiased`` (whole public fit, one ε).
* ``privatize`` (size: rows): ``privatize_file`` (RPWithPrior, Parquet in and
  out, no progress bar) against a plain pyarrow copy of the same file
  (``ParquetFile.iter_batches`` + ``ParquetWriter``, same chunk size).

Timing: a warm-up call (compiles; reported as ``warmup_s``), a calibration
call that sets how many calls make one sample (at least ``min_sample_s``),
then ``repeats`` samples; the median is reported. Every timed call ends in
``block_until_ready`` (or returns host data). Numbers are wall-clock seconds
(``time.perf_counter``) on whatever backend JAX runs on, recorded with the
machine's load average: on a busy machine they are upper bounds.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

SCHEMA_VERSION = 1
SEARCH_EPSILON = 1.0  # ε of the single-ε search and fit cases
SLOW_CALL_S = 10.0  # a warm-up longer than this also serves as the calibration call
SEARCH_ZETA_FRACTION = 0.02  # ζ of the search cases, as a fraction of hi - lo
SAMPLER_SUPPORT = 64  # support points of the prior the samplers are fitted to
CONTINUOUS_RANGE = (0.0, 5.0)  # 5·Beta(2, 5): every label distinct, like house prices
CRITEO_RANGE = (0.0, 400.0)
HISTOGRAM_SOURCE_LABELS = 1_000_000  # Criteo-shaped labels binned into the histogram priors


# --------------------------------------------------------------------------- plans


@dataclasses.dataclass(frozen=True)
class Plan:
    """Sizes and repeats of one benchmark run."""

    name: str
    sampling_n: tuple[int, ...]
    search_labels: tuple[int, ...]
    search_bins: tuple[int, ...]
    reference_max_bins: int
    epsilon_grid_sizes: tuple[int, ...]
    epsilon_grid_prior: int
    fit_support: dict  # mechanism -> support sizes
    privatize_rows: tuple[int, ...]
    repeats: int
    slow_repeats: int  # for members whose single call takes seconds (reference, privatize)
    min_sample_s: float
    max_member_s: float  # repeats are cut (to no fewer than 3) when a case would take longer


PLANS = {
    "full": Plan(
        name="full",
        sampling_n=(10**4, 10**5, 10**6, 10**7),
        search_labels=(10**3, 10**4, 10**5, 10**6, 1_300_000),
        search_bins=(16, 32, 64, 128, 256, 1024, 4096),
        reference_max_bins=256,
        epsilon_grid_sizes=(1, 3, 10, 30),
        epsilon_grid_prior=1_300_000,
        fit_support={"rr-on-bins": (16, 64, 128, 256, 401, 1024), "unbiased": (16, 32, 64, 128, 256, 401)},
        privatize_rows=(10**6, 10**7),
        repeats=7,
        slow_repeats=5,
        min_sample_s=0.02,
        max_member_s=30.0,
    ),
    "quick": Plan(
        name="quick",
        sampling_n=(10**4, 10**5, 10**6, 10**7),
        search_labels=(10**3, 10**5, 1_300_000),
        search_bins=(16, 64, 256),
        reference_max_bins=256,
        epsilon_grid_sizes=(1, 10),
        epsilon_grid_prior=1_300_000,
        fit_support={"rr-on-bins": (16, 64, 401), "unbiased": (16, 64)},
        privatize_rows=(10**6,),
        repeats=3,
        slow_repeats=2,
        min_sample_s=0.01,
        max_member_s=10.0,
    ),
    # for the smoke test of the runner only: every family and mechanism, tiny sizes
    "tiny": Plan(
        name="tiny",
        sampling_n=(1000,),
        search_labels=(200,),
        search_bins=(8,),
        reference_max_bins=8,
        epsilon_grid_sizes=(2,),
        epsilon_grid_prior=200,
        fit_support={"rr-on-bins": (8,), "unbiased": (8,)},
        privatize_rows=(5000,),
        repeats=2,
        slow_repeats=2,
        min_sample_s=0.0,
        max_member_s=10.0,
    ),
}

# Targets of the project's issue. "metric" is read from the case at "size";
# "speedup" is 1 / ratio. "prior_labels" (ε-grid family) must match the plan.
TARGETS = (
    dict(name="rpwithprior_release_vs_uniform_floor", family="sampling", case="release/rpwithprior",
         size=10**7, metric="ratio", op="<=", threshold=2.0,
         description="RPWithPrior release of 1e7 float64 labels / jax.random.uniform of 1e7 float64"),
    dict(name="interval_search_per_epsilon_continuous", family="search-labels", case="search/continuous",
         size=1_300_000, metric="median_s", op="<=", threshold=0.3,
         description="exact interval search, 1.3e6-label empirical prior (all distinct), one ε, seconds"),
    dict(name="interval_search_per_epsilon_criteo", family="search-labels", case="search/criteo",
         size=1_300_000, metric="median_s", op="<=", threshold=0.3,
         description="exact interval search, 1.3e6 Criteo-shaped labels (zero-inflated), one ε, seconds"),
    dict(name="vmapped_fit_10_epsilons", family="search-epsilons", case="search/vmapped",
         size=10, metric="median_s", op="<=", threshold=1.0, prior_labels=1_300_000,
         description="fixed-ζ fit vmapped over 10 ε on a 1.3e6-label empirical prior, seconds"),
    dict(name="speedup_vs_algorithm1_k256", family="search-histogram", case="search/histogram-inside",
         size=256, metric="speedup", op=">=", threshold=100.0,
         description="O(k³) reference time / exact search time, 256-bin histogram, objective 'inside'"),
    dict(name="rr_on_bins_fit_k401", family="fit-support", case="fit/rr-on-bins",
         size=401, metric="median_s", op="<=", threshold=1.0,
         description="fit_rr_on_bins on 401 support points, one ε, seconds"),
    dict(name="unbiased_fit_k401", family="fit-support", case="fit/unbiased",
         size=401, metric="median_s", op="<=", threshold=10.0,
         description="fit_unbiased on 401 support points, one ε, seconds"),
    dict(name="privatize_vs_pyarrow_copy", family="privatize", case="privatize/rpwithprior",
         size=10**7, metric="ratio", op="<=", threshold=3.0,
         description="privatize_file on a 1e7-row Parquet file / plain pyarrow read-and-write of it"),
)


# --------------------------------------------------------------------------- cases


@dataclasses.dataclass
class Member:
    """One timed case. ``setup()`` builds inputs and returns the zero-argument callable to time."""

    family: str
    name: str
    size: int
    size_unit: str
    setup: Callable[[], Callable[[], Any]]
    baseline: str | None = None  # name of another member of the same group
    slow: bool = False
    meta: dict = dataclasses.field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.family}:{self.name}:{self.size}"


@dataclasses.dataclass
class Group:
    family: str
    size: int
    members: list


def _block(tree):
    import jax

    return jax.block_until_ready(tree)


# data builders: cached (the runner clears them between groups)


@functools.lru_cache(maxsize=None)
def continuous_labels(n: int, seed: int = 0) -> np.ndarray:
    """``5·Beta(2, 5)`` float64 labels: every value distinct (with probability one)."""
    rng = np.random.default_rng(seed)
    lo, hi = CONTINUOUS_RANGE
    return lo + (hi - lo) * rng.beta(2.0, 5.0, int(n))


@functools.lru_cache(maxsize=None)
def criteo_labels(n: int, seed: int = 0) -> np.ndarray:
    """Criteo-shaped labels on [0, 400]: 9.7% zeros, the rest continuous (see rpwjax.experiments.datasets)."""
    from rpwjax.experiments.datasets import criteo_synthetic_labels

    return criteo_synthetic_labels(int(n), seed)


@functools.lru_cache(maxsize=None)
def empirical(kind: str, n: int):
    from rpwjax.priors import empirical_prior

    if kind == "continuous":
        return empirical_prior(continuous_labels(n), *CONTINUOUS_RANGE)
    return empirical_prior(criteo_labels(n), *CRITEO_RANGE)


@functools.lru_cache(maxsize=None)
def histogram(k: int):
    """A k-bin equal-width histogram prior of Criteo-shaped labels over [0, 400]."""
    from rpwjax.priors import histogram_prior

    edges = np.linspace(*CRITEO_RANGE, int(k) + 1)
    counts, _ = np.histogram(criteo_labels(HISTOGRAM_SOURCE_LABELS), bins=edges)
    return histogram_prior(edges, counts.astype(np.float64))


@functools.lru_cache(maxsize=None)
def support_prior(k: int):
    """k equally spaced support points on [0, 400] (k = 401: the integers) weighted like Criteo labels."""
    from rpwjax.priors import empirical_prior

    lo, hi = CRITEO_RANGE
    points = np.linspace(lo, hi, int(k))
    edges = np.concatenate([[lo], 0.5 * (points[1:] + points[:-1]), [hi]])
    counts, _ = np.histogram(criteo_labels(100_000, seed=1), bins=edges)
    return empirical_prior(points, lo, hi, weights=counts + 1.0)  # every point keeps some mass


def clear_caches(everything: bool = True):
    """Drop cached inputs (between groups: the large ones; the fitted sampler parameters are small)."""
    for fn in (continuous_labels, criteo_labels, empirical, histogram, support_prior, sampling_labels):
        fn.cache_clear()
    if everything:
        _sampler_params.cache_clear()
        _privatize_params.cache_clear()


@functools.lru_cache(maxsize=None)
def sampling_labels(n: int, seed: int = 0) -> np.ndarray:
    """Criteo-shaped float64 labels in host memory (what a release is given)."""
    rng = np.random.default_rng(seed)
    zero = rng.random(int(n)) < 0.097
    amount = np.exp(4.2 + rng.standard_normal(int(n)))
    return np.where(zero, 0.0, np.minimum(amount, 400.0))


@functools.lru_cache(maxsize=None)
def _sampler_params(mechanism: str):
    """Parameters (ε = 1) of ``mechanism`` fitted to a small Criteo-shaped prior (float64)."""
    from rpwjax.api import _entry

    prior = support_prior(SAMPLER_SUPPORT)
    # a fixed ζ skips the auto-ζ search: the sampler's cost does not depend on ζ
    options = {"zeta": SEARCH_ZETA_FRACTION * (prior.hi - prior.lo)} if mechanism == "rpwithprior" else {}
    params, _ = _entry(mechanism)[0](prior, SEARCH_EPSILON, **options)
    return params


def sampler_thunk(mechanism: str, n: int):
    """Timed call: the release path for ``mechanism`` on n float64 labels (compiled after one call)."""
    from rpwjax.keys import Secret
    from rpwjax.release_path import release

    params = _sampler_params(mechanism)
    y = sampling_labels(n)
    secret = Secret.from_seed(1)
    return lambda: release(params, secret, y)


def uniform_thunk(n: int):
    """The floor: ``jax.random.uniform`` of n float64 values (x64 on, result on the device)."""
    import jax
    import jax.numpy as jnp

    def call():
        with jax.enable_x64(True):
            return fn(key).block_until_ready()

    with jax.enable_x64(True):
        key = jax.random.key(1)
        fn = jax.jit(lambda k: jax.random.uniform(k, (int(n),), jnp.float64))
    return call


def search_thunk(prior, epsilons, objective: str = "neighborhood"):
    """Timed call: the exact interval search for a fixed ζ over ``epsilons`` (one vmapped fit).

    Goes through the public ``fit_rpwithprior(prior, epsilons, zeta=ζ)``: with ζ
    fixed it is the interval search alone (no ζ search), from a host prior to
    host parameters, as a user calls it.
    """
    from rpwjax.mechanisms.rpwithprior import fit_rpwithprior

    zeta = SEARCH_ZETA_FRACTION * (prior.hi - prior.lo)
    eps = np.atleast_1d(np.asarray(epsilons, np.float64))
    return lambda: fit_rpwithprior(prior, eps, zeta=zeta, objective=objective)


def load_reference():
    """The NumPy O(k³) reference (:func:`rpwjax.mechanisms.reference_algorithm1.algorithm1_interval`)."""
    from rpwjax.mechanisms.reference_algorithm1 import algorithm1_interval

    return algorithm1_interval


def reference_thunk(k: int):
    algorithm1 = load_reference()
    prior = histogram(k)
    edges = np.concatenate([np.asarray(prior.left), np.asarray(prior.right)[-1:]])
    zeta = SEARCH_ZETA_FRACTION * (prior.hi - prior.lo)
    mass = np.asarray(prior.mass)
    return lambda: algorithm1(edges, mass, SEARCH_EPSILON, zeta)


def fit_thunk(mechanism: str, k: int):
    """Timed call: the mechanism's public fit on a k-point support (one ε, host results)."""
    from rpwjax.api import _entry

    fit_fn = _entry(mechanism)[0]
    prior = support_prior(k)
    return lambda: fit_fn(prior, SEARCH_EPSILON)


# privatize: a cached Parquet file, privatize_file against a plain pyarrow copy

PRIVATIZE_LABEL = "SalesAmountInEuro"
PRIVATIZE_FILE_VERSION = 1
PRIVATIZE_CHUNK_ROWS = 1 << 20  # privatize.DEFAULT_CHUNK_ROWS, the CLI's default; both sides use it


def default_cache_dir() -> Path:
    env = os.environ.get("RPWJAX_BENCH_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rpwjax" / "bench"


def parquet_file(rows: int, cache_dir) -> Path:
    """A ``rows``-row Parquet file (row id, 3 float32 features, an int32 category, the label), made once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rpwjax.experiments.datasets import criteo_synthetic_labels

    cache_dir = Path(cache_dir)
    path = cache_dir / f"privatize-{int(rows)}-v{PRIVATIZE_FILE_VERSION}.parquet"
    if path.is_file():
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.part")
    chunk = 1 << 20
    writer = None
    try:
        for i, start in enumerate(range(0, int(rows), chunk)):
            m = min(chunk, int(rows) - start)
            rng = np.random.default_rng([20261130, i])
            table = pa.table(
                {
                    "row_id": pa.array(np.arange(start, start + m, dtype=np.int64)),
                    "f0": pa.array(rng.standard_normal(m, dtype=np.float32)),
                    "f1": pa.array(rng.standard_normal(m, dtype=np.float32)),
                    "f2": pa.array(rng.standard_normal(m, dtype=np.float32)),
                    "category": pa.array(rng.integers(0, 1000, m, dtype=np.int32)),
                    PRIVATIZE_LABEL: pa.array(criteo_synthetic_labels(m, seed=1000 + i)),
                }
            )
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
        writer.close()
        writer = None
        os.replace(tmp, path)
    finally:
        if writer is not None:
            writer.close()
        if tmp.exists():
            tmp.unlink()
    return path


def pyarrow_copy(src, dst, chunk_rows: int) -> int:
    """The baseline: read ``src`` in batches and write them unchanged to ``dst``."""
    import pyarrow.parquet as pq

    rows = 0
    writer = None
    try:
        for batch in pq.ParquetFile(src).iter_batches(batch_size=chunk_rows):
            if writer is None:
                writer = pq.ParquetWriter(dst, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    return rows


@functools.lru_cache(maxsize=None)
def _privatize_params(rows: int, cache_dir: str):
    import pyarrow.parquet as pq

    from rpwjax.api import fit

    path = parquet_file(rows, cache_dir)
    first = next(pq.ParquetFile(path).iter_batches(batch_size=100_000, columns=[PRIVATIZE_LABEL]))
    labels = first.column(0).to_numpy()
    zeta = SEARCH_ZETA_FRACTION * (CRITEO_RANGE[1] - CRITEO_RANGE[0])
    result = fit("rpwithprior", labels, range=CRITEO_RANGE, epsilon=SEARCH_EPSILON, zeta=zeta, prior="private", seed=0)
    return result.params, result.records()[0]


def privatize_thunk(rows: int, cache_dir):
    from rpwjax.keys import Secret
    from rpwjax.privatize import privatize_file

    src = parquet_file(rows, cache_dir)
    params, record = _privatize_params(int(rows), str(cache_dir))
    dst = Path(cache_dir) / f"out-privatize-{os.getpid()}.parquet"
    secret = Secret.from_seed(7)

    def call():
        return privatize_file(
            src, dst, label_column=PRIVATIZE_LABEL, params=params, secret=secret, record=record,
            chunk_rows=PRIVATIZE_CHUNK_ROWS, progress=False,
        )

    return call


def copy_thunk(rows: int, cache_dir):
    src = parquet_file(rows, cache_dir)
    dst = Path(cache_dir) / f"out-copy-{os.getpid()}.parquet"
    return lambda: pyarrow_copy(src, dst, PRIVATIZE_CHUNK_ROWS)


def cleanup_outputs(cache_dir):
    """Remove this process's privatize/copy outputs from the cache directory."""
    for pattern in (f"out-privatize-{os.getpid()}.parquet*", f"out-copy-{os.getpid()}.parquet"):
        for p in Path(cache_dir).glob(pattern):
            p.unlink()


def mechanism_names() -> tuple[str, ...]:
    """Every registered mechanism (a registered one whose module is missing fails its case, loudly)."""
    from rpwjax.api import MECHANISMS

    return tuple(MECHANISMS)


def build_groups(plan: Plan, cache_dir, families=None) -> list[Group]:
    """The case table of a plan: groups in run order (``families`` filters)."""
    cache_dir = Path(cache_dir)
    groups: list[Group] = []

    def add(family, size, members):
        if families is None or family in families:
            groups.append(Group(family, size, members))

    for n in plan.sampling_n:
        members = [Member("sampling", "uniform-floor", n, "labels", functools.partial(uniform_thunk, n))]
        for name in mechanism_names():
            members.append(
                Member("sampling", f"release/{name}", n, "labels", functools.partial(sampler_thunk, name, n),
                       baseline="uniform-floor", meta={"mechanism": name, "dtype": "float64"})
            )
        add("sampling", n, members)

    for n in plan.search_labels:
        add("search-labels", n, [
            Member("search-labels", f"search/{kind}", n, "labels",
                   functools.partial(lambda kind, n: search_thunk(empirical(kind, n), [SEARCH_EPSILON]), kind, n),
                   meta={"prior": kind, "epsilons": 1, "objective": "neighborhood"})
            for kind in ("continuous", "criteo")
        ])

    for k in plan.search_bins:
        members = [
            Member("search-histogram", f"search/histogram-{objective}", k, "bins",
                   functools.partial(lambda k, o: search_thunk(histogram(k), [SEARCH_EPSILON], o), k, objective),
                   baseline="reference/algorithm1" if objective == "inside" and k <= plan.reference_max_bins else None,
                   meta={"objective": objective, "epsilons": 1})
            for objective in ("neighborhood", "inside")
        ]
        if k <= plan.reference_max_bins:
            members.append(Member("search-histogram", "reference/algorithm1", k, "bins",
                                  functools.partial(reference_thunk, k), slow=True,
                                  meta={"objective": "inside", "implementation": "numpy O(k^3)"}))
        add("search-histogram", k, members)

    grid_prior = plan.epsilon_grid_prior
    for e in plan.epsilon_grid_sizes:
        epsilons = np.geomspace(0.05, 8.0, e) if e > 1 else np.array([SEARCH_EPSILON])
        add("search-epsilons", e, [
            Member("search-epsilons", "search/vmapped", e, "epsilons",
                   functools.partial(lambda eps: search_thunk(empirical("continuous", grid_prior), eps), epsilons),
                   meta={"prior_labels": grid_prior, "prior": "continuous"})
        ])

    sizes = sorted({k for ks in plan.fit_support.values() for k in ks})
    for k in sizes:
        add("fit-support", k, [
            Member("fit-support", f"fit/{name}", k, "support points", functools.partial(fit_thunk, name, k),
                   meta={"mechanism": name, "epsilons": 1})
            for name, ks in plan.fit_support.items() if k in ks
        ])

    chunk = {"chunk_rows": PRIVATIZE_CHUNK_ROWS, "format": "parquet"}
    for rows in plan.privatize_rows:
        add("privatize", rows, [
            Member("privatize", "pyarrow-copy", rows, "rows", functools.partial(copy_thunk, rows, cache_dir),
                   slow=True, meta=dict(chunk)),
            Member("privatize", "privatize/rpwithprior", rows, "rows",
                   functools.partial(privatize_thunk, rows, cache_dir), baseline="pyarrow-copy", slow=True,
                   meta={"mechanism": "rpwithprior", **chunk}),
        ])
    return groups


# --------------------------------------------------------------------------- timing


def calibrate(thunk, min_sample_s: float) -> tuple[float, int, float]:
    """Warm-up call (compiles; returned as warmup_s), then a second untimed call that sets the
    calls per sample: enough for ``min_sample_s`` (0: one call). Returns (warmup_s, calls, one call's s).

    A warm-up over :data:`SLOW_CALL_S` stands in for the second call (which would cost as much).
    """
    start = time.perf_counter()
    thunk()
    warmup = time.perf_counter() - start
    if min_sample_s <= 0 or warmup > SLOW_CALL_S:
        return warmup, 1, warmup
    start = time.perf_counter()
    thunk()
    once = time.perf_counter() - start
    return warmup, max(1, math.ceil(min_sample_s / max(once, 1e-9))), once


def time_group(group: Group, plan: Plan, repeats: int | None = None, progress=None) -> list[dict]:
    """Set up, warm up and time every member of ``group``, interleaved; one record per member."""
    records = []
    live = []
    for m in group.members:
        rec = _record(m)
        try:
            thunk = m.setup()
            rec["warmup_s"], number, rec["_once_s"] = calibrate(thunk, plan.min_sample_s)
            live.append((m, thunk, number, rec))
        except Exception as err:  # a broken case is reported, never silently dropped
            rec["error"] = f"{type(err).__name__}: {err}"
            if progress is not None:
                progress.update(1)
        records.append(rec)
    count = {}
    for m, _, number, rec in live:
        count[m.name] = repeats or (plan.slow_repeats if m.slow else plan.repeats)
        # a case whose calls take many seconds (a large LP fit) gets fewer repeats, never under 3
        once = rec.pop("_once_s")
        if repeats is None and count[m.name] * number * once > plan.max_member_s:
            count[m.name] = min(count[m.name], max(3, int(plan.max_member_s / (number * once))))
    for r in range(max(count.values(), default=0)):
        for m, thunk, number, rec in live:
            if r >= count[m.name] or "error" in rec:
                continue
            try:
                start = time.perf_counter()
                for _ in range(number):
                    thunk()
                rec["samples_s"].append((time.perf_counter() - start) / number)
            except Exception as err:
                rec["error"] = f"{type(err).__name__}: {err}"
    for m, _, number, rec in live:
        rec["calls_per_sample"] = number
        if rec["samples_s"] and "error" not in rec:
            rec["median_s"] = statistics.median(rec["samples_s"])
            rec["min_s"] = min(rec["samples_s"])
            rec["repeats"] = len(rec["samples_s"])
        if progress is not None:
            progress.update(1)
    _fill_ratios(records)
    return records


def _record(m: Member) -> dict:
    return {
        "family": m.family, "name": m.name, "size": int(m.size), "size_unit": m.size_unit,
        "median_s": None, "min_s": None, "repeats": 0, "samples_s": [], "warmup_s": None,
        "baseline": m.baseline, "baseline_median_s": None, "ratio": None, "meta": dict(m.meta),
    }


def _fill_ratios(records: list[dict]):
    """ratio = median / median of the baseline member of the same group; throughput where it applies."""
    by_name = {r["name"]: r for r in records}
    for r in records:
        if r["median_s"] and r["size_unit"] in ("labels", "rows"):
            r[f"{r['size_unit']}_per_s"] = r["size"] / r["median_s"]
        if r["family"] == "search-epsilons" and r["median_s"]:
            r["per_epsilon_s"] = r["median_s"] / r["size"]
        base = by_name.get(r["baseline"]) if r["baseline"] else None
        if base is not None and base["median_s"] and r["median_s"]:
            r["baseline_median_s"] = base["median_s"]
            r["ratio"] = r["median_s"] / base["median_s"]


# --------------------------------------------------------------------------- targets


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
            entry["reason"] = "not measured in this run"
            out[t["name"]] = entry
            continue
        exact = [c for c in found if c["size"] == t["size"]]
        case = exact[0] if exact else min(found, key=lambda c: (abs(math.log(c["size"] / t["size"])), -c["size"]))
        value = {"ratio": case["ratio"], "median_s": case["median_s"],
                 "speedup": 1.0 / case["ratio"] if case["ratio"] else None}[t["metric"]]
        proxy = case["size"] != t["size"]
        if "prior_labels" in t and case["meta"].get("prior_labels") != t["prior_labels"]:
            proxy = True
            entry["prior_labels"] = case["meta"].get("prior_labels")
        entry.update(value=value, measured_at_size=case["size"], proxy=proxy,
                     met=bool(value <= t["threshold"] if t["op"] == "<=" else value >= t["threshold"]))
        out[t["name"]] = entry
    return out


# --------------------------------------------------------------------------- reporting


def machine_info() -> dict:
    import jax

    info = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "jax": jax.__version__,
        "jaxlib": getattr(importlib.import_module("jaxlib"), "__version__", None),
        "numpy": np.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        import pyarrow

        info["pyarrow"] = pyarrow.__version__
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        pass
    if hasattr(os, "getloadavg"):
        info["load_average"] = list(os.getloadavg())
    return info


def plot_results(cases: list[dict], out_dir) -> list[str]:
    """One figure per family: time against size (log-log, baselines dashed) and, where a
    baseline exists, the ratio to it against size. Returns the file names written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    written = []
    families = list(dict.fromkeys(c["family"] for c in cases))
    for family in families:
        rows = [c for c in cases if c["family"] == family and c["median_s"]]
        if not rows:
            continue
        names = list(dict.fromkeys(c["name"] for c in rows))
        baselines = {c["baseline"] for c in cases if c["family"] == family and c["baseline"]}
        with_ratio = [n for n in names if any(c["ratio"] for c in rows if c["name"] == n)]
        ncols = 2 if with_ratio else 1
        fig, axes = plt.subplots(1, ncols, figsize=(6.4 * ncols, 4.4), squeeze=False)
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
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


def run_plan(plan: Plan, out_dir, *, cache_dir=None, families=None, repeats=None, plots=True,
             progress: bool = True) -> dict:
    """Run every case of ``plan``; write ``out_dir/results.json`` (+ plots); return the results."""
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    groups = build_groups(plan, cache_dir, families)
    started = time.perf_counter()
    cases = []
    bar = tqdm(total=sum(len(g.members) for g in groups), unit="case", desc="bench", disable=not progress)
    with bar:
        for g in groups:
            bar.set_postfix_str(f"{g.family} size={g.size}")
            cases.extend(time_group(g, plan, repeats, bar))
            clear_caches(everything=False)
            if g.family == "privatize":
                cleanup_outputs(cache_dir)
    clear_caches()
    results = {
        "schema_version": SCHEMA_VERSION,
        "plan": plan.name,
        "machine": machine_info(),
        "elapsed_s": time.perf_counter() - started,
        "settings": {"repeats": repeats or plan.repeats, "slow_repeats": repeats or plan.slow_repeats,
                     "min_sample_s": plan.min_sample_s, "search_epsilon": SEARCH_EPSILON,
                     "search_zeta_fraction": SEARCH_ZETA_FRACTION, "sampler_support": SAMPLER_SUPPORT,
                     "cache_dir": str(cache_dir)},
        "cases": cases,
        "targets": evaluate_targets(cases),
        "errors": [f"{c['family']}:{c['name']}:{c['size']}: {c['error']}" for c in cases if "error" in c],
    }
    results["plots"] = plot_results(cases, out_dir) if plots else []
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


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
    for e in results["errors"]:
        lines.append(f"  ERROR {e}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line

FAMILIES = ("sampling", "search-labels", "search-histogram", "search-epsilons", "fit-support", "privatize")


def add_arguments(parser) -> None:
    """Options of ``rpwjax bench`` (the CLI adds them to its ``bench`` subparser)."""
    import argparse

    parser.add_argument("--quick", action="store_true",
                        help="smaller sizes and fewer repeats (every family and mechanism; about 2 minutes on 2 cores)")
    parser.add_argument("--out", required=True, help="directory for results.json and the plots")
    parser.add_argument("--cache", default=None,
                        help="directory for generated input files (default $RPWJAX_BENCH_CACHE or ~/.cache/rpwjax/bench)")
    parser.add_argument("--only", nargs="+", choices=FAMILIES, default=None, metavar="FAMILY",
                        help=f"run only these families: {', '.join(FAMILIES)}")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per case (default: by plan)")
    parser.add_argument("--no-plots", action="store_true", help="skip the plots")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--plan", choices=tuple(PLANS), default=None, help=argparse.SUPPRESS)


def run(args) -> int:
    """Run the benchmarks; exit code 1 if any case failed (its error is in results.json)."""
    from rpwjax.errors import InputError

    if args.repeats is not None and args.repeats < 1:
        raise InputError(f"--repeats must be a positive integer, got --repeats={args.repeats}")
    plan = PLANS[args.plan or ("quick" if args.quick else "full")]
    results = run_plan(plan, args.out, cache_dir=args.cache, families=args.only, repeats=args.repeats,
                       plots=not args.no_plots, progress=not args.quiet)
    print(summary(results))
    print(f"wrote {Path(args.out) / 'results.json'}")
    return 1 if results["errors"] else 0


def main(argv=None) -> int:
    """``python -m rpwjax.bench.suite`` (the same options as ``rpwjax bench``)."""
    import argparse

    parser = argparse.ArgumentParser(prog="rpwjax bench", description="Runtime benchmarks of rpwjax.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
