"""What ``rpwjax audit`` checks of the release as shipped, besides the exact and empirical checks.

The realized check itself is :func:`rpwjax.realized.check`; this module holds how many fresh random
labels every audit adds to its fixed ones (:data:`FRESH_LABELS`), the seed they are drawn from
(:func:`new_audit_seed`), and the output-grid check (:func:`output_grid_check`: every released value
lies in the sidecar's range and on its grid).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpwjax.keys import Secret
from rpwjax.mechanisms.base import Mechanism
from rpwjax.release_path import release, sidecar_fields

FRESH_LABELS = 4096  # labels drawn afresh by every audit for the realized check, per mechanism and ε


def output_grid_check(params: Mechanism, seed: int) -> tuple[bool, dict]:
    """What the release path writes lies in the sidecar's ``output_range`` and, if continuous, on ``output_grid``.

    Every released value must be an exact multiple of ``output_grid`` (so its
    low-order bits are zero whatever the label was) and inside
    ``output_range``; the grid must be fine enough not to collapse the
    distribution (many distinct outputs).
    """
    fields = sidecar_fields(params)
    step, (a, b) = fields["output_grid"], fields["output_range"]
    info: dict[str, Any] = {"step": step, "output_range": [a, b], "problems": []}
    labels = np.linspace(params.lo, params.hi, 100_000)
    out = release(params, Secret.from_seed(seed).child("grid-audit"), labels)
    outside = int(np.count_nonzero((out < a) | (out > b)))
    info.update(outside_range=outside)
    if outside:
        info["problems"].append(f"{outside} released values lie outside output_range=[{a!r}, {b!r}]")
    if step is None:
        info["note"] = "discrete outputs: released values are the mechanism's own output values"
        return not info["problems"], info
    off_grid = int(np.count_nonzero(np.round(out / step) * step != out))
    distinct = int(np.unique(out).size)
    info.update(off_grid=off_grid, distinct_outputs=distinct)
    if off_grid:
        info["problems"].append(f"{off_grid} released values are not multiples of output_grid={step!r}")
    if distinct < 100:
        info["problems"].append(f"only {distinct} distinct outputs among 100000: the grid collapses the distribution")
    return not info["problems"], info


def new_audit_seed() -> int:
    """A fresh audit seed from OS entropy (63 bits)."""
    import secrets

    return secrets.randbits(63)
