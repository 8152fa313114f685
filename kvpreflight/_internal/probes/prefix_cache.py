"""The prefix-cache controls: a fresh shared prefix sent cold by tenant A, repeated by A (must
hit: the positive control) and then by tenant B (must not). Each request's cache hit is read from
the answer (`cached_tokens`) and from the engines' prefix-cache hit counters.

Where both are silent (no cached-token count, no hit counter: SGLang without metrics, a gateway
that strips usage), the timing audit follows: `timing_samples` fresh prefixes, each sent cold by
A, then again by A (warm), by B (cross-tenant) and, beside them, a fresh prompt by each tenant,
those four in a drawn order; only the time to first token is kept, and the check compares the
samples with two-sample Kolmogorov-Smirnov tests. The fresh prompts are the references, not the
cold one: the cold request always goes first, and the place alone can be faster (a llama.cpp
with no cache at all answered repeats 1 ms faster than the first of each sample); and a tenant's
own path may be slower (a gateway's per-tenant work), which against tenant A's times alone would
hide a shared hit."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvpreflight._internal.engines.interface import EngineAdapter
from kvpreflight._internal.probes.budget import Budget
from kvpreflight._internal.probes.engine_state import EngineState, counter_deltas
from kvpreflight._internal.probes.markers import new_marker
from kvpreflight._internal.probes.results import (
    CacheProbe,
    CacheProbeKind,
    Expect,
    PrefixCacheRun,
    Tenant,
)
from kvpreflight._internal.probes.tenants import TenantClient
from kvpreflight.model import EngineSnapshot, Role

CACHE_PREFIXES = 3  # fresh shared prefixes (medians of TTFT); one where the engines state caching is off
MAX_PROMPT_TOKENS = 1024
# The controls' prompt: 1/256 of the context, at least 128 tokens and 4 of the engines' pages (a
# repeat hits whole pages only, never the last token's: a prompt of one 128-token vLLM block got no
# hit at all), at most MAX_PROMPT_TOKENS.
PROMPT_FRACTION = 256
MIN_PROMPT_TOKENS = 128
MIN_PROMPT_PAGES = 4
ASSUMED_PAGE_TOKENS = 128  # where no engine states its page size (vLLM's CPU default block)
ORDER = ((CacheProbeKind.COLD, Tenant.A), (CacheProbeKind.WARM, Tenant.A), (CacheProbeKind.WARM, Tenant.A),
         (CacheProbeKind.CROSS, Tenant.B))
DEFAULT_TIMING_SAMPLES = 30
TIMING_MAX_PROMPT_TOKENS = 512
# Each timing sample sends cold first, then warm, cross-tenant and each tenant's fresh prompt in an
# order drawn from this seed: none always follows another, and a rerun draws the same orders.
TIMING_ORDER_SEED = 20250713
TIMING_REQUESTS_PER_SAMPLE = 5


def caching_off(snapshots: Sequence[EngineSnapshot]) -> str | None:
    """Which engines say their prefix cache is off. A decode engine does not count: it never
    looks a prompt up (SGLang's decode runs without a radix cache while its prefill has one)."""
    off = [s.url for s in snapshots if s.role is not Role.DECODE and s.prefix_caching is False]
    return "; ".join(f"{url} reports it off" for url in off) or None


def cache_prompt_tokens(longest: int, context: int, page_tokens: int | None) -> int:
    pages = MIN_PROMPT_PAGES * (page_tokens or ASSUMED_PAGE_TOKENS)
    return max(1, min(longest, MAX_PROMPT_TOKENS, max(MIN_PROMPT_TOKENS, pages, context // PROMPT_FRACTION)))


def timing_prompt_tokens(longest: int) -> int:
    return max(1, min(longest, TIMING_MAX_PROMPT_TOKENS))


def _fields(client: TenantClient) -> dict[str, Any]:
    """The tenant's fields plus those that turn the engine's prefix cache on for this request."""
    return {**client.adapter.prefix_cache_fields, **(client.extra or {})}


def probe_prefix_cache(tenants: Mapping[Tenant, TenantClient], state: EngineState,
                       token_ids: Callable[[EngineAdapter, int, str], list[int]], *, longest: int, tokens: int,
                       prefixes: int, budget: Budget, binding: str, off: str | None, timing_samples: int) -> PrefixCacheRun:
    """`tokens`: the controls' prompt; `prefixes`: how many fresh prefixes (IsolationSizes)."""
    a = tenants[Tenant.A]
    if not budget.may_send():
        return PrefixCacheRun(binding=binding, caching_off=off, not_run=f"the prefix-cache probes were not sent: {budget.stopped}")
    # One throw-away request first, so the cold probe does not also pay for a cold engine.
    warmup = token_ids(a.adapter, tokens, f"{new_marker('WARMUP')} ")
    budget.send(a.adapter, warmup, max_tokens=1, stream=True, timeout_s=budget.request_s(tokens, Expect.ACCEPT), extra=_fields(a))
    probes: list[CacheProbe] = []

    def part(done: Sequence[CacheProbe], timing: Sequence[CacheProbe] = ()) -> PrefixCacheRun:
        return PrefixCacheRun(probes=tuple(done), timing=tuple(timing), binding=binding, caching_off=off, prompt_tokens=tokens,
                              not_run=f"the prefix-cache probes ran only in part: {budget.stopped}")

    for prefix in range(prefixes):
        ids = token_ids(a.adapter, tokens, f"{new_marker('SHARED')} ")  # fresh: nobody has it cached
        for kind, tenant in ORDER:
            sent = _send(tenants[tenant], ids, kind, prefix, state, budget, count_hits=True)
            if sent is None:
                return part(probes)
            probes.append(sent)
    first_warm = next(p for p in probes if p.kind is CacheProbeKind.WARM)
    silent = first_warm.completion.cached_tokens is None and first_warm.hit_metric_delta is None
    if not silent or off is not None:  # counted hits decide; or the engines state caching is off
        return PrefixCacheRun(probes=tuple(probes), binding=binding, caching_off=off, prompt_tokens=tokens)
    # Counters are silent: only time can tell.
    timing_tokens = timing_prompt_tokens(longest)
    orders = random.Random(TIMING_ORDER_SEED)
    timing: list[CacheProbe] = []
    for sample in range(timing_samples):
        # both prompts made before the first is sent: no request waits on the making of a prompt
        ids, fresh_a, fresh_b = (token_ids(a.adapter, timing_tokens, f"{new_marker('TIMING')} ") for _ in range(3))
        later = [(CacheProbeKind.WARM, Tenant.A, ids), (CacheProbeKind.CROSS, Tenant.B, ids),
                 (CacheProbeKind.FRESH, Tenant.A, fresh_a), (CacheProbeKind.CROSS_FRESH, Tenant.B, fresh_b)]
        orders.shuffle(later)
        for kind, tenant, prompt in [(CacheProbeKind.COLD, Tenant.A, ids), *later]:
            sent = _send(tenants[tenant], prompt, kind, sample, state, budget, count_hits=False)
            if sent is None:
                return part(probes, timing)
            timing.append(sent)
    return PrefixCacheRun(probes=tuple(probes), timing=tuple(timing), binding=binding, caching_off=off, prompt_tokens=tokens,
                          timing_prompt_tokens=timing_tokens)


def _send(client: TenantClient, ids: list[int], kind: CacheProbeKind, prefix: int, state: EngineState, budget: Budget,
          *, count_hits: bool) -> CacheProbe | None:
    """One streamed prefix-cache request through the budget; None when the run stopped."""
    if not budget.may_send():
        return None
    before = state.counters() if count_hits else {}
    sent = budget.probe(client.adapter, ids, name=f"the {kind.value} prefix-cache probe", expect=Expect.ACCEPT,
                        max_tokens=1, stream=True, engines=state.engines.values(), extra=_fields(client))
    if sent is None:
        return None
    deltas = counter_deltas(before, state.counters()) if count_hits else {}
    hits = [h for d in deltas.values() if (h := d.prefix_cache_hits) is not None]
    return CacheProbe(kind=kind, tenant=client.tenant, prefix=prefix, completion=sent[0],
                      hit_metric_delta=round(sum(hits), 3) if hits else None, counter_deltas=deltas)
