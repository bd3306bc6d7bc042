"""Secrets, key files and what the CLI writes about them (the release-path contract).

* ``rpwjax keygen`` writes 256 bits as 64 hex characters, mode 0600, never over a file;
* every key is derived from the whole secret, per purpose and block (one flipped bit,
  one changed hex digit anywhere, changes the output);
* the same key file and release id reproduce outputs bit for bit, across chunk sizes and
  shards; a new release (no --release-id) draws other noise; no key file means fresh OS entropy;
* key material never reaches an output, a sidecar, a params file, stdout or stderr;
* an integer ``--seed`` is for experiments only and the sidecar says so;
* the private prior is the default, the empirical prior needs ``--prior-is-public``;
* the sidecar's ``output_range``/``output_grid`` describe every released value.
"""

import errno
import json
import os
import pickle
import stat

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from rpwjax import cli
from rpwjax.errors import InputError
from rpwjax.keys import KEY_FILE_HEX, SECRET_BYTES, Secret
from rpwjax.release_path import BLOCK_ROWS
from helpers import fixed_key, json_lines, run, slow_unless

ROWS = BLOCK_ROWS + 4_464  # the rows cross a block boundary
HEX = "0123456789abcdef"


def keygen(path, capsys):
    code, out, err = run(["keygen", "-o", path], capsys)
    assert code == 0, err
    return path


def key_hex(path):
    return path.read_text().strip()


def with_digit(path, text, position):
    """A key file equal to ``text`` except for the hex digit at ``position``."""
    digit = HEX[(HEX.index(text[position].lower()) + 1) % 16]
    changed = text[:position] + digit + text[position + 1:]
    path.write_text(changed + "\n")
    assert sum(a != b for a, b in zip(changed, text)) == 1
    return path


def labels_of(path):
    table = pq.read_table(path) if str(path).endswith(".parquet") else pacsv.read_csv(path)
    return table.column("y").to_numpy()


def sidecar(path):
    return json.loads(path.with_name(path.name + ".json").read_text())


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    rng = np.random.default_rng(3)
    y = rng.beta(2, 5, ROWS)
    table = pa.table({"id": np.arange(ROWS), "y": y, "x1": y + rng.normal(0, 0.1, ROWS), "x2": rng.normal(size=ROWS)})
    pq.write_table(table, d / "t.parquet")
    pacsv.write_csv(table.slice(0, 2_000), d / "small.csv")
    np.savetxt(d / "train.txt", rng.beta(2, 5, 3_000))
    # a fixed key (the keygen command has its own tests): every run of this module sees the same fits and outputs
    fixed_key(d / "key", 4)
    for mechanism in ("rpwithprior", "laplace", "rr-on-bins"):
        assert cli.main(["fit", "--labels", str(d / "train.txt"), "--range", "0", "1", "--mechanism", mechanism,
                         "--epsilon", "1", "--key-file", str(d / "key"), "--save", str(d / f"{mechanism}.json")]) == 0
    return d, table


def privatize(capsys, d, out, *extra, params="rpwithprior", src="t.parquet"):
    code, stdout, err = run(["privatize", d / src, "-o", out, "--label-column", "y", "--params",
                             d / f"{params}.json", "--quiet", *extra], capsys)
    assert code == 0, err
    return labels_of(out)


# --------------------------------------------------------------------------- Secret itself


def test_flipping_any_bit_of_the_secret_changes_every_derived_key():
    material = bytes(np.random.default_rng(0).integers(0, 256, SECRET_BYTES, dtype=np.uint8))
    base = Secret(material)
    for block in (0, 1, 12_345):
        reference = base.stream_key("labels", block)
        for bit in range(8 * SECRET_BYTES):
            flipped = bytearray(material)
            flipped[bit // 8] ^= 1 << (bit % 8)
            assert not np.array_equal(Secret(bytes(flipped)).stream_key("labels", block), reference), (block, bit)


def test_blocks_and_purposes_get_distinct_keys():
    secret = Secret(bytes(range(SECRET_BYTES)))
    keys = {tuple(secret.stream_key(purpose, block)) for purpose in ("labels", "histogram", "release")
            for block in range(200)}
    assert len(keys) == 3 * 200
    # a purpose is not confused with a longer purpose, nor with an index
    assert not np.array_equal(secret.stream_key("a", 1), secret.stream_key("a1"))
    assert not np.array_equal(secret.stream_key("labels", 0, 1), secret.stream_key("labels", 1, 0))
    # children and releases are independent secrets
    assert not np.array_equal(secret.child("fit").stream_key("labels"), secret.child("release").stream_key("labels"))
    assert not np.array_equal(secret.child("fit").stream_key("labels"), secret.stream_key("labels"))
    one = secret.for_release("ab" * 16, command="privatize", label_column="y")
    assert one.release_id == "ab" * 16 and one.child("release").release_id == one.release_id
    others = [secret.for_release("ab" * 16, command="privatize", label_column="z"),
              secret.for_release("ac" * 16, command="privatize", label_column="y"), secret]
    assert all(not np.array_equal(one.stream_key("labels"), o.stream_key("labels")) for o in others)
    # every uniform's key has 256 bits
    assert secret.stream_key("labels").dtype == np.uint32 and secret.stream_key("labels").shape == (8,)


def test_the_same_secret_derives_the_same_keys():
    a, b = Secret(bytes(range(SECRET_BYTES))), Secret(bytes(range(SECRET_BYTES)))
    np.testing.assert_array_equal(a.stream_key("labels", 9), b.stream_key("labels", 9))
    assert pickle.loads(pickle.dumps(a)).stream_key("labels", 9).tolist() == a.stream_key("labels", 9).tolist()
    bound = a.for_release("0f" * 16, command="x")
    assert pickle.loads(pickle.dumps(bound)).release_id == bound.release_id


def test_repr_and_str_never_show_the_material():
    material = bytes(range(100, 100 + SECRET_BYTES))
    for secret in (Secret(material), Secret.from_hex(material.hex()), Secret.from_seed(12345)):
        for text in (repr(secret), str(secret), f"{secret}", repr([secret])):
            assert material.hex() not in text and material.hex().upper() not in text
            assert secret.hex() not in text and "hidden" in text
    assert "reproducible" in repr(Secret.from_seed(1)) and "reproducible" not in repr(Secret(material))


def test_from_hex_errors_do_not_echo_the_text():
    for text in ["ab12cd34" * 7 + "ab12cd3", "ab12cd34" * 8 + "ef", "zz" + "ab12cd34" * 7 + "ab12cd"]:
        with pytest.raises(InputError) as err:
            Secret.from_hex(text)
        assert "ab12cd34" not in str(err.value) and text not in str(err.value)


# --------------------------------------------------------------------------- keygen


def test_keygen_writes_64_hex_characters_mode_0600_and_never_overwrites(tmp_path, capsys):
    path = tmp_path / "k"
    code, out, err = run(["keygen", "-o", path], capsys)
    assert code == 0, err
    text = path.read_text()
    assert text.endswith("\n") and len(text.strip()) == KEY_FILE_HEX == 64
    assert all(c in HEX for c in text.strip())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert text.strip() not in out + err  # keygen does not print the key either
    assert Secret.from_file(path).hex() == text.strip()
    code, out, err = run(["keygen", "-o", path], capsys)
    assert code == 2 and "already exists" in err and err.count("\n") == 1
    assert path.read_text() == text  # untouched
    other = keygen(tmp_path / "k2", capsys)
    assert key_hex(other) != text.strip()  # fresh entropy every time


@pytest.mark.parametrize("number", [errno.EROFS, errno.EACCES])
def test_keygen_that_cannot_write_names_the_file_and_the_reason(tmp_path, capsys, monkeypatch, number):
    path = tmp_path / "k"
    real = os.open

    def refused(name, *args, **kwargs):  # a read-only file system, a directory we may not write
        if str(name) == str(path):
            raise OSError(number, os.strerror(number), str(name))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)
    code, out, err = run(["keygen", "-o", path], capsys)
    assert code == 1 and out == "", err
    assert err == f"rpwjax keygen: error: cannot write the key file {str(path)!r}: {os.strerror(number)}\n"
    assert not path.exists()


def test_keygen_makes_missing_folders_owner_only_and_leaves_none_when_it_fails(tmp_path, capsys, monkeypatch):
    """As fit --save, privatize -o and curves --out make their folders, keygen makes the key's (mode 0700, like
    the key's 0600); a key that cannot be written leaves no folder behind."""
    path = tmp_path / "out" / "keys" / "secret.key"
    code, _, err = run(["keygen", "-o", path], capsys)
    assert code == 0, err
    assert len(path.read_text().strip()) == 64 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    for folder in (tmp_path / "out", tmp_path / "out" / "keys"):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    real = os.open

    def refused(name, *args, **kwargs):
        if str(name).endswith("never.key"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(name))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)
    code, _, err = run(["keygen", "-o", tmp_path / "new" / "deeper" / "never.key"], capsys)
    assert code == 1 and "cannot write the key file" in err, err
    assert not (tmp_path / "new").exists()


# --------------------------------------------------------------------------- reproducibility


@pytest.mark.slow
def test_one_hex_digit_first_or_last_changes_the_output(data, tmp_path, capsys):
    d, _ = data
    text = key_hex(d / "key")
    base = privatize(capsys, d, tmp_path / "base.parquet", "--key-file", d / "key")
    for position in (0, KEY_FILE_HEX - 1):
        key = with_digit(tmp_path / f"key{position}", text, position)
        other = privatize(capsys, d, tmp_path / f"o{position}.parquet", "--key-file", key)
        # continuous outputs on a fine grid: independent draws almost never coincide
        assert np.mean(other != base) > 0.5, position
    # and for the private histogram of a fit
    fits = []
    for key in (d / "key", tmp_path / "key0", tmp_path / f"key{KEY_FILE_HEX - 1}"):
        code, out, err = run(["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "rpwithprior",
                              "--epsilon", "1", "--key-file", key, "--json"], capsys)
        assert code == 0, err
        fits.append(json_lines(out)[0]["prior"]["masses"])
    assert fits[0] != fits[1] and fits[0] != fits[2] and fits[1] != fits[2]


@pytest.mark.slow
def test_same_key_file_is_bit_identical_across_runs_and_chunk_sizes(data, tmp_path, capsys):
    d, _ = data
    first = tmp_path / "first.parquet"
    outs = [privatize(capsys, d, first, "--key-file", d / "key")]
    rid = sidecar(first)["release_id"]  # the same key file and release id reproduce the release
    outs += [privatize(capsys, d, tmp_path / f"o{chunk}.parquet", "--key-file", d / "key", "--chunk-rows", chunk,
                       "--release-id", rid) for chunk in (ROWS, 9_999, BLOCK_ROWS)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    assert outs[0].shape == (ROWS,)
    # an inline fit (histogram from the key file too) reproduces as well
    inline = []
    for i in range(2):
        out = tmp_path / f"inline{i}.parquet"
        code, _, err = run(["privatize", d / "t.parquet", "-o", out, "--label-column", "y", "--key-file", d / "key",
                            "--mechanism", "rpwithprior", "--epsilon", "1", "--range", "0", "1", "--quiet",
                            *(["--release-id", inline[0][2]] if inline else [])], capsys)
        assert code == 0, err
        inline.append((labels_of(out), sidecar(out)["params"], sidecar(out)["release_id"]))
    np.testing.assert_array_equal(inline[0][0], inline[1][0])
    assert inline[0][1] == inline[1][1]


@pytest.mark.slow
def test_shards_with_row_offsets_concatenate_to_the_single_run(data, tmp_path, capsys):
    d, table = data
    ledger = tmp_path / "shards.jsonl"
    whole = privatize(capsys, d, tmp_path / "whole.parquet", "--key-file", d / "key", "--ledger", ledger)
    rid = sidecar(tmp_path / "whole.parquet")["release_id"]
    parts = []
    cut = 40_000  # the second shard starts inside block 0 and crosses into block 1
    for i, (lo, hi) in enumerate(((0, cut), (cut, ROWS))):
        shard = tmp_path / f"shard{i}.parquet"
        pq.write_table(table.slice(lo, hi - lo), shard)
        out = tmp_path / f"out{i}.parquet"
        code, _, err = run(["privatize", shard, "-o", out, "--label-column", "y", "--params", d / "rpwithprior.json",
                            "--key-file", d / "key", "--row-offset", lo, "--quiet", "--release-id", rid,
                            "--ledger", tmp_path / f"shard{i}.jsonl"], capsys)
        assert code == 0, err
        parts.append(labels_of(out))
        assert (sidecar(out)["release_id"], sidecar(out)["row_offset"], sidecar(out)["rows"]) == (rid, lo, hi - lo)
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    # the release id given back for rows it already covered, with other input, is refused where the ledger sees it
    code, _, err = run(["privatize", tmp_path / "shard1.parquet", "-o", tmp_path / "wrong.parquet", "--label-column",
                        "y", "--params", d / "rpwithprior.json", "--key-file", d / "key", "--quiet", "--release-id",
                        rid, "--ledger", ledger], capsys)
    assert code == 2 and "already used" in err and rid in err, err
    assert not (tmp_path / "wrong.parquet").exists()
    # without it, the shard is a new release: other noise
    code, _, err = run(["privatize", tmp_path / "shard1.parquet", "-o", tmp_path / "new.parquet", "--label-column",
                        "y", "--params", d / "rpwithprior.json", "--key-file", d / "key", "--quiet"], capsys)
    assert code == 0, err
    assert np.mean(labels_of(tmp_path / "new.parquet") != whole[cut:]) > 0.5


@pytest.mark.slow
def test_without_a_key_file_every_run_draws_fresh_entropy(data, tmp_path, capsys):
    d, _ = data
    a = privatize(capsys, d, tmp_path / "a.parquet")
    b = privatize(capsys, d, tmp_path / "b.parquet")
    assert np.mean(a != b) > 0.5
    assert sidecar(tmp_path / "a.parquet")["reproducible_seed"] is False


@pytest.mark.slow
def test_privatize_table_takes_a_key_file(data, tmp_path, capsys):
    d, _ = data
    outs = []
    for i in range(3):
        out = tmp_path / f"table{i}.csv"
        again = ["--release-id", sidecar(tmp_path / "table0.csv")["release_id"]] if i == 1 else []
        code, _, err = run(["privatize-table", d / "small.csv", "-o", out, "--label-column", "y", "--range", "0", "1",
                            "--epsilon", "1", "--pipeline", "linear-prior", "--key-file", d / "key", *again], capsys)
        assert code == 0, err
        outs.append(labels_of(out))
    np.testing.assert_array_equal(outs[0], outs[1])  # the same release id reproduces the release
    assert np.mean(outs[2] != outs[0]) > 0.5  # a new release with the same key file draws other noise
    key = with_digit(tmp_path / "key-last", key_hex(d / "key"), KEY_FILE_HEX - 1)
    code, _, err = run(["privatize-table", d / "small.csv", "-o", tmp_path / "other.csv", "--label-column", "y",
                        "--range", "0", "1", "--epsilon", "1", "--pipeline", "linear-prior", "--key-file", key], capsys)
    assert code == 0, err
    assert np.mean(labels_of(tmp_path / "other.csv") != outs[0]) > 0.5
    assert sidecar(tmp_path / "table0.csv")["reproducible_seed"] is False


# --------------------------------------------------------------------------- key material stays secret


@pytest.mark.slow
def test_key_material_appears_in_no_output(data, tmp_path, capsys):
    d, _ = data
    key = keygen(tmp_path / "secret.key", capsys)
    text = key_hex(key)
    needles = [text, text.upper(), text[:32], text[32:]]
    raw = bytes.fromhex(text)
    seen_text, seen_bytes = [], []

    def collect(code, out, err):
        assert code == 0, err
        seen_text.extend([out, err])

    params = tmp_path / "p.json"
    collect(*run(["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "rpwithprior",
                  "--epsilon", "1", "--key-file", key, "--save", params], capsys))
    collect(*run(["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "rpwithprior",
                  "--epsilon", "0.5", "1", "--key-file", key, "--json"], capsys))
    collect(*run(["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "rpwithprior",
                  "--epsilon", "1", "--key-file", key], capsys))
    outputs = [params]
    for name, argv in (
        ("o.parquet", ["--params", params]),
        ("o.csv", ["--params", params]),
        ("inline.csv", ["--mechanism", "rpwithprior", "--epsilon", "1", "--range", "0", "1"]),
        ("denoised.csv", ["--params", params, "--denoise", "posterior"]),
    ):
        out = tmp_path / name
        src = d / ("small.csv" if name.endswith(".csv") else "t.parquet")
        collect(*run(["privatize", src, "-o", out, "--label-column", "y", "--key-file", key, *argv], capsys))
        outputs += [out, out.with_name(out.name + ".json")]
    table_out = tmp_path / "table.parquet"
    collect(*run(["privatize-table", d / "small.csv", "-o", table_out, "--label-column", "y", "--range", "0", "1",
                  "--epsilon", "1", "--key-file", key], capsys))
    outputs += [table_out, table_out.with_name(table_out.name + ".json")]
    for path in outputs:
        assert path.exists(), path
        seen_bytes.append(path.read_bytes())
    for blob in seen_bytes:
        assert raw not in blob
        for needle in needles:
            assert needle.encode() not in blob
    for t in seen_text:
        for needle in needles:
            assert needle not in t


@pytest.mark.parametrize("content, why", [
    ("ab12cd34" * 7 + "ab12cd3\n", "63 characters"),
    ("ab12cd34" * 8 + "ab\n", "66 characters"),
    ("zq" + "ab12cd34" * 7 + "ab12cd\n", "non-hex"),
    (b"\xff\xfe" * 32, "not ASCII"),
    ("", "0 characters"),
    (None, "does not exist"),
    ("0" * 64 + "\n", "take only 1 distinct value"),  # all zeros: typed, not drawn
    ("01234567" * 8 + "\n", "take only 4 distinct value"),  # a repeated pattern
])
def test_a_bad_key_file_exits_2_with_one_line_that_hides_its_content(data, tmp_path, capsys, content, why):
    d, _ = data
    key = tmp_path / "bad.key"
    if isinstance(content, bytes):
        key.write_bytes(content)
    elif content is not None:
        key.write_text(content)
    for argv in (
        ["privatize", d / "small.csv", "-o", tmp_path / "o.csv", "--label-column", "y", "--params",
         d / "rpwithprior.json", "--key-file", key, "--quiet"],
        ["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "rpwithprior", "--epsilon", "1",
         "--key-file", key],
        ["privatize-table", d / "small.csv", "-o", tmp_path / "t.csv", "--label-column", "y", "--range", "0", "1",
         "--epsilon", "1", "--key-file", key],
    ):
        code, out, err = run(argv, capsys)
        assert code == 2, err
        assert err.count("\n") == 1 and "key file" in err and why in err and str(key) in err
        if isinstance(content, str) and content.strip():
            text = content.strip()
            for i in range(len(text) - 7):  # not even 8 characters of it
                assert text[i:i + 8] not in err + out
        assert not (tmp_path / "o.csv").exists() and not (tmp_path / "t.csv").exists()


def test_a_weak_key_names_where_a_key_file_must_come_from():
    with pytest.raises(InputError, match="must come from `rpwjax keygen` or an equally strong source"):
        Secret.from_hex("ab" * 32)
    Secret.from_hex("0123456789abcdef" * 4)  # 8 distinct bytes: accepted


def test_a_key_file_others_can_read_gets_one_warning_line(data, tmp_path, capsys):
    d, _ = data
    key = fixed_key(tmp_path / "open.key", 5)
    argv = ["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "laplace", "--epsilon", "1",
            "--key-file", key]
    code, _, err = run(argv, capsys)
    assert code == 0 and err == "", err  # mode 0600: nothing to say
    key.chmod(0o644)
    code, _, err = run(argv, capsys)
    assert code == 0, err
    assert err.count("\n") == 1 and err.startswith("rpwjax fit: warning: key file ") and str(key) in err, err
    assert "mode 0644" in err and "chmod 600" in err and key_hex(key)[:8] not in err


def test_key_material_given_as_the_path_is_not_echoed(data, tmp_path, capsys):
    d, _ = data
    text = key_hex(d / "key")  # e.g. --key-file "$(cat KEYFILE)"
    code, out, err = run(["privatize", d / "small.csv", "-o", tmp_path / "o.csv", "--label-column", "y", "--params",
                          d / "rpwithprior.json", "--key-file", text, "--quiet"], capsys)
    assert code == 2 and err.count("\n") == 1 and "looks like key material" in err
    assert text[:16] not in err + out and text[-16:] not in err + out
    assert not (tmp_path / "o.csv").exists()


def test_key_file_and_seed_together_are_refused(data, tmp_path, capsys):
    d, _ = data
    code, _, err = run(["privatize", d / "small.csv", "-o", tmp_path / "o.csv", "--label-column", "y", "--params",
                        d / "rpwithprior.json", "--key-file", d / "key", "--seed", "3", "--quiet"], capsys)
    assert code == 2 and "--key-file or --seed" in err and not (tmp_path / "o.csv").exists()


# --------------------------------------------------------------------------- experiments-only seeds


def test_every_command_that_takes_a_seed_warns_once(data, tmp_path, capsys):
    d, _ = data
    warning = "warning: reproducible seed: not for production"
    for argv, code in (
        (["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "laplace", "--epsilon", "1"], 0),
        (["privatize", d / "small.csv", "-o", tmp_path / "o.csv", "--label-column", "y", "--params",
          d / "laplace.json", "--quiet"], 0),
        # the warning comes before any work: an option refused later still shows it
        (["privatize-table", d / "small.csv", "-o", tmp_path / "t.csv", "--label-column", "y", "--range", "0", "1",
          "--epsilon", "1", "--epochs", "3"], 2),
    ):
        got, out, err = run([*argv, "--seed", "3"], capsys)
        assert got == code, err
        lines = err.splitlines()
        assert lines[0] == f"rpwjax {argv[0]}: {warning} (--seed 3 is for experiments; a release takes --key-file " \
                           "or fresh OS entropy)", err
        assert sum(warning in line for line in lines) == 1 and len(lines) == 1 + (code != 0), err
        for written in tmp_path.iterdir():
            written.unlink()
        got, out, err = run(argv, capsys)  # without a seed: no warning
        assert got == code and warning not in err, err


def test_fit_json_prints_one_line_per_epsilon(data, capsys):
    d, _ = data
    for epsilons in (["1"], ["0.5", "1"]):
        code, out, err = run(["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "laplace",
                              "--epsilon", *epsilons, "--json"], capsys)
        assert code == 0, err
        assert len(out.splitlines()) == len(epsilons)
        assert [r["epsilon"] for r in json_lines(out)] == [float(e) for e in epsilons]


@pytest.mark.slow
def test_seed_is_marked_reproducible_and_not_for_production(data, tmp_path, capsys):
    d, _ = data
    a = privatize(capsys, d, tmp_path / "a.csv", "--seed", 3, src="small.csv")
    b = privatize(capsys, d, tmp_path / "b.csv", "--seed", 3, src="small.csv")
    np.testing.assert_array_equal(a, b)  # what a seed is for
    side = sidecar(tmp_path / "a.csv")
    assert side["reproducible_seed"] is True and "not for production" in json.dumps(side)
    keyed = privatize(capsys, d, tmp_path / "k.csv", "--key-file", d / "key", src="small.csv")
    side = sidecar(tmp_path / "k.csv")
    assert side["reproducible_seed"] is False and "not for production" not in json.dumps(side)
    assert np.mean(keyed != a) > 0.5
    # a fit whose histogram used a seed marks the release made from it, whatever the release's key
    seeded = tmp_path / "seeded.json"
    code, _, err = run(["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "rpwithprior",
                        "--epsilon", "1", "--seed", 4, "--save", seeded], capsys)
    assert code == 0, err
    assert json.loads(seeded.read_text())["reproducible_seed"] is True
    code, _, err = run(["privatize", d / "small.csv", "-o", tmp_path / "s.csv", "--label-column", "y", "--params",
                        seeded, "--key-file", d / "key", "--quiet"], capsys)
    assert code == 0, err
    side = sidecar(tmp_path / "s.csv")
    assert side["reproducible_seed"] is True and "not for production" in json.dumps(side)


# --------------------------------------------------------------------------- priors


def test_private_prior_is_the_default_for_fit_and_privatize(data, tmp_path, capsys):
    d, _ = data
    code, out, err = run(["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "rpwithprior",
                          "--epsilon", "1", "--json"], capsys)
    assert code == 0, err
    record = json_lines(out)[0]
    assert record["prior"]["kind"] == "private-histogram" and record["epsilon_prior"] > 0
    assert record["epsilon_prior"] + record["epsilon_mechanism"] == pytest.approx(record["epsilon"])
    out_path = tmp_path / "o.csv"
    code, _, err = run(["privatize", d / "small.csv", "-o", out_path, "--label-column", "y", "--mechanism",
                        "rpwithprior", "--epsilon", "1", "--range", "0", "1", "--quiet"], capsys)
    assert code == 0, err
    side = sidecar(out_path)
    assert side["prior"]["kind"] == "private-histogram" and side["epsilon_prior"] > 0


@pytest.mark.slow
def test_privatize_refuses_an_empirical_prior_unless_it_is_declared_public(data, tmp_path, capsys):
    d, _ = data
    inline = ["--mechanism", "rpwithprior", "--epsilon", "1", "--range", "0", "1", "--prior", "empirical"]
    out = tmp_path / "o.csv"
    code, _, err = run(["privatize", d / "small.csv", "-o", out, "--label-column", "y", "--quiet", *inline], capsys)
    assert code == 2 and "--prior-is-public" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # no output, no sidecar, no temporary file
    # a params file fitted on an empirical prior is refused the same way
    params = tmp_path / "empirical.json"
    code, _, err = run(["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "rpwithprior",
                        "--epsilon", "1", "--prior", "empirical", "--prior-is-public", "--save", params], capsys)
    assert code == 0, err
    record = json.loads(params.read_text())
    assert record["prior"]["kind"] == "empirical" and record["epsilon_prior"] == 0
    note = record["prior"]["note"]
    assert "only if" in note and "public" in note and "functions of the raw labels" in note
    code, _, err = run(["privatize", d / "small.csv", "-o", out, "--label-column", "y", "--params", params, "--quiet"],
                       capsys)
    assert code == 2 and "--prior-is-public" in err and not out.exists()
    # declared public: both work, and the sidecar keeps the note and the declaration
    for argv in (inline, ["--params", params]):
        code, _, err = run(["privatize", d / "small.csv", "-o", out, "--label-column", "y", "--quiet",
                            "--prior-is-public", *argv], capsys)
        assert code == 0, err
        side = sidecar(out)
        assert side["prior"]["kind"] == "empirical" and "only if" in side["prior"]["note"]
        assert "--prior-is-public" in side["prior_is_public"]
        assert labels_of(out).shape == (2_000,)
        out.unlink()
        out.with_name(out.name + ".json").unlink()


def test_prior_epsilon_under_an_empirical_prior_is_refused(data, capsys):
    d, _ = data
    code, _, err = run(["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "rpwithprior",
                        "--epsilon", "1", "--prior", "empirical", "--prior-epsilon", "0.1"], capsys)
    assert code == 2 and "--prior-epsilon" in err


@pytest.mark.slow
def test_multi_epsilon_fit_reports_each_epsilon_and_the_total_once(data, capsys):
    d, _ = data
    epsilons = [0.5, 1.0, 2.0]
    code, out, err = run(["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "rpwithprior",
                          "--epsilon", *epsilons, "--key-file", d / "key", "--json"], capsys)
    assert code == 0, err
    records = json_lines(out)
    assert [r["epsilon"] for r in records] == epsilons
    for r in records:
        assert r["epsilon_prior"] + r["epsilon_mechanism"] == pytest.approx(r["epsilon"])
        total = r["all_records"]
        assert total["records"] == len(epsilons) and total["empirical_prior"] is False
        assert total["epsilon_prior_total"] == pytest.approx(sum(q["epsilon_prior"] for q in records))
    assert records[0]["all_records"] == records[-1]["all_records"]
    assert err.count(records[0]["all_records"]["note"]) == 1  # the note once, on stderr, not in the JSON stream
    # the text format prints it once too
    code, out, err = run(["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "rpwithprior",
                          "--epsilon", *epsilons, "--key-file", d / "key"], capsys)
    assert code == 0, err
    assert out.count(records[0]["all_records"]["note"]) == 1 and len(out.strip().splitlines()) == len(epsilons) + 1
    # an empirical prior spends nothing, and the total says the records read the raw labels
    code, out, err = run(["fit", "--labels", d / "train.txt", "--range", "0", "1", "--mechanism", "rpwithprior",
                          "--epsilon", *epsilons, "--prior", "empirical", "--prior-is-public", "--json"], capsys)
    assert code == 0, err
    total = json_lines(out)[0]["all_records"]
    assert total["epsilon_prior_total"] == 0 and total["empirical_prior"] is True


# --------------------------------------------------------------------------- the public output range and grid


@pytest.mark.parametrize("mechanism", slow_unless(["rpwithprior", "laplace", "rr-on-bins"], fast=["laplace"]))
def test_sidecar_output_range_and_grid_describe_every_released_value(data, tmp_path, capsys, mechanism):
    d, _ = data
    out = tmp_path / "o.parquet"
    noisy = privatize(capsys, d, out, "--key-file", d / "key", params=mechanism)
    side = sidecar(out)
    a, b = side["output_range"]
    assert a < b and np.all(noisy >= a) and np.all(noisy <= b)
    grid = side["output_grid"]
    if mechanism == "rr-on-bins":  # discrete: the mechanism's own output values, no grid
        outputs = np.asarray(side["params"]["outputs"], np.float64)
        assert grid is None and np.all(np.isin(noisy, outputs)) and np.unique(noisy).size > 1
        assert a == outputs.min() and b == outputs.max()
    else:
        assert grid > 0 and np.log2(grid) == np.round(np.log2(grid))  # a power of two
        np.testing.assert_array_equal(np.round(noisy / grid) * grid, noisy)
        assert a == np.round(a / grid) * grid and b == np.round(b / grid) * grid  # the ends are grid points
        assert np.unique(noisy).size > 100  # the grid is fine, not a handful of values
    if mechanism == "laplace":
        assert a < 0 and b > 1  # unbounded noise, clamped to a public range wider than the labels'
