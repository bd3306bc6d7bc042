r"""Data sets for the evaluation protocol and loaders for user tables.

Every loader returns a :class:`Dataset`: public features (float32, shape
``(n, d)``), private labels (float64, shape ``(n,)``) and the PUBLIC label
range ``[lo, hi]``. The range is documented for the bundled sets and given by
the user otherwise; no loader derives anything from the labels except the
check that they lie inside the range.

Bundled (inside the package, see ``rpwjax/data/PROVENANCE.md``):

* ``"california"``: California Housing, 20,640 × 8, target ``MedHouseVal``
  on [0.14999, 5.00001].
* ``"crime"``: Communities and Crime, 1,994 × 99, target
  ``ViolentCrimesPerPop`` on [0, 1]. Cleaning as in the paper: drop
  ``state, county, community, communityname, fold`` and ``racepctblack``,
  fill ``OtherPerCap``'s one gap with its mean, drop the 22 police (LEMAS)
  columns that still have gaps.
* ``"randhie"``: the RAND Health Insurance Experiment, 20,190 × 9, target
  ``mdvis`` (outpatient visits to an MD in a year: a count, zero-inflated and
  heavy-tailed, the shape of conversion values) on the public range [0, 30]
  with labels above clipped (30 visits a year, more than one every two
  weeks, is a bound set from what the variable is, not from its values).
* ``"criteo-synthetic"``: labels shaped like the Criteo Sponsored Search
  Conversion Log (zero-inflated, heavy-tailed on [0, 400]) with features
  that predict them; see :func:`criteo_synthetic`.

User data: :func:`load_table` (CSV or Parquet, numeric feature columns) and
:func:`load_criteo` (the real 6 GB Criteo file, streamed in blocks).

:func:`train_test_split` gives the 80/20 split with a fixed seed, features
standardized with statistics of the training rows only.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.resources
import warnings
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from scipy import special

from rpwjax.errors import InputError, check_integer, check_labels, check_range
from rpwjax.io.source import check_exists, file_kind, read_labels
from rpwjax.tables import check_feature_options, read_feature_table

__all__ = [
    "CALIFORNIA_RANGE",
    "CRIME_RANGE",
    "CRITEO_COLUMNS",
    "CRITEO_RANGE",
    "DATASETS",
    "Dataset",
    "Split",
    "criteo_synthetic",
    "criteo_synthetic_labels",
    "load_criteo",
    "load_dataset",
    "load_table",
    "train_test_split",
]

CALIFORNIA_RANGE = (0.14999, 5.00001)
CRIME_RANGE = (0.0, 1.0)
CRITEO_RANGE = (0.0, 400.0)
RANDHIE_RANGE = (0.0, 30.0)
DATASETS = ("california", "crime", "randhie", "criteo-synthetic")


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """Public features, private labels, and the public label range.

    ``notes`` records what a loader dropped or filled, in words.
    """

    name: str
    features: np.ndarray  # float32 (n, d), public
    labels: np.ndarray  # float64 (n,), private, inside [lo, hi]
    lo: float
    hi: float
    feature_names: tuple[str, ...]
    notes: tuple[str, ...] = ()
    # a user's table: its networks learn the labels mapped from the public [lo, hi] onto [0, 1] (any range
    # trains alike); the bundled sets keep the paper's protocol, raw labels
    scaled_targets: bool = False

    @property
    def n(self) -> int:
        return int(self.labels.shape[0])

    @property
    def d(self) -> int:
        return int(self.features.shape[1])


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    """An 80/20 split; features standardized with ``feature_mean``/``feature_scale`` of the train rows."""

    name: str
    x_train: np.ndarray  # float32 (n_train, d)
    y_train: np.ndarray  # float64 (n_train,)
    x_test: np.ndarray  # float32 (n_test, d)
    y_test: np.ndarray  # float64 (n_test,)
    lo: float
    hi: float
    feature_mean: np.ndarray  # float64 (d,), train rows only
    feature_scale: np.ndarray  # float64 (d,), train rows only (1 for constant columns)
    train_index: np.ndarray  # rows of the dataset in x_train, in order
    test_index: np.ndarray
    split_seed: int = 0  # the seed of train_test_split (a validation split keeps its split's: it re-splits those rows)
    scaled_targets: bool = False  # the dataset's (see Dataset)


def _make_dataset(name, features, labels, lo, hi, feature_names, notes=(), clip=False, label_name="labels",
                  scaled_targets=False):
    lo, hi = check_range(lo, hi)
    labels = check_labels(labels, lo, hi, clip=clip, name=label_name)
    features = np.ascontiguousarray(features, dtype=np.float32)
    if features.ndim != 2 or features.shape[0] != labels.shape[0]:
        raise InputError(f"features must have shape (n, d) with n = {labels.shape[0]} labels, got {features.shape}")
    for arr in (features, labels):
        arr.setflags(write=False)
    return Dataset(name, features, labels, lo, hi, tuple(feature_names), tuple(notes), bool(scaled_targets))


# --------------------------------------------------------------------------- bundled


def _data_bytes(filename: str) -> bytes:
    resource = importlib.resources.files("rpwjax").joinpath("data").joinpath(filename)
    raw = resource.read_bytes()
    return gzip.decompress(raw) if filename.endswith(".gz") else raw


# The bundled files are small (at most 20,640 rows), so they are parsed on the calling thread: a threaded
# read starts pyarrow's CPU thread pool, whose idle workers can abort the process at interpreter exit
# ("terminate called without an active exception", exit -6) after all the work is done.
_SERIAL = pacsv.ReadOptions(use_threads=False)


def _load_california() -> Dataset:
    table = pacsv.read_csv(pa.BufferReader(_data_bytes("california_housing_sklearn.csv.gz")), read_options=_SERIAL)
    names = [c for c in table.column_names if c != "MedHouseVal"]
    features = np.column_stack([table[c].to_numpy() for c in names])
    labels = table["MedHouseVal"].to_numpy()
    return _make_dataset("california", features, labels, *CALIFORNIA_RANGE, names, label_name="MedHouseVal")


def _crime_column_names() -> list[str]:
    text = _data_bytes("communities.names").decode("latin-1")
    return [line.split()[1] for line in text.splitlines() if line.lower().startswith("@attribute")]


CRIME_DROPPED = ("state", "county", "community", "communityname", "fold", "racepctblack")


def _load_crime() -> Dataset:
    names = _crime_column_names()
    table = pacsv.read_csv(
        pa.BufferReader(_data_bytes("communities.data.gz")),
        read_options=pacsv.ReadOptions(column_names=names, use_threads=False),
        convert_options=pacsv.ConvertOptions(
            null_values=["?"], column_types={n: pa.string() if n == "communityname" else pa.float64() for n in names}
        ),
    )
    target = "ViolentCrimesPerPop"
    notes = [f"dropped {', '.join(CRIME_DROPPED)}"]
    columns = {}
    for name in names:
        if name in CRIME_DROPPED or name == target:
            continue
        values = table[name].to_numpy(zero_copy_only=False).astype(np.float64)
        columns[name] = values
    other = columns["OtherPerCap"]
    gaps = np.isnan(other)
    # Features are public, so filling the one gap with the column mean costs no privacy.
    other[gaps] = other[~gaps].mean()
    notes.append(f"filled {int(gaps.sum())} missing OtherPerCap value(s) with the column mean")
    with_gaps = [name for name, values in columns.items() if np.isnan(values).any()]
    if with_gaps:
        notes.append(f"dropped {len(with_gaps)} columns with missing values: {', '.join(with_gaps)}")
    kept = [name for name in columns if name not in with_gaps]
    features = np.column_stack([columns[name] for name in kept])
    labels = table[target].to_numpy(zero_copy_only=False)
    return _make_dataset("crime", features, labels, *CRIME_RANGE, kept, notes, label_name=target)


RANDHIE_TARGET = "mdvis"


def _load_randhie() -> Dataset:
    table = pacsv.read_csv(pa.BufferReader(_data_bytes("randhie.csv.gz")), read_options=_SERIAL)
    names = [c for c in table.column_names if c != RANDHIE_TARGET]
    features = np.column_stack([table[c].to_numpy().astype(np.float64) for c in names])
    labels = table[RANDHIE_TARGET].to_numpy().astype(np.float64)
    notes = [f"{RANDHIE_TARGET} clipped to the public range [{RANDHIE_RANGE[0]:g}, {RANDHIE_RANGE[1]:g}]"]
    return _make_dataset("randhie", features, labels, *RANDHIE_RANGE, names, notes, clip=True,
                         label_name=RANDHIE_TARGET)


# --------------------------------------------------------------------------- synthetic Criteo

# Shape of the synthetic Criteo labels, calibrated on the real 1,000-row sample
# (134 rows with 0 <= SalesAmountInEuro <= 400: 13 zeros, log of the positives
# with std 0.97). A zero with probability CRITEO_ZERO_FRACTION, else a
# log-normal(mu, sigma) truncated to (0, 400]; mu is solved so that
# P(label > 170) = 0.13 exactly (the published description of the log: "13% of labels above ~170").
CRITEO_ZERO_FRACTION = 0.097
CRITEO_LOG_SIGMA = 1.0
CRITEO_LOG_MU = 4.20325319746828
CRITEO_FEATURES = 8
_CRITEO_VIEW_CORRELATION = 0.5


def _criteo_latents(n: int, seed: int):
    n = int(n)
    if n <= 0:
        raise InputError(f"n must be a positive number of rows, got n={n}")
    rng = np.random.default_rng(seed)
    latents = rng.standard_normal((2, n))  # drawn first: the labels depend on these only
    amount, zero = latents
    log_cap = (np.log(CRITEO_RANGE[1]) - CRITEO_LOG_MU) / CRITEO_LOG_SIGMA
    # Inverse CDF of the truncated log-normal, driven by the N(0, 1) latent.
    u = special.ndtr(amount) * special.ndtr(log_cap)
    labels = np.exp(CRITEO_LOG_MU + CRITEO_LOG_SIGMA * special.ndtri(u))
    labels = np.where(special.ndtr(zero) < CRITEO_ZERO_FRACTION, 0.0, labels)
    return rng, latents, np.clip(labels, *CRITEO_RANGE)


def criteo_synthetic_labels(n: int = 100_000, seed: int = 0) -> np.ndarray:
    r"""Criteo-shaped labels on [0, 400] (float64, shape ``(n,)``).

    .. math::
       Y = 0 \text{ w.p. } 0.097, \quad
       \log Y \sim \mathcal N(\mu, 1) \text{ truncated to } Y \le 400 \text{ otherwise},

    with :math:`\mu = 4.2033` solved so that :math:`P(Y > 170) = 0.13`. The
    positive part has median 64 and mean 90 (the real sample's kept positives:
    median 58, mean 82). Equal to ``criteo_synthetic(n, seed).labels``.
    """
    return _criteo_latents(n, seed)[2]


def criteo_synthetic(n: int = 100_000, seed: int = 0) -> Dataset:
    """Synthetic Criteo-shaped data: :func:`criteo_synthetic_labels` plus 8 features.

    Each label comes from two N(0, 1) latents, one for the amount (through the
    truncated log-normal's inverse CDF) and one for the zero/non-zero switch.
    Features 0-3 are noisy views of the amount latent, features 4-5 of the
    zero latent (correlation 0.5 each), features 6-7 pure noise; a model can
    learn part of the label, not all of it.
    """
    rng, latents, labels = _criteo_latents(n, seed)
    n = labels.shape[0]
    r = _CRITEO_VIEW_CORRELATION
    noise = rng.standard_normal((n, CRITEO_FEATURES))
    source = np.stack([latents[0]] * 4 + [latents[1]] * 2 + [np.zeros(n)] * 2, axis=1)
    weight = np.array([r] * 6 + [0.0] * 2)
    features = weight * source + np.sqrt(1 - weight**2) * noise
    names = [f"amount_view_{i}" for i in range(4)] + [f"zero_view_{i}" for i in range(2)] + ["noise_0", "noise_1"]
    return _make_dataset("criteo-synthetic", features, labels, *CRITEO_RANGE, names, label_name="SalesAmountInEuro")


# --------------------------------------------------------------------------- entry point


def load_dataset(name: str, *, n: int | None = None, seed: int = 0) -> Dataset:
    """Load a bundled data set: ``"california"``, ``"crime"``, ``"randhie"`` or ``"criteo-synthetic"``.

    ``n`` (default 100,000) and ``seed`` apply to ``"criteo-synthetic"`` only.
    """
    if name == "criteo-synthetic":
        return criteo_synthetic(100_000 if n is None else n, seed)
    if name not in DATASETS:
        raise InputError(f"dataset must be one of {', '.join(DATASETS)}, got dataset={name!r}")
    if n is not None:
        raise InputError(f"n= applies to the synthetic data set only, got n={n!r} for dataset={name!r}")
    return {"california": _load_california, "crime": _load_crime, "randhie": _load_randhie}[name]()


# --------------------------------------------------------------------------- user tables


def load_table(path, label_column: str, lo: float, hi: float, *, clip: bool = False, encoding=None, features=None,
               exclude=None, report=None) -> Dataset:
    """A user's CSV or Parquet table as a :class:`Dataset` (:func:`rpwjax.tables.read_feature_table`).

    Features are chosen as ``rpwjax privatize-table`` chooses them (:func:`rpwjax.tables.choose_features`:
    ``features``/``exclude``, else the numeric columns that do not look like identifiers; missing values
    filled with the column's median, plus a 0/1 indicator column). ``report(line)``, if given, receives
    the choice in words (one line each for the columns used, left out and filled); else each column left
    out or filled is reported with a ``UserWarning``. ``Dataset.notes`` records them.
    Labels must be numeric, finite and inside the public ``[lo, hi]``
    (``clip=True`` clips those outside; NaN is always an error). They are read and checked first, the way
    ``rpwjax privatize`` and ``privatize-table`` read them (:func:`rpwjax.io.source.read_labels`): an error names
    the file, the 1-based data row (and a CSV's line) and the label as written.
    """
    lo, hi = check_range(lo, hi)
    check_feature_options(features, exclude)
    file_kind(path, what="input file")  # CSV or Parquet (read_labels would also take a text label file)
    check_exists(path, "input file")  # named as the table it is, not as read_labels' "labels file"
    labels = read_labels(path, label_column, encoding=encoding, check=(lo, hi, clip))
    table = read_feature_table(path, label_column, encoding=encoding, features=features, exclude=exclude)
    if table.labels.size != labels.size:
        raise InputError(f"{str(path)!r} changed while it was read ({labels.size} rows, then {table.labels.size})")
    if report is not None:
        for line in table.choice.lines():
            report(line)
    else:
        for note in table.notes:
            warnings.warn(f"{Path(path).name}: {note}", UserWarning, stacklevel=2)
    # a user's file never passes for a bundled data set (its paper config, its rows in results.csv)
    name = Path(path).stem + ("-file" if Path(path).stem in DATASETS else "")
    return _make_dataset(name, table.features, labels, lo, hi, table.feature_names, table.notes,
                         clip=clip, label_name=label_column, scaled_targets=True)


# --------------------------------------------------------------------------- real Criteo

CRITEO_COLUMNS = (
    "Sale",
    "SalesAmountInEuro",
    "time_delay_for_conversion",
    "click_timestamp",
    "nb_clicks_1week",
    "product_price",
    "product_age_group",
    "device_type",
    "audience_id",
    "product_gender",
    "product_brand",
    *(f"product_category{i}" for i in range(1, 8)),
    "product_country",
    "product_id",
    "product_title",
    "partner_id",
    "user_id",
)
CRITEO_TARGET = "SalesAmountInEuro"
# Hashed into shared buckets. Left out: Sale and time_delay_for_conversion
# (they reveal the label), click_timestamp, and the per-item / per-user ids
# product_id, product_title, user_id (near-unique, nothing to generalize from).
CRITEO_CATEGORICAL = (
    "product_age_group",
    "device_type",
    "audience_id",
    "product_gender",
    "product_brand",
    *(f"product_category{i}" for i in range(1, 8)),
    "product_country",
    "partner_id",
)
_CRITEO_NUMERIC = ("nb_clicks_1week", "product_price")
_CRITEO_BYTES_PER_ROW = 400  # the sample averages 365 bytes per row


def _bucket_of(column: str, value: str, buckets: int) -> int:
    if value == "-1":  # Criteo writes missing values as -1
        return -1
    return zlib.crc32(f"{column}={value}".encode()) % buckets


def _criteo_block_features(batch: pa.RecordBatch, keep: np.ndarray, buckets: int) -> np.ndarray:
    rows = int(keep.sum())
    out = np.zeros((rows, 4 + buckets), dtype=np.float32)
    for j, name in enumerate(_CRITEO_NUMERIC):
        values = batch.column(name).to_numpy(zero_copy_only=False)[keep]
        missing = ~(values >= 0)
        out[:, 2 * j] = np.log1p(np.where(missing, 0.0, values))
        out[:, 2 * j + 1] = missing
    counts = np.zeros(rows * buckets, dtype=np.int64)
    for name in CRITEO_CATEGORICAL:
        # Hash each distinct value once per block, not once per row.
        encoded = pc.dictionary_encode(batch.column(name).filter(pa.array(keep)))
        table = np.array([_bucket_of(name, v, buckets) for v in encoded.dictionary.to_pylist()], dtype=np.int64)
        bucket = table[encoded.indices.to_numpy(zero_copy_only=False)] if len(table) else np.zeros(0, np.int64)
        present = bucket >= 0
        counts += np.bincount((np.arange(rows) * buckets + bucket)[present], minlength=rows * buckets)
    out[:, 4:] = counts.reshape(rows, buckets)
    return out


def load_criteo(path, chunk_rows: int = 1_000_000, *, hash_buckets: int = 32) -> Dataset:
    """Stream the Criteo Sponsored Search Conversion Log into a :class:`Dataset`.

    The file (``CriteoSearchData``, optionally ``.gz``) is tab-separated with no
    header and the 23 columns of :data:`CRITEO_COLUMNS`. It is read with
    ``pyarrow.csv.open_csv`` in blocks of about ``chunk_rows`` rows, so the
    6 GB file never sits in memory whole; only the kept rows' features are.
    Kept rows: ``0 <= SalesAmountInEuro <= 400`` (the paper's filter; it also
    drops the non-sales, written -1). Labels are in [0, 400].

    Features (float32, ``4 + hash_buckets`` columns; fixed transforms, nothing
    estimated from the data):

    * ``log1p`` of ``nb_clicks_1week`` and ``product_price`` (0 when missing),
      each with a 0/1 missing indicator (Criteo writes missing as -1);
    * the hashing trick over the 14 categorical columns of
      :data:`CRITEO_CATEGORICAL`: each present ``column=value`` pair adds 1 to
      bucket ``crc32("column=value") % hash_buckets``. CRC32 is fixed, so the
      encoding does not depend on the block size, the process or the platform.
    """
    chunk_rows = int(chunk_rows)
    if chunk_rows <= 0:
        raise InputError(f"chunk_rows must be positive, got chunk_rows={chunk_rows}")
    hash_buckets = int(hash_buckets)
    if hash_buckets <= 0:
        raise InputError(f"hash_buckets must be positive, got hash_buckets={hash_buckets}")
    path = Path(path)
    if not path.exists():
        raise InputError(f"no such file: {str(path)!r}")
    used = (CRITEO_TARGET, *_CRITEO_NUMERIC, *CRITEO_CATEGORICAL)
    types = {name: pa.float64() for name in (CRITEO_TARGET, *_CRITEO_NUMERIC)}
    types.update({name: pa.string() for name in CRITEO_CATEGORICAL})
    features, labels = [], []
    try:
        reader = pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(
                column_names=list(CRITEO_COLUMNS), block_size=max(chunk_rows * _CRITEO_BYTES_PER_ROW, 1 << 16)
            ),
            parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
            convert_options=pacsv.ConvertOptions(column_types=types, include_columns=list(used), strings_can_be_null=False),
        )
        for batch in reader:
            target = batch.column(CRITEO_TARGET).to_numpy(zero_copy_only=False)
            keep = (target >= CRITEO_RANGE[0]) & (target <= CRITEO_RANGE[1])
            if keep.any():
                labels.append(target[keep])
                features.append(_criteo_block_features(batch, keep, hash_buckets))
    except pa.ArrowInvalid as err:
        raise InputError(f"could not read {str(path)!r} as the 23-column Criteo log: {err}") from None
    if not labels:
        raise InputError(f"{str(path)!r} has no row with 0 <= {CRITEO_TARGET} <= 400")
    names = ["log1p_nb_clicks_1week", "nb_clicks_1week_missing", "log1p_product_price", "product_price_missing"]
    names += [f"hash_{i:02d}" for i in range(hash_buckets)]
    notes = [f"kept rows with 0 <= {CRITEO_TARGET} <= 400; categoricals hashed into {hash_buckets} buckets"]
    return _make_dataset(
        "criteo", np.concatenate(features), np.concatenate(labels), *CRITEO_RANGE, names, notes, label_name=CRITEO_TARGET
    )


# --------------------------------------------------------------------------- split


def train_test_split(dataset: Dataset, seed: int = 0, *, test_fraction: float = 0.2) -> Split:
    """Shuffle with ``seed``, hold out ``floor(test_fraction * n)`` rows, standardize.

    Feature mean and standard deviation come from the training rows only
    (features are public; the labels are not touched, they are only carried
    along as training targets and test truths). ``seed`` is a non-negative integer; the split records it
    (``Split.split_seed``).
    """
    seed = check_integer(seed, "split seed", 0, 2**63 - 1)
    if not 0 < test_fraction < 1:
        raise InputError(f"test_fraction must be in (0, 1), got test_fraction={test_fraction!r}")
    n = dataset.n
    n_test = int(np.floor(test_fraction * n))
    if n_test == 0 or n_test == n:
        raise InputError(f"cannot split {n} rows with test_fraction={test_fraction!r}")
    order = np.random.default_rng(seed).permutation(n)
    test_index, train_index = np.sort(order[:n_test]), np.sort(order[n_test:])
    x_train = dataset.features[train_index].astype(np.float64)
    mean = x_train.mean(axis=0)
    scale = x_train.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)

    def standardize(x):
        return ((x - mean) / scale).astype(np.float32)

    return Split(
        dataset.name,
        standardize(x_train),
        dataset.labels[train_index],
        standardize(dataset.features[test_index].astype(np.float64)),
        dataset.labels[test_index],
        dataset.lo,
        dataset.hi,
        mean,
        scale,
        train_index,
        test_index,
        seed,
        dataset.scaled_targets,
    )


VALIDATION_SEED = 777


def validation_split(split: Split, *, fraction: float = 0.25, seed: int = VALIDATION_SEED) -> Split:
    """The training rows of ``split`` split again: ``fraction`` of them become the held-out rows.

    For tuning a pipeline or a rule without reading a test row (``rpwjax curves --validation``): the
    returned split's "test" rows are training rows of ``split``, and ``split``'s test rows are not in it.
    Features keep the standardization of ``split`` (train-row statistics, public).
    """
    if not 0 < fraction < 1:
        raise InputError(f"fraction must be in (0, 1), got fraction={fraction!r}")
    n = split.y_train.size
    k = int(n * fraction)
    if k == 0 or k == n:
        raise InputError(f"cannot hold out {fraction!r} of {n} training rows")
    order = np.random.default_rng(seed).permutation(n)
    held, kept = np.sort(order[:k]), np.sort(order[k:])
    return Split(split.name, split.x_train[kept], split.y_train[kept], split.x_train[held], split.y_train[held],
                 split.lo, split.hi, split.feature_mean, split.feature_scale, split.train_index[kept],
                 split.train_index[held], split.split_seed, split.scaled_targets)
