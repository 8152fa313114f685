"""Issue 44: an answer proves only what it proves. A near-limit answer must come from its own
prompt (an echoing model repeats it; a long-range one from its head) and no faster than the
engine can prefill what it reports. Both variants of each class differ in shape: streamed and
not, the limit prompt and the concurrent pair, a calibration that stalled and one that did not."""

from __future__ import annotations

import hashlib
import json

from support.fake_adapter import snapshot

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks import CheckContext, run_checks
from kvpreflight._internal.probes.results import Echo, Expect, Limits, ProbeResult, ProbeRun, Tenant
from kvpreflight.model import Completion, Status

URL = "http://engine:1"
CONTEXT, LIMIT = 4096, 4089
SPEED = 6800.0  # tokens/s: about 0.6 s for the limit prompt, as the engine measured
STALE = "order 000017: CUSTOMER-SECRET-4f1e9a0c "  # another customer's text in the stale pages


def answer(tokens: int, first_token_s: float, *, text: str, max_tokens: int = 256, cached: int = 0,
           stream: bool = True) -> Completion:
    return Completion(sent_tokens=tokens, max_tokens=max_tokens, streamed=stream, status=200,
                      elapsed_s=first_token_s + 0.01, ttft_s=first_token_s if stream else None,
                      completion_tokens=max_tokens, prompt_tokens=tokens, cached_tokens=cached, text=text,
                      finish_reason="length")


def probe(name: str, c: Completion, *, own: bool | None, head: bool | None = None, tenant: Tenant | None = Tenant.A) -> ProbeResult:
    return ProbeResult(name=name, expect=Expect.ACCEPT, completion=c, purpose="test", tenant=tenant,
                       echo=Echo(own=own, head=head, sent_tokens=c.sent_tokens, chars=len(c.text),
                                 sha256=hashlib.sha256(c.text.encode()).hexdigest()))


def run_of(*probes: ProbeResult, rate: float | None = SPEED, calibration_prefill_s: float | None = None,
           overhead_s: float = 0.005) -> ProbeRun:
    """The calibration's short request (1/16 of the limit, 255 tokens) took 255 / rate past its fixed cost."""
    measured = calibration_prefill_s if calibration_prefill_s is not None else (LIMIT // 16 / rate if rate else None)
    return ProbeRun(limits=Limits(served_context=CONTEXT, pool_tokens=8192, max_accepted=LIMIT), probes=probes,
                    healthy_after={URL: True}, idle_after={URL: True}, prefill_rate=rate, overhead_s=overhead_s,
                    calibration_prefill_s=measured)


def verdicts(run: ProbeRun) -> dict[str, tuple[Status, str, dict]]:
    ctx = CheckContext((snapshot(URL, pool=8192, context=CONTEXT),), load_thresholds(), probes=run, entry=URL)
    return {r.id: (r.status, r.message, r.evidence) for r in run_checks(ctx, ["prompt-integrity", "concurrent-capacity"])}


def honest_pair(first_token_s: float = 0.62) -> tuple[ProbeResult, ...]:
    return (probe("concurrent-1", answer(4085, 0.02, text="KVPF-TENANTA " * 20, max_tokens=4, cached=4080), own=True, head=True),
            probe("concurrent-2", answer(4085, first_token_s, text="KVPF-TENANTB " * 20, max_tokens=4), own=True, head=True,
                  tenant=Tenant.B))


def test_the_incidents_placeholder_answer_came_faster_than_any_prefill_and_fails_prompt_integrity():
    """The limit prompt answered in 12 ms from an engine whose measured speed needs 0.6 s for it."""
    run = run_of(probe("boundary-accept", answer(LIMIT, 0.012, text="x", max_tokens=1), own=None), *honest_pair())
    status, message, evidence = verdicts(run)["prompt-integrity"]
    assert status is Status.FAIL, message
    assert "answered a 4,089-token uncached prompt in 0.012 s" in message and "6,800 tokens/s" in message
    assert "did not compute the prompt it says it computed" in message
    judged = evidence["plausibility"][0]
    assert judged["impossible"] is True and judged["margin"] == 10.0 and judged["needs_at_least_s"] > 0.6


def test_the_concurrent_tenant_b_prompt_answered_from_stale_pages_fails_two_checks_without_quoting_it():
    """Not streamed this time, and slow enough to pass the speed rule: its text is the proof."""
    stale = probe("concurrent-2", answer(4085, 0.7, text=STALE * 10, max_tokens=96, stream=False), own=False, head=False,
                  tenant=Tenant.B)
    run = run_of(probe("boundary-accept", answer(LIMIT, 0.63, text="K", max_tokens=1), own=None),
                 probe("concurrent-1", answer(4085, 0.05, text="KVPF-TENANTA " * 20, max_tokens=96, cached=4080), own=True,
                       head=True), stale)
    got = verdicts(run)
    for check in ("prompt-integrity", "concurrent-capacity"):
        status, message, evidence = got[check]
        assert status is Status.FAIL, (check, message)
        assert "concurrent-2's prompt (4,085 tokens) with text that is not from it" in message
        assert "CUSTOMER-SECRET" not in message + json.dumps(evidence)


def test_an_answer_from_the_last_window_only_fails_prompt_integrity():
    """An answer repeating its prompt's end, not the head, where a 512-token prompt's answer did."""
    short = probe("concurrent-1", answer(512, 0.08, text="KVPF-HEADA KVPF-TENANTA " * 5, max_tokens=96), own=True, head=True)
    tail = probe("concurrent-2", answer(4085, 0.65, text="KVPF-TENANTA " * 10, max_tokens=96), own=True, head=False)
    run = run_of(probe("boundary-accept", answer(LIMIT, 0.63, text="K", max_tokens=1), own=None), short, tail)
    status, message, _ = verdicts(run)["prompt-integrity"]
    assert status is Status.FAIL and "repeated its prompt's end but not its head" in message, message


def test_a_model_that_never_repeats_a_head_is_not_held_to_it():
    """The echo model for vLLM copies 38 tokens back: it never reaches a long prompt's head."""
    run = run_of(probe("boundary-accept", answer(LIMIT, 0.63, text="K", max_tokens=1), own=None),
                 probe("concurrent-1", answer(4085, 0.64, text="KVPF-TENANTA " * 10, max_tokens=96), own=True, head=False),
                 probe("concurrent-2", answer(4085, 0.66, text="KVPF-TENANTB " * 10, max_tokens=96), own=True, head=False,
                       tenant=Tenant.B))
    got = verdicts(run)
    assert got["prompt-integrity"][0] is Status.PASS, got["prompt-integrity"][1]
    assert got["concurrent-capacity"][0] is Status.PASS, got["concurrent-capacity"][1]


def test_an_honest_engine_passes_and_the_message_gives_both_figures():
    run = run_of(probe("boundary-accept", answer(LIMIT, 0.63, text="K", max_tokens=1), own=None), *honest_pair())
    status, message, _ = verdicts(run)["prompt-integrity"]
    assert status is Status.PASS, message
    assert "answered in 0.630 s, which the fastest prefill seen (6,800 tokens/s) allows" in message


def test_a_stalled_calibration_cannot_make_an_honest_answer_look_impossible():
    """The calibration measured 300 tokens/s (a stall); the run's shorter requests went at 20,000
    (a 900-token one, a 2,000-token one): the fastest speed shown is the one judged against, so the
    2,000-token answer in 0.105 s and the limit answer in 0.15 s pass."""
    short = probe("health", answer(900, 0.05, text="K", max_tokens=4, stream=False), own=None, tenant=None)
    fast = probe("concurrent-2", answer(2000, 0.105, text="KVPF-TENANTB " * 20, max_tokens=4), own=True, head=True,
                 tenant=Tenant.B)
    run = run_of(probe("boundary-accept", answer(LIMIT, 0.15, text="K", max_tokens=1), own=None), fast, short, rate=300.0)
    status, message, evidence = verdicts(run)["prompt-integrity"]
    assert status is Status.PASS, message
    assert all(not j["impossible"] and not j["fastest_from"].startswith("the calibration") for j in evidence["plausibility"])


def test_a_cached_prompt_or_an_unmeasured_speed_is_not_judged():
    cached = run_of(probe("boundary-accept", answer(LIMIT, 0.01, text="K", max_tokens=1, cached=4080), own=None))
    assert verdicts(cached)["prompt-integrity"][0] is Status.PASS
    unmeasured = run_of(probe("boundary-accept", answer(LIMIT, 0.01, text="K", max_tokens=1), own=None), rate=None)
    status, _, evidence = verdicts(unmeasured)["prompt-integrity"]
    assert status is Status.PASS and evidence["plausibility"][0]["needs_at_least_s"] is None


def test_a_speed_measured_within_the_fixed_cost_spread_judges_nothing():
    """Live SGLang P/D at a 1,024 context: the calibration's 63-token request took 37 ms past the
    8-token one's 10 ms, so it measured 1,700 tokens/s; the run's small requests took up to 45 ms
    to their first token, so those 37 ms were the pair's per-request spread, not prefill. An honest
    1,017-token answer in 44 ms must not be called impossible (it was, before: a false fail)."""
    small = probe("normal-b10", answer(36, 0.045, text="KVPF-TENANTB " * 3, max_tokens=8), own=True, head=True,
                  tenant=Tenant.B)
    honest = probe("boundary-accept", answer(1017, 0.044, text="K", max_tokens=1), own=None)
    run = run_of(honest, small, rate=1700.0, calibration_prefill_s=0.037, overhead_s=0.01)
    status, message, evidence = verdicts(run)["prompt-integrity"]
    assert status is Status.PASS, message
    (judged,) = evidence["plausibility"]
    assert judged["needs_at_least_s"] is None and judged["fastest_from"] == "no speed measured past the fixed cost"
    # the same run with a calibration whose prefill stood clear of that spread: judged, and impossible
    trusted = run_of(honest, small, rate=1700.0, calibration_prefill_s=0.3, overhead_s=0.01)
    assert verdicts(trusted)["prompt-integrity"][0] is Status.FAIL


def test_a_stalled_request_that_stood_clear_of_the_fixed_cost_does_not_slow_the_speed_judged_against():
    """The calibration's prefill was within the fixed-cost spread (not trusted by itself) but fast;
    a queued request took 0.4 s past its fixed cost (trusted, and slow). The answer is judged, against
    the fastest speed of all, and passes (the builtin engine without a prefix cache was failed when
    the trusted speed alone was used)."""
    small = probe("normal-b10", answer(36, 0.03, text="KVPF-TENANTB " * 3, max_tokens=8), own=True, head=True,
                  tenant=Tenant.B)
    queued = probe("health", answer(900, 0.41, text="K", max_tokens=4, stream=False), own=None, tenant=None)
    honest = probe("boundary-accept", answer(LIMIT, 0.15, text="K", max_tokens=1), own=None)
    run = run_of(honest, small, queued, rate=12000.0, calibration_prefill_s=0.011, overhead_s=0.01)
    status, message, evidence = verdicts(run)["prompt-integrity"]
    assert status is Status.PASS, message
    judged = evidence["plausibility"][0]
    assert judged["fastest_from"] == "the calibration" and not judged["impossible"]
