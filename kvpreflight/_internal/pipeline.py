"""One `check` run: open the deployment (`kvpreflight._internal.session`), probe through each entry, judge,
and build the Report. Private to `kvpreflight.preflight`, the library entry that `check`, `demo`,
boot mode and the fleet call, all with a `CheckPlan`; boot mode only adds the log files it captured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from kvpreflight import __version__
from kvpreflight._internal.checkdata import Thresholds
from kvpreflight._internal.checks import Scope, ids_of
from kvpreflight._internal.checks.advisory_data import load_advisories
from kvpreflight._internal.checks.probe_common import outlived_deadlines
from kvpreflight._internal.clock import utc_now
from kvpreflight._internal.engines import EngineError
from kvpreflight._internal.engines.interface import Counters, EngineAdapter
from kvpreflight._internal.probes.budget import Budget, calibrate, calibrate_once
from kvpreflight._internal.probes.capacity import CapacityProber, ProbeSettings, capacity_plan, deployment_limits, near_context_s
from kvpreflight._internal.probes.cost import CostMeter
from kvpreflight._internal.probes.engine_state import EngineState
from kvpreflight._internal.probes.isolation import IsolationSettings, run_isolation
from kvpreflight._internal.probes.isolation_sizes import IsolationSizes
from kvpreflight._internal.probes.prefix_cache import DEFAULT_TIMING_SAMPLES
from kvpreflight._internal.probes.results import IsolationRun, Limits, ProbeRun
from kvpreflight._internal.probes.scenarios import isolation_sizes
from kvpreflight._internal.probes.tenant_prompts import open_tenants
from kvpreflight._internal.request_plan import GroupPlan, GroupPreview
from kvpreflight._internal.session import DeploymentSession, ProbeGroup, open_session
from kvpreflight.check_plan import CheckPlan
from kvpreflight.model import CheckResult, Cost, EngineCost, EngineSnapshot, Report, Role


def run_check(check_plan: CheckPlan, progress: Callable[[str], None] = lambda _: None) -> Report:
    started = utc_now()
    advisories = load_advisories(check_plan.advisory_dirs)
    with open_session(check_plan, progress) as session:
        budget = session.budget(deadline_s=check_plan.deadline_s)
        settings = _settings(check_plan, session.thresholds)
        results: list[CheckResult] = list(session.unreadable)
        state = EngineState(session.adapters)
        counters_before = state.counters() if not check_plan.capacity_only else {}
        probes_started = time.monotonic()
        per_group_ids = ids_of(Scope.GROUP)
        for group in session.groups:
            run, isolation = _probe(session, group, settings, budget, progress)
            results.extend(session.judge(group, run, per_group_ids, isolation=isolation, advisories=advisories,
                                         waivers=check_plan.waivers))
        snapshots = session.snapshots
        cost = None
        if budget.cost.requests:
            cost = engine_cost(snapshots, counters_before, state.counters(), budget.cost, time.monotonic() - probes_started)
        if snapshots:
            results.extend(session.judge_deployment(ids_of(Scope.DEPLOYMENT), advisories=advisories, waivers=check_plan.waivers))
        return Report(
            tool_version=__version__, engines=snapshots, checks=tuple(results), waivers=check_plan.waivers,
            context_length_promised=check_plan.context_length, entry=check_plan.entry, started_at=started,
            finished_at=utc_now(), gpus=tuple(check_plan.gpus), cost=cost,
        )


def engine_cost(snapshots: Sequence[EngineSnapshot], before: Mapping[str, Counters | None],
                after: Mapping[str, Counters | None], meter: CostMeter, wall_s: float) -> Cost:
    """The report's cost block: kvpreflight's own count of what it sent, and each engine's counters
    over the whole check. "Prefilled" is measured only when every engine counts it."""
    def moved(url: str, name: str) -> int | None:
        a, b = after.get(url), before.get(url)
        if a is None or b is None or getattr(a, name) is None or getattr(b, name) is None:
            return None
        return round(getattr(a, name) - getattr(b, name))

    engines = tuple(EngineCost(url=s.url, role=s.role, context_length=s.served_context,
                               prompt_tokens=moved(s.url, "prompt_tokens"), prefilled_tokens=moved(s.url, "prefilled_tokens"),
                               generated_tokens=moved(s.url, "generation_tokens")) for s in snapshots)
    counted = [e.prefilled_tokens for e in engines if e.prefilled_tokens is not None]
    measured = bool(engines) and len(counted) == len(engines)
    if measured:
        prefilled, basis = sum(counted), ("measured: each engine's prompt-token counter less its prefix-cache hits, "
                                          "other traffic it served meanwhile included")
    else:
        silent = [e.url for e in engines if e.prefilled_tokens is None]
        prefilled = max(0, meter.prompt_tokens - meter.cached_tokens)
        basis = ("estimated: prompt tokens submitted less the cached tokens the answers reported "
                 f"({', '.join(silent)} count no prefilled tokens")
        basis += f"; {meter.answers_without_cache_count} served answers did not say what was cached)" \
            if meter.answers_without_cache_count else ")"
    contexts = [s.served_context for s in snapshots if s.served_context]
    return Cost(requests=meter.requests, prompt_tokens_submitted=meter.prompt_tokens, generated_tokens=meter.generated_tokens,
                wall_s=round(wall_s, 3), checked_context=min(contexts) if contexts else None, prefilled_tokens=prefilled,
                measured=measured, basis=basis, engines=engines)


def preview(check_plan: CheckPlan, *, measure: bool, progress: Callable[[str], None] = lambda _: None) -> list[GroupPreview]:
    """`check --plan`: read the engines (as --capacity-only does), derive every probe run's
    requests and, with `measure`, send one short calibration request per entry to estimate the
    duration (an upper estimate: see `calibrate_once`). No other request is sent."""
    with open_session(check_plan, progress) as session:
        settings = _settings(check_plan, session.thresholds)
        out = []
        for group in session.groups:
            entry = group.entry
            plan = group_plan(check_plan, group.entry_url, entry, list(group.snapshots), settings)
            plan.refuse_above(check_plan.max_context_equivalents)  # before the calibration requests
            if plan.not_probed or plan.limits is None or entry is None or not measure:
                why = "not sent (--no-calibrate)" if not measure else "none: no probe request is planned"
                out.append(GroupPreview(plan=plan, calibration=why))
                continue
            budget = Budget(timeout_s=check_plan.timeout_s, fallback_tokens_per_second=session.thresholds.accepted_tokens_per_second)
            engines = list(session.engines_of(group).values())
            try:
                calibration = calibrate_once(entry, engines, budget, max_accepted=plan.limits.max_accepted,
                                             timeout_s=check_plan.timeout_s)
            except EngineError as exc:
                out.append(GroupPreview(plan=plan, calibration=f"failed: {exc}"))
                continue
            sent = "; ".join(f"{c.sent_tokens}-token request, max_tokens {c.max_tokens}{' (streamed)' if c.streamed else ''}"
                             for c in calibration.completions)
            if calibration.speed is None:
                out.append(GroupPreview(plan=plan, calibration=f"sent {sent}; no speed measured: {calibration.failure}"))
                continue
            stated, assumed = outlived_deadlines(group.snapshots, near_context_s(calibration.speed, plan.limits),
                                                 plan.limits.max_accepted)
            out.append(GroupPreview(plan=plan, speed=calibration.speed, calibration=f"sent {sent}",
                                    estimate_s=budget.calibrated(calibration.speed, plan.requests),
                                    outlived=tuple(stated + assumed)))
        return out


def group_plan(check_plan: CheckPlan, entry_url: str | None, entry: EngineAdapter | None, group: Sequence[EngineSnapshot],
               settings: ProbeSettings) -> GroupPlan:
    """Every request one probe run will send, or why it sends none."""
    def none(why: str, limits: Limits | None = None) -> GroupPlan:
        return GroupPlan(entry=entry_url, engines=tuple(s.url for s in group), limits=limits, not_probed=why)

    if check_plan.capacity_only:
        return none("--capacity-only: no request is sent (read-only mode)")
    if not group:
        return none("no engine could be read")
    if entry is None:
        return none("prefill/decode deployment without --entry: probes must go through the client-facing "
                    "router, so capacity was checked but no request was sent; pass --entry URL")
    kinds = {s.engine for s in group}
    if len(kinds) > 1:
        return none(f"the engines behind the entry are of different kinds ({', '.join(sorted(kinds))})")
    limits = deployment_limits(entry, group)
    if limits is None:
        return none("the engines state no served context or request limit, so no probe size can be derived")
    sizes = IsolationSizes.of(limits, group, settings.concurrency)
    # The concurrent requests carry the tenants' canaries and scanned answers (probes/isolation.py).
    requests = (*capacity_plan(limits, settings.concurrency, scan_tokens=sizes.gen,
                               decode=any(s.role is Role.DECODE for s in group)),
                *isolation_sizes(sizes, churn=_churn_allowed(check_plan, group), timing_samples=_timing_samples(check_plan),
                                 only=check_plan.scenarios))
    return GroupPlan(entry=entry_url, engines=tuple(s.url for s in group), limits=limits, requests=requests)


def _timing_samples(check_plan: CheckPlan) -> int:
    return DEFAULT_TIMING_SAMPLES if check_plan.timing_samples is None else check_plan.timing_samples


def _settings(check_plan: CheckPlan, thresholds: Thresholds) -> ProbeSettings:
    return ProbeSettings(concurrency=check_plan.concurrency or thresholds.concurrency,
                         known_markers=check_plan.known_markers)


def _probe(deployment: DeploymentSession, group: ProbeGroup, settings: ProbeSettings, budget: Budget,
           progress: Callable[[str], None]) -> tuple[ProbeRun | None, IsolationRun | None]:
    """The capacity probes, then the two-tenant probes through the same entry and as the same
    tenants: the capacity probes' near-limit requests carry the tenants' canaries, so the
    isolation probes need not send near-limit prompts of their own (issue 14)."""
    check_plan = deployment.plan
    logs = deployment.log_watch(group)  # from where each log stands before anything is asked of the entry
    if check_plan.capacity_only:
        return None, None  # the checks say so
    entry, snapshots = group.entry, list(group.snapshots)
    try:
        plan = group_plan(check_plan, entry.url if entry else None, entry, snapshots, settings)
    except EngineError as exc:
        return _not_probed(ProbeRun(limits=None, not_run=f"probes could not run: {exc}"))
    limits = plan.limits
    if plan.not_probed or limits is None or entry is None:
        return _not_probed(ProbeRun(limits=limits, not_run=plan.not_probed))
    plan.refuse_above(check_plan.max_context_equivalents)  # before any request
    if not budget.may_send():
        return _not_probed(ProbeRun(limits=limits, not_run=f"no probe was sent: {budget.stopped}"))
    engines = deployment.engines_of(group)
    iso_settings = _isolation_settings(check_plan, snapshots, settings)
    session = deployment.probe_session(group, entry=entry, limits=limits, budget=budget, logs=logs, progress=progress)

    def measure() -> None:
        budget.enter("calibration")
        progress("calibrating: a warm-up and two short requests through the entry measure its speed")
        calibration = calibrate(entry, engines.values(), budget, max_accepted=limits.max_accepted,
                                timeout_s=min(check_plan.timeout_s, budget.remaining_s()))
        for retry in calibration.retried:
            progress(f"warning: {retry}")
        if calibration.speed is None:
            budget.stop(f"the engine's speed could not be measured, so it was probed no further: {calibration.failure}")
            return
        estimate = budget.calibrated(calibration.speed, plan.requests)
        deadline = f"; deadline {budget.deadline_s:.0f} s" if budget.deadline_s is not None else ""
        progress(f"measured {calibration.speed.describe()}: {plan.request_count} requests with the calibration, "
                 f"{plan.equivalents(plan.submitted_tokens):.1f} context-equivalents submitted{plan.conditional_text()}; "
                 f"expected to take about {estimate:.0f} s at most{deadline}")
        stated, assumed = outlived_deadlines(snapshots, near_context_s(calibration.speed, limits), limits.max_accepted)
        for said in stated + assumed:  # said before the near-context probes are sent; pd-transfer judges it
            progress(f"warning: {said}")

    try:
        with open_tenants(session, check_plan.auth.tenant_headers, salted=check_plan.auth.tenant_binding is None) as prompts:
            try:
                run = CapacityProber(session, settings, tenants=prompts).run(calibrate=measure)
            except EngineError as exc:
                return _not_probed(ProbeRun(limits=None, not_run=f"probes could not run: {exc}"))
            if run.not_run or run.limits is None:
                return _not_probed(run)
            iso_settings = replace(iso_settings, known_markers=iso_settings.known_markers | run.own_markers)
            return run, run_isolation(replace(session, limits=run.limits), iso_settings, prompts=prompts, shared=run)
    except EngineError as exc:  # the tenants' prompts could not be built: capacity probes without them
        try:
            run = CapacityProber(session, settings).run(calibrate=measure)
        except EngineError as again:
            return _not_probed(ProbeRun(limits=None, not_run=f"probes could not run: {again}"))
        return run, IsolationRun(not_run=f"isolation probes could not run: {exc}")


def _not_probed(run: ProbeRun) -> tuple[ProbeRun, IsolationRun]:
    return run, IsolationRun(not_run=run.not_run or "the capacity limits are unknown, so no isolation probe size can be derived")


def _churn_allowed(check_plan: CheckPlan, group: Sequence[EngineSnapshot]) -> bool:
    return check_plan.allow_disruptive or check_plan.booted or sorted({s.engine for s in group}) == ["builtin"]


def _isolation_settings(check_plan: CheckPlan, group: Sequence[EngineSnapshot], settings: ProbeSettings) -> IsolationSettings:
    kinds = sorted({s.engine for s in group})
    return IsolationSettings(
        churn_allowed=_churn_allowed(check_plan, group),
        churn_not_allowed_reason=(f"disruptive (client disconnects, load near the pool) against a live {', '.join(kinds)} "
                                  "deployment; pass --allow-disruptive to run it (it runs by default with --boot, "
                                  "the demo and builtin engines)"),
        binding=check_plan.auth.tenant_binding or "a cache_salt per tenant", timing_samples=_timing_samples(check_plan),
        known_markers=frozenset(settings.known_markers), concurrency=settings.concurrency,
        selected=frozenset(check_plan.scenarios),
    )
