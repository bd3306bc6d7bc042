r"""The paper's O(k³) interval search (Algorithm 1 of Liu & Huang, 2026), in NumPy.

A timing reference only: ``rpwjax bench`` runs it next to the exact search of
:mod:`rpwjax.mechanisms.interval_search` on the same histogram prior (objective
``"inside"``), and the test suite checks that both reach the same optimum.

Which version this is. It follows the structure of the authors' released
notebook code (``compute_optimal_interval2`` in the ``Response_privacy``
repository), rewritten here in NumPy:

* a histogram prior with edges :math:`x_0 < \dots < x_k` and densities
  :math:`f_l = p_l / (x_{l+1} - x_l)`;
* an outer loop over the bin ``i`` holding :math:`A_1` and an inner loop over
  the bin ``j > i`` holding :math:`A_2` (two nested loops, O(k²) pairs);
* for each pair, the mass strictly between the two bins summed afresh,
  :math:`\sum_{l=i+1}^{j-1} f_l (x_{l+1} - x_l)` (an O(k) sum: O(k³) in all),
  so that :math:`P(A_1 \le Y \le A_2) = h + f_j A_2 - f_i A_1` with
  :math:`h = f_i x_{i+1} + \sum_{l=i+1}^{j-1} f_l (x_{l+1} - x_l) - f_j x_j`;
* candidates :math:`A_1 \in \{x_i, x_{i+1}, e_2\}`,
  :math:`A_2 \in \{x_j, x_{j+1}, e_1\}`, where :math:`e_1, e_2` are the points
  at which a partial derivative of the ratio changes sign inside the bin
  (the notebook's ``d11 * d12 < 0`` and ``d21 * d22 < 0`` tests);
* the objective :math:`J = 2\zeta P(A_1 \le Y \le A_2) / (2\zeta + e^{-\varepsilon}(A_2 - A_1))`
  (the ``"inside"`` objective of :mod:`rpwjax.mechanisms.interval_search`).

Departures from the notebook, none of which changes the running time:
it uses the bin densities (the notebook passes bin masses, which only
rescales J for equal-width bins); its last candidate pair ``(e_2, e_1)``
updates the running maximum (the notebook forgets to); ``(A_1, A_2)`` starts
at ``(x_0, x_k)`` instead of being undefined when no pair beats zero; and J
carries the factor 2ζ so that its value equals rpwjax's ``"inside"`` value.
Like the notebook it never places both ends in the same bin.
"""

from __future__ import annotations

import math

import numpy as np


def algorithm1_interval(edges, masses, epsilon: float, zeta: float):
    """Best ``(A1, A2, J)`` for a histogram prior by the O(k³) loop (one ε)."""
    node = np.asarray(edges, dtype=np.float64)
    mass = np.asarray(masses, dtype=np.float64)
    k = mass.size
    if node.size != k + 1:
        raise ValueError(f"need len(edges) == len(masses) + 1, got {node.size} edges for {k} masses")
    width = np.diff(node)
    freq = mass / width  # density per bin
    shrink = math.exp(-epsilon)
    two_zeta = 2.0 * zeta

    best = 0.0
    a1_best, a2_best = float(node[0]), float(node[-1])

    def ratio(h, fi, fj, a1, a2):
        return two_zeta * (h + fj * a2 - fi * a1) / (two_zeta + shrink * (a2 - a1))

    for i in range(k):
        fi = float(freq[i])
        for j in range(i + 1, k):
            fj = float(freq[j])
            # the O(k) step: mass of the bins strictly between i and j, summed afresh
            between = float(np.sum(freq[i + 1 : j] * (node[i + 2 : j + 1] - node[i + 1 : j])))
            h = fi * float(node[i + 1]) + between - fj * float(node[j])
            slope = shrink * (fj - fi)
            c1 = two_zeta * fi - shrink * h
            c2 = two_zeta * fj - shrink * h
            d11 = slope * float(node[j]) - c1
            d12 = slope * float(node[j + 1]) - c1
            d21 = -slope * float(node[i]) + c2
            d22 = -slope * float(node[i + 1]) + c2

            candidates = [
                (float(node[i]), float(node[j])),
                (float(node[i]), float(node[j + 1])),
                (float(node[i + 1]), float(node[j + 1])),
                (float(node[i + 1]), float(node[j])),
            ]
            cross1 = d11 * d12 < 0  # slope != 0 here, so e1 is finite
            cross2 = d21 * d22 < 0
            if cross2:
                e2 = c2 / slope
                candidates += [(e2, float(node[j])), (e2, float(node[j + 1]))]
            if cross1:
                e1 = c1 / slope
                candidates += [(float(node[i]), e1), (float(node[i + 1]), e1)]
            if cross1 and cross2:
                candidates.append((c2 / slope, c1 / slope))
            for a1, a2 in candidates:
                value = ratio(h, fi, fj, a1, a2)
                if value > best:
                    best, a1_best, a2_best = value, a1, a2
    return a1_best, a2_best, best
