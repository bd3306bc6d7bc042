"""Core benchmark cases on whatever backend JAX runs on (a GPU when it sees one).

Called by ``benchmarks/device_run.sh``; never needed by the tests or CI.
Measures, with the timing loop and case definitions of :mod:`rpwjax.bench`:

* sampling: ``jax.random.uniform`` (the floor) and RPWithPrior's sampler on
  n float32 labels, n up to 1e8;
* the exact interval search (fixed ζ) on 1.3e6-label empirical priors, one ε,
  and vmapped over 10 ε.

Writes ``$OUT/device_results.json`` (labels per second per case, the backend
and devices) after every group, so a run cut short still leaves its results;
groups that would start after ``--budget`` seconds are listed as skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "device-out"))
    parser.add_argument("--budget", type=float, default=360.0, help="seconds; no group starts after this")
    parser.add_argument("--max-n", type=int, default=10**8)
    args = parser.parse_args(argv)
    started = time.perf_counter()

    from rpwjax.bench import cases, plans, report, timing

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = tuple(n for n in (10**6, 10**7, 10**8) if n <= args.max_n)
    plan = dataclasses.replace(
        plans.PLANS["full"], name="device", sampling_n=sizes, search_labels=(1_300_000,), search_bins=(),
        epsilon_grid_sizes=(10,), epsilon_grid_prior=1_300_000, fit_support={}, privatize_rows=(), table_rows=(),
        repeats=10, min_sample_s=0.05,
    )
    groups = cases.build_groups(plan, out / "cache", families=("sampling", "search-labels", "search-epsilons"))
    for g in groups:
        if g.family == "sampling":
            g.members = [m for m in g.members if m.name in ("uniform-floor", "release/rpwithprior")]
    results = {"machine": report.machine_info(), "plan": dataclasses.asdict(plan), "cases": [], "skipped": []}
    path = out / "device_results.json"
    for g in groups:
        elapsed = time.perf_counter() - started
        if elapsed > args.budget:
            results["skipped"].append(f"{g.family} size={g.size}: time budget ({elapsed:.0f} s > {args.budget:.0f} s)")
            continue
        print(f"[device_bench] {g.family} size={g.size} at {elapsed:.0f} s", flush=True)
        records = timing.time_group(g, plan)
        for r in records:
            if r["median_s"] and r["family"] == "search-labels":
                r["labels_per_s"] = r["size"] / r["median_s"]
            if r["median_s"] and r["family"] == "search-epsilons":
                r["labels_per_s"] = r["meta"]["prior_labels"] * r["size"] / r["median_s"]
            print(f"  {r['name']}: median {r['median_s']} s, ratio {r['ratio']}, "
                  f"labels/s {r.get('labels_per_s')}, error {r.get('error')}", flush=True)
        results["cases"].extend(records)
        cases.clear_caches()
        results["elapsed_s"] = time.perf_counter() - started
        path.write_text(json.dumps(results, indent=2) + "\n")
    results["elapsed_s"] = time.perf_counter() - started
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"[device_bench] wrote {path}")
    return 1 if any("error" in r for r in results["cases"]) else 0


if __name__ == "__main__":
    sys.exit(main())
