r"""Priors over the label, and the private histogram ``Hist_ε``.

A prior is a list of non-overlapping sorted *bins* ``[left_j, right_j]`` with
masses ``mass_j`` summing to one; the density is uniform inside a bin. An
empirical prior (weighted point masses) is the special case ``left == right``
and is flagged ``discrete`` so that kernels can take the cheaper piecewise
linear path. One representation serves both prior kinds in every kernel.

Privacy: the empirical prior *is* the labels (the paper's known-prior
setting; the mechanism then gets all of ε, and the guarantee holds only if
that prior is public). When the prior is unknown, :func:`private_histogram`
spends ε₁ on a noisy histogram over the PUBLIC range (exact discrete Laplace
noise, replace-one neighbours, L1 sensitivity 2) and nothing else is ever
read from the labels.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from rpwjax import noise, pytree
from rpwjax.accounting import Accounting, account
from rpwjax.errors import InputError, check_choice, check_epsilon, check_integer, check_labels, check_range
from rpwjax.keys import check_secret, epsilon_index


def tree_rows(tree, start: int, stop: int, dtype=None):
    """Rows ``start:stop`` of every leaf of a batched pytree (a Prior, fitted params), as JAX arrays.

    Host arrays are sliced before they are moved, so that walking a million-row batch in chunks copies each
    row once (moving the whole leaf for every chunk made chunked loops quadratic in the rows)."""

    def rows(v):
        part = v[start:stop] if isinstance(v, jax.Array) else np.asarray(v)[start:stop]
        return jnp.asarray(part, dtype)

    return jax.tree_util.tree_map(rows, tree)


@partial(
    pytree.register,
    data_fields=["left", "right", "mass"],
    meta_fields=["lo", "hi", "discrete", "kind"],
)
@dataclasses.dataclass(frozen=True)
class Prior:
    """Sorted bins ``[left, right]`` with masses; leaves may carry a leading batch axis."""

    left: jax.Array
    right: jax.Array
    mass: jax.Array
    lo: float
    hi: float
    discrete: bool
    kind: str  # "empirical" | "histogram" | "private-histogram"

    @property
    def size(self) -> int:
        return int(np.shape(self.mass)[-1])

    def _leaves(self):
        return jnp.asarray(self.left), jnp.asarray(self.right), jnp.asarray(self.mass)

    # --- functions of the prior, traceable, exact for uniform-in-bin densities ---

    def partial_expectation(self, x):
        r"""H(x) = E[(x - Y)_+], piecewise quadratic in x (linear for point masses)."""
        x = jnp.asarray(x)
        left, right, mass = self._leaves()
        k = jnp.searchsorted(left, x, side="right")  # bins with left <= x
        mid = 0.5 * (left + right)
        cum_mass = jnp.concatenate([jnp.zeros(1, mass.dtype), jnp.cumsum(mass)])
        cum_first = jnp.concatenate([jnp.zeros(1, mass.dtype), jnp.cumsum(mass * mid)])
        last = jnp.maximum(k - 1, 0)
        # bins before the last one with left <= x lie entirely at or below x
        full = x * cum_mass[last] - cum_first[last]
        l, r, p = left[last], right[last], mass[last]
        width = r - l
        t = jnp.minimum(x, r)
        inside = jnp.where(width > 0, (t - l) ** 2 / (2 * jnp.where(width > 0, width, 1.0)) + (x - t), x - l)
        return jnp.where(k > 0, full + p * inside, 0.0)

    def cdf(self, x, *, strict: bool = False):
        """P(Y <= x), or P(Y < x) with ``strict`` (they differ at point masses)."""
        x = jnp.asarray(x)
        left, right, mass = self._leaves()
        k = jnp.searchsorted(left, x, side="left" if strict else "right")
        cum_mass = jnp.concatenate([jnp.zeros(1, mass.dtype), jnp.cumsum(mass)])
        last = jnp.maximum(k - 1, 0)
        l, r, p = left[last], right[last], mass[last]
        width = r - l
        frac = jnp.where(width > 0, jnp.clip((x - l) / jnp.where(width > 0, width, 1.0), 0.0, 1.0), 1.0)
        return jnp.where(k > 0, cum_mass[last] + p * frac, 0.0)

    def expect(self, fn, breakpoints=()):
        """E[fn(Y)] under the prior.

        Exact for ``fn`` polynomial of degree <= 15 between the given
        breakpoints (Gauss-Legendre, 8 nodes per piece of each bin); for
        point masses it is the weighted sum.
        """
        left, right, mass = self._leaves()
        if self.discrete:
            return jnp.sum(mass * fn(left))
        nodes, weights = np.polynomial.legendre.leggauss(8)
        cuts = [left]
        for b in breakpoints:
            cuts.append(jnp.clip(b, left, right))
        cuts.append(right)
        cuts = jnp.sort(jnp.stack(cuts, axis=-1), axis=-1)  # (bins, pieces+1)
        a, b = cuts[:, :-1], cuts[:, 1:]
        width = right - left
        frac = (b - a) / jnp.where(width > 0, width, 1.0)[:, None]
        xs = 0.5 * (a + b)[..., None] + 0.5 * (b - a)[..., None] * nodes
        vals = fn(xs)
        piece = jnp.sum(vals * (0.5 * weights), axis=-1)
        return jnp.sum(mass[:, None] * frac * piece)

    def support_points(self):
        """Finite support for discrete mechanisms: the points, or the bin centres."""
        return 0.5 * (self.left + self.right)


def empirical_prior(labels, lo, hi, *, weights=None, clip: bool = False) -> Prior:
    """Known prior: the empirical distribution of ``labels`` (weighted point masses)."""
    lo, hi = check_range(lo, hi)
    y = check_labels(labels, lo, hi, clip=clip)
    if weights is None:
        values, counts = np.unique(y, return_counts=True)
        mass = counts.astype(np.float64)
    else:
        w = np.asarray(weights, dtype=np.float64).ravel()
        if w.shape != y.shape:
            raise InputError(f"weights must have one entry per label, got {w.size} weights for {y.size} labels")
        if not np.all(np.isfinite(w)) or (w < 0).any() or w.sum() <= 0:
            raise InputError("weights must be finite, non-negative and not all zero")
        values, inverse = np.unique(y, return_inverse=True)
        mass = np.bincount(inverse.ravel(), weights=w)
    mass = mass / mass.sum()
    return Prior(values, values.copy(), mass, lo, hi, True, "empirical")


def histogram_prior(edges, masses, *, kind: str = "histogram") -> Prior:
    """A user-given histogram: ``len(edges) == len(masses) + 1``, uniform density in each bin."""
    e = np.asarray(edges, dtype=np.float64).ravel()
    m = np.asarray(masses, dtype=np.float64)
    if e.size < 2:
        raise InputError(f"histogram needs at least two edges, got {e.size}")
    if not np.all(np.isfinite(e)) or not np.all(np.diff(e) > 0):
        raise InputError(f"histogram edges must be finite and strictly increasing, got edges={e}")
    if m.shape[-1] != e.size - 1:
        raise InputError(f"histogram needs one mass per bin: {e.size - 1} bins, got {m.shape[-1]} masses")
    if not np.all(np.isfinite(m)) or (m < 0).any():
        raise InputError("histogram masses must be finite and non-negative")
    total = m.sum(axis=-1, keepdims=True)
    if (total <= 0).any():
        raise InputError("histogram masses must not all be zero")
    m = m / total
    return Prior(e[:-1], e[1:], m, float(e[0]), float(e[-1]), False, kind)


def cut_pieces(left, right, mass, cuts):
    """The prior's bins cut at ``cuts``: (a, b, m) per piece, uniform on [a, b] (a == b: a point mass)."""
    point = right <= left
    pa, pb, pm = [left[point]], [left[point]], [mass[point]]
    l, r, m = left[~point], right[~point], mass[~point]
    if l.size:
        edges = np.unique(np.concatenate([l, r, cuts[(cuts > l.min()) & (cuts < r.max())]]))
        a, b = edges[:-1], edges[1:]
        mid = 0.5 * (a + b)
        bin_ = np.clip(np.searchsorted(l, mid, side="right") - 1, 0, l.size - 1)
        inside = mid < r[bin_]
        a, b, bin_ = a[inside], b[inside], bin_[inside]
        pa.append(a)
        pb.append(b)
        pm.append(m[bin_] * (b - a) / (r[bin_] - l[bin_]))
    return np.concatenate(pa), np.concatenate(pb), np.concatenate(pm)


def project_counts(noisy, total: float) -> np.ndarray:
    """Least-squares post-processing of noisy counts whose true total is public:
    the closest (L2) c >= 0 with sum(c) = total, i.e. c = max(noisy - tau, 0) for one shift tau.

    Plain clipping at zero keeps the positive noise of every empty bin, a floor
    of spurious mass spread over the whole range; the projection removes it.
    """
    v = np.asarray(noisy, np.float64)
    total = float(total)
    if total <= 0:
        return np.full(v.size, 0.0)
    u = np.sort(v)[::-1]
    cum = np.cumsum(u) - total
    k = np.arange(1, v.size + 1)
    rho = np.nonzero(u - cum / k > 0)[0][-1]
    tau = cum[rho] / (rho + 1)
    return np.maximum(v - tau, 0.0)


def histogram_release(values, edges, epsilon, secret, purpose: str = "counts", *index: int) -> np.ndarray:
    """The one ε-DP histogram release of the package (``Hist_ε`` and every pipeline's histogram).

    ``values`` are clipped to the public ``edges`` and counted; the counts (the
    only thing read from the values) get exact discrete Laplace noise of rate
    ε/2 (:func:`rpwjax.noise.noisy_counts`: replace-one neighbours change two
    counts by one, L1 sensitivity 2; no floating point touches the noise), drawn
    from ``secret`` under ``purpose`` and ``index``. Returns int64 noisy counts
    (they may be negative: post-process with :func:`project_counts` or by clipping).
    """
    eps = float(check_epsilon(epsilon))
    edges = np.asarray(edges, np.float64)
    v = np.clip(np.asarray(values, np.float64), edges[0], edges[-1])
    counts, _ = np.histogram(v, bins=edges)  # np.histogram puts the last edge into the last bin
    return noise.noisy_counts(counts, eps, secret, purpose, *index)


def histogram_spend(accounting: Accounting, purpose: str, epsilon, bins: int):
    """Record one :func:`histogram_release` of ``bins`` bins at ``epsilon`` in ``accounting`` as ``purpose``."""
    return accounting.spend(purpose, float(epsilon), sensitivity="2 in L1 on the counts (one label leaves a bin "
                            "for another)", mechanism=f"discrete Laplace of rate epsilon/2 on each of {int(bins)} counts")


DEFAULT_BINS = 32  # bins of a private histogram prior over the public range, unless a caller says otherwise
PROJECTIONS = ("clip", "project")


def private_histogram(labels, lo, hi, epsilon_prior, *, bins: int, secret, clip: bool = False,
                      projection: str = "clip", purpose: str = "histogram", keyed_by_epsilon: bool = True,
                      accounting: Accounting | None = None) -> Prior:
    r"""``Hist_ε``: an ε₁-DP histogram prior over the public range.

    ``bins`` equal-width bins over ``[lo, hi]``, released once by
    :func:`histogram_release`, then post-processed into masses:
    ``projection="clip"`` clips the noisy counts at zero and normalises (all
    zero gives the uniform prior); ``"project"`` takes the closest
    non-negative counts with the public total (:func:`project_counts`). The
    noise is drawn from ``secret`` (:class:`rpwjax.keys.Secret`) under
    ``purpose``; with ``keyed_by_epsilon`` each ε value gets its own noise,
    keyed by the value's float64 bits (:func:`rpwjax.keys.epsilon_index`, not
    its position in the grid, so one cell of a sweep can be rerun alone): equal values in a 1-d
    ``epsilon_prior`` give the same histogram, one release. A 1-d ``epsilon_prior`` gives a result with a
    leading axis. ``accounting``, if given, gets one entry "histogram" per distinct ε released
    (:func:`histogram_spend`).
    """
    lo, hi = check_range(lo, hi)
    eps1 = check_epsilon(epsilon_prior, "epsilon_prior")
    bins = check_integer(bins, "bins")
    check_choice(projection, "projection", PROJECTIONS)
    check_secret(secret)
    y = check_labels(labels, lo, hi, clip=clip)
    edges = np.linspace(lo, hi, bins + 1)
    flat = eps1.reshape(-1)
    if not keyed_by_epsilon and flat.size > 1:
        # one key for several ε would scale the same noise draws: their differences would reveal the counts
        raise InputError(f"a histogram not keyed by epsilon takes one epsilon, got {flat.size}")
    # equal ε values draw from the same key, so they are one release (the same counts): spent once
    for e in dict.fromkeys(flat.tolist()) if account(accounting) is not None else ():
        histogram_spend(accounting, "histogram", e, bins)
    noisy = np.stack([histogram_release(y, edges, e, secret, purpose, *((epsilon_index(e),) if keyed_by_epsilon else ()))
                      for e in flat]).astype(np.float64)
    if projection == "project":
        noisy = np.stack([project_counts(row, y.size) for row in noisy])
    noisy = np.maximum(noisy, 0.0)
    total = noisy.sum(axis=1, keepdims=True)
    mass = np.where(total > 0, noisy / np.where(total > 0, total, 1.0), 1.0 / bins)
    if eps1.ndim == 0:
        mass = mass[0]
        left, right = edges[:-1], edges[1:]
    else:
        left = np.broadcast_to(edges[:-1], mass.shape).copy()
        right = np.broadcast_to(edges[1:], mass.shape).copy()
    return Prior(left, right, mass, lo, hi, False, "private-histogram")
