"""prompt-integrity and pd-transfer against the engines' own counters (issue 26): the answer's
usage says every prompt token was processed, the counters over the probe's window say less. On
hand-built snapshots and recorded counter deltas (no server)."""

from __future__ import annotations

from dataclasses import replace

from support.check_cases import DECODE, ENTRY, PREFILL, T, check, ok, snap

from kvpreflight._internal.checks import CheckContext
from kvpreflight._internal.probes.results import Expect, Limits, ProbeResult, ProbeRun
from kvpreflight.model import CounterDelta, Role, Status

SENT = 9992


def probes(deltas, *, concurrent=None, reached=(PREFILL,)) -> ProbeRun:
    """boundary-accept answered with its full length in usage, and its window's counter deltas;
    `concurrent`: the pair's shared window's deltas (each 9,900 tokens)."""
    items = [ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, completion=ok(SENT), purpose="t", reached=reached,
                         counter_deltas=deltas)]
    if concurrent is not None:
        items += [ProbeResult(name=f"concurrent-{i}", expect=Expect.ACCEPT, completion=ok(9900, max_tokens=4, generated=4),
                              purpose="t", reached=reached, counter_deltas=concurrent) for i in (1, 2)]
    return ProbeRun(limits=Limits(10000, 20000, 9993), probes=tuple(items))


def integrity(deltas, engines=None, **kw):
    (r,) = check("prompt-integrity", CheckContext(engines or (snap(),), T, probes=probes(deltas, **kw), entry=PREFILL))
    return r


def test_a_prompt_computed_only_in_part_fails_whatever_the_usage_says():
    r = integrity({PREFILL: CounterDelta(prompt_tokens=4096, prefilled_tokens=4096, cached_prompt_tokens=0, requests=1)})
    assert r.status is Status.FAIL
    assert "the answer reports all 9,992 prompt tokens processed" in r.message
    assert "computed 4,096 tokens" in r.message and "5,896 prompt tokens never computed, cached or received" in r.message


def test_cache_hits_count_but_do_not_make_up_a_shortened_prompt():
    # Another shape: part of it found in the prefix cache, still short of what was sent.
    r = integrity({PREFILL: CounterDelta(prompt_tokens=6000, prefilled_tokens=2000, cached_prompt_tokens=4000)})
    assert r.status is Status.FAIL and "found 4,000 tokens in the prefix cache" in r.message
    # Computed plus cached covers it: pass.
    r = integrity({PREFILL: CounterDelta(prompt_tokens=SENT, prefilled_tokens=1992, cached_prompt_tokens=8000)})
    assert r.status is Status.PASS and "not cross-checked" not in r.message


def test_the_concurrent_window_is_cross_checked_too():
    whole = {PREFILL: CounterDelta(prefilled_tokens=SENT, cached_prompt_tokens=0)}
    r = integrity(whole, concurrent={PREFILL: CounterDelta(prefilled_tokens=9900 + 512, cached_prompt_tokens=0)})
    assert r.status is Status.FAIL and r.message.count("concurrent (x2)") == 1 and "19,800 prompt tokens sent" in r.message


def test_within_a_page_is_not_a_shortfall():
    r = integrity({PREFILL: CounterDelta(prefilled_tokens=SENT - 16, cached_prompt_tokens=0)})
    assert r.status is Status.PASS
    r = integrity({PREFILL: CounterDelta(prefilled_tokens=SENT - 17, cached_prompt_tokens=0)})
    assert r.status is Status.FAIL


def test_other_traffic_in_the_window_is_said_and_never_failed_on():
    r = integrity({PREFILL: CounterDelta(prompt_tokens=60000, prefilled_tokens=60000, cached_prompt_tokens=0, requests=7)})
    assert r.status is Status.PASS
    assert r.evidence["engine_counts"]["boundary-accept"]["other_traffic"] == [
        f"{PREFILL} counted 60,000 prompt tokens", f"{PREFILL} finished 7 requests"]


def test_a_missing_counter_is_said_not_assumed():
    # No prefix-cache counter: a short compute count may be cache hits, so nothing is concluded.
    r = integrity({PREFILL: CounterDelta(prompt_tokens=4096, prefilled_tokens=4096)})
    assert r.status is Status.PASS and "not cross-checked" in r.message and "prefix-cache hits" in r.message
    # The engine states its prefix cache is off: nothing can be cached, and the deficit stands.
    r = integrity({PREFILL: CounterDelta(prompt_tokens=4096, prefilled_tokens=4096)}, engines=(snap(prefix_caching=False),))
    assert r.status is Status.FAIL
    # No counter moved at all: only the answer's own count vouches for it, and the message says so.
    r = integrity({})
    assert r.status is Status.PASS and "only the answer's own count" in r.message


def test_behind_a_router_the_prefill_tier_accounts_for_the_prompt():
    pd = (snap(PREFILL, Role.PREFILL), snap(DECODE, Role.DECODE))
    full = CounterDelta(prefilled_tokens=0, cached_prompt_tokens=0, kv_transfer_tokens=SENT)
    run = probes({PREFILL: CounterDelta(prefilled_tokens=3000, cached_prompt_tokens=0), DECODE: full}, reached=(PREFILL, DECODE))
    (r,) = check("prompt-integrity", CheckContext(pd, T, probes=run, entry=ENTRY))
    assert r.status is Status.FAIL and "computed 3,000 tokens" in r.message
    # The decode got KV for only part of it: pd-transfer says so through the same count.
    run = probes({PREFILL: CounterDelta(prefilled_tokens=SENT, cached_prompt_tokens=0),
                  DECODE: replace(full, kv_transfer_tokens=5000)}, reached=(PREFILL, DECODE))
    results = check("pd-transfer", CheckContext(pd, T, probes=run, entry=ENTRY))
    assert results[0].status is Status.FAIL and "never reached the decode" in results[0].message


def test_a_prefill_that_says_it_sent_the_whole_prompt_does_not_make_up_what_it_computed():
    # Found on the builtin P/D trio (fault shortened-prompt on the prefill): the prefill computed
    # half and its transfer counter said it sent KV for all of it; that counter is what it SENT,
    # never KV it received, so it cannot account for a token it did not compute or find cached.
    pd = (snap(PREFILL, Role.PREFILL), snap(DECODE, Role.DECODE))
    half = CounterDelta(prefilled_tokens=SENT // 2, cached_prompt_tokens=0, kv_transfer_tokens=SENT)
    decode = CounterDelta(prefilled_tokens=0, cached_prompt_tokens=0, kv_transfer_tokens=SENT)
    run = probes({PREFILL: half, DECODE: decode}, reached=(PREFILL, DECODE))
    (r,) = check("prompt-integrity", CheckContext(pd, T, probes=run, entry=ENTRY))
    assert r.status is Status.FAIL and f"computed {SENT // 2:,} tokens" in r.message, r.message
    assert "received KV for 0 tokens" in r.message
    # A unified engine's transfer counter is KV it loaded from elsewhere (vLLM's KV connector): it counts.
    loaded = CounterDelta(prefilled_tokens=SENT // 2, cached_prompt_tokens=0, kv_transfer_tokens=SENT - SENT // 2)
    assert integrity({PREFILL: loaded}).status is Status.PASS
