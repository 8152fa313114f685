"""prefix-cache-isolation: a prompt prefix cached for tenant A is not reused for tenant B.

Positive control first: the same tenant repeating the prompt must hit the cache (`cached_tokens`
covering most of the prompt, or the engine's hit counter), else "no hit across tenants" proves
nothing. Where the engine reports neither, the timing audit decides from time to first token with
two-sample Kolmogorov-Smirnov tests (Gu et al., "Auditing Prompt Caching in Language Model APIs",
ICML 2025), against fresh prompts sent in the repeats' places by each tenant (the cold request
always goes first, and a place alone can be faster: llama.cpp with no cache answered repeats 1 ms
sooner; a tenant's own path can be slower): tenant A's fresh vs warm must differ, else
inconclusive; a cross-tenant sample faster than tenant B's fresh one and not different from warm
is sharing (fail); one slower than warm and no faster than B's fresh one is not (pass); anything
between is inconclusive.

A cross-tenant request's hit is read from every source that has one: the answer's `cached_tokens`
and each engine's own counters over the request, a decode's as well as a prefill's (SGLang's
decode-side radix cache, `--disaggregation-decode-enable-radix-cache`, answers with the prefill's
`cached_tokens: 0` while the decode found the prompt in its own cache). Any source that saw a hit
wins; a counter's hit that other traffic in its window could explain is inconclusive, never a pass.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpreflight._internal.check_ids import CheckId, Scope
from kvpreflight._internal.checks.counts import DEFAULT_PAGE, other_traffic
from kvpreflight._internal.checks.interface import CheckContext, isolation_run
from kvpreflight._internal.checks.kstest import KsResult, ks_2samp
from kvpreflight._internal.probes.results import CacheProbe, CacheProbeKind, PrefixCacheRun, ttft_summary
from kvpreflight.model import CheckResult, CounterField, EngineSnapshot, Role, Status

ID = CheckId.PREFIX_CACHE_ISOLATION
SCOPE = Scope.GROUP
ALPHA = 0.001  # the timing audit's significance level, for each KS test
# The fix where the engine kind's cache cannot be bound to a tenant at all.
FIXES = {
    "llamacpp": ("llama.cpp's prompt cache is per slot, not per tenant: pin each tenant to its own slot at the gateway "
                 "(id_slot), or force cache_prompt false there"),
}
GENERIC_FIX = "the cache key is not bound to the tenant"
DECODE_FIX = ("the decode's own prefix cache is not bound to the tenant (SGLang: --disaggregation-decode-enable-radix-cache "
              "keys it without the cache salt): turn the decode's prefix cache off, or bind its key to the tenant")


def _hit(p: CacheProbe, prompt_tokens: int) -> bool | None:
    """Did this request reuse the cached prefix? None when neither the answer nor a metric says.
    Cached tokens count as a hit when they cover more than half the prompt: a fresh prefix still
    shares a few leading tokens with earlier prompts (llama.cpp reuses those token by token)."""
    if p.completion.cached_tokens is not None:
        return p.completion.cached_tokens * 2 > prompt_tokens
    if p.hit_metric_delta is not None:
        return p.hit_metric_delta > 0
    return None


@dataclass(frozen=True, kw_only=True)
class CrossReading:
    """What the sources say about one cross-tenant request: `hit` where any of them saw one."""

    hit: bool
    said: str  # what was seen, for the message
    counted_by: tuple[str, ...] = ()  # engines whose own counters saw the hit the answer did not report
    other_traffic: tuple[str, ...] = ()  # what else moved those engines' counters in the window


def _counter_hits(p: CacheProbe, prompt_tokens: int, roles: dict[str, Role]) -> list[tuple[str, str]]:
    """(url, what) for each engine whose own counters say this request found its prompt in that
    engine's prefix cache: tokens covering more than a quarter of the prompt (a decode's own cache
    may reuse only the leading pages of another tenant's prefix: SGLang's decode radix cache
    matches page by page; a fresh prefix shares only a few leading tokens), or, where an engine
    counts no tokens, any hit at all."""
    out = []
    for url, d in p.counter_deltas.items():
        role = roles[url].value if url in roles else "engine"
        if (tokens := d.cached_prompt_tokens) is not None:
            if tokens * 4 > prompt_tokens:
                out.append((url, f"{role} {url} found {tokens:,.0f} of its prompt tokens in its own prefix cache"))
        elif (hits := d.prefix_cache_hits) is not None and hits > 0:
            out.append((url, f"{role} {url}'s prefix-cache hit counter moved by {hits:,.0f}"))
    return out


def _cross_reading(p: CacheProbe, prompt_tokens: int, snapshots: Sequence[EngineSnapshot]) -> CrossReading:
    """A cross-tenant request read from the answer and from every engine's counters. Where they
    disagree, the unsafe reading wins: a hit any engine counted is a hit, unless other traffic in
    that engine's window could have made it (then the request proves nothing either way)."""
    answer = p.completion.cached_tokens
    if answer is not None and answer * 2 > prompt_tokens:
        return CrossReading(hit=True, said=f"the answer said cached tokens: {answer} of {prompt_tokens}")
    if answer is None and p.hit_metric_delta is not None and p.hit_metric_delta > 0:
        return CrossReading(hit=True, said=f"the engines' prefix-cache hit counters moved by {p.hit_metric_delta:,.0f}")
    roles = {s.url: s.role for s in snapshots}
    pages = {s.url: s.page_size or DEFAULT_PAGE for s in snapshots}
    counted = _counter_hits(p, prompt_tokens, roles)
    if not counted:
        return CrossReading(hit=False, said="")
    answered = (f"the answer said cached tokens: {answer} of {prompt_tokens}" if answer is not None
                else "the answer said nothing of cached tokens")
    said = f"{answered}, but " + "; ".join(what for _, what in counted)
    sent = p.completion.sent_tokens
    other = tuple(o for url, _ in counted
                  for o in other_traffic(url, p.counter_deltas[url], sent + pages.get(url, DEFAULT_PAGE), 1))
    return CrossReading(hit=True, said=said, counted_by=tuple(url for url, _ in counted), other_traffic=other)


def _probe_ev(p: CacheProbe) -> dict[str, Any]:
    ev: dict[str, Any] = {"kind": p.kind.value, "tenant": p.tenant.value, "prefix": p.prefix, "ttft_s": round(p.ttft_s, 4),
                          **p.completion.evidence(),
                          "cached_tokens": p.completion.cached_tokens}  # 0 is a finding here; None: not reported
    if p.hit_metric_delta is not None:
        ev["hit_metric_delta"] = p.hit_metric_delta
    hits = {url: {f.value: v for f in (CounterField.CACHED_PROMPT_TOKENS, CounterField.PREFIX_CACHE_HITS) if (v := d.get(f)) is not None}
            for url, d in p.counter_deltas.items()}
    if any(hits.values()):
        ev["engine_cache_hits"] = {url: h for url, h in hits.items() if h}
    return ev


def _fix(snapshots: Sequence[EngineSnapshot], counted_by: Sequence[str] = ()) -> str:
    """The fix for the engines that shared the prefix: a decode's own cache has its own."""
    if any(s.url in counted_by and s.role is Role.DECODE for s in snapshots):
        return DECODE_FIX
    kinds = sorted({s.engine for s in snapshots if s.engine in FIXES})
    return "; ".join(FIXES[k] for k in kinds) or GENERIC_FIX


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    run = isolation_run(ctx, ID)
    if isinstance(run, CheckResult):
        return [run]
    cache = run.cache
    if cache is None or cache.not_run:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE,
                            message=(cache.not_run if cache else None) or "the prefix-cache probes did not run",
                            endpoint=ctx.entry)]
    ttft = ttft_summary(cache)
    evidence: dict[str, Any] = {"tenant_binding": cache.binding, "prompt_tokens": cache.prompt_tokens,
                      "probes": [_probe_ev(p) for p in cache.probes]}
    if ttft:
        evidence["ttft_median_s"] = {k.value: round(v, 4) for k, v in ttft.items()}
    failed = [p for p in cache.probes if not p.completion.served]
    cross = [p for p in cache.of(CacheProbeKind.CROSS) if p.completion.served]
    readings = [_cross_reading(p, cache.prompt_tokens, ctx.snapshots) for p in cross]
    leaks = [r for r in readings if r.hit and not r.other_traffic]
    if leaks:
        counted_by = tuple(url for r in leaks for url in r.counted_by)
        believed = ("; the answer and the engines' counters disagree, and the counter that saw the hit is believed"
                    if counted_by else "")
        return [CheckResult(id=ID, status=Status.FAIL,
                            message=f"tenant B reused tenant A's cached prefix ({len(leaks)} of {len(cross)} cross-tenant requests hit; "
                            f"first: {leaks[0].said}{believed}) with {cache.binding}: {_fix(ctx.snapshots, counted_by)}",
                            endpoint=ctx.entry, evidence=evidence)]
    if unsure := [r for r in readings if r.hit]:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE,
                            message=f"{len(unsure)} of {len(cross)} cross-tenant requests may have reused tenant A's cached prefix: "
                            f"{unsure[0].said}, while other traffic was in the window ({'; '.join(unsure[0].other_traffic)}), "
                            "so whose hit it was cannot be told and the answer's rosier figure is not believed: rerun with no "
                            "other traffic on the engines", endpoint=ctx.entry, evidence=evidence)]
    if failed:
        first = failed[0].completion
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE,
                            message=f"{len(failed)} of {len(cache.probes)} prefix-cache requests were not served "
                            f"(first: HTTP {first.status} {first.error_message or first.transport_error or ''})".rstrip(),
                            endpoint=ctx.entry, evidence=evidence)]
    first_warm: list[CacheProbe] = []
    for p in cache.of(CacheProbeKind.WARM):  # the first repeat of each prefix is the control; the second only adds TTFT
        if all(q.prefix != p.prefix for q in first_warm):
            first_warm.append(p)
    warm_hits = [_hit(p, cache.prompt_tokens) for p in first_warm]
    if warm_hits and all(h is True for h in warm_hits):
        pass
    elif cache.caching_off:
        return [CheckResult(id=ID, status=Status.SKIP, message=f"prefix caching is off ({cache.caching_off}); a same-tenant repeat got no "
                                             "cache hit, so no prefix is shared between tenants", endpoint=ctx.entry, evidence=evidence)]
    elif any(h is None for h in warm_hits):
        if cache.timing:
            return [_timing_audit(ctx, cache, evidence)]
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE,
                            message="the engine reports no cached_tokens and exposes no prefix-cache hit "
                            "counter, so a cache hit cannot be seen at all", endpoint=ctx.entry, evidence=evidence)]
    else:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE,
                            message="positive control failed: the same tenant repeating a prompt got no prefix-cache hit "
                            f"({sum(1 for h in warm_hits if h)} of {len(warm_hits)}), so 'no hit across tenants' proves "
                            "nothing (is prefix caching on? vLLM: --enable-prefix-caching --enable-prompt-tokens-details; "
                            "llama.cpp: does a gateway force cache_prompt false?)",
                            endpoint=ctx.entry, evidence=evidence)]
    warm_tokens = [p.completion.cached_tokens for p in first_warm if p.completion.cached_tokens is not None]
    message = (f"same tenant hit the cache ({len(first_warm)} of {len(first_warm)}"
               + (f", {min(warm_tokens):,}+ cached tokens" if warm_tokens else "")
               + f"), the other tenant never did (0 of {len(cross)}) with {cache.binding}")
    if ttft:
        message += (f"; TTFT median cold {ttft[CacheProbeKind.COLD] * 1000:.1f} ms, warm {ttft[CacheProbeKind.WARM] * 1000:.1f} ms, "
                    f"cross-tenant {ttft[CacheProbeKind.CROSS] * 1000:.1f} ms")
    return [CheckResult(id=ID, status=Status.PASS, message=message, endpoint=ctx.entry, evidence=evidence)]


def _ks_ev(result: KsResult) -> dict[str, Any]:
    return {"statistic": round(result.statistic, 4), "p_value": float(f"{result.p_value:.3g}"), "exact": result.exact}


def _timing_audit(ctx: CheckContext, cache: PrefixCacheRun, evidence: dict[str, Any]) -> CheckResult:
    """The verdict from time to first token alone (the engine reports no cache hit any other way).
    Warm, cross-tenant and both fresh prompts share the places after the cold one in drawn orders,
    so only what the engine cached can set them apart; each repeat is judged against its own
    tenant's fresh prompt, and cold is shown, never judged against."""
    unserved = [p for p in cache.timing if not p.completion.served]
    samples = {kind: cache.timing_of(kind) for kind in CacheProbeKind}
    fresh, warm = samples[CacheProbeKind.FRESH], samples[CacheProbeKind.WARM]
    cross, cross_fresh = samples[CacheProbeKind.CROSS], samples[CacheProbeKind.CROSS_FRESH]
    median_ms = {kind.value: round(statistics.median(v) * 1000, 2) for kind, v in samples.items() if v}
    timing: dict[str, Any] = {"prompt_tokens": cache.timing_prompt_tokens, "samples": {k.value: len(v) for k, v in samples.items()},
                              "alpha": ALPHA, "ttft_median_ms": median_ms,
                              "ttft_s": {k.value: [round(t, 5) for t in v] for k, v in samples.items()}}
    evidence = {**evidence, "timing_audit": timing}
    if unserved or not all(samples.values()):
        first = unserved[0].completion if unserved else None
        why = f" (first: HTTP {first.status} {first.error_message or first.transport_error or ''})".rstrip() if first else ""
        return CheckResult(id=ID, status=Status.INCONCLUSIVE, message=f"the engine reports no cache hits, and {len(unserved)} of "
                           f"{len(cache.timing)} timing-audit requests were not served{why}", endpoint=ctx.entry, evidence=evidence)
    warm_fresh, cross_fresh_ks, cross_warm = ks_2samp(warm, fresh), ks_2samp(cross, cross_fresh), ks_2samp(cross, warm)
    timing["ks"] = {"warm_vs_fresh": _ks_ev(warm_fresh), "cross_vs_cross_fresh": _ks_ev(cross_fresh_ks),
                    "cross_vs_warm": _ks_ev(cross_warm)}
    figures = (f"TTFT median cold {median_ms['cold']:.1f} ms, fresh {median_ms['fresh']:.1f} ms (tenant B's "
               f"{median_ms['cross-fresh']:.1f} ms), warm {median_ms['warm']:.1f} ms, cross-tenant {median_ms['cross']:.1f} ms "
               f"over {len(fresh)} samples of {cache.timing_prompt_tokens} tokens; KS p fresh/warm {warm_fresh.p_value:.2g}, "
               f"cross/B's fresh {cross_fresh_ks.p_value:.2g}, cross/warm {cross_warm.p_value:.2g}")
    head = "the engine reports no cache hits, so time to first token decided"
    if warm_fresh.p_value >= ALPHA or median_ms["warm"] >= median_ms["fresh"]:
        # A saving seen but not significant (a first token that is mostly fixed overhead: on a tiny
        # model vLLM's cache saved 2-3 ms of 12-17 ms) is decided by more samples, not by this run.
        more = (f"; the repeats were faster by a median of {median_ms['fresh'] - median_ms['warm']:.1f} ms but not "
                f"significantly: more samples may decide it (--timing-samples, now {len(fresh)})"
                if median_ms["warm"] < median_ms["fresh"] else "")
        return CheckResult(id=ID, status=Status.INCONCLUSIVE,
                           message=f"{head} nothing: a same-tenant repeat is not measurably faster than a "
                           f"fresh prompt in the same place (KS p >= {ALPHA} or slower), so prefix caching is off or its "
                           f"effect is not measurable here ({figures}){more}", endpoint=ctx.entry, evidence=evidence)
    faster_than_fresh = cross_fresh_ks.p_value < ALPHA and median_ms["cross"] < median_ms["cross-fresh"]
    if cross_warm.p_value < ALPHA and median_ms["cross"] > median_ms["warm"] and not faster_than_fresh:
        return CheckResult(id=ID, status=Status.PASS, message=f"{head}: tenant B's requests are not warm (cross-tenant is slower than "
                           f"same-tenant warm, p < {ALPHA}, and no faster than tenant B's fresh prompts) with {cache.binding} ({figures})",
                           endpoint=ctx.entry, evidence=evidence)
    if faster_than_fresh and cross_warm.p_value >= ALPHA:
        return CheckResult(id=ID, status=Status.FAIL,
                           message=f"{head}: tenant B's requests are as fast as tenant A's warm repeats (cross-tenant "
                           f"is faster than tenant B's fresh prompts, p < {ALPHA}, and does not differ from warm) with {cache.binding}: "
                           f"{_fix(ctx.snapshots)} ({figures})", endpoint=ctx.entry, evidence=evidence)
    between = (" (faster than tenant B's fresh prompts, not as fast as warm: part of the prefix may have been reused, or "
               "tenant B's path is slower)" if faster_than_fresh else "")
    return CheckResult(id=ID, status=Status.INCONCLUSIVE, message=f"{head} nothing: the cross-tenant samples are neither clearly warm nor "
                       f"clearly not{between} ({figures})", endpoint=ctx.entry, evidence=evidence)
