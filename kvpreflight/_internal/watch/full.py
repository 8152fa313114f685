"""Full rounds (`--full-every`): now and then a round also sends the near-context request and the
over-capacity request that must be hard-rejected, sized as the capacity probes size them
(`probes.capacity.capacity_plan`) and sent by the capacity prober, then judged by `check`'s own
checks (overcapacity-rejected, prompt-integrity): a failure is a `capacity` finding, an
inconclusive verdict is not measured. Nothing here judges a request itself."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from kvpreflight._internal.check_ids import CheckId
from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.interface import EngineAdapter
from kvpreflight._internal.probes.budget import PlannedRequest
from kvpreflight._internal.probes.capacity import capacity_plan
from kvpreflight._internal.probes.results import Limits, ProbeName
from kvpreflight._internal.session import DeploymentSession, ProbeGroup
from kvpreflight._internal.watch.canaries import SYNTHETIC_HEADER, SYNTHETIC_VALUE, synthetic_user
from kvpreflight._internal.watch.findings import Finding, FindingKind
from kvpreflight.model import Status

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

    group: ProbeGroup
    entry: EngineAdapter  # the group's entry
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


def full_targets(session: DeploymentSession) -> tuple[list[FullTarget], list[str]]:
    """What a full round would send through each entry, and why a group can send nothing."""
    targets: list[FullTarget] = []
    missing: list[str] = []
    for group in session.groups:
        if group.entry is None:
            missing.append("full round: a prefill/decode deployment is probed through its router; pass --entry URL")
            continue
        try:
            limits = session.limits(group)
        except EngineError as exc:
            missing.append(f"full round: {group.entry_url}: the limits could not be read: {exc}")
            continue
        if limits is None:
            missing.append(f"full round: {group.entry_url} states no served context or request limit")
            continue
        targets.append(FullTarget(group=group, entry=group.entry, limits=limits, requests=full_requests(limits)))
    return targets, missing


def full_round(session: DeploymentSession, target: FullTarget, stop: threading.Event) -> FullResult:
    """Send the target's two requests through its entry (marked synthetic) and judge them with
    `check`'s checks, through the session's `judge` as `check` does."""
    from kvpreflight._internal.probes.capacity import CapacityProber, ProbeSettings

    if stop.is_set():
        return FullResult(cut_short=True)
    budget = session.budget()
    probes = session.probe_session(target.group, entry=target.entry, limits=target.limits, budget=budget,
                                   headers={SYNTHETIC_HEADER: SYNTHETIC_VALUE})
    try:
        settings = ProbeSettings(concurrency=1, request_fields={"user": synthetic_user(None)})
        run = CapacityProber(probes, settings).send_only(target.requests)
    except EngineError as exc:
        return FullResult(not_measured=(f"full round: {target.entry.url}: the prompts could not be built: {exc}",),
                          requests=budget.cost.requests, prompt_tokens=budget.cost.prompt_tokens)
    findings: list[Finding] = []
    missing: list[str] = []
    notes: list[str] = []
    for result in session.judge(target.group, run, FULL_CHECKS):
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
