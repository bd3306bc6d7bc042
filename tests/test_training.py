"""Batched MLP training: it learns, vmap equals loop, determinism, the optimizer's schedule and decay."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpwjax import training
from rpwjax.errors import InputError
from rpwjax.training import _epoch_many, adam_l2, init_mlp, mlp_apply, predict_many, test_mse_many, train_many

FAST = dict(epochs=3, hidden=(16, 8))  # small and quick: the properties do not depend on size


@pytest.fixture(scope="module")
def small_problem():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.3).astype(np.float32)
    return x, y, np.stack([y, y + 0.1 * rng.standard_normal(300), -y])


def _leaves(params):
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(params)]


@pytest.mark.slow
def test_learns_a_linear_function():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2500, 5)).astype(np.float32)
    y = x @ np.array([1.0, -1.0, 0.5, 2.0, 0.0]) + 0.5
    x_train, y_train, x_test, y_test = x[:2000], y[:2000], x[2000:], y[2000:]
    params = train_many(x_train, y_train, np.array([0, 1]), epochs=15, batch_size=64)
    mse = test_mse_many(params, x_test, y_test)
    assert mse.shape == (2,)
    assert np.all(mse < 0.02 * y_test.var()), mse  # an untrained model is at ~1x the variance


@pytest.mark.slow
def test_vmap_over_models_equals_training_each_alone(small_problem):
    x, _, targets = small_problem
    seeds = np.array([3, 7])
    together = train_many(x, targets[:2], seeds, batch_size=64, **FAST)
    for i, seed in enumerate(seeds):
        alone = train_many(x, targets[i : i + 1], seeds[i : i + 1], batch_size=64, **FAST)
        for a, b in zip(_leaves(together), _leaves(alone)):
            # Batched and unbatched float32 matrix products may round differently.
            np.testing.assert_allclose(a[i], b[0], rtol=1e-4, atol=1e-5)


def test_deterministic_for_fixed_seeds_and_distinct_across_seeds(small_problem):
    x, y, _ = small_problem
    first = train_many(x, y, np.array([5, 6]), batch_size=64, **FAST)
    second = train_many(x, y, np.array([5, 6]), batch_size=64, **FAST)
    for a, b in zip(_leaves(first), _leaves(second)):
        np.testing.assert_array_equal(a, b)
    w = _leaves(first)[1]  # first layer weights, shape (2, 4, 16)
    assert not np.allclose(w[0], w[1])


def test_shared_targets_broadcast(small_problem):
    x, y, _ = small_problem
    seeds = np.array([1, 2])
    shared = train_many(x, y, seeds, batch_size=64, **FAST)
    explicit = train_many(x, np.stack([y, y]), seeds, batch_size=64, **FAST)
    for a, b in zip(_leaves(shared), _leaves(explicit)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_partial_batch_is_masked(small_problem):
    # One padded batch of 512 slots with 300 real rows must equal one exact batch of 300.
    x, y, _ = small_problem
    padded = train_many(x, y, np.array([4]), batch_size=512, **FAST)
    exact = train_many(x, y, np.array([4]), batch_size=300, **FAST)
    for a, b in zip(_leaves(padded), _leaves(exact)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_second_call_does_not_recompile(small_problem):
    x, y, _ = small_problem
    train_many(x, y, np.array([0, 1]), batch_size=64, **FAST)
    size = _epoch_many._cache_size()
    train_many(x, y + 1, np.array([8, 9]), batch_size=64, **FAST)
    assert _epoch_many._cache_size() == size


@pytest.mark.slow
def test_predictions_and_mse(small_problem, monkeypatch):
    x, y, targets = small_problem
    params = train_many(x, targets[:2], np.arange(2), batch_size=64, **FAST)
    predictions = predict_many(params, x[:10])
    assert predictions.shape == (2, 10) and predictions.dtype == np.float32
    one = jax.tree_util.tree_map(lambda leaf: leaf[1], params)
    np.testing.assert_allclose(predictions[1], mlp_apply(one, jnp.asarray(x[:10])), rtol=1e-5, atol=1e-6)
    mse = test_mse_many(params, x[:10], y[:10])
    np.testing.assert_allclose(mse, ((predictions - y[:10]) ** 2).mean(axis=1), rtol=1e-5)
    # Rows in chunks (the last one padded) give the same predictions as all at once.
    whole = predict_many(params, x)
    monkeypatch.setattr(training, "_PREDICT_FLOATS", 1)  # 256-row chunks: 300 rows -> 2 chunks
    np.testing.assert_allclose(predict_many(params, x), whole, rtol=1e-6, atol=1e-7)  # matmul shape may round


@pytest.mark.slow
def test_float32_under_x64(small_problem):
    x, y, _ = small_problem
    with jax.enable_x64(True):
        params = train_many(x, y, np.array([0]), epochs=1, batch_size=128, hidden=(8,))
    assert all(leaf.dtype == np.float32 for leaf in _leaves(params))


def test_learning_rate_halves_every_period():
    # Constant gradient 1, no decay: Adam's normalized step is ~1, so the update is -lr(t).
    optimizer = adam_l2(steps_per_epoch=2, learning_rate=1e-3, weight_decay=0.0, halve_every=1)
    params = jnp.zeros(1)
    state = optimizer.init(params)
    steps = []
    for _ in range(5):
        updates, state = optimizer.update(jnp.ones(1), state, params)
        steps.append(float(updates[0]))
    np.testing.assert_allclose(steps, [-1e-3, -1e-3, -5e-4, -5e-4, -2.5e-4], rtol=1e-4)


def test_weight_decay_is_l2_in_the_gradient_not_decoupled():
    # Zero loss gradient: the decay term 1e-4 * θ goes through Adam and is normalized
    # to a full step of size lr (AdamW would move θ by lr * 1e-4 * θ only).
    optimizer = adam_l2(steps_per_epoch=10, learning_rate=1e-3, weight_decay=1e-4)
    params = jnp.array([2.0, -3.0])
    updates, _ = optimizer.update(jnp.zeros(2), optimizer.init(params), params)
    np.testing.assert_allclose(updates, [-1e-3, 1e-3], rtol=1e-3)


@pytest.mark.slow
def test_init_matches_pytorch_linear_bounds():
    params = init_mlp(jax.random.PRNGKey(0), 8)
    assert [layer["w"].shape for layer in params] == [(8, 128), (128, 64), (64, 1)]
    for layer, fan_in in zip(params, (8, 128, 64)):
        bound = 1 / np.sqrt(fan_in)
        assert float(jnp.abs(layer["w"]).max()) <= bound and float(jnp.abs(layer["b"]).max()) <= bound
        assert float(jnp.abs(layer["w"]).max()) > 0.9 * bound


def test_bad_inputs_name_the_problem(small_problem):
    x, y, _ = small_problem
    with pytest.raises(InputError, match=r"\(3, 300\)"):
        train_many(x, np.zeros((2, 300)), np.arange(3))
    with pytest.raises(InputError, match="seeds"):
        train_many(x, y, np.array([0.5]))
    with pytest.raises(InputError, match="epochs=0"):
        train_many(x, y, np.arange(1), epochs=0)
    with pytest.raises(InputError, match="row 2"):
        bad = x.copy()
        bad[2, 1] = np.nan
        train_many(bad, y, np.arange(1))
    with pytest.raises(InputError, match="finite"):
        train_many(x, np.full(300, np.inf), np.arange(1))


@pytest.mark.slow
def test_early_stopping_returns_each_models_best_validation_epoch():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3)).astype(np.float32)
    y = (x[:, 0] + 0.1 * rng.normal(size=200)).astype(np.float32)
    noisy = np.stack([y + 3.0 * rng.normal(size=200).astype(np.float32) for _ in range(2)])
    x_val = rng.normal(size=(100, 3)).astype(np.float32)
    y_val = np.stack([x_val[:, 0]] * 2)
    seeds = np.array([1, 2])
    last = train_many(x, noisy, seeds, epochs=12)
    best = train_many(x, noisy, seeds, epochs=12, validation=(x_val, y_val))
    # the best epoch is at least as good on the validation rows as the last one, for every model
    assert np.all(test_mse_many(best, x_val, x_val[:, 0]) <= test_mse_many(last, x_val, x_val[:, 0]) + 1e-7)
    with pytest.raises(InputError, match="validation"):
        train_many(x, noisy, seeds, epochs=1, validation=(x_val, y_val[:, :10]))
