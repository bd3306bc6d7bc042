r"""Verify a saved fit record: recompute its guarantee from the parameters, take nothing on trust.

A params file (``rpwjax fit --save``, one record of ``FitResult.records()``)
*states* a guarantee: ``epsilon`` (the total), ``epsilon_prior`` (ε₁, spent
on the prior), ``epsilon_mechanism`` (ε₂), ``delta``, ``pure_dp``, the
``mechanism``, the public ``range``, the ``prior`` and the mechanism's
``params`` (with their own ``params.epsilon``). A file can be edited, so
:func:`verify_record` checks it in four layers and refuses it (an
:class:`~rpwjax.errors.InputError` naming the field and both values) when
anything disagrees or the parameters are less private than stated:

1. **Fields agree.** ε = ε₁ + ε₂ (to 1e-12 relative), ``params.epsilon`` = ε₂,
   ``range`` = ``[params.lo, params.hi]``, ``pure_dp`` = the mechanism class's
   ``pure``, ``delta`` = 0 for a pure mechanism and ``params.delta`` for the
   Gaussian, and the prior's record matches ε₁: a ``private-histogram``
   needs ε₁ > 0 and its saved bins over the range; an ``empirical``,
   ``histogram`` (a public prior someone vouched for) or ``none`` prior spends
   nothing (ε₁ = 0); ``none`` only for mechanisms that use no prior.
2. **The guarantee, recomputed from the parameters alone** (never from
   ``params.epsilon`` where the parameters determine the privacy loss
   otherwise): the smallest ε for which the parameters are ε-DP,

   * Laplace: Δ / ``scale`` (Δ = hi - lo);
   * RPWithPrior: its densities take the values 1/γ and e^{-ε}/γ on one
     support, so the loss is exactly ``params.epsilon`` (0 if A1 = A2);
     the saved ``gamma`` must equal 2ζ + e^{-ε}(A2 - A1);
   * Staircase: its density steps by b = e^{-ε} per step, a ratio of e^ε for
     every γ in (0, 1): ``params.epsilon``;
   * RR-on-Bins: log of the own-group weight over the other-group weight,
     log((c - 1 + e^ε)/c) for an output value shared by c groups (ε when
     the outputs are distinct, 0 for one group);
   * Unbiased: max over outputs of log(max_j Q_jm / min_j Q_jm) of the
     probability matrix (infinite where a column is zero for some rows
     only), after checking that every row is a distribution;
   * Gaussian ((ε, δ) only): δ(ε₂) of its σ, exactly
     (:func:`rpwjax.mechanisms.additive.gaussian_delta`), must be at most δ; the
     reported ε is the smallest ε' with δ(ε') ≤ δ.

   Pure: recomputed ε ≤ ε₂ + 1e-9 (+ 1e-12 relative, float rounding of e.g. Δ/scale).
3. **The audit's checks of those parameters.** The exact check of the ideal
   density (the one ``rpwjax audit`` runs, :mod:`rpwjax.audit.exact`)
   and the as-implemented check :func:`rpwjax.realized.check` (the exact
   realized probability of every value the release path can emit), both
   against the *stated* ε₂ and δ: pure, max log ratio ≤ ε₂ + 1e-9 (exact) and
   ≤ ε₂ + 1e-6 (realized); Gaussian, δ(ε₂) ≤ δ·(1 + 1e-5) (exact, quadrature)
   and realized δ ≤ δ.

4. **The refit** (run before the exact and realized checks). Fitting is
   deterministic given the prior, so the
   parameters are fitted again (:func:`rpwjax.api.refit_record`) from the
   saved histogram (or, for Laplace, Gaussian and Staircase, from the range
   alone) and the saved options (ε₂ = ``params.epsilon``, ζ and objective,
   δ and calibration, the Staircase's γ rule), and every field of ``params``
   and ``label_mse`` must be what the refit gives, to
   :data:`~rpwjax.api.REFIT_TOLERANCE` relative plus
   :data:`~rpwjax.api.REFIT_ABSOLUTE` (float rounding across machines, e.g.
   an LP's optimality gap that is zero up to rounding). What is released and
   published is then the refit, not the file's numbers, and the accounting
   is recomputed from what was spent: ε = ε₁ + ε₂ with ε₁ > 0 only for a
   ``private-histogram`` prior.

What cannot be checked from a file: that ε₁ was really spent on the noisy
histogram (its noise is secret); and a prior that is not a private release
(``empirical``, or a ``histogram`` someone vouched for) is private only if it
is public: ``privatize --params`` then needs ``--prior-is-public`` and the
record says the guarantee is conditional on it. The parameters of a
mechanism fitted to an empirical prior (never saved) cannot be refitted at
all. The report's ``not_verifiable`` says which applies.

:func:`check_record` runs the same checks without raising (``rpwjax audit
--params`` reports every problem); :func:`verify_record` raises when any
fails (the message leads with the first problem) and otherwise returns the
report that ``rpwjax privatize --params`` publishes in the sidecar as ``"verified"``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import numpy as np

from rpwjax import certify, realized
from rpwjax.api import (FORMAT_VERSION, REFIT_ABSOLUTE, REFIT_TOLERANCE, load_params, one_record, prior_from_record,
                        record_entry, refit_record)
from rpwjax.audit.checks import audit_mechanism, fit_record
from rpwjax.audit.empirical import DEFAULT_SAMPLES
from rpwjax.audit.exact import DEFAULT_GRID_SIZE, DELTA_RELATIVE_TOLERANCE, RATIO_TOLERANCE, exact_check, label_grid
from rpwjax.audit.report import _judged_against
from rpwjax.audit.shipped import new_audit_seed
from rpwjax.errors import InputError, check_integer, show_value
from rpwjax.io.atomic import read_json
from rpwjax.mechanisms import entry
from rpwjax.mechanisms.additive import gaussian_delta

RELATIVE_TOLERANCE = 1e-12  # stated numbers that must agree (ε = ε₁ + ε₂, params.epsilon = ε₂, δ = params.delta)
EPSILON_TOLERANCE = 1e-9  # a recomputed ε may exceed ε₂ by this (plus RELATIVE_TOLERANCE·ε₂)
GAUSSIAN_DELTA_TOLERANCE = 1e-9  # relative: δ(ε₂) of σ may exceed δ by this (root-finding rounding)
ROW_MASS_TOLERANCE = 1e-6  # rows of a probability matrix sum to one within this
PRIOR_KINDS = ("private-histogram", "histogram", "empirical", "none")
REQUIRED_FIELDS = ("mechanism", "epsilon", "epsilon_prior", "epsilon_mechanism", "delta", "pure_dp", "range", "prior",
                   "params")
PUBLIC_PRIOR_KINDS = ("empirical", "histogram")  # priors with no accounted private release behind them
UNVERIFIABLE = {
    "private-histogram": "epsilon_prior is accounted as stated: the private histogram's noise is secret, so the file "
                         "cannot show that epsilon_prior was spent on it",
    "histogram": "the saved histogram is not an accounted private release (epsilon_prior = 0): the guarantee holds "
                 "only if that prior is public",
    "empirical": "the empirical prior is a function of the raw labels and is not saved: the guarantee holds only if "
                 "that prior is public",
    "none": "nothing: the mechanism uses no prior and its parameters were refitted from the options and range",
}


def _number(record: dict, name: str, problems: list[str]) -> float | None:
    """A stated finite real number (not a bool), or None with a problem."""
    if name not in record:
        return None  # reported once as missing
    value = record[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        problems.append(f"{name} must be a finite number, got {name}={value!r}")
        return None
    return float(value)


def _close(a: float, b: float, rel: float = RELATIVE_TOLERANCE) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


def _scalar(params, name: str) -> float:
    return float(np.asarray(getattr(params, name), np.float64))


# --------------------------------------------------------------------------- layer 1: the stated fields


def _check_fields(record: dict, params, cls, problems: list[str]) -> dict:
    """ε = ε₁ + ε₂, params.epsilon = ε₂, range, pure_dp, delta; returns the stated numbers."""
    for name in REQUIRED_FIELDS:
        if name not in record:
            problems.append(f"field {name!r} is missing (a params file states its whole guarantee)")
    if "format_version" in record:
        if record["format_version"] != FORMAT_VERSION:
            problems.append(f"format_version={record['format_version']!r} is not {FORMAT_VERSION}")
    eps = _number(record, "epsilon", problems)
    eps1 = _number(record, "epsilon_prior", problems)
    eps2 = _number(record, "epsilon_mechanism", problems)
    delta = _number(record, "delta", problems)
    if eps is not None and eps <= 0:
        problems.append(f"epsilon must be positive, got epsilon={eps!r}")
    if eps1 is not None and eps1 < 0:
        problems.append(f"epsilon_prior must not be negative, got epsilon_prior={eps1!r}")
    if eps2 is not None and eps2 <= 0:
        problems.append(f"epsilon_mechanism must be positive, got epsilon_mechanism={eps2!r}")
    if delta is not None and not 0 <= delta < 1:
        problems.append(f"delta must be in [0, 1), got delta={delta!r}")
    if None not in (eps, eps1, eps2) and not _close(eps, eps1 + eps2):
        problems.append(f"epsilon={eps!r} disagrees with epsilon_prior + epsilon_mechanism = {eps1!r} + {eps2!r} "
                        f"= {eps1 + eps2!r}")
    pure = bool(cls.pure)
    if "pure_dp" in record and record["pure_dp"] is not pure:
        problems.append(f"pure_dp={record['pure_dp']!r} disagrees with the {cls.name} mechanism, which is "
                        + ("pure epsilon-DP (pure_dp=True)" if pure else "only (epsilon, delta)-DP (pure_dp=False)"))
    if params is None:
        return {"epsilon": eps, "epsilon_prior": eps1, "epsilon_mechanism": eps2, "delta": delta}
    p_eps = _scalar(params, "epsilon")
    if eps2 is not None and not _close(p_eps, eps2):
        problems.append(f"params.epsilon={p_eps!r} disagrees with epsilon_mechanism={eps2!r}")
    if "range" in record:
        stated = record["range"]
        ok = isinstance(stated, (list, tuple)) and len(stated) == 2 and all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) for v in stated)
        if not ok or (float(stated[0]), float(stated[1])) != (float(params.lo), float(params.hi)):
            problems.append(f"range={stated!r} disagrees with [params.lo, params.hi]=[{params.lo!r}, {params.hi!r}]")
    if delta is not None:
        if pure and delta != 0:
            problems.append(f"delta={delta!r} disagrees with the {cls.name} mechanism, which is pure epsilon-DP "
                            "(delta must be 0)")
        if not pure:
            p_delta = _scalar(params, "delta")
            if not _close(delta, p_delta):
                problems.append(f"delta={delta!r} disagrees with params.delta={p_delta!r}")
    return {"epsilon": eps, "epsilon_prior": eps1, "epsilon_mechanism": eps2, "delta": delta}


def _check_prior(record: dict, stated: dict, name: str, uses_prior: bool, problems: list[str]) -> str | None:
    """The prior's record against ε₁; returns its kind (None if unusable)."""
    if "prior" not in record:
        return None  # reported as missing
    saved = record["prior"]
    if not isinstance(saved, dict):
        problems.append(f"prior must be an object with a 'kind', got prior={saved!r}")
        return None
    kind = saved.get("kind")
    if kind not in PRIOR_KINDS:
        problems.append(f"prior.kind must be one of {', '.join(PRIOR_KINDS)}, got prior.kind={kind!r}")
        return None
    eps1 = stated["epsilon_prior"]
    has_histogram = "edges" in saved or "masses" in saved
    if kind == "private-histogram":
        if eps1 is not None and not eps1 > 0:
            problems.append(f"prior.kind='private-histogram' costs privacy, but epsilon_prior={eps1!r} "
                            "(it must be > 0)")
    elif eps1 is not None and eps1 != 0:
        problems.append(f"prior.kind={kind!r} spends no privacy budget, but epsilon_prior={eps1!r} (it must be 0)")
    if kind == "none" and uses_prior:
        problems.append(f"prior.kind='none' disagrees with mechanism={name!r}, which is fitted to a prior")
    if kind in ("empirical", "none"):
        if has_histogram:
            problems.append(f"prior.kind={kind!r} carries edges/masses (only histogram priors are saved)")
        if saved.get("bins") is not None:
            problems.append(f"prior.kind={kind!r} disagrees with prior.bins={saved['bins']!r} (it must be null)")
        return kind
    # a histogram: its saved bins must be readable and lie on the range
    if "edges" not in saved or "masses" not in saved:
        problems.append(f"prior.kind={kind!r} needs prior.edges and prior.masses")
        return kind
    try:
        prior = prior_from_record(record)
    except InputError as err:
        problems.append(f"prior: {err}")
        return kind
    except (TypeError, ValueError) as err:
        problems.append(f"prior: edges or masses are not numbers: {err}")
        return kind
    masses = np.asarray(saved["masses"], np.float64)
    if not abs(float(masses.sum()) - 1.0) <= 1e-9:
        problems.append(f"prior.masses sum to {float(masses.sum())!r}, not 1")
    rng = record.get("range")
    if isinstance(rng, (list, tuple)) and len(rng) == 2:
        try:
            lo, hi = float(rng[0]), float(rng[1])
        except (TypeError, ValueError):
            lo = hi = None
        if lo is not None and (prior.lo, prior.hi) != (lo, hi):
            problems.append(f"prior.edges span [{prior.lo!r}, {prior.hi!r}], range is [{lo!r}, {hi!r}]")
    bins = saved.get("bins")
    if kind == "private-histogram":
        if isinstance(bins, bool) or not isinstance(bins, numbers.Integral) or bins != masses.size:
            problems.append(f"prior.bins={bins!r} disagrees with the {masses.size} saved prior.masses")
        else:
            edges = np.asarray(saved["edges"], np.float64)
            equal = np.linspace(prior.lo, prior.hi, masses.size + 1)
            if not np.allclose(edges, equal, rtol=0, atol=1e-12 * (prior.hi - prior.lo)):
                problems.append("prior.edges of a private histogram must be equal-width bins over the range")
    elif bins is not None:
        problems.append(f"prior.kind={kind!r} disagrees with prior.bins={bins!r} (it must be null)")
    return kind


# --------------------------------------------------------------------------- layer 2: recompute from the parameters


def _laplace(params, stated, problems):
    scale = _scalar(params, "scale")
    width = float(params.hi) - float(params.lo)
    eps = width / scale if scale > 0 and math.isfinite(scale) else math.inf
    return eps, {"recomputed_from": "(hi - lo) / scale"}


def _rpwithprior(params, stated, problems):
    eps, zeta = _scalar(params, "epsilon"), _scalar(params, "zeta")
    a1, a2 = _scalar(params, "a1"), _scalar(params, "a2")
    gamma = 2 * zeta + math.exp(-eps) * (a2 - a1)
    saved = stated["fields"].get("gamma")
    if saved is not None:
        ok = isinstance(saved, numbers.Real) and not isinstance(saved, bool) and _close(float(saved), gamma, 1e-9)
        if not ok:
            problems.append(f"params.gamma={saved!r} disagrees with 2*zeta + exp(-epsilon)*(A2 - A1) = {gamma!r}")
    return (eps if a2 > a1 else 0.0), {
        "recomputed_from": "densities 1/gamma and exp(-params.epsilon)/gamma on one support (0 if A1 = A2)"}


def _staircase(params, stated, problems):
    gamma = _scalar(params, "gamma")
    if not 0 < gamma < 1:
        return math.inf, {"recomputed_from": "gamma outside (0, 1)"}
    return _scalar(params, "epsilon"), {
        "recomputed_from": "steps of b = exp(-params.epsilon): density ratio 1/b for every gamma in (0, 1)"}


def _rr_on_bins(params, stated, problems):
    eps = _scalar(params, "epsilon")
    outputs = np.asarray(params.outputs, np.float64)
    thresholds = np.asarray(params.thresholds, np.float64)
    m = _scalar(params, "num_bins")
    if outputs.ndim != 1 or thresholds.shape != (max(outputs.size - 1, 0),):
        problems.append(f"params.outputs ({outputs.shape}) and params.thresholds ({thresholds.shape}) do not fit "
                        "(K outputs need K - 1 thresholds)")
        return math.inf, {}
    if not (m == int(m) and 1 <= m <= outputs.size):
        problems.append(f"params.num_bins={m!r} must be an integer in [1, {outputs.size}] (the outputs given)")
        return math.inf, {}
    if not (np.all(np.isfinite(outputs)) and np.all(np.isfinite(thresholds))):
        problems.append("params.outputs and params.thresholds must be finite")
        return math.inf, {}
    m = int(m)
    _, shared = np.unique(outputs[:m], return_counts=True)
    # own group e^ε, others 1: a value shared by c of the m groups has weight c - 1 + e^ε or c
    losses = [float(np.logaddexp(math.log(c - 1) if c > 1 else -math.inf, eps) - math.log(c)) for c in shared if c < m]
    return max(losses, default=0.0), {"recomputed_from": "log of the own-group weight over another group's"}


def _unbiased(params, stated, problems):
    support = np.asarray(params.support, np.float64)
    outputs = np.asarray(params.outputs, np.float64)
    q = np.asarray(params.probabilities, np.float64)
    if support.ndim != 1 or outputs.ndim != 1 or q.shape != (support.size, outputs.size):
        problems.append(f"params.probabilities has shape {q.shape}, needs (len(support), len(outputs)) = "
                        f"({support.size}, {outputs.size})")
        return math.inf, {}
    if not (np.all(np.isfinite(q)) and np.all(q >= 0) and np.all(np.isfinite(support))
            and np.all(np.isfinite(outputs))):
        problems.append("params.probabilities must be finite and non-negative, support and outputs finite")
        return math.inf, {}
    if support.size > 1 and not np.all(np.diff(support) > 0):
        problems.append("params.support must be strictly increasing")
    if outputs.size > 1 and not np.all(np.diff(outputs) >= 0):
        problems.append("params.outputs must be non-decreasing")
    rows = q.sum(axis=1)
    if np.any(np.abs(rows - 1) > ROW_MASS_TOLERANCE):
        i = int(np.argmax(np.abs(rows - 1)))
        problems.append(f"row {i} of params.probabilities sums to {float(rows[i])!r}, not 1")
    high, low = q.max(axis=0), q.min(axis=0)
    used = high > 0
    if np.any(used & (low == 0)):
        eps = math.inf
    else:
        eps = float(np.max(np.log(high[used]) - np.log(low[used]))) if used.any() else 0.0
    return eps, {"recomputed_from": "max over outputs of log(max/min) of the probability matrix's column"}


def _gaussian_epsilon(sigma: float, delta: float, width: float) -> float:
    """The smallest ε' with δ(ε') <= δ for N(0, σ²) noise (δ(ε) decreases in ε); inf if none below 1e6."""
    ok = lambda e: float(gaussian_delta(sigma, e, width)) <= delta  # noqa: E731
    if ok(0.0):
        return 0.0
    high = 1.0
    while not ok(high):
        high *= 2
        if high > 1e6:
            return math.inf
    low = 0.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        low, high = (low, mid) if ok(mid) else (mid, high)
    return high


RECOMPUTE = {"laplace": _laplace, "rpwithprior": _rpwithprior, "staircase": _staircase, "rr-on-bins": _rr_on_bins,
             "unbiased": _unbiased}


def _recompute(params, stated: dict, problems: list[str]) -> dict:
    """Layer 2: the guarantee of the parameters themselves against the stated ε₂ (and δ)."""
    eps2, delta = stated["epsilon_mechanism"], stated["delta"]
    out: dict[str, Any] = {}
    if not params.pure:
        sigma = _scalar(params, "sigma")
        width = float(params.hi) - float(params.lo)
        if not (sigma > 0 and math.isfinite(sigma)):
            problems.append(f"params.sigma={sigma!r} must be positive and finite")
            return {"epsilon_mechanism_recomputed": math.inf}
        target = delta if delta is not None and delta > 0 else _scalar(params, "delta")
        out["epsilon_mechanism_recomputed"] = _gaussian_epsilon(sigma, target, width)
        out["recomputed_from"] = "exact delta(epsilon) of sigma (rpwjax.mechanisms.additive.gaussian_delta)"
        if eps2 is not None:
            at = float(gaussian_delta(sigma, eps2, width))
            out["delta_recomputed"] = at
            if delta is not None and not at <= delta * (1 + GAUSSIAN_DELTA_TOLERANCE):
                problems.append(f"the parameters give delta={at:.9g} at epsilon_mechanism={eps2!r} (exact, from "
                                f"sigma={sigma!r}), more than the stated delta={delta!r}")
        return out
    fn = RECOMPUTE.get(params.name)
    if fn is None:  # pragma: no cover - every registered pure mechanism has a closed form above
        return {"epsilon_mechanism_recomputed": None, "recomputed_from": "no closed form: exact and realized checks only"}
    eps, info = fn(params, stated, problems)
    out["epsilon_mechanism_recomputed"] = eps
    out.update(info)
    out["delta_recomputed"] = 0.0
    if eps2 is not None and not eps <= eps2 + EPSILON_TOLERANCE + RELATIVE_TOLERANCE * eps2:
        problems.append(f"the parameters are {eps:.12g}-DP (recomputed from {info.get('recomputed_from', 'them')}), "
                        f"less private than epsilon_mechanism={eps2!r}")
    return out


# --------------------------------------------------------------------------- layer 3: the audit's checks


def _exact_stage(params, stated: dict, problems: list[str]) -> dict:
    eps2, delta = stated["epsilon_mechanism"], stated["delta"]
    try:
        with jax.enable_x64(True):
            exact = exact_check(params, label_grid(params), DEFAULT_GRID_SIZE, 0)
    except Exception as err:  # noqa: BLE001 - a record whose parameters break the check fails it
        problems.append(f"exact check could not run: {type(err).__name__}: {err}")
        return {}
    problems += [f"exact check: {p}" for p in exact["info"].get("problems", [])]
    if params.pure:
        ratio = exact["max_ratio"]
        if eps2 is not None and not ratio <= eps2 + RATIO_TOLERANCE:
            problems.append(f"exact check: max log density ratio {ratio:.9g} exceeds epsilon_mechanism={eps2!r}")
        return {"exact_max_log_ratio": ratio}
    if delta is not None and not exact["delta"] <= delta * (1 + DELTA_RELATIVE_TOLERANCE):
        problems.append(f"exact check: delta(epsilon) {exact['delta']:.9g} exceeds delta={delta!r}")
    return {"exact_delta": exact["delta"]}


def _realized_stage(params, stated: dict, problems: list[str]) -> dict:
    eps2, delta = stated["epsilon_mechanism"], stated["delta"]
    try:
        real = certify.realized_result(params)  # cached: the release that follows does not run it again
    except Exception as err:  # noqa: BLE001 - e.g. no certified release grid for these parameters
        problems.append(f"realized check could not run: {type(err).__name__}: {err}")
        return {}
    # its own verdict is against params.epsilon; what matters here is the stated ε₂ and δ
    verdicts = ("realized max log ratio", "realized delta")
    problems += [f"realized check: {p}" for p in real["problems"] if not p.startswith(verdicts)]
    if params.pure:
        ratio = real["realized_max_log_ratio"]
        if eps2 is not None and not ratio <= eps2 + realized.tolerance(eps2):
            problems.append(f"realized check: max log ratio {ratio:.9g} of the shipped release exceeds "
                            f"epsilon_mechanism={eps2!r}")
        return {"realized_max_log_ratio": ratio, "output_grid": real["info"].get("output_grid"),
                "output_range": real["info"].get("output_range")}
    if delta is not None and not real["realized_delta"] <= delta:
        problems.append(f"realized check: delta {real['realized_delta']:.9g} of the shipped release at "
                        f"epsilon={_scalar(params, 'epsilon')!r} exceeds delta={delta!r}")
    return {"realized_delta": real["realized_delta"], "output_grid": real["info"].get("output_grid"),
            "output_range": real["info"].get("output_range")}


# --------------------------------------------------------------------------- layer 4: the refit


def _mismatch(saved, refit):
    """Where a saved value is not the refit's: None if it is, else ``(suffix, saved part, refit part)``.

    Numbers agree to :data:`~rpwjax.api.REFIT_TOLERANCE` relative plus
    :data:`~rpwjax.api.REFIT_ABSOLUTE` (float rounding across machines); strings
    and booleans exactly. An array names its first element that differs.
    """
    if isinstance(refit, (str, bool)) or refit is None or isinstance(saved, (str, bool)) or saved is None:
        return None if saved == refit and type(saved) is type(refit) else ("", saved, refit)
    try:
        a, b = np.asarray(saved, np.float64), np.asarray(refit, np.float64)
    except (TypeError, ValueError):
        return "", show_value(saved), refit
    if a.shape != b.shape:
        return " (shape)", list(a.shape), list(b.shape)
    bad = ~(np.abs(a - b) <= REFIT_TOLERANCE * np.maximum(np.abs(a), np.abs(b)) + REFIT_ABSOLUTE)
    if not bad.any():
        return None
    i = np.unravel_index(int(np.flatnonzero(bad)[0]), a.shape)
    return "".join(f"[{k}]" for k in i), a[i].item(), b[i].item()


def _unpadded(name: str, fields: dict) -> dict:
    """An Unbiased record without its never-emitted outputs: a fit over an ε grid pads every ε to the same number
    of outputs with columns of probability zero, which the fit for that ε alone does not have (same mechanism)."""
    if name != "unbiased":
        return fields
    try:
        q = np.asarray(fields["probabilities"], np.float64)
        outputs = np.asarray(fields["outputs"], np.float64)
        used = q.max(axis=0) > 0
        if q.ndim != 2 or outputs.shape != used.shape:
            return fields
    except (KeyError, TypeError, ValueError):
        return fields
    return dict(fields, outputs=outputs[used].tolist(), probabilities=q[:, used].tolist())


def _refit_stage(record: dict, problems: list[str], out: dict):
    """Layer 4: refit from the saved prior and options; every saved parameter must be the refit's."""
    try:
        result, how = refit_record(record)
    except InputError as err:
        problems.append(f"refit: {err}")
        return None
    except (KeyError, TypeError, ValueError) as err:
        problems.append(f"refit could not read the saved options: {type(err).__name__}: {err}")
        return None
    if result is None:
        out["refit"] = how
        return None
    refit = result.records()[0]
    name = record["mechanism"]
    saved = _unpadded(name, record["params"] if isinstance(record["params"], dict) else {})
    for key, value in _unpadded(name, refit["params"]).items():
        if key not in saved:
            problems.append(f"params.{key} is missing: the {name} fit gives {key}={show_value(value)} for the saved "
                            "prior")
        elif (where := _mismatch(saved[key], value)) is not None:
            at, was, fit = where
            problems.append(f"params.{key}{at}={was!r} is not what the {name} fit gives for the saved prior and "
                            f"options ({key}{at}={fit!r}): the parameters were not fitted to them")
    for key in saved:
        if key not in refit["params"]:
            problems.append(f"params.{key}={show_value(saved[key])} is not a field the {name} fit gives")
    if "label_mse" in record and _mismatch(record["label_mse"], refit["label_mse"]) is not None:
        problems.append(f"label_mse={record['label_mse']!r} is not what the fit gives for the saved prior "
                        f"({refit['label_mse']!r})")
    out["refit"] = f"refitted from {how}: every parameter agrees"
    out["accounting"] = {
        **{k: refit[k] for k in ("epsilon", "epsilon_prior", "epsilon_mechanism", "delta")},
        "from": "recomputed: epsilon_mechanism of the refit parameters plus epsilon_prior, which counts only for a "
                "private-histogram prior (0 for a public prior or none)",
    }
    return result


# --------------------------------------------------------------------------- public API


def _finite(v):
    """JSON has no inf or nan: write them as strings."""
    return v if not isinstance(v, float) or math.isfinite(v) else str(v)


def check_record(record, *, exact: bool = True, realized: bool = True, stop_early: bool = False) -> tuple[Any, dict]:
    """Every check of :func:`verify_record`, collected instead of raised.

    Returns ``(params, report)``: the parsed parameters (None when the
    mechanism's own validation already refuses them; the refit's when the
    refit ran) and a JSON-ready report whose ``problems`` lists every
    disagreement found (empty: verified) and whose ``checks`` says which
    layers passed (None: not run; ``refit`` None also when the parameters
    cannot be refitted, an empirical prior). With ``stop_early`` the refit,
    exact and realized checks are skipped once the fields or the recomputed
    guarantee have failed. A value that is not a fit record at all raises
    :class:`InputError`.
    """
    params, report, _ = _check(record, exact=exact, realized=realized, stop_early=stop_early)
    return params, report


def _check(record, *, exact: bool, realized: bool, stop_early: bool):
    """:func:`check_record` plus the refit's :class:`~rpwjax.api.FitResult` (None when it did not run or failed)."""
    record = one_record(record)
    row = entry(record["mechanism"])
    cls, uses_prior = row.params, row.uses_prior
    problems: list[str] = []
    stages: dict[str, bool] = {}

    def stage(name, fn, *args):
        before = len(problems)
        out = fn(*args)
        stages[name] = len(problems) == before
        return out

    params = result = None
    try:
        params, _ = load_params(record)
    except InputError as err:
        problems.append(str(err))
    stated = stage("fields", _check_fields, record, params, cls, problems)
    if params is None:
        stages["fields"] = False
    kind = stage("prior", _check_prior, record, stated, cls.name, uses_prior, problems)
    if kind is None:
        stages["prior"] = False
    report: dict[str, Any] = {
        "verifier": "rpwjax.audit.verify.verify_record",
        "mechanism": cls.name,
        "guarantee": "eps-DP" if cls.pure else "(eps, delta)-DP",
        **{k: stated[k] for k in ("epsilon", "epsilon_prior", "epsilon_mechanism", "delta")},
        "prior": kind,
    }
    if params is None:
        stages.update(parameters=False, exact=None, realized=None)
    else:
        stated["fields"] = record["params"] if isinstance(record["params"], dict) else {}
        report.update(stage("parameters", _recompute, params, stated, problems))
        skip = stop_early and bool(problems)
        if kind is not None and not skip:
            result = stage("refit", _refit_stage, record, problems, report)
            if result is None and not problems:
                stages["refit"] = None  # an empirical prior: nothing to refit from
            elif result is not None and stages["refit"]:
                params = result.params  # what is released: the refit, not the file's numbers
        else:
            stages["refit"] = None
        skip = stop_early and bool(problems)
        for name, wanted, fn in (("exact", exact, _exact_stage), ("realized", realized, _realized_stage)):
            if wanted and not skip:
                report.update(stage(name, fn, params, stated, problems))
            else:
                stages[name] = None
    report = {k: _finite(v) for k, v in report.items()}
    report["checks"] = stages
    report["not_verifiable"] = UNVERIFIABLE.get(kind, UNVERIFIABLE["private-histogram"])
    if kind in PUBLIC_PRIOR_KINDS:
        report["conditional"] = f"the guarantee holds only if the {kind} prior is public (nothing was spent on it)"
    report["problems"] = problems
    report["pass"] = not problems
    return params, report, (result if stages.get("refit") else None)


def verify_record(record):
    """Parameters of a params file whose stated guarantee was recomputed and holds; refuse anything else.

    Runs the four layers of checks of the module docstring on ``record`` (a
    ``--save`` record or a one-element ``fit --json`` list). Returns
    ``(params, report)``: ``params`` the refit's (the file's only where
    nothing can be refitted, an empirical prior), ``report`` the JSON-ready
    ``"verified"`` object of a sidecar: the stated ε, ε₁, ε₂, δ, the ε₂
    recomputed from the parameters (``epsilon_mechanism_recomputed``, and for
    the Gaussian ``delta_recomputed``, its exact δ at ε₂), the refit and its
    recomputed ``accounting``, the exact and realized checks' maxima, and
    which checks ran. Raises :class:`InputError` (exit 2 in the CLI), one line,
    naming the field and both values of the first disagreement.
    """
    params, _, report = verified_release(record)
    return params, report


def verified_release(record, *, name: str | None = None):
    """:func:`verify_record`, and the record to publish: ``(params, record, report)``.

    When the parameters were refitted, ``params`` and the returned record are
    the refit's (its parameters, ``label_mse``, prior record and recomputed
    accounting; an integer-seed mark kept), so no number of the file reaches
    the release or the sidecar unchecked; otherwise (an empirical prior) the
    file's. ``name`` (the file's path) leads the refusal's message.
    """
    record = one_record(record)
    params, report, result = _check(record, exact=True, realized=True, stop_early=True)
    problems = report["problems"]
    if problems:
        more = f" (and {len(problems) - 1} more: {'; '.join(problems[1:])})" if len(problems) > 1 else ""
        where = f" {name!r}" if name is not None else ""
        raise InputError(f"params file{where} refused: {problems[0]}{more}")
    if result is not None:
        seeded = record.get("reproducible_seed") is True
        record = result.records()[0]
        if seeded:  # the fit's histogram noise came from an integer seed: the release says so
            record.update(reproducible_seed=True, seed_note="integer seed: not for production")
    return params, record, report


def audit_params_file(path, *, samples: int = DEFAULT_SAMPLES, seed: int = 0,
                      audit_seed: int | None = None) -> dict:
    """Audit a saved fit (``rpwjax audit --params``): the record's verification (:func:`check_record`) and the
    exact, realized and empirical checks of its parameters, against the epsilon_mechanism and delta it states.

    ``path`` is a params file (``rpwjax fit --save``) or a privatize sidecar (``OUTPUT.json``): the fields a
    release adds to the record (:data:`~rpwjax.audit.checks.SIDECAR_FIELDS`) are set aside first. Returns
    ``{"report", "record", "broken", "keys", "pass", "audit_seed"}`` (``report`` is None when the parameters do
    not parse).
    """
    samples = check_integer(samples, "samples")
    seed = check_integer(seed, "seed", 0)
    audit_seed = new_audit_seed() if audit_seed is None else check_integer(audit_seed, "audit_seed", 0)
    record = one_record(fit_record(read_json(path)), name=str(path))
    record_entry(record, name=str(path))  # an unknown mechanism is bad input, refused naming the file
    params, record = check_record(record)
    keys = realized.key_space_check()
    report, broken = None, []
    if params is not None:
        try:
            report = audit_mechanism(params, samples=samples, seed=seed, name=record["mechanism"],
                                            audit_seed=audit_seed)
            report = _judged_against(report, record["epsilon_mechanism"], record["delta"])
        except Exception as err:  # noqa: BLE001 - parameters that break the audit fail it
            broken.append(f"{path}: could not be audited: {type(err).__name__}: {err}")
    ok = bool(record["pass"] and report is not None and report.passed and not broken and keys["pass"])
    return {"report": report, "record": record, "broken": broken, "keys": keys, "pass": ok, "audit_seed": audit_seed}
