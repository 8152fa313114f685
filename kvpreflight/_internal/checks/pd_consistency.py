"""pd-consistency: the engines of one deployment serve the same model, context and page size."""

from __future__ import annotations

from kvpreflight._internal.check_ids import CheckId, Scope
from kvpreflight._internal.checks.interface import CheckContext
from kvpreflight.model import CheckResult, Status

ID = CheckId.PD_CONSISTENCY
SCOPE = Scope.DEPLOYMENT


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    wrong = [s for s in ctx.snapshots if ctx.expected_model and s.model != ctx.expected_model]
    if wrong:
        return [CheckResult(id=ID, status=Status.FAIL,
                            message="; ".join(f"{s.url} serves {s.model!r}, not --model {ctx.expected_model!r}" for s in wrong),
                            endpoint=None, evidence={"expected_model": ctx.expected_model})]
    if len(ctx.snapshots) < 2:
        return [CheckResult(id=ID, status=Status.PASS, message="one engine: nothing to compare", endpoint=None)]
    problems, evidence = [], {}
    for field in ("model", "served_context", "page_size", "engine"):
        values = {s.url: getattr(s, field) for s in ctx.snapshots}
        evidence[field] = values
        distinct = {v for v in values.values() if v is not None}
        if len(distinct) > 1:
            problems.append(f"{field} differs: " + ", ".join(f"{u}={v}" for u, v in values.items()))
    if problems:
        return [CheckResult(id=ID, status=Status.FAIL, message="; ".join(problems), endpoint=None, evidence=evidence)]
    # Model and context are what a handoff depends on: unknown on one engine is not "the same".
    unknown = [f"{field} unknown at {url}" for field in ("model", "served_context")
               for url, value in evidence[field].items() if value is None]
    if unknown:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE, message="cannot compare the engines: " + "; ".join(unknown),
                            endpoint=None, evidence=evidence)]
    return [CheckResult(id=ID, status=Status.PASS, message=f"{len(ctx.snapshots)} engines serve the same model, context and page size",
                        endpoint=None, evidence=evidence)]
