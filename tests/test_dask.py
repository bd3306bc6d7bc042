"""Dask integration: a partitioned data set privatized on a local cluster equals one process."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

dd = pytest.importorskip("dask.dataframe", reason="dask is an optional extra (pip install 'rpwjax[dask]')")
distributed = pytest.importorskip("distributed", reason="dask.distributed is part of the dask extra")

import pandas as pd  # noqa: E402

from rpwjax import api, cli  # noqa: E402
from rpwjax.dask import privatize_dataframe  # noqa: E402
from rpwjax.keys import Secret  # noqa: E402


@pytest.mark.slow
def test_local_cluster_equals_single_process(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n = 150_001
    frame = pd.DataFrame({"id": np.arange(n), "y": rng.beta(2, 5, n), "note": rng.choice(["a", "b"], n)})
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "all.parquet")
    np.savetxt(tmp_path / "train.txt", rng.beta(2, 5, 500))
    assert cli.main(["keygen", "-o", str(tmp_path / "key")]) == 0
    assert cli.main(["fit", "--labels", str(tmp_path / "train.txt"), "--range", "0", "1", "--mechanism", "rpwithprior",
                     "--epsilon", "1", "--save", str(tmp_path / "p.json")]) == 0
    assert cli.main(["privatize", str(tmp_path / "all.parquet"), "-o", str(tmp_path / "one.parquet"), "--label-column",
                     "y", "--key-file", str(tmp_path / "key"), "--params", str(tmp_path / "p.json"), "--quiet"]) == 0
    capsys.readouterr()
    single = pq.read_table(tmp_path / "one.parquet").column("y").to_numpy()
    release_id = json.loads((tmp_path / "one.parquet.json").read_text())["release_id"]

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with distributed.Client(cluster):
            ddf = dd.from_pandas(frame, npartitions=7)  # uneven partitions, not aligned to blocks
            # the same key file and release id as the single-process CLI run
            out = privatize_dataframe(ddf, label_column="y", params=tmp_path / "p.json",
                                      secret=Secret.from_file(tmp_path / "key"), release_id=release_id).compute()
    assert list(out.columns) == ["id", "y", "note"]
    np.testing.assert_array_equal(out["id"].to_numpy(), frame["id"].to_numpy())
    np.testing.assert_array_equal(out["y"].to_numpy(), single)


def test_missing_column_is_named():
    frame = dd.from_pandas(pd.DataFrame({"a": [0.1, 0.2]}), npartitions=1)
    params = api.fit("laplace", [0.1], range=(0, 1), epsilon=1.0).params
    with pytest.raises(api.InputError, match="'y' not found"):
        privatize_dataframe(frame, label_column="y", params=params, secret=Secret.from_entropy())


def test_a_secret_is_required():
    frame = dd.from_pandas(pd.DataFrame({"y": [0.1, 0.2]}), npartitions=1)
    params = api.fit("laplace", [0.1], range=(0, 1), epsilon=1.0).params
    with pytest.raises(api.InputError, match="rpwjax.keys.Secret"):
        privatize_dataframe(frame, label_column="y", params=params, secret=9)


def test_a_saved_fit_is_verified_and_releases_what_its_parameters_do(tmp_path, capsys):
    """``params`` may be the saved fit's file, checked as ``privatize --params`` checks it: the same labels as
    its parameters give, and a file whose parameters were edited is refused, naming it."""
    y = np.random.default_rng(1).beta(2, 5, 300)
    np.savetxt(tmp_path / "train.txt", y)
    assert cli.main(["fit", "--labels", str(tmp_path / "train.txt"), "--range", "0", "1", "--mechanism", "rpwithprior",
                     "--epsilon", "1", "--save", str(tmp_path / "p.json")]) == 0
    capsys.readouterr()
    frame = dd.from_pandas(pd.DataFrame({"y": y}), npartitions=3)
    secret = Secret.from_entropy()
    params, _ = api.load_params(json.loads((tmp_path / "p.json").read_text()))
    run = lambda p: privatize_dataframe(frame, label_column="y", params=p, secret=secret,  # noqa: E731
                                        release_id="ab" * 16).compute()["y"].to_numpy()
    np.testing.assert_array_equal(run(str(tmp_path / "p.json")), run(params))
    saved = json.loads((tmp_path / "p.json").read_text())
    saved["params"]["A1"] = 0.0
    (tmp_path / "edited.json").write_text(json.dumps(saved))
    with pytest.raises(api.InputError, match="edited.json"):
        run(tmp_path / "edited.json")
