"""The capacity probes: real requests at and beyond the limits the engines state.

Every request goes through the entry (how users reach the engines). Before and after each one the
counters of every engine are read, so each probe is attributed to the engines it really reached
and a rejected request can be shown to have stopped before any KV transfer.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from kvpreflight.engines.errors import EngineError
from kvpreflight.engines.interface import Completion, Counters, EngineAdapter
from kvpreflight.model import EngineSnapshot
from kvpreflight.probes.tokens import valid_token_ids
from kvpreflight.probes.markers import foreign_markers, new_marker

# Enough generated tokens that, if an over-capacity request is wrongly served from stale pages,
# whole synthetic markers of other requests (37 characters) surface in the answer as evidence.
OVER_MAX_TOKENS = 96
CONCURRENT_MAX_TOKENS = 4

EXPECT_ACCEPT = "accept"
EXPECT_REJECT = "reject"


@dataclass(frozen=True)
class ProbeResult:
    name: str  # stable: boundary-accept, boundary-reject, over-pool, over-context, clamp, concurrent-N, ...
    expect: str  # EXPECT_ACCEPT | EXPECT_REJECT
    completion: Completion
    purpose: str
    reached: tuple[str, ...] = ()  # URLs of engines whose request/token counters moved
    counter_deltas: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    foreign_markers: tuple[str, ...] = ()  # synthetic markers in the response that this request never sent


@dataclass(frozen=True)
class Limits:
    """What the engines' stated numbers predict, for the deployment as the entry serves it."""

    served_context: int
    pool_tokens: int | None
    max_accepted: int  # longest prompt the stated limits accept with max_tokens=1

    @property
    def pool_bound(self) -> bool:
        return self.pool_tokens is not None and self.pool_tokens < self.served_context


@dataclass(frozen=True)
class ProbeRun:
    limits: Limits | None
    probes: tuple[ProbeResult, ...] = ()
    not_run: str | None = None  # why no probe was sent (then every probe check is inconclusive/skip)
    healthy_after: Mapping[str, bool] = field(default_factory=dict)
    idle_after: Mapping[str, bool | None] = field(default_factory=dict)
    small_request_after: Completion | None = None
    own_markers: frozenset[str] = frozenset()  # this run's probe marker: not foreign to the isolation probes

    def get(self, name: str) -> ProbeResult | None:
        return next((p for p in self.probes if p.name == name), None)

    def named(self, prefix: str) -> list[ProbeResult]:
        return [p for p in self.probes if p.name.startswith(prefix)]


@dataclass(frozen=True)
class ProbeSettings:
    timeout_s: float = 30.0  # bound on the wait for a rejection
    accepted_tokens_per_second: float = 20000.0  # budget for an honest, accepted long prompt
    concurrency: int = 2
    known_markers: frozenset[str] = frozenset()  # other tenants' markers planted before the probes (demo)


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


class CapacityProber:
    def __init__(self, entry: EngineAdapter, engines: Mapping[str, EngineAdapter],
                 snapshots: Sequence[EngineSnapshot], settings: ProbeSettings,
                 progress: Callable[[str], None] = lambda _: None) -> None:
        self.entry = entry
        self.engines = engines  # url -> adapter, for counters
        self.snapshots = {s.url: s for s in snapshots}
        self.settings = settings
        self.progress = progress
        self.marker = new_marker("PROBE")
        self._latest: dict[str, Counters | None] | None = None  # counters after the last probe

    def run(self) -> ProbeRun:
        limits = deployment_limits(self.entry, list(self.snapshots.values()))
        if limits is None:
            return ProbeRun(None, not_run="the engines state no served context or request limit, so no probe size can be derived")
        longest = max(limits.served_context + 1, limits.max_accepted + 1)
        seed = f"kvpreflight capacity probe {self.marker}. Repeat this marker: {self.marker}.\n"
        ids = self._token_ids(longest, seed)
        probes: list[ProbeResult] = []
        m = limits.max_accepted

        # Over-capacity first: if the engine wrongly serves one from stale pages, those pages still
        # hold what ran before the preflight (not our own boundary probes), as in the incident.
        if limits.pool_bound and limits.pool_tokens is not None:
            over_pool = limits.pool_tokens + max(1, (limits.served_context - limits.pool_tokens) // 2)
            over_pool = min(max(over_pool, m + 1), limits.served_context - 1)
            for stream in (False, True):
                probes.append(self._one(f"over-pool{'-stream' if stream else ''}", EXPECT_REJECT, ids[:over_pool], OVER_MAX_TOKENS,
                                        "longer than the KV pool but within the served context (the incident's danger zone)",
                                        stream=stream))
        for stream in (False, True):
            probes.append(self._one(f"over-context{'-stream' if stream else ''}", EXPECT_REJECT,
                                    ids[: limits.served_context + 1], OVER_MAX_TOKENS, "one token over the served context", stream=stream))
        probes.append(self._one("boundary-accept", EXPECT_ACCEPT, ids[:m], 1,
                                "the longest prompt the stated limits accept; must succeed with every token processed"))
        probes.append(self._one("boundary-reject", EXPECT_REJECT, ids[: m + 1], 1,
                                "one token more than the stated limits accept; must be refused"))
        clamp_prompt = max(1, m - 8)
        clamp_max = limits.served_context - clamp_prompt + 8
        probes.append(self._one("clamp", EXPECT_REJECT, ids[:clamp_prompt], clamp_max,
                                "prompt plus max_tokens 8 tokens over the served context: refuse, or say it cut max_tokens"))
        # Near the limit, but leaving room for the 4 generated tokens so no engine has to cut them.
        probes.extend(self._concurrent(ids[: max(1, m - CONCURRENT_MAX_TOKENS)]))
        healthy, idle, small = self._after()
        return ProbeRun(limits, tuple(probes), healthy_after=healthy, idle_after=idle, small_request_after=small,
                        own_markers=frozenset({self.marker}))

    def _token_ids(self, count: int, seed: str) -> list[int]:
        return valid_token_ids(self.entry, self.engines.values(), count, seed)

    # -- one request ----------------------------------------------------------------------
    def _budget(self, tokens: int, expect: str) -> float:
        # --timeout bounds the wait for a refusal; an honest accepted prompt gets time for its size.
        if expect == EXPECT_REJECT:
            return self.settings.timeout_s
        return self.settings.timeout_s + tokens / self.settings.accepted_tokens_per_second

    def _one(self, name: str, expect: str, ids: list[int], max_tokens: int, purpose: str, *, stream: bool = False) -> ProbeResult:
        self.progress(f"probe {name}: {len(ids)} tokens, max_tokens {max_tokens}{' (stream)' if stream else ''}")
        before = self._latest or self._counters()
        completion = self.entry.complete(ids, max_tokens=max_tokens, stream=stream,
                                         timeout_s=self._budget(len(ids), expect))
        after = self._latest = self._counters()
        return self._result(name, expect, completion, purpose, before, after)

    def _result(self, name: str, expect: str, completion: Completion, purpose: str,
                before: Mapping[str, Counters | None], after: Mapping[str, Counters | None]) -> ProbeResult:
        reached, deltas = [], {}
        for url in self.engines:
            b, a = before.get(url), after.get(url)
            if a is None or b is None:
                continue
            if a.moved_since(b):
                reached.append(url)
            deltas[url] = {k: round(getattr(a, k) - getattr(b, k), 3) for k in
                           ("requests", "prompt_tokens", "generation_tokens", "transfer_failures")
                           if getattr(a, k) is not None and getattr(b, k) is not None}
            for key, value in a.extra.items():
                if key in b.extra:
                    deltas[url][key] = round(value - b.extra[key], 3)
        foreign = foreign_markers(completion.text, {self.marker}, set(self.settings.known_markers))
        return ProbeResult(name, expect, completion, purpose, tuple(reached), deltas, tuple(foreign))

    def _counters(self) -> dict[str, Counters | None]:
        # Probes run one after another, so one probe's "after" is the next one's "before":
        # each probe costs one metrics scrape per engine, not two.
        out: dict[str, Counters | None] = {}
        for url, adapter in self.engines.items():
            try:
                out[url] = adapter.counters()
            except EngineError:
                out[url] = None
        return out

    def _concurrent(self, ids: list[int]) -> list[ProbeResult]:
        k = max(1, self.settings.concurrency)
        self.progress(f"probe concurrent: {k} x {len(ids)} tokens at once")
        before = self._latest or self._counters()
        budget = self.settings.timeout_s + k * len(ids) / self.settings.accepted_tokens_per_second
        with ThreadPoolExecutor(max_workers=k) as pool:
            futures = [pool.submit(self.entry.complete, ids, max_tokens=CONCURRENT_MAX_TOKENS, stream=False, timeout_s=budget)
                       for _ in range(k)]
            completions = [f.result() for f in futures]
        after = self._latest = self._counters()
        return [self._result(f"concurrent-{i + 1}", EXPECT_ACCEPT, c,
                             f"{k} near-limit requests at once: each must succeed or be refused with a capacity error",
                             before, after) for i, c in enumerate(completions)]

    def _after(self) -> tuple[dict[str, bool], dict[str, bool | None], Completion | None]:
        healthy = {url: adapter.healthy() for url, adapter in self.engines.items()}
        small_ids = self._token_ids(16, f"kvpreflight health check {self.marker}")
        small = self.entry.complete(small_ids, max_tokens=4, stream=False, timeout_s=self.settings.timeout_s)
        idle: dict[str, bool | None] = {}
        deadline = time.monotonic() + 10
        pending = set(self.engines)
        while True:
            for url in list(pending):
                try:
                    used = self.engines[url].counters().used_tokens
                except EngineError:
                    used = None
                idle[url] = None if used is None else used == 0
                if idle[url] is not False:
                    pending.discard(url)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        return healthy, idle, small

