"""rpwjax: ε-label differential privacy for regression, in JAX.

The public namespace is flat: the one-call :func:`fit` and its result, the
mechanisms' fit functions and parameter classes, priors, secrets, the one
release path (:func:`release`, :func:`release_grid`), posterior denoising and
file privatization. The rooms behind it: :mod:`rpwjax.mechanisms` (one module
per mechanism and their registry), :mod:`rpwjax.pipelines` (feature-aware
pipelines), :mod:`rpwjax.experiments` (data sets, sweeps, plots),
:mod:`rpwjax.audit` (privacy checks), :mod:`rpwjax.bench` (benchmarks).
"""

__version__ = "0.1.0"

from rpwjax.api import FitResult, fit, load_params
from rpwjax.errors import InputError
from rpwjax.keys import Secret
from rpwjax.mechanisms import MECHANISMS, mechanism_names
from rpwjax.mechanisms.additive import Gaussian, Laplace, Staircase, fit_gaussian, fit_laplace, fit_staircase
from rpwjax.mechanisms.base import Mechanism, label_mse_grid, sample_batches, sample_grid
from rpwjax.mechanisms.rpwithprior import RPWithPrior, choose_zeta, fit_rpwithprior
from rpwjax.mechanisms.rr_on_bins import RROnBins, fit_rr_on_bins
from rpwjax.mechanisms.unbiased import Unbiased, fit_unbiased
from rpwjax.posterior import posterior_mean
from rpwjax.priors import Prior, empirical_prior, histogram_prior, private_histogram
from rpwjax.privatize import privatize_file
from rpwjax.release_path import release, release_grid

__all__ = [
    "FitResult",
    "Gaussian",
    "InputError",
    "Laplace",
    "MECHANISMS",
    "Mechanism",
    "Prior",
    "RPWithPrior",
    "RROnBins",
    "Secret",
    "Staircase",
    "Unbiased",
    "choose_zeta",
    "empirical_prior",
    "fit",
    "fit_gaussian",
    "fit_laplace",
    "fit_rpwithprior",
    "fit_rr_on_bins",
    "fit_staircase",
    "fit_unbiased",
    "histogram_prior",
    "label_mse_grid",
    "load_params",
    "mechanism_names",
    "posterior_mean",
    "private_histogram",
    "privatize_file",
    "release",
    "release_grid",
    "sample_batches",
    "sample_grid",
]
