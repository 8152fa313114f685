"""The two-tenant isolation prober: synthetic tenants A and B, each with a fresh canary, sent
through the entry in the scenarios probes/scenarios.py declares (what each sends, in which order),
then the prefix-cache controls (probes/prefix_cache.py: cold, same-tenant warm, cross-tenant).
Every response is scanned for the other tenant's canary (whole or a fragment) and for any other
synthetic marker. The prober records; it never judges. How large each request is:
probes/isolation_sizes.py.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.interface import EngineAdapter, PrefillLeg, SplitLegs
from kvpreflight._internal.probes import occurrence
from kvpreflight._internal.probes import scenarios as declaration
from kvpreflight._internal.probes.budget import TINY_TOKENS
from kvpreflight._internal.probes.capacity import HEALTH_MAX_TOKENS, HEALTH_PROMPT
from kvpreflight._internal.probes.disconnect import (
    UNIFIED_CANCEL_AFTER_S,
    Departure,
    RawTarget,
    leave_after_first_token,
    leave_during_transfer,
)
from kvpreflight._internal.probes.engine_state import EngineState, counter_deltas
from kvpreflight._internal.probes.isolation_sizes import MIN_SCAN_TOKENS, IsolationSizes
from kvpreflight._internal.probes.late_decode import HeldLegs, held_legs
from kvpreflight._internal.probes.logs import name_lines
from kvpreflight._internal.probes.markers import echo_of, foreign_markers
from kvpreflight._internal.probes.prefix_cache import (
    DEFAULT_TIMING_SAMPLES,
    caching_off,
    probe_prefix_cache,
)
from kvpreflight._internal.probes.results import (
    DangerLine,
    Expect,
    IsolationRun,
    ProbeName,
    ProbeResult,
    ProbeRun,
    Scenario,
    Tenant,
    TenantRequest,
)
from kvpreflight._internal.probes.scenarios import (
    LATE_DECODE_MARGIN_S,
    LATE_DECODE_MAX_WAIT_S,
    Evidence,
    Leave,
    Leg,
    ScenarioRequest,
    ScenarioSpec,
)
from kvpreflight._internal.probes.session import ProbeSession
from kvpreflight._internal.probes.tenant_prompts import open_tenants
from kvpreflight._internal.probes.tenants import TenantPrompts
from kvpreflight._internal.probes.tokens import valid_token_ids
from kvpreflight.model import Completion, CounterDelta, CounterDeltas, CounterField, Role

FRESH_OFFSET_FIRST = 2  # fresh prompts start 2, 3, ... tokens into the canaries (fewer than one canary's tokens)
IDLE_WAIT_S = 12.0  # a cancelled bootstrap may hold pages ~10 s on SGLang-like engines
A, B = Tenant.A, Tenant.B


def in_part(shown: str, requests: Sequence[TenantRequest]) -> str:
    """A scenario's occurrence, said as "in part" where some of its requests got no answer."""
    missed = sum(1 for r in requests if r.unanswered)
    return f"{shown}, in part: {missed} of {len(requests)} requests got no answer" if missed else shown


def over_windows(windows: Iterable[CounterDeltas]) -> dict[str, CounterDelta]:
    """Each engine's counters over several windows, summed. A counter is known only where every
    window read it at both ends, and an engine only where every window read it: a sum that left
    out an unread window would show less than moved (a stale read or a transfer failure in it),
    so what one window could not see stays unknown, never a smaller figure."""
    windows = list(windows)
    urls = set.intersection(*(set(w) for w in windows)) if windows else set()
    out = {}
    for url in sorted(urls):
        deltas = [w[url] for w in windows]
        read = {f: [v for d in deltas if (v := d.get(f)) is not None] for f in CounterField}
        moved = {f: sum(values) for f, values in read.items() if len(values) == len(deltas)}
        extra = {key: sum(d.extra[key] for d in deltas) for key in deltas[0].extra if all(key in d.extra for d in deltas)}
        out[url] = CounterDelta.of(moved, extra)
    return out


@dataclass(frozen=True)
class IsolationSettings:
    churn_allowed: bool = False
    churn_not_allowed_reason: str = ""
    binding: str = "cache_salt"
    timing_samples: int = DEFAULT_TIMING_SAMPLES  # per kind, for the timing audit where cache counters are silent
    known_markers: frozenset[str] = frozenset()  # other synthetic markers in play (capacity probes, demo)
    concurrency: int = 2  # the capacity probes' concurrent requests (the load scenario where they fill the pool)
    selected: frozenset[str] = frozenset()  # only these scenarios (--scenario); empty: all


class IsolationProber:
    """`shared`: the capacity probes' run, whose near-limit requests carried these tenants'
    canaries (CapacityProber with `tenants`): a scenario they carry (boundary; load where the
    concurrent pair fills the pool) is read from them. Without them it sends its own requests."""

    def __init__(self, session: ProbeSession, settings: IsolationSettings, prompts: TenantPrompts,
                 shared: ProbeRun | None = None, scenarios: Sequence[ScenarioSpec] | None = None) -> None:
        self.session = session
        self.tenants = dict(prompts.clients)
        self.logs = session.logs
        self._untied: list[DangerLine] = []  # logged between scenarios or during the prefix-cache probes
        self.engines = session.engines
        self.state = EngineState(session.engines)
        self.snapshots = list(session.snapshots)
        self.settings = settings
        self.budget = session.budget
        self.progress = session.progress
        self.canaries = dict(prompts.canaries)
        self.heads = dict(prompts.heads)
        self._ids = dict(prompts.ids)
        self.shared = [p for p in shared.probes if p.tenant is not None] if shared is not None else []
        self.shared_idle = shared.idle_after if shared is not None else {}
        self.sizes = IsolationSizes.of(session.limits, session.snapshots, settings.concurrency)
        self.gen = self.sizes.gen
        self.longest = self.sizes.longest
        self.min_pool = self.sizes.min_pool
        self.scenarios = tuple(declaration.declared(self.sizes) if scenarios is None else scenarios)
        self._held: HeldLegs | None = None  # late-decode's legs, while it runs
        self._prefill_legs: dict[Tenant, tuple[PrefillLeg, float]] = {}  # its prefill leg's answer, and when
        self._decode_after_s = 0.0  # how long after the prefill leg's answer its decode leg went
        # where the next fresh prompt starts in its tenant's canaries (1 is the unified abandon's)
        self._fresh_offsets = iter(range(FRESH_OFFSET_FIRST, 1 << 30))

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> IsolationRun:
        scenarios = []
        for spec in self.scenarios:
            if self.settings.selected and spec.name not in self.settings.selected:
                scenarios.append(Scenario(name=spec.name, purpose=spec.purpose, churn=spec.churn,
                                          skipped=f"not selected (--scenario {', '.join(sorted(self.settings.selected))})"))
            elif spec.churn and not self.settings.churn_allowed:
                scenarios.append(Scenario(name=spec.name, purpose=spec.purpose, skipped=self.settings.churn_not_allowed_reason,
                                          churn=True))
            else:
                scenarios.append(self._run_scenario(spec))
        if self.budget.may_send():  # a step that will not run is not announced
            self.progress("isolation: prefix cache (cold, same-tenant warm, cross-tenant)")
        self.budget.enter("the prefix-cache probes")
        cache = probe_prefix_cache(self.tenants, self.state, self._token_ids, longest=self.longest,
                                   tokens=self.sizes.cache_tokens, prefixes=self.sizes.cache_prefixes, budget=self.budget,
                                   binding=self.settings.binding, off=caching_off(self.snapshots),
                                   timing_samples=self.settings.timing_samples)
        self._prefill_notices()
        self.budget.wait_idle(self.state, IDLE_WAIT_S)
        small = self._small_request()
        # Read even when probing stopped (as after the capacity probes): a /health read sends no
        # completion, and an engine the scenarios wedged or killed is a finding.
        healthy = {url: adapter.healthy() for url, adapter in self.engines.items()}
        idle = self.budget.wait_idle(self.state, IDLE_WAIT_S)
        self._untied.extend(self.logs.take())
        # A line logged late (vLLM: up to a lease after the request) still names its request.
        ids = {r.request_id: f"tenant {r.tenant.value}'s request {r.name} ({s.name})"
               for s in scenarios for r in s.requests if r.request_id}
        untied = name_lines(self._untied, ids, other="one of kvpreflight's requests outside the isolation scenarios")
        return IsolationRun(scenarios=tuple(scenarios), cache=cache, canaries=dict(self.canaries),
                            binding=self.settings.binding, healthy_after=healthy, idle_after=idle,
                            untied_danger_lines=untied, small_request_after=small, stopped=self.budget.stopped,
                            not_answering=self.budget.not_answering)

    def _small_request(self) -> Completion | None:
        """The check's last request, through the entry: does the engine still serve after every
        probe? None where the run stopped, or the deadline ran out under it (no verdict)."""
        if not self.budget.may_send():
            return None
        entry = self.session.entry
        ids = self._token_ids(entry, HEALTH_PROMPT, "kvpreflight health check after the isolation probes")
        small = self.budget.send(entry, ids, max_tokens=HEALTH_MAX_TOKENS, stream=False,
                                 timeout_s=self.budget.request_s(HEALTH_PROMPT, Expect.ACCEPT, max_tokens=HEALTH_MAX_TOKENS))
        return None if self.budget.ended_by_deadline(small) else small

    def _prefill_notices(self) -> None:
        """One tiny plain request straight to each prefill that reads its decodes' transfer
        notifications only when it steps: without it, a late read on the check's last request (its
        log line, its counter) would show only at the prefill's next request, after the check."""
        for snap in self.snapshots:
            adapter = self.engines.get(snap.url)
            if snap.role is not Role.PREFILL or adapter is None or not adapter.notices_late_reads_when_stepping:
                continue
            if not self.budget.may_send():
                return
            ids = self._token_ids(adapter, TINY_TOKENS, "kvpreflight prefill notices")
            self.budget.send(adapter, ids, max_tokens=1, stream=False,
                             timeout_s=self.budget.request_s(TINY_TOKENS, Expect.ACCEPT))

    # -- scenarios -----------------------------------------------------------------------------
    def _run_scenario(self, spec: ScenarioSpec) -> Scenario:
        if spec.carried_by and self.shared and (carried := self._from_capacity(spec)) is not None:
            return carried
        if spec.evidence is Evidence.READ_AFTER_LEASE:
            return self._late_decode(spec)
        deferred_before = (self.state.total(lambda c: c.deferred_releases)
                           if spec.evidence is Evidence.LEFT_MID_TRANSFER else None)
        notes: list[str] = []
        scenario = self._scenario(spec, lambda: self._steps(spec, notes))
        if spec.evidence is Evidence.LEFT_MID_TRANSFER:
            pd = any(s.role is not Role.UNIFIED for s in self.snapshots)
            deferred = (deferred_before, self.state.total(lambda c: c.deferred_releases))
            return occurrence.left_mid_transfer(scenario, pd=pd, deferred=deferred, notes=notes)
        if spec.evidence is Evidence.LEFT_AFTER_TOKEN:
            return occurrence.left_after_token(scenario, notes)
        if spec.evidence is Evidence.POOL_FILLED:
            return occurrence.pool_filled(scenario, spec, self.min_pool)
        return scenario

    def _steps(self, spec: ScenarioSpec, notes: list[str]) -> list[TenantRequest | None]:
        """Send the scenario's steps as declared: each step's requests at once."""
        out: list[TenantRequest | None] = []
        for step in spec.steps:
            at_once = len(step.requests)
            if at_once == 1:
                out.append(self._request(step.requests[0], 1, notes))
            else:
                with ThreadPoolExecutor(max_workers=at_once) as pool:
                    futures = [pool.submit(self._request, r, at_once, notes) for r in step.requests]
                    out.extend(f.result() for f in futures)
            if step.pause_s:
                time.sleep(step.pause_s)
            if step.outwait_lease and self._held is not None:
                time.sleep(self._held.wait_s)
            if step.settle:
                self.budget.wait_idle(self.state, IDLE_WAIT_S)
        return out

    def _request(self, r: ScenarioRequest, at_once: int, notes: list[str]) -> TenantRequest | None:
        if r.leg is not None:
            return self._leg(r, notes)
        if r.leave is None:
            return self._send(r.tenant, r.name, r.prompt_tokens, expect=r.expect, max_tokens=r.max_tokens, at_once=at_once,
                              stream=r.stream, offset=next(self._fresh_offsets) if r.fresh_prefix else 0)
        return self._abandon(r, notes)

    def _from_capacity(self, spec: ScenarioSpec) -> Scenario | None:
        """The scenario as the capacity probes that carried the tenants' canaries ran it; None
        where they did not serve it, so it sends its own requests."""
        probes = [p for p in self.shared if p.probe in spec.carried_by]
        if spec.evidence is Evidence.POOL_FILLED:
            if {p.tenant for p in probes} != {A, B} or not all(p.completion.served for p in probes):
                return None
            kv = sum(p.completion.sent_tokens + p.completion.max_tokens for p in probes)
            c = probes[0].completion
            return replace(self._carried(spec, probes, ""), occurred=True,
                           occurrence=f"requests at once: {len(probes)} x ({c.sent_tokens:,} prompt + {c.max_tokens:,} answer) = "
                                      f"{kv:,} tokens against a {self.min_pool:,}-token pool (the concurrent-capacity "
                                      "requests, one per tenant)")
        carried = self._carried(spec, probes, f"{spec.shown}: the capacity probes' near-limit requests carried their "
                                "canaries (boundary-accept: a; concurrent: a and b)")
        scanned = {r.tenant for r in carried.requests if r.served and r.scanned}
        missing = [t for t in (A, B) if t not in scanned]
        if not missing:
            return carried
        # The concurrent pair was not served for every tenant (it fails concurrent-capacity):
        # the missing tenant's request at the longest prompt is sent here, so the scenario still scans both.
        if not self.budget.may_send():
            return replace(carried, stopped=self.budget.stopped)
        names = ", ".join(t.value for t in missing)
        self.progress(f"isolation: {spec.name} (for tenant {names})")
        extra = [r for t in missing if (r := self._send(t, f"{spec.name}-{t.value}", self.longest)) is not None]
        return replace(carried, requests=carried.requests + tuple(extra),
                       occurred=True if carried.requests or extra else None,
                       occurrence=(f"{spec.shown} (tenant {names}: its own {spec.name} request, as the concurrent pair "
                                   "did not serve it)"),
                       stopped=self.budget.stopped if len(extra) < len(missing) else None)

    # -- late-decode ---------------------------------------------------------------------------
    def _late_decode(self, spec: ScenarioSpec) -> Scenario:
        held = held_legs(self.snapshots, self.engines)
        if isinstance(held, str):
            return Scenario(name=spec.name, purpose=spec.purpose, skipped=held, not_applicable=held, churn=True)
        if held.wait_s > LATE_DECODE_MAX_WAIT_S:
            why = (f"not probed: the lease outlasts the scenario's wait ({held.lease_said}; the scenario waits the lease "
                   f"+ {LATE_DECODE_MARGIN_S:g} s, {LATE_DECODE_MAX_WAIT_S:g} s at most)")
            return Scenario(name=spec.name, purpose=spec.purpose, skipped=why, not_probed=why, churn=True)
        self._held, self._prefill_legs = held, {}
        notes: list[str] = []
        try:
            scenario = self._scenario(spec, lambda: self._steps(spec, notes))
        finally:
            self._held = None
        return occurrence.read_after_lease(scenario, f"{spec.name}-a", after_s=self._decode_after_s, lease_said=held.lease_said,
                                           notes=notes)

    def _leg(self, r: ScenarioRequest, notes: list[str]) -> TenantRequest | None:
        """One leg of late-decode, straight to the engine as the router would send it, with the
        tenant's connection and fields; the decode leg's answer is scanned like any other."""
        held = self._held
        if held is None or not self.budget.may_send():
            return None
        client = self.tenants[r.tenant]
        ids = self._ids[r.tenant][:r.prompt_tokens]
        if r.leg is Leg.PREFILL:
            prefill = self.engines[held.prefill].with_client(client.adapter.client)
            assert isinstance(prefill, SplitLegs)
            leg = prefill.send_prefill_leg(ids, timeout_s=self.budget.request_s(r.prompt_tokens, Expect.ACCEPT),
                                           extra=client.extra)
            self.budget.cost.add(leg.completion)
            self._prefill_legs[r.tenant] = (leg, time.monotonic())
            if leg.handoff is None:
                notes.append(f"{r.name}: the prefill's answer named no KV blocks for a decode to read")
            return replace(self._scan(r.tenant, r.name, leg.completion, leg.completion.text), scanned=False)
        first = self._prefill_legs.get(r.tenant)
        if first is None or first[0].handoff is None:
            return None
        decode = self.engines[held.decode].with_client(client.adapter.client)
        assert isinstance(decode, SplitLegs)
        self._decode_after_s = time.monotonic() - first[1]
        completion = decode.send_decode_leg(ids, first[0].handoff, max_tokens=r.max_tokens, extra=client.extra,
                                            timeout_s=self.budget.request_s(r.prompt_tokens, Expect.ACCEPT,
                                                                            max_tokens=r.max_tokens))
        self.budget.cost.add(completion)
        return self._scan(r.tenant, r.name, completion, completion.text)

    def _scenario(self, spec: ScenarioSpec, steps: Callable[[], list[TenantRequest | None]]) -> Scenario:
        name, purpose, churn = spec.name, spec.purpose, spec.churn
        if not self.budget.may_send():
            return Scenario(name=name, purpose=purpose, stopped=self.budget.stopped, churn=churn)
        self.progress(f"isolation: {name}")
        self.budget.enter(f"the isolation scenario {name}")
        before = self.state.counters()
        self._untied.extend(self.logs.take())  # logged before it began: not this scenario's
        sent = steps()
        requests = [r for r in sent if r is not None]
        idle = self.budget.wait_idle(self.state, IDLE_WAIT_S)
        after = self.state.counters()
        ran = any(r.completion is not None for r in requests)
        ids = {r.request_id: f"tenant {r.tenant.value}'s request {r.name}" for r in requests if r.request_id}
        return Scenario(name=name, purpose=purpose, requests=tuple(requests), occurred=True if ran else None,
                        occurrence=in_part(spec.shown, requests) if ran else "unconfirmed: no request was answered",
                        idle_after=idle, counter_deltas=counter_deltas(before, after), churn=churn,
                        stopped=self.budget.stopped if len(requests) < len(sent) else None,
                        danger_lines=name_lines(self.logs.take(), ids, other="one of kvpreflight's requests outside this scenario"))

    def _carried(self, spec: ScenarioSpec, probes: Sequence[ProbeResult], shown: str) -> Scenario:
        """A scenario made of capacity probes that carried the tenants' canaries: scanned here,
        sent once. Its counters are those of the probes' windows (the concurrent ones share one)."""
        requests = tuple(replace(self._scan(p.tenant, f"{p.name}-{p.tenant.value}", p.completion, p.completion.text,
                                            headed=True),
                                 scanned=p.completion.max_tokens >= MIN_SCAN_TOKENS, carried=True)
                         for p in probes if p.tenant is not None)
        windows = [p.counter_deltas for p in {p.probe: p for p in probes}.values()]  # the concurrent probes share one
        logged = {id(p.danger_lines): p.danger_lines for p in probes}  # the concurrent probes share one
        return Scenario(name=spec.name, purpose=spec.purpose, requests=requests, occurred=True if requests else None,
                        occurrence=in_part(shown, requests) if requests else "unconfirmed: no request was answered",
                        idle_after=self.shared_idle, counter_deltas=over_windows(windows), churn=spec.churn,
                        danger_lines=tuple(d for lines in logged.values() for d in lines))

    # -- one request ---------------------------------------------------------------------------
    def _send(self, tenant: Tenant, name: str, tokens: int, *, expect: Expect = Expect.ACCEPT,
              max_tokens: int | None = None, at_once: int = 1, stream: bool = False, offset: int = 0) -> TenantRequest | None:
        """One scanned request (one of `at_once` the scenario sends together), streamed or not,
        read to its end; None when it was not sent or the deadline cut it short. `offset`: where
        its prompt starts in the tenant's canaries."""
        client = self.tenants[tenant]
        sent = self.budget.probe(client.adapter, self._ids[tenant][offset:offset + tokens], name=name, expect=expect,
                                 max_tokens=max_tokens or self.gen, engines=self.engines.values(), extra=client.extra,
                                 at_once=at_once, stream=stream)
        if sent is None:
            return None
        return self._scan(tenant, name, sent[0], sent[0].text, expect=expect, headed=offset == 0)

    def _scan(self, tenant: Tenant, name: str, completion: Completion | None, text: str, *,
              expect: Expect = Expect.ACCEPT, abandoned: str | None = None, headed: bool = False) -> TenantRequest:
        """`headed`: its prompt began with the tenant's head (it started at offset 0)."""
        own = {self.canaries[tenant], self.heads[tenant]}
        known = {self.canaries[tenant.other], self.heads[tenant.other], *self.settings.known_markers}
        crossings = []
        for found in foreign_markers(text, own, known):
            if found in known or found.endswith(" (fragment)"):
                crossings.append(found)
            else:  # marker-shaped but not one of ours in play (e.g. pieces of two): length and hash only
                digest = hashlib.sha256(found.encode()).hexdigest()
                crossings.append(f"unrecognised marker-shaped text ({len(found)} chars, sha256 {digest})")
        echo = echo_of(text, own, sent_tokens=completion.sent_tokens if completion else 0,
                       head=self.heads[tenant] if headed else None)
        return TenantRequest(tenant=tenant, name=name, completion=completion, expect=expect, abandoned=abandoned,
                             echo=echo, crossings=tuple(crossings))

    def _abandon(self, r: ScenarioRequest, notes: list[str]) -> TenantRequest | None:
        """Send the adapter's own request over a raw connection and close it mid-flight, as a
        client that goes away: during the KV transfer, or after the first streamed token. What
        arrived before the close is scanned too."""
        if not self.budget.may_send():
            return None
        tenant, name = r.tenant, r.name
        during_transfer = r.leave is Leave.DURING_TRANSFER
        client = self.tenants[tenant]
        decoders = [s.url for s in self.snapshots if s.role is Role.DECODE and s.url in self.engines]
        tokens = self._leaver_tokens(r, notes) if during_transfer and not decoders else r.prompt_tokens
        ids = self._ids[tenant][:tokens]
        if during_transfer and not decoders and len(self._ids[tenant]) > tokens:
            # Unified: the disconnect is to land during prefill, so the prompt must not be one the
            # prefix cache already holds (the same canaries, one token later: no cached prefix).
            ids = self._ids[tenant][1:tokens + 1]
        request = client.adapter.with_request_id(client.adapter.build_request(
            ids, max_tokens=r.max_tokens, stream=r.stream, extra=client.extra))
        # The request's own budget, from the measured speed: the socket must not time out first
        # (a vLLM P/D pair answered after its prefill's 30 s KV lease ran out, past --timeout).
        budget_s = self.budget.request_s(tokens, Expect.ACCEPT, max_tokens=2)
        connection = self.session.connection
        target = RawTarget(client.adapter, request, client.headers, max(connection.timeout_s, budget_s),
                           connection.ca_bundle, connection.client_cert, connection.client_key)
        departure: Departure
        if during_transfer:
            watch = decoders or list(self.engines)
            baseline = {url: self.state.used(url) for url in watch}

            def pages_reserved() -> bool | None:
                if all(v is None for v in baseline.values()):
                    return None
                return any((v := self.state.used(url)) is not None and v > (baseline[url] or 0) for url in watch)

            # A decode reserves pages only once the prefill is done (vLLM: after the router's
            # hop too): wait as long as the engine's measured speed says a prefill takes.
            departure = leave_during_transfer(target, pages_reserved, unified=not decoders,
                                              wait_s=self.budget.request_s(tokens, Expect.ACCEPT))
        else:
            departure = leave_after_first_token(target, budget_s)
        self.budget.cost.add_abandoned(tokens)
        if departure.note:
            notes.append(f"{name}: {departure.note}")
        scanned = self._scan(tenant, name, None, departure.received.decode("utf-8", errors="replace"),
                             abandoned=departure.left or "without the intended timing")
        return replace(scanned, abandoned_id=request.request_id, abandoned_tokens=len(ids))

    def _leaver_tokens(self, r: ScenarioRequest, notes: list[str]) -> int:
        """cancel-transfer's leaver on a unified engine, sized from the prompt at the limit that
        the capacity probes sent (its time to the first token): IsolationSizes.leaver_tokens. Why
        it is not the short prompt goes into the notes, once for both leavers."""
        if r.longer is None:
            return r.prompt_tokens
        at_limit = next((p.completion for p in self.shared if p.probe is ProbeName.BOUNDARY_ACCEPT and p.completion.served), None)
        why: str | None
        if at_limit is None:
            tokens, why = r.prompt_tokens, (f"the leavers stayed {r.prompt_tokens:,} tokens: no prompt at the limit was "
                                            "answered before them, so the engine's prefill time is not known")
        else:
            tokens, why = self.sizes.leaver_tokens(at_limit.sent_tokens, at_limit.first_token_s, UNIFIED_CANCEL_AFTER_S)
        if why and why not in notes:
            notes.append(why)
        return tokens

    def _token_ids(self, adapter: EngineAdapter, count: int, seed: str) -> list[int]:
        return valid_token_ids(adapter, self.engines.values(), count, seed)


def run_isolation(session: ProbeSession, settings: IsolationSettings, *, tenant_headers: Sequence[Mapping[str, str]] = ({}, {}),
                  salted: bool = True, prompts: TenantPrompts | None = None, shared: ProbeRun | None = None,
                  scenarios: Sequence[ScenarioSpec] | None = None) -> IsolationRun:
    """Run the scenarios (all declared ones unless `scenarios`) as tenants A and B: `prompts` (the
    capacity probes' tenants, whose requests are in `shared`), or tenants opened here."""
    try:
        if prompts is not None:
            return IsolationProber(session, settings, prompts, shared, scenarios).run()
        with open_tenants(session, tenant_headers, salted=salted) as opened:
            return IsolationProber(session, settings, opened, scenarios=scenarios).run()
    except EngineError as exc:
        return IsolationRun(not_run=f"isolation probes could not run: {exc}")
