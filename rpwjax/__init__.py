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

# The names are imported on first use (PEP 562), so that ``import rpwjax.cli`` costs no JAX import: the command
# line installs its signal handlers before anything heavy loads. ``from rpwjax import fit`` works as before.
_SOURCES = {
    "rpwjax.api": ("FitResult", "fit", "load_params"),
    "rpwjax.errors": ("InputError",),
    "rpwjax.keys": ("Secret",),
    "rpwjax.mechanisms": ("MECHANISMS", "mechanism_names"),
    "rpwjax.mechanisms.additive": ("Gaussian", "Laplace", "Staircase", "fit_gaussian", "fit_laplace",
                                   "fit_staircase"),
    "rpwjax.mechanisms.base": ("Mechanism", "label_mse_grid", "sample_batches", "sample_grid"),
    "rpwjax.mechanisms.rpwithprior": ("RPWithPrior", "choose_zeta", "fit_rpwithprior"),
    "rpwjax.mechanisms.rr_on_bins": ("RROnBins", "fit_rr_on_bins"),
    "rpwjax.mechanisms.unbiased": ("Unbiased", "fit_unbiased"),
    "rpwjax.posterior": ("posterior_mean",),
    "rpwjax.priors": ("Prior", "empirical_prior", "histogram_prior", "private_histogram"),
    "rpwjax.privatize": ("privatize_file",),
    "rpwjax.release_path": ("release", "release_grid"),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}


def __getattr__(name):
    import importlib

    module = _MODULE_OF.get(name)
    if module is None:  # a submodule (rpwjax.io, ...) that nothing has imported yet
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups find it directly
    return value


def __dir__():
    return sorted(set(globals()) | set(_MODULE_OF))


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
