r"""The empirical audit of ``rpwjax audit``: a lower bound on ε from samples of the shipped release path.

It trusts nothing but the samples; the sets it tests come from the claimed
density and the exact check (:mod:`rpwjax.audit.exact`), which only affects its power.

**2. Empirical audit** (of the sampler that actually runs). ``samples``
outputs at each of two labels, by one compiled call of ``sample`` per label
(float64, fixed keys): (lo, hi), unless the exact check found a strictly
worse pair. The sets tested are fixed before sampling, from public
parameters only: the outputs (discrete), or for continuous outputs the
central range of the two claimed densities (mixture mass 1e-5 left out on
each side) cut into ``bins`` equal-width bins and at every step edge of the two
densities, plus the two tails; and, per direction, the Neyman-Pearson unions
(the bins ranked by the claimed likelihood ratio, every prefix), which are the
most powerful sets for a density that is right and the ones a δ-violation
needs. For each set S and direction, Clopper-Pearson bounds
(``scipy.stats.beta``) give :math:`L \le P(M(y) \in S)` and
:math:`U \ge P(M(y') \in S)`; Bonferroni over all bounds makes them hold
together with probability ``confidence`` (99.9%). Then

.. math::
   \hat\varepsilon_{lb} = \max_{S,\ \text{directions}} \log \frac{L - \delta}{U}

is a lower bound on every ε for which the sampler is (ε, δ)-DP, at that
confidence (δ = 0 for pure mechanisms; for the Gaussian P(S|y) ≤ e^ε P(S|y') + δ
is exactly what (ε, δ)-DP allows, so the test is valid and fails only on a
real violation; 1e6 samples cannot resolve its δ = 1e-5 tails, so for it the
audit is weak and says so by passing with a small bound). The audit fails
iff :math:`\hat\varepsilon_{lb} > \varepsilon`, or a sample lies where the
claimed density is zero, or is not finite.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from rpwjax.audit.exact import _cell_masses, _claimed, _log_density_table
from rpwjax.keys import Secret
from rpwjax.release_path import release

CENTRAL_TAIL_MASS = 1e-5  # binning range of the empirical audit leaves this much out per side

DEFAULT_SAMPLES = 1_000_000
DEFAULT_BINS = 100
DEFAULT_CONFIDENCE = 0.999


# --------------------------------------------------------------------------- empirical audit


def clopper_pearson(k, n, alpha):
    """One-sided Clopper-Pearson bounds at level ``alpha`` each: (lower, upper) on a binomial p."""
    k = np.asarray(k, np.float64)
    lower = np.where(k > 0, stats.beta.ppf(alpha, np.maximum(k, 1), n - k + 1), 0.0)
    upper = np.where(k < n, stats.beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1)), 1.0)
    return lower, upper


def _bins(params, exact, pair, labels, bins):
    """Fixed sets for the empirical audit: bin edges (continuous) or outputs (discrete), and claimed masses.

    Continuous: bins ``(-inf, e_0), [e_0, e_1), ..., [e_last, inf)``; the claimed
    mass of each bin under each label of ``pair`` comes from the exact densities.
    """
    rows = list(pair)
    if params.discrete:
        return exact["points"], np.exp(exact["L"][rows]), {"bins": int(exact["points"].size)}
    n = exact["n_quadrature"]
    xs = exact["points"][:n]
    cells = _cell_masses(xs, exact["L"][rows][:, :n])
    mixture_cdf = np.concatenate([[0.0], np.cumsum(cells.mean(axis=0))])
    total = mixture_cdf[-1]
    left = xs[np.searchsorted(mixture_cdf, CENTRAL_TAIL_MASS * total)]
    right = xs[min(np.searchsorted(mixture_cdf, (1 - CENTRAL_TAIL_MASS) * total), xs.size - 1)]
    step_edges = np.concatenate([exact["edges_by_label"].get(i, np.empty(0)) for i in rows])
    step_edges = step_edges[(step_edges > left) & (step_edges < right)]
    cap = 4 * bins
    if step_edges.size > cap:
        # many stairs: keep the edges nearest the labels, where the densities differ most
        a, b = sorted(float(labels[i]) for i in rows)
        distance = np.maximum(np.maximum(a - step_edges, step_edges - b), 0.0)
        step_edges = step_edges[np.argsort(distance, kind="stable")[:cap]]
    edges = np.unique(np.concatenate([np.linspace(left, right, bins + 1), step_edges]))
    # claimed bin masses: cumulative cell masses on the grid augmented with the edges
    aug = np.unique(np.concatenate([xs, edges]))
    cdf = np.cumsum(_cell_masses(aug, _log_density_table(params)(aug, labels[rows])), axis=1)
    cdf = np.concatenate([np.zeros((2, 1)), cdf], axis=1)
    at_edges = cdf[:, np.searchsorted(aug, edges)]
    mass = cdf[:, -1:]
    claimed = np.diff(np.concatenate([np.zeros((2, 1)), at_edges, mass], axis=1), axis=1) / mass
    info = {"bins": int(edges.size + 1), "bin_range": (float(left), float(right)), "step_edge_bins": int(step_edges.size)}
    return edges, np.maximum(claimed, 0.0), info


def _empirical(params, exact, labels, samples, seed, bins, confidence):
    eps, delta, _ = _claimed(params)
    pair = exact["pair"]
    ys = [float(labels[i]) for i in pair]
    edges, claimed, info = _bins(params, exact, pair, labels, bins)
    base = Secret.from_seed(seed).child("empirical-audit")
    counts, off_support, not_finite = [], 0, 0
    table = jax.jit(lambda yt, y: params.log_density(yt, y))
    for j, y in enumerate(ys):
        # the shipped release path, as privatize runs it (grid, clamp, derived keys)
        draws = jnp.asarray(release(params, base.child("label", j), np.full(samples, y)))
        finite = np.isfinite(np.asarray(draws))
        not_finite += int((~finite).sum())
        draws_np = np.asarray(draws, np.float64)
        if params.discrete:
            idx = np.clip(np.searchsorted(edges, draws_np), 0, edges.size - 1)
            hit = finite & (edges[idx] == draws_np)
            off_support += int((finite & ~hit).sum())
            counts.append(np.bincount(idx[hit], minlength=edges.size))
        else:
            density = np.asarray(table(draws, jnp.full_like(draws, y)))
            off_support += int((finite & ~np.isfinite(density)).sum())
            counts.append(np.bincount(np.searchsorted(edges, draws_np[finite], side="right"), minlength=edges.size + 1))
    counts = np.stack(counts).astype(np.float64)
    n_bins = counts.shape[1]

    # sets: every bin, and per direction every prefix of the bins ranked by the claimed likelihood ratio
    tests = []
    for num, den in ((0, 1), (1, 0)):
        with np.errstate(divide="ignore", invalid="ignore"):
            log_ratio = np.log(claimed[num]) - np.log(claimed[den])
        rank = np.argsort(-np.nan_to_num(log_ratio, nan=-np.inf), kind="stable")
        prefix_num = np.cumsum(counts[num][rank])[:-1]
        prefix_den = np.cumsum(counts[den][rank])[:-1]
        tests.append((np.concatenate([counts[num], prefix_num]), np.concatenate([counts[den], prefix_den]), num, rank))
    n_bounds = 2 * sum(t[0].size for t in tests)
    alpha = (1 - confidence) / n_bounds
    best, best_pure, best_where = -np.inf, -np.inf, None
    for k_num, k_den, num, _ in tests:
        lower, _ = clopper_pearson(k_num, samples, alpha)
        _, upper = clopper_pearson(k_den, samples, alpha)
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = np.where(lower > delta, np.log(np.maximum(lower - delta, 1e-300)) - np.log(upper), -np.inf)
            bound_pure = np.where(lower > 0, np.log(np.maximum(lower, 1e-300)) - np.log(upper), -np.inf)
        i = int(np.argmax(bound))
        if bound[i] > best:
            kind = f"bin {i}" if i < n_bins else f"the {i - n_bins + 1} bins of highest claimed ratio"
            best = float(bound[i])
            best_where = f"{kind}, P(y={ys[num]!r}) >= {lower[i]:.4g}, P(y={ys[1 - num]!r}) <= {upper[i]:.4g}"
        best_pure = max(best_pure, float(np.max(bound_pure)))
    problems = []
    if off_support:
        problems.append(f"{off_support} samples where the claimed density is zero")
    if not_finite:
        problems.append(f"{not_finite} samples not finite")
    info.update(
        pair=tuple(ys),
        samples=samples,
        confidence=confidence,
        tests=n_bounds // 2,
        lower_bound_raw=best,
        lower_bound_ignoring_delta=best_pure,
        strongest_set=best_where,
        problems=problems,
    )
    lower_bound = max(best, 0.0)
    return lower_bound, bool(lower_bound <= eps and not problems), info
