"""The command line contract: fit, privatize, errors, no partial output.

Reproducible runs use key files from ``rpwjax keygen`` (``--key-file``); runs whose
randomness does not matter to the test use fresh OS entropy (no key option).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from rpwjax import cli, posterior_mean
from rpwjax.privatize import load_release_params
from helpers import fixed_key, json_lines, run, slow_unless


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    fixed_key(d / "key", 0)
    fixed_key(d / "other-key", 1)
    rng = np.random.default_rng(0)
    n = 5000
    table = pa.table({
        "id": np.arange(n),
        "name": [f"row{i}" for i in range(n)],
        "value": rng.beta(2, 5, n),
        "x": rng.normal(size=n),
    })
    pq.write_table(table, d / "t.parquet")
    pacsv.write_csv(table, d / "t.csv")
    np.savetxt(d / "labels.txt", table.column("value").to_numpy())
    return d, table


def test_fit_json_has_the_contract_fields(files, capsys):
    d, _ = files
    code, out, _ = run(["fit", "--labels", str(d / "t.csv"), "--label-column", "value", "--range", "0", "1",
                        "--mechanism", "rpwithprior", "--epsilon", "0.5", "1", "2", "--zeta", "0.05", "--json"], capsys)
    assert code == 0
    records = json_lines(out)
    assert [r["epsilon"] for r in records] == [0.5, 1.0, 2.0]
    for r in records:
        assert {"mechanism", "epsilon", "epsilon_prior", "epsilon_mechanism", "delta", "range", "params", "label_mse"} <= set(r)
        assert r["range"] == [0.0, 1.0] and r["delta"] == 0.0
        assert {"A1", "A2", "zeta", "gamma", "objective", "preservation"} <= set(r["params"])
        assert 0 <= r["params"]["A1"] <= r["params"]["A2"] <= 1


def test_fit_reads_text_and_parquet_labels_alike(files, capsys):
    d, _ = files
    # the empirical prior is a function of the labels read and nothing else (two fits are two releases: a private
    # histogram would draw independent noise for each)
    common = ["--range", "0", "1", "--mechanism", "rpwithprior", "--epsilon", "1", "--zeta", "0.05", "--json",
              "--prior", "empirical", "--prior-is-public"]
    _, a, _ = run(["fit", "--labels", str(d / "labels.txt"), *common], capsys)
    _, b, _ = run(["fit", "--labels", str(d / "t.parquet"), "--label-column", "value", *common], capsys)
    assert json_lines(a)[0]["prior"]["kind"] == "empirical"
    ra, rb = json_lines(a)[0]["params"], json_lines(b)[0]["params"]
    assert ra["A1"] == pytest.approx(rb["A1"], abs=1e-12) and ra["A2"] == pytest.approx(rb["A2"], abs=1e-12)


@pytest.mark.slow
def test_private_prior_reports_split(files, capsys):
    d, _ = files
    code, out, _ = run(["fit", "--labels", str(d / "labels.txt"), "--range", "0", "1", "--mechanism", "rpwithprior",
                        "--epsilon", "1", "2", "--prior", "private", "--prior-epsilon", "0.25", "--bins", "20",
                        "--key-file", str(d / "key"), "--json"], capsys)
    assert code == 0
    for r in json_lines(out):
        assert r["epsilon_prior"] == 0.25 and r["epsilon_mechanism"] == pytest.approx(r["epsilon"] - 0.25)
        assert r["prior"]["kind"] == "private-histogram" and r["prior"]["bins"] == 20
        assert len(r["prior"]["masses"]) == 20 and sum(r["prior"]["masses"]) == pytest.approx(1.0)


@pytest.mark.parametrize("fmt", slow_unless(["csv", "parquet"], fast=["csv"]))
def test_privatize_with_saved_params_keeps_rows_columns_and_order(files, tmp_path, capsys, fmt):
    d, table = files
    params = tmp_path / "p.json"
    code, _, _ = run(["fit", "--labels", str(d / "labels.txt"), "--range", "0", "1", "--mechanism", "rpwithprior",
                      "--epsilon", "1", "--save", str(params)], capsys)
    assert code == 0
    out = tmp_path / f"o.{fmt}"
    code, _, err = run(["privatize", str(d / f"t.{fmt}"), "-o", str(out), "--label-column", "value",
                        "--key-file", str(d / "key"), "--params", str(params), "--quiet"], capsys)
    assert code == 0, err
    got = pq.read_table(out) if fmt == "parquet" else pacsv.read_csv(out)
    assert got.column_names == table.column_names
    assert got.num_rows == table.num_rows
    for name in ("id", "name", "x"):
        assert got.column(name).to_pylist() == table.column(name).to_pylist()
    noisy = got.column("value").to_numpy()
    true = table.column("value").to_numpy()
    assert not np.any(noisy == true)  # the true labels are not written
    rec = json.loads(params.read_text())
    lo_support = rec["params"]["A1"] - rec["params"]["zeta"]
    hi_support = rec["params"]["A2"] + rec["params"]["zeta"]
    assert noisy.min() >= lo_support - 1e-12 and noisy.max() <= hi_support + 1e-12
    side_text = (tmp_path / f"o.{fmt}.json").read_text()
    side = json.loads(side_text)
    assert side["rows"] == table.num_rows and side["params"] == rec["params"]
    key_hex = (d / "key").read_text().strip()
    assert key_hex not in side_text and key_hex.upper() not in side_text  # the secret never reaches the sidecar
    assert side["reproducible_seed"] is False
    a, b = side["output_range"]
    assert a <= noisy.min() and noisy.max() <= b
    step = side["output_grid"]
    assert step > 0 and np.log2(step) == np.round(np.log2(step))  # a power of two
    np.testing.assert_array_equal(np.round(noisy / step) * step, noisy)  # low bits carry nothing


def test_privatize_is_independent_of_chunk_size_and_reproducible(files, tmp_path, capsys):
    d, _ = files
    outs = []
    for chunk in (5000, 777, 65536):
        out = tmp_path / f"o{chunk}.parquet"
        again = ["--release-id", json.loads((tmp_path / "o5000.parquet.json").read_text())["release_id"]] if outs else []
        code, _, err = run(["privatize", str(d / "t.parquet"), "-o", str(out), "--label-column", "value",
                            "--key-file", str(d / "key"), *again,
                            "--mechanism", "rpwithprior", "--epsilon", "1", "--range", "0", "1", "--zeta", "0.05",
                            "--chunk-rows", str(chunk), "--quiet"], capsys)
        assert code == 0, err
        outs.append(pq.read_table(out).column("value").to_numpy())
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    other = tmp_path / "other.parquet"
    assert run(["privatize", str(d / "t.parquet"), "-o", str(other), "--label-column", "value",
                "--key-file", str(d / "other-key"), "--mechanism", "rpwithprior", "--epsilon", "1", "--range", "0", "1",
                "--zeta", "0.05", "--quiet"], capsys)[0] == 0
    assert not np.array_equal(pq.read_table(other).column("value").to_numpy(), outs[0])


def _bad_table(tmp_path, values, fmt="csv"):
    path = tmp_path / f"bad.{fmt}"
    t = pa.table({"id": np.arange(len(values)), "value": pa.array(values, pa.float64())})
    (pq.write_table if fmt == "parquet" else pacsv.write_csv)(t, path)
    return path


@pytest.mark.parametrize(
    "values, extra, message",
    [
        # the 1-based data row and the physical line (the header is line 1)
        ([0.1, float("nan"), 0.3], [], "label nan in column 'value' is not a finite number, at data row 2 (line 3)"),
        ([0.1, 0.2, 7.0], [], "label 7.0 in column 'value' lies outside the public range [0.0, 1.0], at data row 3 "
                              "(line 4)"),
        ([0.1, 0.2], ["--epsilon", "0"], "epsilon=0.0"),
        ([0.1, 0.2], ["--epsilon", "-2"], "epsilon=-2.0"),
        ([0.1, 0.2], ["--zeta", "0"], "zeta=0.0"),
        ([0.1, 0.2], ["--range", "1", "0"], "lo=1.0, hi=0.0"),
        ([0.1, 0.2], ["--prior", "private", "--prior-epsilon", "1.5"], "prior_epsilon=1.5"),
        ([], [], "has no rows"),
    ],
)
def test_privatize_bad_input_fails_cleanly_with_no_output(tmp_path, capsys, values, extra, message):
    src = _bad_table(tmp_path, values)
    out = tmp_path / "out.csv"
    argv = ["privatize", str(src), "-o", str(out), "--label-column", "value", "--mechanism", "rpwithprior", "--quiet"]
    defaults = {"--epsilon": ["1"], "--range": ["0", "1"]}
    for flag, val in defaults.items():
        if flag not in extra:
            argv += [flag, *val]
    code, _, err = run(argv + extra, capsys)
    assert code != 0
    assert message in err and err.count("\n") == 1
    assert not out.exists() and not (tmp_path / "out.csv.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == [src.name]  # no temporary leftovers either


def test_nan_in_parquet_is_named(tmp_path, capsys):
    src = _bad_table(tmp_path, [0.1, float("nan")], "parquet")
    out = tmp_path / "o.parquet"
    code, _, err = run(["privatize", str(src), "-o", str(out), "--label-column", "value",
                        "--mechanism", "rpwithprior", "--epsilon", "1", "--range", "0", "1", "--quiet"], capsys)
    assert code == 2 and "label nan in column 'value' is not a finite number, at data row 2 of" in err
    assert not out.exists()


def test_bad_value_in_a_late_chunk_leaves_no_output(tmp_path, capsys, files):
    d, _ = files
    params = tmp_path / "p.json"
    run(["fit", "--labels", str(d / "labels.txt"), "--range", "0", "1", "--mechanism", "rpwithprior", "--epsilon", "1",
         "--save", str(params)], capsys)
    values = list(np.linspace(0, 1, 3000)) + [2.0]
    src = _bad_table(tmp_path, values, "parquet")
    out = tmp_path / "out.parquet"
    code, _, err = run(["privatize", str(src), "-o", str(out), "--label-column", "value",
                        "--params", str(params), "--chunk-rows", "1000", "--quiet"], capsys)
    assert code == 2 and "label 2.0 in column 'value' lies outside" in err and "at data row 3001 of" in err
    assert not out.exists()


def test_missing_label_column_and_missing_file(files, tmp_path, capsys):
    d, _ = files
    code, _, err = run(["fit", "--labels", str(d / "t.csv"), "--label-column", "nope", "--range", "0", "1",
                        "--mechanism", "rpwithprior", "--epsilon", "1"], capsys)
    assert code != 0 and "'nope' not found" in err
    code, _, err = run(["privatize", str(tmp_path / "none.csv"), "-o", str(tmp_path / "o.csv"), "--label-column", "v",
                        "--mechanism", "rpwithprior", "--epsilon", "1", "--range", "0", "1"], capsys)
    assert code != 0 and "not found" in err and not (tmp_path / "o.csv").exists()


@pytest.mark.parametrize("lo, hi", slow_unless([("-1e6", "1e6"), ("-2.5E-1", "7.5e-1"), ("-1", "1")],
                                             fast=[("-1e6", "1e6")]))
def test_a_negative_range_in_any_number_notation_is_a_value(files, tmp_path, capsys, lo, hi):
    """``--range -1e6 1e6`` is two numbers, not an unknown option (argparse alone reads only -1 and -1.5 so)."""
    d, table = files
    src = tmp_path / "shifted.csv"
    scale = float(hi) - float(lo)
    pacsv.write_csv(pa.table({"value": table.column("value").to_numpy() * scale + float(lo), "x": table["x"]}), src)
    code, out, err = run(["fit", "--labels", str(src), "--label-column", "value", "--range", lo, hi,
                          "--mechanism", "laplace", "--epsilon", "1", "--json"], capsys)
    assert code == 0, err
    assert json_lines(out)[0]["range"] == [float(lo), float(hi)]
    code, _, err = run(["privatize-table", str(src), "-o", str(tmp_path / "o.csv"), "--label-column", "value",
                        "--range", lo, hi, "--epsilon", "1", "--key-file", str(d / "key")], capsys)
    assert code == 0, err
    # an infinite bound parses as a number too, and is then refused by name, with no output
    code, _, err = run(["privatize-table", str(src), "-o", str(tmp_path / "p.csv"), "--label-column", "value",
                        "--range", "-inf", hi, "--epsilon", "1"], capsys)
    assert code == 2 and "range must be finite" in err and not (tmp_path / "p.csv").exists()


def test_clip_flag_clips_instead_of_refusing(tmp_path, capsys):
    src = _bad_table(tmp_path, [0.1, 0.2, 7.0])
    out = tmp_path / "o.csv"
    code, _, err = run(["privatize", str(src), "-o", str(out), "--label-column", "value",
                        "--mechanism", "rpwithprior", "--epsilon", "1", "--range", "0", "1", "--clip", "--quiet"], capsys)
    assert code == 0, err
    assert out.exists() and pacsv.read_csv(out).num_rows == 3
    # without --clip the same file is refused
    code, _, err = run(["privatize", str(src), "-o", str(tmp_path / "refused.csv"), "--label-column", "value",
                        "--mechanism", "rpwithprior", "--epsilon", "1", "--range", "0", "1", "--quiet"], capsys)
    assert code == 2 and "label 7.0" in err and "data row 3 (line 4)" in err
    assert not (tmp_path / "refused.csv").exists()


@pytest.mark.slow
def test_save_needs_exactly_one_epsilon(files, tmp_path, capsys):
    d, _ = files
    code, _, err = run(["fit", "--labels", str(d / "labels.txt"), "--range", "0", "1", "--mechanism", "rpwithprior",
                        "--epsilon", "1", "2", "--save", str(tmp_path / "p.json")], capsys)
    assert code != 0 and "exactly one" in err and not (tmp_path / "p.json").exists()


def test_params_file_must_be_a_fit_record(tmp_path, capsys, files):
    d, _ = files
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"hello": 1}))
    code, _, err = run(["privatize", str(d / "t.csv"), "-o", str(tmp_path / "o.csv"), "--label-column", "value",
                        "--params", str(bad)], capsys)
    assert code != 0 and "not an rpwjax fit record" in err


@pytest.mark.parametrize("command", ["fit", "privatize-table"])
def test_range_is_required_in_the_help_and_on_the_command_line(files, tmp_path, capsys, command):
    d, _ = files
    code, out, _ = run([command, "--help"], capsys)
    usage = " ".join(out.split("options:")[0].split())
    assert code == 0 and " --range LO HI " in usage and "[--range" not in usage, usage
    argv = ["fit", "--labels", d / "labels.txt", "--mechanism", "laplace", "--epsilon", "1"] if command == "fit" else \
        ["privatize-table", d / "t.csv", "-o", tmp_path / "o.csv", "--label-column", "value", "--epsilon", "1"]
    code, _, err = run(argv, capsys)
    assert code == 2 and err.count("\n") == 1 and "required: --range" in err and "public input" in err, err


@pytest.mark.slow
def test_console_script_runs(files):
    d, _ = files
    proc = subprocess.run([sys.executable, "-m", "rpwjax.cli", "fit", "--labels", str(d / "labels.txt"), "--range", "0",
                           "1", "--mechanism", "rpwithprior", "--epsilon", "1", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json_lines(proc.stdout)[0]["mechanism"] == "rpwithprior"


ENTRY = """
import atexit, sys
atexit.register(lambda: sys.stderr.write("teardown ran\\n"))
from rpwjax.cli import entry
entry(sys.argv[1:])
"""


@pytest.mark.parametrize("case", ["help", "bad command line", "missing input", "privatize"])
def test_the_command_delivers_its_output_and_code_and_skips_the_teardown(files, tmp_path, case):
    # the console entry ends with os._exit (a native thread pool alive at interpreter teardown can abort a finished
    # run); its buffered output must still arrive in full, with main's exit code, and the teardown must not run
    d, table = files
    privatize = ["privatize", str(d / "t.csv"), "-o", "out.csv", "--label-column", "value", "--range", "0", "1",
                 "--mechanism", "laplace", "--epsilon", "1", "--key-file", str(d / "key")]
    argv, code = {"help": (["--help"], 0), "bad command line": (["fit", "--labels"], 2),
                  "missing input": (["privatize", "missing.csv", *privatize[2:]], 2), "privatize": (privatize, 0)}[case]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout block-buffered, as in a pipe
    proc = subprocess.run([sys.executable, "-c", ENTRY, *argv], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == code, proc.stderr
    assert "teardown ran" not in proc.stderr
    if case == "help":  # the whole help, down to its last line
        assert proc.stdout.startswith("usage: rpwjax") and "--version" in proc.stdout and proc.stdout.endswith("\n")
    elif case == "privatize":  # every row written and closed
        assert pacsv.read_csv(tmp_path / "out.csv").num_rows == table.num_rows
    else:
        assert proc.stderr.startswith(("rpwjax", "usage:")), proc.stderr
        assert case != "missing input" or "not found: 'missing.csv'" in proc.stderr, proc.stderr
        assert not (tmp_path / "out.csv").exists()


def test_the_installed_command_is_that_entry():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "rpwjax"]
    assert script.value == "rpwjax.cli:entry"


@pytest.mark.slow
def test_shards_with_row_offsets_match_one_run(files, tmp_path, capsys):
    d, table = files
    params = tmp_path / "p.json"
    run(["fit", "--labels", str(d / "labels.txt"), "--range", "0", "1", "--mechanism", "staircase", "--epsilon", "1",
         "--save", str(params)], capsys)
    whole = tmp_path / "whole.parquet"
    assert run(["privatize", str(d / "t.parquet"), "-o", str(whole), "--label-column", "value",
                "--key-file", str(d / "key"), "--params", str(params), "--quiet"], capsys)[0] == 0
    rid = json.loads((tmp_path / "whole.parquet.json").read_text())["release_id"]  # the shards are that release
    parts = []
    for i, (lo, hi) in enumerate(((0, 1234), (1234, 5000))):
        shard = tmp_path / f"shard{i}.parquet"
        pq.write_table(table.slice(lo, hi - lo), shard)
        out = tmp_path / f"out{i}.parquet"
        assert run(["privatize", str(shard), "-o", str(out), "--label-column", "value", "--key-file", str(d / "key"),
                    "--params", str(params), "--row-offset", str(lo), "--quiet", "--release-id", rid,
                    "--ledger", str(tmp_path / f"shard{i}.jsonl")], capsys)[0] == 0
        parts.append(pq.read_table(out).column("value").to_numpy())
    np.testing.assert_array_equal(np.concatenate(parts), pq.read_table(whole).column("value").to_numpy())


DEBIAS_ROWS = 150_000


@pytest.fixture(scope="module")
def one_label_blocks(files):
    """150,000 rows of label 0.3, then 150,000 of label 0.9, then 150,000 from Beta(2, 5) (a spread for the fit)."""
    d, _ = files
    path = d / "blocks.csv"
    rng = np.random.default_rng(3)
    y = np.concatenate([np.full(DEBIAS_ROWS, 0.3), np.full(DEBIAS_ROWS, 0.9), rng.beta(2, 5, DEBIAS_ROWS)])
    pacsv.write_csv(pa.table({"y": y}), path)
    return path


@pytest.mark.parametrize("source", slow_unless(["inline", "params"], fast=["inline"]))
def test_privatize_debias_is_unbiased_for_the_projected_label(files, one_label_blocks, tmp_path, capsys, source):
    d, _ = files
    if source == "params":
        fit = tmp_path / "p.json"
        # fitted on the released file itself, as the inline path is: its private histogram (fresh noise every run)
        # keeps 0.3 inside [A1, A2] and 0.9 beyond it, which a fit on another label file need not
        assert run(["fit", "--labels", one_label_blocks, "--label-column", "y", "--range", "0", "1", "--mechanism",
                    "rpwithprior", "--epsilon", "1", "--key-file", d / "key", "--save", fit], capsys)[0] == 0
        how = ["--params", fit]
    else:
        how = ["--mechanism", "rpwithprior", "--epsilon", "1", "--range", "0", "1"]
    outputs = {}
    for denoise in ("none", "debias"):
        out = tmp_path / f"{denoise}.csv"
        # the same release (its id given back), written raw and debiased: post-processing spends nothing more
        again = ["--release-id", json.loads((tmp_path / "none.csv.json").read_text())["release_id"]] if outputs else []
        code, _, err = run(["privatize", one_label_blocks, "-o", out, "--label-column", "y", "--key-file", d / "key",
                            "--quiet", "--denoise", denoise, *how, *again], capsys)
        assert code == 0, err
        outputs[denoise] = pacsv.read_csv(out).column("y").to_numpy()
    side = json.loads((tmp_path / "debias.csv.json").read_text())
    p, coefficients = side["params"], side["debias"]
    assert side["postprocessing"] == "debias" and side["epsilon"] == 1.0  # post-processing: nothing more spent
    raw, debiased = outputs["none"], outputs["debias"]
    a, b = coefficients["a"], coefficients["b"]
    np.testing.assert_allclose(debiased, (raw - b) / a, rtol=0, atol=1e-12)  # the same release, mapped
    # the sidecar's range is the image of the release's range: every debiased value lies in it
    r_lo, r_hi = side["release_range"]
    assert coefficients["range"] == pytest.approx([(r_lo - b) / a, (r_hi - b) / a], rel=1e-15)
    assert side["output_grid"] is None and side["output_range"][0] <= debiased.min()
    assert debiased.max() <= side["output_range"][1]
    inside, outside = 0.3, 0.9
    assert p["A1"] < inside < p["A2"] < outside  # one label in [A1, A2], one beyond it
    for block, label in enumerate((inside, outside)):
        rows = slice(block * DEBIAS_ROWS, (block + 1) * DEBIAS_ROWS)
        projected = min(max(label, p["A1"]), p["A2"])
        for values, unbiased in ((debiased[rows], True), (raw[rows], False)):
            se = values.std(ddof=1) / np.sqrt(DEBIAS_ROWS)
            assert (abs(values.mean() - projected) <= 4.5 * se) == unbiased, (source, label, unbiased)


def test_privatize_debias_refuses_a_params_file_of_another_mechanism(files, tmp_path, capsys):
    d, _ = files
    fit = tmp_path / "laplace.json"
    assert run(["fit", "--labels", d / "labels.txt", "--range", "0", "1", "--mechanism", "laplace", "--epsilon", "1",
                "--save", fit], capsys)[0] == 0
    code, _, err = run(["privatize", d / "t.csv", "-o", tmp_path / "o.csv", "--label-column", "value", "--params", fit,
                        "--denoise", "debias", "--quiet"], capsys)
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "o.csv").exists()
    assert "--denoise debias applies to --mechanism rpwithprior only, got laplace" in err and "already unbiased" in err


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rpwithprior", "rr-on-bins", "unbiased"])
def test_privatize_with_posterior_denoising(files, tmp_path, capsys, name):
    """Every mechanism with a prior: a release written raw and denoised (discrete outputs too: the check made
    before any output probes the posterior with a value the mechanism puts out)."""
    d, table = files
    params = tmp_path / "p.json"
    assert run(["fit", "--labels", str(d / "labels.txt"), "--range", "0", "1", "--mechanism", name,
                "--epsilon", "4", "--prior", "private", "--key-file", str(d / "key"), "--save", str(params)],
               capsys)[0] == 0
    saved = json.loads(params.read_text())["prior"]
    assert len(saved["masses"]) == 32 and len(saved["edges"]) == 33
    raw, clean = tmp_path / "raw.parquet", tmp_path / "clean.parquet"
    assert run(["privatize", str(d / "t.parquet"), "-o", str(raw), "--label-column", "value",
                "--key-file", str(d / "key"), "--params", str(params), "--quiet"], capsys)[0] == 0
    # the same release written denoised: its release id again (denoising is post-processing, not a new release)
    release_id = json.loads((tmp_path / "raw.parquet.json").read_text())["release_id"]
    assert run(["privatize", str(d / "t.parquet"), "-o", str(clean), "--label-column", "value", "--key-file",
                str(d / "key"), "--params", str(params), "--quiet", "--denoise", "posterior",
                "--release-id", release_id], capsys)[0] == 0
    true = table.column("value").to_numpy()
    r = pq.read_table(raw).column("value").to_numpy()
    c = pq.read_table(clean).column("value").to_numpy()
    # one release, so one noise: the denoised file is exactly the posterior mean of the raw one under the saved
    # (private) prior
    mechanism, prior = load_release_params(params)[::2]
    np.testing.assert_allclose(c, posterior_mean(mechanism, prior, r), rtol=0, atol=1e-12)
    # and it lowers the error. The prior is a private histogram, so this is not guaranteed at every budget: at
    # epsilon = 1 (0.1 on the histogram) the fit can pick a near-constant release whose posterior barely moves
    # and the noisy prior's mean then decides; at epsilon = 4 it was 19% to 23% for each of ten random keys tried
    # RR-on-Bins already outputs each bin's mean under the prior it was fitted to: its posterior mean is its output
    assert np.mean((c - true) ** 2) < (0.9 if name != "rr-on-bins" else 1 + 1e-9) * np.mean((r - true) ** 2)
    side = json.loads((tmp_path / "clean.parquet.json").read_text())
    assert side["postprocessing"] == "posterior-mean"
    # posterior means are off the release grid but inside the public range the sidecar names
    assert side["output_grid"] is None
    assert side["output_range"][0] <= c.min() and c.max() <= side["output_range"][1]
    assert 0.0 <= c.min() and c.max() <= 1.0
    raw_side = json.loads((tmp_path / "raw.parquet.json").read_text())
    assert side["release_grid"] == raw_side["output_grid"] and side["release_range"] == raw_side["output_range"]
    code, _, err = run(["privatize", str(d / "t.parquet"), "-o", str(tmp_path / "inline.parquet"), "--label-column",
                        "value", "--key-file", str(d / "key"), "--mechanism", name, "--epsilon", "4", "--range",
                        "0", "1", "--quiet", "--denoise", "posterior"], capsys)
    assert code == 0, err
    if name != "rpwithprior":
        return
    # an empirical prior is never saved, so a saved known-prior fit cannot be denoised later
    known = tmp_path / "known.json"
    assert run(["fit", "--labels", str(d / "labels.txt"), "--range", "0", "1", "--mechanism", "rpwithprior",
                "--epsilon", "1", "--prior", "empirical", "--prior-is-public", "--save", str(known)], capsys)[0] == 0
    assert "masses" not in json.loads(known.read_text())["prior"]
    code, _, err = run(["privatize", str(d / "t.parquet"), "-o", str(tmp_path / "x.parquet"), "--label-column",
                        "value", "--prior-is-public", "--params", str(known), "--denoise", "posterior", "--quiet"],
                       capsys)
    assert code != 0 and "needs the prior" in err and not (tmp_path / "x.parquet").exists()


# --------------------------------------------------------------------------- types survive, progress shows


TYPED_CSV = ("id,zip,price,flag,name,user_id,empty,y\n"
             "1,02134,3.5,true,ann,12345678901234567890,,0.25\n"
             "2,10001,,false,\"b, c\",12345678901234567891,,0.75\n"
             "3,94110,1e3,true,NA,12345678901234567892,,0.5\n")


@pytest.mark.parametrize("command", ["privatize", "privatize-table"])
def test_csv_into_parquet_writes_numbers_as_numbers_and_text_as_text(files, tmp_path, capsys, command):
    d, _ = files
    src = tmp_path / "t.csv"
    src.write_text(TYPED_CSV)
    out = tmp_path / "o.parquet"
    how = (["--mechanism", "laplace", "--epsilon", "1", "--range", "0", "1"] if command == "privatize"
           else ["--range", "0", "1", "--epsilon", "1", "--features", "price"])
    code, _, err = run([command, src, "-o", out, "--label-column", "y", "--key-file", d / "key", "--quiet", *how],
                       capsys)
    assert code == 0, err
    table = pq.read_table(out)
    assert dict(zip(table.column_names, map(str, table.schema.types))) == {
        "id": "int64", "zip": "string", "price": "double", "flag": "bool", "name": "string", "user_id": "string",
        "empty": "null", "y": "double"}
    assert table.column("zip").to_pylist() == ["02134", "10001", "94110"]  # a code keeps its zeros
    assert table.column("user_id").to_pylist()[0] == "12345678901234567890"  # too long for float64: text
    assert table.column("price").to_pylist() == [3.5, None, 1000.0]
    assert table.column("name").to_pylist() == ["ann", "b, c", "NA"]  # text as it came in, null spellings too
    assert table.column("id").to_pylist() == [1, 2, 3]


def test_column_types_do_not_depend_on_the_chunks(tmp_path):
    from rpwjax.io.csv_types import csv_column_types, read_csv_table
    from rpwjax.io.source import TableSource

    rows = ["a,b,c,d,y"] + [f"{i},{i}.5,{'x' if i == 997 else i},{'007' if i == 998 else i},0.5" for i in range(1000)]
    src = tmp_path / "t.csv"
    src.write_text("\n".join(rows) + "\n")
    source = TableSource(src, "y")
    for chunk in (1, 7, 1000):
        kinds = csv_column_types(source, chunk_rows=chunk)
        assert [str(k.type) for k in kinds[:4]] == ["int64", "double", "string", "string"], chunk
        assert kinds[3].text_reason == "leading zeros (e.g. '007'): a code, not a quantity"
    whole = read_csv_table(src)
    assert [str(t) for t in whole.schema.types] == ["int64", "double", "string", "string", "double"]


@pytest.mark.slow
def test_a_decimal_label_is_read_as_float64_and_said_so(files, tmp_path, capsys):
    from decimal import Decimal

    d, _ = files
    src = tmp_path / "money.parquet"
    values = [Decimal("12.34"), Decimal("0.99"), Decimal("250.00"), Decimal("75.50")] * 50
    x = np.linspace(0, 1, len(values))
    pq.write_table(pa.table({"x": x, "z": np.cos(7 * x), "price": pa.array(values, pa.decimal128(12, 2))}), src)
    out = tmp_path / "o.parquet"
    code, _, err = run(["privatize", src, "-o", out, "--label-column", "price", "--mechanism", "laplace", "--epsilon",
                        "1", "--range", "0", "300", "--key-file", d / "key", "--quiet"], capsys)
    assert code == 0, err
    side = json.loads((tmp_path / "o.parquet.json").read_text())
    assert side["label_type"] == "decimal128(12, 2) read as float64"
    assert pq.read_table(out).schema.field("price").type == pa.float64()
    code, _, err = run(["privatize-table", src, "-o", tmp_path / "t.parquet", "--label-column", "price", "--range",
                        "0", "300", "--epsilon", "1", "--key-file", d / "key", "--quiet"], capsys)
    assert code == 0, err
    side = json.loads((tmp_path / "t.parquet.json").read_text())
    assert side["label_type"] == "decimal128(12, 2) read as float64" and side["features"]["used"] == ["x", "z"]


@pytest.mark.slow
def test_every_long_pass_shows_a_bar_with_a_total(files, tmp_path, capsys):
    d, _ = files
    src = tmp_path / "t.csv"
    rng = np.random.default_rng(0)
    pacsv.write_csv(pa.table({"x": rng.normal(size=3000), "y": rng.uniform(size=3000)}), src)
    size = src.stat().st_size
    code, _, err = run(["privatize", src, "-o", tmp_path / "o.csv", "--label-column", "y", "--mechanism", "laplace",
                        "--epsilon", "1", "--range", "0", "1", "--key-file", d / "key"], capsys)
    assert code == 0, err
    # the inline fit's read pass and the release, each with its total (the file's bytes) and the time left
    for desc in ("read labels", "privatize"):
        bar = [line for line in err.replace("\r", "\n").splitlines() if line.startswith(desc + ":")]
        assert bar and "100%" in bar[-1] and "<00:00" in bar[-1], err
    from tqdm import tqdm

    assert err.count(f"{tqdm.format_sizeof(size, divisor=1024)}/{tqdm.format_sizeof(size, divisor=1024)}") >= 2, err
    code, _, err = run(["privatize-table", src, "-o", tmp_path / "p.csv", "--label-column", "y", "--range", "0", "1",
                        "--epsilon", "1", "--key-file", d / "key"], capsys)
    assert code == 0, err
    text = err.replace("\r", "\n")
    for desc in ("[1/4] read labels", "[2/4] read table", "[4/4] write"):
        assert any(line.startswith(desc + ":") and "100%" in line for line in text.splitlines()), (desc, err)
    assert "[3/4] pipeline auto: 3/3 steps" in text  # auto's own steps, each named as it runs
    for step in ("design (public)", "private linear fit and residual histogram", "release"):
        assert step in text, (step, err)
    code, _, err = run(["privatize-table", src, "-o", tmp_path / "q.csv", "--label-column", "y", "--range", "0", "1",
                        "--epsilon", "1", "--key-file", d / "key", "--quiet"], capsys)
    assert code == 0 and "read table" not in err and "%" not in err, err
