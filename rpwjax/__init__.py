"""rpwjax: ε-label differential privacy for regression, in JAX.

The public namespace is flat: mechanisms' fit functions and parameter
classes, priors, the one-call :func:`fit`, and the sampling helpers.
"""

__version__ = "0.1.0"

from rpwjax.api import FitResult, fit, load_params, mechanism_names
from rpwjax.mechanisms.base import Mechanism, label_mse_grid, sample_batches, sample_grid
from rpwjax.errors import InputError
from rpwjax.priors import Prior, empirical_prior, histogram_prior, private_histogram
from rpwjax.keys import Secret
from rpwjax.privatize import privatize_file
from rpwjax.release_path import release, release_grid
from rpwjax.mechanisms.additive import Gaussian, Laplace, Staircase, fit_gaussian, fit_laplace, fit_staircase
from rpwjax.mechanisms.rpwithprior import RPWithPrior, choose_zeta, fit_rpwithprior
from rpwjax.mechanisms.rr_on_bins import RROnBins, fit_rr_on_bins
from rpwjax.mechanisms.unbiased import Unbiased, fit_unbiased

__all__ = [
    "FitResult",
    "Gaussian",
    "Laplace",
    "RROnBins",
    "Staircase",
    "Unbiased",
    "fit_gaussian",
    "fit_laplace",
    "fit_rr_on_bins",
    "fit_staircase",
    "fit_unbiased",
    "InputError",
    "Mechanism",
    "Prior",
    "RPWithPrior",
    "Secret",
    "choose_zeta",
    "empirical_prior",
    "fit",
    "fit_rpwithprior",
    "histogram_prior",
    "label_mse_grid",
    "load_params",
    "mechanism_names",
    "private_histogram",
    "release",
    "release_grid",
    "privatize_file",
    "sample_batches",
    "sample_grid",
]
