import os
from pathlib import Path

import jax
import numpy as np
import pytest

# JAX's persistent compilation cache, for the tests only (git-ignored, under .pytest_cache): most of a test
# run is XLA compiling the same programs again, so a rerun of the fast subset takes about 1½-2 minutes instead
# of about 2½. A clean clone starts empty (CI compiles each program once per run). Set JAX_COMPILATION_CACHE_DIR
# to use another directory.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    jax.config.update("jax_compilation_cache_dir",
                      str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "jax-compilation-cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.05)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(autouse=True)
def _own_ledger(tmp_path_factory, monkeypatch):
    """Each test's releases without a key file go to a ledger of its own (never the user's per-user ledger)."""
    monkeypatch.setenv("RPWJAX_LEDGER", str(tmp_path_factory.mktemp("ledger") / "ledger.jsonl"))


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


@pytest.fixture(autouse=True, scope="module")
def _fresh_jax_caches():
    """Each test module starts with empty JAX compilation caches: a full run compiles thousands of shapes, and
    holding every executable of every module at once once made XLA's compiler crash late in the run."""
    yield
    jax.clear_caches()


@pytest.fixture
def histogram_epsilons(monkeypatch):
    """The ε of every integer-noise histogram release, in order, as the noise sampler receives it
    (:func:`rpwjax.noise.noisy_counts`, which every histogram release calls)."""
    import rpwjax.noise

    seen, real = [], rpwjax.noise.noisy_counts

    def spy(counts, epsilon, secret, purpose, *index):
        seen.append(float(epsilon))
        return real(counts, epsilon, secret, purpose, *index)

    monkeypatch.setattr(rpwjax.noise, "noisy_counts", spy)
    return seen
