"""Full rounds (`--full-every`): now and then a round also sends the near-context request and the
over-capacity request that must be hard-rejected, sized as the capacity probes size them
(`probes.capacity.capacity_plan`) and sent by the capacity prober, then judged by `check`'s own
checks (overcapacity-rejected, prompt-integrity): a failure is a `capacity` finding, an
inconclusive verdict is not measured. Nothing here judges a request itself."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvpreflight.check_ids import CheckId
from kvpreflight.check_plan import CheckPlan
from kvpreflight.engines.errors import EngineError
from kvpreflight.engines.http import HttpClient
from kvpreflight.engines.interface import EngineAdapter
from kvpreflight.model import EngineSnapshot, Status
from kvpreflight.probes.budget import PlannedRequest
from kvpreflight.probes.capacity import capacity_plan, deployment_limits
from kvpreflight.probes.results import Limits, ProbeName
from kvpreflight.watch.canaries import SYNTHETIC_HEADER, SYNTHETIC_VALUE, synthetic_user
from kvpreflight.watch.findings import Finding, FindingKind

# The checks that judge a full round's two requests, exactly as they judge `check`'s.
FULL_CHECKS = (CheckId.OVERCAPACITY_REJECTED, CheckId.PROMPT_INTEGRITY)
REQUESTS_PER_FULL_ROUND = 2


def full_requests(limits: Limits) -> tuple[PlannedRequest, PlannedRequest]:
    """The capacity plan's over-capacity request (over the pool where the pool is smaller than the
    served context, the incident's danger zone; else over the context), then its shorter twin at
    the longest prompt the stated limits accept."""
    plan = capacity_plan(limits, 1)
    over = next(p for p in plan if p.name in (ProbeName.OVER_POOL, ProbeName.OVER_CONTEXT))
    near = next(p for p in plan if p.name is ProbeName.BOUNDARY_ACCEPT)
    return over, near


@dataclass(frozen=True, kw_only=True)
class FullTarget:
    """One probe run's entry, the engines behind it, and what a full round sends through it."""

    entry: EngineAdapter
    group: tuple[EngineSnapshot, ...]
    limits: Limits
    requests: tuple[PlannedRequest, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(p.prompt_tokens for p in self.requests)


@dataclass(frozen=True, kw_only=True)
class FullResult:
    findings: tuple[Finding, ...] = ()
    not_measured: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    requests: int = 0
    prompt_tokens: int = 0
    cut_short: bool = False
    skipped: bool = False  # over the hourly cap: nothing was sent


def full_targets(plan: CheckPlan, client: HttpClient, snapshots: Sequence[EngineSnapshot]
                 ) -> tuple[list[FullTarget], list[str]]:
    """What a full round would send through each entry, and why a group can send nothing."""
    from kvpreflight.pipeline import entry_adapter, probe_groups

    targets: list[FullTarget] = []
    missing: list[str] = []
    for entry_url, group in probe_groups(plan, snapshots):
        entry = entry_adapter(plan, entry_url, group, client)
        if entry is None:
            missing.append("full round: a prefill/decode deployment is probed through its router; pass --entry URL")
            continue
        try:
            limits = deployment_limits(entry, group)
        except EngineError as exc:
            missing.append(f"full round: {entry_url}: the limits could not be read: {exc}")
            continue
        if limits is None:
            missing.append(f"full round: {entry_url} states no served context or request limit")
            continue
        targets.append(FullTarget(entry=entry, group=tuple(group), limits=limits, requests=full_requests(limits)))
    return targets, missing


def full_round(plan: CheckPlan, target: FullTarget, engines: Mapping[str, EngineAdapter], stop: threading.Event
               ) -> FullResult:
    """Send the target's two requests through its entry (marked synthetic) and judge them with
    `check`'s checks."""
    from kvpreflight.checkdata import load_thresholds
    from kvpreflight.checks import CheckContext, run_checks
    from kvpreflight.probes.budget import Budget
    from kvpreflight.probes.capacity import CapacityProber, ProbeSettings
    from kvpreflight.probes.session import Connection, ProbeSession

    if stop.is_set():
        return FullResult(cut_short=True)
    thresholds = load_thresholds()
    budget = Budget(timeout_s=plan.timeout_s, fallback_tokens_per_second=plan.accepted_tokens_per_second
                    or thresholds.accepted_tokens_per_second)
    connection = Connection(headers={**plan.auth.headers, SYNTHETIC_HEADER: SYNTHETIC_VALUE}, timeout_s=plan.timeout_s,
                            ca_bundle=plan.auth.ca_bundle, client_cert=plan.auth.client_cert, client_key=plan.auth.client_key)
    http = connection.client()
    try:
        group = {s.url: engines[s.url] for s in target.group if s.url in engines}
        session = ProbeSession(entry=target.entry.with_client(http), engines=group, snapshots=target.group,
                               limits=target.limits, budget=budget, connection=connection)
        try:
            settings = ProbeSettings(concurrency=1, request_fields={"user": synthetic_user(None)})
            run = CapacityProber(session, settings).send_only(target.requests)
        except EngineError as exc:
            return FullResult(not_measured=(f"full round: {target.entry.url}: the prompts could not be built: {exc}",),
                              requests=budget.cost.requests, prompt_tokens=budget.cost.prompt_tokens)
    finally:
        http.close()
    ctx = CheckContext(target.group, thresholds, plan.context_length, run, target.entry.url, entry_model=plan.entry_model)
    findings: list[Finding] = []
    missing: list[str] = []
    notes: list[str] = []
    for result in run_checks(ctx, FULL_CHECKS):
        where = result.endpoint or target.entry.url
        said = f"{where}: {result.id} (full round): {result.message}"
        if result.status is Status.FAIL:
            findings.append(Finding(kind=FindingKind.CAPACITY, what=str(result.id), endpoint=where, message=said))
        elif result.status is Status.INCONCLUSIVE:
            missing.append(said)
        elif result.status is Status.WARN:
            notes.append(said)
    return FullResult(findings=tuple(findings), not_measured=tuple(missing), notes=tuple(notes),
                      requests=budget.cost.requests, prompt_tokens=budget.cost.prompt_tokens, cut_short=stop.is_set())
