r"""The linear program behind :mod:`rpwjax.mechanisms.unbiased`: its construction and exact solution.

The mechanism, its parameters and its fit are documented there; this module
holds the LP over a finite output grid and its solver, which
:func:`~rpwjax.mechanisms.unbiased.fit_unbiased` calls once per ε (:func:`solve`).

**Reformulation.** With the column minima :math:`u_m` (``u_m ≤ Q_jm ≤ e^ε u_m``
is equivalent to the k² DP constraints per output) write
:math:`Q_{jm} = u_m + R_{jm}`, :math:`0 \le R_{jm} \le (e^\varepsilon - 1) u_m`.
For fixed :math:`u` the rows decouple, and each row's best :math:`R_j` fills the
cap :math:`(e^\varepsilon - 1) u` on a *window* of consecutive outputs
(fractional at its two ends): an optimum has at most 2k outputs with mass, and
every row is "high" (:math:`Q = e^\varepsilon u`) on an interval of outputs and
"low" (:math:`Q = u`) elsewhere, except at a few fractional entries.

**Solver.** The LP over the full grid has kM variables and kM cap constraints
(k = 401, M = 1025: 4·10⁵ of each) - too large for HiGHS in seconds. We
solve it exactly by *restricted master + pricing*: each entry (j, m) is
fixed low, fixed high or free; fixed-high runs of a row enter the row
constraints through prefix sums of ``u`` (two non-zeros per run), so the
restricted LP has about 3M + (free entries) variables and is solved by
:func:`scipy.optimize.linprog` (HiGHS). Its duals :math:`(\alpha_j, \beta_j)`
of the row constraints price every entry of the full grid,
:math:`c_{jm} = p_j (z_m - x_j)^2 - \alpha_j - \beta_j (z_m - x_j)`, and every
output, :math:`r_m = \sum_j \phi(c_{jm})` with :math:`\phi(c) = c` for
:math:`c \ge 0` and :math:`e^\varepsilon c` for :math:`c < 0` (the cheapest column
of the DP cone at :math:`z_m`). If :math:`\min_m r_m \ge 0` the restricted optimum
is optimal for the full grid LP; in general :math:`-\min_m r_m` bounds the gap
(any feasible Q has cost ≥ the dual value :math:`+ \sum_m u_m r_m` and
:math:`\sum_m u_m \le 1`), and is reported as ``optimality_gap`` (relative).
Otherwise the statuses follow the prices (high where c < 0, free near sign
changes) while the current solution's own entries stay as they are, so the
objective never rises, and the master is solved again. The structure is found
coarse to fine: first on grouped support points (41 groups) and a 65-point
grid, then on the full support with grids of 65, 257 and ``grid_size``
points, each level started from the windows (roots of :math:`c_{j}(z) = 0`) of
the level before; the finest level typically needs one or two solves.

**Output grid.** ``grid_size`` (default 1025) equally spaced points on
:math:`[lo - c\Delta, hi + c\Delta]` with
:math:`c = 1.5/(e^\varepsilon - 1) + 1` by default: 1.5 times the necessary
reach plus Δ (optimal outputs reach about :math:`1/(e^\varepsilon - 1)` beyond the range
at small ε and up to about 0.45 Δ at large ε). After the fit the prices of
outputs out to four times farther are checked; if any is negative the grid is
widened and the fit continued, so the range never binds. The grid costs a
little: refining it from 1025 to 2049 points lowers the optimum by 1.4e-6
relative at ε = 1 and by 2.1e-5 at ε = 4 (k = 401, the benchmark's prior).
With outputs anywhere (k = 41, the same prior's shape) the optimum has no
fractional entries and 80 outputs at ε = 1, and lies 2.0e-6 (ε = 1) and
2.3e-5 (ε = 4) below the 1025-point optimum.
For ε above 12 the LP is solved at ε = 12 (its coefficients e^ε would otherwise
exceed what the solver resolves): a (12 + 2e-6)-DP randomizer (see *Exactness*)
is ε-DP; ``info`` says so.

**Zero-mass support points** (empty bins of a noisy histogram, lo and hi under an
empirical prior that does not reach them) get the mass
1e-5/k in the LP (so does any point lighter than that), so their rows are the
cheapest ones for the shared outputs rather than an arbitrary feasible row, and
their duals stay far above the solver's tolerance (with masses near 1e-9 the
prices of those rows are noise and the search crawls). ``info["label_mse"]`` is
always computed under the prior's true masses.

**Solver.** Each restricted LP goes to HiGHS's default method, then its dual simplex, then its interior
point, until one solves it: at a small ε (outputs hundreds of ranges away) the default alone can stop
without an answer (seen at ε = 0.002-0.003). Where none does (e.g. ε = 1e-4), the fit is refused with an
:class:`~rpwjax.errors.InputError` naming ε.

**Exactness.** The LP is solved at ε' = min(ε, 12) - 1e-8 (below ε = 1e-6: minus 1% of ε). The final matrix
keeps the outputs with mass, is clipped into the DP box
:math:`[u_m, e^{\varepsilon'} u_m]` column by column, and a per-row affine
reweighting (relative change δ at most min((ε - ε')/4, 1e-6), checked: 2.5e-9
up to ε = 12) makes every row sum to one and have mean :math:`x_j` to rounding
(≈1e-15) while every ratio stays below :math:`e^{\varepsilon' + 2.0001\delta} < e^\varepsilon`.
When the solver's solution needs a larger change than that (seen on peaked
priors at ε = 12), the LP is solved again with ε' = min(ε, 12) - 1e-6, then
- 1e-4 (each only while it is at most 1% of ε): a slightly smaller ε, still
ε-DP; ``info["lp_margin"]`` is the margin used.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import scipy.sparse as sparse
from scipy.optimize import linprog

from rpwjax.errors import InputError

DEFAULT_GRID_SIZE = 1025
MAX_LP_EPSILON = 12.0  # e^12 ≈ 1.6e5: the largest coefficient ratio we hand to HiGHS
_COARSE_GROUPS = 41  # support groups of the first (structure-finding) level
_COARSE_GRID = 65
_GRID_REFINEMENT = 4  # each level has about 4x the points of the one before
_MASS_FLOOR = 1e-5  # LP masses are at least this / k (empty support points; see the module docstring)
_GAP_TOLERANCE = 1e-7  # stop when the certified relative gap is below this
_STALL_TOLERANCE = 1e-11  # ... or when a solve improves the objective by less (relative)
_WARN_GAP = 1e-5  # warn when the final certified gap is above this
_MAX_SOLVES_PER_LEVEL = 60
_FREE_MARGIN = 2  # entries within this many outputs of a sign change of c_j(z) are free
_FREE_MARGIN_ROWS = 1  # ... and within this many rows
_ZERO_U = 1e-13  # column minima below this count as zero while searching
_ZERO_MASS = 1e-9  # outputs whose largest probability is below this are dropped from the result: LP noise (e.g.
# 4e-11 at ε = 0.0018), and too few of the 2^52 uniforms (under 5e6) for a realized ratio within 1e-6
_EPSILON_MARGIN = 1e-8  # the LP is solved at ε - this, so rounding fixes cannot exceed ε
_RETRY_MARGINS = (1e-6, 1e-4)  # ... or at ε - these, when its solution is too far from feasible for the first
_MAX_POLISH = 1e-6  # the polish never changes an entry by more than this (relative)
_LOW, _FREE, _HIGH = 0, 1, 2
_HIGHS_OPTIONS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
_HIGHS_METHODS = ("highs", "highs-ds", "highs-ipm")  # tried in turn until one solves the restricted LP


class UnsolvedLP(RuntimeError):
    """No HiGHS method solved a restricted LP (seen only at small ε, e.g. 1e-4: outputs 15,000 ranges away)."""


class UnsolvedLPError(InputError):
    """What :func:`solve` raises for :class:`UnsolvedLP`: one line naming ε (a pipeline may retry with a
    flatter prior)."""


# --------------------------------------------------------------------------- the output grid


def default_extension(epsilon: float) -> float:
    """Reach of the default output grid beyond each end of the range, in units of Δ."""
    return 1.5 / math.expm1(min(float(epsilon), MAX_LP_EPSILON)) + 1.0


def output_grid(lo: float, hi: float, epsilon: float, grid_size: int = DEFAULT_GRID_SIZE, extension=None) -> np.ndarray:
    """The candidate outputs: ``grid_size`` equal steps over [lo - cΔ, hi + cΔ], c = ``extension``."""
    c = default_extension(epsilon) if extension is None else float(extension)
    width = hi - lo
    return lo + width * np.linspace(-c, 1.0 + c, int(grid_size))


# --------------------------------------------------------------------------- the LP solver
# Everything below works on the normalised problem: support in [0, 1] (Δ = 1).


@dataclasses.dataclass
class _Problem:
    x: np.ndarray  # (k,) normalised support
    p: np.ndarray  # (k,) LP masses (positive)
    growth: float  # e^ε

    @property
    def k(self) -> int:
        return self.x.size


def _runs(mask):
    """Maximal runs of True in each row of a (k, G) mask: (row, first, last) inclusive."""
    k, g = mask.shape
    padded = np.zeros((k, g + 2), np.int8)
    padded[:, 1:-1] = mask
    step = np.diff(padded, axis=1)
    rows, first = np.nonzero(step == 1)
    _, last = np.nonzero(step == -1)
    return rows, first, last - 1


def _restricted_lp(problem: _Problem, z, status):
    """Solve the grid LP with entries fixed low / high / free by ``status``; duals of the row constraints.

    Variables: u (G), prefix sums P_m = Σ_{i≤m} u_i and S_m = Σ_{i≤m} z_i u_i, and
    one R per free entry. Row j: P_G + (e^ε - 1) Σ_runs (P_b - P_{a-1}) + Σ R = 1 and
    the same with centred values (z - x_j), = 0.
    """
    x, p, growth = problem.x, problem.p, problem.growth
    k, g = status.shape
    up = growth - 1.0
    free_rows, free_cols = np.nonzero(status == _FREE)
    n_free = free_rows.size
    iu, ip, isum, ir = 0, g, 2 * g, 3 * g
    n = 3 * g + n_free
    rows, cols, vals = [], [], []

    def add(r, c, v):
        r = np.asarray(r)
        rows.append(r)
        cols.append(np.asarray(c))
        vals.append(np.broadcast_to(np.asarray(v, np.float64), r.shape))

    m = np.arange(g)
    add(m, ip + m, 1.0)
    add(m[1:], ip + m[1:] - 1, -1.0)
    add(m, iu + m, -1.0)
    add(g + m, isum + m, 1.0)
    add(g + m[1:], isum + m[1:] - 1, -1.0)
    add(g + m, iu + m, -z)
    r_sum, r_mean = 2 * g, 2 * g + k
    j = np.arange(k)
    add(r_sum + j, np.full(k, ip + g - 1), 1.0)
    add(r_mean + j, np.full(k, isum + g - 1), 1.0)
    add(r_mean + j, np.full(k, ip + g - 1), -x)
    run_row, first, last = _runs(status == _HIGH)
    add(r_sum + run_row, ip + last, up)
    add(r_mean + run_row, isum + last, up)
    add(r_mean + run_row, ip + last, -up * x[run_row])
    before = first > 0
    rb, fb = run_row[before], first[before]
    add(r_sum + rb, ip + fb - 1, -up)
    add(r_mean + rb, isum + fb - 1, -up)
    add(r_mean + rb, ip + fb - 1, up * x[rb])
    free_index = ir + np.arange(n_free)
    add(r_sum + free_rows, free_index, 1.0)
    add(r_mean + free_rows, free_index, z[free_cols] - x[free_rows])
    a_eq = sparse.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(2 * g + 2 * k, n)
    )
    b_eq = np.concatenate([np.zeros(2 * g), np.ones(k), np.zeros(k)])
    a_ub = sparse.csr_matrix(
        (
            np.concatenate([np.ones(n_free), np.full(n_free, -up)]),
            (np.concatenate([np.arange(n_free)] * 2), np.concatenate([free_index, iu + free_cols])),
        ),
        shape=(n_free, n),
    )
    sq = (z[None, :] - x[:, None]) ** 2 * p[:, None]  # (k, G) cost of one unit of Q
    cost = np.zeros(n)
    cost[:g] = sq.sum(0) + up * np.where(status == _HIGH, sq, 0.0).sum(0)
    cost[ir:] = sq[free_rows, free_cols]
    lower = np.zeros(n)
    lower[isum : isum + g] = -np.inf
    bounds = np.stack([lower, np.full(n, np.inf)], axis=1)
    for method in _HIGHS_METHODS:  # HiGHS's default choice first; at a small ε (outputs hundreds of ranges
        # away, costs up to ~1e6) it can stop without an answer where its dual simplex or interior point does not
        res = linprog(
            cost, A_ub=a_ub, b_ub=np.zeros(n_free), A_eq=a_eq, b_eq=b_eq, bounds=bounds, method=method,
            options=_HIGHS_OPTIONS,
        )
        if res.status == 0:
            break
    else:
        raise UnsolvedLP(f"none of HiGHS's methods ({', '.join(_HIGHS_METHODS)}) solved its LP (last: {res.message})")
    duals = res.eqlin.marginals[2 * g :]
    free = np.zeros((k, g))
    free[free_rows, free_cols] = res.x[ir:]
    return res.fun, duals[:k], duals[k:], res.x[:g].copy(), free


def _prices(problem: _Problem, z, alpha, beta):
    """Reduced costs c (k, G) of single entries and r (G,) of the best DP column at each output."""
    d = z[None, :] - problem.x[:, None]
    c = problem.p[:, None] * d * d - alpha[:, None] - beta[:, None] * d
    r = np.where(c < 0, problem.growth * c, c).sum(0)
    return c, r


def _near_sign_change(negative, margin, margin_rows):
    k, g = negative.shape
    along = np.zeros((k, g), bool)
    change = negative[:, 1:] != negative[:, :-1]
    along[:, 1:] |= change
    along[:, :-1] |= change
    across = np.zeros((k, g), bool)
    change = negative[1:, :] != negative[:-1, :]
    across[1:] |= change
    across[:-1] |= change
    out = along.copy()
    for s in range(1, margin + 1):
        out[:, s:] |= along[:, :-s]
        out[:, :-s] |= along[:, s:]
    wide = across.copy()
    for s in range(1, margin_rows + 1):
        wide[s:] |= across[:-s]
        wide[:-s] |= across[s:]
    return out | wide


def _status_from_prices(c):
    negative = c < 0
    status = np.where(negative, _HIGH, _LOW).astype(np.int8)
    status[_near_sign_change(negative, _FREE_MARGIN, _FREE_MARGIN_ROWS)] = _FREE
    # the two ends are free in every row: then any status admits the two-output solution
    status[:, 0] = _FREE
    status[:, -1] = _FREE
    return status


def _next_status(status, c, u, free, growth):
    """Statuses from the prices, except that the current solution stays feasible (the objective cannot rise)."""
    negative = c < 0
    new = _status_from_prices(c)
    active = u > _ZERO_U
    cap = (growth - 1.0) * u[None, active]
    r = free[:, active]
    current = np.where(
        status[:, active] != _FREE,
        status[:, active],
        np.where(r <= 1e-12 * cap, _LOW, np.where(r >= cap * (1 - 1e-12), _HIGH, _FREE)),
    )
    wrong = ((current == _HIGH) & ~negative[:, active]) | ((current == _LOW) & negative[:, active])
    new[:, active] = np.where(wrong | (new[:, active] == _FREE), _FREE, current)
    return new


def _windows(problem: _Problem, alpha, beta):
    """Roots of c_j(z) = 0 (the row's high window); an empty window is (x_j, x_j)."""
    p = problem.p
    disc = beta * beta + 4.0 * p * alpha
    s = np.sqrt(np.maximum(disc, 0.0))
    left = problem.x + (beta - s) / (2 * p)
    right = problem.x + (beta + s) / (2 * p)
    empty = disc <= 0
    return np.where(empty, problem.x, left), np.where(empty, problem.x, right)


def _status_from_windows(z, left, right):
    inside = (z[None, :] > left[:, None]) & (z[None, :] < right[:, None])
    status = np.where(inside, _HIGH, _LOW).astype(np.int8)
    status[_near_sign_change(inside, _FREE_MARGIN, 0)] = _FREE
    status[:, 0] = _FREE
    status[:, -1] = _FREE
    return status


def _solve_level(problem: _Problem, z, status):
    """Restricted solves until the full-grid prices certify the optimum (or stop improving)."""
    best = np.inf
    solves = 0
    while True:
        value, alpha, beta, u, free = _restricted_lp(problem, z, status)
        solves += 1
        c, r = _prices(problem, z, alpha, beta)
        gap = max(0.0, -float(r.min())) / max(value, 1e-300)
        stalled = best - value <= _STALL_TOLERANCE * value
        best = min(best, value)
        if gap <= _GAP_TOLERANCE or (stalled and solves > 1) or solves >= _MAX_SOLVES_PER_LEVEL:
            return dict(value=value, alpha=alpha, beta=beta, u=u, free=free, status=status, gap=gap, solves=solves)
        status = _next_status(status, c, u, free, problem.growth)


def _coarse_problem(problem: _Problem, groups: int) -> _Problem:
    edges = np.linspace(0, problem.k, groups + 1).round().astype(int)
    mass = np.add.reduceat(problem.p, edges[:-1])
    mean = np.add.reduceat(problem.p * problem.x, edges[:-1]) / mass
    return _Problem(mean, mass, problem.growth)


def _levels(grid_size: int):
    sizes = [grid_size]
    while (sizes[-1] - 1) // _GRID_REFINEMENT + 1 >= _COARSE_GRID:
        sizes.append((sizes[-1] - 1) // _GRID_REFINEMENT + 1)
    return sizes[::-1]


class _TooFarFromFeasible(RuntimeError):
    pass


def _polish(problem: _Problem, z, u, free, status, slack: float):
    """Exact row sums and means; the DP ratio stays below e^ε.

    The solver's Q is rebuilt on the outputs with mass and clipped into the DP
    box [u_m, e^ε' u_m] column by column (ε' the ε the LP was solved at, with
    ``slack`` = ε - ε' > 0: 1e-8, or more when ε is above MAX_LP_EPSILON). The
    rows' remaining residuals (solver tolerance, dropped near-empty outputs) are
    removed by the per-row affine reweighting Q_jm <- Q_jm (1 + a_j + b_j (z_m - x_j)),
    a 2 x 2 solve per row. It changes every entry by a relative δ ≤ min(slack/4,
    1e-6) (checked), so every ratio stays below e^ε' (1 + δ) / (1 - δ) <
    e^(ε' + 2.0001 δ) < e^ε.
    """
    x, growth = problem.x, problem.growth
    active = np.flatnonzero(growth * u > _ZERO_MASS)
    z = z[active]
    u = u[active]
    q = u[None, :] * np.where(status[:, active] == _HIGH, growth, 1.0) + free[:, active]
    q = np.clip(q, u[None, :], growth * u[None, :])
    d = z[None, :] - x[:, None]
    s0, s1, s2 = q.sum(1), (q * d).sum(1), (q * d * d).sum(1)
    # (1 + a) s0 + b s1 = 1 and (1 + a) s1 + b s2 = 0
    det = s0 * s2 - s1 * s1
    one_plus_a = s2 / det
    b = -s1 / det
    change = (one_plus_a - 1.0)[:, None] + b[:, None] * d
    worst = float(np.abs(change).max())
    if not worst <= min(0.25 * slack, _MAX_POLISH):
        raise _TooFarFromFeasible(f"internal error: the unbiased LP solution is too far from feasible "
                                  f"(relative {worst:.1e})")
    return z, q * (1.0 + change)


def solve(x, p, epsilon: float, grid_size: int, extension):
    """The optimal unbiased randomizer of one normalised problem: (outputs, Q, info).

    The LP is solved at min(ε, MAX_LP_EPSILON) - 1e-8 (1% of ε below 1e-6); when HiGHS leaves a solution that
    the polish cannot repair within that margin (seen on peaked priors at the cap), it is solved again with a
    margin of 1e-6, then 1e-4, each only while it is at most 1% of that ε: a slightly smaller ε, still
    ε-DP (``info["lp_margin"]`` says which)."""
    eps_lp = min(epsilon, MAX_LP_EPSILON)
    # below ε = 1e-6 the first margin is 1% of ε, so the LP's ε stays positive
    margins = (min(_EPSILON_MARGIN, 0.01 * eps_lp), *(m for m in _RETRY_MARGINS if m <= 0.01 * eps_lp))
    for margin in margins:
        try:
            return _solve_with_margin(x, p, epsilon, grid_size, extension, margin)
        except _TooFarFromFeasible as failure:
            last = failure
        except UnsolvedLP as failure:
            raise UnsolvedLPError(f"unbiased: no fit at epsilon={epsilon!r}: {failure}; at so small an epsilon "
                                  "its outputs lie hundreds of ranges beyond the labels (give a larger epsilon, or "
                                  "another mechanism)") from None
    raise RuntimeError(f"{last} at every margin tried ({', '.join(f'{m:g}' for m in margins)} below "
                       f"epsilon={eps_lp!r})") from last


def _solve_with_margin(x, p, epsilon: float, grid_size: int, extension, margin: float):
    eps_lp = min(epsilon, MAX_LP_EPSILON)
    growth = math.exp(eps_lp - margin)
    k = x.size
    p = np.maximum(p, _MASS_FLOOR / k)
    problem = _Problem(x, p / p.sum(), growth)
    c_ext = default_extension(eps_lp) if extension is None else extension
    if c_ext * (growth - 1.0) <= 1.0:
        raise InputError(
            f"extension must exceed 1/(e^epsilon - 1) = {1 / (growth - 1):.6g} (in units of hi - lo) for unbiased "
            f"outputs to exist at epsilon={epsilon!r}, got extension={c_ext!r}"
        )
    solves = 0
    windows = None
    if k > 2 * _COARSE_GROUPS:
        coarse = _coarse_problem(problem, _COARSE_GROUPS)
        z = np.linspace(-c_ext, 1 + c_ext, min(_COARSE_GRID, grid_size))
        state = _solve_level(coarse, z, _status_from_prices(np.ones((coarse.k, z.size))))
        solves += state["solves"]
        left, right = _windows(coarse, state["alpha"], state["beta"])
        windows = np.interp(x, coarse.x, left), np.interp(x, coarse.x, right)
    for _ in range(4):
        for size in _levels(grid_size):
            z = np.linspace(-c_ext, 1 + c_ext, size)
            if windows is None:
                status = _status_from_prices(np.ones((k, size)))
            else:
                status = _status_from_windows(z, *windows)
            state = _solve_level(problem, z, status)
            solves += state["solves"]
            windows = _windows(problem, state["alpha"], state["beta"])
        # outputs beyond the grid must not be worth having: price them, widen if they are
        step = z[1] - z[0]
        outer = np.arange(1, int(4 * (c_ext + 1) / step) + 1) * step
        beyond = np.concatenate([-c_ext - outer, 1 + c_ext + outer])
        _, r_out = _prices(problem, beyond, state["alpha"], state["beta"])
        if r_out.min() >= -_GAP_TOLERANCE * state["value"]:
            break
        c_ext = 2 * c_ext + 1
    else:  # pragma: no cover - the prices grow quadratically away from the range
        raise RuntimeError(f"internal error: the unbiased LP kept wanting wider outputs at epsilon={epsilon!r}")
    if state["gap"] > _WARN_GAP:
        warnings.warn(
            f"the unbiased LP at epsilon={epsilon!r} stopped with a certified relative gap of {state['gap']:.1e} "
            "(the randomizer is unbiased and private, possibly not optimal)",
            RuntimeWarning,
            stacklevel=3,
        )
    outputs, q = _polish(problem, z, state["u"], state["free"], state["status"], epsilon - (eps_lp - margin))
    info = dict(gap=state["gap"], solves=solves, extension=c_ext, epsilon_lp=eps_lp, lp_margin=margin)
    return outputs, q, info
