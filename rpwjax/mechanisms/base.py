"""What every mechanism shares: the fitted-parameter contract and batched helpers.

A fitted mechanism is a frozen dataclass registered as a pytree: ε and the
fitted values are array leaves (with a leading ε axis after a vmapped fit),
settings that fix shapes or branches are static metadata. Methods are pure
functions of those leaves, so ``jax.vmap`` maps them over an ε grid.

Contract of a params class (one per mechanism, ``name`` = the CLI name):

* ``sample_from_uniform(u, y)`` the inverse-CDF sampler: noisy labels from ONE
                               uniform per label, non-decreasing in ``u`` (what the
                               release path and the as-implemented audit rely on)
* ``sample(key, y)``           noisy labels, same shape and float dtype as ``y`` (a
                               sampling kernel for tests and benchmarks, NOT a release:
                               releases go through :func:`rpwjax.release_path.release`)
* ``release_spec()``           the public output grid and clamp range of a release
* ``log_density(y_tilde, y)``  exact log density (log pmf for discrete outputs),
                               ``-inf`` off the support
* ``bias(y)``, ``variance(y)``, ``mse(y)``  analytic, per true label ``y``
* ``breakpoints()``            points where ``mse`` is not smooth (exact expectations)
* ``label_mse(prior)``         E[(Ỹ - Y)²] under a prior

``pure`` is False for mechanisms that are only (ε, δ)-DP (Gaussian).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from rpwjax import pytree


def midpoint_uniform(key, shape, dtype):
    """Uniforms ``(k + 1/2)·2^-p`` on (0, 1), p = 52 (float64) or 23 (float32): never 0 or 1, symmetric."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float64:
        bits, p = jax.random.bits(key, shape, jnp.uint64), 52
        k = bits >> jnp.uint64(64 - p)
    else:
        bits, p = jax.random.bits(key, shape, jnp.uint32), min(jnp.finfo(dtype).nmant, 23)
        k = bits >> jnp.uint32(32 - p)
    return ((k.astype(dtype) + dtype.type(0.5)) * dtype.type(2.0**-p)).astype(dtype)


class Mechanism:
    """Base class for fitted mechanism parameters (subclasses are pytree dataclasses)."""

    name: ClassVar[str]
    pure: ClassVar[bool] = True
    # a fit above this ε builds its probability ratios for this ε (still ε-DP): min(ε, cap) decides whether a
    # float64 release can certify them (rpwjax.sampling.check_release_epsilon)
    ratio_epsilon_cap: ClassVar[float] = float("inf")
    discrete: ClassVar[bool] = False
    # fields that are positions on the label axis (they move with a translation of it; the rest are scales)
    position_fields: ClassVar[tuple] = ("lo", "hi")
    # fields computed from the others when the parameters are built (lookup tables of a fast sampler): never
    # saved or read, and not candidate outputs
    derived_fields: ClassVar[tuple] = ()
    # the fields :meth:`_derive` reads: the derived fields are built only when these are concrete values, not
    # tracers (parameters rebuilt inside a traced function keep the derived fields they were given)
    derived_from: ClassVar[tuple] = ()
    # static fields coerced to Python floats when the parameters are built: static metadata must stay hashable,
    # and a JSON round trip or a caller may hand back arrays
    float_fields: ClassVar[tuple] = ()
    # whether a release on a single CPU device runs this mechanism one release block at a time: an inverse CDF
    # that gathers from per-row tables keeps its intermediates in cache that way; elementwise inverse CDFs run
    # faster over all blocks at once (one loop, both cores)
    release_by_block: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        # A subclass that only overrides methods (a variant sampler, a deliberately
        # broken mechanism in a test) stays a pytree with its parent's fields, so
        # every jitted entry point accepts it. Subclasses declaring new fields are
        # registered by @params_dataclass instead.
        super().__init_subclass__(**kwargs)
        parent_static = getattr(cls, "_static_fields", None)
        if parent_static is not None and dataclasses.is_dataclass(cls) and not cls.__dict__.get("__annotations__"):
            names = [f.name for f in dataclasses.fields(cls)]
            pytree.register(
                cls, data_fields=[n for n in names if n not in parent_static],
                meta_fields=[n for n in names if n in parent_static],
            )

    def __post_init__(self):
        """Coerce :attr:`float_fields`; build the derived fields when one is missing and their inputs are concrete.

        Pytree unflattening sets the fields directly and never gets here, so traced or vmapped parameters keep
        the derived fields they were flattened with."""
        for name in self.float_fields:
            object.__setattr__(self, name, float(getattr(self, name)))
        if any(getattr(self, n) is None for n in self.derived_fields) and not any(
                isinstance(getattr(self, n), jax.core.Tracer) for n in self.derived_from):
            for name, value in self._derive().items():
                object.__setattr__(self, name, value)

    def _derive(self) -> dict:
        """Values of the derived fields, by name, computed from the fields in :attr:`derived_from` (concrete);
        empty when they cannot be built (the sampler then runs without them)."""
        return {}

    def _derived_static(self) -> dict:
        """Values of the static derived fields, by name, recomputed from the derived arrays (concrete) of a
        selection made by :meth:`__getitem__`: a table's step count is that of the ε it now holds."""
        return {}

    # -- to be provided by subclasses -------------------------------------------
    def sample_from_uniform(self, u, y):  # pragma: no cover - interface
        raise NotImplementedError

    def sample(self, key, y):
        """Noisy labels for ``y`` (one midpoint uniform per label). A kernel, not a release: it neither
        snaps nor clamps and takes any key; released labels come from :func:`rpwjax.release_path.release`."""
        y = jnp.asarray(y)
        if not jnp.issubdtype(y.dtype, jnp.floating):
            y = y.astype(jnp.float32)
        return self.sample_from_uniform(midpoint_uniform(key, y.shape, y.dtype), y)

    def release_spec(self) -> dict:
        """Public grid (None for discrete outputs) and clamp range ``low``/``high`` of a release.

        Discrete mechanisms release their own output values: no grid, and the
        range of those values. Continuous mechanisms override this."""
        if not self.discrete:  # pragma: no cover - interface
            raise NotImplementedError
        outputs = np.asarray(self.outputs, np.float64)
        return {"grid": None, "low": outputs.min(axis=-1), "high": outputs.max(axis=-1)}

    def translated(self, shift: float):
        """The same mechanism on the label axis moved by ``shift`` (a Python float): every field in
        :attr:`position_fields` plus ``shift``. The release samples a continuous mechanism this way, relative to
        a public origin near the range (:func:`rpwjax.sampling.released_values`), so that float64 rounding
        scales with the distance from the range, not with its magnitude."""
        shift = float(shift)
        return dataclasses.replace(self, **{f: getattr(self, f) + shift for f in self.position_fields})

    def log_density(self, y_tilde, y):  # pragma: no cover - interface
        raise NotImplementedError

    def bias(self, y):  # pragma: no cover - interface
        raise NotImplementedError

    def variance(self, y):
        return self.mse(y) - self.bias(y) ** 2

    def mse(self, y):  # pragma: no cover - interface
        raise NotImplementedError

    def breakpoints(self):
        return ()

    # -- shared -----------------------------------------------------------------
    def label_mse(self, prior):
        """E[(Ỹ - Y)²] with Y drawn from ``prior`` (unbatched parameters)."""
        return prior.expect(self.mse, self.breakpoints())

    @property
    def batch_shape(self) -> tuple:
        return tuple(np.shape(self.epsilon))

    def __getitem__(self, index):
        """Select one ε (or a sub-grid) of a batched fit; static derived fields are those of the selection."""
        out = jax.tree_util.tree_map(lambda leaf: leaf[index], self)
        static = getattr(self, "_static_fields", ())
        tables = [getattr(out, n) for n in self.derived_fields if n not in static]
        if tables and not any(t is None or isinstance(t, jax.core.Tracer) for t in tables):
            for name, value in out._derived_static().items():
                object.__setattr__(out, name, value)
        return out

    def to_json(self) -> dict:
        """Fields as plain JSON values (lists for batched leaves)."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name in self.derived_fields:
                continue
            v = getattr(self, f.name)
            if isinstance(v, (str, bool)) or v is None:
                out[f.name] = v
            else:
                arr = np.asarray(v)
                out[f.name] = arr.item() if arr.ndim == 0 else arr.tolist()
        return out

    @classmethod
    def from_json(cls, fields: dict):
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name in cls.derived_fields:
                continue
            if f.name not in fields:
                raise KeyError(f.name)
            v = fields[f.name]
            if f.name in ("lo", "hi"):
                v = float(v)
            elif not isinstance(v, (str, bool)):
                v = np.asarray(v, dtype=np.float64)
            kwargs[f.name] = v
        return cls(**kwargs)


def params_dataclass(cls=None, *, static=()):
    """Decorator: frozen dataclass + pytree with the named fields static."""

    def wrap(c):
        c = dataclasses.dataclass(frozen=True)(c)
        c._static_fields = tuple(static)
        names = [f.name for f in dataclasses.fields(c)]
        return pytree.register(
            c, data_fields=[n for n in names if n not in static], meta_fields=[n for n in names if n in static]
        )

    return wrap if cls is None else wrap(cls)


@jax.jit
def _sample_grid(params, key, y):
    keys = jax.random.split(key, params.batch_shape[0])
    return jax.vmap(lambda p, k: p.sample(k, y))(params, keys)


def sample_grid(params: Mechanism, key, y):
    """Sampling kernel over a whole ε grid: batched params (E,) x labels (...) -> (E, ...).

    NOT a release (no grid, no clamp, any key): for tests and benchmarks.
    Released labels come from :func:`rpwjax.release_path.release_grid`."""
    y = jnp.asarray(y)
    if not jnp.issubdtype(y.dtype, jnp.floating):
        y = y.astype(jnp.float32)
    if params.batch_shape == ():
        return params.sample(key, y)
    return _sample_grid(params, key, y)


def sample_batches(params: Mechanism, key, ys):
    """Sampling kernel for a batch of label arrays (B, n) with one (unbatched) mechanism, one key per array.

    NOT a release (for tests and benchmarks): see :func:`rpwjax.release_path.release`."""
    ys = jnp.asarray(ys)
    keys = jax.random.split(key, ys.shape[0])
    return jax.jit(jax.vmap(lambda k, y: params.sample(k, y)))(keys, ys)


_label_mse_shared_prior = jax.jit(jax.vmap(lambda p, q: p.label_mse(q), in_axes=(0, None)))
_label_mse_batched_prior = jax.jit(jax.vmap(lambda p, q: p.label_mse(q), in_axes=(0, 0)))


def label_mse_grid(params: Mechanism, prior):
    """label_mse for batched params (leading ε axis); the prior may be batched alike."""
    with jax.enable_x64(True):
        if params.batch_shape == ():
            return np.asarray(jax.jit(type(params).label_mse)(params, prior))
        fn = _label_mse_batched_prior if np.ndim(prior.mass) == 2 else _label_mse_shared_prior
        return np.asarray(fn(params, prior))
