"""Pytree structures name their class, so JAX's compile caches never run one class's code for another."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpwjax.api import mechanism_names
from rpwjax.audit.checks import fit_example
from rpwjax.mechanisms.additive import Laplace
from rpwjax.priors import Prior
from rpwjax.release_path import release
from rpwjax.keys import Secret


def test_structures_of_different_classes_differ():
    fitted = [fit_example(name, 1.0) for name in mechanism_names()]
    prior = Prior(np.zeros(4), np.ones(4), np.full(4, 0.25), 0.0, 1.0, False, "histogram")
    structures = [jax.tree_util.tree_structure(p) for p in [*fitted, prior]]
    for i, a in enumerate(structures):
        for j, b in enumerate(structures):
            assert (a == b) == (i == j), (a, b)
    # a subclass that only overrides the sampler is its own structure, and still round-trips
    laplace = fitted[mechanism_names().index("laplace")]
    shifted = type("Shifted", (Laplace,), {"sample_from_uniform": lambda self, u, y: y})
    other = shifted(laplace.epsilon, laplace.scale, laplace.lo, laplace.hi)
    assert jax.tree_util.tree_structure(other) != jax.tree_util.tree_structure(laplace)
    leaves, tree = jax.tree_util.tree_flatten(other)
    back = jax.tree_util.tree_unflatten(tree, leaves)
    assert type(back) is shifted and back.lo == laplace.lo and back.hi == laplace.hi


@pytest.mark.slow  # the fast subset keeps the cause: structures of different classes differ
def test_a_jitted_function_runs_each_subclass_own_code():
    # Many method-only subclasses through one jitted function: with structures that compare equal across
    # classes (the plain dataclass registration), about one in ten of these calls ran another class's
    # compiled code. Each call must return its own class's shift.
    base = fit_example("laplace", 1.0)
    run = jax.jit(lambda params, u, y: params.sample_from_uniform(u, y))
    u, y = jnp.full(3, 0.5), jnp.full(3, 0.25)
    wrong = []
    for i in range(200):
        cls = type(f"Shift{i}", (Laplace,), {"sample_from_uniform": (lambda k: lambda self, u, y: y + k)(i)})
        got = np.asarray(run(cls(base.epsilon, base.scale, base.lo, base.hi), u, y))
        if not np.all(got == 0.25 + i):
            wrong.append(i)
    assert not wrong, f"ran another class's compiled code for subclasses {wrong}"


def test_release_after_the_parent_uses_the_subclass_sampler():
    base = fit_example("laplace", 1.0)
    secret = Secret.from_seed(5)
    honest = release(base, secret, np.full(8, 0.5))
    pinned = type("Pinned", (Laplace,), {"sample_from_uniform": lambda self, u, y: jnp.zeros_like(u + y) + self.lo})
    out = release(pinned(base.epsilon, base.scale, base.lo, base.hi), secret, np.full(8, 0.5))
    assert np.all(out == base.lo) and not np.all(honest == base.lo)
