"""Combine the paper-setting sweep (results/<data set>/results.csv) with the beyond-the-paper sweep
(results/beyond/<data set>/results.csv): plots/beyond/<data set>_curves.png and results/beyond/target.md.

Both sweeps use the same protocol, split and seeds; the beyond sweep reruns plain RPWithPrior, and its
rows must match the committed ones (a check that the two runs are comparable).

    python scripts/beyond_report.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from rpwjax import api
from rpwjax.experiments.sweeps import format_target_table, read_rows, summarize, target_table
from rpwjax.experiments.plots import plot_curves

ROOT = Path(__file__).resolve().parents[1]
MAX_EPSILON = 2.0


def main() -> int:
    combined = []
    for dataset in ("california", "crime"):
        paper = [r for r in read_rows(ROOT / "results" / dataset / "results.csv") if r["epsilon"] <= MAX_EPSILON
                 or r["mechanism"] == "non-private"]
        beyond = read_rows(ROOT / "results" / "beyond" / dataset / "results.csv")
        # the rerun of plain RPWithPrior must reproduce the committed cells (same noisy labels)
        committed = {(r["epsilon"], r["seed"]): r for r in paper if r["mechanism"] == "rpwithprior"}
        for r in beyond:
            if r["mechanism"] == "rpwithprior":
                c = committed[(r["epsilon"], r["seed"])]
                if not np.isclose(r["label_mse"], c["label_mse"], rtol=1e-9):
                    raise SystemExit(f"{dataset}: rpwithprior eps={r['epsilon']} seed={r['seed']} differs from the committed sweep")
        combined += paper + [r for r in beyond if r["mechanism"] not in api.MECHANISMS and r["mechanism"] != "non-private"]
    paths = plot_curves(combined, ROOT / "plots" / "beyond")
    table = format_target_table(target_table(summarize(combined), max_epsilon=MAX_EPSILON))
    (ROOT / "results" / "beyond" / "target.md").write_text(table + "\n")
    print(table)
    for p in paths:
        print(f"plot: {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
