"""The prefix-cache controls: a fresh shared prefix sent cold by tenant A, repeated by A (must
hit: the positive control) and then by tenant B (must not). Each request's cache hit is read from
the answer (`cached_tokens`) and from the engines' prefix-cache hit counters."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from kvpreflight.engines.interface import EngineAdapter
from kvpreflight.model import EngineSnapshot, Role
from kvpreflight.probes.budget import Budget
from kvpreflight.probes.engine_state import EngineState
from kvpreflight.probes.markers import new_marker
from kvpreflight.probes.results import (
    CacheProbe,
    CacheProbeKind,
    Expect,
    PrefixCacheRun,
    Tenant,
)
from kvpreflight.probes.tenants import TenantClient

CACHE_PREFIXES = 3  # fresh shared prefixes (medians of TTFT)
MAX_PROMPT_TOKENS = 1024
ORDER = ((CacheProbeKind.COLD, Tenant.A), (CacheProbeKind.WARM, Tenant.A), (CacheProbeKind.WARM, Tenant.A),
         (CacheProbeKind.CROSS, Tenant.B))


def caching_off(snapshots: Sequence[EngineSnapshot]) -> str | None:
    """Which engines say their prefix cache is off. A decode engine does not count: it never
    looks a prompt up (SGLang's decode runs without a radix cache while its prefill has one)."""
    off = [s.url for s in snapshots if s.role is not Role.DECODE and s.prefix_caching is False]
    return "; ".join(f"{url} reports it off" for url in off) or None


def cache_prompt_tokens(longest: int) -> int:
    return max(1, min(longest, MAX_PROMPT_TOKENS))


def probe_prefix_cache(tenants: Mapping[Tenant, TenantClient], state: EngineState,
                       token_ids: Callable[[EngineAdapter, int, str], list[int]], *, longest: int,
                       budget: Budget, binding: str, off: str | None) -> PrefixCacheRun:
    tokens = cache_prompt_tokens(longest)
    a = tenants[Tenant.A]
    if not budget.may_send():
        return PrefixCacheRun(binding=binding, caching_off=off, not_run=f"the prefix-cache probes were not sent: {budget.stopped}")
    # One throw-away request first, so the cold probe does not also pay for a cold engine.
    warmup = token_ids(a.adapter, tokens, f"{new_marker('WARMUP')} ")
    budget.send(a.adapter, warmup, max_tokens=1, stream=True, timeout_s=budget.request_s(tokens, Expect.ACCEPT), extra=a.extra)
    probes: list[CacheProbe] = []
    for prefix in range(CACHE_PREFIXES):
        ids = token_ids(a.adapter, tokens, f"{new_marker('SHARED')} ")  # fresh: nobody has it cached
        for kind, tenant in ORDER:
            if not budget.may_send():
                return PrefixCacheRun(binding=binding, caching_off=off,
                                      not_run=f"the prefix-cache probes ran only in part: {budget.stopped}")
            client = tenants[tenant]
            hits_before = state.total(lambda c: c.prefix_cache_hits)
            sent = budget.probe(client.adapter, ids, name=f"the {kind.value} prefix-cache probe", expect=Expect.ACCEPT,
                                max_tokens=1, stream=True, engines=state.engines.values(), extra=client.extra)
            if sent is None:
                return PrefixCacheRun(binding=binding, caching_off=off,
                                      not_run=f"the prefix-cache probes ran only in part: {budget.stopped}")
            completion = sent[0]
            hits_after = state.total(lambda c: c.prefix_cache_hits)
            delta = None if hits_before is None or hits_after is None else round(hits_after - hits_before, 3)
            probes.append(CacheProbe(kind=kind, tenant=tenant, prefix=prefix, completion=completion, hit_metric_delta=delta))
    return PrefixCacheRun(probes=tuple(probes), binding=binding, caching_off=off, prompt_tokens=tokens)
