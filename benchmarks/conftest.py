"""pytest-benchmark wrappers around the case table of :mod:`rpwjax.bench`.

Not collected by the default ``pytest`` run (testpaths = tests). Run with::

    pytest benchmarks --benchmark-only                       # full sizes
    pytest benchmarks --benchmark-only --rpwjax-plan quick   # the quick subset

Each case of ``rpwjax.bench.cases.build_groups`` is one test; the warm-up call
(compilation) happens before pytest-benchmark's timer starts. Members of a
(family, size) group share ``benchmark.group``, so the report puts a case
next to its baseline.
"""

from __future__ import annotations

import statistics
import time

import pytest

from rpwjax.bench import cases, plans, report, timing


def pytest_addoption(parser):
    group = parser.getgroup("rpwjax")
    group.addoption("--rpwjax-plan", choices=sorted(plans.PLANS), default="full",
                    help="sizes and repeats of the rpwjax benchmark cases (default: full)")
    group.addoption("--rpwjax-cache", default=None,
                    help="directory for generated input files (default: $RPWJAX_BENCH_CACHE or ~/.cache/rpwjax/bench)")


def _plan(config):
    return plans.PLANS[config.getoption("--rpwjax-plan")]


def _cache(config):
    return config.getoption("--rpwjax-cache") or cases.default_cache_dir()


def pytest_generate_tests(metafunc):
    if "case" not in metafunc.fixturenames:
        return
    families = metafunc.module.FAMILIES
    groups = cases.build_groups(_plan(metafunc.config), _cache(metafunc.config), families)
    params = [(g, m) for g in groups for m in g.members]
    metafunc.parametrize("case", params, ids=[m.id for _, m in params])


@pytest.fixture(scope="module", autouse=True)
def _release_data(request):
    yield
    cases.clear_caches()
    cases.cleanup_outputs(_cache(request.config))


@pytest.fixture
def run_case(benchmark, request):
    """Time one case: warm-up outside the timer, then pytest-benchmark's rounds.

    A case with a baseline (a release against the uniform floor, privatize
    against the pyarrow copy, auto against privatize) runs its baseline in
    pytest-benchmark's untimed ``setup`` before every round, timed here: the
    two alternate in one warm process and ``extra_info`` carries the
    baseline's median and the ratio of medians. A case that a speed target
    names, at the target's size, fails when it misses the target.
    """
    plan = _plan(request.config)

    def run(case):
        group, member = case
        try:
            thunk = member.setup()
        except cases.SkipCase as why:  # an optional peer library that is not installed
            pytest.skip(str(why))
        warmup, number, _ = timing.calibrate(thunk, plan.min_sample_s)
        rounds = plan.slow_repeats if member.slow else plan.repeats
        benchmark.group = f"{member.family} {member.size_unit}={member.size}"
        benchmark.extra_info.update(family=member.family, case=member.name, size=member.size,
                                    size_unit=member.size_unit, warmup_s=warmup, baseline=member.baseline,
                                    **member.meta)
        if member.baseline:
            (base,) = [m for m in group.members if m.name == member.baseline]
            base_thunk = base.setup()
            base_thunk()
            base_times = []

            def run_baseline():
                start = time.perf_counter()
                base_thunk()
                base_times.append(time.perf_counter() - start)

            benchmark.pedantic(thunk, setup=run_baseline, rounds=rounds, iterations=1)
            base_median = statistics.median(base_times)
            benchmark.extra_info["baseline_median_s"] = base_median
            stats = getattr(getattr(benchmark, "stats", None), "stats", None)
            if stats is not None:
                benchmark.extra_info["ratio"] = stats.median / base_median
        else:
            benchmark.pedantic(thunk, rounds=rounds, iterations=number)
        benchmark.extra_info.update(getattr(thunk, "meta", None) or {})  # what the calls report (auto's choice)
        stats = getattr(getattr(benchmark, "stats", None), "stats", None)
        if stats is not None:  # None under --benchmark-disable: nothing was timed
            assert stats.median > 0 and stats.median == stats.median
            missed = report.missed_targets(member.family, member.name, member.size, member.meta, stats.median,
                                           benchmark.extra_info.get("ratio"))
            assert not missed, "; ".join(missed)

    return run

