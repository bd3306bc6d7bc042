"""The timing loop: calibrated samples, interleaved members, medians and same-run ratios."""

from __future__ import annotations

import math
import statistics
import time


from rpwjax.bench.plans import Plan, SLOW_CALL_S
from rpwjax.bench.cases import Group, Member, SkipCase

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
        except SkipCase as why:  # an optional peer that is not installed: said, not an error
            rec["skipped"] = str(why)
            if progress is not None:
                progress.update(1)
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
    for m, thunk, number, rec in live:
        rec["calls_per_sample"] = number
        rec["meta"].update(getattr(thunk, "meta", None) or {})  # what a thunk's calls report (auto's choice)
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


