"""prefix-cache-isolation: a prompt prefix cached for tenant A is not reused for tenant B.

Positive control first: the same tenant repeating the prompt must hit the cache
(`cached_tokens` > 0, or the engine's hit counter), else "no hit across tenants" proves
nothing. Time to first token of cold, same-tenant warm and cross-tenant requests is reported;
a cross-tenant request as fast as a warm one is a timing side channel (warn).
"""

from __future__ import annotations

from typing import Any

from kvpreflight.checks.interface import CheckContext, isolation_run
from kvpreflight.model import CheckResult, Status
from kvpreflight.probes.results import CacheProbe, CacheProbeKind, ttft_summary

ID = "prefix-cache-isolation"
GAP_MIN_S = 0.005  # a warm/cold TTFT gap smaller than this is noise
GAP_MIN_RATIO = 0.2


def _hit(p: CacheProbe) -> bool | None:
    """Did this request reuse cached KV? None when neither the answer nor a metric says."""
    if p.completion.cached_tokens is not None:
        return p.completion.cached_tokens > 0
    if p.hit_metric_delta is not None:
        return p.hit_metric_delta > 0
    return None


def _probe_ev(p: CacheProbe) -> dict[str, Any]:
    ev: dict[str, Any] = {"kind": p.kind.value, "tenant": p.tenant.value, "prefix": p.prefix, "ttft_s": round(p.ttft_s, 4), **p.completion.evidence(),
          "cached_tokens": p.completion.cached_tokens}  # 0 is a finding here; None: not reported
    if p.hit_metric_delta is not None:
        ev["hit_metric_delta"] = p.hit_metric_delta
    return ev


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    run = isolation_run(ctx, ID)
    if isinstance(run, CheckResult):
        return [run]
    cache = run.cache
    if cache is None or cache.not_run:
        return [CheckResult(ID, Status.INCONCLUSIVE, (cache.not_run if cache else None) or "the prefix-cache probes did not run", ctx.entry)]
    ttft = ttft_summary(cache)
    evidence: dict[str, Any] = {"tenant_binding": cache.binding, "prompt_tokens": cache.prompt_tokens,
                      "probes": [_probe_ev(p) for p in cache.probes]}
    if ttft:
        evidence["ttft_median_s"] = {k.value: round(v, 4) for k, v in ttft.items()}
    failed = [p for p in cache.probes if not p.completion.served]
    cross = [p for p in cache.of(CacheProbeKind.CROSS) if p.completion.served]
    leaks = [p for p in cross if _hit(p)]
    if leaks:
        shown = ", ".join(f"{p.completion.cached_tokens if p.completion.cached_tokens is not None else 'hit-counter'}"
                          for p in leaks)
        return [CheckResult(ID, Status.FAIL,
                            f"tenant B reused tenant A's cached prefix ({len(leaks)} of {len(cross)} cross-tenant requests hit; "
                            f"cached tokens: {shown}) with {cache.binding}: the cache key is not bound to the tenant",
                            ctx.entry, evidence)]
    if failed:
        return [CheckResult(ID, Status.INCONCLUSIVE,
                            f"{len(failed)} of {len(cache.probes)} prefix-cache requests were not served "
                            f"(first: HTTP {failed[0].completion.status} {failed[0].completion.error_message or failed[0].completion.transport_error or ''})".rstrip(),
                            ctx.entry, evidence)]
    first_warm: list[CacheProbe] = []
    for p in cache.of(CacheProbeKind.WARM):  # the first repeat of each prefix is the control; the second only adds TTFT
        if all(q.prefix != p.prefix for q in first_warm):
            first_warm.append(p)
    warm_hits = [_hit(p) for p in first_warm]
    if warm_hits and all(h is True for h in warm_hits):
        pass
    elif cache.caching_off:
        return [CheckResult(ID, Status.SKIP, f"prefix caching is off ({cache.caching_off}); a same-tenant repeat got no "
                                             "cache hit, so no prefix is shared between tenants", ctx.entry, evidence)]
    elif any(h is None for h in warm_hits):
        return [CheckResult(ID, Status.INCONCLUSIVE, "the engine reports no cached_tokens and exposes no prefix-cache hit "
                                                     "counter, so a cache hit cannot be seen at all", ctx.entry, evidence)]
    else:
        return [CheckResult(ID, Status.INCONCLUSIVE,
                            "positive control failed: the same tenant repeating a prompt got no prefix-cache hit "
                            f"({sum(1 for h in warm_hits if h)} of {len(warm_hits)}), so 'no hit across tenants' proves "
                            "nothing (is prefix caching on? vLLM: --enable-prefix-caching --enable-prompt-tokens-details)",
                            ctx.entry, evidence)]
    warm_tokens = [p.completion.cached_tokens for p in first_warm if p.completion.cached_tokens is not None]
    message = (f"same tenant hit the cache ({len(first_warm)} of {len(first_warm)}"
               + (f", {min(warm_tokens):,}+ cached tokens" if warm_tokens else "")
               + f"), the other tenant never did (0 of {len(cross)}) with {cache.binding}")
    if ttft:
        cold, warm, x = ttft[CacheProbeKind.COLD], ttft[CacheProbeKind.WARM], ttft[CacheProbeKind.CROSS]
        gap = cold - warm
        timing = f"TTFT median cold {cold * 1000:.1f} ms, warm {warm * 1000:.1f} ms, cross-tenant {x * 1000:.1f} ms"
        if gap > GAP_MIN_S and gap > GAP_MIN_RATIO * cold and x < warm + gap / 2:
            return [CheckResult(ID, Status.WARN, f"{message}, but the cross-tenant TTFT is warm-like ({timing}): "
                                                 "a timing side channel", ctx.entry, evidence)]
        message += f"; {timing}" + ("" if gap > GAP_MIN_S and gap > GAP_MIN_RATIO * cold else " (no measurable warm/cold gap)")
    return [CheckResult(ID, Status.PASS, message, ctx.entry, evidence)]
