import jax
import numpy as np
import pytest


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
