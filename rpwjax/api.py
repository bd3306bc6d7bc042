"""One entry point for every mechanism: fit with privacy accounting, save, load, apply.

:func:`fit` turns labels (or a prior) and a total ε (scalar or grid) into a
:class:`FitResult`: batched parameters plus the accounting
(ε = ε₁ + ε₂ by basic composition; δ for the Gaussian) and the label MSE
under the prior that was used. ``FitResult.records()`` is the JSON contract of
``rpwjax fit --json``; :func:`load_params` reads one record back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from rpwjax.mechanisms.base import Mechanism, label_mse_grid
from rpwjax.errors import InputError, check_choice, check_epsilon, check_integer, check_labels, check_range  # noqa: F401 (InputError re-exported)
from rpwjax.errors import check_positive, show_value
from rpwjax.keys import Secret
from rpwjax.mechanisms import MECHANISMS, entry, mechanism_names  # noqa: F401 (MECHANISMS, mechanism_names re-exported)
from rpwjax.priors import DEFAULT_BINS, Prior, empirical_prior, histogram_prior, private_histogram

PRIORS = ("empirical", "private")
DEFAULT_PRIOR_FRACTION = 0.1  # ε₁ = 0.1·ε unless --prior-epsilon is given
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class FitResult:
    """A fitted mechanism over an ε grid (or one ε) with its privacy accounting."""

    mechanism: str
    params: Mechanism
    epsilon: np.ndarray  # total ε, per fit
    epsilon_prior: np.ndarray  # ε₁ spent on the prior (0 for a known prior)
    epsilon_mechanism: np.ndarray  # ε₂ the mechanism runs with
    delta: np.ndarray
    prior: str  # "empirical" | "private-histogram" | "histogram" | "none"
    bins: int | None
    lo: float
    hi: float
    label_mse: np.ndarray
    info: dict[str, Any]
    prior_used: Prior | None = None  # the prior object (one per ε when private): for post-processing

    def __len__(self) -> int:
        return int(np.size(self.epsilon))

    def __getitem__(self, i: int) -> "FitResult":
        """The fit for the i-th ε of the grid."""
        if np.ndim(self.epsilon) == 0:
            if i not in (0, -1):
                raise IndexError(i)
            return self
        pick = lambda v: np.asarray(v)[i]  # noqa: E731
        return dataclasses.replace(
            self,
            params=self.params[i],
            epsilon=pick(self.epsilon),
            epsilon_prior=pick(self.epsilon_prior),
            epsilon_mechanism=pick(self.epsilon_mechanism),
            delta=pick(self.delta),
            label_mse=pick(self.label_mse),
            info={k: pick(v) for k, v in self.info.items()},
            prior_used=self.prior_for(i),
        )

    def prior_for(self, i: int) -> Prior | None:
        """The prior the i-th fit used (a slice of a batched private histogram)."""
        if self.prior_used is None or np.ndim(self.prior_used.mass) == 1:
            return self.prior_used
        return jax.tree_util.tree_map(lambda leaf: np.asarray(leaf)[i], self.prior_used)

    def records(self) -> list[dict]:
        """One JSON-ready dict per ε (the ``fit --json`` / ``--save`` format)."""
        return [self[i]._record() for i in range(len(self))]

    def _prior_record(self) -> dict:
        """Kind and bins; a histogram prior also its edges and masses (they are private or public
        already, so saving them costs nothing; the empirical prior is never written out)."""
        out = {"kind": self.prior, "bins": self.bins}
        if self.prior == "empirical":
            uses_prior = MECHANISMS[self.mechanism].uses_prior
            read = ("the parameters and the reported label_mse are functions of the raw labels"
                    if uses_prior else "the reported label_mse is a function of the raw labels")
            out["public_prior_required"] = True
            out["note"] = (f"known-prior setting (experiments): {read}, so the epsilon guarantee holds only if this "
                           "prior (the labels' empirical distribution) is public; nothing was spent on it")
        prior = self.prior_used
        if prior is not None and not prior.discrete and self.prior in ("private-histogram", "histogram"):
            out["edges"] = np.concatenate([np.asarray(prior.left)[:1], np.asarray(prior.right)]).tolist()
            out["masses"] = np.asarray(prior.mass).tolist()
        return out

    def _record(self) -> dict:
        fields = self.params.to_json()
        fields.update({k: _plain(v) for k, v in self.info.items()})
        return {
            "format_version": FORMAT_VERSION,
            "mechanism": self.mechanism,
            "epsilon": float(self.epsilon),
            "epsilon_prior": float(self.epsilon_prior),
            "epsilon_mechanism": float(self.epsilon_mechanism),
            "delta": float(self.delta),
            "pure_dp": bool(self.params.pure),
            "range": [self.lo, self.hi],
            "prior": self._prior_record(),
            "label_mse": float(self.label_mse),
            "params": fields,
        }


def _plain(v):
    arr = np.asarray(v)
    return arr.item() if arr.ndim == 0 else arr.tolist()


def fit(
    mechanism: str,
    labels=None,
    *,
    range,
    epsilon,
    prior: str | Prior = "private",
    prior_epsilon=None,
    bins: int = DEFAULT_BINS,
    secret: Secret | None = None,
    seed: int | None = None,
    clip: bool = False,
    spend_prior: bool = False,
    **options,
) -> FitResult:
    """Fit ``mechanism`` for a total privacy budget ``epsilon`` (scalar or 1-d grid).

    Args:
      mechanism: one of :data:`MECHANISMS` (``"rpwithprior"``, ``"laplace"``, ...).
      labels: the training labels (1-d); not needed with a :class:`Prior` object.
      range: the PUBLIC label range ``(lo, hi)``.
      epsilon: total ε per fit.
      prior: ``"private"`` (default; ``Hist_ε``: ε₁ for a noisy histogram with
        ``bins`` bins, ε₂ = ε - ε₁ for the mechanism), ``"empirical"`` (the
        known-prior setting: the labels' empirical distribution, the mechanism
        gets all of ε; the guarantee then holds only if that prior is public,
        and the parameters are functions of the labels), or a :class:`Prior`
        the caller vouches for (e.g. public knowledge). Mechanisms that do not
        use a prior ignore it and get all of ε.
      prior_epsilon: ε₁ (must be < every ε), one value or one per ε; default ``0.1·ε`` per ε.
      secret: the :class:`~rpwjax.keys.Secret` the histogram noise is drawn
        from; default: fresh OS entropy.
      seed: EXPERIMENTS ONLY, instead of ``secret``: an integer expanded into a
        secret (anyone can try every small seed and subtract the noise).
      clip: clip labels outside the range instead of refusing them.
      spend_prior: also build the prior for a mechanism that does not use one
        (Laplace, Gaussian, Staircase), e.g. to denoise its outputs under it;
        with ``prior="private"`` that costs ε₁ and the mechanism gets ε - ε₁.
      options: mechanism options (``zeta``, ``objective``, ``delta``, ...).
    """
    row = entry(mechanism)
    fit_fn, uses_prior = row.fit, row.uses_prior
    lo, hi = check_range(*range)
    eps = check_epsilon(epsilon)
    grid = np.atleast_1d(eps)
    if labels is not None:  # checked even where the fit does not read them (a prior-free mechanism)
        if np.ndim(labels) != 1:  # a table or a batch is not flattened into one list of labels
            raise InputError(f"labels must be one-dimensional (one label per row), got shape {np.shape(labels)}")
        labels = check_labels(labels, lo, hi, clip=clip)

    if isinstance(prior, Prior):
        prior_obj, kind, eps1 = prior, prior.kind, np.zeros_like(grid)
        if (prior.lo, prior.hi) != (lo, hi):
            raise InputError(f"prior range ({prior.lo}, {prior.hi}) differs from range ({lo}, {hi})")
    else:
        check_choice(prior, "prior", PRIORS)
        if labels is None:
            raise InputError("labels are required unless a Prior object is given")
        if not uses_prior and not spend_prior:
            # the prior would only serve reporting; spending budget on it would be waste
            prior_obj = empirical_prior(labels, lo, hi, clip=clip) if prior == "empirical" else None
            kind = "empirical" if prior == "empirical" else "none"
            eps1 = np.zeros_like(grid)
        elif prior == "empirical":
            prior_obj, kind, eps1 = empirical_prior(labels, lo, hi, clip=clip), "empirical", np.zeros_like(grid)
        else:
            if prior_epsilon is None:
                eps1 = DEFAULT_PRIOR_FRACTION * grid
            else:
                e1 = check_epsilon(prior_epsilon, "prior_epsilon")
                if e1.ndim and e1.shape != grid.shape:
                    raise InputError(f"prior_epsilon needs one value or one per epsilon: {e1.size} values for "
                                     f"{grid.size} epsilons")
                eps1 = np.broadcast_to(e1, grid.shape).astype(np.float64)
                too_big = grid <= eps1
                if too_big.any():
                    raise InputError(
                        f"prior_epsilon must be smaller than epsilon, got prior_epsilon={float(eps1[too_big][0])!r} "
                        f"for epsilon={float(grid[too_big][0])!r}"
                    )
            if secret is not None and seed is not None:
                raise InputError("give either secret or seed, not both")
            _check_before_drawing(options)
            if secret is None:
                secret = Secret.from_seed(seed) if seed is not None else Secret.from_entropy()
            prior_obj = private_histogram(labels, lo, hi, eps1 if eps.ndim else eps1[0], bins=bins, secret=secret,
                                          clip=clip)
            kind = "private-histogram"
    if prior_obj is None:
        # prior-free mechanism with a private-prior request: nothing is read from the labels
        prior_obj = Prior(np.array([lo]), np.array([hi]), np.array([1.0]), lo, hi, False, "none")
    eps2 = grid - eps1
    params, info = fit_fn(prior_obj, eps2 if eps.ndim else eps2[0], **options)
    delta = np.broadcast_to(np.asarray(getattr(params, "delta", 0.0), np.float64), grid.shape if eps.ndim else ())
    mse = np.asarray(label_mse_grid(params, prior_obj)) if kind != "none" else _prior_free_mse(params)
    squeeze = (lambda v: np.asarray(v)[0]) if eps.ndim == 0 else np.asarray
    return FitResult(
        mechanism=mechanism,
        params=params,
        epsilon=squeeze(grid),
        epsilon_prior=squeeze(eps1),
        epsilon_mechanism=squeeze(eps2),
        delta=np.asarray(delta, np.float64).copy(),
        prior=kind,
        bins=bins if kind == "private-histogram" else None,
        lo=lo,
        hi=hi,
        label_mse=mse,
        info=info,
        prior_used=prior_obj if kind != "none" else None,
    )


def _check_before_drawing(options: dict) -> None:
    """What the fit would refuse that needs no label, refused before the histogram is drawn (a failure after a
    draw is charged, :mod:`rpwjax.draws`): a ζ that is no positive number."""
    zeta = options.get("zeta", "auto")
    if not (isinstance(zeta, str) and zeta == "auto"):
        check_positive(zeta, "zeta")


def _prior_free_mse(params):
    """Label MSE of a prior-free mechanism: its mse does not depend on y inside the range."""
    lo = params.lo
    with jax.enable_x64(True):
        if params.batch_shape == ():
            return np.asarray(params.mse(np.float64(lo)))
        return np.asarray(jax.vmap(lambda p: p.mse(np.float64(lo)))(params))


def prior_from_record(record: dict) -> Prior | None:
    """The histogram prior saved in a fit record, or None (empirical priors are never saved)."""
    saved = record.get("prior") or {}
    if "edges" not in saved or "masses" not in saved:
        return None
    return histogram_prior(saved["edges"], saved["masses"], kind=saved.get("kind", "histogram"))


def _params_file(name: str | None) -> str:
    """How a refusal names a params file: by its path when known."""
    return f"params file {name!r}" if name is not None else "a params file"


def one_record(record, *, name: str | None = None) -> dict:
    """The single fit record of a params file (a ``--save`` object or a one-element ``fit --json`` list).

    ``name`` (the file's path, when the record was read from one) is named by the refusals."""
    where = f" {name!r}" if name is not None else ""
    if isinstance(record, list):
        if len(record) != 1:
            raise InputError(f"{_params_file(name)} must hold exactly one fit, got {len(record)}")
        record = record[0]
    if not isinstance(record, dict) or "mechanism" not in record or "params" not in record:
        raise InputError(f"params file{where} is not an rpwjax fit record (needs 'mechanism' and 'params')")
    return record


def record_entry(record: dict, *, name: str | None = None):
    """The registry row of a fit record's ``mechanism``; an unknown one is refused naming the file (``name``)."""
    try:
        return entry(record["mechanism"])
    except InputError as err:
        raise InputError(_in_file(name, str(err))) from None


def _in_file(name: str | None, message: str) -> str:
    """``message`` led by the params file it is about, when its path is known."""
    return message if name is None else f"{_params_file(name)}: {message}"


def _check_number_fields(cls, fields, name: str | None):
    """Refuse a field of the parameters that must hold numbers but holds text, a boolean or null (e.g.
    ``"scale": "a"``), naming the file, the field and the value: ``from_json`` would pass it on as it is, and
    the mechanism's own checks would fail on it with a NumPy type error that names none of them."""
    if not isinstance(fields, dict):
        return  # not a mapping at all: load_params says the record has a bad field
    # the parameters read as numbers, by their names in the file (RPWithPrior writes its a1, a2 as A1, A2)
    numeric = {f.name for f in dataclasses.fields(cls) if f.name not in cls.derived_fields and f.type != "str"}
    for key, value in fields.items():
        if str(key).lower() not in numeric:
            continue
        try:
            kind = np.asarray(value).dtype.kind
        except (TypeError, ValueError):  # e.g. ragged nested lists
            kind = "O"
        if kind not in "iuf":  # integers and floats only: not text ("U"), booleans ("b") or objects (null, mixed)
            raise InputError(_in_file(name, f"params.{key} must be a number or a list of numbers, got "
                                            f"params.{key}={show_value(value)}"))


def load_params(record: dict, *, name: str | None = None) -> tuple[Mechanism, dict]:
    """Parameters for ONE ε from a ``--save`` record (or a one-element ``fit --json`` list).

    This only parses (with each mechanism's own ``from_json`` validation); it does not check that the record's
    stated ε and δ hold for the parameters. :func:`rpwjax.audit.verify.verify_record` does (``privatize --params`` runs it).
    ``name`` (the file's path) is named by the refusals of the record's shape, its mechanism and its fields.
    """
    record = one_record(record, name=name)
    where = f" {name!r}" if name is not None else ""
    cls = record_entry(record, name=name).params
    _check_number_fields(cls, record["params"], name)
    try:
        params = cls.from_json(record["params"])
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"params file{where} for {record['mechanism']} is missing or has a bad field: {err}") \
            from None
    if params.batch_shape != ():
        raise InputError(f"{_params_file(name)} must hold parameters for one epsilon, got shape {params.batch_shape}")
    return params, record


ACCOUNTED_PRIOR = "private-histogram"  # the one prior kind with a private release (ε₁ > 0) behind it
REFIT_TOLERANCE = 1e-9  # relative: a saved number and its refit agree to this (float rounding across machines)
REFIT_ABSOLUTE = 1e-12  # plus this, for numbers that are zero up to rounding (an LP's optimality gap)


def _refit_options(name: str, fields: dict) -> list[dict]:
    """The fit options a record states, as keyword sets to try in order (the first that reproduces it wins).

    ζ of RPWithPrior is tried as ``"auto"`` first (the default, recomputed from the prior) and then as the saved
    number (a public option given at fit time, ``--zeta``); the Gaussian's δ and calibration and the Staircase's γ
    rule (or a given γ) are public options. RR-on-Bins, Unbiased and Laplace take none (Unbiased: its defaults, the
    only ones ``rpwjax fit`` offers)."""
    if name == "rpwithprior":
        objective = fields.get("objective", "neighborhood")
        return [{"zeta": "auto", "objective": objective}, {"zeta": fields["zeta"], "objective": objective}]
    if name == "gaussian":
        return [{"delta": fields["delta"], "calibration": fields["calibration"]}]
    if name == "staircase":
        rule = fields["gamma_rule"]
        return [{"gamma": fields["gamma"] if rule == "given" else rule}]
    return [{}]


def refit_record(record) -> tuple[FitResult | None, str]:
    """Fit again what a saved record says it is: ``(result, how)``.

    Fitting is deterministic given the prior, so the saved histogram (or, for a mechanism that uses no prior,
    the public range alone) and the saved options (mechanism, ε₂ = ``params.epsilon``, ζ and objective, δ and
    calibration, the range) give the parameters the file must hold. The saved masses are used exactly as written
    (the fit's own prior; renormalising them would move their last bits, and an interval search can amplify
    that). The accounting is recomputed, not read: ε₂ is the refit's,
    ε₁ is the saved ``epsilon_prior`` only for a ``private-histogram`` prior (the one kind with a private release
    behind it; its noise is secret) and 0 otherwise, ε = ε₁ + ε₂. Returns ``(None, reason)`` when the parameters
    cannot be recomputed: a mechanism fitted to an empirical prior, which is never saved. Raises
    :class:`InputError` (or ``KeyError``/``TypeError``/``ValueError`` on a malformed record) when the options
    cannot be read.
    """
    record = one_record(record)
    row = entry(record["mechanism"])
    saved = record.get("prior") or {}
    kind = saved.get("kind")
    fields = record["params"]
    lo, hi = check_range(fields["lo"], fields["hi"])
    eps2 = float(check_epsilon(fields["epsilon"], "params.epsilon"))
    prior = prior_from_record(record)
    if prior is not None:
        prior = dataclasses.replace(prior, mass=np.asarray(saved["masses"], np.float64))
    if prior is None and row.uses_prior:
        return None, (f"the {row.name} parameters were fitted to an empirical prior, which is never saved: they cannot "
                      "be recomputed, so the release holds only if that prior is public")
    fit_prior = prior if prior is not None else Prior(np.array([lo]), np.array([hi]), np.array([1.0]), lo, hi, False,
                                                      "none")
    eps1 = float(record.get("epsilon_prior", 0.0)) if kind == ACCOUNTED_PRIOR else 0.0
    attempts = _refit_options(row.name, fields)
    for i, options in enumerate(attempts):
        params, info = row.fit(fit_prior, eps2, **options)
        if i == len(attempts) - 1 or _same_zeta(params, fields):
            break
    mse = np.asarray(label_mse_grid(params, prior)) if prior is not None else _prior_free_mse(params)
    result = FitResult(
        mechanism=row.name, params=params, epsilon=np.asarray(eps1 + eps2), epsilon_prior=np.asarray(eps1),
        epsilon_mechanism=np.asarray(eps2), delta=np.asarray(getattr(params, "delta", 0.0), np.float64),
        prior=kind, bins=saved.get("bins") if kind == ACCOUNTED_PRIOR else None, lo=lo, hi=hi, label_mse=mse,
        info=info, prior_used=prior)
    how = "the saved prior and options" if prior is not None else "the saved options and range (no prior used)"
    return result, how


def _same_zeta(params, fields: dict) -> bool:
    """Whether ζ = "auto" reproduced the saved ζ (to :data:`REFIT_TOLERANCE`)."""
    saved, refit = float(fields["zeta"]), float(np.asarray(params.zeta))
    return abs(saved - refit) <= REFIT_TOLERANCE * max(abs(saved), abs(refit)) + REFIT_ABSOLUTE


def histogram_epsilons(records) -> list[float]:
    """The distinct positive ``epsilon_prior`` of a multi-epsilon fit's records: one private histogram each.

    The records of one fit that share an ``epsilon_prior`` share its histogram (the noise is keyed by that
    value, :func:`rpwjax.priors.private_histogram`): the same draw, released once and spent once."""
    return list(dict.fromkeys(float(r["epsilon_prior"]) for r in records if float(r["epsilon_prior"]) > 0))


def records_total(records) -> dict:
    """What publishing every record of a multi-epsilon fit together costs (basic composition)."""
    distinct = histogram_epsilons(records)
    spent = sum(distinct)
    empirical = any(r["prior"]["kind"] == "empirical" for r in records)
    shared = sum(1 for r in records if float(r["epsilon_prior"]) > 0) - len(distinct)
    note = (f"publishing all {len(records)} records together spends epsilon {spent:g} on their private histograms "
            f"(the sum of their distinct epsilon_prior: {len(distinct)} independent histograms"
            + (f"; records with the same epsilon_prior share one histogram, the same draw" if shared else "")
            + "); each record's epsilon holds for one record alone")
    if empirical:
        note += "; the empirical-prior records are functions of the raw labels (private only if that prior is public)"
    return {"records": len(records), "epsilon_prior_total": spent, "empirical_prior": empirical, "note": note}


MAX_BINS = 1024  # bins lie in [1, MAX_BINS] (--bins): RR-on-Bins' fit grows with the square of the bins


def check_bins(bins, name="--bins"):
    """``bins`` (when given) an integer in [1, :data:`MAX_BINS`]."""
    if bins is not None:
        check_integer(bins, name, 1, MAX_BINS)


@dataclasses.dataclass(frozen=True)
class FitOptions:
    """The fit options of a file command (``rpwjax fit``, ``rpwjax privatize``), each None when not given.

    Options that would do nothing for the mechanism and prior are refused
    (:meth:`check`), never ignored; :meth:`settings` is what fixes the fit in
    a release's identity and its ledger record; :meth:`fit` runs it.
    """

    mechanism: str | None = None
    epsilon: Any = None
    range: Any = None
    zeta: Any = None
    objective: str | None = None
    prior: str | None = None
    prior_epsilon: float | None = None
    bins: int | None = None
    delta: float | None = None
    calibration: str | None = None
    clip: bool = False

    def settings(self) -> dict:
        """Every fit option as given (for the release identity and the ledger)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def check(self, *, spend_prior: bool):
        """Refuse options that would do nothing for this mechanism and prior (instead of ignoring them)."""
        check_bins(self.bins)
        self.check_prior_epsilon()
        mechanism = self.mechanism
        for flag, value, owner in (("--zeta", self.zeta, "rpwithprior"), ("--objective", self.objective, "rpwithprior"),
                                   ("--delta", self.delta, "gaussian"), ("--calibration", self.calibration, "gaussian")):
            if value is not None and mechanism != owner:
                raise InputError(f"{flag} {value} does nothing for --mechanism {mechanism} (it applies to {owner} only)")
        uses_prior = MECHANISMS[mechanism].uses_prior or spend_prior
        if (self.prior or "private") == "empirical":
            if self.bins is not None:
                raise InputError(f"--bins {self.bins} does nothing under --prior empirical (no histogram is built): "
                                 "drop it or use --prior private")
        elif not uses_prior:
            for flag, value in (("--prior", self.prior), ("--bins", self.bins), ("--prior-epsilon", self.prior_epsilon)):
                if value is not None:
                    raise InputError(f"{flag} {value} does nothing for --mechanism {mechanism}: it uses no prior and "
                                     "spends nothing on one (with privatize --denoise posterior it does)")

    def check_prior_epsilon(self):
        if (self.prior or "private") == "empirical" and self.prior_epsilon is not None:
            raise InputError(f"--prior-epsilon {self.prior_epsilon:g} does nothing under --prior empirical (nothing "
                             "is spent on a known prior): drop it or use --prior private")

    def mechanism_options(self) -> dict:
        """The mechanism's own options: ζ and the objective (RPWithPrior), δ and the calibration (Gaussian)."""
        opts = {}
        if self.mechanism == "rpwithprior":
            zeta = "auto" if self.zeta is None else self.zeta
            opts["zeta"] = zeta if zeta == "auto" else _number(zeta, "zeta")
            opts["objective"] = self.objective or "neighborhood"
        if self.mechanism == "gaussian":
            if self.delta is not None:
                opts["delta"] = self.delta
            if self.calibration is not None:
                opts["calibration"] = self.calibration
        return opts

    def fit(self, labels, epsilon, secret: Secret, *, spend_prior: bool = False) -> FitResult:
        """:func:`fit` of ``labels`` with these options (defaults where not given) and ``epsilon``."""
        return fit(self.mechanism, labels, range=tuple(self.range), epsilon=epsilon, prior=self.prior or "private",
                   prior_epsilon=self.prior_epsilon, bins=DEFAULT_BINS if self.bins is None else self.bins,
                   secret=secret, clip=self.clip, spend_prior=spend_prior, **self.mechanism_options())


def _number(text, name):
    try:
        return float(text)
    except ValueError:
        raise InputError(f"{name} must be a number or 'auto', got {name}={text!r}") from None
