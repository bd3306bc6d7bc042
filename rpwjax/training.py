r"""Many small regression MLPs trained at once: one compiled, vmapped program.

The paper's model and schedule: an MLP ``d → 128 → 64 → 1``
with ELU, mean squared error, Adam with learning rate 1e-3 and weight decay
1e-4, the learning rate halved every 10 epochs, 50 epochs, batch size 256.

Weight decay is PyTorch's ``Adam(weight_decay=...)``: an L2 term added to the
gradient *before* the Adam moments (not AdamW's decoupled decay),

.. math::
   g \leftarrow \nabla L + \lambda\,\theta, \qquad
   \theta \leftarrow \theta - \eta_t\,\mathrm{Adam}(g), \qquad
   \eta_t = 10^{-3} \cdot 0.5^{\lfloor t / (10\,S) \rfloor},

with ``S`` optimizer steps per epoch. Initialization is PyTorch's default for
``nn.Linear``: weights and biases uniform on ±1/√fan_in.

Batching over models: :func:`train_many` trains ``M`` models (one row of noisy
labels and one seed each) as ``jax.vmap`` of a single model's epoch, and the
epoch itself is a ``lax.scan`` over mini-batches; a Python loop runs the
epochs, calling one jit-compiled function (compiled once per shape). Each
model has its own initialization and its own shuffle in every epoch, both
derived from its seed only, so model ``i`` trained in a batch equals model
``i`` trained alone (up to float32 rounding of batched matrix products).

The last partial batch is kept, as PyTorch's ``DataLoader`` does by default:
every epoch has ``ceil(n / batch_size)`` steps, and the last batch is padded
with a mask so that its loss is the mean over its real rows only.

Training runs in float32, also under ``jax.enable_x64``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rpwjax.errors import InputError, check_integer

__all__ = [
    "TrainConfig",
    "adam_l2",
    "init_mlp",
    "mlp_apply",
    "predict_many",
    "target_scale",
    "test_mse_many",
    "train_many",
]

_DTYPE = jnp.float32


class TrainConfig(NamedTuple):
    """Static training settings (hashable: a compile-time key)."""

    hidden: tuple[int, ...] = (128, 64)
    learning_rate: float = 1e-3
    weight_decay: float = 1e-4
    halve_every: int = 10  # epochs
    batch_size: int = 256


def adam_l2(steps_per_epoch: int, learning_rate=1e-3, weight_decay=1e-4, halve_every=10) -> optax.GradientTransformation:
    """Adam with L2 weight decay in the gradient and a staircase halving schedule (PyTorch ``Adam`` + ``StepLR``)."""
    schedule = optax.exponential_decay(
        init_value=learning_rate, transition_steps=steps_per_epoch * halve_every, decay_rate=0.5, staircase=True
    )
    return optax.chain(
        optax.add_decayed_weights(weight_decay),
        optax.scale_by_adam(),
        optax.scale_by_learning_rate(schedule),
    )


def init_mlp(key, in_dim: int, hidden=(128, 64)):
    """Parameters of one MLP ``in_dim → hidden… → 1``: a list of ``{"w": (fan_in, fan_out), "b": (fan_out,)}``."""
    sizes = (int(in_dim), *map(int, hidden), 1)
    layers = []
    for fan_in, fan_out, k in zip(sizes[:-1], sizes[1:], jax.random.split(key, len(sizes) - 1)):
        bound = 1.0 / math.sqrt(fan_in)
        kw, kb = jax.random.split(k)
        layers.append(
            {
                "w": jax.random.uniform(kw, (fan_in, fan_out), _DTYPE, -bound, bound),
                "b": jax.random.uniform(kb, (fan_out,), _DTYPE, -bound, bound),
            }
        )
    return layers


def mlp_apply(params, x):
    """Predictions of one MLP for rows ``x`` of shape ``(n, d)``: shape ``(n,)``."""
    h = x
    for layer in params[:-1]:
        h = jax.nn.elu(h @ layer["w"] + layer["b"])
    out = h @ params[-1]["w"] + params[-1]["b"]
    return out[..., 0]


def _masked_mse(params, x, y, mask):
    err = mlp_apply(params, x) - y
    return jnp.sum(mask * err**2) / jnp.maximum(jnp.sum(mask), 1.0)


def _steps_per_epoch(n: int, batch_size: int) -> int:
    return -(-n // batch_size)


def _model_keys(seeds):
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds))
    init_keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys)
    shuffle_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)
    return init_keys, shuffle_keys


@partial(jax.jit, static_argnames=("config",))
def _init_many(init_keys, x, *, config: TrainConfig):
    optimizer = adam_l2(_steps_per_epoch(x.shape[0], config.batch_size), *config[1:4])
    params = jax.vmap(lambda k: init_mlp(k, x.shape[1], config.hidden))(init_keys)
    return params, jax.vmap(optimizer.init)(params)


@partial(jax.jit, static_argnames=("config",))
def _epoch_many(params, opt_state, shuffle_keys, epoch, x, y, *, config: TrainConfig):
    """One epoch for every model: vmap over models of a scan over mini-batches."""
    n = x.shape[0]
    batch = config.batch_size
    steps = _steps_per_epoch(n, batch)
    optimizer = adam_l2(steps, *config[1:4])
    mask = (jnp.arange(steps * batch) < n).astype(_DTYPE).reshape(steps, batch)

    def one_model(params, opt_state, key, y_model):
        order = jax.random.permutation(jax.random.fold_in(key, epoch), n)
        order = jnp.pad(order, (0, steps * batch - n)).reshape(steps, batch)  # padded rows are masked out

        def step(carry, batch_rows):
            params, opt_state = carry
            rows, row_mask = batch_rows
            loss, grads = jax.value_and_grad(_masked_mse)(params, x[rows], y_model[rows], row_mask)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), (order, mask))
        return params, opt_state, losses.mean()

    return jax.vmap(one_model)(params, opt_state, shuffle_keys, y)


def _check_features(x, name):
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise InputError(f"{name} must be a non-empty 2-d array (n, d), got shape {x.shape}")
    if not np.isfinite(x).all():
        row = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise InputError(f"{name} must be finite, got a non-finite value in row {row}")
    return x


def train_many(
    x_train,
    y_train,
    seeds,
    *,
    epochs: int = 50,
    batch_size: int = 256,
    learning_rate: float = 1e-3,
    weight_decay: float = 1e-4,
    halve_every: int = 10,
    hidden=(128, 64),
    return_losses: bool = False,
    on_epoch=None,
    validation=None,
):
    """Train ``M = len(seeds)`` MLPs at once; returns their parameters, batched over ``M``.

    ``x_train``: ``(n, d)`` public features, shared by all models.
    ``y_train``: ``(M, n)`` training targets, one row per model (e.g. one noisy
    label draw per model), or ``(n,)`` shared by all models.
    ``seeds``: ``(M,)`` integers; model ``i``'s initialization and shuffles
    depend on ``seeds[i]`` alone.

    With ``return_losses=True`` also returns the mean training loss of every
    epoch, shape ``(epochs, M)``. ``on_epoch()`` is called after each epoch
    (progress bars).

    ``validation=(x_val, y_val)`` (``y_val`` shaped like ``y_train``): early
    stopping. Each model's validation MSE is measured after every epoch and
    the parameters of its best epoch are returned (per model).
    """
    x = _check_features(x_train, "x_train")
    n = x.shape[0]
    seeds = np.asarray(seeds)
    if seeds.ndim != 1 or seeds.size == 0 or not np.issubdtype(seeds.dtype, np.integer):
        raise InputError(f"seeds must be a non-empty 1-d array of integers, got {seeds!r}")
    m = seeds.shape[0]
    y = np.asarray(y_train, dtype=np.float32)
    if y.ndim == 1:
        y = np.broadcast_to(y, (m, y.shape[0]))
    if y.shape != (m, n):
        raise InputError(f"y_train must have shape ({n},) or ({m}, {n}) for {m} seeds and {n} rows, got {y.shape}")
    if not np.isfinite(y).all():
        raise InputError("y_train must be finite, got a non-finite target")
    epochs = check_integer(epochs, "epochs")
    config = TrainConfig(
        hidden=tuple(check_integer(h, "hidden size") for h in hidden),
        learning_rate=float(learning_rate),
        weight_decay=float(weight_decay),
        halve_every=check_integer(halve_every, "halve_every"),
        batch_size=check_integer(batch_size, "batch_size"),
    )
    x_dev, y_dev = jnp.asarray(x, _DTYPE), jnp.asarray(y, _DTYPE)
    init_keys, shuffle_keys = _model_keys(seeds)
    params, opt_state = _init_many(init_keys, x_dev, config=config)
    if validation is not None:
        x_val = jnp.asarray(_check_features(validation[0], "x_val"), _DTYPE)
        y_val = np.asarray(validation[1], np.float32)
        y_val = jnp.asarray(np.broadcast_to(y_val, (m, y_val.shape[-1])), _DTYPE)
        if x_val.shape[1] != x.shape[1] or y_val.shape[1] != x_val.shape[0]:
            raise InputError(f"validation rows and targets disagree: x_val {x_val.shape}, y_val {y_val.shape}")
        best_params, best_loss = params, jnp.full((m,), jnp.inf, _DTYPE)
    losses = []
    for epoch in range(epochs):
        params, opt_state, loss = _epoch_many(params, opt_state, shuffle_keys, epoch, x_dev, y_dev, config=config)
        if validation is not None:
            best_params, best_loss = _keep_best(params, best_params, best_loss, x_val, y_val)
        losses.append(loss)
        if on_epoch is not None:
            loss.block_until_ready()  # so a progress bar shows work done, not work queued
            on_epoch()
    if validation is not None:
        params = best_params
    if return_losses:
        return params, np.asarray(jnp.stack(losses))
    return params


@jax.jit
def _keep_best(params, best_params, best_loss, x_val, y_val):
    val = jnp.mean((jax.vmap(mlp_apply, in_axes=(0, None))(params, x_val) - y_val) ** 2, axis=1)
    better = val < best_loss

    def pick(new, old):
        return jnp.where(better.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)

    return jax.tree_util.tree_map(pick, params, best_params), jnp.where(better, val, best_loss)


@jax.jit
def _predict_many(params, x):
    return jax.vmap(mlp_apply, in_axes=(0, None))(params, x)


_PREDICT_FLOATS = 1 << 24  # activations per chunk (64 MiB of float32): bounds memory for large M x n


def predict_many(params, x) -> np.ndarray:
    """Predictions of every model in ``params`` (batched over ``M``) for rows ``x``: shape ``(M, n)``, float32.

    Rows go through in equal-size chunks (the last one padded), so a large
    test set needs neither ``M * n * 128`` floats of memory nor a second compile.
    """
    x = _check_features(x, "x")
    leaves = jax.tree_util.tree_leaves(params)
    models = int(leaves[0].shape[0])
    widest = max(int(leaf.shape[-1]) for leaf in leaves)
    n = x.shape[0]
    chunk = min(n, max(256, _PREDICT_FLOATS // (models * widest)))
    padded = np.zeros((-(-n // chunk) * chunk, x.shape[1]), np.float32)
    padded[:n] = x
    parts = [np.asarray(_predict_many(params, jnp.asarray(padded[i : i + chunk]))) for i in range(0, n, chunk)]
    return np.concatenate(parts, axis=1)[:, :n]


def target_scale(target_range=None) -> tuple[float, float]:
    """``(lo, width)`` of the affine map t -> (t - lo)/width that puts a public label range ``(lo, hi)`` onto
    [0, 1], so that networks learn labels in any units alike (predictions map back as lo + width·p); (0, 1),
    the identity, for None."""
    if target_range is None:
        return 0.0, 1.0
    lo, hi = float(target_range[0]), float(target_range[1])
    return lo, hi - lo


def test_mse_many(params, x_test, y_test) -> np.ndarray:
    """Test MSE of every model against the TRUE test labels ``y_test`` ``(n,)``: shape ``(M,)``, float64."""
    y = np.asarray(y_test, dtype=np.float64)
    predictions = predict_many(params, x_test)
    if y.shape != predictions.shape[1:]:
        raise InputError(f"y_test must have shape ({predictions.shape[1]},), got {y.shape}")
    return np.mean((predictions.astype(np.float64) - y) ** 2, axis=1)


test_mse_many.__test__ = False  # not a pytest test, despite the name
