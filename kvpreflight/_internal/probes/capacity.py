"""The capacity probes: real requests at and beyond the limits the engines state.

Every request goes through the entry (how users reach the engines). Before and after each one the
counters of every engine are read, so each probe is attributed to the engines it really reached
and a rejected request can be shown to have stopped before any KV transfer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from kvpreflight._internal.engines.interface import Counters, EngineAdapter
from kvpreflight._internal.probes.budget import PlannedRequest, Speed
from kvpreflight._internal.probes.engine_state import EngineState, counter_deltas
from kvpreflight._internal.probes.logs import named_by_request_id
from kvpreflight._internal.probes.markers import echo_of, foreign_markers, new_marker
from kvpreflight._internal.probes.results import (
    OVER_CAPACITY_PROBES,
    DangerLine,
    Expect,
    Limits,
    ProbeName,
    ProbeResult,
    ProbeRun,
    Tenant,
    transfer_moved,
)
from kvpreflight._internal.probes.session import ProbeSession
from kvpreflight._internal.probes.tenants import TenantPrompts
from kvpreflight._internal.probes.tokens import valid_token_ids
from kvpreflight.model import Completion, CounterDeltas, EngineSnapshot, Role

# Enough generated tokens that, if an over-capacity request is wrongly served from stale pages,
# whole synthetic markers of other requests (37 characters) surface in the answer as evidence.
OVER_MAX_TOKENS = 96
CONCURRENT_MAX_TOKENS = 4
IDLE_WAIT_S = 10.0
HEALTH_PROMPT = 16
HEALTH_MAX_TOKENS = 4
# Served probes sent streamed (besides the `-stream` ones): prompt-integrity's limit prompt is,
# and every other concurrent request, so the served near-limit answers are read both ways.
STREAMED = frozenset({ProbeName.BOUNDARY_ACCEPT})
# A decode's counters are the deployment's, not one request's: another client's KV transfer landing
# while an over-capacity probe is being refused looks like the probe's KV reaching the decode (a
# third customer's did in 4 of 7 runs of the honest builtin trio). Such a probe is sent again, each
# time in a window of its own, until one shows nothing moving; the check reads every window.
QUIET_RESENDS = 2
QUIET_RESEND_CONDITION = ("a decode's KV counters moved while an over-capacity probe was refused "
                          f"(sent again, up to {QUIET_RESENDS} times, for a window with no other client's transfer)")

PURPOSES = {
    ProbeName.OVER_POOL: "longer than the KV pool but within the served context (the incident's danger zone)",
    ProbeName.OVER_CONTEXT: "one token over the served context",
    ProbeName.BOUNDARY_ACCEPT: "the longest prompt the stated limits accept; must succeed with every token processed",
    ProbeName.BOUNDARY_REJECT: "one token more than the stated limits accept; must be refused",
    ProbeName.CLAMP: "prompt plus max_tokens 8 tokens over the served context: refuse, or say it cut max_tokens",
    ProbeName.CONCURRENT: "{k} near-limit requests at once: each must succeed or be refused with a capacity error",
    ProbeName.HEALTH: "a small request after the probes",
}


@dataclass(frozen=True)
class ProbeSettings:
    concurrency: int = 2
    known_markers: frozenset[str] = frozenset()  # other tenants' markers planted before the probes (demo)
    request_fields: Mapping[str, object] = field(default_factory=dict)  # added to every probe no tenant sends (watch: `user`)


def deployment_limits(entry: EngineAdapter, snapshots: Sequence[EngineSnapshot]) -> Limits | None:
    served = [s.served_context for s in snapshots if s.served_context]
    if not served:
        return None
    pools = [p for s in snapshots if (p := s.pool_tokens()) is not None]
    request_limits = [s.max_request_tokens for s in snapshots if s.max_request_tokens]
    combined = replace(
        snapshots[0],
        served_context=min(served),
        pool_readings=tuple(r for s in snapshots for r in s.pool_readings),
        max_request_tokens=min(request_limits) if request_limits else None,
    )
    max_ok = entry.max_accepted_prompt(combined)
    if max_ok is None or max_ok < 2:
        return None
    return Limits(served_context=min(served), pool_tokens=min(pools) if pools else None, max_accepted=max_ok)


def capacity_plan(limits: Limits, concurrency: int, scan_tokens: int | None = None,
                  decode: bool = False) -> list[PlannedRequest]:
    """The capacity probes in the order they are sent. Over-capacity first: if the engine wrongly
    serves one from stale pages, those pages still hold what ran before the preflight (not our own
    boundary probes), as in the incident. `scan_tokens`: when the concurrent requests carry the
    tenants' canaries, each answer is this long (long enough to show another tenant's pages) and
    its prompt leaves room for it. `decode`: a decode engine's counters are read, so each
    over-capacity probe may be sent again (QUIET_RESENDS, conditional)."""
    m = limits.max_accepted
    out: list[PlannedRequest] = []
    if limits.pool_bound and limits.pool_tokens is not None:
        over_pool = limits.pool_tokens + max(1, (limits.served_context - limits.pool_tokens) // 2)
        over_pool = min(max(over_pool, m + 1), limits.served_context - 1)
        out += [PlannedRequest(name, over_pool, OVER_MAX_TOKENS, Expect.REJECT)
                for name in (ProbeName.OVER_POOL, ProbeName.OVER_POOL_STREAM)]
    out += [PlannedRequest(name, limits.served_context + 1, OVER_MAX_TOKENS, Expect.REJECT)
            for name in (ProbeName.OVER_CONTEXT, ProbeName.OVER_CONTEXT_STREAM)]
    if decode:
        out += [PlannedRequest(p.name, p.prompt_tokens, p.max_tokens, p.expect, QUIET_RESENDS, QUIET_RESEND_CONDITION)
                for p in list(out)]
    out.append(PlannedRequest(ProbeName.BOUNDARY_ACCEPT, m, 1, Expect.ACCEPT))
    out.append(PlannedRequest(ProbeName.BOUNDARY_REJECT, m + 1, 1, Expect.REJECT))
    clamp_prompt = max(1, m - 8)
    out.append(PlannedRequest(ProbeName.CLAMP, clamp_prompt, limits.served_context - clamp_prompt + 8, Expect.REJECT))
    # Near the limit, but leaving room for the 4 generated tokens so no engine has to cut them.
    k = max(1, concurrency)
    answer = scan_tokens or CONCURRENT_MAX_TOKENS
    out.append(PlannedRequest(ProbeName.CONCURRENT, max(1, m - answer), answer, Expect.ACCEPT, k))
    out.append(PlannedRequest(ProbeName.HEALTH, HEALTH_PROMPT, HEALTH_MAX_TOKENS, Expect.ACCEPT))
    return out


class CapacityProber:
    """With `tenants`, the near-limit requests carry the isolation canaries (issue 14: a check
    prefills each near-limit prompt once): boundary-accept is tenant A's, and the concurrent
    requests alternate A and B. The isolation prober reads them as its boundary scenario, and the
    pair as its load scenario where it fills the pool."""

    def __init__(self, session: ProbeSession, settings: ProbeSettings, tenants: TenantPrompts | None = None) -> None:
        self.entry = session.entry
        self.tenants = tenants
        self.engines = session.engines
        self.state = EngineState(session.engines)
        self.limits = session.limits
        self.settings = settings
        self.budget = session.budget
        self.progress = session.progress
        self.marker = new_marker("PROBE")
        self._latest: dict[str, Counters | None] | None = None  # counters after the last probe
        self.logs = session.logs
        self._lines: tuple[DangerLine, ...] = ()  # danger lines logged while the last probe was in flight
        self._untied: list[DangerLine] = []  # logged between probes
        self.decoders = frozenset(snap.url for snap in session.snapshots if snap.role is Role.DECODE)

    def run(self, calibrate: Callable[[], None] = lambda: None) -> ProbeRun:
        """Send the plan. `calibrate` runs right after the over-capacity probes: those go first so
        that pages an engine wrongly serves still hold what ran before the preflight, not our own
        calibration prompts (they get --timeout, enough for a clear rejection)."""
        limits = self.limits
        plan = capacity_plan(limits, self.settings.concurrency, self.tenants.answer_tokens if self.tenants else None,
                             decode=bool(self.decoders))
        resends = {p.name: p.concurrent for p in plan if p.only_if == QUIET_RESEND_CONDITION}
        plan = [p for p in plan if p.only_if is None]
        ids = self._token_ids(max(limits.served_context + 1, limits.max_accepted + 1), self._seed())
        self.budget.enter("the capacity probes")
        probes: list[ProbeResult] = []
        small: Completion | None = None
        calibrated = False
        for planned in plan:
            if planned.expect is Expect.ACCEPT and not calibrated:
                calibrated = True
                if self.budget.may_send():
                    calibrate()
                    self._latest = None  # the calibration requests moved the counters: not this probe's doing
            if planned.name is ProbeName.CONCURRENT:
                probes.extend(self._concurrent(ids[: planned.prompt_tokens], planned.concurrent, planned.max_tokens))
            elif planned.name is ProbeName.HEALTH:
                if self.budget.may_send():
                    small_ids = self._token_ids(planned.prompt_tokens, f"kvpreflight health check {self.marker}")
                    small = self.budget.send(self.entry, small_ids, max_tokens=planned.max_tokens, stream=False,
                                                timeout_s=self.budget.request_s(planned.prompt_tokens, Expect.ACCEPT,
                                                                                max_tokens=planned.max_tokens))
                    if self.budget.ended_by_deadline(small):  # sent with what was left of the deadline: no verdict
                        small = None
            elif planned.name is ProbeName.BOUNDARY_ACCEPT and self.tenants is not None:
                if (result := self._one(planned, self.tenants.ids[Tenant.A][: planned.prompt_tokens], Tenant.A)) is not None:
                    probes.append(result)
            elif (result := self._one(planned, ids[: planned.prompt_tokens])) is not None:
                probes.append(self._in_a_quiet_window(planned, ids[: planned.prompt_tokens], result,
                                                      resends.get(planned.name, 0)))
        stopped = self.budget.stopped
        # Read even when probing stopped: a /health read sends no completion, and an engine that
        # died during the probes (vLLM's decode on its first transferred request) is a finding.
        healthy = {url: adapter.healthy() for url, adapter in self.engines.items()}
        idle = self.budget.wait_idle(self.state, IDLE_WAIT_S)
        self._untied.extend(self.logs.take())
        probes, untied = named_by_request_id(probes, self._untied)
        return ProbeRun(limits=limits, probes=tuple(probes), healthy_after=healthy, idle_after=idle,
                        small_request_after=small, own_markers=frozenset({self.marker}), stopped=stopped,
                        not_answering=self.budget.not_answering,
                        speed_note=self.budget.rate_note(), untied_danger_lines=untied,
                        near_context_s=near_context_s(self.budget.speed, limits),
                        prefill_rate=self.budget.speed.prefill_tokens_per_second if self.budget.speed else None,
                        calibration_prefill_s=self.budget.speed.prefill_s if self.budget.speed else None,
                        overhead_s=self.budget.speed.overhead_s if self.budget.speed else 0.0)

    def send_only(self, planned: Sequence[PlannedRequest]) -> ProbeRun:
        """Only these single requests of the plan (`capacity_plan`'s sizes), one after another, for
        the checks to judge as they judge a whole run's: no calibration, no health request, no idle
        wait (`kvpreflight watch --full-every`). Raises EngineError when no prompt can be built."""
        ids = self._token_ids(max(p.prompt_tokens for p in planned), self._seed())
        self.budget.enter("the capacity probes")
        probes = [r for p in planned if (r := self._one(p, ids[: p.prompt_tokens])) is not None]
        self._untied.extend(self.logs.take())
        named, untied = named_by_request_id(probes, self._untied)
        return ProbeRun(limits=self.limits, probes=tuple(named), own_markers=frozenset({self.marker}),
                        stopped=self.budget.stopped, speed_note=self.budget.rate_note(), untied_danger_lines=untied)

    def _seed(self) -> str:
        return f"kvpreflight capacity probe {self.marker}. Repeat this marker: {self.marker}.\n"

    def _token_ids(self, count: int, seed: str) -> list[int]:
        return valid_token_ids(self.entry, self.engines.values(), count, seed)


    # -- one request ----------------------------------------------------------------------
    def _one(self, planned: PlannedRequest, ids: list[int], tenant: Tenant | None = None) -> ProbeResult | None:
        """Send one probe (as `tenant`, when given); None when it was not sent, or the deadline
        cut it short (it proves nothing)."""
        probe, expect, max_tokens = ProbeName(planned.name), planned.expect, planned.max_tokens
        name = probe.value
        stream = probe.streamed or probe in STREAMED
        if not self.budget.may_send():
            return None
        self.budget.enter(f"the capacity probe {name}")
        self.progress(f"probe {name}: {len(ids)} tokens, max_tokens {max_tokens}{' (stream)' if stream else ''}"
                      f"{self.budget.expected_note(len(ids), expect, max_tokens=max_tokens)}")
        # Probes run one after another, so one probe's "after" is the next one's "before":
        # each probe costs one metrics scrape per engine, not two.
        before = self._latest or self.state.counters()
        self._window_opens()
        adapter, extra = self._sender(tenant)
        sent = self.budget.probe(adapter, ids, name=name, expect=expect, max_tokens=max_tokens, stream=stream,
                                 engines=self.engines.values(), extra=extra, after_send=self._read_counters)
        if sent is None:
            return None
        return self._result(name, expect, sent[0], PURPOSES[probe.unstreamed], before, self._latest or {}, tenant)

    def _in_a_quiet_window(self, planned: PlannedRequest, ids: list[int], result: ProbeResult, tries: int) -> ProbeResult:
        """A refused over-capacity probe whose window saw a decode's KV move, sent again (at most
        `tries` times, each window opened by a fresh read of the counters) until a window shows
        nothing moving; the result carries the earlier windows."""
        earlier: list[CounterDeltas] = []
        while (tries > len(earlier) and planned.name in OVER_CAPACITY_PROBES and result.completion.rejected
               and (moved := transfer_moved(result.counter_deltas, self.decoders))):
            self.progress(f"probe {planned.name}: refused, but the decode's counters moved in its window "
                          f"({', '.join(sorted(k for d in moved.values() for k in d))}); sending it again")
            self._latest = None  # the next window opens with its own read, right before the request
            again = self._one(planned, ids)
            if again is None:
                break
            earlier.append(result.counter_deltas)
            result = again
        return replace(result, earlier_windows=tuple(earlier)) if earlier else result

    def _sender(self, tenant: Tenant | None) -> tuple[EngineAdapter, dict[str, object] | None]:
        """The adapter and extra request fields a probe is sent with: the entry's, or the tenant's."""
        if tenant is None or self.tenants is None:
            return self.entry, dict(self.settings.request_fields) or None
        client = self.tenants.clients[tenant]
        return client.adapter, client.extra

    def _read_counters(self) -> None:
        self._latest = self.state.counters()
        self._lines = self.logs.take()

    def _window_opens(self) -> None:
        """A probe is about to be sent: what the logs gained since the last one is no probe's."""
        self._untied.extend(self.logs.take())
        self._lines = ()

    def _result(self, name: str, expect: Expect, completion: Completion, purpose: str,
                before: Mapping[str, Counters | None], after: Mapping[str, Counters | None],
                tenant: Tenant | None = None) -> ProbeResult:
        reached = tuple(url for url in self.engines
                        if (a := after.get(url)) is not None and (b := before.get(url)) is not None and a.moved_since(b))
        own, known = {self.marker}, set(self.settings.known_markers)
        # the markers its prompt repeats back to back (a tenant's canary: the probe marker's seed is not made
        # to be echoed, so its answers are not judged by it) and its unique head
        prompt: set[str] = set()
        head = None
        if self.tenants is not None:
            markers = {t: {self.tenants.canaries[t], self.tenants.heads[t]} for t in Tenant}
            if tenant is not None:
                prompt, head = markers.pop(tenant), self.tenants.heads[tenant]
                own |= prompt
            known.update(m for ms in markers.values() for m in ms)
        foreign = foreign_markers(completion.text, own, known)
        return ProbeResult(name=name, expect=expect, completion=completion, purpose=purpose, reached=reached,
                           counter_deltas=counter_deltas(before, after), foreign_markers=tuple(foreign),
                           danger_lines=self._lines, tenant=tenant,
                           echo=echo_of(completion.text, prompt, sent_tokens=completion.sent_tokens, head=head))

    def _concurrent(self, ids: list[int], k: int, max_tokens: int) -> list[ProbeResult]:
        if not self.budget.may_send():
            return []
        self.budget.enter("the concurrent capacity probe")
        self.progress(f"probe concurrent: {k} x {len(ids)} tokens at once"
                      f"{self.budget.expected_note(len(ids), Expect.ACCEPT, max_tokens=max_tokens, concurrent=k)}")
        before = self._latest or self.state.counters()
        self._window_opens()
        tenants: list[Tenant | None] = [None] * k
        if self.tenants is None:
            completions = self.budget.probe(self.entry, ids, name=ProbeName.CONCURRENT.value, expect=Expect.ACCEPT,
                                            max_tokens=max_tokens, engines=self.engines.values(), copies=k,
                                            after_send=self._read_counters)
        else:  # tenants A and B alternating, each its own canary prompt of the same size; B's streamed
            prompts = self.tenants.ids
            alternating = [(Tenant.A, Tenant.B)[i % 2] for i in range(k)]
            tenants = list(alternating)
            with ThreadPoolExecutor(max_workers=k) as pool:
                futures = [pool.submit(self._send_concurrent, t, prompts[t][: len(ids)], k, max_tokens, i % 2 == 1)
                           for i, t in enumerate(alternating)]
                each = [f.result() for f in futures]
            self._read_counters()
            completions = None if any(c is None for c in each) else tuple(c[0] for c in each if c is not None)
        if completions is None:
            return []
        purpose = PURPOSES[ProbeName.CONCURRENT].format(k=k)
        return [self._result(f"{ProbeName.CONCURRENT.value}-{i + 1}", Expect.ACCEPT, c, purpose, before, self._latest or {}, tenants[i])
                for i, c in enumerate(completions)]

    def _send_concurrent(self, tenant: Tenant, ids: list[int], k: int, max_tokens: int,
                         stream: bool) -> tuple[Completion, ...] | None:
        adapter, extra = self._sender(tenant)
        return self.budget.probe(adapter, ids, name=ProbeName.CONCURRENT.value, expect=Expect.ACCEPT, max_tokens=max_tokens,
                                 engines=self.engines.values(), extra=extra, at_once=k, stream=stream)


def near_context_s(speed: Speed | None, limits: Limits | None) -> float | None:
    """What the measured speed predicts the longest accepted prompt takes, answered with one token."""
    return None if speed is None or limits is None else speed.expected_s(limits.max_accepted)
