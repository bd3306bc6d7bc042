"""The mechanisms: one module each, and the one registry of them.

Every mechanism follows the same contract (:class:`~rpwjax.mechanisms.base.Mechanism`):
``fit_*(prior, epsilon, ...)`` returns a frozen parameter pytree (batched over
ε when ε is a grid) with ``log_density``, ``sample_from_uniform`` (the
monotone inverse CDF the release path uses), ``bias``, ``mse``,
``release_spec`` and a JSON round trip.

:data:`MECHANISMS` is the registry: a typed table of direct imports, in the
order tables and plots show them. Everything that looks a mechanism up by
name (the one-call :func:`rpwjax.fit`, the CLI, the sweeps, the audit, the
pipelines) goes through :func:`entry`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from rpwjax.errors import check_choice
from rpwjax.mechanisms.additive import Gaussian, Laplace, Staircase, fit_gaussian, fit_laplace, fit_staircase
from rpwjax.mechanisms.base import Mechanism
from rpwjax.mechanisms.rpwithprior import RPWithPrior, fit_rpwithprior
from rpwjax.mechanisms.rr_on_bins import RROnBins, fit_rr_on_bins
from rpwjax.mechanisms.unbiased import Unbiased, fit_unbiased


@dataclasses.dataclass(frozen=True)
class MechanismEntry:
    """One row of the registry."""

    name: str
    fit: Callable  # fit(prior, epsilon, **options) -> (params, info)
    params: type[Mechanism]  # the frozen parameter class (``from_json`` reads a saved fit)
    uses_prior: bool  # True: the fit reads the prior (it costs ε₁ when the prior is private)


MECHANISMS: dict[str, MechanismEntry] = {
    e.name: e
    for e in (
        MechanismEntry("rpwithprior", fit_rpwithprior, RPWithPrior, True),
        MechanismEntry("laplace", fit_laplace, Laplace, False),
        MechanismEntry("gaussian", fit_gaussian, Gaussian, False),
        MechanismEntry("staircase", fit_staircase, Staircase, False),
        MechanismEntry("rr-on-bins", fit_rr_on_bins, RROnBins, True),
        MechanismEntry("unbiased", fit_unbiased, Unbiased, True),
    )
}


def entry(name: str) -> MechanismEntry:
    """The registry row of ``name`` (an :class:`~rpwjax.errors.InputError` naming the choices otherwise)."""
    check_choice(name, "mechanism", tuple(MECHANISMS))
    return MECHANISMS[name]


def mechanism_names() -> tuple[str, ...]:
    return tuple(MECHANISMS)


__all__ = ["MECHANISMS", "MechanismEntry", "entry", "mechanism_names"]
