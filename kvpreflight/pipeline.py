"""One `check` run: read every engine, probe through the entry, judge, and build the Report.

Called through `kvpreflight.preflight` by `check`, `demo`, boot mode and the fleet, all with a
`CheckPlan`; boot mode only adds the log files it captured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from kvpreflight import __version__
from kvpreflight.check_plan import CheckPlan
from kvpreflight.checkdata import Thresholds, load_thresholds
from kvpreflight.checks import CheckContext, CheckId, Scope, ids_of, run_checks
from kvpreflight.checks.advisory_data import load_advisories
from kvpreflight.checks.probe_common import outlived_deadlines
from kvpreflight.clock import utc_now
from kvpreflight.engines import EngineConfigError, EngineError, HttpClient, adapter_class, open_adapter
from kvpreflight.engines.interface import Counters, EngineAdapter
from kvpreflight.engines.listeners import from_log
from kvpreflight.engines.openai_completions import openai_entry
from kvpreflight.errors import ConfigError
from kvpreflight.files import FileKind, read_tail
from kvpreflight.model import CheckResult, Cost, EngineCost, EngineSnapshot, EntryApi, ProcessListeners, Report, Role, Status
from kvpreflight.probes.budget import Budget, calibrate, calibrate_once
from kvpreflight.probes.capacity import CapacityProber, ProbeSettings, capacity_plan, deployment_limits, near_context_s
from kvpreflight.probes.cost import CostMeter
from kvpreflight.probes.engine_state import EngineState
from kvpreflight.probes.isolation import IsolationSettings, open_tenants, run_isolation
from kvpreflight.probes.isolation_sizes import IsolationSizes
from kvpreflight.probes.logs import LogWatch
from kvpreflight.probes.prefix_cache import DEFAULT_TIMING_SAMPLES
from kvpreflight.probes.results import IsolationRun, Limits, ProbeRun
from kvpreflight.probes.scenarios import isolation_sizes
from kvpreflight.probes.session import Connection, ProbeSession
from kvpreflight.request_plan import GroupPlan, GroupPreview
from kvpreflight.routers import ROUTERS, RouterListing, open_router, router_class
from kvpreflight.targets import Target


def run_check(check_plan: CheckPlan, progress: Callable[[str], None] = lambda _: None) -> Report:
    started = utc_now()
    thresholds = load_thresholds()
    budget = Budget(timeout_s=check_plan.timeout_s, deadline_s=check_plan.deadline_s,
                    fallback_tokens_per_second=check_plan.accepted_tokens_per_second or thresholds.accepted_tokens_per_second)
    advisories = load_advisories(check_plan.advisory_dirs)
    client = client_of(check_plan)
    try:
        adapters, snapshots, unreadable, listing = read_engines(check_plan, client, progress)
        settings = _settings(check_plan, thresholds)
        results: list[CheckResult] = list(unreadable)
        state = EngineState(adapters)
        counters_before = state.counters() if not check_plan.capacity_only else {}
        probes_started = time.monotonic()
        per_group_ids = ids_of(Scope.GROUP)
        for entry_url, group in probe_groups(check_plan, snapshots):
            entry = entry_adapter(check_plan, entry_url, group, client)
            logs = _log_watch(check_plan, group, adapters, listing)
            run, isolation = _probe(check_plan, entry, group, adapters, settings, budget, progress, logs)
            ctx = CheckContext(tuple(group), thresholds, check_plan.context_length, run, entry_url, advisories,
                               isolation=isolation, entry_model=check_plan.entry_model)
            results.extend(run_checks(ctx, per_group_ids, check_plan.waivers))
        cost = None
        if budget.cost.requests:
            cost = engine_cost(snapshots, counters_before, state.counters(), budget.cost, time.monotonic() - probes_started)
        if snapshots:
            ctx = CheckContext(tuple(snapshots), thresholds, check_plan.context_length, None, check_plan.entry, advisories,
                               expected_model=check_plan.model, listeners=listeners_of(check_plan, snapshots))
            results.extend(run_checks(ctx, ids_of(Scope.DEPLOYMENT), check_plan.waivers))
        return Report(
            tool_version=__version__, engines=tuple(snapshots), checks=tuple(results), waivers=check_plan.waivers,
            context_length_promised=check_plan.context_length, entry=check_plan.entry, started_at=started,
            finished_at=utc_now(), gpus=tuple(check_plan.gpus), cost=cost,
        )
    finally:
        client.close()


def listeners_of(check_plan: CheckPlan, snapshots: Sequence[EngineSnapshot]) -> tuple[ProcessListeners, ...]:
    """Every read engine's listening sockets: as /proc showed them to boot mode, else as its
    start-up log (--log) names them."""
    booted = {p.url: p for p in check_plan.listeners}
    out = list(check_plan.listeners)
    for snapshot in snapshots:
        if snapshot.url in booted:
            continue
        try:
            log_text = _read_log(check_plan.logs.get(snapshot.url))
        except EngineError as exc:
            out.append(ProcessListeners(snapshot.url, snapshot.url, None, unread=f"its start-up log cannot be read: {exc}"))
            continue
        out.append(from_log(snapshot.url, snapshot.url, log_text))
    return tuple(out)


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
    thresholds = load_thresholds()
    client = client_of(check_plan)
    try:
        adapters, snapshots, _, _ = read_engines(check_plan, client, progress)
        settings = _settings(check_plan, thresholds)
        out = []
        for entry_url, group in probe_groups(check_plan, snapshots):
            entry = entry_adapter(check_plan, entry_url, group, client)
            plan = group_plan(check_plan, entry_url, entry, group, settings)
            plan.refuse_above(check_plan.max_context_equivalents)  # before the calibration requests
            if plan.not_probed or plan.limits is None or entry is None or not measure:
                why = "not sent (--no-calibrate)" if not measure else "none: no probe request is planned"
                out.append(GroupPreview(plan=plan, calibration=why))
                continue
            budget = Budget(timeout_s=check_plan.timeout_s, fallback_tokens_per_second=thresholds.accepted_tokens_per_second)
            engines = [adapters[s.url] for s in group if s.url in adapters]
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
            stated, assumed = outlived_deadlines(group, near_context_s(calibration.speed, plan.limits), plan.limits.max_accepted)
            out.append(GroupPreview(plan=plan, speed=calibration.speed, calibration=f"sent {sent}",
                                    estimate_s=budget.calibrated(calibration.speed, plan.requests),
                                    outlived=tuple(stated + assumed)))
        return out
    finally:
        client.close()


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


def client_of(check_plan: CheckPlan) -> HttpClient:
    return _connection(check_plan).client()


def _settings(check_plan: CheckPlan, thresholds: Thresholds) -> ProbeSettings:
    return ProbeSettings(concurrency=check_plan.concurrency or thresholds.concurrency,
                         known_markers=check_plan.known_markers)


def read_engines(check_plan: CheckPlan, client: HttpClient, progress: Callable[[str], None],
                  ) -> tuple[dict[str, EngineAdapter], list[EngineSnapshot], list[CheckResult], RouterListing | None]:
    adapters: dict[str, EngineAdapter] = {}
    snapshots: list[EngineSnapshot] = []
    unreadable: list[CheckResult] = []
    targets, listing = _targets(check_plan, client, progress)
    for target in targets:
        url = target.url.rstrip("/")
        progress(f"reading {url}")
        try:
            adapter = open_adapter(url, client, check_plan.engine)
            log_text = _read_log(check_plan.logs.get(url))
            snapshot = adapter.read(role=target.role, log_text=log_text)
            snapshots.append(listing.applied_to(snapshot) if listing is not None else snapshot)
            adapters[url] = adapter
        except EngineError as exc:
            unreadable.append(CheckResult(id=CheckId.KV_CAPACITY, status=Status.INCONCLUSIVE,
                                          message=f"could not read the engine: {exc}{_wrong_kind_hint(url, client, check_plan.engine)}", endpoint=url))
    return adapters, snapshots, unreadable, listing


def _wrong_kind_hint(url: str, client: HttpClient, named: str) -> str:
    """'; it answers as builtin, not vllm: ...' when --engine named a kind that is not what is there."""
    if named == "auto":
        return ""
    from kvpreflight.engines import answering_kind

    found = answering_kind(url, client, named)
    return f"; it answers as {found}, not {named}: pass --engine {found} or drop --engine" if found else ""


def _log_watch(check_plan: CheckPlan, group: Sequence[EngineSnapshot], adapters: Mapping[str, EngineAdapter],
               listing: RouterListing | None) -> LogWatch:
    """The logs of the group's engines and of the router at the entry, followed while probing."""
    sources = {s.url: (check_plan.logs[s.url], adapters[s.url].log_signals)
               for s in group if s.url in check_plan.logs and s.url in adapters}
    if listing is not None and listing.url in check_plan.logs:
        sources[listing.url] = (check_plan.logs[listing.url], router_class(listing.router).log_signals)
    return LogWatch(sources)


def _targets(check_plan: CheckPlan, client: HttpClient, progress: Callable[[str], None]
             ) -> tuple[tuple[Target, ...], RouterListing | None]:
    """The engines to read, and what the router at the entry lists (None: no entry, or not a
    router kvpreflight knows). Without --endpoint the router's workers are the engines."""
    entry = check_plan.entry.rstrip("/") if check_plan.entry else None
    if entry is None:
        return check_plan.targets, None
    router = open_router(entry, client)
    listing = None
    if router is not None:
        progress(f"asking the {router.kind} router at {entry} for its workers")
        try:
            listing = router.listing()
        except EngineError as exc:
            if not check_plan.targets:
                raise ConfigError(f"--entry {entry}: the {router.kind} router's worker list is unreadable ({exc}); "
                                  "add --endpoint ROLE=URL for every engine behind it") from None
            progress(f"the {router.kind} router's worker list is unreadable ({exc}); using the --endpoint roles")
    if check_plan.targets:
        return check_plan.targets, listing
    if listing is None:
        raise ConfigError(f"--entry {entry} is not a router kvpreflight can ask for its workers ({', '.join(ROUTERS)}); "
                          "add --endpoint URL (or ROLE=URL) for every engine behind it")
    if not listing.workers:
        raise ConfigError(f"--entry {entry}: the {listing.router} router lists no workers ({listing.source}); "
                          "add --endpoint prefill=URL and --endpoint decode=URL for the engines behind it")
    return tuple(Target(w.url) for w in listing.workers), listing


def probe_groups(check_plan: CheckPlan, snapshots: Sequence[EngineSnapshot]) -> list[tuple[str | None, list[EngineSnapshot]]]:
    """Which engines each probe run covers: all of them behind --entry, else each unified engine."""
    if check_plan.entry or any(s.role is not Role.UNIFIED for s in snapshots):
        return [(check_plan.entry.rstrip("/") if check_plan.entry else None, list(snapshots))] if snapshots else []
    return [(s.url, [s]) for s in snapshots]


def entry_adapter(check_plan: CheckPlan, entry_url: str | None, group: list[EngineSnapshot], client: HttpClient
                   ) -> EngineAdapter | None:
    """The adapter every probe request goes through: the engines' kind at the entry's URL (on the
    OpenAI routes for a gateway that serves only those), naming the model they serve, or the
    --entry-model a gateway knows them by (OpenAI-style routes need it). None when there is no entry to probe."""
    if entry_url is None or not group:
        return None
    cls = adapter_class(group[0].engine)
    if check_plan.entry_api is EntryApi.OPENAI:
        cls = openai_entry(cls)
    return cls(entry_url, client, model=check_plan.entry_model or group[0].model)


def _probe(check_plan: CheckPlan, entry: EngineAdapter | None, group: list[EngineSnapshot], adapters: Mapping[str, EngineAdapter],
           settings: ProbeSettings, budget: Budget, progress: Callable[[str], None], logs: LogWatch,
           ) -> tuple[ProbeRun | None, IsolationRun | None]:
    """The capacity probes, then the two-tenant probes through the same entry and as the same
    tenants: the capacity probes' near-limit requests carry the tenants' canaries, so the
    isolation probes need not send near-limit prompts of their own (issue 14)."""
    if check_plan.capacity_only:
        return None, None  # the checks say so
    try:
        plan = group_plan(check_plan, entry.url if entry else None, entry, group, settings)
    except EngineError as exc:
        return _not_probed(ProbeRun(limits=None, not_run=f"probes could not run: {exc}"))
    limits = plan.limits
    if plan.not_probed or limits is None or entry is None:
        return _not_probed(ProbeRun(limits=limits, not_run=plan.not_probed))
    plan.refuse_above(check_plan.max_context_equivalents)  # before any request
    if not budget.may_send():
        return _not_probed(ProbeRun(limits=limits, not_run=f"no probe was sent: {budget.stopped}"))
    engines = {s.url: adapters[s.url] for s in group}
    iso_settings = _isolation_settings(check_plan, group, settings)
    session = ProbeSession(entry=entry, engines=engines, snapshots=tuple(group), limits=limits, budget=budget, logs=logs,
                           progress=progress, connection=_connection(check_plan))

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
        stated, assumed = outlived_deadlines(group, near_context_s(calibration.speed, limits), limits.max_accepted)
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


def _connection(check_plan: CheckPlan) -> Connection:
    return Connection(headers=check_plan.auth.headers, timeout_s=check_plan.timeout_s, ca_bundle=check_plan.auth.ca_bundle,
                      client_cert=check_plan.auth.client_cert, client_key=check_plan.auth.client_key)


def _read_log(path: Path | None) -> str | None:
    if path is None:
        return None
    return read_tail(path, FileKind.LOG, EngineConfigError)
