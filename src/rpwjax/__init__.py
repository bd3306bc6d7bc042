"""rpwjax: ε-label differential privacy for regression, in JAX.

The public namespace is flat: mechanisms' fit functions and parameter
classes, priors, the one-call :func:`fit`, and the sampling helpers.
"""

__version__ = "0.1.0"

from .api import FitResult, fit, load_params, mechanism_names
from .base import Mechanism, label_mse_grid, sample_batches, sample_grid
from .errors import InputError
from .priors import Prior, empirical_prior, histogram_prior, private_histogram
from .privatize import privatize_array, privatize_file
from .rpwithprior import RPWithPrior, choose_zeta, fit_rpwithprior

__all__ = [
    "FitResult",
    "InputError",
    "Mechanism",
    "Prior",
    "RPWithPrior",
    "choose_zeta",
    "empirical_prior",
    "fit",
    "fit_rpwithprior",
    "histogram_prior",
    "label_mse_grid",
    "load_params",
    "mechanism_names",
    "private_histogram",
    "privatize_array",
    "privatize_file",
    "sample_batches",
    "sample_grid",
]
