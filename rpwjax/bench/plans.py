"""Benchmark plans (sizes, repeats per family) and the speed targets, as data."""

from __future__ import annotations

import dataclasses


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
    table_rows: tuple[int, ...]  # privatize-table: rows of the 8-feature table (auto pipeline, privatize_file)
    peers_n: tuple[int, ...]  # peers: labels released by rpwjax and by the peer libraries, same labels, same run
    repeats: int
    slow_repeats: int  # for members whose single call takes seconds (reference, privatize)
    min_sample_s: float
    max_member_s: float  # repeats are cut (to no fewer than 3) when a case would take longer
    kernel_n: tuple[int, ...] = ()  # sampling sizes that also time each release's device computation alone
    release_max_n: int | None = None  # sampling sizes above this time the device computation only


PLANS = {
    "full": Plan(
        name="full",
        sampling_n=(10**4, 10**5, 10**6, 10**7),
        kernel_n=(10**7,),
        search_labels=(10**3, 10**4, 10**5, 10**6, 1_300_000),
        search_bins=(16, 32, 64, 128, 256, 1024, 4096),
        reference_max_bins=256,
        epsilon_grid_sizes=(1, 3, 10, 30),
        epsilon_grid_prior=1_300_000,
        fit_support={"rr-on-bins": (16, 64, 128, 256, 401, 1024), "unbiased": (16, 32, 64, 128, 256, 401)},
        privatize_rows=(10**6, 10**7),
        table_rows=(10**6,),
        peers_n=(10**6,),
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
        table_rows=(20_000,),
        peers_n=(10**5,),
        repeats=3,
        slow_repeats=2,
        min_sample_s=0.01,
        max_member_s=10.0,
    ),
    # a GPU machine (benchmarks/device_run.sh): the release path of every mechanism up to 1e9 labels and
    # the vmapped fits; no file pipelines (their cost is the host's disk and CPU, measured in the CPU run)
    "device": Plan(
        name="device",
        sampling_n=(10**7, 10**9),
        search_labels=(1_300_000,),
        search_bins=(),
        reference_max_bins=0,
        epsilon_grid_sizes=(1, 10, 30),
        epsilon_grid_prior=1_300_000,
        fit_support={"rr-on-bins": (401,)},
        privatize_rows=(),
        table_rows=(),
        peers_n=(),
        repeats=5,
        slow_repeats=3,
        min_sample_s=0.05,
        max_member_s=12.0,
        kernel_n=(10**7, 10**9),
        release_max_n=10**8,
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
        table_rows=(10_000,),  # the unbiased release (at 5000 rows auto picks the slower per-row RPWithPrior)
        peers_n=(1000,),
        repeats=2,
        slow_repeats=2,
        min_sample_s=0.0,
        max_member_s=10.0,
    ),
}

# The speed targets. "metric" is read from the case at "size";
# "speedup" is 1 / ratio; any other metric is a number in the case's meta (peak_rss_mb). "prior_labels" (ε-grid family) must match the plan.
TARGETS = (
    dict(name="rpwithprior_release_vs_uniform_floor", family="sampling", case="release/rpwithprior",
         size=10**7, metric="ratio", op="<=", threshold=1.3,
         description="RPWithPrior release of 1e7 float64 labels (the whole release path) / jax.random.uniform of 1e7 float64"),
    dict(name="laplace_release_vs_uniform_floor", family="sampling", case="release/laplace",
         size=10**7, metric="ratio", op="<=", threshold=1.3,
         description="Laplace release of 1e7 float64 labels (the whole release path) / jax.random.uniform of 1e7 float64"),
    dict(name="gaussian_release_vs_uniform_floor", family="sampling", case="release/gaussian",
         size=10**7, metric="ratio", op="<=", threshold=1.3,
         description="Gaussian release of 1e7 float64 labels (the whole release path) / jax.random.uniform of 1e7 float64"),
    dict(name="staircase_release_vs_uniform_floor", family="sampling", case="release/staircase",
         size=10**7, metric="ratio", op="<=", threshold=1.3,
         description="Staircase release of 1e7 float64 labels (the whole release path) / jax.random.uniform of 1e7 float64"),
    dict(name="rr_on_bins_release_vs_uniform_floor", family="sampling", case="release/rr-on-bins",
         size=10**7, metric="ratio", op="<=", threshold=2.0,
         description="RR-on-Bins release of 1e7 float64 labels (the whole release path) / jax.random.uniform of 1e7 float64"),
    dict(name="unbiased_release_vs_uniform_floor", family="sampling", case="release/unbiased",
         size=10**7, metric="ratio", op="<=", threshold=2.0,
         description="Unbiased release of 1e7 float64 labels (the whole release path) / jax.random.uniform of 1e7 float64"),
    dict(name="laplace_release_vs_opendp_vector_laplace", family="peers", case="opendp/vector-laplace",
         size=10**6, metric="ratio", op=">=", threshold=1500.0,
         description="OpenDP's float-safe vector Laplace / the rpwjax Laplace release, same 1e6 labels, same run"),
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
         size=401, metric="median_s", op="<=", threshold=0.1,
         description="fit_unbiased on 401 support points, one ε, seconds (ten ε in 1 s)"),
    dict(name="privatize_vs_pyarrow_copy", family="privatize", case="privatize/rpwithprior",
         size=10**7, metric="ratio", op="<=", threshold=3.0,
         description="privatize_file on a 1e7-row Parquet file / plain pyarrow read-and-write of it"),
    dict(name="privatize_table_auto_1m", family="privatize-table", case="auto",
         size=10**6, metric="median_s", op="<=", threshold=120.0,
         description="privatize-table --pipeline auto, 1e6 rows x 8 features, ε = 1, end to end, seconds"),
    dict(name="privatize_table_auto_1m_small_epsilon", family="privatize-table", case="auto-eps0.05",
         size=10**6, metric="median_s", op="<=", threshold=120.0,
         description="privatize-table --pipeline auto, 1e6 rows x 8 features, ε = 0.05 (denoised branch), seconds"),
    dict(name="privatize_table_auto_1m_memory", family="privatize-table", case="auto",
         size=10**6, metric="peak_rss_mb", op="<=", threshold=1024.0,
         description="privatize-table --pipeline auto, 1e6 rows x 8 features, ε = 1, peak RSS of one call in a fresh process, MiB"),
    dict(name="privatize_table_auto_1m_small_epsilon_memory", family="privatize-table", case="auto-eps0.05",
         size=10**6, metric="peak_rss_mb", op="<=", threshold=1024.0,
         description="privatize-table --pipeline auto, 1e6 rows x 8 features, ε = 0.05, peak RSS of one call in a fresh process, MiB"),
)


FAMILIES = ("sampling", "search-labels", "search-histogram", "search-epsilons", "fit-support", "privatize",
            "privatize-table", "peers")


