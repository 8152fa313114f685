"""The two-tenant isolation probes: synthetic tenants A and B, each with a fresh canary, sent
through the entry in scenarios interleaved so that one tenant's KV pages are freed right before
the other tenant's requests reuse them. Every response is scanned for the other tenant's canary
(whole or a fragment) and for any other synthetic marker. The prober records; it never judges.

Scenarios (the incident's paths, issue 4):
  normal         short prompts, A B A B A B (a lost transfer shows the previous tenant's pages)
  boundary       the longest prompt the limits accept: the capacity probes' near-limit requests
                 (prompt-integrity's, then the concurrent pair) carry the canaries of A, then A and B
  over-capacity  A short, then B over the pool/context (the incident path), and mirrored
  cancel-transfer  (churn) A disconnects while its KV is being written, then B's requests take
                 the freed pages; mirrored
  cancel-decode  (churn) A disconnects after its first streamed token, then B; mirrored
  load           (churn) A and B at once, near the smallest pool: the concurrent pair where its
                 KV fills 80-100% of the smallest pool, else requests of its own

plus the prefix-cache controls (probes/prefix_cache.py): cold, same-tenant warm (must hit),
cross-tenant (must not). How large each request is, and what a check costs: probes/isolation_plan.py.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace

from kvpreflight.engines.errors import EngineError
from kvpreflight.engines.http import HttpClient
from kvpreflight.engines.interface import EngineAdapter
from kvpreflight.model import Completion, EngineSnapshot, Role
from kvpreflight.probes.budget import Budget
from kvpreflight.probes.disconnect import (
    AFTER_FIRST_TOKEN,
    Departure,
    RawTarget,
    leave_after_first_token,
    leave_during_transfer,
)
from kvpreflight.probes.engine_state import EngineState, counter_deltas
from kvpreflight.probes.isolation_plan import MIN_SCAN_TOKENS, PURPOSES, IsolationSizes
from kvpreflight.probes.logs import LogWatch, name_lines
from kvpreflight.probes.markers import contains_marker, foreign_markers, new_marker
from kvpreflight.probes.prefix_cache import (
    DEFAULT_TIMING_SAMPLES,
    caching_off,
    probe_prefix_cache,
)
from kvpreflight.probes.results import (
    DangerLine,
    Expect,
    IsolationRun,
    Limits,
    ProbeResult,
    ProbeRun,
    Scenario,
    Tenant,
    TenantRequest,
)
from kvpreflight.probes.tenants import TenantClient, TenantPrompts
from kvpreflight.probes.tokens import valid_token_ids

IDLE_WAIT_S = 12.0  # a cancelled bootstrap may hold pages ~10 s on SGLang-like engines
CANCEL_PROPAGATION_S = 0.06  # router and decode notice a closed socket within ~40 ms
A, B = Tenant.A, Tenant.B
# The normal scenario's requests, (tenant, streamed): each tenant's answers are read to the end
# both streamed and not, since streaming is its own code path in every engine, router and gateway.
NORMAL_ORDER = ((A, False), (B, False), (A, True), (B, True), (A, False), (B, False))


@dataclass(frozen=True)
class IsolationSettings:
    timeout_s: float = 30.0  # the socket timeout of the disconnect probes (budgets: probes/budget.py)
    churn_allowed: bool = False
    churn_not_allowed_reason: str = ""
    binding: str = "cache_salt"
    timing_samples: int = DEFAULT_TIMING_SAMPLES  # per kind, for the timing audit where cache counters are silent
    known_markers: frozenset[str] = frozenset()  # other synthetic markers in play (capacity probes, demo)
    ca_bundle: str | None = None
    client_cert: str | None = None  # mutual TLS (see HttpClient)
    client_key: str | None = None


class IsolationProber:
    """`shared`: the capacity probes' run, whose near-limit requests carried these tenants'
    canaries (CapacityProber with `tenants`): they are the boundary scenario, and the concurrent
    pair the load scenario where it fills the pool. Without them both are sent here."""

    def __init__(self, prompts: TenantPrompts, engines: Mapping[str, EngineAdapter],
                 snapshots: Sequence[EngineSnapshot], limits: Limits, settings: IsolationSettings, budget: Budget,
                 progress: Callable[[str], None] = lambda _: None, shared: ProbeRun | None = None,
                 concurrency: int = 2, logs: LogWatch | None = None) -> None:
        self.tenants = dict(prompts.clients)
        self.logs = logs or LogWatch({})
        self._untied: list[DangerLine] = []  # logged between scenarios or during the prefix-cache probes
        self.engines = engines
        self.state = EngineState(engines)
        self.snapshots = list(snapshots)
        self.limits = limits
        self.settings = settings
        self.budget = budget
        self.progress = progress
        self.canaries = dict(prompts.canaries)
        self._ids = dict(prompts.ids)
        self.shared = [p for p in shared.probes if p.tenant is not None] if shared is not None else []
        self.shared_idle = shared.idle_after if shared is not None else {}
        self.sizes = IsolationSizes.of(limits, snapshots, concurrency)
        self.gen = self.sizes.gen
        self.longest = self.sizes.longest
        self.min_pool = self.sizes.min_pool

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> IsolationRun:
        scenarios = [self._normal(), self._boundary(), self._over_capacity()]
        churn: dict[str, Callable[[], Scenario]] = {
            "cancel-transfer": self._cancel_transfer, "cancel-decode": self._cancel_decode, "load": self._load}
        for name, run_scenario in churn.items():
            if self.settings.churn_allowed:
                scenarios.append(run_scenario())
            else:
                scenarios.append(Scenario(name=name, purpose=PURPOSES[name], skipped=self.settings.churn_not_allowed_reason,
                                          churn=True))
        if self.budget.may_send():  # a step that will not run is not announced
            self.progress("isolation: prefix cache (cold, same-tenant warm, cross-tenant)")
        self.budget.enter("the prefix-cache probes")
        cache = probe_prefix_cache(self.tenants, self.state, self._token_ids, longest=self.longest,
                                   tokens=self.sizes.cache_tokens, prefixes=self.sizes.cache_prefixes, budget=self.budget,
                                   binding=self.settings.binding, off=caching_off(self.snapshots),
                                   timing_samples=self.settings.timing_samples)
        self.budget.wait_idle(self.state, IDLE_WAIT_S)
        healthy = {} if self.budget.stopped else {url: adapter.healthy() for url, adapter in self.engines.items()}
        idle = self.budget.wait_idle(self.state, IDLE_WAIT_S)
        self._untied.extend(self.logs.take())
        # A line logged late (vLLM: up to a lease after the request) still names its request.
        ids = {r.request_id: f"tenant {r.tenant.value}'s request {r.name} ({s.name})"
               for s in scenarios for r in s.requests if r.request_id}
        untied = name_lines(self._untied, ids, other="one of kvpreflight's requests outside the isolation scenarios")
        return IsolationRun(scenarios=tuple(scenarios), cache=cache, canaries=dict(self.canaries),
                            binding=self.settings.binding, healthy_after=healthy, idle_after=idle,
                            untied_danger_lines=untied)

    # -- scenarios -----------------------------------------------------------------------------
    def _normal(self) -> Scenario:
        n = self.sizes.normal_tokens
        return self._scenario("normal", lambda: [self._send(t, f"normal-{t.value}{i // 2 + 1}", n, stream=stream)
                                                 for i, (t, stream) in enumerate(NORMAL_ORDER)],
                              "both tenants ran and were scanned, streamed and not")

    def _boundary(self) -> Scenario:
        n = self.longest
        if self.shared:
            carried = self._carried("boundary", self.shared, "both tenants ran at the longest accepted prompt: the capacity "
                                    "probes' near-limit requests carried their canaries (boundary-accept: a; concurrent: a and b)")
            scanned = {r.tenant for r in carried.requests if r.served and r.scanned}
            missing = [t for t in (A, B) if t not in scanned]
            if not missing:
                return carried
            # The concurrent pair was not served for every tenant (it fails concurrent-capacity):
            # the missing tenant's boundary request is sent here, so the scenario still scans both.
            if not self.budget.may_send():
                return replace(carried, stopped=self.budget.stopped)
            names = ", ".join(t.value for t in missing)
            self.progress(f"isolation: boundary (for tenant {names})")
            extra = [r for t in missing if (r := self._send(t, f"boundary-{t.value}", n)) is not None]
            return replace(carried, requests=carried.requests + tuple(extra),
                           occurred=True if carried.requests or extra else None,
                           occurrence=(f"both tenants ran at the longest accepted prompt (tenant {names}: its own boundary "
                                       "request, as the concurrent pair did not serve it)"),
                           stopped=self.budget.stopped if len(extra) < len(missing) else None)
        order = (A, B, B, A)
        return self._scenario("boundary", lambda: [self._send(t, f"boundary-{t.value}{i + 1}", n)
                                                   for i, t in enumerate(order)],
                              "both tenants ran at the longest accepted prompt")

    def _over_capacity(self) -> Scenario:
        over, where = self.sizes.over, self.sizes.over_where

        def steps() -> list[TenantRequest | None]:
            out: list[TenantRequest | None] = []
            for stream, first in enumerate((A, B)):  # mirrored in the other mode: each path refuses, streamed or not
                second = first.other
                out.append(self._send(first, f"over-capacity-{first.value}-long", self.sizes.short, stream=bool(stream)))
                out.append(self._send(second, f"over-capacity-{second.value}-over", over, expect=Expect.REJECT,
                                      stream=bool(stream)))
            return out

        return self._scenario("over-capacity", steps, f"refusal path exercised right after the other tenant's pages were freed ({where})")

    def _cancel_transfer(self) -> Scenario:
        size, victim = self.sizes.transfer_size, self.sizes.transfer_victim
        deferred_before = self.state.total(lambda c: c.deferred_releases)
        pd = any(s.role is not Role.UNIFIED for s in self.snapshots)
        notes: list[str] = []

        def steps() -> list[TenantRequest | None]:
            out: list[TenantRequest | None] = []
            for leaver in (A, B):
                other = leaver.other
                out.append(self._abandon(leaver, f"cancel-transfer-{leaver.value}-left", size, notes, during_transfer=True))
                time.sleep(CANCEL_PROPAGATION_S)
                with ThreadPoolExecutor(max_workers=2) as pool:
                    futures = [pool.submit(self._send, other, f"cancel-transfer-{other.value}{i + 1}", victim, at_once=2,
                                           stream=i == 1) for i in range(2)]
                    out.extend(f.result() for f in futures)
                self.budget.wait_idle(self.state, IDLE_WAIT_S)
            return out

        scenario = self._scenario("cancel-transfer", steps, "", churn=True)
        deferred_after = self.state.total(lambda c: c.deferred_releases)
        occurred: bool | None
        if deferred_before is not None and deferred_after is not None and deferred_after > deferred_before:
            how = (f"confirmed: decode deferred {int(deferred_after - deferred_before)} release(s) until the "
                   "transfer drained (its deferred-release counter moved), so the disconnect landed mid-transfer")
            occurred = True
        elif any(r.crossings for r in scenario.requests):
            how, occurred = "confirmed by the canary crossing itself", True
        elif not pd:
            how, occurred = prefill_cancel_shown(scenario)
        else:
            how, occurred = ("unconfirmed: no deferred-release counter moved and no page log is reachable over HTTP, so the "
                             "disconnect cannot be shown to have landed while KV was being written"), None
        if notes:
            how += "; " + "; ".join(notes)
        moot = None if pd else "a disconnect mid-transfer: a unified engine moves no KV between engines"
        return replace(scenario, occurred=occurred, occurrence=how, not_applicable=moot)

    def _cancel_decode(self) -> Scenario:
        n, max_tokens = self.sizes.decode_prompt, self.sizes.decode_max_tokens
        notes: list[str] = []

        def steps() -> list[TenantRequest | None]:
            out: list[TenantRequest | None] = []
            for leaver in (A, B):
                out.append(self._abandon(leaver, f"cancel-decode-{leaver.value}-left", n, notes, max_tokens=max_tokens))
                out.append(self._send(leaver.other, f"cancel-decode-{leaver.other.value}", n))
            return out

        scenario = self._scenario("cancel-decode", steps, "", churn=True)
        left = [r for r in scenario.requests if r.abandoned]
        occurred: bool | None
        if left and all(r.abandoned == AFTER_FIRST_TOKEN for r in left):
            how, occurred = "confirmed: each disconnect came after a streamed token and before the answer ended", True
        else:
            how, occurred = "unconfirmed: " + ("; ".join(notes) or "no streamed token arrived before the disconnect"), None
        return replace(scenario, occurred=occurred, occurrence=how)

    def _load(self) -> Scenario:
        pair = [p for p in self.shared if p.name.startswith("concurrent-")]
        if self.sizes.pair_is_load and {p.tenant for p in pair} == {A, B} and all(p.completion.served for p in pair):
            kv = sum(p.completion.sent_tokens + p.completion.max_tokens for p in pair)
            c = pair[0].completion
            return replace(self._carried("load", pair, "", churn=True), occurred=True,
                           occurrence=f"requests at once: {len(pair)} x ({c.sent_tokens:,} prompt + {c.max_tokens:,} answer) = "
                                      f"{kv:,} tokens against a {self.min_pool:,}-token pool (the concurrent-capacity "
                                      "requests, one per tenant)")
        count, per, answer = self.sizes.load_count, self.sizes.load_per, self.sizes.load_max_tokens
        total = self.sizes.load_tokens()
        order = [(A, B)[i % 2] for i in range(count)]

        def steps() -> list[TenantRequest | None]:
            with ThreadPoolExecutor(max_workers=count) as pool:
                futures = [pool.submit(self._send, t, f"load-{t.value}{i // 2 + 1}", per, max_tokens=answer, at_once=count,
                                       stream=(i // 2) % 2 == 1) for i, t in enumerate(order)]
                return [f.result() for f in futures]

        scenario = self._scenario("load", steps, "", churn=True)
        occurred: bool | None
        held = f"{count} x ({per:,} prompt + {answer:,} answer) = {total:,} tokens"
        if self.min_pool is not None and total >= 0.8 * self.min_pool:
            how, occurred = f"requests at once: {held} against a {self.min_pool:,}-token pool", True
        else:
            how = f"unconfirmed: bounded to {held}, " + (
                f"below 80% of the {self.min_pool:,}-token pool" if self.min_pool else "the pool size is unknown")
            occurred = None
        return replace(scenario, occurred=occurred, occurrence=how)

    def _scenario(self, name: str, steps: Callable[[], list[TenantRequest | None]], shown: str, churn: bool = False) -> Scenario:
        if not self.budget.may_send():
            return Scenario(name=name, purpose=PURPOSES[name], stopped=self.budget.stopped, churn=churn)
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
        return Scenario(name=name, purpose=PURPOSES[name], requests=tuple(requests), occurred=True if ran else None,
                        occurrence=shown if ran else "unconfirmed: no request was answered",
                        idle_after=idle, counter_deltas=counter_deltas(before, after), churn=churn,
                        stopped=self.budget.stopped if len(requests) < len(sent) else None,
                        danger_lines=name_lines(self.logs.take(), ids, other="one of kvpreflight's requests outside this scenario"))

    def _carried(self, name: str, probes: Sequence[ProbeResult], shown: str, churn: bool = False) -> Scenario:
        """A scenario made of capacity probes that carried the tenants' canaries: scanned here,
        sent once. Its counters are those of the probes' windows (the concurrent ones share one)."""
        requests = tuple(replace(self._scan(p.tenant, f"{p.name}-{p.tenant.value}", p.completion, p.completion.text),
                                 scanned=p.completion.max_tokens >= MIN_SCAN_TOKENS)
                         for p in probes if p.tenant is not None)
        deltas: dict[str, dict[str, float]] = {}
        for p in {p.name.rstrip("0123456789").rstrip("-"): p for p in probes}.values():
            for url, moved in p.counter_deltas.items():
                into = deltas.setdefault(url, {})
                for key, value in moved.items():
                    into[key] = into.get(key, 0) + value
        windows = {id(p.danger_lines): p.danger_lines for p in probes}  # the concurrent probes share one
        return Scenario(name=name, purpose=PURPOSES[name], requests=requests, occurred=True if requests else None,
                        occurrence=shown if requests else "unconfirmed: no request was answered",
                        idle_after=self.shared_idle, counter_deltas=deltas, churn=churn,
                        danger_lines=tuple(d for lines in windows.values() for d in lines))

    # -- one request ---------------------------------------------------------------------------
    def _send(self, tenant: Tenant, name: str, tokens: int, *, expect: Expect = Expect.ACCEPT,
              max_tokens: int | None = None, at_once: int = 1, stream: bool = False) -> TenantRequest | None:
        """One scanned request (one of `at_once` the scenario sends together), streamed or not,
        read to its end; None when it was not sent or the deadline cut it short."""
        client = self.tenants[tenant]
        sent = self.budget.probe(client.adapter, self._ids[tenant][:tokens], name=name, expect=expect,
                                 max_tokens=max_tokens or self.gen, engines=self.engines.values(), extra=client.extra,
                                 at_once=at_once, stream=stream)
        if sent is None:
            return None
        return self._scan(tenant, name, sent[0], sent[0].text, expect=expect)

    def _scan(self, tenant: Tenant, name: str, completion: Completion | None, text: str, *,
              expect: Expect = Expect.ACCEPT, abandoned: str | None = None) -> TenantRequest:
        own = self.canaries[tenant]
        known = {self.canaries[tenant.other], *self.settings.known_markers}
        crossings = []
        for found in foreign_markers(text, {own}, known):
            if found in known or found.endswith(" (fragment)"):
                crossings.append(found)
            else:  # marker-shaped but not one of ours in play (e.g. pieces of two): length and hash only
                digest = hashlib.sha256(found.encode()).hexdigest()
                crossings.append(f"unrecognised marker-shaped text ({len(found)} chars, sha256 {digest})")
        return TenantRequest(tenant=tenant, name=name, completion=completion, expect=expect, abandoned=abandoned,
                             own_seen=contains_marker(text, own), crossings=tuple(crossings))

    def _abandon(self, tenant: Tenant, name: str, tokens: int, notes: list[str], *, during_transfer: bool = False,
                 max_tokens: int | None = None) -> TenantRequest | None:
        """Send the adapter's own streamed request over a raw connection and close it mid-flight,
        as a client that goes away: during the KV transfer, or after the first streamed token.
        What arrived before the close is scanned too."""
        if not self.budget.may_send():
            return None
        client = self.tenants[tenant]
        decoders = [s.url for s in self.snapshots if s.role is Role.DECODE and s.url in self.engines]
        ids = self._ids[tenant][:tokens]
        if during_transfer and not decoders and len(self._ids[tenant]) > tokens:
            # Unified: the disconnect is to land during prefill, so the prompt must not be one the
            # prefix cache already holds (the same canaries, one token later: no cached prefix).
            ids = self._ids[tenant][1:tokens + 1]
        # A disconnect during the transfer needs no stream, and a router may not pass a streamed
        # client's disconnect on (smg 1.13.0 does not): only the after-first-token case streams.
        request = client.adapter.with_request_id(client.adapter.build_request(
            ids, max_tokens=max_tokens or self.gen, stream=not during_transfer, extra=client.extra))
        # The request's own budget, from the measured speed: the socket must not time out first
        # (a vLLM P/D pair answered after its prefill's 30 s KV lease ran out, past --timeout).
        budget_s = self.budget.request_s(tokens, Expect.ACCEPT, max_tokens=2)
        target = RawTarget(client.adapter, request, client.headers, max(self.settings.timeout_s, budget_s),
                           self.settings.ca_bundle, self.settings.client_cert, self.settings.client_key)
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
        return replace(scanned, abandoned_id=request.request_id)

    def _token_ids(self, adapter: EngineAdapter, count: int, seed: str) -> list[int]:
        return valid_token_ids(adapter, self.engines.values(), count, seed)


def prefill_cancel_shown(scenario: Scenario) -> tuple[str, bool | None]:
    """A unified engine moves no KV, so a disconnect mid-transfer does not apply there; what does
    is a disconnect during prefill. It is shown where the engine counted an abort for each
    request whose client left, and its generated-token counter moved by exactly the answers the
    others got: not one token was generated for the abandoned ones."""
    aborted = sum(d.get("aborted_requests", 0) for d in scenario.counter_deltas.values())
    known = [d for d in scenario.counter_deltas.values() if "aborted_requests" in d and "generation_tokens" in d]
    generated = sum(d["generation_tokens"] for d in known)
    answered = sum((r.completion.completion_tokens or 0) for r in scenario.requests if r.completion is not None)
    left = sum(1 for r in scenario.requests if r.abandoned)
    if not known:
        return ("unconfirmed: the engine counts no aborted requests, so a disconnect during prefill cannot be shown"), None
    if left and aborted >= left and generated == answered:
        return (f"confirmed: the engine counted {aborted:.0f} aborted request(s) for the {left} that left, with no token "
                "generated for them (generated tokens moved by exactly the answers the others got), so each disconnect "
                "landed during prefill"), True
    return (f"unconfirmed: the engine counted {aborted:.0f} aborted request(s) for the {left} that left and "
            f"{generated - answered:.0f} generated token(s) beyond the answers the others got, so the disconnects did not "
            "all land during prefill"), None


@contextmanager
def open_tenants(entry: EngineAdapter, engines: Mapping[str, EngineAdapter], limits: Limits, settings: IsolationSettings,
                 base_headers: Mapping[str, str], tenant_headers: Sequence[Mapping[str, str]], *,
                 salted: bool) -> Iterator[TenantPrompts]:
    """Tenants A and B: each its own connection and credentials, the entry's request shape, a
    fresh cache_salt unless the deployment binds tenants itself, a fresh canary, and its prompt.
    Raises EngineError when a prompt cannot be tokenized."""
    clients: list[HttpClient] = []
    try:
        tenants: dict[Tenant, TenantClient] = {}
        for tenant, extra in zip(Tenant, tenant_headers, strict=True):
            headers = {**base_headers, **extra}
            http = HttpClient(headers=headers, ca_bundle=settings.ca_bundle, timeout_s=settings.timeout_s,
                              client_cert=settings.client_cert, client_key=settings.client_key)
            clients.append(http)
            salt = f"kvpreflight-tenant-{tenant.value}-{secrets.token_hex(8)}" if salted else None
            tenants[tenant] = TenantClient(tenant=tenant, adapter=entry.with_client(http), headers=headers, salt=salt)
        canaries = {tenant: new_marker(f"TENANT{tenant.label}") for tenant in Tenant}
        sizes = IsolationSizes.of(limits, [])
        length = max(limits.max_accepted, sizes.longest + 2 * sizes.gen + limits.served_context)
        # The canary back to back: an echoing model repeats it from any offset.
        ids = {tenant: valid_token_ids(tenants[tenant].adapter, engines.values(), length, f"{canaries[tenant]} ")
               for tenant in Tenant}
        yield TenantPrompts(clients=tenants, canaries=canaries, ids=ids, answer_tokens=sizes.gen)
    finally:
        for http in clients:
            http.close()


def run_isolation(entry: EngineAdapter, engines: Mapping[str, EngineAdapter], snapshots: Sequence[EngineSnapshot],
                  limits: Limits, settings: IsolationSettings, budget: Budget, base_headers: Mapping[str, str],
                  tenant_headers: Sequence[Mapping[str, str]], *, salted: bool,
                  progress: Callable[[str], None] = lambda _: None, prompts: TenantPrompts | None = None,
                  shared: ProbeRun | None = None, concurrency: int = 2, logs: LogWatch | None = None) -> IsolationRun:
    """Run the probes as tenants A and B: `prompts` (the capacity probes' tenants, whose
    requests are in `shared`), or tenants opened here."""
    try:
        if prompts is not None:
            return IsolationProber(prompts, engines, snapshots, limits, settings, budget, progress, shared, concurrency,
                                   logs).run()
        with open_tenants(entry, engines, limits, settings, base_headers, tenant_headers, salted=salted) as opened:
            return IsolationProber(opened, engines, snapshots, limits, settings, budget, progress, logs=logs).run()
    except EngineError as exc:
        return IsolationRun(not_run=f"isolation probes could not run: {exc}")
