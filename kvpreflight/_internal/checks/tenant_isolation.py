"""tenant-isolation: two synthetic tenants never see each other's canary, in any scenario; the
model could have shown one (positive control: each tenant's own canary comes back); every
scenario really happened and left the engines idle with no failed transfers.

Fail closed: a crossing fails; so do a late read (a decode read KV its prefill had released) of a
request that was answered and a violation of the engine's own KV canary; a late read of a request
whose client had left warns (the cancel path); a model that does not echo makes the probe
powerless (inconclusive); a scenario that cannot be shown to have happened is "unconfirmed"
(warn), one that cannot apply to the deployment says so in its evidence ("not_applicable").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from kvpreflight._internal.check_ids import CheckId, Scope
from kvpreflight._internal.checks.interface import CheckContext, isolation_run
from kvpreflight._internal.checks.probe_common import (
    CANARY_MEANING,
    CANCEL_PATH_MEANING,
    EchoScope,
    canary_finding,
    danger_entry,
    echo_evidence,
    expiry_finding,
    late_read_finding,
    logged_lines,
    worst_status,
)
from kvpreflight._internal.probes.results import (
    DangerLine,
    Expect,
    Scenario,
    Tenant,
    TenantRequest,
    counter_moved,
    deltas_evidence,
    stale_reads,
)
from kvpreflight.model import CheckResult, CounterField, EngineSnapshot, Hazard, Status

ID = CheckId.TENANT_ISOLATION
SCOPE = Scope.GROUP


def request_evidence(r: TenantRequest) -> dict[str, Any]:
    ev: dict[str, Any] = {"tenant": r.tenant.value, "request": r.name}
    if not r.scanned:
        ev["scanned"] = "no: its answer had no room for a canary; it planted the tenant's canary in the pool"
    elif r.served:  # the positive control is about answers; a refusal (HTTP 200 in a stream too) has none
        ev["own_canary_seen"] = r.own_seen
        ev.update(echo_evidence(r.echo))
    if r.abandoned:
        ev["disconnected"] = r.abandoned
        if r.completion is None:  # a served request's id and size are in its completion's evidence
            ev["sent_tokens"] = r.abandoned_tokens
            if r.request_id:
                ev["request_id"] = r.request_id
    if r.completion is not None:
        ev.update(r.completion.evidence())
    if r.crossings:
        ev["foreign_markers"] = list(r.crossings)
    return ev


def danger_entries(s: Scenario) -> list[dict[str, Any]]:
    return [danger_entry(d, f"logged during the {s.name} scenario") for d in s.danger_lines]


def names_abandoned(line: DangerLine, requests: Sequence[TenantRequest]) -> bool:
    """The line names one of the requests whose client left on purpose."""
    return bool(line.request_id) and any(r.abandoned and r.request_id and r.request_id in (line.request_id or "")
                                         for r in requests)


def names_ours(line: DangerLine, requests: Sequence[TenantRequest]) -> bool:
    """The line names one of the check's requests (behind vllm-router it names the router's id instead)."""
    return bool(line.request_id) and any(r.request_id and r.request_id in (line.request_id or "") for r in requests)


def abandoned_late_reads(scenarios: Sequence[Scenario], between: Sequence[DangerLine]) -> set[int]:
    """Which late-read lines (by id()) belong to requests whose clients left on purpose. A line that
    names one of them does; a line that names no request of ours (vLLM's ids replaced by a router)
    is counted against the abandoned requests not yet accounted for, in the order the lines came
    (a disconnect scenario's window first, then between scenarios, where vLLM logs a read that
    ended after its scenario): one late read per abandoned request at most. Any other late read,
    and one past that count, is an answered request's (a fail): never more forgiven than left."""
    requests = [r for s in scenarios for r in s.requests]
    late: list[tuple[Scenario | None, DangerLine]] = [(s, d) for s in scenarios for d in s.danger_lines
                                                      if d.hazard is Hazard.LATE_READ]
    late += [(None, d) for d in between if d.hazard is Hazard.LATE_READ]
    named = {id(d) for _, d in late if names_abandoned(d, requests)}
    allowance = sum(1 for r in requests if r.abandoned) - len(named)
    untied = set()
    for scenario, d in late:
        if id(d) in named or names_ours(d, requests) or allowance <= 0:
            continue
        if scenario is None or any(r.abandoned for r in scenario.requests):
            untied.add(id(d))
            allowance -= 1
    return named | untied


def late_read_verdict(s: Scenario, snapshots: Sequence[EngineSnapshot],
                      abandoned: set[int] | None = None) -> tuple[Status, str] | None:
    """A decode read KV its prefill had released during this scenario: a failure when the request
    was answered; a warning when it was one whose client had left (a disconnect scenario), or a
    read the counter alone shows there. None when nothing read late. `abandoned`: the late-read
    lines of the whole run that belong to abandoned requests (abandoned_late_reads); by default
    this scenario's alone."""
    abandoned = abandoned_late_reads([s], ()) if abandoned is None else abandoned
    late = [d for d in s.danger_lines if d.hazard is Hazard.LATE_READ]
    counted = [(url, n, f"during the {s.name} scenario") for url, n in stale_reads(s.counter_deltas).items()]
    disconnects = any(r.abandoned for r in s.requests)
    left = [d for d in late if id(d) in abandoned]
    answered = [d for d in late if d not in left]
    when = f"logged during the {s.name} scenario"
    # the scenario's other lines (an expired lease, a transfer error) are quoted with the verdict: it is all the user reads
    others = logged_lines([danger_entry(d, when) for d in s.danger_lines if d.hazard is not Hazard.LATE_READ])
    if answered or (counted and not disconnects):
        said = late_read_finding([danger_entry(d, when) for d in answered], [] if disconnects else counted, snapshots)
        return Status.FAIL, f"{s.name}: {said}{others}"
    said = late_read_finding([danger_entry(d, when) for d in left], counted, snapshots, CANCEL_PATH_MEANING)
    return None if said is None else (Status.WARN, f"{s.name}: {said}{others}")


def scenario_verdict(s: Scenario, snapshots: Sequence[EngineSnapshot] = (),
                     abandoned: set[int] | None = None) -> tuple[Status, str]:
    """One scenario's status and a one-line reason (crossings are judged by the caller)."""
    if s.skipped:
        return Status.SKIP, f"{s.name}: not run ({s.skipped})"
    canary = canary_finding([danger_entry(d, f"logged during the {s.name} scenario") for d in s.danger_lines
                             if d.hazard is Hazard.KV_CANARY])
    if canary is not None:
        return Status.FAIL, f"{s.name}: {canary}"
    late = late_read_verdict(s, snapshots, abandoned)
    if late is not None and late[0] is Status.FAIL:
        return late
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
    # Fail closed: a crossing could have hidden in any answer the deployment did not give (a router
    # answering HTTP 503 for most of a scenario once left 1 of its 28 requests answered).
    if unanswered := [r.unanswered for r in s.requests if r.unanswered]:
        counts = Counter(unanswered)
        return Status.INCONCLUSIVE, (f"{s.name}: {len(unanswered)} of {len(s.requests)} requests got no answer ("
                                     + ", ".join(f"{why} x{n}" for why, n in counts.most_common())
                                     + "), so the scenario ran only in part")
    if late is not None:
        return Status.WARN, late[1] if s.occurred is True else f"{late[1]}; {s.occurrence or 'unconfirmed'}"
    expired = [(url, n, f"during the {s.name} scenario") for url, n in counter_moved(s.counter_deltas, CounterField.EXPIRED_KV).items()]
    expiry = expiry_finding([], expired)  # the expiry lines are quoted with the scenario's other lines
    if s.danger_lines or expiry:
        said = f"{s.name}: {len(s.requests)} requests, no crossing{logged_lines(danger_entries(s))}"
        if expiry is not None:
            said += f"; {expiry}"
        return Status.WARN, said if s.occurred is True else f"{said}; {s.occurrence or 'unconfirmed'}"
    if not s.churn:
        moved = {u: {f.value: v for f in (CounterField.TRANSFER_FAILURES, CounterField.BOOTSTRAP_FAILURES) if (v := d.get(f))}
                 for u, d in s.counter_deltas.items()}
        moved = {u: d for u, d in moved.items() if d}
        if moved:
            return Status.WARN, f"{s.name}: transfer/bootstrap failure counters moved ({moved})"
    if s.occurred is not True:
        return Status.WARN, f"{s.name}: {s.occurrence or 'unconfirmed'}"
    return Status.PASS, f"{s.name}: {len(s.requests)} requests, no crossing"


def between_verdict(lines: Sequence[DangerLine], entries: Sequence[Mapping[str, Any]],
                    snapshots: Sequence[EngineSnapshot], abandoned: set[int]) -> tuple[Status, str]:
    """Lines logged while no scenario ran (vLLM logs a late read when the decode's read ends, which
    can be after the scenario, or during the prefix-cache probes): a late read there fails unless
    it belongs to a request whose client had left (abandoned_late_reads)."""
    canary = canary_finding([e for d, e in zip(lines, entries, strict=True) if d.hazard is Hazard.KV_CANARY])
    if canary is not None:
        return Status.FAIL, f"no scenario was running: {canary}"
    late = [(d, e) for d, e in zip(lines, entries, strict=True) if d.hazard is Hazard.LATE_READ]
    others = logged_lines([e for d, e in zip(lines, entries, strict=True) if d.hazard is not Hazard.LATE_READ])
    answered = [e for d, e in late if id(d) not in abandoned]
    if answered:
        return Status.FAIL, f"no scenario was running: {late_read_finding(answered, [], snapshots)}{others}"
    left = [e for d, e in late if id(d) in abandoned]
    if left:
        return Status.WARN, f"no scenario was running: {late_read_finding(left, [], snapshots, CANCEL_PATH_MEANING)}{others}"
    return Status.WARN, f"no scenario was running{logged_lines(entries)}"


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
                "counter_deltas": deltas_evidence(s.counter_deltas),
                "requests": [request_evidence(r) for r in s.requests]}), **({"stopped": s.stopped} if s.stopped else {}),
             **({"danger_lines": danger_entries(s)} if s.danger_lines else {}),
             **({"not_applicable": s.not_applicable} if s.not_applicable else {}),
             **({"not_probed": s.not_probed} if s.not_probed else {})}
            for s in run.scenarios
        ],
    }
    between = [danger_entry(d, "logged between the scenarios or during the prefix-cache probes") for d in run.untied_danger_lines]
    if between:  # in the evidence of a failure too
        evidence["danger_lines_between_scenarios"] = between
    abandoned = abandoned_late_reads(run.scenarios, run.untied_danger_lines)
    crossed = [(s, r) for s in run.scenarios for r in s.requests if r.crossings]
    if crossed:
        lines = [f"tenant {r.tenant.label}'s {r.name} ({s.name}) carried {', '.join(r.crossings)}" for s, r in crossed]
        lines += [said for st, said in (scenario_verdict(s, ctx.snapshots, abandoned) for s in run.scenarios)
                  if st is Status.FAIL and CANARY_MEANING in said]  # the engine's own detector saw it too
        return [CheckResult(id=ID, status=Status.FAIL, message="canary crossed tenants: " + "; ".join(lines), endpoint=ctx.entry,
                            evidence={**evidence, "crossings": [{"scenario": s.name, **request_evidence(r)} for s, r in crossed]})]
    results = []
    # Each answer on its own: where the model echoes, one that repeats nothing of its own prompt was
    # computed from other KV. The per-tenant control below cannot see it when other answers echoed.
    scope = EchoScope.of(ctx)
    for s in run.scenarios:
        for r in s.requests:
            if r.served and r.scanned and (said := scope.not_from_prompt(r.echo, f"tenant {r.tenant.label}'s {r.name} ({s.name})")):
                results.append((Status.FAIL, said))
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
        results.append(scenario_verdict(s, ctx.snapshots, abandoned))
    if between:
        results.append(between_verdict(run.untied_danger_lines, between, ctx.snapshots, abandoned))
    judged = [(st, m) for st, m in results if st is not Status.SKIP]
    worst = worst_status(st for st, _ in judged) if judged else Status.INCONCLUSIVE
    reasons: dict[str, list[str]] = {}
    for s in run.scenarios:
        # a scenario that cannot apply, or one not probed by design (late-decode's long lease), is
        # said in the evidence only: neither is a step the user could take to make the check see more
        if s.skipped and not s.not_applicable and not s.not_probed:
            reasons.setdefault(s.skipped, []).append(s.name)
    skipped = [f"{', '.join(names)}: not run ({why})" for why, names in reasons.items()]
    if worst is Status.PASS:
        ran = [s.name for s in run.scenarios if not s.skipped]
        message = (f"no canary crossed in {len(requests)} requests over {len(ran)} scenarios ({', '.join(ran)}); "
                   "every scanned answer repeated its own prompt (the probe could have seen a crossing)")
    else:
        message = "; ".join(m for st, m in judged if st is worst)
        # What warned, or could not be shown, beside a fail is still said (after it): a late read
        # in one scenario does not hide another scenario's.
        lesser = [m for st, m in judged if st is not worst and st is not Status.PASS]
        if lesser:
            message += "; also: " + "; ".join(lesser)
    if skipped:
        message += "; " + "; ".join(skipped)
    return [CheckResult(id=ID, status=worst, message=message, endpoint=ctx.entry, evidence=evidence)]
