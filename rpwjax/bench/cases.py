"""Benchmark cases: data generators and the thunks each case times, grouped by (family, size)."""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rpwjax.api import fit
from rpwjax.bench.plans import CONTINUOUS_RANGE, CRITEO_RANGE, HISTOGRAM_SOURCE_LABELS, Plan, SAMPLER_SUPPORT, SEARCH_EPSILON, SEARCH_ZETA_FRACTION
from rpwjax.experiments.datasets import criteo_synthetic_labels
from rpwjax.keys import Secret
from rpwjax.mechanisms import MECHANISMS, entry
from rpwjax.mechanisms.reference_algorithm1 import algorithm1_interval
from rpwjax.mechanisms.rpwithprior import fit_rpwithprior
from rpwjax.pipelines.table import privatize_table
from rpwjax.priors import empirical_prior, histogram_prior
from rpwjax.privatize import release_file
from rpwjax import release_path
from rpwjax.keys import bound
from rpwjax.release_path import release
from rpwjax.sampling import params_digest, spec
from rpwjax.stream import BLOCK_ROWS

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


class SkipCase(Exception):
    """Raised by a member's setup when it cannot run here (an optional peer library is absent): recorded as
    skipped with the reason, not as an error."""


@dataclasses.dataclass
class Group:
    family: str
    size: int
    members: list


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
    return criteo_synthetic_labels(int(n), seed)


@functools.lru_cache(maxsize=None)
def empirical(kind: str, n: int):
    if kind == "continuous":
        return empirical_prior(continuous_labels(n), *CONTINUOUS_RANGE)
    return empirical_prior(criteo_labels(n), *CRITEO_RANGE)


@functools.lru_cache(maxsize=None)
def histogram(k: int):
    """A k-bin equal-width histogram prior of Criteo-shaped labels over [0, 400]."""
    edges = np.linspace(*CRITEO_RANGE, int(k) + 1)
    counts, _ = np.histogram(criteo_labels(HISTOGRAM_SOURCE_LABELS), bins=edges)
    return histogram_prior(edges, counts.astype(np.float64))


@functools.lru_cache(maxsize=None)
def support_prior(k: int):
    """k equally spaced support points on [0, 400] (k = 401: the integers) weighted like Criteo labels."""
    lo, hi = CRITEO_RANGE
    points = np.linspace(lo, hi, int(k))
    edges = np.concatenate([[lo], 0.5 * (points[1:] + points[:-1]), [hi]])
    counts, _ = np.histogram(criteo_labels(100_000, seed=1), bins=edges)
    return empirical_prior(points, lo, hi, weights=counts + 1.0)  # every point keeps some mass


def clear_caches(everything: bool = True):
    """Drop cached inputs (between groups: the large ones; the fitted sampler parameters are small)."""
    for fn in (continuous_labels, criteo_labels, empirical, histogram, support_prior, sampling_labels,
               _device_blocks):
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
    prior = support_prior(SAMPLER_SUPPORT)
    # a fixed ζ skips the auto-ζ search: the sampler's cost does not depend on ζ
    options = {"zeta": SEARCH_ZETA_FRACTION * (prior.hi - prior.lo)} if mechanism == "rpwithprior" else {}
    params, _ = entry(mechanism).fit(prior, SEARCH_EPSILON, **options)
    return params


def sampler_thunk(mechanism: str, n: int):
    """Timed call: the release path for ``mechanism`` on n float64 labels (compiled after one call)."""
    params = _sampler_params(mechanism)
    y = sampling_labels(n)
    secret = Secret.from_seed(1)
    return lambda: release(params, secret, y)


@functools.lru_cache(maxsize=1)
def _device_blocks(n: int, fill: float):
    """The Criteo-shaped labels in release blocks, already on the device (shared by the kernel members)."""
    num_blocks = -(-int(n) // BLOCK_ROWS)
    with jax.enable_x64(True):
        return jax.device_put(release_path._blocks(sampling_labels(n), 0, num_blocks, fill))


def kernel_thunk(mechanism: str, n: int, secret: Secret | None = None):
    """Timed call: the release's computation alone (its stream words, inverse CDF, grid, clamp) on labels
    already on the device, output left there: what the release costs without the labels' round trip. On CPU
    the stream words come from the host, as in a release (:func:`rpwjax.release_path.stream_inputs`).

    With the same ``secret`` (bound to a release) its first n values are the release's, bit for bit.
    """
    params = _sampler_params(mechanism)
    s = spec(params)
    secret = bound(secret if secret is not None else Secret.from_seed(1))
    key = secret.stream_key("labels/" + params.name + "/" + params_digest(params))  # the release's own stream
    blocks = _device_blocks(n, float(params.lo))
    label_range = np.array([float(params.lo), float(params.hi)])
    devices = jax.local_devices()
    sequential = release_path._sequential(devices, blocks.shape[0], params)

    def call():
        counters, words = release_path._start_stream(key, 0, blocks.shape[0], devices, reuse=True)()  # as a release
        with jax.enable_x64(True):
            out, _ = release_path._release_blocks(params, s["low"], s["high"], key, counters, words, blocks,
                                                  label_range, grid=s["grid"], per_row=False, sequential=sequential)
            return out.block_until_ready()
    return call


def uniform_thunk(n: int):
    """The floor: ``jax.random.uniform`` of n float64 values (x64 on, result on the device)."""
    def call():
        with jax.enable_x64(True):
            return fn(key).block_until_ready()

    with jax.enable_x64(True):
        key = jax.random.key(1)
        fn = jax.jit(lambda k: jax.random.uniform(k, (int(n),), jnp.float64))
    return call


def stream_uniform_thunk(n: int):
    """The release path's own uniforms: the ChaCha20 uniforms of ``ceil(n / BLOCK_ROWS)`` blocks, made the way a
    release makes them (words from the host on CPU, else computed on the device), result on the device. The
    part of every release ratio that is the generator, before any mechanism's work. Its host words go into a
    fresh buffer each call, so on CPU it also pays the page faults that a release's reused buffers avoid."""
    num_blocks = -(-int(n) // BLOCK_ROWS)
    key = bound(Secret.from_seed(1)).stream_key("labels/uniforms")
    devices = jax.local_devices()

    def one(xs):
        return release_path.stream_uniforms(key, *xs)

    with jax.enable_x64(True):
        fn = jax.jit(lambda c, w: release_path.map_blocks(one, (c, w), sequential=False))

    def call():
        counters, words = release_path.stream_inputs(key, 0, num_blocks, devices)
        with jax.enable_x64(True):
            return fn(counters, words).block_until_ready()
    return call


PEER_EPSILON = 1.0
PEER_RANGE = (0.0, 1.0)


def peer_labels(n: int) -> np.ndarray:
    return continuous_labels(n) / (CONTINUOUS_RANGE[1] - CONTINUOUS_RANGE[0])


def peer_release_thunk(n: int):
    """Timed call: the rpwjax Laplace release (the whole release path) of n labels in [0, 1] at ε = 1."""
    params, _ = entry("laplace").fit(histogram_prior(np.array(PEER_RANGE), np.array([1.0])), PEER_EPSILON)
    y = peer_labels(n)
    secret = Secret.from_seed(2)
    return lambda: release(params, secret, y)


def opendp_laplace_thunk(n: int):
    """Timed call: OpenDP's vector Laplace (float-safe sampler) on the same labels, scale Δ/ε."""
    try:
        import opendp.prelude as dp
    except ImportError as err:
        raise SkipCase(f"opendp is not installed (pip install -e '.[peers]'): {err}") from None
    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l1_distance(T=float)
    measurement = space >> dp.m.then_laplace(scale=(PEER_RANGE[1] - PEER_RANGE[0]) / PEER_EPSILON)
    y = peer_labels(n).tolist()
    return lambda: measurement(y)


def diffprivlib_laplace_thunk(n: int):
    """Timed call: diffprivlib's Laplace mechanism on the same labels, one ``randomise`` per label."""
    try:
        from diffprivlib.mechanisms import Laplace
    except Exception as err:  # noqa: BLE001 - absent, or broken against the installed scikit-learn
        raise SkipCase(f"diffprivlib cannot be imported here ({type(err).__name__}: {err}; pip install -e '.[peers]' "
                       "installs a scikit-learn it works with)") from None
    mechanism = Laplace(epsilon=PEER_EPSILON, sensitivity=PEER_RANGE[1] - PEER_RANGE[0])
    y = peer_labels(n).tolist()
    return lambda: [mechanism.randomise(v) for v in y]


def search_thunk(prior, epsilons, objective: str = "neighborhood"):
    """Timed call: the exact interval search for a fixed ζ over ``epsilons`` (one vmapped fit).

    Goes through the public ``fit_rpwithprior(prior, epsilons, zeta=ζ)``: with ζ
    fixed it is the interval search alone (no ζ search), from a host prior to
    host parameters, as a user calls it.
    """
    zeta = SEARCH_ZETA_FRACTION * (prior.hi - prior.lo)
    eps = np.atleast_1d(np.asarray(epsilons, np.float64))
    return lambda: fit_rpwithprior(prior, eps, zeta=zeta, objective=objective)


def load_reference():
    """The NumPy O(k³) reference (:func:`rpwjax.mechanisms.reference_algorithm1.algorithm1_interval`)."""
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
    fit_fn = entry(mechanism).fit
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


def _cached_parquet(path: Path, rows: int, make_chunk) -> Path:
    """Write ``path`` once (atomically) from ``make_chunk(i, start, m)`` tables of up to 2^20 rows each."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.part")
    chunk = 1 << 20
    writer = None
    try:
        for i, start in enumerate(range(0, int(rows), chunk)):
            table = make_chunk(i, start, min(chunk, int(rows) - start))
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


def parquet_file(rows: int, cache_dir) -> Path:
    """A ``rows``-row Parquet file (row id, 3 float32 features, an int32 category, the label), made once."""
    def make_chunk(i, start, m):
        rng = np.random.default_rng([20261130, i])
        return pa.table(
            {
                "row_id": pa.array(np.arange(start, start + m, dtype=np.int64)),
                "f0": pa.array(rng.standard_normal(m, dtype=np.float32)),
                "f1": pa.array(rng.standard_normal(m, dtype=np.float32)),
                "f2": pa.array(rng.standard_normal(m, dtype=np.float32)),
                "category": pa.array(rng.integers(0, 1000, m, dtype=np.int32)),
                PRIVATIZE_LABEL: pa.array(criteo_synthetic_labels(m, seed=1000 + i)),
            }
        )

    return _cached_parquet(Path(cache_dir) / f"privatize-{int(rows)}-v{PRIVATIZE_FILE_VERSION}.parquet", rows,
                           make_chunk)


def pyarrow_copy(src, dst, chunk_rows: int) -> int:
    """The baseline: read ``src`` in batches and write them unchanged to ``dst``."""
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
def _privatize_params(path: str, label_column: str, lo: float, hi: float):
    """RPWithPrior (ε = :data:`SEARCH_EPSILON`, fixed ζ, private histogram prior) fitted to the first
    100,000 labels of ``path``: outside the timed call, as ``rpwjax privatize --params`` uses a saved fit."""
    first = next(pq.ParquetFile(path).iter_batches(batch_size=100_000, columns=[label_column]))
    labels = first.column(0).to_numpy()
    zeta = SEARCH_ZETA_FRACTION * (hi - lo)
    result = fit("rpwithprior", labels, range=(lo, hi), epsilon=SEARCH_EPSILON, zeta=zeta, prior="private", seed=0)
    return result.params, result.records()[0]


def privatize_file_thunk(src, label_column: str, lo: float, hi: float, dst):
    """Timed call: ``release_file`` (the streaming half of ``privatize_file``) of ``label_column`` of ``src``
    (RPWithPrior, parameters fitted in setup)."""
    params, record = _privatize_params(str(src), label_column, float(lo), float(hi))
    secret = Secret.from_seed(7)

    def call():
        return release_file(
            src, dst, label_column=label_column, params=params, secret=secret, record=record,
            chunk_rows=PRIVATIZE_CHUNK_ROWS, progress=False,
        )

    return call


def privatize_thunk(rows: int, cache_dir):
    src = parquet_file(rows, cache_dir)
    dst = Path(cache_dir) / f"out-privatize-{os.getpid()}.parquet"
    return privatize_file_thunk(src, PRIVATIZE_LABEL, *CRITEO_RANGE, dst)


def copy_thunk(rows: int, cache_dir):
    src = parquet_file(rows, cache_dir)
    dst = Path(cache_dir) / f"out-copy-{os.getpid()}.parquet"
    return lambda: pyarrow_copy(src, dst, PRIVATIZE_CHUNK_ROWS)


# privatize-table: the auto pipeline on a feature table, next to privatize_file of the same labels

TABLE_LABEL = "y"
TABLE_FEATURES = 8
TABLE_RANGE = (0.0, 10.0)
TABLE_FILE_VERSION = 1
TABLE_WEIGHTS = np.array([1.0, -0.8, 0.6, -0.4, 0.3, -0.2, 0.1, 0.05])  # the public formula's linear part


def table_labels(x: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """The public formula of the benchmark table's labels, clipped into :data:`TABLE_RANGE`:
    ``5 + x·w + sin(2·x0) + 0.5·x1·x2 + noise`` (w = :data:`TABLE_WEIGHTS`)."""
    raw = 5.0 + x @ TABLE_WEIGHTS + np.sin(2.0 * x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] + noise
    return np.clip(raw, *TABLE_RANGE)


def table_file(rows: int, cache_dir) -> Path:
    """A ``rows``-row Parquet table made once: 8 float64 standard normal features ``x0..x7`` and the label
    ``y`` = :func:`table_labels` (standard normal noise), each 2^20-row chunk from its own fixed seed."""
    def make_chunk(i, start, m):
        rng = np.random.default_rng([20261201, i])
        x = rng.standard_normal((m, TABLE_FEATURES))
        y = table_labels(x, rng.standard_normal(m))
        return pa.table({**{f"x{j}": pa.array(x[:, j]) for j in range(TABLE_FEATURES)}, TABLE_LABEL: pa.array(y)})

    return _cached_parquet(Path(cache_dir) / f"privatize-table-{int(rows)}-v{TABLE_FILE_VERSION}.parquet", rows,
                           make_chunk)


_PEAK_RSS_CHILD = """
import resource, sys
from rpwjax.keys import Secret
from rpwjax.pipelines.table import privatize_table
src, dst, lo, hi, eps = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
privatize_table(src, dst, label_column=sys.argv[6], lo=lo, hi=hi, epsilon=eps, pipeline="auto",
                secret=Secret.from_seed(7))
try:  # Linux: this process's own high-water mark (ru_maxrss would include the parent's peak: exec keeps it)
    with open("/proc/self/status") as f:
        print(next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")))
except OSError:
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_rss_mb(src, dst, label_column: str, lo: float, hi: float, epsilon: float) -> float:
    """Peak resident memory (MiB) of one ``privatize_table(..., pipeline="auto")`` call in a fresh Python process
    (imports included: what ``rpwjax privatize-table`` costs a machine): the child's ``VmHWM`` on Linux. Not its
    ``ru_maxrss``: a child started by ``subprocess`` (vfork, then exec) inherits the parent's peak in it, so a
    large test process would be measured instead of the call. macOS falls back to ``ru_maxrss``."""
    import subprocess
    import sys

    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the directory that holds the rpwjax package
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    done = subprocess.run([sys.executable, "-c", _PEAK_RSS_CHILD, str(src), str(dst), str(lo), str(hi), str(epsilon),
                           label_column], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the peak-RSS run failed: {done.stderr.strip().splitlines()[-1:]}")
    for suffix in ("", ".json"):
        Path(str(dst) + suffix).unlink(missing_ok=True)
    kib = int(done.stdout.strip().splitlines()[-1])
    return round(kib / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)  # macOS's ru_maxrss is in bytes


def table_auto_thunk(rows: int, cache_dir, epsilon: float = SEARCH_EPSILON):
    """Timed call: ``privatize_table(..., pipeline="auto")`` at ``epsilon`` (what ``rpwjax privatize-table
    --pipeline auto`` runs: read, every statistic and fit, release, write). The thunk's ``meta`` receives the
    rule's choice and ``peak_rss_mb``, the peak memory of one such call in a fresh process (measured once, in
    setup: :func:`peak_rss_mb`)."""
    src = table_file(rows, cache_dir)
    dst = Path(cache_dir) / f"out-table-auto-{os.getpid()}.parquet"
    secret = Secret.from_seed(7)
    meta = {"peak_rss_mb": peak_rss_mb(src, dst, TABLE_LABEL, *TABLE_RANGE, epsilon)}

    def call():
        sidecar = privatize_table(src, dst, label_column=TABLE_LABEL, lo=TABLE_RANGE[0], hi=TABLE_RANGE[1],
                                  epsilon=epsilon, pipeline="auto", secret=secret)
        trace = sidecar["accounting"]["auto"]
        meta.update(branch=trace["plan"]["branch"], release=sidecar["accounting"]["mechanism"],
                    q=trace["plan"]["unbiased_noise_ratio"])
        return sidecar

    call.meta = meta
    return call


def table_privatize_thunk(rows: int, cache_dir):
    src = table_file(rows, cache_dir)
    dst = Path(cache_dir) / f"out-table-privatize-{os.getpid()}.parquet"
    return privatize_file_thunk(src, TABLE_LABEL, *TABLE_RANGE, dst)


def cleanup_outputs(cache_dir):
    """Remove this process's privatize/copy/privatize-table outputs from the cache directory."""
    pid = os.getpid()
    for pattern in (f"out-privatize-{pid}.parquet*", f"out-copy-{pid}.parquet", f"out-table-*-{pid}.parquet*"):
        for p in Path(cache_dir).glob(pattern):
            p.unlink()


def mechanism_names() -> tuple[str, ...]:
    """Every registered mechanism (a registered one whose module is missing fails its case, loudly)."""
    return tuple(MECHANISMS)


def build_groups(plan: Plan, cache_dir, families=None) -> list[Group]:
    """The case table of a plan: groups in run order (``families`` filters)."""
    cache_dir = Path(cache_dir)
    groups: list[Group] = []

    def add(family, size, members):
        if families is None or family in families:
            groups.append(Group(family, size, members))

    for n in plan.sampling_n:
        members = [Member("sampling", "uniform-floor", n, "labels", functools.partial(uniform_thunk, n)),
                   Member("sampling", "stream-uniforms", n, "labels", functools.partial(stream_uniform_thunk, n),
                          baseline="uniform-floor",
                          meta={"dtype": "float64", "what": "the release path's ChaCha20 uniforms alone (host words on "
                                                            "CPU), result on the device"})]
        for name in mechanism_names():
            if plan.release_max_n is None or n <= plan.release_max_n:
                members.append(
                    Member("sampling", f"release/{name}", n, "labels", functools.partial(sampler_thunk, name, n),
                           baseline="uniform-floor", meta={"mechanism": name, "dtype": "float64"})
                )
            if n in plan.kernel_n:
                members.append(
                    Member("sampling", f"kernel/{name}", n, "labels", functools.partial(kernel_thunk, name, n),
                           baseline="uniform-floor",
                           meta={"mechanism": name, "dtype": "float64", "labels": "on the device, no round trip"})
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

    table = {"features": TABLE_FEATURES, "range": list(TABLE_RANGE), "epsilon": SEARCH_EPSILON, "format": "parquet"}
    for rows in plan.table_rows:
        add("privatize-table", rows, [
            Member("privatize-table", "privatize/rpwithprior", rows, "rows",
                   functools.partial(table_privatize_thunk, rows, cache_dir), slow=True,
                   meta={"mechanism": "rpwithprior", "fit": "in setup (first 100,000 labels, fixed zeta)",
                         "chunk_rows": PRIVATIZE_CHUNK_ROWS, **table}),
            Member("privatize-table", "auto", rows, "rows", functools.partial(table_auto_thunk, rows, cache_dir),
                   baseline="privatize/rpwithprior", slow=True,
                   meta={"pipeline": "auto", "fit": "in the timed call", **table}),
            # a small ε, where the rule picks the denoised release (a per-level interval search and a per-row
            # posterior): the slower branch, same table
            Member("privatize-table", "auto-eps0.05", rows, "rows",
                   functools.partial(table_auto_thunk, rows, cache_dir, epsilon=0.05),
                   baseline="privatize/rpwithprior", slow=True,
                   meta={"pipeline": "auto", "fit": "in the timed call", **table, "epsilon": 0.05}),
        ])
    for n in plan.peers_n:
        add("peers", n, [
            Member("peers", "release/laplace", n, "labels", functools.partial(peer_release_thunk, n),
                   meta={"mechanism": "laplace", "epsilon": PEER_EPSILON, "library": "rpwjax"}),
            Member("peers", "opendp/vector-laplace", n, "labels", functools.partial(opendp_laplace_thunk, n),
                   baseline="release/laplace", slow=True, meta={"epsilon": PEER_EPSILON, "library": "opendp"}),
            Member("peers", "diffprivlib/laplace", n, "labels", functools.partial(diffprivlib_laplace_thunk, n),
                   baseline="release/laplace", slow=True, meta={"epsilon": PEER_EPSILON, "library": "diffprivlib"}),
        ])
    return groups


