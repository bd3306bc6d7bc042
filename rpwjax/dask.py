"""Privatize a partitioned Dask DataFrame with a saved fit, identical to one process.

Fit once (``rpwjax fit --save params.json``), then apply the saved parameters
to every partition. Randomness derives from each row's GLOBAL index (see
:mod:`rpwjax.privatize`), so the result is bit-identical to privatizing the
concatenated data in one process, however the data are partitioned and
wherever the partitions run.

Requires the optional ``dask[dataframe]`` dependency (``pip install 'rpwjax[dask]'``).
"""

from __future__ import annotations

import os

import numpy as np

from rpwjax import certify
from rpwjax.errors import InputError, check_labels
from rpwjax.keys import Secret
from rpwjax.privatize import load_release_params, release_secret
from rpwjax.release_path import release


def privatize_dataframe(frame, *, label_column: str, params, secret: Secret, clip: bool = False,
                        release_id: str | None = None, prior_is_public: bool = False):
    """A new Dask DataFrame whose ``label_column`` holds private labels (float64); other columns untouched.

    ``params``: the saved fit's file (``rpwjax fit --save params.json``), verified and refitted as
    ``rpwjax privatize --params`` does (:func:`rpwjax.privatize.load_release_params`; ``prior_is_public`` as
    its ``--prior-is-public``), or fitted parameters (a :class:`~rpwjax.mechanisms.base.Mechanism`).

    Partition lengths are computed first (one pass) to give every partition
    its global row offset; the privatization itself is lazy like any
    ``map_partitions``. Labels go through :func:`rpwjax.release_path.release` with
    :func:`rpwjax.privatize.release_secret` of ``secret`` (e.g.
    ``Secret.from_file(KEYFILE)``) bound to one release: ``release_id``, or
    a fresh one. With the same release id ``rpwjax privatize --key-file KEYFILE
    --release-id ID --params ...`` gives the same labels; the derived secret
    travels to the workers inside the task graph, in memory only.
    """
    if not isinstance(secret, Secret):
        raise InputError(f"secret must be an rpwjax.keys.Secret (Secret.from_file(KEYFILE)), got {type(secret).__name__}")
    if isinstance(params, (str, os.PathLike)):
        params = load_release_params(params, prior_is_public=prior_is_public)[0]
    elif prior_is_public:
        raise InputError("prior_is_public does nothing with fitted parameters: it is for a saved fit's file")
    key = release_secret(secret, release_id, label_column=label_column)
    if label_column not in frame.columns:
        raise InputError(f"label column {label_column!r} not found; columns are {list(frame.columns)}")
    certify.certify(params)  # refused here, before the graph: every partition would refuse these parameters
    lengths = frame.map_partitions(len).compute()
    offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))[:-1]])

    def one(part, partition_info=None):
        if partition_info is None:  # dask's metadata pass on an empty frame
            out = part.copy()
            out[label_column] = out[label_column].astype("float64")
            return out
        start = int(offsets[partition_info["number"]])
        y = check_labels(part[label_column].to_numpy(dtype=np.float64), params.lo, params.hi, clip=clip,
                         name="labels") if len(part) else np.zeros(0)
        out = part.copy()
        out[label_column] = release(params, key, y, start=start) if len(part) else y
        return out

    meta = frame._meta.copy()
    meta[label_column] = meta[label_column].astype("float64")
    return frame.map_partitions(one, meta=meta)
