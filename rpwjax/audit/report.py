"""The audit's report: :class:`AuditReport` per (mechanism, ε), and the table, legend and problem lines
``rpwjax audit`` prints from reports.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from rpwjax import realized
from rpwjax.audit.empirical import DEFAULT_CONFIDENCE
from rpwjax.audit.exact import DELTA_RELATIVE_TOLERANCE, RATIO_TOLERANCE
from rpwjax.audit.shipped import FRESH_LABELS


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """The outcome of :func:`~rpwjax.audit.checks.audit_mechanism` for one fitted mechanism.

    ``exact_max_log_ratio`` is the largest log density ratio found on the grid
    (for a non-pure mechanism a grid artefact: its true supremum is infinite,
    and ``exact_delta``, the δ(ε) of its privacy-loss profile, decides
    ``exact_pass``). ``empirical_lower_bound`` is the δ-aware lower bound on ε
    at ``details["confidence"]``, clamped at 0.
    """

    mechanism: str
    epsilon: float
    delta: float
    pure: bool
    exact_max_log_ratio: float
    exact_delta: float
    exact_pass: bool
    empirical_lower_bound: float
    empirical_pass: bool
    details: dict[str, Any]
    output_grid_pass: bool = True
    realized_max_log_ratio: float = float("nan")
    realized_delta: float = float("nan")
    realized_pass: bool = True

    @property
    def passed(self) -> bool:
        return self.exact_pass and self.empirical_pass and self.output_grid_pass and self.realized_pass

    def to_json(self) -> dict:
        """One JSON object (``rpwjax audit --json``)."""
        real = self.details.get("realized", {})
        finite = lambda v: v if math.isfinite(v) else str(v)  # noqa: E731 - JSON has no inf
        return {
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "guarantee": self.guarantee,
            "exact_max_log_ratio": finite(self.exact_max_log_ratio),
            "exact_delta": finite(self.exact_delta),
            "exact_pass": self.exact_pass,
            "realized_max_log_ratio": finite(self.realized_max_log_ratio),
            "realized_delta": finite(self.realized_delta),
            "realized_pass": self.realized_pass,
            "output_grid": real.get("output_grid"),
            "output_range": real.get("output_range"),
            "fewest_uniforms_in_a_cell": real.get("fewest_uniforms_in_a_cell"),
            "realized_labels": real.get("labels"),
            "audit_seed": self.details.get("audit_seed"),
            "release_mse_change": real.get("release_mse_change"),
            "empirical_lower_bound": self.empirical_lower_bound,
            "empirical_pass": self.empirical_pass,
            "output_grid_pass": self.output_grid_pass,
            "pass": self.passed,
            "problems": [f"{stage}: {p}" for stage in ("exact", "realized", "empirical", "output_grid")
                         for p in self.details.get(stage, {}).get("problems", [])],
        }

    @property
    def guarantee(self) -> str:
        return "eps-DP" if self.pure else "(eps, delta)-DP"


# --------------------------------------------------------------------------- the printed text


def legend(samples: int, keys: dict, audit_seed: int | None = None) -> str:
    """What each column of :func:`format_table` means (printed under the table)."""
    return (
        f"exact: max log density ratio of the ideal density over a grid of labels and outputs, pass iff <= "
        f"eps + {RATIO_TOLERANCE:g}; (eps, delta)-DP mechanisms: delta(eps) of the privacy-loss profile <= delta."
        f"\nrealized: the exact probability of every value the release path can emit (2^52 uniforms, bisection "
        f"on the monotone sampler), max log ratio over labels, pass iff <= eps + min({realized.REALIZED_TOLERANCE:g}, "
        f"{realized.RELATIVE_TOLERANCE:g}*eps) "
        f"(Gaussian: realized delta <= delta); labels: the range ends, every breakpoint and its float "
        f"neighbours, a grid, and {FRESH_LABELS} fresh random labels"
        + ("" if audit_seed is None else f" (audit seed {audit_seed}; --audit-seed {audit_seed} reproduces them)")
        + "."
        f"\nempirical: {samples} released samples at each of two labels, Clopper-Pearson + Bonferroni lower bound "
        f"on eps at {DEFAULT_CONFIDENCE:.1%} confidence, fail iff > claimed eps."
        f"\ngrid: the public output grid (none: discrete outputs); every released value lies on it and in the "
        f"sidecar's output_range. release MSE change: label MSE of the release against the ideal mechanism."
        f"\nkeys: {keys['key_bits']}-bit block keys, every secret bit reaches them: "
        f"{'yes' if keys['pass'] else 'NO'}"
    )


def record_lines(path, record: dict) -> list[str]:
    """A verified params record in words (``rpwjax audit --params``)."""
    recomputed = record.get("epsilon_mechanism_recomputed")
    lines = [f"record: {path}: states epsilon={record['epsilon']} (prior {record['epsilon_prior']} + mechanism "
             f"{record['epsilon_mechanism']}), delta={record['delta']}, prior {record['prior']}; recomputed from the "
             f"parameters: epsilon_mechanism={recomputed}; checks "
             + ", ".join(f"{k}={'skipped' if v is None else 'yes' if v else 'NO'}" for k, v in record["checks"].items())
             + f"; verified: {'yes' if record['pass'] else 'NO'}"]
    return lines + [f"record: {problem}" for problem in record["problems"]]


def problem_lines(reports, keys, broken) -> list[str]:
    """Every failed check, one line each."""
    out = []
    for r in reports:
        for stage in ("exact", "realized", "empirical", "output_grid"):
            for problem in r.details[stage].get("problems", []):
                out.append(f"{r.mechanism} (epsilon={r.epsilon:g}): {stage}: {problem}")
    out += [f"keys: {problem}" for problem in keys["problems"]]
    return out + list(broken)


def format_table(reports: Sequence[AuditReport]) -> str:
    """The audit table: one row per (mechanism, ε)."""
    head = (
        "mechanism", "guarantee", "claimed eps", "delta", "exact (ideal density)", "realized (as shipped)",
        "empirical eps lower bound", "grid", "release MSE change", "pass",
    )
    rows = []
    for r in reports:
        real = r.details.get("realized", {})
        if r.pure:
            exact = f"{r.exact_max_log_ratio:.9f}"
            shipped = f"{r.realized_max_log_ratio:.9f}"
        else:
            # the ratio of an (ε, δ) mechanism is unbounded: its checks are δ(ε) <= δ
            exact = f"delta(eps)={r.exact_delta:.7g}"
            shipped = f"delta(eps)={r.realized_delta:.7g}"
        change = real.get("release_mse_change")
        rows.append(
            (
                r.mechanism,
                r.guarantee,
                f"{r.epsilon:g}",
                f"{r.delta:g}",
                exact + ("" if r.exact_pass else " NO"),
                shipped + ("" if r.realized_pass else " NO"),
                f"{r.empirical_lower_bound:.4f}" + ("" if r.empirical_pass else " NO"),
                "none" if real.get("output_grid") is None else f"{real['output_grid']:.6g}",
                "-" if change is None else f"{100 * change:+.4f}%",
                "yes" if r.passed else "NO",
            )
        )
    widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(len(head))]
    line = lambda row: "  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])


def _judged_against(report: AuditReport, eps2, delta) -> AuditReport:
    """``report`` re-judged against the epsilon_mechanism and delta a params file states (its checks ran at
    ``params.epsilon``; a file whose two disagree must fail at the stated, smaller one)."""
    if eps2 is None or delta is None:
        return report
    if report.pure:
        exact_pass = report.exact_pass and report.exact_max_log_ratio <= eps2 + RATIO_TOLERANCE
        realized_pass = report.realized_pass and report.realized_max_log_ratio <= eps2 + realized.tolerance(eps2)
    else:
        exact_pass = report.exact_pass and report.exact_delta <= delta * (1 + DELTA_RELATIVE_TOLERANCE)
        realized_pass = report.realized_pass and report.realized_delta <= delta
    empirical_pass = report.empirical_pass and report.empirical_lower_bound <= eps2
    return dataclasses.replace(report, epsilon=float(eps2), delta=report.delta if report.pure else float(delta),
                               exact_pass=bool(exact_pass), realized_pass=bool(realized_pass),
                               empirical_pass=bool(empirical_pass))
