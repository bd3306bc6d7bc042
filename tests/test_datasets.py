"""Bundled data sets, the user-table and Criteo loaders, the synthetic generator, the split."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import importlib.resources
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rpwjax.experiments.datasets import (
    CRITEO_CATEGORICAL,
    Dataset,
    criteo_synthetic,
    criteo_synthetic_labels,
    load_criteo,
    load_dataset,
    load_table,
    train_test_split,
)
from rpwjax.errors import InputError

CRITEO_SAMPLE = Path(__file__).parent / "data" / "criteo_search_sample_1000.tsv"


@pytest.fixture(scope="module")
def california():
    return load_dataset("california")


@pytest.fixture(scope="module")
def crime():
    return load_dataset("crime")


# --------------------------------------------------------------------------- bundled files


@pytest.mark.parametrize(
    "filename, sha256",
    [
        ("california_housing_sklearn.csv.gz", "dd226f82db6264ad85a0a90c04c1bd4afe0374cd273f5599a838f3d79f953ea9"),
        ("communities.data.gz", "56018c09158ea0af5a9d6bf4f645a3c7a39e8efc75b881c6183f942b2f26fdbf"),
        ("communities.names", "80914f24ab37261fb0fbda7e417cad8001335dadda4a8d702c265601ef8434fc"),
    ],
)
def test_bundled_files_match_provenance(filename, sha256):
    data = importlib.resources.files("rpwjax").joinpath("data")
    assert hashlib.sha256(data.joinpath(filename).read_bytes()).hexdigest() == sha256
    assert sha256 in data.joinpath("PROVENANCE.md").read_text()


def test_california_shape_range_and_documented_means(california):
    assert california.features.shape == (20640, 8)
    assert california.features.dtype == np.float32 and california.labels.dtype == np.float64
    assert (california.lo, california.hi) == (0.14999, 5.00001)
    assert california.lo <= california.labels.min() and california.labels.max() <= california.hi
    assert california.feature_names[0] == "MedInc" and "MedHouseVal" not in california.feature_names
    assert int(np.sum(california.labels == 5.00001)) == 965  # the capped rows (data README)
    # Feature means documented by scikit-learn (and the data README).
    expected = [3.870671, 28.639486, 5.429000, 1.096675, 1425.476744, 3.070655, 35.631861, -119.569704]
    np.testing.assert_allclose(california.features.astype(np.float64).mean(axis=0), expected, rtol=1e-5)


def test_crime_cleaning(crime):
    # 128 columns - 5 non-predictive (state, county, community, communityname, fold)
    # - 1 target = 122 predictive; - racepctblack = 121; - the 22 police/LEMAS
    # columns with 1,675 gaps each = 99. OtherPerCap (one gap, filled) stays.
    assert crime.features.shape == (1994, 99)
    assert not np.isnan(crime.features).any()
    assert (crime.lo, crime.hi) == (0.0, 1.0)
    assert crime.labels.min() >= 0 and crime.labels.max() <= 1
    assert crime.labels.mean() == pytest.approx(0.237979, abs=1e-6)
    names = set(crime.feature_names)
    assert "OtherPerCap" in names and "racepctblack" not in names
    assert not names & {"state", "county", "community", "communityname", "fold", "ViolentCrimesPerPop"}
    # Of the police/LEMAS columns only LemasPctOfficDrugUn is complete, so it stays.
    police = {n for n in names if n.startswith(("Lemas", "Polic", "PctPolic", "Offic", "NumKindsDrugs", "RacialMatch"))}
    assert police == {"LemasPctOfficDrugUn"}
    assert any(note.startswith("dropped 22 columns with missing values") for note in crime.notes)
    assert any("OtherPerCap" in note for note in crime.notes)


def test_load_dataset_rejects_unknown_names_and_misplaced_n():
    with pytest.raises(InputError, match="'mnist'"):
        load_dataset("mnist")
    with pytest.raises(InputError, match="n=10"):
        load_dataset("crime", n=10)


# --------------------------------------------------------------------------- Criteo


def _sample_rows():
    with open(CRITEO_SAMPLE, newline="") as fh:
        return list(csv.reader(fh, delimiter="\t"))


def test_criteo_sample_keeps_exactly_the_rows_in_range():
    rows = _sample_rows()
    kept = [r for r in rows if 0 <= float(r[1]) <= 400]
    assert len(rows) == 1000 and len(kept) == 134  # 139 sales, 5 of them above 400
    data = load_criteo(CRITEO_SAMPLE)
    assert data.labels.shape == (134,) and data.features.shape == (134, 4 + 32)
    np.testing.assert_array_equal(data.labels, [float(r[1]) for r in kept])
    assert (data.lo, data.hi) == (0.0, 400.0)
    # The missing-value indicator of nb_clicks_1week (column 5), counted independently.
    missing = [float(r[4]) < 0 for r in kept]
    np.testing.assert_array_equal(data.features[:, data.feature_names.index("nb_clicks_1week_missing")], missing)
    # Every present categorical value lands in exactly one bucket.
    present = [sum(r[i] != "-1" for i in range(6, 19)) + (r[21] != "-1") for r in kept]
    assert len(CRITEO_CATEGORICAL) == 14
    np.testing.assert_array_equal(data.features[:, 4:].sum(axis=1), present)


def test_criteo_streaming_does_not_depend_on_block_size():
    whole = load_criteo(CRITEO_SAMPLE)
    small = load_criteo(CRITEO_SAMPLE, chunk_rows=10)  # 64 KiB blocks: several per file
    np.testing.assert_array_equal(whole.labels, small.labels)
    np.testing.assert_array_equal(whole.features, small.features)


def test_criteo_rejects_bad_arguments(tmp_path):
    with pytest.raises(InputError, match="chunk_rows=0"):
        load_criteo(CRITEO_SAMPLE, chunk_rows=0)
    with pytest.raises(InputError, match="no such file"):
        load_criteo(tmp_path / "missing.tsv")
    bad = tmp_path / "bad.tsv"
    bad.write_text("1\t2\t3\n")
    with pytest.raises(InputError, match="23-column"):
        load_criteo(bad)


def test_synthetic_criteo_label_shape():
    y = criteo_synthetic_labels(200_000, seed=3)
    assert y.dtype == np.float64 and y.min() >= 0 and y.max() <= 400
    # Binomial standard error at n = 200k is below 0.001; allow 5 of them.
    assert np.mean(y > 170) == pytest.approx(0.13, abs=0.005)
    assert np.mean(y == 0) == pytest.approx(0.097, abs=0.005)
    positive = y[y > 0]
    assert 50 < np.median(positive) < 80 and 70 < positive.mean() < 110  # real sample: 58, 82


def test_synthetic_criteo_is_deterministic_and_learnable():
    data = load_dataset("criteo-synthetic", n=20_000, seed=5)
    assert data.features.shape == (20_000, 8) and (data.lo, data.hi) == (0.0, 400.0)
    np.testing.assert_array_equal(data.labels, criteo_synthetic_labels(20_000, seed=5))
    np.testing.assert_array_equal(data.features, criteo_synthetic(20_000, seed=5).features)
    assert not np.array_equal(data.labels, criteo_synthetic_labels(20_000, seed=6))
    corr = [np.corrcoef(data.features[:, j], np.log1p(data.labels))[0, 1] for j in range(8)]
    assert min(corr[:6]) > 0.1 and max(abs(c) for c in corr[6:]) < 0.05


# --------------------------------------------------------------------------- user tables


def _write_csv(path, header, rows):
    path.write_text("\n".join([",".join(header)] + [",".join(map(str, r)) for r in rows]) + "\n")
    return path


def test_load_table_csv_and_parquet(tmp_path):
    rows = [(1.0, 0.5, "a", 3), (2.0, 0.25, "b", ""), (3.0, 1.0, "c", 4)]
    path = _write_csv(tmp_path / "t.csv", ["x", "y", "city", "gappy"], rows)
    with pytest.warns(UserWarning) as caught:
        data = load_table(path, "y", 0.0, 1.0)
    said = " ".join(str(w.message) for w in caught)
    assert "city (not numeric (text))" in said and "gappy has 1 missing value(s)" in said
    # a feature with a gap is kept: the gap filled with the median of the observed values, plus an indicator
    assert isinstance(data, Dataset) and data.feature_names == ("x", "gappy", "gappy_missing")
    # each column standardized (in float64, then float32); the indicator 0/1
    unit = lambda v: (np.asarray(v) - np.mean(v)) / np.std(v)  # noqa: E731
    np.testing.assert_allclose(data.features, np.c_[unit([1, 2, 3]), unit([3, 3.5, 4]), [0, 1, 0]], atol=1e-6)
    np.testing.assert_array_equal(data.labels, [0.5, 0.25, 1.0])
    assert any("gappy" in note for note in data.notes) and any("city" in note for note in data.notes)

    parquet = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0], "flag": [True, False], "y": [0.1, 0.9]}), parquet)
    data = load_table(parquet, "y", 0.0, 1.0)
    assert data.feature_names == ("x", "flag") and data.features.dtype == np.float32
    np.testing.assert_allclose(data.features, [[-1, 1], [1, -1]], atol=1e-6)


def test_a_users_table_keeps_features_with_a_large_offset_or_magnitude(tmp_path):
    """Features are standardized in float64 before their float32 copy: a timestamp-like column (1.7e9 + a
    spread of 100) keeps its distinct values, which float32 would round to a few, and a column near 1e39 (past
    float32) stays finite."""
    rng = np.random.default_rng(2)
    u = rng.uniform(0, 100, 400)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"t": 1.7e9 + u, "big": 1e39 * (1 + u / 100), "y": u / 20}), path)
    data = load_table(path, "y", 0.0, 5.0)
    assert data.features.dtype == np.float32 and np.isfinite(data.features).all()
    assert np.unique(data.features[:, 0]).size > 390
    np.testing.assert_allclose(data.features[:, 0], (u - u.mean()) / u.std(), atol=1e-4)
    np.testing.assert_allclose(data.features[:, 1], (u - u.mean()) / u.std(), atol=1e-4)


def test_a_users_table_is_never_named_as_a_bundled_data_set(tmp_path):
    """A file named like a bundled data set loads under another name (``california-file``): its rows never pass
    for the bundled set's in results.csv, nor take its paper config; a user's table trains on scaled labels."""
    path = _write_csv(tmp_path / "california.csv", ["x", "y"], [(1, 0.5), (2, 0.25), (3, 1.0)])
    data = load_table(path, "y", 0.0, 1.0)
    assert data.name == "california-file" and data.scaled_targets
    assert load_table(_write_csv(tmp_path / "mine.csv", ["x", "y"], [(1, 0.5), (2, 0.2)]), "y", 0, 1).name == "mine"
    assert not load_dataset("crime").scaled_targets


def test_load_table_errors_name_the_value(tmp_path):
    path = _write_csv(tmp_path / "t.csv", ["x", "y"], [(1, 0.5), (2, 7.5)])
    with pytest.raises(InputError, match="'price'.*'x', 'y'"):
        load_table(path, "price", 0.0, 1.0)
    with pytest.raises(InputError, match=r"label 7\.5 in column 'y' .*at data row 2 \(line 3\) of .*t\.csv"):
        load_table(path, "y", 0.0, 1.0)
    np.testing.assert_array_equal(load_table(path, "y", 0.0, 1.0, clip=True).labels, [0.5, 1.0])
    nan_path = _write_csv(tmp_path / "nan.csv", ["x", "y"], [(1, 0.5), (2, "")])
    with pytest.raises(InputError, match=r"missing label in column 'y'.*data row 2 \(line 3\) of .*nan\.csv"):
        load_table(nan_path, "y", 0.0, 1.0, clip=True)
    with pytest.raises(InputError, match="lo < hi"):
        load_table(path, "y", 1.0, 0.0)
    text = _write_csv(tmp_path / "text.csv", ["x", "y"], [(1, "high"), (2, "low")])
    with pytest.raises(InputError, match=r"label 'high' in column 'y' is not a number, at data row 1 .*text\.csv"):
        load_table(text, "y", 0.0, 1.0)
    sheet = tmp_path / "t.xlsx"
    sheet.write_text("")
    with pytest.raises(InputError, match="xlsx"):
        load_table(sheet, "y", 0.0, 1.0)


# --------------------------------------------------------------------------- split


def test_split_is_deterministic_80_20(california):
    a, b = train_test_split(california, seed=0), train_test_split(california, seed=0)
    assert a.x_train.shape == (16512, 8) and a.x_test.shape == (4128, 8)
    np.testing.assert_array_equal(a.train_index, b.train_index)
    np.testing.assert_array_equal(a.x_test, b.x_test)
    assert not np.array_equal(a.test_index, train_test_split(california, seed=1).test_index)
    assert a.split_seed == 0 and train_test_split(california, seed=np.int64(3)).split_seed == 3
    with pytest.raises(InputError, match="split seed must be an integer from 0 to .*, got split seed=-1"):
        train_test_split(california, seed=-1)
    assert np.union1d(a.train_index, a.test_index).size == 20640
    np.testing.assert_array_equal(a.y_train, california.labels[a.train_index])


def test_standardization_uses_train_rows_only(crime):
    split = train_test_split(crime, seed=0)
    train = crime.features[split.train_index].astype(np.float64)
    np.testing.assert_allclose(split.feature_mean, train.mean(axis=0))
    np.testing.assert_allclose(split.x_train.mean(axis=0), 0, atol=1e-5)
    expected = (crime.features[split.test_index] - split.feature_mean) / split.feature_scale
    np.testing.assert_allclose(split.x_test, expected, rtol=1e-5, atol=1e-5)
    # Changing the test rows' features changes nothing learned from the train rows.
    features = crime.features.copy()
    features[split.test_index] = 1e3
    moved = train_test_split(dataclasses.replace(crime, features=features), seed=0)
    np.testing.assert_array_equal(moved.feature_mean, split.feature_mean)
    np.testing.assert_array_equal(moved.x_train, split.x_train)
