"""kv-sources-agree: the pool number must be confirmed by independent origins.

Origins: the allocator's start-up log line, the scheduler's API/metrics, and the observed
accept/reject boundary (only when the pool, not the context, is the binding limit). Two numbers
from one origin are one computation seen twice; a pass needs two origins that agree.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kvpreflight._internal.check_ids import CheckId, Scope
from kvpreflight._internal.checks.interface import CheckContext
from kvpreflight._internal.probes.results import ProbeName, ProbeRun
from kvpreflight.model import CheckResult, EngineSnapshot, ErrorKind, Origin, Status

ID = CheckId.KV_SOURCES_AGREE
SCOPE = Scope.GROUP
MISSING_HINT = {
    Origin.ALLOCATOR: "the allocator's start-up log line (pass --log URL=PATH, or use --boot so kvpreflight owns the log)",
    Origin.SCHEDULER: "the scheduler's API or metrics (enable /metrics or /server_info)",
}
# The same, as short as the report's message says it (MISSING_HINT is in the evidence).
MISSING_FIX = {
    Origin.ALLOCATOR: "--log URL=PATH or --boot (the start-up log)",
    Origin.SCHEDULER: "enable /metrics or /server_info",
}


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    return [_one(ctx, snap) for snap in ctx.snapshots]


def _one(ctx: CheckContext, snap: EngineSnapshot) -> CheckResult:
    tolerance = max(snap.page_size or 1, 1)
    by_origin: dict[Origin, dict[str, int]] = defaultdict(dict)
    problems: list[str] = []
    series: dict[str, set[int]] = defaultdict(set)  # one series = one source at one rank
    for r in snap.pool_readings:
        series[r.label].add(r.tokens)
        # Per source, the smallest rank counts (a request lands on one rank).
        previous = by_origin[r.origin].get(r.source)
        by_origin[r.origin][r.source] = r.tokens if previous is None else min(previous, r.tokens)
    for label, values in series.items():
        if len(values) > 1:
            problems.append(f"{label} reports different values: {sorted(values)}")

    origin_values: dict[str, int] = {}
    for origin, sources in by_origin.items():
        lowest, highest = min(sources.values()), max(sources.values())
        if highest - lowest > tolerance:
            problems.append(f"{origin.value} sources disagree: " + ", ".join(f"{s}={v:,}" for s, v in sources.items()))
        origin_values[origin.value] = lowest

    behaviour, behaviour_note = _behaviour(ctx.probes, snap)
    evidence: dict[str, Any] = {"origins": {o.value: dict(s) for o, s in by_origin.items()}, "tolerance_tokens": tolerance}
    if behaviour is not None:
        evidence["behaviour"] = behaviour
        if behaviour.get("implied_pool_tokens") is not None:
            origin_values[Origin.BEHAVIOUR.value] = behaviour["implied_pool_tokens"]
        if behaviour.get("disagrees"):
            problems.append(behaviour["disagrees"])
    if behaviour_note:
        evidence["behaviour_note"] = behaviour_note

    if len(origin_values) >= 2:
        lo, hi = min(origin_values.values()), max(origin_values.values())
        if hi - lo > tolerance:
            problems.append("origins disagree: " + ", ".join(f"{o}={v:,}" for o, v in origin_values.items()))
    evidence["origin_values"] = origin_values

    if problems:
        return CheckResult(id=ID, status=Status.FAIL, message=f"{snap.role.value} engine: " + "; ".join(problems),
                           endpoint=snap.url, evidence=evidence)
    if not origin_values:
        return CheckResult(id=ID, status=Status.INCONCLUSIVE, message=f"{snap.role.value} engine: no source reported the KV pool",
                           endpoint=snap.url, evidence=evidence)
    if len(origin_values) == 1:
        (only,) = origin_values
        evidence["missing"] = [hint for o, hint in MISSING_HINT.items() if o.value != only]
        fix = " or ".join(hint for o, hint in MISSING_FIX.items() if o.value != only)
        return CheckResult(id=ID, status=Status.WARN,
                           message=f"{snap.role.value} engine: only one origin ({only}) reports the pool; fix: {fix}",
                           endpoint=snap.url, evidence=evidence)
    return CheckResult(id=ID, status=Status.PASS,
                       message=f"{snap.role.value} engine: {len(origin_values)} independent origins agree on "
                       f"{min(origin_values.values()):,} tokens ({', '.join(origin_values)})", endpoint=snap.url, evidence=evidence)


def _behaviour(run: ProbeRun | None, snap: EngineSnapshot) -> tuple[dict | None, str | None]:
    """What the accept/reject boundary says about this engine's pool, if it can say anything."""
    if run is None or run.limits is None or run.not_run:
        return None, None
    accept, reject = run.get(ProbeName.BOUNDARY_ACCEPT), run.get(ProbeName.BOUNDARY_REJECT)
    if accept is None or reject is None:
        return None, None
    limits = run.limits
    binding = limits.pool_bound and snap.pool_tokens() == limits.pool_tokens
    if not binding:
        return None, "the context, not this engine's pool, is the binding limit: the boundary confirms the context only"
    a, r = accept.completion, reject.completion
    facts: dict[str, Any] = {"largest_prompt_sent_accepted": None, "smallest_prompt_sent_rejected": None,
             "predicted_max_accepted": limits.max_accepted}
    ok_a = a.served
    len_rejected_a = a.error_kind is ErrorKind.LENGTH
    ok_r = r.served
    len_rejected_r = r.error_kind is ErrorKind.LENGTH
    if ok_a:
        facts["largest_prompt_sent_accepted"] = a.sent_tokens
    if len_rejected_r:
        facts["smallest_prompt_sent_rejected"] = r.sent_tokens
    if ok_a and len_rejected_r:
        facts["implied_pool_tokens"] = limits.pool_tokens
        return facts, None
    if len_rejected_a:
        facts["disagrees"] = (f"the engine refused {a.sent_tokens:,} tokens as too long although its stated pool "
                              f"({limits.pool_tokens:,}) accepts up to {limits.max_accepted:,}: the real pool is smaller than reported")
        return facts, None
    if ok_r:
        facts["disagrees"] = (f"the engine accepted {r.sent_tokens:,} tokens although its stated pool "
                              f"({limits.pool_tokens:,}) refuses more than {limits.max_accepted:,}")
        return facts, None
    return facts, "the boundary probes gave no length verdict (see overcapacity-rejected)"
