"""The capacity probes: real requests at and beyond the limits the engines state.

Every request goes through the entry (how users reach the engines). Before and after each one the
counters of every engine are read, so each probe is attributed to the engines it really reached
and a rejected request can be shown to have stopped before any KV transfer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from kvpreflight.engines.interface import Counters, EngineAdapter
from kvpreflight.model import Completion, EngineSnapshot
from kvpreflight.probes.engine_state import EngineState, counter_deltas, request_budget
from kvpreflight.probes.markers import foreign_markers, new_marker
from kvpreflight.probes.results import Expect, Limits, ProbeResult, ProbeRun
from kvpreflight.probes.tokens import valid_token_ids

# Enough generated tokens that, if an over-capacity request is wrongly served from stale pages,
# whole synthetic markers of other requests (37 characters) surface in the answer as evidence.
OVER_MAX_TOKENS = 96
CONCURRENT_MAX_TOKENS = 4
IDLE_WAIT_S = 10.0


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
        self.state = EngineState(engines)
        self.snapshots = list(snapshots)
        self.settings = settings
        self.progress = progress
        self.marker = new_marker("PROBE")
        self._latest: dict[str, Counters | None] | None = None  # counters after the last probe

    def run(self) -> ProbeRun:
        limits = deployment_limits(self.entry, self.snapshots)
        if limits is None:
            return ProbeRun(limits=None, not_run="the engines state no served context or request limit, so no probe size can be derived")
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
                probes.append(self._one(f"over-pool{'-stream' if stream else ''}", Expect.REJECT, ids[:over_pool], OVER_MAX_TOKENS,
                                        "longer than the KV pool but within the served context (the incident's danger zone)",
                                        stream=stream))
        for stream in (False, True):
            probes.append(self._one(f"over-context{'-stream' if stream else ''}", Expect.REJECT,
                                    ids[: limits.served_context + 1], OVER_MAX_TOKENS, "one token over the served context", stream=stream))
        probes.append(self._one("boundary-accept", Expect.ACCEPT, ids[:m], 1,
                                "the longest prompt the stated limits accept; must succeed with every token processed"))
        probes.append(self._one("boundary-reject", Expect.REJECT, ids[: m + 1], 1,
                                "one token more than the stated limits accept; must be refused"))
        clamp_prompt = max(1, m - 8)
        clamp_max = limits.served_context - clamp_prompt + 8
        probes.append(self._one("clamp", Expect.REJECT, ids[:clamp_prompt], clamp_max,
                                "prompt plus max_tokens 8 tokens over the served context: refuse, or say it cut max_tokens"))
        # Near the limit, but leaving room for the 4 generated tokens so no engine has to cut them.
        probes.extend(self._concurrent(ids[: max(1, m - CONCURRENT_MAX_TOKENS)]))
        healthy = {url: adapter.healthy() for url, adapter in self.engines.items()}
        small_ids = self._token_ids(16, f"kvpreflight health check {self.marker}")
        small = self.entry.complete(small_ids, max_tokens=4, stream=False, timeout_s=self.settings.timeout_s)
        idle = self.state.wait_idle(IDLE_WAIT_S)
        return ProbeRun(limits=limits, probes=tuple(probes), healthy_after=healthy, idle_after=idle,
                        small_request_after=small, own_markers=frozenset({self.marker}))

    def _token_ids(self, count: int, seed: str) -> list[int]:
        return valid_token_ids(self.entry, self.engines.values(), count, seed)

    # -- one request ----------------------------------------------------------------------
    def _one(self, name: str, expect: Expect, ids: list[int], max_tokens: int, purpose: str, *, stream: bool = False) -> ProbeResult:
        self.progress(f"probe {name}: {len(ids)} tokens, max_tokens {max_tokens}{' (stream)' if stream else ''}")
        # Probes run one after another, so one probe's "after" is the next one's "before":
        # each probe costs one metrics scrape per engine, not two.
        before = self._latest or self.state.counters()
        budget = request_budget(self.settings.timeout_s, self.settings.accepted_tokens_per_second, len(ids), expect)
        completion = self.entry.complete(ids, max_tokens=max_tokens, stream=stream, timeout_s=budget)
        after = self._latest = self.state.counters()
        return self._result(name, expect, completion, purpose, before, after)

    def _result(self, name: str, expect: Expect, completion: Completion, purpose: str,
                before: Mapping[str, Counters | None], after: Mapping[str, Counters | None]) -> ProbeResult:
        reached = tuple(url for url in self.engines
                        if (a := after.get(url)) is not None and (b := before.get(url)) is not None and a.moved_since(b))
        foreign = foreign_markers(completion.text, {self.marker}, set(self.settings.known_markers))
        return ProbeResult(name=name, expect=expect, completion=completion, purpose=purpose, reached=reached,
                           counter_deltas=counter_deltas(before, after), foreign_markers=tuple(foreign))

    def _concurrent(self, ids: list[int]) -> list[ProbeResult]:
        k = max(1, self.settings.concurrency)
        self.progress(f"probe concurrent: {k} x {len(ids)} tokens at once")
        before = self._latest or self.state.counters()
        budget = request_budget(self.settings.timeout_s, self.settings.accepted_tokens_per_second, k * len(ids), Expect.ACCEPT)
        with ThreadPoolExecutor(max_workers=k) as pool:
            futures = [pool.submit(self.entry.complete, ids, max_tokens=CONCURRENT_MAX_TOKENS, stream=False, timeout_s=budget)
                       for _ in range(k)]
            completions = [f.result() for f in futures]
        after = self._latest = self.state.counters()
        return [self._result(f"concurrent-{i + 1}", Expect.ACCEPT, c,
                             f"{k} near-limit requests at once: each must succeed or be refused with a capacity error",
                             before, after) for i, c in enumerate(completions)]
