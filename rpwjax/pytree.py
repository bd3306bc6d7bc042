"""Pytree registration that keeps classes apart.

JAX caches a compiled function by the *structure* of its pytree arguments. In
jaxlib 0.10, two nodes registered with ``jax.tree_util.register_dataclass``
compare equal when they have the same number of children and equal static
fields, whatever their classes: ``RROnBins`` and ``Unbiased`` on the same
range, or a mechanism and a subclass that overrides its sampler. Their hashes
differ, so a cache lookup usually misses, but when two entries land in the
same hash slot the lookup trusts the equality and runs the *other* class's
compiled code. For the release path that would mean sampling one mechanism
while claiming another.

:func:`register` registers a frozen dataclass with the class itself in the
static part of its structure, so two structures are equal only when their
classes are the same object.
"""

from __future__ import annotations

from typing import Sequence

import jax


def register(cls: type, data_fields: Sequence[str], meta_fields: Sequence[str]) -> type:
    """Register the frozen dataclass ``cls`` as a pytree: ``data_fields`` are children, ``meta_fields`` static.

    The static part is ``(cls, meta values)``; unflattening sets the fields directly (no ``__init__``:
    the values came from an object that was already built, and children may be tracers or placeholders).
    Returns ``cls``.
    """
    data_fields, meta_fields = tuple(data_fields), tuple(meta_fields)
    keys = tuple(jax.tree_util.GetAttrKey(name) for name in data_fields)

    def flatten(obj):
        return [getattr(obj, n) for n in data_fields], (cls, tuple(getattr(obj, n) for n in meta_fields))

    def flatten_with_keys(obj):
        children, aux = flatten(obj)
        return list(zip(keys, children)), aux

    def unflatten(aux, children):
        obj = object.__new__(cls)
        for name, value in zip(data_fields, children):
            object.__setattr__(obj, name, value)
        for name, value in zip(meta_fields, aux[1]):
            object.__setattr__(obj, name, value)
        return obj

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    return cls
