"""engine-advisories: each engine's kind, version and settings against the advisory data."""

from __future__ import annotations

from kvpreflight.checks.interface import CheckContext
from kvpreflight.model import CheckResult, Role, Status

ID = "engine-advisories"


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    is_pd = any(s.role in (Role.PREFILL, Role.DECODE) for s in ctx.snapshots)
    results = []
    for snap in ctx.snapshots:
        hits, unknown, infos = [], [], []
        for adv in ctx.advisories:
            applies = adv.applies(snap.engine, snap.version, is_pd, snap.settings)
            if applies is None:
                unknown.append(adv)
            elif applies:
                (infos if adv.severity == "info" else hits).append(adv)
        evidence = {
            "engine": snap.engine, "version": snap.version, "pd": is_pd,
            "matched": [{"id": a.id, "severity": a.severity, "title": a.title, "fix": a.fix} for a in hits],
            "notes": [{"id": a.id, "title": a.title} for a in infos],
        }
        if hits:
            status = Status.FAIL if any(a.severity == "fail" for a in hits) else Status.WARN
            message = "; ".join(f"{a.id}: {a.title} (fix: {a.fix})" for a in hits)
        elif unknown:
            status = Status.INCONCLUSIVE
            message = (f"{snap.engine} version unknown, and {len(unknown)} advisory(ies) may apply: "
                       + ", ".join(a.id for a in unknown))
        else:
            status = Status.PASS
            message = f"{snap.engine} {snap.version}: no known advisory applies" + (
                f" ({'; '.join(a.title for a in infos)})" if infos else "")
        results.append(CheckResult(ID, status, message, snap.url, evidence))
    return results
