"""tenant-isolation: two synthetic tenants never see each other's canary, in any scenario; the
model could have shown one (positive control: each tenant's own canary comes back); every
scenario really happened and left the engines idle with no failed transfers.

Fail closed: a crossing fails; a model that does not echo makes the probe powerless
(inconclusive); a scenario that cannot be shown to have happened is "unconfirmed" (warn).
"""

from __future__ import annotations

from typing import Any

from kvpreflight.checks.interface import CheckContext, isolation_run
from kvpreflight.checks.probe_common import counted_stale_reads, danger_entry, logged_lines, worst_status
from kvpreflight.model import CheckResult, Status
from kvpreflight.probes.results import Expect, Scenario, Tenant, TenantRequest, stale_reads

ID = "tenant-isolation"


def request_evidence(r: TenantRequest) -> dict[str, Any]:
    ev: dict[str, Any] = {"tenant": r.tenant.value, "request": r.name}
    if r.scanned:
        ev["own_canary_seen"] = r.own_seen
    else:
        ev["scanned"] = "no: its answer had no room for a canary; it planted the tenant's canary in the pool"
    if r.abandoned:
        ev["disconnected"] = r.abandoned
        if r.completion is None and r.request_id:  # a served request's id is in its completion's evidence
            ev["request_id"] = r.request_id
    if r.completion is not None:
        ev.update(r.completion.evidence())
    if r.crossings:
        ev["foreign_markers"] = list(r.crossings)
    return ev


def danger_entries(s: Scenario) -> list[dict[str, Any]]:
    return [danger_entry(d, f"logged during the {s.name} scenario") for d in s.danger_lines]


def scenario_verdict(s: Scenario) -> tuple[Status, str]:
    """One scenario's status and a one-line reason (crossings are judged by the caller)."""
    if s.skipped:
        return Status.SKIP, f"{s.name}: not run ({s.skipped})"
    if s.stopped:
        return Status.INCONCLUSIVE, f"{s.name}: {'ran only in part' if s.requests else 'not run'} ({s.stopped})"
    answered = [r for r in s.requests if r.completion is not None]
    if not answered:
        return Status.INCONCLUSIVE, f"{s.name}: no request was answered"
    stuck = sorted(u for u, idle in s.idle_after.items() if idle is False)
    if stuck:
        return Status.FAIL, f"{s.name}: KV pages still held afterwards at {', '.join(stuck)} (not back to idle)"
    tenants_served = {r.tenant for r in s.requests if r.expect is Expect.ACCEPT and r.served}
    if set(Tenant) - tenants_served:
        missing = ", ".join(sorted(t.value for t in set(Tenant) - tenants_served))
        return Status.INCONCLUSIVE, f"{s.name}: no answer of tenant {missing} was served, so nothing of it was scanned"
    stale = [(url, n, f"during the {s.name} scenario") for url, n in stale_reads(s.counter_deltas).items()]
    if s.danger_lines or stale:
        said = f"{s.name}: {len(s.requests)} requests, no crossing{logged_lines(danger_entries(s))}{counted_stale_reads(stale)}"
        return Status.WARN, said if s.occurred is True else f"{said}; {s.occurrence or 'unconfirmed'}"
    if not s.churn:
        moved = {u: {k: v for k, v in d.items() if k in ("transfer_failures", "bootstrap_failures") and v}
                 for u, d in s.counter_deltas.items()}
        moved = {u: d for u, d in moved.items() if d}
        if moved:
            return Status.WARN, f"{s.name}: transfer/bootstrap failure counters moved ({moved})"
    if s.occurred is not True:
        return Status.WARN, f"{s.name}: {s.occurrence or 'unconfirmed'}"
    return Status.PASS, f"{s.name}: {len(s.requests)} requests, no crossing"


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    run = isolation_run(ctx, ID)
    if isinstance(run, CheckResult):
        return [run]
    requests = run.requests()
    evidence: dict[str, Any] = {
        "canaries": {tenant.value: canary for tenant, canary in run.canaries.items()},
        "tenant_binding": run.binding,
        "scenarios": [
            {"scenario": s.name, "purpose": s.purpose, **({"skipped": s.skipped} if s.skipped else {
                "occurrence": s.occurrence, "idle_after": dict(s.idle_after),
                "counter_deltas": {u: dict(d) for u, d in s.counter_deltas.items()},
                "requests": [request_evidence(r) for r in s.requests]}), **({"stopped": s.stopped} if s.stopped else {}),
             **({"danger_lines": danger_entries(s)} if s.danger_lines else {})}
            for s in run.scenarios
        ],
    }
    between = [danger_entry(d, "logged between the scenarios or during the prefix-cache probes") for d in run.untied_danger_lines]
    if between:  # in the evidence of a failure too
        evidence["danger_lines_between_scenarios"] = between
    crossed = [(s, r) for s in run.scenarios for r in s.requests if r.crossings]
    if crossed:
        lines = [f"tenant {r.tenant.label}'s {r.name} ({s.name}) carried {', '.join(r.crossings)}" for s, r in crossed]
        return [CheckResult(ID, Status.FAIL, "canary crossed tenants: " + "; ".join(lines), ctx.entry,
                            {**evidence, "crossings": [{"scenario": s.name, **request_evidence(r)} for s, r in crossed]})]
    results = []
    silent = []
    for tenant in Tenant:
        served = [r for r in requests if r.tenant is tenant and r.served and r.scanned]
        if served and not any(r.own_seen for r in served):
            silent.append(f"tenant {tenant.label}'s {len(served)}")
    if silent:
        results.append((Status.INCONCLUSIVE,
                        f"model does not echo: none of {' or '.join(silent)} served answers repeated the tenant's own "
                        "canary, so a missing foreign canary proves nothing"))
    if not requests or not any(r.served for r in requests):
        results.append((Status.INCONCLUSIVE, "no tenant request was served, nothing was scanned"))
    unhealthy = sorted(u for u, ok in run.healthy_after.items() if not ok)
    if unhealthy:
        results.append((Status.FAIL, f"engine not healthy after the isolation probes: {', '.join(unhealthy)}"))
    stuck = sorted(u for u, idle in run.idle_after.items() if idle is False)
    if stuck:
        results.append((Status.FAIL, f"KV pages still held after the isolation probes at {', '.join(stuck)}"))
    for s in run.scenarios:
        results.append(scenario_verdict(s))
    if between:
        results.append((Status.WARN, f"no scenario was running{logged_lines(between)}"))
    judged = [(st, m) for st, m in results if st is not Status.SKIP]
    worst = worst_status(st for st, _ in judged) if judged else Status.INCONCLUSIVE
    reasons: dict[str, list[str]] = {}
    for s in run.scenarios:
        if s.skipped:
            reasons.setdefault(s.skipped, []).append(s.name)
    skipped = [f"{', '.join(names)}: not run ({why})" for why, names in reasons.items()]
    if worst is Status.PASS:
        ran = [s.name for s in run.scenarios if not s.skipped]
        message = (f"no canary crossed in {len(requests)} requests over {len(ran)} scenarios ({', '.join(ran)}); "
                   "each tenant's own canary came back (the probe could have seen a crossing)")
    else:
        message = "; ".join(m for st, m in judged if st is worst)
    if skipped:
        message += "; " + "; ".join(skipped)
    return [CheckResult(ID, worst, message, ctx.entry, evidence)]
