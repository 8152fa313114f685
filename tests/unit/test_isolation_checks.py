"""Verdict logic of tenant-isolation and prefix-cache-isolation on hand-built probe results (no
server), plus the CLI's per-tenant credential parsing and the marker scan the prober uses."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks import CHECK_IDS, CheckContext, run_checks
from kvpreflight._internal.checks.prefix_cache_isolation import GENERIC_FIX
from kvpreflight._internal.probes.markers import contains_marker, new_marker
from kvpreflight._internal.probes.results import (
    CacheProbe,
    CacheProbeKind,
    DangerLine,
    Echo,
    Expect,
    IsolationRun,
    Limits,
    PrefixCacheRun,
    ProbeRun,
    Scenario,
    Tenant,
    TenantRequest,
)
from kvpreflight.check_options import CheckOptions, build_plan
from kvpreflight.errors import ConfigError
from kvpreflight.model import Completion, CounterDelta, EngineSnapshot, ErrorKind, Hazard, Role, Status, Waiver

T = load_thresholds()
ENTRY, DECODE = "http://router:1", "http://decode:2"
CANARY = {"a": new_marker("TENANTA"), "b": new_marker("TENANTB")}
CANARIES = {Tenant(name): canary for name, canary in CANARY.items()}


def served(tenant="a", name="normal-a1", own=True, crossings=(), cached=None, ttft=0.05, status=200, **kw) -> TenantRequest:
    c = Completion(sent_tokens=4000, max_tokens=256, streamed=False, status=status, elapsed_s=ttft, completion_tokens=256,
                   prompt_tokens=4000, cached_tokens=cached, body_bytes=100, body_sha256="ab", ttft_s=ttft, text="never serialized")
    echo = Echo(own=own, sent_tokens=4000, chars=len(c.text), sha256=hashlib.sha256(c.text.encode()).hexdigest())
    return TenantRequest(tenant=Tenant(tenant), name=name, completion=c, echo=echo, crossings=tuple(crossings), **kw)


def refused(tenant="b", name="over-capacity-b-over") -> TenantRequest:
    c = Completion(sent_tokens=8193, max_tokens=256, streamed=False, status=400, elapsed_s=0.01,
                   error_message="The input (8193 tokens) is longer than the model's context length (8192 tokens).",
                   error_kind=ErrorKind.LENGTH)
    return TenantRequest(tenant=Tenant(tenant), name=name, completion=c, expect=Expect.REJECT)


def scenario(name="normal", requests=None, **kw) -> Scenario:
    requests = requests if requests is not None else (served("a", "normal-a1"), served("b", "normal-b1"))
    fields = {"occurred": True, "occurrence": "both tenants ran", "idle_after": {DECODE: True}, **kw}
    return Scenario(name=name, purpose="test", requests=tuple(requests), **fields)


def cache_run(cross_cached=0, warm_cached=1008, off=None, ttft=(0.080, 0.020, 0.080), hit_delta=None,
              cross_deltas=None) -> PrefixCacheRun:
    """`cross_deltas`: each engine's counters over every cross-tenant request (url -> field -> delta)."""
    probes = []
    for k in range(3):
        for kind, tenant, cached, t in (("cold", "a", 0, ttft[0]), ("warm", "a", warm_cached, ttft[1]),
                                        ("warm", "a", warm_cached, ttft[1]), ("cross", "b", cross_cached, ttft[2])):
            c = Completion(sent_tokens=1024, max_tokens=1, streamed=True, status=200, elapsed_s=t, completion_tokens=1, prompt_tokens=1024,
                           cached_tokens=cached, ttft_s=t)
            probes.append(CacheProbe(kind=CacheProbeKind(kind), tenant=Tenant(tenant), prefix=k, completion=c,
                                     hit_metric_delta=hit_delta, counter_deltas=(cross_deltas or {}) if kind == "cross" else {}))
    return PrefixCacheRun(probes=tuple(probes), binding="a cache_salt per tenant", caching_off=off, prompt_tokens=1024)


def iso(*scenarios, cache=None, **kw) -> IsolationRun:
    return IsolationRun(scenarios=scenarios or (scenario(),), cache=cache or cache_run(), canaries=CANARIES,
                        binding="a cache_salt per tenant", healthy_after={DECODE: True}, idle_after={DECODE: True}, **kw)


DEFAULT_PROBES = ProbeRun(limits=Limits(8192, 16384, 8185))


def ctx(isolation, probes=DEFAULT_PROBES) -> CheckContext:
    snap = EngineSnapshot(url=DECODE, engine="builtin", version="x", role=Role.DECODE, model="m", served_context=8192)
    return CheckContext((snap,), T, None, probes, ENTRY, isolation=isolation)


def one(check_id: str, isolation, **kw):
    (result,) = run_checks(ctx(isolation, **kw), [check_id])
    return result


# -- tenant-isolation ----------------------------------------------------------------------------

def test_clean_run_with_echoing_model_passes_and_names_every_scenario():
    r = one("tenant-isolation", iso(scenario("normal"), scenario("boundary")))
    assert r.status is Status.PASS
    assert "normal, boundary" in r.message and "every scanned answer repeated its own prompt" in r.message
    assert r.evidence["canaries"] == CANARY  # our synthetic markers are the only text ever quoted
    assert "never serialized" not in json.dumps(r.evidence)


def test_a_crossing_fails_with_scenario_request_and_marker_even_without_echo_elsewhere():
    victim = served("b", "cancel-transfer-b2", own=False, crossings=(CANARY["a"],))
    r = one("tenant-isolation", iso(scenario("normal"), scenario("cancel-transfer", (served("a"), victim), churn=True)))
    assert r.status is Status.FAIL
    assert "cancel-transfer-b2 (cancel-transfer)" in r.message and CANARY["a"] in r.message
    (crossing,) = r.evidence["crossings"]
    assert crossing["scenario"] == "cancel-transfer" and crossing["foreign_markers"] == [CANARY["a"]]
    assert crossing["http_status"] == 200


def test_a_model_that_does_not_echo_is_inconclusive_not_pass():
    quiet = scenario("normal", (served("a", own=False), served("b", "normal-b1", own=False)))
    r = one("tenant-isolation", iso(quiet))
    assert r.status is Status.INCONCLUSIVE
    assert "model does not echo" in r.message


def test_where_the_model_echoes_an_answer_that_does_not_fails():
    """Issue 44: the echo control is judged per answer; one tenant's echo does not vouch for the
    other tenant's answers, which repeated nothing of their prompts (the incident's stale pages)."""
    half = scenario("normal", (served("a", own=True), served("b", "normal-b1", own=False)))
    r = one("tenant-isolation", iso(half))
    assert r.status is Status.FAIL, r.message
    assert "tenant B's normal-b1 (normal)" in r.message and "text that is not from it" in r.message
    assert "never serialized" not in json.dumps(r.evidence) + r.message  # the answer's text is never quoted
    answer = r.evidence["scenarios"][0]["requests"][1]
    assert answer["own_prompt_repeated"] is False and len(answer["answer_sha256"]) == 64


def test_a_model_that_echoes_nowhere_is_inconclusive_not_failed():
    silent = scenario("normal", (served("a", own=False), served("b", "normal-b1", own=False)))
    r = one("tenant-isolation", iso(silent))
    assert r.status is Status.INCONCLUSIVE and "model does not echo" in r.message


def test_churn_scenarios_skipped_with_the_reason_but_the_rest_still_judged():
    reason = "disruptive against a live vllm deployment; pass --allow-disruptive to run it"
    skipped = Scenario(name="cancel-transfer", purpose="test", skipped=reason, churn=True)
    r = one("tenant-isolation", iso(scenario("normal"), skipped, Scenario(name="load", purpose="test", skipped=reason, churn=True)))
    assert r.status is Status.PASS
    assert f"cancel-transfer, load: not run ({reason})" in r.message
    assert {"scenario": "cancel-transfer", "purpose": "test", "skipped": reason} in r.evidence["scenarios"]


def test_unconfirmed_scenario_warns():
    unsure = scenario("cancel-transfer", churn=True, occurred=None,
                      occurrence="unconfirmed: no deferred-release counter moved and no page log is reachable over HTTP")
    r = one("tenant-isolation", iso(scenario("normal"), unsure))
    assert r.status is Status.WARN and "cancel-transfer: unconfirmed" in r.message


def test_a_danger_line_logged_during_a_scenario_warns_and_is_quoted_with_the_request_it_names():
    line = DangerLine(source=DECODE, what="Decode transfer failed for request", request_id="kvpreflight-00aa",
                      names="tenant b's request load-b1")
    r = one("tenant-isolation", iso(scenario("normal"), scenario("load", churn=True, danger_lines=(line,))))
    assert r.status is Status.WARN
    assert (f'load: 2 requests, no crossing; the logs say: {DECODE} log: "Decode transfer failed for request" '
            "(logged during the load scenario, naming tenant b's request load-b1)") in r.message
    (load,) = [s for s in r.evidence["scenarios"] if s["scenario"] == "load"]
    assert load["danger_lines"] == [{"source": DECODE, "what": line.what, "request_id": "kvpreflight-00aa",
                                     "when": "logged during the load scenario", "names": "tenant b's request load-b1",
                                     "hazard": "transfer"}]
    crossed = scenario("load", (served("a"), served("b", "load-b1", crossings=(CANARY["a"],))), churn=True, danger_lines=(line,))
    assert one("tenant-isolation", iso(crossed)).status is Status.FAIL  # with a crossing it is part of the failure


def test_a_kv_canary_violation_in_a_scenario_fails_quoting_slot_position_and_reason():
    """SGLang's own KV canary (--kv-canary log) logs a violation and serves on: the scenario it
    falls in fails, even though no tenant canary crossed."""
    line = DangerLine(source=DECODE, what="kv_canary violation", hazard=Hazard.KV_CANARY,
                      detail="slot_idx=4123 position=17 fail_reason=verify_token stored_token=881 expected_token=42 launch_tag=HEAD_K_FULL")
    r = one("tenant-isolation", iso(scenario("normal"), scenario("load", churn=True, danger_lines=(line,))))
    assert r.status is Status.FAIL, r.message
    assert r.message.startswith("load: the engine's own KV canary found KV slots not holding what was written"), r.message
    assert (f'{DECODE} log: "kv_canary violation (slot_idx=4123 position=17 fail_reason=verify_token stored_token=881 '
            'expected_token=42 launch_tag=HEAD_K_FULL)" (logged during the load scenario)') in r.message
    crossed = scenario("load", (served("a"), served("b", "load-b1", crossings=(CANARY["a"],))), churn=True, danger_lines=(line,))
    both = one("tenant-isolation", iso(crossed))
    assert both.status is Status.FAIL and "carried" in both.message and "slot_idx=4123" in both.message


def test_an_expired_kv_lease_counted_in_a_scenario_warns_naming_the_cost():
    expired = {"http://prefill:1": CounterDelta(expired_kv=2.0)}
    r = one("tenant-isolation", iso(scenario("normal"), scenario("cancel-decode", churn=True, counter_deltas=expired)))
    assert r.status is Status.WARN, r.message
    assert "cancel-decode: 2 requests, no crossing; the prefill released KV no decode had read within its lease" in r.message
    assert "http://prefill:1 counted 2 request(s) whose KV lease ran out unread (during the cancel-decode scenario)" in r.message


def test_pages_not_back_to_idle_after_a_scenario_fail():
    r = one("tenant-isolation", iso(scenario("cancel-decode", churn=True, idle_after={DECODE: False})))
    assert r.status is Status.FAIL and "still held" in r.message and DECODE in r.message


def test_failure_counters_moving_in_a_plain_scenario_warn_but_not_in_cancellations():
    moved = {DECODE: CounterDelta(transfer_failures=1.0, bootstrap_failures=0.0)}
    assert one("tenant-isolation", iso(scenario("normal", counter_deltas=moved))).status is Status.WARN
    assert one("tenant-isolation", iso(scenario("cancel-transfer", counter_deltas=moved, churn=True))).status is Status.PASS


def test_a_tenant_with_no_served_answer_makes_the_scenario_inconclusive():
    only_refusals = scenario("over-capacity", (served("a", "over-capacity-a-long"), refused("b")))
    r = one("tenant-isolation", iso(scenario("normal"), only_refusals))
    assert r.status is Status.INCONCLUSIVE and "tenant b" in r.message


def test_engine_unhealthy_after_the_probes_fails():
    run = IsolationRun(scenarios=(scenario(),), cache=cache_run(), canaries=CANARIES, binding="x",
                       healthy_after={DECODE: False}, idle_after={DECODE: True})
    assert one("tenant-isolation", run).status is Status.FAIL


def test_capacity_only_and_not_run_are_skip_and_inconclusive():
    r = one("tenant-isolation", None, probes=None)
    assert r.status is Status.SKIP and "--capacity-only" in r.message
    r = one("prefix-cache-isolation", IsolationRun(not_run="isolation probes could not run: boom"))
    assert r.status is Status.INCONCLUSIVE and "boom" in r.message


def test_waiver_keeps_what_was_found():
    quiet = scenario("normal", (served("a", own=False), served("b", "normal-b1", own=False)))
    (r,) = run_checks(ctx(iso(quiet)), ["tenant-isolation"], [Waiver("tenant-isolation", "random-weight test model")])
    assert r.status is Status.SKIP and r.evidence["status_before_waiver"] == "inconclusive"
    assert "model does not echo" in r.message


# -- prefix-cache-isolation ----------------------------------------------------------------------

def test_same_salt_hit_and_other_salt_miss_passes_with_ttft_figures():
    r = one("prefix-cache-isolation", iso(cache=cache_run(ttft=(0.080, 0.020, 0.078))))
    assert r.status is Status.PASS
    assert "3 of 3" in r.message and "0 of 3" in r.message and "cold 80.0 ms, warm 20.0 ms, cross-tenant 78.0 ms" in r.message
    assert r.evidence["ttft_median_s"] == {"cold": 0.08, "warm": 0.02, "cross": 0.078}
    assert [p["cached_tokens"] for p in r.evidence["probes"][:4]] == [0, 1008, 1008, 0]  # a zero is evidence too


def test_cross_tenant_hit_fails():
    r = one("prefix-cache-isolation", iso(cache=cache_run(cross_cached=1008)))
    assert r.status is Status.FAIL and "1008" in r.message and "not bound to the tenant" in r.message


def test_cross_tenant_hit_seen_only_in_the_hit_metric_fails():
    r = one("prefix-cache-isolation", iso(cache=cache_run(cross_cached=None, warm_cached=None, hit_delta=1.0)))
    assert r.status is Status.FAIL


def test_no_same_tenant_hit_means_the_control_failed():
    r = one("prefix-cache-isolation", iso(cache=cache_run(warm_cached=0)))
    assert r.status is Status.INCONCLUSIVE and "positive control failed" in r.message


def test_caching_off_is_said_not_passed():
    r = one("prefix-cache-isolation", iso(cache=cache_run(warm_cached=0, off="http://decode:2 reports it off")))
    assert r.status is Status.SKIP and "prefix caching is off" in r.message


def test_no_cached_tokens_and_no_metric_is_inconclusive():
    r = one("prefix-cache-isolation", iso(cache=cache_run(warm_cached=None, cross_cached=None)))
    assert r.status is Status.INCONCLUSIVE and "cannot be seen" in r.message


def test_counted_hits_decide_and_ttft_is_only_reported():
    # The fixed warm/cold gap thresholds are gone: where the engine counts its cache hits, a
    # warm-like cross-tenant TTFT over three prefixes is reported, not judged (no KS power at n=3).
    r = one("prefix-cache-isolation", iso(cache=cache_run(ttft=(0.080, 0.020, 0.025))))
    assert r.status is Status.PASS and "cross-tenant 25.0 ms" in r.message and "timing_audit" not in r.evidence


def test_a_few_leading_cached_tokens_are_not_a_hit():
    # llama.cpp reuses a slot's prompt token by token: a fresh prefix shares its first tokens
    # ("KVPF-SHARED-") with the previous one. Only most of the prompt counts as the prefix reused.
    r = one("prefix-cache-isolation", iso(cache=cache_run(cross_cached=12)))
    assert r.status is Status.PASS, r.message


# -- contradictions: the answer's cached_tokens against each engine's own counters ---------------

PREFILL = "http://prefill:3"


def pd_ctx(isolation, engine="sglang") -> CheckContext:
    snaps = tuple(EngineSnapshot(url=url, engine=engine, version="x", role=role, model="m", served_context=8192, page_size=1)
                  for url, role in ((PREFILL, Role.PREFILL), (DECODE, Role.DECODE)))
    return CheckContext(snaps, T, None, DEFAULT_PROBES, ENTRY, isolation=isolation)


def window(cached=None, hits=None, requests=1, prompt=1024) -> CounterDelta:
    """One engine's counters over one cross-tenant request (None: it has no such counter)."""
    return CounterDelta(requests=requests, prompt_tokens=prompt, cached_prompt_tokens=cached, prefix_cache_hits=hits)


def test_a_decode_whose_own_cache_hit_across_tenants_fails_though_the_answer_says_0_cached():
    """Issue 44: SGLang's decode-side radix cache ignores the salt; the answer carries the
    prefill's cached_tokens 0, the decode's counters found 1,016 of the 1,024 tokens."""
    deltas = {PREFILL: window(cached=0, hits=0), DECODE: window(cached=1016, hits=1016)}
    (r,) = run_checks(pd_ctx(iso(cache=cache_run(cross_cached=0, cross_deltas=deltas))), ["prefix-cache-isolation"])
    assert r.status is Status.FAIL, r.message
    assert r.message.startswith("tenant B reused tenant A's cached prefix (3 of 3 cross-tenant requests hit; first: the answer "
                                "said cached tokens: 0 of 1024, but decode http://decode:2 found 1,016 of its prompt tokens in "
                                "its own prefix cache; the answer and the engines' counters disagree, and the counter that saw "
                                "the hit is believed)"), r.message
    assert "--disaggregation-decode-enable-radix-cache" in r.message and "turn the decode's prefix cache off" in r.message
    assert r.evidence["probes"][3]["engine_cache_hits"] == {PREFILL: {"cached_prompt_tokens": 0, "prefix_cache_hits": 0},
                                                            DECODE: {"cached_prompt_tokens": 1016, "prefix_cache_hits": 1016}}


def test_a_prefill_hit_counter_that_moved_fails_though_the_answer_says_0_cached():
    """The other shape: a unified engine (a gateway rewrites usage) whose only hit counter counts
    lookups, no tokens, and moved on every cross-tenant request while the answer said 0."""
    snap = EngineSnapshot(url=ENTRY, engine="sglang", version="x", role=Role.UNIFIED, model="m", served_context=8192)
    isolation = iso(cache=cache_run(cross_cached=0, cross_deltas={ENTRY: window(hits=1)}))
    (r,) = run_checks(CheckContext((snap,), T, None, DEFAULT_PROBES, ENTRY, isolation=isolation), ["prefix-cache-isolation"])
    assert r.status is Status.FAIL and "unified http://router:1's prefix-cache hit counter moved by 1" in r.message, r.message
    assert GENERIC_FIX in r.message


def test_a_counter_hit_with_other_traffic_in_its_window_is_inconclusive_never_a_pass():
    deltas = {PREFILL: window(cached=1016, hits=1016, requests=3, prompt=4000), DECODE: window(cached=0, hits=0)}
    (r,) = run_checks(pd_ctx(iso(cache=cache_run(cross_cached=0, cross_deltas=deltas))), ["prefix-cache-isolation"])
    assert r.status is Status.INCONCLUSIVE, r.message
    assert r.message.startswith("3 of 3 cross-tenant requests may have reused tenant A's cached prefix: the answer said "
                                "cached tokens: 0 of 1024, but prefill http://prefill:3 found 1,016 of its prompt tokens in "
                                "its own prefix cache, while other traffic was in the window (http://prefill:3 counted 4,000 "
                                "prompt tokens; http://prefill:3 finished 3 requests)"), r.message
    assert "rerun with no other traffic on the engines" in r.message


@pytest.mark.parametrize("deltas", [
    {PREFILL: window(cached=0, hits=0), DECODE: window(cached=0, hits=0)},
    {PREFILL: window(cached=12, hits=12), DECODE: window()},  # a few leading tokens: not the prefix reused
    {PREFILL: window(cached=0, hits=0, requests=5, prompt=9000), DECODE: window(cached=0)},  # other traffic, no hit
])
def test_counters_that_agree_with_the_answer_pass(deltas):
    (r,) = run_checks(pd_ctx(iso(cache=cache_run(cross_cached=0, cross_deltas=deltas))), ["prefix-cache-isolation"])
    assert r.status is Status.PASS and "the other tenant never did (0 of 3)" in r.message, r.message


def llama_ctx(isolation) -> CheckContext:
    snap = EngineSnapshot(url=ENTRY, engine="llamacpp", version="b1", role=Role.UNIFIED, model="m", served_context=2048)
    return CheckContext((snap,), T, None, DEFAULT_PROBES, ENTRY, isolation=isolation)


def test_llama_cpp_shared_slot_fails_naming_the_fix():
    (r,) = run_checks(llama_ctx(iso(cache=cache_run(cross_cached=1023))), ["prefix-cache-isolation"])
    assert r.status is Status.FAIL and "1023 of 1024" in r.message
    assert "pin each tenant to its own slot" in r.message and "force cache_prompt false" in r.message


# -- the timing audit (counters silent) --------------------------------------------------------

def timing_run(cold_ms: float, warm_ms: float, cross_ms: float, samples: int = 30, unserved: int = 0,
               off: str | None = None, fresh_ms: float | None = None, cross_fresh_ms: float | None = None) -> PrefixCacheRun:
    """Silent counters (no cached_tokens, no hit metric) and `samples` timing samples per kind,
    each a deterministic spread of +-10% around its centre; each tenant's fresh prompt as cold
    unless given."""
    silent = cache_run(warm_cached=None, cross_cached=None, off=off)
    timing = []
    fresh = cold_ms if fresh_ms is None else fresh_ms
    kinds = (("cold", "a", cold_ms), ("warm", "a", warm_ms), ("cross", "b", cross_ms), ("fresh", "a", fresh),
             ("cross-fresh", "b", fresh if cross_fresh_ms is None else cross_fresh_ms))
    for k in range(samples):
        spread = 0.9 + 0.2 * ((k * 7) % samples) / samples
        for kind, tenant, ms in kinds:
            status = 503 if (kind == "cross" and k < unserved) else 200
            t = ms * spread / 1000
            c = Completion(sent_tokens=512, max_tokens=1, streamed=True, status=status, elapsed_s=t, completion_tokens=1,
                           prompt_tokens=512, ttft_s=t)
            timing.append(CacheProbe(kind=CacheProbeKind(kind), tenant=Tenant(tenant), prefix=k, completion=c))
    return replace(silent, timing=tuple(timing), timing_prompt_tokens=512)


def test_timing_audit_cross_tenant_as_slow_as_a_fresh_prompt_passes():
    r = one("prefix-cache-isolation", iso(cache=timing_run(82, 13, 81)))
    assert r.status is Status.PASS and "not warm" in r.message, r.message
    ks = r.evidence["timing_audit"]["ks"]
    assert ks["warm_vs_fresh"]["p_value"] < 0.001 and ks["cross_vs_warm"]["p_value"] < 0.001
    assert ks["cross_vs_cross_fresh"]["p_value"] > 0.5
    assert r.evidence["timing_audit"]["samples"] == {"cold": 30, "warm": 30, "cross": 30, "fresh": 30, "cross-fresh": 30}
    assert "over 30 samples of 512 tokens; KS p fresh/warm" in r.message
    medians = r.evidence["timing_audit"]["ttft_median_ms"]
    assert 12 < medians["warm"] < 14 and 79 < medians["cross"] < medians["fresh"] < 83


def test_timing_audit_cross_tenant_as_fast_as_warm_fails():
    r = one("prefix-cache-isolation", iso(cache=timing_run(82, 13, 13.2)))
    assert r.status is Status.FAIL and "as fast as tenant A's warm repeats" in r.message, r.message
    assert GENERIC_FIX in r.message


def test_timing_audit_without_a_warm_fresh_difference_is_inconclusive():
    r = one("prefix-cache-isolation", iso(cache=timing_run(82, 81, 13)))
    assert r.status is Status.INCONCLUSIVE and "not measurably faster" in r.message, r.message
    # a saving seen but not significant: more samples are the way to a verdict, and the message says so
    assert "but not significantly: more samples may decide it (--timing-samples, now 30)" in r.message
    slower = one("prefix-cache-isolation", iso(cache=timing_run(81, 82, 13)))
    assert slower.status is Status.INCONCLUSIVE and "--timing-samples" not in slower.message, slower.message


def test_a_repeat_faster_only_because_it_is_not_first_is_inconclusive_never_a_fail():
    """A request that is not a sample's first can be faster with nothing cached: llama.cpp with its
    prompt cache off answered every repeat 1 ms sooner than the sample's first request (cold 8.0 ms,
    warm 7.0, cross-tenant 7.0; KS p cold/warm 1.3e-6, cross/warm 0.83; docs/FINDINGS.md), so an
    audit judging against cold would fail an honest engine. A fresh prompt sent in the repeats'
    places is as fast as they are: nothing was cached."""
    r = one("prefix-cache-isolation", iso(cache=timing_run(8.0, 7.0, 7.0, samples=20, fresh_ms=7.0)))
    assert r.status is Status.INCONCLUSIVE and "not measurably faster than a fresh prompt" in r.message, r.message
    assert "cold 8.0 ms, fresh 7.0 ms (tenant B's 7.0 ms), warm 7.0 ms" in r.message, r.message


def test_timing_audit_cross_between_warm_and_fresh_is_inconclusive():
    # warm 13 ms +-10%, fresh 82 ms: cross at 40 ms overlaps neither, so both KS tests reject: the
    # other tenant got part of a saving, which is not "no sharing"
    r = one("prefix-cache-isolation", iso(cache=timing_run(82, 13, 40)))
    assert r.status is Status.INCONCLUSIVE and "part of the prefix may have been reused" in r.message, r.message
    # a cross-tenant sample faster than warm is neither pattern either
    r = one("prefix-cache-isolation", iso(cache=timing_run(82, 13, 5)))
    assert r.status is Status.INCONCLUSIVE and "neither clearly warm nor clearly not" in r.message, r.message


def test_timing_audit_with_unserved_samples_is_inconclusive():
    r = one("prefix-cache-isolation", iso(cache=timing_run(82, 13, 13, unserved=2)))
    assert r.status is Status.INCONCLUSIVE and "2 of 150 timing-audit requests were not served (first: HTTP 503" in r.message


def test_a_shared_hit_hidden_by_a_slower_path_for_tenant_b_is_never_a_pass():
    """A gateway that spends 30 ms more on tenant B's requests, in front of a cache shared by both
    tenants: B's hits (13 + 30 ms) are then as slow as A's fresh prompts (45 ms) and, judged against
    tenant A's times alone, passed as "not warm". B's own fresh prompts (45 + 30 ms) show the hit."""
    r = one("prefix-cache-isolation", iso(cache=timing_run(45, 13, 43, fresh_ms=45, cross_fresh_ms=75)))
    assert r.status is Status.INCONCLUSIVE and "faster than tenant B's fresh prompts" in r.message, r.message
    # the same slower path with nothing shared: B's repeats are as slow as B's fresh prompts, a pass
    honest = one("prefix-cache-isolation", iso(cache=timing_run(45, 13, 75, fresh_ms=45, cross_fresh_ms=75)))
    assert honest.status is Status.PASS, honest.message


# -- wiring ----------------------------------------------------------------------------------------

def test_tenant_keys_come_from_the_environment_and_bind_the_tenants(monkeypatch):
    monkeypatch.setenv("KEY_A", "secret-a")
    monkeypatch.setenv("KEY_B", "secret-b")
    plan = build_plan(tenant_args("KEY_A", "KEY_B", "X-Tenant"))
    a, b = plan.auth.tenant_headers
    assert a == {"Authorization": "Bearer secret-a", "X-Tenant": "a"} and b["X-Tenant"] == "b"
    binding = plan.auth.tenant_binding
    assert binding and "secret" not in binding and "$KEY_A" in binding and "X-Tenant" in binding
    assert {"secret-a", "secret-b"} <= plan.auth.secrets
    plain = build_plan(tenant_args(None, None, None))
    assert plain.auth.tenant_headers == ({}, {}) and plain.auth.tenant_binding is None


def tenant_args(a: str | None, b: str | None, header: str | None) -> CheckOptions:
    return CheckOptions(endpoints=("http://127.0.0.1:1",), tenant_a_key_env=a, tenant_b_key_env=b, tenant_header=header)


@pytest.mark.parametrize("args,needle", [
    (("KEY_A", None, None), "go together"),
    (("KEY_A", "KEY_A", None), "same variable"),
    (("KEY_A", "UNSET_KEY", None), "UNSET_KEY"),
    (("KEY_A", "KEY_SAME", None), "same key"),
    ((None, None, "X Tenant"), "header name"),
])
def test_bad_tenant_options_are_usage_errors(monkeypatch, args, needle):
    monkeypatch.setenv("KEY_A", "secret-a")
    monkeypatch.setenv("KEY_SAME", "secret-a")
    monkeypatch.delenv("UNSET_KEY", raising=False)
    with pytest.raises(ConfigError) as err:
        build_plan(tenant_args(*args))
    assert needle in str(err.value) and "secret" not in str(err.value)


def test_marker_scan_counts_fragments():
    m = CANARY["a"]
    assert contains_marker(f"xx{m}yy", m)
    assert contains_marker("..." + m[-14:], m)  # cut by a page boundary
    assert not contains_marker(m[:-13], m)


def test_isolation_checks_are_registered_in_report_order():
    assert CHECK_IDS.index("engine-healthy-after") < CHECK_IDS.index("tenant-isolation") < CHECK_IDS.index("prefix-cache-isolation")


def test_a_fail_in_one_scenario_does_not_hide_another_scenarios_warning():
    """Seen on the real vLLM pair: a late read on a served request failed the normal scenario, and
    the message dropped cancel-transfer's own late reads; both are said, the fail first."""
    stuck = scenario("normal", idle_after={DECODE: False})
    expired = {"http://prefill:1": CounterDelta(expired_kv=2.0)}
    r = one("tenant-isolation", iso(stuck, scenario("cancel-decode", churn=True, counter_deltas=expired)))
    assert r.status is Status.FAIL, r.message
    fail, _, rest = r.message.partition("; also: ")
    assert fail.startswith("normal: KV pages still held afterwards") and rest.startswith("cancel-decode: "), r.message
    assert "whose KV lease ran out unread (during the cancel-decode scenario)" in rest
