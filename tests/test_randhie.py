"""The bundled RAND Health Insurance Experiment data: the file, its provenance, the loader."""

import gzip
import hashlib
import io
import importlib.resources

import numpy as np

from rpwjax.experiments.datasets import RANDHIE_RANGE, load_dataset


def test_file_matches_provenance():
    data = importlib.resources.files("rpwjax").joinpath("data")
    digest = hashlib.sha256(data.joinpath("randhie.csv.gz").read_bytes()).hexdigest()
    assert digest == "cb910bda24941992ca6c12d6b6fb9f72de7c34560986694469c5a9410cf722bf"
    assert digest in data.joinpath("PROVENANCE.md").read_text()


def test_loader_shape_range_and_clip():
    d = load_dataset("randhie")
    assert (d.n, d.d) == (20190, 9) and d.name == "randhie"
    assert d.feature_names == ("lncoins", "idp", "lpi", "fmde", "physlm", "disea", "hlthg", "hlthf", "hlthp")
    assert (d.lo, d.hi) == RANDHIE_RANGE == (0.0, 30.0)
    # a count label: integers, zero-inflated, clipped at the public bound
    assert np.all(d.labels == np.round(d.labels)) and d.labels.min() == 0.0 and d.labels.max() == 30.0
    assert 0.25 < np.mean(d.labels == 0) < 0.4
    assert any("clipped" in note for note in d.notes)
    # the clip is the only change: the raw counts below the bound are untouched
    raw_bytes = importlib.resources.files("rpwjax").joinpath("data").joinpath("randhie.csv.gz").read_bytes()
    raw = np.loadtxt(io.StringIO(gzip.decompress(raw_bytes).decode()), delimiter=",", skiprows=1, usecols=0)
    assert raw.shape == (20190,) and raw.max() > 30
    np.testing.assert_array_equal(d.labels, np.minimum(raw, 30.0))
