"""Params files are verified, not trusted (rpwjax.audit.verify; ``privatize --params``, ``audit --params``).

Honest files of every mechanism come from ``rpwjax fit --save`` with the default
private prior and a key file from ``rpwjax keygen``; the edited ones change a
field by hand, as anyone holding the file could. Consistent edits (every stated
field agrees, the guarantee holds) are caught by the refit: the parameters must
be what the fit gives for the saved prior and options.
"""

import copy
import contextlib
import io
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from rpwjax import api
from rpwjax import cli
from rpwjax.audit import verify
from rpwjax.errors import InputError
from helpers import fixed_key, run, slow_unless

MECHANISMS = list(api.MECHANISMS)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A directory with a key file, training labels and a small table; the saved fits are made on first use
    (:func:`saved_fit`: each from the key file or a seed, so the order of use does not change them)."""
    d = tmp_path_factory.mktemp("verify")
    fixed_key(d / "key")
    rng = np.random.default_rng(5)
    np.savetxt(d / "train.txt", rng.beta(2, 5, 3000))
    pacsv.write_csv(pa.table({"id": np.arange(500), "y": rng.beta(2, 5, 500)}), d / "small.csv")
    return d


def saved_fit(d, name):
    """The path of the saved fit ``name``: a mechanism (private prior, noise from the key file), "empirical"
    (RPWithPrior, empirical prior), "laplace-empirical" (Laplace under --prior empirical) or "seeded" (RR-on-Bins at ε = 2, seed 7); fitted the first time it is asked for."""
    path = d / f"{name}.json"
    if not path.exists():
        if name in ("empirical", "laplace-empirical"):
            mechanism = "laplace" if name == "laplace-empirical" else "rpwithprior"
            options = ["--mechanism", mechanism, "--epsilon", "1", "--prior", "empirical", "--prior-is-public"]
        elif name == "seeded":
            options = ["--mechanism", "rr-on-bins", "--epsilon", "2", "--seed", "7"]
        else:
            # each fit in a ledger of its own: the module's fits of one label file would otherwise print their
            # running total, and the tests read stderr line by line
            options = ["--mechanism", name, "--epsilon", "1", "--key-file", str(d / "key"),
                       "--ledger", str(d / f"{name}.ledger.jsonl")]
        # the fit's own report stays out of the output of the command a test is reading, whichever test fits first
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = cli.main(["fit", "--labels", str(d / "train.txt"), "--range", "0", "1", *options,
                             "--save", str(path)])
        assert code == 0
    return path


def record(d, name):
    return json.loads(saved_fit(d, name).read_text())


def write(tmp_path, rec, name="edited.json"):
    path = tmp_path / name
    path.write_text(json.dumps(rec))
    return path


def privatize(d, out, params_path, capsys, *extra):
    return run(["privatize", d / "small.csv", "-o", out, "--label-column", "y", "--params", params_path,
                "--key-file", d / "key", "--quiet", *extra], capsys)


def assert_refused(d, tmp_path, rec, capsys, *named):
    """privatize exits 2 with one line naming every string in ``named``, and writes nothing."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    path = write(tmp_path, rec)
    code, _, err = privatize(d, out_dir / "o.csv", path, capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and f"params file {str(path)!r} refused: " in err
    for text in named:
        assert text in err, (text, err)
    assert list(out_dir.iterdir()) == []  # no output, no sidecar, no temporary file
    return err


# --------------------------------------------------------------------------- honest files


@pytest.mark.parametrize("mechanism", slow_unless(MECHANISMS, fast=["laplace"]))
def test_honest_file_of_every_mechanism_verifies(saved, mechanism):
    rec = record(saved, mechanism)
    params, report = verify.verify_record(rec)
    assert params.name == mechanism and report["pass"] and report["problems"] == []
    assert report["checks"] == {"fields": True, "prior": True, "parameters": True, "refit": True, "exact": True,
                                "realized": True}
    assert report["refit"].startswith("refitted from the saved") and report["refit"].endswith("every parameter agrees")
    assert {k: report["accounting"][k] for k in ("epsilon", "epsilon_prior", "epsilon_mechanism", "delta")} == {
        k: rec[k] for k in ("epsilon", "epsilon_prior", "epsilon_mechanism", "delta")}
    eps2 = rec["epsilon_mechanism"]
    assert report["epsilon"] == rec["epsilon"] == 1.0 and report["epsilon_mechanism"] == eps2
    recomputed = report["epsilon_mechanism_recomputed"]
    assert recomputed <= eps2 + 1e-9 and recomputed == pytest.approx(eps2, rel=1e-6)
    if params.pure:
        assert report["delta"] == 0.0 and report["guarantee"] == "eps-DP"
        assert report["exact_max_log_ratio"] <= eps2 + 1e-9
        assert report["realized_max_log_ratio"] <= eps2 + 1e-6
    else:
        assert report["guarantee"] == "(eps, delta)-DP"
        assert report["delta_recomputed"] <= rec["delta"] * (1 + 1e-9)
        assert report["realized_delta"] <= rec["delta"]
    uses_prior = api.MECHANISMS[mechanism].uses_prior
    assert report["prior"] == ("private-histogram" if uses_prior else "none")
    assert (rec["epsilon_prior"] > 0) == uses_prior
    json.dumps(report, allow_nan=False)  # a sidecar-ready object


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_privatize_with_an_honest_file_reports_what_was_verified(saved, tmp_path, mechanism, capsys):
    out = tmp_path / "o.csv"
    code, _, err = privatize(saved, out, saved_fit(saved, mechanism), capsys)
    assert code == 0, err
    side = json.loads((tmp_path / "o.csv.json").read_text())
    rec = record(saved, mechanism)
    assert side["epsilon"] == rec["epsilon"] and side["params"] == rec["params"]
    verified = side["verified"]
    assert verified["pass"] is True and verified["verifier"] == "rpwjax.audit.verify.verify_record"
    assert verified["mechanism"] == mechanism and verified["epsilon_mechanism"] == rec["epsilon_mechanism"]
    assert all(verified["checks"].values())
    assert verified["epsilon_mechanism_recomputed"] <= rec["epsilon_mechanism"] + 1e-9
    key = "realized_max_log_ratio" if rec["pure_dp"] else "realized_delta"
    assert key in verified and "not_verifiable" in verified
    assert verified["output_range"] == side["output_range"]


@pytest.mark.slow
def test_seeded_fit_and_one_element_list_verify(saved):
    params, report = verify.verify_record([record(saved, "seeded")])
    assert params.name == "rr-on-bins" and report["epsilon"] == 2.0 and report["pass"]


@pytest.mark.slow
def test_empirical_prior_file_verifies_and_still_needs_prior_is_public(saved, tmp_path, capsys):
    _, report = verify.verify_record(record(saved, "empirical"))
    assert report["prior"] == "empirical" and report["epsilon_prior"] == 0.0
    # its parameters were fitted to the raw labels, which are not saved: nothing to refit from, said so
    assert report["checks"]["refit"] is None and "cannot be recomputed" in report["refit"]
    assert "only if" in report["conditional"] and "public" in report["not_verifiable"]
    code, _, err = privatize(saved, tmp_path / "o.csv", saved_fit(saved, "empirical"), capsys)
    assert code == 2 and "--prior-is-public" in err and not (tmp_path / "o.csv").exists()
    code, _, err = privatize(saved, tmp_path / "o.csv", saved_fit(saved, "empirical"), capsys, "--prior-is-public")
    assert code == 0, err
    assert json.loads((tmp_path / "o.csv.json").read_text())["verified"]["prior"] == "empirical"


# --------------------------------------------------------------------------- the cases of issue 15


def test_laplace_edited_to_epsilon_100_is_refused(saved, tmp_path, capsys):
    rec = record(saved, "laplace")
    assert rec["epsilon"] == 1.0
    rec["params"]["epsilon"], rec["params"]["scale"] = 100.0, 0.05
    api.load_params(rec)  # the mechanism's own validation alone lets it through
    with pytest.raises(InputError, match=r"params\.epsilon=100\.0 disagrees with epsilon_mechanism=1\.0"):
        verify.verify_record(rec)
    _, report = verify.check_record(rec)
    assert report["epsilon_mechanism_recomputed"] == pytest.approx(20.0)
    assert report["checks"]["parameters"] is False and report["checks"]["realized"] is False
    assert any("epsilon=100 on the range [0, 1] cannot be certified" in p for p in report["problems"])
    assert_refused(saved, tmp_path, rec, capsys, "params.epsilon=100.0", "epsilon_mechanism=1.0")


@pytest.mark.slow
def test_rpwithprior_edited_to_epsilon_5_is_refused(saved, tmp_path, capsys):
    rec = record(saved, "rpwithprior")
    eps2 = rec["epsilon_mechanism"]
    rec["params"]["epsilon"] = 5.0
    with pytest.raises(InputError, match=rf"params\.epsilon=5\.0 disagrees with epsilon_mechanism={eps2!r}"):
        verify.verify_record(rec)
    _, report = verify.check_record(rec)
    assert report["exact_max_log_ratio"] == pytest.approx(5.0) and report["realized_max_log_ratio"] > 4.9
    assert any(p.startswith("params.gamma=") for p in report["problems"])  # the saved gamma disagrees too
    assert_refused(saved, tmp_path, rec, capsys, "params.epsilon=5.0", f"epsilon_mechanism={eps2!r}")


@pytest.mark.slow
def test_gaussian_edited_to_pure_is_refused(saved, tmp_path, capsys):
    rec = record(saved, "gaussian")
    rec["pure_dp"], rec["delta"] = True, 0.0
    with pytest.raises(InputError, match=r"pure_dp=True disagrees with the gaussian mechanism.*pure_dp=False"):
        verify.verify_record(rec)
    _, report = verify.check_record(rec)
    assert any(p == "delta=0.0 disagrees with params.delta=1e-05" for p in report["problems"])
    err = assert_refused(saved, tmp_path, rec, capsys, "pure_dp=True", "delta=0.0 disagrees with params.delta=1e-05")
    assert "(epsilon, delta)-DP" in err


@pytest.mark.slow
def test_parameters_less_private_than_stated_are_refused_by_recomputation(saved, tmp_path, capsys):
    # an unbiased randomizer's matrix is not validated when read: only the recomputation sees the edit
    rec = record(saved, "unbiased")
    q = np.asarray(rec["params"]["probabilities"])
    column = int(np.argmax(q[0]))
    q[0, column] *= 20
    q[0] /= q[0].sum()
    rec["params"]["probabilities"] = q.tolist()
    eps2 = rec["epsilon_mechanism"]
    with pytest.raises(InputError, match=rf"the parameters are [0-9.]+-DP .* less private than epsilon_mechanism="
                                         rf"{eps2!r}"):
        verify.verify_record(rec)
    _, report = verify.check_record(rec)
    assert report["epsilon_mechanism_recomputed"] > eps2 + 1
    assert report["checks"]["exact"] is False and report["checks"]["realized"] is False
    assert_refused(saved, tmp_path, rec, capsys, "less private than epsilon_mechanism")


def test_consistent_claim_whose_parameters_are_not_the_fit_is_refused(saved):
    # every stated field says 100 and the parameters are 20-DP, which the guarantee alone would let through; but
    # a Laplace fit at epsilon 100 has scale 0.01, not 0.05: these parameters were not fitted to what the file says
    rec = record(saved, "laplace")
    rec["epsilon"] = rec["epsilon_mechanism"] = rec["params"]["epsilon"] = 100.0
    rec["params"]["scale"] = 0.05
    with pytest.raises(InputError, match=r"params\.scale=0\.05 is not what the laplace fit gives for the saved prior "
                                         r"and options \(scale=0\.01\)"):
        verify.verify_record(rec)
    _, report = verify.check_record(rec)
    assert report["epsilon_mechanism_recomputed"] == pytest.approx(20.0) and report["checks"]["parameters"] is True
    assert report["checks"]["refit"] is False


# --------------------------------------------------------------------------- every field


def _edit(saved, name, change):
    rec = record(saved, name)
    change(rec)
    return rec


def _set(path, value):
    def change(rec):
        target = rec
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _prior_none(rec):
    rec["prior"] = {"kind": "none", "bins": None}
    rec["epsilon"], rec["epsilon_prior"] = rec["epsilon_mechanism"], 0.0


def _private_prior_for_free(rec):
    rec["epsilon"], rec["epsilon_prior"] = rec["epsilon_mechanism"], 0.0


def _empirical_that_costs(rec):
    rec["epsilon"], rec["epsilon_prior"] = rec["epsilon_mechanism"] + 0.1, 0.1


FIELD_EDITS = [
    ("laplace", _set(["epsilon"], 2.0), r"epsilon=2\.0 disagrees with epsilon_prior \+ epsilon_mechanism"),
    ("rpwithprior", _set(["epsilon_prior"], 0.2), r"epsilon=1\.0 disagrees with epsilon_prior \+ epsilon_mechanism = "
                                                  r"0\.2 \+ 0\.9"),
    ("laplace", _set(["epsilon_mechanism"], 0.5), r"epsilon=1\.0 disagrees with epsilon_prior \+ epsilon_mechanism"),
    ("staircase", _set(["params", "epsilon"], 1.5), r"params\.epsilon=1\.5 disagrees with epsilon_mechanism=1\.0"),
    ("rr-on-bins", _set(["params", "epsilon"], 3.0), r"params\.epsilon=3\.0 disagrees with epsilon_mechanism=0\.9"),
    ("laplace", _set(["range"], [0.0, 2.0]), r"range=\[0\.0, 2\.0\] disagrees with \[params\.lo, params\.hi\]="
                                             r"\[0\.0, 1\.0\]"),
    ("laplace", _set(["pure_dp"], False), r"pure_dp=False disagrees with the laplace mechanism, which is pure"),
    ("staircase", _set(["delta"], 1e-5), r"delta=1e-05 disagrees with the staircase mechanism, which is pure"),
    ("gaussian", _set(["delta"], 1e-3), r"delta=0\.001 disagrees with params\.delta=1e-05"),
    ("gaussian", _set(["pure_dp"], True), r"pure_dp=True disagrees with the gaussian mechanism"),
    ("rpwithprior", _private_prior_for_free, r"prior\.kind='private-histogram' costs privacy, but epsilon_prior=0\.0"),
    ("empirical", _empirical_that_costs, r"prior\.kind='empirical' spends no privacy budget, but epsilon_prior=0\.1"),
    ("rr-on-bins", _prior_none, r"prior\.kind='none' disagrees with mechanism='rr-on-bins'"),
    ("unbiased", _set(["prior", "bins"], 16), r"prior\.bins=16 disagrees with the 32 saved prior\.masses"),
    ("rpwithprior", _set(["prior", "kind"], "public"), r"prior\.kind must be one of .*got prior\.kind='public'"),
    ("rpwithprior", _set(["params", "gamma"], 0.5), r"params\.gamma=0\.5 disagrees with 2\*zeta"),
    ("laplace", _set(["epsilon"], "1"), r"epsilon must be a finite number, got epsilon='1'"),
    ("laplace", lambda rec: rec.pop("epsilon_mechanism"), r"field 'epsilon_mechanism' is missing"),
    ("gaussian", lambda rec: rec.pop("delta"), r"field 'delta' is missing"),
    ("laplace", _set(["params", "scale"], 0.5), r"Laplace scale must be at least"),
    ("laplace", _set(["prior"], None), r"prior must be an object with a 'kind', got prior=None"),
]


@pytest.mark.parametrize("name, change, message", slow_unless(  # the fast subset: the edits of a Laplace file
    FIELD_EDITS, fast=[e for e in FIELD_EDITS if e[0] == "laplace"], ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(FIELD_EDITS)]))
def test_each_field_inconsistency_is_refused_naming_the_field(saved, name, change, message):
    rec = _edit(saved, name, change)
    with pytest.raises(InputError, match=message):
        verify.verify_record(rec)
    _, report = verify.check_record(copy.deepcopy(rec), exact=False, realized=False)
    assert report["pass"] is False and report["problems"]


# --------------------------------------------------------------------------- the refit: consistent edits


def _times(path, factor):
    def change(rec):
        target = rec
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = (np.asarray(target[path[-1]]) * factor).tolist()

    return change


def _rpwithprior_a1(rec):  # A1 moved and gamma kept consistent with it: only the refit sees it
    p = rec["params"]
    p["A1"] = p["A1"] / 2
    p["gamma"] = 2 * p["zeta"] + math.exp(-p["epsilon"]) * (p["A2"] - p["A1"])


def _swapped_prior_masses(rec):  # the parameters of another prior (the histogram reversed) under this one
    rec["prior"]["masses"] = rec["prior"]["masses"][::-1]


def _outputs_shifted(rec):
    rec["params"]["outputs"] = (np.asarray(rec["params"]["outputs"]) + 0.01).tolist()


def _extra_field(rec):
    rec["params"]["note"] = "raw labels: 0.31 0.27"


REFIT_EDITS = [  # (saved fit, edit, the parameter the refusal names)
    ("laplace", _set(["params", "scale"], 1.5), r"params\.scale=1\.5 is not what the laplace fit gives .*scale=1\.0"),
    ("laplace-empirical", _set(["params", "scale"], 1.5), r"params\.scale=1\.5 is not what the laplace fit gives"),
    ("laplace", _set(["label_mse"], 3.0), r"label_mse=3\.0 is not what the fit gives for the saved prior \(2\.0\)"),
    ("laplace", _extra_field, r"params\.note='raw labels: 0\.31 0\.27' is not a field the laplace fit gives"),
    ("gaussian", _times(["params", "sigma"], 2.0), r"params\.sigma=7\.46.* is not what the gaussian fit gives .*"
                                                   r"\(sigma=3\.73"),
    ("staircase", _set(["params", "gamma"], 0.3), r"params\.gamma=0\.3 is not what the staircase fit gives"),
    ("rpwithprior", _rpwithprior_a1, r"params\.A1=.* is not what the rpwithprior fit gives for the saved prior "
                                     r"and options \(A1="),
    ("rpwithprior", _swapped_prior_masses, r"params\.A1=.* is not what the rpwithprior fit gives"),
    ("rr-on-bins", _outputs_shifted, r"params\.outputs\[0\]=.* is not what the rr-on-bins fit gives .*"
                                     r"\(outputs\[0\]="),
    ("unbiased", _swapped_prior_masses, r"params\.outputs\[0\]=.* is not what the unbiased fit gives"),
]


@pytest.mark.parametrize("name, change, message", slow_unless(
    REFIT_EDITS, fast=[e for e in REFIT_EDITS if e[0] == "laplace"], ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(REFIT_EDITS)]))
def test_parameters_that_are_not_the_fit_of_the_saved_prior_are_refused(saved, name, change, message):
    rec = _edit(saved, name, change)
    with pytest.raises(InputError, match=message) as err:
        verify.verify_record(rec)
    assert "\n" not in str(err.value)  # one line, whatever the shape of the parameter
    _, report = verify.check_record(copy.deepcopy(rec), exact=False, realized=False)
    assert report["pass"] is False and report["checks"]["refit"] is False


@pytest.mark.slow
def test_honest_fits_refit_to_the_same_parameters(saved):
    # private histograms whose masses do not sum to exactly 1 in float64 (the first two seeds that give one): the
    # refit must use the saved masses as written, or the interval search moves A1 and A2 in the 8th digit
    labels = np.random.default_rng(0).beta(2, 5, 5000)
    found = 0
    for seed in range(400):
        rec = json.loads(json.dumps(api.fit("rpwithprior", labels, range=(0, 1), epsilon=1.0, seed=seed).records()[0]))
        if abs(sum(rec["prior"]["masses"]) - 1) == 0:
            continue
        assert verify.check_record(rec, exact=False, realized=False)[1]["checks"]["refit"] is True
        found += 1
        if found == 2:
            break
    assert found == 2
    # one record of a fit over an epsilon grid (Unbiased pads every epsilon to the same number of outputs)
    for mechanism in ("unbiased", "rr-on-bins"):
        for rec in api.fit(mechanism, labels, range=(0, 1), epsilon=[0.5, 1.0, 2.0], seed=3).records():
            _, report = verify.check_record([json.loads(json.dumps(rec))], exact=False, realized=False)
            assert report["pass"], report["problems"]


def test_refit_refusal_through_the_cli_names_the_file_and_the_parameter(saved, tmp_path, capsys):
    rec = _edit(saved, "laplace", _set(["params", "scale"], 1.5))
    assert_refused(saved, tmp_path, rec, capsys, "params.scale=1.5 is not what the laplace fit gives", "scale=1.0")


def test_what_is_released_and_published_is_the_refit_not_the_file(saved, tmp_path, capsys):
    # numbers within the refit tolerance pass, but none of their low bits, nor a stray field, reaches the release
    rec = record(saved, "laplace")
    rec["params"]["scale"] = 1.0 + 1e-12
    rec["label_mse"] = 2.0 * (1 + 1e-12)
    rec["notes"] = "raw labels: 0.31 0.27"
    params, report = verify.verify_record(rec)
    assert report["pass"] and float(params.scale) == 1.0
    out = tmp_path / "o.csv"
    code, _, err = privatize(saved, out, write(tmp_path, rec), capsys)
    assert code == 0, err
    side = json.loads((tmp_path / "o.csv.json").read_text())
    assert side["params"]["scale"] == 1.0 and side["label_mse"] == 2.0 and "notes" not in side
    assert side["epsilon"] == side["verified"]["accounting"]["epsilon"] == 1.0


def test_laplace_under_an_empirical_prior_is_still_refitted(saved):
    _, report = verify.verify_record(record(saved, "laplace-empirical"))
    assert report["checks"]["refit"] is True and "no prior used" in report["refit"]
    assert report["prior"] == "empirical" and "only if" in report["conditional"]


def _histogram_for_free(rec):
    """A private-histogram fit relabelled as a public histogram: nothing spent on it, ε = ε₂ claimed."""
    rec["prior"]["kind"], rec["prior"]["bins"] = "histogram", None
    rec["epsilon"], rec["epsilon_prior"] = rec["epsilon_mechanism"], 0.0


def test_a_histogram_with_no_accounted_release_is_a_public_prior(saved, tmp_path, capsys):
    rec = _edit(saved, "rr-on-bins", _histogram_for_free)
    _, report = verify.verify_record(rec)  # the parameters are the fit of that histogram: they verify
    assert report["prior"] == "histogram" and "only if the histogram prior is public" in report["conditional"]
    assert report["accounting"]["epsilon"] == report["accounting"]["epsilon_mechanism"] == 0.9
    path = write(tmp_path, rec)
    out = tmp_path / "o.csv"
    code, _, err = privatize(saved, out, path, capsys)
    assert code == 2 and err.count("\n") == 1 and not out.exists(), err
    assert f"params file {str(path)!r} was fitted on prior.kind='histogram'" in err and "--prior-is-public" in err
    code, _, err = privatize(saved, out, path, capsys, "--prior-is-public")
    assert code == 0, err
    side = json.loads((tmp_path / "o.csv.json").read_text())
    assert side["epsilon"] == 0.9 and side["epsilon_prior"] == 0.0 and side["prior"]["kind"] == "histogram"
    assert "--prior-is-public" in side["prior_is_public"] and "only if" in side["prior_is_public"]
    assert "only if" in side["verified"]["conditional"]


@pytest.mark.slow
def test_an_empirical_fit_relabelled_as_a_histogram_prior_is_refused(saved, tmp_path, capsys):
    # A1 and A2 of the empirical fit are raw labels; relabelled as a histogram (or as the private one of another
    # fit) the refit from that histogram gives other parameters
    rec = record(saved, "empirical")
    private = record(saved, "rpwithprior")
    for kind, eps1 in (("histogram", 0.0), ("private-histogram", 0.1)):
        rec["prior"] = dict(private["prior"], kind=kind, bins=private["prior"]["bins"] if eps1 else None)
        rec["epsilon_prior"], rec["epsilon"] = eps1, rec["epsilon_mechanism"] + eps1
        with pytest.raises(InputError, match=r"params\.A[12]=.* is not what the rpwithprior fit gives"):
            verify.verify_record(rec)
    assert_refused(saved, tmp_path, rec, capsys, "is not what the rpwithprior fit gives for the saved prior")


@pytest.mark.slow
def test_prior_edges_off_the_range_are_refused(saved):
    rec = record(saved, "rpwithprior")
    rec["prior"]["edges"] = (np.asarray(rec["prior"]["edges"]) * 2).tolist()
    with pytest.raises(InputError, match=r"prior\.edges span \[0\.0, 2\.0\], range is \[0\.0, 1\.0\]"):
        verify.verify_record(rec)


def test_field_refusals_through_the_cli(saved, tmp_path, capsys):
    rec = _edit(saved, "laplace", _set(["range"], [0.0, 2.0]))
    assert_refused(saved, tmp_path, rec, capsys, "range=[0.0, 2.0]", "[params.lo, params.hi]=[0.0, 1.0]")


def test_not_a_record_is_still_an_input_error(tmp_path):
    with pytest.raises(InputError, match="not an rpwjax fit record"):
        verify.verify_record({"hello": 1})
    with pytest.raises(InputError, match="exactly one fit"):
        verify.verify_record([])


@pytest.mark.slow
def test_report_is_json_without_infinities(saved):
    rec = record(saved, "unbiased")
    q = np.asarray(rec["params"]["probabilities"])
    used = np.flatnonzero(q.max(axis=0) > 0)
    q[0, used[len(used) // 2]] = 0.0  # one row can no longer emit an output the others can: an infinite ratio
    q[0] /= q[0].sum()
    rec["params"]["probabilities"] = q.tolist()
    _, report = verify.check_record(rec)
    assert report["epsilon_mechanism_recomputed"] == "inf" and not report["pass"]
    json.dumps(report, allow_nan=False)
    assert math.isinf(float(report["epsilon_mechanism_recomputed"]))


# --------------------------------------------------------------------------- rpwjax audit --params


@pytest.mark.slow
@pytest.mark.usefixtures("fewer_fresh_labels")
def test_audit_params_passes_on_an_honest_file(saved, capsys):
    code, out, err = run(["audit", "--params", saved_fit(saved, "rr-on-bins"), "--samples", "20000"], capsys)
    assert code == 0, out + err
    assert "rr-on-bins" in out and "claimed eps" in out and "verified: yes" in out and " NO" not in out
    code, out, err = run(["audit", "--params", saved_fit(saved, "gaussian"), "--samples", "20000", "--json"], capsys)
    assert code == 0, out + err
    (line,) = [json.loads(x) for x in out.splitlines()]
    assert line["pass"] is True and line["record_pass"] is True and line["record_problems"] == []
    assert line["verified"]["checks"]["realized"] is True and line["mechanism"] == "gaussian"


@pytest.mark.slow
@pytest.mark.usefixtures("fewer_fresh_labels")
def test_audit_params_fails_on_an_edited_file(saved, tmp_path, capsys):
    rec = record(saved, "rpwithprior")
    eps2 = rec["epsilon_mechanism"]
    rec["params"]["epsilon"] = 5.0
    path = write(tmp_path, rec)
    code, out, _ = run(["audit", "--params", path, "--samples", "20000"], capsys)
    assert code == 1
    assert f"record: params.epsilon=5.0 disagrees with epsilon_mechanism={eps2!r}" in out
    assert "verified: NO" in out and " NO" in out.splitlines()[2]  # the table row, judged at the stated epsilon
    code, out, _ = run(["audit", "--params", path, "--samples", "20000", "--json"], capsys)
    (line,) = [json.loads(x) for x in out.splitlines()]
    assert code == 1 and line["pass"] is False and line["record_pass"] is False
    assert line["epsilon"] == eps2 and line["exact_pass"] is False and line["realized_pass"] is False


def test_audit_params_reports_a_file_whose_parameters_do_not_parse(saved, tmp_path, capsys):
    rec = _edit(saved, "laplace", _set(["params", "scale"], 0.5))
    code, out, _ = run(["audit", "--params", write(tmp_path, rec), "--samples", "1000"], capsys)
    assert code == 1 and "record: params file for laplace" in out and "Laplace scale must be at least" in out


def test_audit_params_argument_errors(saved, tmp_path, capsys):
    code, _, err = run(["audit", "--params", saved_fit(saved, "laplace"), "--mechanism", "laplace"], capsys)
    assert code == 2 and "either --params FILE or --mechanism/--epsilon" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    code, _, err = run(["audit", "--params", bad], capsys)
    assert code == 2 and "not an rpwjax fit record" in err
