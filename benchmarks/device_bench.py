"""The release path and the vmapped fits on whatever backend JAX runs on (a GPU when it sees one).

Called by ``benchmarks/device_run.sh``; never needed by the tests or CI.
Runs the ``device`` plan of :mod:`rpwjax.bench.plans` with the same timing
loop, cases and ``results.json`` schema as ``rpwjax bench``:

* the fits first (cheap): the exact interval search on a 1.3e6-label
  empirical prior at one ε and vmapped over 1, 10 and 30 ε, and RR-on-Bins
  on 401 support points;
* then, against ``jax.random.uniform`` of as many float64 values on the
  device: each mechanism's release computation on labels already on the
  device (``kernel/*``: the ChaCha20 stream, inverse CDF, grid, clamp) at n = 1e7 and
  1e9, and the whole release with its host round trip (``release/*``:
  float64 labels from host memory, host array out) at n = 1e7.

``results.json`` is rewritten after every group, so a run cut short keeps
what it measured; a group that would start after ``--budget`` seconds is
listed under ``skipped``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from rpwjax.bench import cases, plans, report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "device-out"))
    parser.add_argument("--budget", type=float, default=360.0, help="seconds; no group starts after this")
    parser.add_argument("--sizes", default=None, help="release sizes, comma-separated (default the plan's: 1e7, 1e9)")
    parser.add_argument("--release-max-n", type=float, default=None,
                        help="largest size that also times the whole release with its host round trip (default 1e8)")
    parser.add_argument("--search-labels", type=int, default=None, help="prior size of the fits (default the plan's)")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)

    plan = plans.PLANS["device"]
    if args.sizes:
        sizes = tuple(int(float(n)) for n in args.sizes.split(","))
        plan = dataclasses.replace(plan, sampling_n=sizes, kernel_n=sizes)
    if args.release_max_n is not None:
        plan = dataclasses.replace(plan, release_max_n=int(args.release_max_n))
    if args.search_labels is not None:
        plan = dataclasses.replace(plan, search_labels=(args.search_labels,), epsilon_grid_prior=args.search_labels)
    out = Path(args.out)
    groups = cases.build_groups(plan, out / "cache")
    # the fits first, then the releases by growing n: a run cut short loses only the largest
    groups = [g for g in groups if g.family != "sampling"] + [g for g in groups if g.family == "sampling"]
    results = report.run_plan(plan, out, cache_dir=out / "cache", groups=groups, budget_s=args.budget,
                              plots=not args.no_plots, progress=False, checkpoint=True)
    print(report.summary(results))
    for c in results["cases"]:
        print(f"  {c['family']:16s} {c['name']:22s} n={c['size']:>11,d}  median {c['median_s']} s  "
              f"ratio {c['ratio']}  labels/s {c.get('labels_per_s')}  {c.get('error', '')}", flush=True)
    print(f"[device_bench] wrote {out / 'results.json'}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
