r"""``rpwjax audit``: check each mechanism's guarantee on a grid and on fresh labels, and try to refute it by sampling.

Every check is driven only by the mechanism contract (``log_density``,
``sample``, ``pure``, ``discrete``, ``breakpoints``), so a new mechanism in
:data:`rpwjax.api.MECHANISMS` is audited without code here. This module runs
them; per fitted mechanism (:func:`audit_mechanism`):

1. the exact check of the density it claims (:mod:`rpwjax.audit.exact`);
2. the empirical audit of the sampler that runs (:mod:`rpwjax.audit.empirical`);
3. the realized check of every value the release path can emit (:func:`rpwjax.realized.check`, at
   fixed labels and fresh random ones, :mod:`rpwjax.audit.shipped`), and the output-grid check
   (:func:`rpwjax.audit.shipped.output_grid_check`).

Each returns an :class:`~rpwjax.audit.report.AuditReport`; :func:`audit` and
:func:`run_audit` fit the registered mechanisms on a fixed example prior and audit them.

The exact check trusts ``log_density``; the empirical audit trusts nothing
but the samples (its sets come from ``log_density``, which only affects its
power). A sampler bug that changes the distribution by less than sampling
noise, or only at labels other than the audited pair, is not caught.

**A saved fit** (``rpwjax audit --params FILE``): instead of fitting the
example prior, the file's record is verified first
(:func:`rpwjax.audit.verify.check_record`: its fields agree, and the guarantee is
recomputed from the parameters), then its parameters get the three checks
above, judged against the ``epsilon_mechanism`` and ``delta`` the file
states. Every problem of the record is printed; the exit code is 0 iff the
record verifies and every check passes.
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from scipy import stats

from rpwjax import api
from rpwjax import certify, realized
from rpwjax.audit.empirical import DEFAULT_BINS, DEFAULT_CONFIDENCE, DEFAULT_SAMPLES, _empirical
from rpwjax.audit.exact import DEFAULT_GRID_SIZE, DEFAULT_LABEL_GRID_SIZE, _claimed, exact_check, label_grid
from rpwjax.audit.report import AuditReport
from rpwjax.audit.shipped import FRESH_LABELS, new_audit_seed, output_grid_check
from rpwjax.mechanisms.base import Mechanism
from rpwjax.sampling import spec
from rpwjax.errors import InputError, check_choice, check_epsilon, check_integer

DEFAULT_EPSILON = 1.0
EXAMPLE_RANGE = (0.0, 1.0)


# --------------------------------------------------------------------------- public API



def audit_mechanism(
    params: Mechanism,
    *,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    grid_size: int = DEFAULT_GRID_SIZE,
    label_grid_size: int = DEFAULT_LABEL_GRID_SIZE,
    bins: int = DEFAULT_BINS,
    confidence: float = DEFAULT_CONFIDENCE,
    name: str | None = None,
    audit_seed: int | None = None,
    fresh_labels: int = FRESH_LABELS,
) -> AuditReport:
    """Exact check and empirical audit of ONE fitted mechanism (unbatched params).

    Args:
      params: a fitted :class:`~rpwjax.mechanisms.base.Mechanism` for one ε.
      samples: outputs drawn at each of the two audited labels.
      seed: the sampling seed (public: the audit has nothing to hide).
      grid_size: points of the uniform output grid (continuous outputs).
      label_grid_size: equally spaced labels on [lo, hi] (breakpoints are added).
      bins: equal-width bins of the empirical audit (continuous outputs).
      confidence: joint confidence of all Clopper-Pearson bounds.
      name: the name in the report (default ``params.name``).
      audit_seed: the seed of the realized check's ``fresh_labels`` random labels (default: drawn from OS
        entropy, so that every audit checks labels nobody chose; recorded in the report to reproduce it).
    """
    if not isinstance(params, Mechanism):
        raise InputError(f"params must be a fitted rpwjax mechanism, got params of type {type(params).__name__}")
    if params.batch_shape != ():
        raise InputError(f"audit needs parameters for one epsilon, got batch shape {params.batch_shape}")
    samples = check_integer(samples, "samples")
    seed = check_integer(seed, "seed", 0)
    grid_size = check_integer(grid_size, "grid_size", 3)
    label_grid_size = check_integer(label_grid_size, "label_grid_size", 2)
    bins = check_integer(bins, "bins")
    if not 0 < confidence < 1:
        raise InputError(f"confidence must be in (0, 1), got confidence={confidence!r}")
    audit_seed = new_audit_seed() if audit_seed is None else check_integer(audit_seed, "audit_seed", 0)
    fresh_labels = check_integer(fresh_labels, "fresh_labels", 0)
    eps, delta, pure = _claimed(params)
    check_epsilon(eps)
    with jax.enable_x64(True), certify.suspended():  # the audit measures the release, it does not refuse it
        labels = label_grid(params, label_grid_size)
        exact = exact_check(params, labels, grid_size, seed)
        lower_bound, empirical_pass, empirical_info = _empirical(params, exact, labels, samples, seed, bins, confidence)
        real = realized.check(params, extra_labels=realized.fresh_labels(params, fresh_labels, audit_seed))
        grid_pass, grid_info = output_grid_check(params, seed)
    return AuditReport(
        mechanism=name or params.name,
        epsilon=eps,
        delta=delta,
        pure=pure,
        exact_max_log_ratio=exact["max_ratio"],
        exact_delta=exact["delta"],
        exact_pass=exact["pass"],
        empirical_lower_bound=lower_bound,
        empirical_pass=empirical_pass,
        details={"exact": exact["info"], "empirical": empirical_info, "output_grid": grid_info, "confidence": confidence,
                 "realized": dict(real["info"], problems=real["problems"]), "audit_seed": audit_seed},
        output_grid_pass=grid_pass,
        realized_max_log_ratio=real["realized_max_log_ratio"],
        realized_delta=real["realized_delta"],
        realized_pass=real["pass"],
    )


def example_labels() -> np.ndarray:
    """The fixed public example prior: 64 Beta(2, 5) quantiles on [0, 1] (no randomness, no data)."""
    return stats.beta.ppf((np.arange(64) + 0.5) / 64, 2, 5)


def fit_example(name: str, epsilon: float) -> Mechanism:
    """``name`` fitted at ``epsilon`` on the example prior (privacy does not depend on the prior)."""
    return api.fit(name, example_labels(), range=EXAMPLE_RANGE, epsilon=epsilon, prior="empirical").params


def _names(names) -> list[str]:
    known = api.mechanism_names()
    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not names:
        raise InputError("mechanism names must not be empty, got names=[]")
    out = []
    for n in names:
        if n == "all":
            out += [m for m in known if m not in out]
        else:
            check_choice(n, "mechanism", (*known, "all"))
            if n not in out:
                out.append(n)
    return out


def audit(
    names: str | Sequence[str] = "all",
    epsilon=DEFAULT_EPSILON,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    audit_seed: int | None = None,
    **options,
) -> list[AuditReport]:
    """Fit each named mechanism (``"all"``: every registered one) at each ``epsilon`` and audit it.

    Every mechanism is fitted with :func:`rpwjax.api.fit` on :func:`example_labels`
    over [0, 1]; ``options`` go to :func:`audit_mechanism`. Reports are ordered
    by mechanism, then ε. ``audit_seed`` (default: one from OS entropy) seeds every report's fresh labels.
    """
    eps = np.atleast_1d(check_epsilon(epsilon))
    samples = check_integer(samples, "samples")
    seed = check_integer(seed, "seed", 0)
    audit_seed = new_audit_seed() if audit_seed is None else check_integer(audit_seed, "audit_seed", 0)
    return [
        audit_mechanism(fit_example(n, float(e)), samples=samples, seed=seed, name=n, audit_seed=audit_seed, **options)
        for n in _names(names) for e in eps
    ]


# --------------------------------------------------------------------------- runs


def run_audit(mechanisms=None, epsilons=None, *, samples: int = DEFAULT_SAMPLES, seed: int = 0,
              audit_seed: int | None = None) -> dict:
    """Audit registered mechanisms on the example prior at one or more ε.

    Returns ``{"reports", "broken", "keys", "pass", "audit_seed"}``: one :class:`AuditReport` per (mechanism, ε); a
    mechanism that cannot be fitted or audited is reported in ``broken`` (the others are still audited);
    ``keys`` is the key-derivation check (:func:`rpwjax.realized.key_space_check`). Bad arguments
    raise :class:`~rpwjax.errors.InputError`, and so does an ε that the fit or the release's grid refuses (e.g. one
    above what a float64 release can certify, which ``rpwjax privatize`` refuses the same way): every mechanism is
    fitted before anything is checked.
    """
    eps = np.atleast_1d(check_epsilon(epsilons if epsilons is not None else [DEFAULT_EPSILON]))
    samples = check_integer(samples, "samples")
    seed = check_integer(seed, "seed", 0)
    audit_seed = new_audit_seed() if audit_seed is None else check_integer(audit_seed, "audit_seed", 0)
    names = _names(mechanisms if mechanisms is not None else "all")
    fitted, broken = [], []
    for name in names:
        for e in eps:
            try:
                params = fit_example(name, float(e))
                # the public grid and range of its release, as privatize computes them: there are none at an ε no
                # float64 release can certify (e.g. Laplace above 20.1), which privatize refuses as bad input
                spec(params)
            except InputError:  # the ε asked for is refused: bad input, not a broken mechanism
                raise
            except Exception as err:  # noqa: BLE001 - the arguments are valid: this mechanism is broken, not the call
                broken.append(f"{name} at epsilon={e:g}: could not be audited: {type(err).__name__}: {err}")
                continue
            fitted.append((name, e, params))
    keys = realized.key_space_check()
    reports = []
    for name, e, params in fitted:
        try:
            reports.append(audit_mechanism(params, samples=samples, seed=seed, name=name, audit_seed=audit_seed))
        except Exception as err:  # noqa: BLE001 - parameters that break the audit fail it
            broken.append(f"{name} at epsilon={e:g}: could not be audited: {type(err).__name__}: {err}")
    ok = bool(reports and not broken and keys["pass"] and all(r.passed for r in reports))
    return {"reports": reports, "broken": broken, "keys": keys, "pass": ok, "audit_seed": audit_seed}


# what rpwjax privatize adds to the fit's record in its sidecar (rpwjax.privatize.privatize_file)
SIDECAR_FIELDS = ("rows", "label_column", "output_grid", "output_range", "release_grid", "release_range",
                  "postprocessing", "randomness", "verified", "prior_is_public")


def fit_record(record):
    """The fit record inside a privatize sidecar (``OUTPUT.json``): the sidecar less :data:`SIDECAR_FIELDS`;
    anything else unchanged (a params file passes through)."""
    if isinstance(record, dict) and "rows" in record and "label_column" in record:
        return {k: v for k, v in record.items() if k not in SIDECAR_FIELDS}
    return record
