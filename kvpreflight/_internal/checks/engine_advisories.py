"""engine-advisories: each engine's kind, version and settings against the advisory data."""

from __future__ import annotations

from kvpreflight._internal.check_ids import CheckId, Scope
from kvpreflight._internal.checks.advisory_data import EngineFacts, summarise
from kvpreflight._internal.checks.interface import CheckContext
from kvpreflight.model import CheckResult, Role

ID = CheckId.ENGINE_ADVISORIES
SCOPE = Scope.GROUP


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    is_pd = any(s.role in (Role.PREFILL, Role.DECODE) for s in ctx.snapshots)
    results = []
    for snap in ctx.snapshots:
        facts = EngineFacts(engine=snap.engine, version=snap.version, pd=is_pd, settings=snap.settings)
        subject = f"{snap.engine} {snap.version or '(version unknown)'}"
        # an advisory without a `detect.check` needs something a running engine does not report
        assessments = [a.assess(facts) for a in ctx.advisories if a.detect_check]
        summary = summarise(subject, assessments, static=False)
        review_only = [a.id for a in ctx.advisories if a.engine == snap.engine and not a.detect_check]
        evidence = {"engine": snap.engine, "version": snap.version, "pd": is_pd, **summary.evidence,
                    "not_checked_here": review_only}
        results.append(CheckResult(id=ID, status=summary.status, message=summary.message, endpoint=snap.url, evidence=evidence))
    return results
