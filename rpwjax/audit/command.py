"""What ``rpwjax audit`` runs and prints: the audit of fitted example priors or of a saved fit, as lines.

:func:`audit_lines` returns the table (or JSON Lines), the legend and every
problem, and whether every check passed.
"""

from __future__ import annotations

import json

from rpwjax.audit import checks, verify
from rpwjax.audit.empirical import DEFAULT_SAMPLES
from rpwjax.audit.report import format_table, legend, problem_lines, record_lines
from rpwjax.errors import InputError


def audit_lines(*, mechanism=None, epsilon=None, params=None, samples: int = DEFAULT_SAMPLES, seed: int = 0,
                audit_seed=None, as_json: bool = False) -> tuple[list[str], bool]:
    """``(lines to print, passed)``: a saved fit's audit when ``params`` (a file) is given, else
    :func:`rpwjax.audit.checks.run_audit` of ``mechanism`` (default all) at ``epsilon``."""
    if params is not None:
        if mechanism is not None or epsilon is not None:
            raise InputError("give either --params FILE or --mechanism/--epsilon, not both: a saved fit states its own "
                             "mechanism and epsilon")
        out = verify.audit_params_file(params, samples=samples, seed=seed, audit_seed=audit_seed)
        report, record = out["report"], out["record"]
        if as_json:
            obj = report.to_json() if report is not None else {"mechanism": record["mechanism"]}
            obj.update(params_file=str(params), record_pass=record["pass"], record_problems=record["problems"],
                       verified=record, key_check_pass=out["keys"]["pass"], errors=out["broken"],
                       audit_seed=out["audit_seed"], **{"pass": out["pass"]})
            return [json.dumps(obj)], out["pass"]
        lines = [format_table([report])] if report is not None else []
        lines += ["\n" + legend(samples, out["keys"], out["audit_seed"]), *record_lines(params, record)]
        reports = [report] if report is not None else []
    else:
        out = checks.run_audit(mechanism, epsilon, samples=samples, seed=seed, audit_seed=audit_seed)
        reports = out["reports"]
        if as_json:
            lines = []
            for r in reports:
                obj = r.to_json()
                obj["key_check_pass"] = out["keys"]["pass"]
                obj["pass"] = obj["pass"] and out["keys"]["pass"]
                lines.append(json.dumps(obj))
            lines += [json.dumps({"error": line, "audit_seed": out["audit_seed"], "pass": False})
                      for line in out["broken"]]
            return lines, out["pass"]
        lines = [format_table(reports)] if reports else []
        lines.append("\n" + legend(samples, out["keys"], out["audit_seed"]))
    return lines + problem_lines(reports, out["keys"], out["broken"]), out["pass"]
