"""Fit once, save, privatize files with --params: outputs at the two ends of the range stay within ε.

The whole shipped path is exercised (JSON params, streaming, blocks, output grid),
and the empirical privacy loss is bounded below with Clopper-Pearson intervals
(Bonferroni over all bins, 99.9% joint confidence): the bound must not exceed ε.
"""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rpwjax import api, cli
from rpwjax.audit.empirical import clopper_pearson
from helpers import fixed_key, slow_unless

N = 200_000
EPSILON = 1.0


def _bins(outputs, params, discrete, output_range):
    """Distinct outputs, or 40 bins over [lo - W, hi + W] cut to the release's public output range: a fit
    whose outputs all lie in a narrow interval (a private prior can give RPWithPrior [A1 - ζ, A2 + ζ] of width
    0.07) would otherwise fall in one or two bins and the test would lose its power."""
    if discrete:
        return np.unique(outputs)
    lo, hi = params.lo, params.hi
    width = hi - lo
    return np.linspace(max(lo - width, output_range[0]), min(hi + width, output_range[1]), 41)


def _empirical_lower_bound(a, b, edges, discrete, delta):
    if discrete:
        ca = np.array([(a == v).sum() for v in edges])
        cb = np.array([(b == v).sum() for v in edges])
    else:
        # 40 bins plus the two tails
        ca = np.histogram(a, np.concatenate([[-np.inf], edges, [np.inf]]))[0]
        cb = np.histogram(b, np.concatenate([[-np.inf], edges, [np.inf]]))[0]
    alpha = 1e-3 / (2 * len(ca))
    best = 0.0
    for x, y in ((ca, cb), (cb, ca)):
        lower = np.array([clopper_pearson(k, N, alpha)[0] for k in x])
        upper = np.array([clopper_pearson(k, N, alpha)[1] for k in y])
        ok = (lower - delta) > 0
        if ok.any():
            best = max(best, float(np.max(np.log((lower[ok] - delta) / upper[ok]))))
    return best


@pytest.fixture(scope="module")
def two_ends(tmp_path_factory):
    d = tmp_path_factory.mktemp("ends")
    labels = np.concatenate([np.zeros(N), np.ones(N)])
    pq.write_table(pa.table({"row": np.arange(2 * N), "y": labels}), d / "ends.parquet")
    train = np.random.default_rng(1).beta(2, 5, 3000)
    np.savetxt(d / "train.txt", train)
    fixed_key(d / "key")
    return d


@pytest.mark.parametrize("mechanism", slow_unless(list(api.MECHANISMS), fast=["laplace"]))
def test_saved_fit_applied_to_range_ends_stays_within_epsilon(two_ends, mechanism, capsys):
    d = two_ends
    params_path = d / f"{mechanism}.json"
    # the default private prior: its histogram noise, like the release, comes from the key file
    assert cli.main(["fit", "--labels", str(d / "train.txt"), "--range", "0", "1", "--mechanism", mechanism,
                     "--epsilon", str(EPSILON), "--key-file", str(d / "key"), "--save", str(params_path)]) == 0
    out = d / f"{mechanism}-out.parquet"
    assert cli.main(["privatize", str(d / "ends.parquet"), "-o", str(out), "--label-column", "y",
                     "--key-file", str(d / "key"), "--params", str(params_path), "--quiet",
                     "--chunk-rows", "150000"]) == 0
    capsys.readouterr()
    noisy = pq.read_table(out).column("y").to_numpy()
    record = json.loads(params_path.read_text())
    assert record["epsilon"] == EPSILON  # the total, histogram included
    params, _ = api.load_params(record)
    side = json.loads((d / f"{mechanism}-out.parquet.json").read_text())
    assert side["output_range"][0] <= noisy.min() and noisy.max() <= side["output_range"][1]
    at_lo, at_hi = noisy[:N], noisy[N:]
    edges = _bins(noisy, params, params.discrete, side["output_range"])
    bound = _empirical_lower_bound(at_lo, at_hi, edges, params.discrete, record["delta"])
    assert bound <= EPSILON, f"{mechanism}: empirical privacy loss lower bound {bound:.3f} > {EPSILON}"
    if mechanism in ("laplace", "rpwithprior", "rr-on-bins", "staircase"):
        assert bound > 0.5 * EPSILON  # the test has power: the loss is really measured
