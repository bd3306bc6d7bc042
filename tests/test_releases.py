"""Private across releases: one key file, many releases, no shared randomness, and the ε they add up to.

* two releases made with one key file (two ε, two files, two fits, two pipelines) draw
  independent noise, unless one reproduces the other with its own release id;
* every uniform comes from a 256-bit ChaCha20 key (RFC 8439's block function), the same bits whether the
  host (OpenSSL) or the device computes them;
* every fit, privatize and privatize-table lands in the ledger, which totals ε and δ per
  (input, label column), refuses a release past ``--budget`` before writing anything,
  and stays whole under concurrent runs.
"""

import json
import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import rpwjax
from rpwjax import ledger, stream
from rpwjax.keys import Secret
from rpwjax.priors import private_histogram
from rpwjax.ledger import ReleasedDigest
from helpers import fixed_key, run, slow_unless

LO, HI = 0.0, 1.0
ROWS = 100_000
# two independent releases: their noises' sample correlation has sd 1/sqrt(ROWS) and the keys are fresh in every run,
# so the bound sits at six sd (a false failure below 1e-8); shared uniforms would give a correlation near 1
INDEPENDENT = 6 / np.sqrt(ROWS)


def labels_of(path):
    return pacsv.read_csv(path).column("y").to_numpy()


def sidecar(path):
    return json.loads(path.with_name(path.name + ".json").read_text())


def write_table(path, y, x=None):
    cols = {"y": y} if x is None else {"x": x, "y": y}
    pacsv.write_csv(pa.table(cols), path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("releases")
    rng = np.random.default_rng(30)
    a, b = rng.beta(2, 5, ROWS), rng.beta(5, 2, ROWS)
    write_table(d / "day1.csv", a)
    write_table(d / "day2.csv", b)
    fixed_key(d / "key", 30)
    return d, a, b


def first_json(out: str) -> dict:
    """The first record ``--json`` printed (JSON Lines)."""
    text = out.strip()
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        record = json.loads(text.splitlines()[0])
    return record[0] if isinstance(record, list) else record


def privatize(capsys, src, out, key, *options):
    code, _, err = run(["privatize", src, "-o", out, "--label-column", "y", "--range", LO, HI, "--key-file", key,
                        "--quiet", *options], capsys)
    assert code == 0, err
    return labels_of(out)


def test_chacha_block_function_matches_published_vectors():
    # RFC 8439, 2.3.2 (20 rounds): key 00 01 .. 1f, block counter 1, nonce 00:00:00:09:00:00:00:4a:00:00:00:00
    key = np.frombuffer(bytes(range(32)), "<u4")
    words = stream.chacha_block(key, np.array([1], np.uint32), 0x09000000, nonce=(0x4A000000, 0), rounds=20)
    out = b"".join(np.asarray(w, "<u4").tobytes() for w in words)
    assert out.hex() == ("10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
                         "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e")
    # the first block of the all-zero 256-bit key and IV at 8, 12 and 20 rounds (draft-strombergson-chacha-test-
    # vectors, TC1); 20 is what every release uses
    published = {
        8: "3e00ef2f895f40d67f5bb8e81f09a5a12c840ec3ce9a7f3b181be188ef711a1e"
           "984ce172b9216f419f445367456d5619314a42a3da86b001387bfdb80e0cfe42",
        12: "9bf49a6a0755f953811fce125f2683d50429c3bb49e074147e0089a52eae155f"
            "0564f879d27ae3c02ce82834acfa8c793a629f2ca0de6919610be82f411326be",
        20: "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
            "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586",
    }
    for rounds, expected in published.items():
        words = stream.chacha_block(np.zeros(8, np.uint32), np.array([0], np.uint32), 0, rounds=rounds)
        assert b"".join(np.asarray(w, "<u4").tobytes() for w in words).hex() == expected, rounds
    assert stream.ROUNDS == 20


def test_host_and_device_streams_are_the_same_bits():
    """OpenSSL's ChaCha20 on the host (what a release on CPU reads) and the block function on the device give the
    same 64-bit word for every row: at the first block, far out, and across the wrap of the low counter word
    (2^32 ChaCha blocks, where the host starts a new cipher)."""
    import jax

    key = Secret(bytes(range(32))).for_release("5a" * 16, purpose="test").stream_key("labels")
    words_per_block = stream.BLOCK_ROWS // 8
    for block in (0, 3, (1 << 32) // words_per_block - 1, 123_456_789):
        counters = stream.block_counters(block, 2)
        with jax.enable_x64(True):
            device = np.concatenate([np.asarray(stream.block_bits(key, c)) for c in counters])
        host = stream.host_words(key, block * stream.BLOCK_ROWS, 2 * stream.BLOCK_ROWS)
        np.testing.assert_array_equal(host, device, err_msg=f"release block {block}")
    # row i is the little-endian word at byte 8i of the keystream: RFC 8439's block function at counter i div 8
    words = stream.chacha_block(key, np.array([5], np.uint32), 0, rounds=20)
    block5 = b"".join(np.asarray(w, "<u4").tobytes() for w in words)
    np.testing.assert_array_equal(stream.host_words(key, 40, 8), np.frombuffer(block5, "<u8"))
    with pytest.raises(ValueError, match="whole ChaCha blocks"):
        stream.host_words(key, 4, 8)


def test_same_key_two_epsilons_draw_independent_noise(files, tmp_path, capsys):
    """Laplace at ε = 1 then 2 with one key file: 2·x₂ − x₁ no longer returns the labels."""
    d, a, _ = files
    x1 = privatize(capsys, d / "day1.csv", tmp_path / "e1.csv", d / "key", "--mechanism", "laplace", "--epsilon", "1")
    x2 = privatize(capsys, d / "day1.csv", tmp_path / "e2.csv", d / "key", "--mechanism", "laplace", "--epsilon", "2")
    assert sidecar(tmp_path / "e1.csv")["release_id"] != sidecar(tmp_path / "e2.csv")["release_id"]
    assert abs(np.corrcoef(x1 - a, x2 - a)[0, 1]) < INDEPENDENT
    solve = 2 * x2 - x1
    assert np.mean((solve - a) ** 2) > np.mean((x2 - a) ** 2)  # no better than the ε = 2 release alone


def test_same_key_two_files_draw_independent_noise(files, tmp_path, capsys):
    """Two daily files with one key file and offset 0: the outputs' difference is not the labels' difference."""
    d, a, b = files
    for mechanism in ("laplace", "rpwithprior"):
        xa = privatize(capsys, d / "day1.csv", tmp_path / f"a-{mechanism}.csv", d / "key", "--mechanism", mechanism,
                       "--epsilon", "1")
        xb = privatize(capsys, d / "day2.csv", tmp_path / f"b-{mechanism}.csv", d / "key", "--mechanism", mechanism,
                       "--epsilon", "1")
        assert abs(np.corrcoef(xa - a, xb - b)[0, 1]) < INDEPENDENT, mechanism
        if mechanism == "laplace":
            assert np.mean(np.abs((xa - xb) - (a - b)) < 1e-3) < 0.01


def test_same_key_two_fits_publish_independent_histogram_noise(files, tmp_path, capsys):
    """Two fits on neighbouring label files: the published histograms differ in more than the moved label's bin."""
    d, a, _ = files
    neighbour = a.copy()
    neighbour[0] = 1.0 - neighbour[0]
    write_table(tmp_path / "neighbour.csv", neighbour)
    masses = []
    for src in (d / "day1.csv", tmp_path / "neighbour.csv"):
        code, out, err = run(["fit", "--labels", src, "--label-column", "y", "--range", LO, HI, "--mechanism",
                              "rpwithprior", "--epsilon", "1", "--key-file", d / "key", "--json"], capsys)
        assert code == 0, err
        record = first_json(out)
        masses.append(np.asarray(record["prior"]["masses"]))
    assert np.sum(np.abs(masses[0] - masses[1]) > 1e-12) > 4


@pytest.mark.slow
def test_pipelines_on_one_key_file_never_share_a_uniform_stream(files, tmp_path, capsys, monkeypatch):
    """Every release of every pipeline (and stage) under one key file draws from its own ChaCha key."""
    import rpwjax.release_path as rp

    d, a, _ = files
    x = a + np.random.default_rng(1).normal(0, 0.1, a.size)
    src = write_table(tmp_path / "table.csv", a[:800], x[:800])  # rows do not matter here: every release's key does
    keys, real = [], rp._release_blocks

    def spy(params, low, high, key, *rest, **kw):
        keys.append(bytes(np.asarray(key, np.uint32)))
        return real(params, low, high, key, *rest, **kw)

    monkeypatch.setattr(rp, "_release_blocks", spy)
    for pipeline in ("linear-prior", "rpwithprior+calibrated", "two-stage", "two-stage-unbiased"):
        code, _, err = run(["privatize-table", src, "-o", tmp_path / f"{pipeline}.csv", "--label-column", "y",
                            "--range", LO, HI, "--epsilon", "1", "--pipeline", pipeline, "--key-file", d / "key",
                            "--epochs", "1"] if pipeline.startswith("two-stage") else
                           ["privatize-table", src, "-o", tmp_path / f"{pipeline}.csv", "--label-column", "y",
                            "--range", LO, HI, "--epsilon", "1", "--pipeline", pipeline, "--key-file", d / "key"],
                           capsys)
        assert code == 0, err
    assert len(keys) >= 6 and len(set(keys)) == len(keys)


def test_python_release_with_one_secret_twice_draws_independent_noise():
    params = rpwjax.fit("laplace", np.zeros(1), range=(LO, HI), epsilon=1.0).params
    secret = Secret(bytes(range(32)))
    y = np.full(ROWS, 0.5)
    first, second = rpwjax.release(params, secret, y), rpwjax.release(params, secret, y)
    assert not np.array_equal(first, second)
    assert abs(np.corrcoef(first - y, second - y)[0, 1]) < INDEPENDENT
    bound = secret.for_release("5a" * 16, purpose="test")  # bound to one release: reproducible
    np.testing.assert_array_equal(rpwjax.release(params, bound, y[:1000]), rpwjax.release(params, bound, y[:1000]))


# --------------------------------------------------------------------------- the ledger


def test_ledger_totals_every_release_of_an_input(files, tmp_path, capsys):
    d, _, _ = files
    book = tmp_path / "book.jsonl"
    common = ["--label-column", "y", "--range", LO, HI, "--ledger", book]
    code, _, err = run(["fit", "--labels", d / "day2.csv", *common, "--mechanism", "rpwithprior", "--epsilon", "1",
                        "--save", tmp_path / "p.json"], capsys)
    assert code == 0, err
    assert "ledger" not in err  # a first release of this input prints nothing
    code, _, err = run(["privatize", d / "day2.csv", "-o", tmp_path / "o1.csv", "--label-column", "y", "--params",
                        tmp_path / "p.json", "--ledger", book, "--quiet"], capsys)
    assert code == 0, err
    assert "has now spent epsilon 1 in 2 releases" in err, err
    # the params release names the fit it came from (whose histogram is the fit's line)
    fit_line, params_line = ledger.read(book)
    assert params_line["params_release_id"] == fit_line["release_id"] == json.loads((tmp_path / "p.json").read_text())[
        "release_id"]
    code, _, err = run(["privatize", d / "day2.csv", "-o", tmp_path / "o2.csv", *common, "--mechanism", "gaussian",
                        "--epsilon", "0.5", "--delta", "1e-6", "--quiet"], capsys)
    assert code == 0, err
    assert "epsilon 1.5, delta 1e-06 in 3 releases" in err, err
    code, out, err = run(["ledger", "--ledger", book, "--json"], capsys)
    assert code == 0, err
    (group,) = [json.loads(line) for line in out.splitlines()]
    assert group["input"] == "day2.csv" and group["label_column"] == "y"
    assert [r["epsilon"] for r in group["releases"]] == [pytest.approx(0.1), pytest.approx(0.9), 0.5]
    assert group["epsilon_total"] == pytest.approx(1.5) and group["delta_total"] == pytest.approx(1e-6)
    assert sidecar(tmp_path / "o2.csv")["ledger"]["epsilon_total_on_input"] == pytest.approx(1.5)
    code, out, _ = run(["ledger", "--ledger", book], capsys)
    assert code == 0 and "epsilon 1.5" in out and "3 releases" in out
    # a key file's ledger lies beside it
    code, _, err = run(["privatize", d / "day2.csv", "-o", tmp_path / "o3.csv", *common[:-2], "--key-file", d / "key",
                        "--mechanism", "laplace", "--epsilon", "1", "--quiet"], capsys)
    assert code == 0, err
    code, out, _ = run(["ledger", "--key-file", d / "key", "--json"], capsys)
    assert code == 0 and any(json.loads(line)["input"] == "day2.csv" for line in out.splitlines())


def test_budget_refuses_before_writing_anything(files, tmp_path, capsys):
    d, _, _ = files
    book = tmp_path / "book.jsonl"
    args = ["--label-column", "y", "--range", LO, HI, "--ledger", book, "--mechanism", "laplace", "--quiet"]
    code, _, err = run(["privatize", d / "day1.csv", "-o", tmp_path / "a.csv", *args, "--epsilon", "1",
                        "--budget", "1.5"], capsys)
    assert code == 0, err
    before = book.read_bytes()
    code, _, err = run(["privatize", d / "day1.csv", "-o", tmp_path / "b.csv", *args, "--epsilon", "1",
                        "--budget", "1.5"], capsys)
    assert code == 2 and "--budget 1.5" in err and "total epsilon of 2" in err, err
    assert not (tmp_path / "b.csv").exists() and not (tmp_path / "b.csv.json").exists()
    assert book.read_bytes() == before
    code, _, err = run(["privatize", d / "day1.csv", "-o", tmp_path / "c.csv", *args, "--epsilon", "0.5",
                        "--budget", "1.5"], capsys)
    assert code == 0, err


def test_reproducing_a_release_counts_once(files, tmp_path, capsys):
    d, _, _ = files
    book = tmp_path / "book.jsonl"
    args = ["--mechanism", "laplace", "--epsilon", "1", "--ledger", book]
    first = privatize(capsys, d / "day1.csv", tmp_path / "a.csv", d / "key", *args)
    rid = sidecar(tmp_path / "a.csv")["release_id"]
    again = privatize(capsys, d / "day1.csv", tmp_path / "b.csv", d / "key", *args, "--release-id", rid)
    np.testing.assert_array_equal(first, again)
    (group,) = ledger.summaries(ledger.read(book))
    assert group["epsilon_total"] == 1.0 and len(group["releases"]) == 1
    # the same id with other settings would reuse its randomness: refused, nothing written
    code, _, err = run(["privatize", d / "day1.csv", "-o", tmp_path / "c.csv", "--label-column", "y", "--range", LO,
                        HI, "--key-file", d / "key", "--quiet", "--mechanism", "laplace", "--epsilon", "2",
                        "--ledger", book, "--release-id", rid], capsys)
    assert code == 2 and "already used" in err, err
    assert not (tmp_path / "c.csv").exists()
    code, _, err = run(["privatize", d / "day1.csv", "-o", tmp_path / "d.csv", "--label-column", "y", "--range", LO,
                        HI, "--quiet", "--mechanism", "laplace", "--epsilon", "1", "--release-id", "12345"], capsys)
    assert code == 2 and "32 to 64 hex characters" in err


def test_an_id_this_ledger_never_recorded_needs_the_shards_row_offset(files, tmp_path, capsys):
    """Two machines, one key file, one ledger each: the second shard given the first's release id without
    --row-offset would draw the first shard's uniforms row for row, so the difference of the two outputs
    would be the difference of the labels. Its ledger cannot see the first shard; the id alone is refused
    (nothing written, no ledger created), and so is an unknown id for fit and privatize-table. With its
    offset the shard releases, with noise of its own."""
    d, a, _ = files
    n = 1000
    write_table(tmp_path / "shard_a.csv", a[:n])
    write_table(tmp_path / "shard_b.csv", a[n:2 * n])
    code, _, err = run(["fit", "--labels", tmp_path / "shard_a.csv", "--label-column", "y", "--range", LO, HI,
                        "--mechanism", "laplace", "--epsilon", "1", "--key-file", d / "key", "--ledger",
                        tmp_path / "machine1.jsonl", "--save", tmp_path / "p.json"], capsys)
    assert code == 0, err
    first = privatize(capsys, tmp_path / "shard_a.csv", tmp_path / "out_a.csv", d / "key", "--params",
                      tmp_path / "p.json", "--ledger", tmp_path / "machine1.jsonl")
    rid = sidecar(tmp_path / "out_a.csv")["release_id"]
    machine2 = tmp_path / "machine2.jsonl"
    shard_b = ["privatize", tmp_path / "shard_b.csv", "-o", tmp_path / "out_b.csv", "--label-column", "y",
               "--params", tmp_path / "p.json", "--key-file", d / "key", "--ledger", machine2, "--quiet",
               "--release-id", rid]
    code, _, err = run(shard_b, capsys)
    assert code == 2, err
    assert f"release id {rid} is not in the ledger" in err and "--row-offset N" in err and "disjoint rows" in err
    assert not (tmp_path / "out_b.csv").exists() and not machine2.exists()
    for command in (["fit", "--labels", tmp_path / "shard_b.csv", "--mechanism", "laplace", "--epsilon", "1",
                     "--range", LO, HI],
                    ["privatize-table", write_table(tmp_path / "table_b.csv", a[n:2 * n], x=a[:n]), "-o",
                     tmp_path / "t.csv", "--pipeline", "linear-prior", "--epsilon", "1", "--range", LO, HI]):
        code, _, err = run([*command, "--label-column", "y", "--key-file", d / "key", "--ledger", machine2,
                            "--release-id", rid], capsys)
        assert code == 2 and f"release id {rid} is not in the ledger" in err, err
    assert not machine2.exists() and not (tmp_path / "t.csv").exists()
    code, _, err = run([*shard_b, "--row-offset", n], capsys)
    assert code == 0, err
    second = labels_of(tmp_path / "out_b.csv")
    assert sidecar(tmp_path / "out_b.csv")["release_id"] == rid and sidecar(tmp_path / "out_b.csv")["row_offset"] == n
    # noise of its own: the outputs' difference is the labels' difference plus the difference of two noises
    assert np.median(np.abs((second - first) - (a[n:2 * n] - a[:n]))) > 0.5


def test_shards_that_fit_their_own_labels_never_share_histogram_noise(files, tmp_path, capsys):
    """Two shards of one release, each fitting a private prior on its own rows: shards with the same true histogram
    still publish different ones (shared noise would cancel in their difference), and a shard given back reproduces."""
    d, a, _ = files
    first = write_table(tmp_path / "first.csv", a[:2000])
    other = a[:2000].copy()
    other[0] += 1e-9  # another file (the ledger refuses the same bytes as a second shard) with the same 32-bin counts
    assert np.floor(other[0] * 32) == np.floor(a[0] * 32)
    write_table(tmp_path / "second.csv", other)
    args = ["--mechanism", "rpwithprior", "--epsilon", "1", "--ledger", tmp_path / "book.jsonl"]
    privatize(capsys, first, tmp_path / "s1.csv", d / "key", *args)
    rid = sidecar(tmp_path / "s1.csv")["release_id"]
    shard = ["--release-id", rid, "--row-offset", "2000"]
    privatize(capsys, tmp_path / "second.csv", tmp_path / "s2.csv", d / "key", *args, *shard)
    again = privatize(capsys, tmp_path / "second.csv", tmp_path / "s2-again.csv", d / "key", *args, *shard)
    masses = [np.asarray(sidecar(tmp_path / f)["prior"]["masses"]) for f in ("s1.csv", "s2.csv", "s2-again.csv")]
    assert sidecar(tmp_path / "s2.csv")["release_id"] == rid
    assert np.sum(np.abs(masses[0] - masses[1]) > 1e-12) > 4
    np.testing.assert_array_equal(masses[1], masses[2])
    np.testing.assert_array_equal(labels_of(tmp_path / "s2.csv"), again)


@pytest.mark.slow  # compiles a pipeline (or times two benchmark groups): out of the fast subset
def test_privatize_table_on_other_features_is_another_release(files, tmp_path, capsys):
    """privatize-table's identity includes the feature columns asked for: given back for other features, an id is
    refused as other settings (nothing written), never taken for a reproduction that the ledger would count once."""
    d, a, _ = files
    rng = np.random.default_rng(31)
    src = tmp_path / "table.csv"
    pacsv.write_csv(pa.table({"x1": rng.normal(size=800), "x2": rng.normal(size=800), "y": a[:800]}), src)
    book = tmp_path / "book.jsonl"

    def table(out, *options):
        return run(["privatize-table", src, "-o", tmp_path / out, "--label-column", "y", "--range", LO, HI,
                    "--epsilon", "1", "--pipeline", "linear-prior", "--key-file", d / "key", "--ledger", book,
                    "--quiet", *options], capsys)

    code, _, err = table("both.csv", "--features", "x1", "x2")
    assert code == 0, err
    rid = sidecar(tmp_path / "both.csv")["release_id"]
    code, _, err = table("one.csv", "--features", "x1", "--release-id", rid)
    assert code == 2 and "already used" in err, err
    assert not (tmp_path / "one.csv").exists() and not (tmp_path / "one.csv.json").exists()
    code, _, err = table("again.csv", "--features", "x1", "x2", "--release-id", rid)
    assert code == 0, err
    np.testing.assert_array_equal(labels_of(tmp_path / "again.csv"), labels_of(tmp_path / "both.csv"))
    (group,) = ledger.summaries(ledger.read(book))
    assert group["epsilon_total"] == 1.0 and len(group["releases"]) == 1


def _two_columns_one_name(path, a, b):
    """A CSV whose header names column A 'Ã©' in UTF-8 and column B 'Ã©' in latin-1 (the same bytes)."""
    header = "x,".encode() + "Ã©".encode("utf-8") + b"," + "é".encode("utf-8") + b"\n"
    body = "".join(f"{i},{float(u)!r},{float(v)!r}\n" for i, (u, v) in enumerate(zip(a, b))).encode()
    path.write_bytes(header + body)
    return path


@pytest.mark.parametrize("how", ["inline", "params", "fit"])
def test_one_release_id_in_another_encoding_is_another_release(files, tmp_path, capsys, how):
    """The same bytes read in another --encoding can name another label column: the encoding joins the release's
    identity, so giving the id back with it is refused as other settings, not taken for a reproduction that would
    draw the same noise for other labels and count it once."""
    d, a, b = files
    src = _two_columns_one_name(tmp_path / "enc.csv", a[:1000], b[:1000])
    book = tmp_path / "book.jsonl"
    column = ["--label-column", "Ã©", "--range", LO, HI, "--key-file", d / "key", "--ledger", book]
    if how == "fit":
        first = ["fit", "--labels", src, *column, "--mechanism", "rpwithprior", "--epsilon", "1", "--json"]
    else:
        first = ["privatize", src, "-o", tmp_path / "e1.csv", *column, "--quiet"]
        if how == "params":
            code, _, err = run(["fit", "--labels", src, *column[:5], "--mechanism", "laplace", "--epsilon", "1",
                                "--save", tmp_path / "p.json"], capsys)
            assert code == 0, err
            first += ["--params", tmp_path / "p.json"]
        else:
            first += ["--mechanism", "laplace", "--epsilon", "1"]
    code, out, err = run(first, capsys)
    assert code == 0, err
    rid = first_json(out)["release_id"] if how == "fit" else sidecar(tmp_path / "e1.csv")["release_id"]
    second = [str(v) for v in first]
    if how != "fit":
        second[second.index(str(tmp_path / "e1.csv"))] = str(tmp_path / "e2.csv")
    recorded = ledger.read(book)
    code, _, err = run([*second, "--release-id", rid, "--encoding", "latin-1"], capsys)
    assert code == 2 and "already used" in err, err
    assert not (tmp_path / "e2.csv").exists()
    assert ledger.read(book) == recorded


def test_a_reproduction_that_releases_other_values_is_refused(files, tmp_path, capsys):
    """The ledger keeps the digest of what each release put out: a claimed reproduction (same id, key, input and
    settings) that released other values (the program changed between the two) is refused and writes nothing;
    a true reproduction still counts once."""
    d, _, _ = files
    book = tmp_path / "book.jsonl"
    args = ["--mechanism", "laplace", "--epsilon", "1", "--ledger", book]
    first = privatize(capsys, d / "day1.csv", tmp_path / "a.csv", d / "key", *args)
    rid = sidecar(tmp_path / "a.csv")["release_id"]
    (record,) = ledger.read(book)
    assert record["released_sha256"] == ReleasedDigest.of(first)
    again = privatize(capsys, d / "day1.csv", tmp_path / "b.csv", d / "key", *args, "--release-id", rid)
    np.testing.assert_array_equal(first, again)
    assert len(ledger.read(book)) == 2 and ledger.summaries(ledger.read(book))[0]["epsilon_total"] == 1.0
    # the recorded release put out other values (as an earlier version of the program would have)
    lines = book.read_text().splitlines()  # each run's pending line, then its release
    assert [bool(json.loads(line).get("pending")) for line in lines] == [True, False, True, False]
    changed = dict(json.loads(lines[1]), released_sha256="0" * 64)
    book.write_text("\n".join([lines[0], json.dumps(changed, sort_keys=True), *lines[2:]]) + "\n")
    code, _, err = run(["privatize", d / "day1.csv", "-o", tmp_path / "c.csv", "--label-column", "y", "--range", LO,
                        HI, "--key-file", d / "key", "--quiet", *args, "--release-id", rid], capsys)
    assert code == 2 and "other released values" in err and "nothing was written" in err, err
    assert not (tmp_path / "c.csv").exists() and not (tmp_path / "c.csv.json").exists()
    assert len(ledger.read(book)) == 2


def test_epsilons_that_share_a_prior_epsilon_share_one_histogram_spent_once(files, tmp_path, capsys):
    """Two ε of one fit with the same --prior-epsilon draw the same histogram (its noise is keyed by that ε₁): it
    is one release, charged once in the ledger and in the records' total, and said to be shared."""
    d, a, _ = files
    src = write_table(tmp_path / "y.csv", a[:5000])
    book = tmp_path / "book.jsonl"
    code, out, err = run(["fit", "--labels", src, "--label-column", "y", "--range", LO, HI, "--mechanism",
                          "rpwithprior", "--epsilon", "1", "2", "--prior-epsilon", "0.1",
                          "--key-file", d / "key", "--ledger", book, "--json"], capsys)
    assert code == 0, err
    records = [json.loads(line) for line in out.strip().splitlines()]
    records = records[0] if isinstance(records[0], list) else records
    masses = [np.asarray(r["prior"]["masses"]) for r in records]
    np.testing.assert_array_equal(masses[0], masses[1])
    total = records[0]["all_records"]
    assert total["epsilon_prior_total"] == 0.1 and "share one histogram" in total["note"]
    (group,) = ledger.summaries(ledger.read(book))
    assert group["epsilon_total"] == 0.1
    # other prior epsilons are other histograms, each spent
    prior = private_histogram(a[:5000], LO, HI, np.array([0.1, 0.1, 0.2]), bins=32, secret=Secret.from_seed(1))
    np.testing.assert_array_equal(prior.mass[0], prior.mass[1])
    assert np.sum(np.abs(prior.mass[0] - prior.mass[2]) > 1e-12) > 4
    with pytest.raises(rpwjax.InputError, match="one epsilon"):
        private_histogram(a[:100], LO, HI, np.array([0.1, 0.2]), bins=8, secret=Secret.from_seed(1),
                                        keyed_by_epsilon=False)


# the CLI in a process of its own, its ledger append followed at once by a signal to itself (the worst moment)
SIGNAL_AFTER_APPEND = """
import os, signal, sys
from rpwjax import cli, ledger
append = ledger.commit
def commit(path, record, *args, **kwargs):
    status = append(path, record, *args, **kwargs)
    if not record.get("pending"):  # the release's own line, not the pending line before its first draw
        os.kill(os.getpid(), getattr(signal, os.environ["SIGNAL"]))
    return status
ledger.commit = commit
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", ["privatize", "fit"])
def test_a_signal_after_the_ledger_append_waits_until_the_outputs_are_in_place(files, tmp_path, command):
    """The ledger records only releases that left the program: a SIGINT arriving right after the append waits
    until the outputs are renamed into place, so the run ends (exit 130) with the record and the outputs both
    there, never the record alone."""
    d, a, _ = files
    src = write_table(tmp_path / "y.csv", a[:3000])
    book = tmp_path / "book.jsonl"
    common = ["--label-column", "y", "--range", LO, HI, "--key-file", d / "key", "--ledger", book]
    if command == "privatize":
        argv, outputs = ["privatize", src, "-o", tmp_path / "o.csv", *common, "--quiet", "--mechanism", "laplace",
                         "--epsilon", "1"], ["o.csv", "o.csv.json"]
    else:
        argv, outputs = ["fit", "--labels", src, *common, "--mechanism", "laplace", "--epsilon", "1",
                         "--save", tmp_path / "p.json"], ["p.json"]
    proc = subprocess.run([sys.executable, "-c", SIGNAL_AFTER_APPEND, *map(str, argv)], capture_output=True,
                          text=True, env=dict(os.environ, SIGNAL="SIGINT"), timeout=300)
    assert proc.returncode == 130, proc.stderr
    assert len(ledger.read(book)) == 1
    for name in outputs:
        assert (tmp_path / name).is_file(), name
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")]
    if command == "privatize":
        assert labels_of(tmp_path / "o.csv").size == 3000 and sidecar(tmp_path / "o.csv")["rows"] == 3000


def test_a_release_whose_outputs_fail_after_the_ledger_append_is_taken_out_again(files, tmp_path, capsys,
                                                                                 monkeypatch):
    """An error after the ledger append (an output that cannot be renamed into place) removes the record again,
    and leaves the lines other runs appended as they were."""
    from rpwjax.io import atomic
    d, a, _ = files
    src = write_table(tmp_path / "y.csv", a[:3000])
    book = tmp_path / "book.jsonl"
    args = ["--mechanism", "laplace", "--epsilon", "1", "--ledger", book]
    privatize(capsys, src, tmp_path / "first.csv", d / "key", *args)
    before = ledger.read(book)

    def broken(*_):
        raise OSError("cannot rename: no space left on device")

    monkeypatch.setattr(atomic, "_commit", broken)
    code, _, err = run(["privatize", src, "-o", tmp_path / "second.csv", "--label-column", "y", "--range", LO, HI,
                        "--key-file", d / "key", "--quiet", *args], capsys)
    assert code != 0 and "no space left" in err, err
    assert not (tmp_path / "second.csv").exists()
    assert ledger.read(book) == before  # its lines withdrawn by one more line: the earlier lines as they were
    assert json.loads(book.read_text().splitlines()[-1])["withdrawn"] is True


@pytest.mark.parametrize("field, value, problem", [
    ("epsilon", float("nan"), "epsilon must be a finite number"),
    ("epsilon", -5.0, "epsilon must be a finite number >= 0, got epsilon=-5.0"),
    ("epsilon", "x", "epsilon must be a finite number"),
    ("label_column", KeyError, "label_column must be a string or null"),  # the field left out
    ("rows", "many", "rows must be an integer"),
    ("pending", "yes", "pending must be true or false"),
    ("run", 7, "run must be a string"),
])
def test_a_damaged_ledger_record_is_named_and_never_bypasses_the_budget(files, tmp_path, capsys, field, value,
                                                                        problem):
    d, a, _ = files
    src = write_table(tmp_path / "y.csv", a[:2000])
    book = tmp_path / "book.jsonl"
    args = ["--mechanism", "laplace", "--epsilon", "1", "--ledger", book]
    privatize(capsys, src, tmp_path / "first.csv", d / "key", *args)
    record = dict(json.loads(book.read_text().splitlines()[-1]), **{field: value})  # its release (after its pending)
    if value is KeyError:
        del record[field]
    book.write_text(json.dumps(record) + "\n")
    code, _, err = run(["privatize", src, "-o", tmp_path / "second.csv", "--label-column", "y", "--range", LO, HI,
                        "--key-file", d / "key", "--quiet", *args, "--budget", "1.5"], capsys)
    assert code == 2 and "line 1 is damaged" in err and problem in err, err
    code, _, err = run(["ledger", "--ledger", book], capsys)
    assert code == 2 and "line 1 is damaged" in err, err
    assert not (tmp_path / "second.csv").exists()


def test_the_key_itself_is_refused_as_a_release_id(files, tmp_path, capsys):
    d, _, _ = files
    key_hex = (d / "key").read_text().strip()
    for rid in (key_hex, key_hex[:32], key_hex[16:56].upper()):
        code, out, err = run(["privatize", d / "day1.csv", "-o", tmp_path / "k.csv", "--label-column", "y", "--range",
                              LO, HI, "--key-file", d / "key", "--quiet", "--mechanism", "laplace", "--epsilon", "1",
                              "--release-id", rid], capsys)
        assert code == 2 and "key material" in err, err
        assert key_hex[:16] not in out + err and key_hex[:16].upper() not in out + err
        assert not (tmp_path / "k.csv").exists()
    with pytest.raises(rpwjax.InputError, match="key material"):
        Secret.from_file(d / "key").for_release(key_hex)


def _append_many(path, worker, count):
    for i in range(count):
        record = ledger.new_record(release_id=f"{worker:016x}{i:016x}", command="privatize",
                                   input={"name": "x.csv", "path": "/x.csv", "size": 1, "sha256": "0" * 64},
                                   label_column="y", rows=10, row_offset=10 * (worker * count + i), epsilon=0.25,
                                   delta=0.0, settings={}, key_fingerprint="f" * 16, reproducible_seed=False)
        ledger.commit(path, record)


def test_only_a_commit_creates_the_ledger_and_a_file_that_is_no_ledger_is_named(tmp_path):
    book = tmp_path / "new" / "book.jsonl"
    record = ledger.new_record(release_id="ab" * 16, command="privatize",
                               input={"name": "x.csv", "path": "/x.csv", "size": 1, "sha256": "0" * 64},
                               label_column="y", rows=None, row_offset=0, epsilon=1.0, delta=0.0, settings={},
                               key_fingerprint="f" * 16, reproducible_seed=False)
    assert ledger.precheck(book, record)["epsilon_total"] == 1.0
    with pytest.raises(rpwjax.InputError, match="--budget 0.5"):
        ledger.precheck(book, record, budget=0.5)
    assert list(tmp_path.iterdir()) == []  # the check before any work read it as empty: no file, no folder
    ledger.commit(book, dict(record, rows=10))
    assert len(ledger.read(book)) == 1
    with open(book, "a") as f:
        f.write("{not json\n")
    with pytest.raises(rpwjax.InputError, match=r"line 2 is not a ledger record: the ledger is damaged; repair or move"):
        ledger.read(book)
    other = tmp_path / "data.csv"
    other.write_text("a,b,y\n1,2,0.5\n")
    for content in ("a,b,y\n1,2,0.5\n", '{"a": 1}\n', "[1, 2]\n"):
        other.write_text(content)
        with pytest.raises(rpwjax.InputError, match=r"ledger '.*data.csv' is not an rpwjax ledger: its first line"):
            ledger.precheck(other, record)


def test_ledger_appends_are_whole_under_concurrent_runs(tmp_path):
    book = tmp_path / "book.jsonl"
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_append_many, args=(book, w, 25)) for w in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
        assert w.exitcode == 0
    records = ledger.read(book)
    assert len(records) == 75 and len({r["release_id"] for r in records}) == 75
    (group,) = ledger.summaries(records)
    assert group["epsilon_total"] == pytest.approx(75 * 0.25)


@pytest.mark.parametrize("mechanism", slow_unless(list(rpwjax.MECHANISMS), fast=["laplace", "unbiased"]))
def test_blocks_one_at_a_time_or_side_by_side_release_the_same_bits(mechanism):
    """A single CPU device may take many blocks one at a time (lax.map), other devices side by side (vmap), and
    the stream words come from the host (CPU) or the device (accelerators): the released values are the same
    bit for bit in all four ways, and so is the range flag the kernel returns."""
    import jax

    import rpwjax.release_path as rp
    from rpwjax.audit.checks import fit_example
    from rpwjax.sampling import spec

    params = fit_example(mechanism, 1.0)
    s = spec(params)
    key = Secret(bytes(range(32))).for_release("5a" * 16, purpose="test").stream_key("labels")
    y = np.random.default_rng(3).uniform(float(params.lo), float(params.hi), 3 * stream.BLOCK_ROWS - 5)
    counters, words = rp.stream_inputs(key, 7, 3, jax.local_devices())
    assert words is not None and words.shape == (3, stream.BLOCK_ROWS)  # the tests run on CPU: host words
    with jax.enable_x64(True):
        blocks = rp._blocks(y, 5, 3, float(params.lo))
        for bad in (None, float("nan")):
            if bad is not None:
                blocks[1, 9] = bad
            runs = [rp._release_blocks(params, s["low"], s["high"], key, counters, source, blocks,
                                       np.array([float(params.lo), float(params.hi)]), grid=s["grid"], per_row=False,
                                       sequential=sequential) for sequential in (False, True) for source in (None, words)]
            for run_ in runs[1:]:
                np.testing.assert_array_equal(np.asarray(runs[0][0]), np.asarray(run_[0]))
                assert bool(run_[1]) == bool(runs[0][1]) == (bad is None)


def test_reused_host_buffers_never_leak_into_a_later_release():
    """A thread's releases reuse their host buffers (labels, stream words): a release after a larger or a smaller
    one, or in another thread, gives the values it gives alone, and an earlier output is never overwritten."""
    import threading

    import rpwjax.release_path as rp
    from rpwjax.audit.checks import fit_example

    params = fit_example("laplace", 1.0)
    secret = Secret(bytes(range(32))).for_release("5a" * 16, purpose="test")
    rng = np.random.default_rng(5)
    big = rng.uniform(LO, HI, 3 * stream.BLOCK_ROWS + 7)
    small = rng.uniform(LO, HI, stream.BLOCK_ROWS // 2)
    first = rp.release(params, secret, big, start=11)
    kept = first.copy()
    after = rp.release(params, secret, small, start=3)
    np.testing.assert_array_equal(first, kept)  # the earlier output is its own array
    np.testing.assert_array_equal(rp.release(params, secret, big, start=11), kept)
    alone = {}
    worker = threading.Thread(target=lambda: alone.update(small=rp.release(params, secret, small, start=3)))
    worker.start()
    worker.join()
    np.testing.assert_array_equal(after, alone["small"])
    assert getattr(rp._local, "labels").size >= big.size  # the buffers were reused, not fresh each time


def _no_lp(*_, **__):
    from rpwjax.mechanisms.unbiased_lp import UnsolvedLPError
    raise UnsolvedLPError("unbiased: no fit at epsilon=0.9 (a test's solver)")


def _no_certificate(*_, **__):
    raise rpwjax.InputError("rpwithprior cannot be certified for a float64 release (a test's certificate)")


# a command whose work fails after the private draws that feed it: (argv, what fails, claimed ε, what its draws spent)
FAILS_AFTER_DRAWS = {
    "fit unbiased, LP after its histogram": (
        ["fit", "--labels", "{src}", "--mechanism", "unbiased", "--epsilon", "1"],
        ("rpwjax.mechanisms.unbiased.solve", _no_lp), 0.1),
    "privatize rpwithprior, certificate after its histogram": (
        ["privatize", "{src}", "-o", "{out}", "--mechanism", "rpwithprior", "--epsilon", "1", "--quiet"],
        ("rpwjax.certify.certify", _no_certificate), 0.1),
    "privatize-table linear-prior, certificate after its statistics": (
        ["privatize-table", "{src}", "-o", "{out}", "--pipeline", "linear-prior", "--epsilon", "2", "--quiet"],
        ("rpwjax.certify.certify", _no_certificate), 0.4 * 2 + 0.1 * 2),
}


@pytest.mark.parametrize("case", list(FAILS_AFTER_DRAWS))
def test_a_run_that_fails_after_private_draws_is_charged_what_they_spent(files, tmp_path, capsys, monkeypatch, case):
    """A failure after a statistic or a histogram was drawn can reflect it (its message, that it failed at all):
    the ledger gets a line marked failed with what the draws spent, no outputs appear, and one line says so.
    A rerun under the same release id draws the same values and counts once, at the claimed ε."""
    d, a, _ = files
    argv, (target, failing), spent = FAILS_AFTER_DRAWS[case]
    src = write_table(tmp_path / "y.csv", a[:2000], x=a[2000:4000])
    out, book = tmp_path / "o.csv", tmp_path / "book.jsonl"
    argv = [str(v).format(src=src, out=out) for v in argv]
    common = ["--label-column", "y", "--range", LO, HI, "--key-file", d / "key", "--ledger", book]
    monkeypatch.setattr(target, failing)
    code, _, err = run([*argv, *common], capsys)
    assert code == 2 and "a test's" in err, err
    assert f"charged epsilon {spent:g}" in err, err
    assert not out.exists() and not out.with_name("o.csv.json").exists()
    (line,) = ledger.read(book)
    assert line["failed"] is True and line["rows"] is None and "accounting" not in line
    assert line["epsilon"] == pytest.approx(spent, rel=1e-12) and line["delta"] == 0
    (group,) = ledger.summaries(ledger.read(book))
    assert group["epsilon_total"] == pytest.approx(spent, rel=1e-12) and group["releases"][0]["failed"]
    # the same release again, nothing failing: the same draws, one release at the claim
    monkeypatch.undo()
    claim = float(argv[argv.index("--epsilon") + 1])
    spent_claim = claim if argv[0] != "fit" else 0.1  # a fit's release is its histogram
    code, _, err = run([*argv, *common, "--release-id", line["release_id"]], capsys)
    assert code == 0, err
    (group,) = ledger.summaries(ledger.read(book))
    assert len(group["releases"]) == 1 and not group["releases"][0]["failed"]
    assert group["epsilon_total"] == pytest.approx(spent_claim, rel=1e-12)


def test_failures_that_cannot_reflect_a_draw_are_not_charged(files, tmp_path, capsys, monkeypatch):
    """Nothing is charged for a failure before any draw (a label out of range: privatize-table reads every
    label first; a pipeline's release at an ε no float64 release can certify), for a refusal of the claim
    alone (--budget), or for a file release whose values only went to its output (a full disk while writing:
    the failure does not depend on them)."""
    d, a, _ = files
    book = tmp_path / "book.jsonl"
    common = ["--label-column", "y", "--range", LO, HI, "--key-file", d / "key", "--ledger", book, "--quiet"]
    bad = write_table(tmp_path / "bad.csv", np.r_[a[:500], 7.0], x=a[:501])
    code, _, err = run(["privatize-table", bad, "-o", tmp_path / "t.csv", "--pipeline", "linear-prior",
                        "--epsilon", "2", *common], capsys)
    assert code == 2 and "7" in err and "charged" not in err, err
    assert not book.exists()
    src = write_table(tmp_path / "y.csv", a[:2000], x=a[2000:4000])
    # a pipeline whose release no float64 release can certify at this ε (stage 1 would get 0.9·30 = 27)
    code, _, err = run(["privatize-table", src, "-o", tmp_path / "t.csv", "--pipeline", "two-stage-rpwithprior",
                        "--epsilon", "30", *common], capsys)
    assert code == 2 and "epsilon=27" in err and "cannot be certified" in err and "charged" not in err, err
    assert not book.exists()
    code, _, err = run(["fit", "--labels", src, "--mechanism", "rpwithprior", "--epsilon", "1", "--budget", "0.05",
                        *[c for c in common if c != "--quiet"]], capsys)
    assert code == 2 and "--budget" in err and "charged" not in err, err
    assert not book.exists()
    from rpwjax.io import atomic

    def broken(*_):
        raise OSError("cannot rename: no space left on device")

    monkeypatch.setattr(atomic, "_commit", broken)
    code, _, err = run(["privatize", src, "-o", tmp_path / "p.csv", "--mechanism", "laplace", "--epsilon", "1",
                        *common], capsys)
    assert code != 0 and "no space left" in err and "charged" not in err, err
    assert ledger.read(book, every_line=True) == []  # its pending line and its line were appended, then taken out


# the CLI in a process of its own, stopped by a signal right after its private statistics, before its release
SIGNAL_AFTER_STATISTICS = """
import os, signal, sys, time
from rpwjax import cli
from rpwjax.pipelines import linear_prior
def release_around(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
linear_prior.release_around = release_around
sys.exit(cli.main(sys.argv[1:]))
"""


# the CLI in a process of its own: its certificate refuses after the histogram was drawn, and a SIGINT arrives
# while the failed run's charge is being written (the worst moment for it)
SIGNAL_DURING_CHARGE = """
import os, signal, sys
import rpwjax
from rpwjax import certify, cli, ledger
append = ledger.commit
def commit(path, record, *args, **kwargs):
    if record.get("failed"):
        os.kill(os.getpid(), signal.SIGINT)
    return append(path, record, *args, **kwargs)
def refuse(*args, **kwargs):
    raise rpwjax.InputError("rpwithprior cannot be certified (a test's certificate)")
ledger.commit = commit
certify.certify = refuse
sys.exit(cli.main(sys.argv[1:]))
"""


# a run stopped after its draws: (the process's script, its command, the signal, its exit code, the ε charged)
STOPPED_AFTER_DRAWS = {
    # SIGTERM right after the statistics were drawn (the progress shown so far can reflect them)
    "SIGTERM after privatize-table's statistics": (
        SIGNAL_AFTER_STATISTICS, ["privatize-table", "{src}", "--pipeline", "linear-prior", "--epsilon", "2"],
        "SIGTERM", 143, 1.0),
    # SIGINT while the charge of a failed run is written: it waits until the line is in
    "SIGINT while a failed privatize is charged": (
        SIGNAL_DURING_CHARGE, ["privatize", "{src}", "--mechanism", "rpwithprior", "--epsilon", "1"],
        "SIGINT", 130, 0.1),
}


# the CLI in a process of its own that dies outright (os._exit runs no handler, no finally: as SIGKILL or the
# kernel's OOM killer would) right after its first private draw: a noise stream, or a file release's first chunk
KILLED_AFTER_FIRST_DRAW = """
import os, sys
from rpwjax import cli, noise, privatize
made, released = noise.BitStream.__init__, privatize.release
def killed(self, *args, **kwargs):
    made(self, *args, **kwargs)
    os._exit(137)
def killed_release(*args, **kwargs):
    released(*args, **kwargs)
    os._exit(137)
noise.BitStream.__init__, privatize.release = killed, killed_release
sys.exit(cli.main(sys.argv[1:]))
"""

# a command killed after its first draw: (its argv, the ε and δ it claims)
KILLED_RUNS = {
    "fit": (["fit", "--labels", "{src}", "--mechanism", "rpwithprior", "--epsilon", "1"], 0.1, 0.0),
    "privatize": (["privatize", "{src}", "-o", "{out}", "--mechanism", "rpwithprior", "--epsilon", "1", "--quiet"],
                  1.0, 0.0),
    # its first draw is the file release's first chunk, whose values were on their way into the part file
    "privatize --params": (["privatize", "{src}", "-o", "{out}", "--params", "{params}", "--chunk-rows", "500",
                            "--quiet"], None, 0.0),
    # the histogram of its posterior first: the claim's delta is the Gaussian's, planned before any draw
    "privatize gaussian": (["privatize", "{src}", "-o", "{out}", "--mechanism", "gaussian", "--epsilon", "1",
                            "--delta", "1e-6", "--denoise", "posterior", "--quiet"], 1.0, 1e-6),
    "privatize-table": (["privatize-table", "{src}", "-o", "{out}", "--pipeline", "auto", "--epsilon", "2",
                         "--quiet"], 2.0, 0.0),
}


@pytest.mark.parametrize("case", slow_unless(list(KILLED_RUNS), fast=["fit"]))
def test_a_run_killed_outright_after_its_first_draw_is_charged_its_claim(files, tmp_path, capsys, case):
    """A run killed outright runs nothing afterwards, so before its first draw that later work reads it appends a
    pending line with its claim: a killed run leaves that line, counted at the claim and shown as not finished,
    and no outputs. Its rerun under the same key and release id (the same draws) counts once; a finished run's
    last line resolves its own pending line, which the totals and ``ledger.read`` then leave out."""
    argv, claim, delta = KILLED_RUNS[case]
    d, a, _ = files
    src = write_table(tmp_path / "y.csv", a[:2000], x=a[2000:4000])
    out, book, params = tmp_path / "o.csv", tmp_path / "book.jsonl", tmp_path / "p.json"
    if claim is None:  # a saved fit (of other labels): the release claims its epsilon_2
        np.savetxt(tmp_path / "train.txt", a[4000:4500])
        code, _, err = run(["fit", "--labels", tmp_path / "train.txt", "--range", LO, HI, "--mechanism", "laplace",
                            "--epsilon", "1", "--save", params, "--ledger", tmp_path / "fits.jsonl"], capsys)
        assert code == 0, err
        claim = json.loads(params.read_text())["epsilon_mechanism"]
    argv = [str(v).format(src=src, out=out, params=params) for v in argv]
    common = ["--label-column", "y", "--key-file", d / "key", "--ledger", book]
    common += [] if "--params" in argv else ["--range", LO, HI]
    proc = subprocess.run([sys.executable, "-c", KILLED_AFTER_FIRST_DRAW, *map(str, argv + common)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 137, proc.stderr
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("o.csv")]
    (line,) = ledger.read(book, every_line=True)
    assert line["pending"] is True and line["epsilon"] == pytest.approx(claim, rel=1e-12) and line["delta"] == delta
    # the rows, when read before the first draw; a streamed --params release does not know them yet
    assert line["rows"] == (None if "--params" in argv else 2000)
    (group,) = ledger.summaries(ledger.read(book))
    assert group["epsilon_total"] == pytest.approx(claim, rel=1e-12) and group["releases"][0]["pending"]
    code, report, _ = run(["ledger", "--ledger", book], capsys)
    assert code == 0 and "did not finish" in report, report
    # the same release again: the same draws, one release at the claim, now finished
    code, _, err = run([*argv, *common, "--release-id", line["release_id"]], capsys)
    assert code == 0, err
    lines = ledger.read(book, every_line=True)
    assert [bool(r.get("pending")) for r in lines] == [True, True, False]
    assert lines[1]["run"] == lines[2]["run"] != lines[0]["run"]
    assert len(ledger.read(book)) == 2  # its own pending line resolved; the killed run's stays, as the same release
    (group,) = ledger.summaries(ledger.read(book))
    assert len(group["releases"]) == 1 and not group["releases"][0]["pending"]
    assert group["epsilon_total"] == pytest.approx(claim, rel=1e-12)


def test_a_budget_spent_meanwhile_refuses_the_pending_line_before_any_draw(files, tmp_path, capsys, monkeypatch):
    """The pending line is checked like the release: a --budget that another run used up between this run's
    check and its first draw refuses the run there, before anything is drawn or charged."""
    d, a, _ = files
    src = write_table(tmp_path / "y.csv", a[:2000])
    book = tmp_path / "book.jsonl"
    common = ["--labels", src, "--label-column", "y", "--range", LO, HI, "--key-file", d / "key", "--ledger", book,
              "--mechanism", "rpwithprior"]
    code, _, err = run(["fit", *common, "--epsilon", "1"], capsys)  # spends 0.1
    assert code == 0, err
    before = ledger.read(book, every_line=True)
    monkeypatch.setattr(ledger, "precheck", lambda *_, **__: None)  # as if the other run came after the check
    drawn = []
    monkeypatch.setattr(rpwjax.noise.BitStream, "bits", lambda self, k: drawn.append(k))
    code, _, err = run(["fit", *common, "--epsilon", "1", "--budget", "0.15"], capsys)
    assert code == 2 and "--budget 0.15" in err and "charged" not in err, err
    assert drawn == [] and ledger.read(book, every_line=True) == before


def test_a_killed_runs_release_id_is_refused_on_other_input_at_its_rows(files, tmp_path, capsys):
    """A pending line holds the rows its run read before its first draw: the id of a run killed while writing
    its output (its part file holds released labels) is refused on another input over any of them."""
    d, a, _ = files
    src, other = write_table(tmp_path / "y.csv", a[:2000]), write_table(tmp_path / "z.csv", a[2000:3000])
    book = tmp_path / "book.jsonl"
    common = ["--label-column", "y", "--key-file", d / "key", "--ledger", book, "--range", LO, HI,
              "--mechanism", "laplace", "--epsilon", "1", "--quiet"]
    proc = subprocess.run([sys.executable, "-c", KILLED_AFTER_FIRST_DRAW, "privatize", str(src), "-o",
                           str(tmp_path / "o.csv"), *map(str, common)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 137, proc.stderr
    (line,) = ledger.read(book)
    for offset in ("0", "1", "1999"):
        code, _, err = run(["privatize", other, "-o", tmp_path / "p.csv", *common, "--release-id",
                            line["release_id"], "--row-offset", offset], capsys)
        assert code == 2 and "already used for rows 0 .. 1999" in err, err
    code, _, err = run(["privatize", other, "-o", tmp_path / "p.csv", *common, "--release-id", line["release_id"],
                        "--row-offset", "2000"], capsys)  # another shard, past the killed run's first row
    assert code == 0, err


def test_a_draw_runs_every_blocks_hook_and_a_foreign_refusal_stays_with_its_block():
    """Two runs in one process (threads): any draw first runs every block's hook (a draw cannot tell whose it
    is: an overcharge, never an undercharge); a hook that is not done yet (its run not started) is tried again
    at the next draw; a hook's refusal stops only a draw on its own block's thread."""
    import threading

    from rpwjax import draws

    calls = []

    def not_started():
        calls.append("a")
        return False

    def refused():
        calls.append("b")
        raise rpwjax.InputError("block b's budget")

    with draws.collecting(first_read=not_started) as made_a:
        started = threading.Event()
        finish = threading.Event()
        errors = []

        def block_b():
            try:
                with draws.collecting(first_read=refused):
                    started.set()
                    finish.wait(10)
                    try:
                        draws.note(b"b-draw", 1.0)
                    except rpwjax.InputError as err:
                        errors.append(str(err))
            finally:
                started.set()

        worker = threading.Thread(target=block_b)
        worker.start()
        started.wait(10)
        draws.note(b"a-draw", 0.5)  # on a's thread: b's refusal is b's, a's hook not done yet
        assert calls == ["a", "b"] and b"a-draw" in made_a
        finish.set()
        worker.join(10)
        assert errors == ["block b's budget"]  # on b's own thread it stops b's draw
        assert calls[2:] == ["a", "b"]  # a's hook, not done, is tried again at the next draw


@pytest.mark.parametrize("case", list(STOPPED_AFTER_DRAWS))
def test_a_run_stopped_after_its_private_draws_is_charged_for_them(files, tmp_path, case):
    """A signal after private draws ends the run at once with its code and no outputs, and the ledger charges
    what the draws spent, the line that says so printed before the stop's; a signal while that charge is
    written waits for it."""
    script, argv, name, code, spent = STOPPED_AFTER_DRAWS[case]
    d, a, _ = files
    src = write_table(tmp_path / "y.csv", a[:2000], x=a[2000:4000])
    book = tmp_path / "book.jsonl"
    argv = [str(v).format(src=src) for v in argv] + [
        "-o", tmp_path / "o.csv", "--label-column", "y", "--range", LO, HI, "--key-file", d / "key", "--ledger", book,
        "--quiet"]
    proc = subprocess.run([sys.executable, "-c", script, *map(str, argv)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert f"charged epsilon {spent:g} " in lines[-2] and f"interrupted by {name}" in lines[-1], proc.stderr
    (line,) = ledger.read(book)
    assert line["failed"] is True and line["epsilon"] == pytest.approx(spent, rel=1e-12)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("o.csv")]
