"""The privacy account (rpwjax.accounting): every pipeline's entries add up, row by row, to the ε it claims.

:data:`CASES` is one table: every row of the registry :data:`rpwjax.pipelines.PIPELINES`, and ``auto`` on both
sides of its step 2 (a small ε on 1,500 rows takes the denoised branch, ε = 4 on 6,000 rows the unbiased
one), on its calibrated branch, and on the denoised branch's fallback (ε = 0.15 on 1,500 rows: a residual
histogram too noisy to read, a private mean bought with part of its ε₁). Each case runs the pipeline as it is
(no monkeypatching) and reads the account back from the record it returns, as a sidecar carries it.
"""

import json

import numpy as np
import pytest

from rpwjax import InputError
from rpwjax.accounting import Accounting, pack_parts, unpack_parts
from rpwjax.keys import Secret
from rpwjax.pipelines import PIPELINES
from helpers import slow_unless

LO, HI = 0.0, 5.0

# (registry row, rows, ε, the auto branch it must take, "+fallback" where step 3 must fall back, or None)
CASES = [("auto", 1500, 0.5, "denoised"), ("auto", 6000, 4.0, "unbiased"), ("auto", 400, 0.05, "calibrated"),
         ("auto", 1500, 0.15, "denoised+fallback"),
         *((name, 600, 1.0, None) for name in PIPELINES if name != "auto")]
FAST = [("linear-prior", 600, 1.0, None), ("rpwithprior+calibrated", 600, 1.0, None)]


def _data(seed, n):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    y = np.clip(2.0 + 0.9 * x[:, 0] - 0.5 * x[:, 1] + 0.4 * np.sin(2 * x[:, 2]) + 0.3 * rng.normal(size=n), LO, HI)
    return x, y


def test_every_registered_pipeline_is_in_the_table():
    assert {case[0] for case in CASES} == set(PIPELINES)


@pytest.mark.parametrize("name, rows, eps, branch", slow_unless(CASES, fast=FAST))
def test_every_rows_entries_add_up_to_the_claimed_epsilon(name, rows, eps, branch):
    x, y = _data(rows, rows)
    _, record = PIPELINES[name].run(x, y, LO, HI, eps, secret=Secret.from_seed(3), epochs=2)
    if branch is not None:
        taken, _, fallback = branch.partition("+")
        assert record["auto"]["plan"]["branch"] == taken
        assert (record["auto"]["plan"]["fallback"] is not None) == (fallback == "fallback")
    record = json.loads(json.dumps(record, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
    account = Accounting.from_json(record)
    assert account.rows == rows and record["epsilon"] == record["per_label_epsilon"] == eps
    assert record["delta"] == 0.0
    per_row_eps, per_row_delta = account.per_row()
    np.testing.assert_allclose(per_row_eps, eps, rtol=1e-12, atol=0)  # every row pays exactly the claim
    np.testing.assert_array_equal(per_row_delta, 0.0)
    purposes = [s.purpose for s in account.spends]
    assert "release" in purposes and purposes[-1] == "release"  # statistics first, then the labels
    assert ("fallback-mean" in purposes) == (branch == "denoised+fallback")
    for s in account.spends:
        assert s.epsilon > 0 and s.sensitivity and s.mechanism
    # the releases together read every row once
    released = np.zeros(rows, int)
    for s in account.spends:
        if s.purpose == "release":
            released += account.mask(s.rows)
    np.testing.assert_array_equal(released, 1)


def test_disjoint_parts_compose_in_parallel_and_an_overspend_is_refused():
    account = Accounting(6, 1.0)
    account.spend("mean", 0.25, sensitivity="s", mechanism="m")
    account.partition("half", np.array([0, 0, 0, 1, 1, 1]))
    for part in (0, 1):
        view = account.within("half", part)
        view.spend("release", 0.5)
        view.partition(f"pair-{part}", np.array([0, 0, 1]))  # a partition of the view's own rows
    account.within("half", 0).within("pair-0", 1).spend("extra", 0.25)
    np.testing.assert_array_equal(account.per_row()[0], [0.75, 0.75, 1.0, 0.75, 0.75, 0.75])
    assert account.partitions["pair-1"].tolist() == [-1, -1, -1, 0, 0, 1]
    with pytest.raises(RuntimeError, match="past the claimed"):
        account.within("half", 0).spend("again", 0.25 + 1e-6)
    assert len(account.spends) == 4  # the refused entry is not kept
    account.within("half", 0).within("pair-0", 0).spend("last", 0.25)  # rows 0 and 1 had room left
    account.within("half", 1).spend("last", 0.25)
    again = Accounting.from_json(json.loads(json.dumps(account.to_json())))
    assert again.spends == account.spends and again.to_json() == account.to_json()
    np.testing.assert_array_equal(again.per_row()[0], 1.0)
    with pytest.raises(InputError, match="no partition"):
        account.within("cells", 0)


def test_packed_partitions_round_trip():
    for parts in (np.array([0, 3, 1, -1]), np.arange(70_000) % 300, np.zeros(0, np.int64)):
        assert unpack_parts(pack_parts(parts), parts.size).tolist() == parts.tolist()


@pytest.mark.parametrize("mechanism, eps, delta, histogram", [("rpwithprior", 1.0, 0.0, True), ("laplace", 0.5, 0.0, False),
                                                               ("gaussian", 1.0, 1e-6, False)])
def test_a_mechanisms_file_release_and_its_ledger_line_carry_one_account(tmp_path, mechanism, eps, delta, histogram):
    """``privatize_file`` (the command's policy): the sidecar's account claims the release's ε and δ, the
    private histogram of an inline fit (when the mechanism has one) and the release read every row, and the
    ledger line copies the same entries."""
    import rpwjax

    y = np.random.default_rng(5).uniform(LO, HI, 400)
    src = tmp_path / "a.csv"
    src.write_text("y\n" + "\n".join(f"{v:.4f}" for v in y) + "\n")
    ledger = tmp_path / "book.jsonl"
    options = {"delta": delta} if delta else {}
    sidecar = rpwjax.privatize_file(src, tmp_path / "o.csv", label_column="y", mechanism=mechanism, epsilon=eps,
                                    range=(LO, HI), ledger=ledger, progress=False, **options)
    account = Accounting.from_json(sidecar["accounting"])
    assert (account.epsilon, account.delta, account.rows) == (eps, delta, y.size)
    per_row_eps, per_row_delta = account.per_row()
    np.testing.assert_allclose(per_row_eps, eps, rtol=1e-12, atol=0)
    np.testing.assert_allclose(per_row_delta, delta, rtol=1e-12, atol=0)
    assert [s.purpose for s in account.spends] == ["prior-histogram", "release"] if histogram else ["release"]
    line = json.loads(ledger.read_text().splitlines()[-1])
    assert [(s["purpose"], s["epsilon"]) for s in line["accounting"]["spends"]] == \
        [(s.purpose, s.epsilon) for s in account.spends]
