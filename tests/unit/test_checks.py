"""Verdict logic of every check, on hand-built snapshots and probe results (no server)."""

from __future__ import annotations

import pytest
from support.check_cases import DECODE, ENTRY, PREFILL, T, check, good_probes, ok, refused, run, snap

from kvpreflight._internal.checks import CheckContext, run_checks
from kvpreflight._internal.probes.results import Expect, Limits, ProbeResult, ProbeRun
from kvpreflight.model import (
    Completion,
    CounterDelta,
    ErrorKind,
    Origin,
    PoolReading,
    Report,
    Role,
    Status,
    Waiver,
    exit_code_of,
    verdict_of,
)


@pytest.mark.parametrize("pool,expected", [
    (6500, Status.FAIL), (10000, Status.WARN), (11999, Status.WARN), (12000, Status.PASS), (20000, Status.PASS),
])
def test_kv_capacity_thresholds_come_from_the_shared_data(pool, expected):
    (r,) = check("kv-capacity", CheckContext((snap(pool=pool),), T))
    assert r.status is expected
    assert r.evidence["ratio"] == round(pool / 10000, 4)


def test_slots_that_own_their_cells_need_no_headroom():
    # llama.cpp without --kv-unified: a tight pool still fits one full request per slot
    (r,) = check("kv-capacity", CheckContext((snap(pool=10000, kv_per_slot=True),), T))
    assert r.status is Status.PASS and "each slot owns its cells" in r.message
    (r,) = check("kv-capacity", CheckContext((snap(pool=10000, kv_per_slot=False),), T))
    assert r.status is Status.WARN


def test_kv_capacity_checks_the_larger_of_promised_and_served():
    (r,) = check("kv-capacity", CheckContext((snap(pool=15000),), T, promised_context=16384))
    assert r.status is Status.FAIL and r.evidence["checked_context"] == 16384


def test_kv_capacity_smallest_rank_counts():
    readings = (PoolReading("metrics sglang:max_total_num_tokens", Origin.SCHEDULER, 20000, "dp0"),
                PoolReading("metrics sglang:max_total_num_tokens", Origin.SCHEDULER, 8000, "dp1"))
    (r,) = check("kv-capacity", CheckContext((snap(readings=readings),), T))
    assert r.status is Status.FAIL and r.evidence["kv_pool_tokens"] == 8000


def test_kv_capacity_unknown_pool_is_inconclusive_never_pass():
    (r,) = check("kv-capacity", CheckContext((snap(readings=()),), T))
    assert r.status is Status.INCONCLUSIVE


def test_every_prefill_and_decode_engine_is_checked():
    ctx = CheckContext((snap(PREFILL, Role.PREFILL, pool=6500), snap(DECODE, Role.DECODE, pool=20000)), T)
    results = check("kv-capacity", ctx)
    assert [(r.endpoint, r.status) for r in results] == [(PREFILL, Status.FAIL), (DECODE, Status.PASS)]


def test_capacity_only_skips_probe_checks_with_the_reason():
    (r,) = check("overcapacity-rejected", CheckContext((snap(),), T, probes=None))
    assert r.status is Status.SKIP and "--capacity-only" in r.message


def test_clean_length_rejections_with_an_accepted_twin_pass():
    (r,) = check("overcapacity-rejected", CheckContext((snap(),), T, probes=run(*good_probes()), entry=PREFILL))
    assert r.status is Status.PASS, r.message
    assert "inside an HTTP 200 stream" in r.message


@pytest.mark.parametrize("completion,fragment", [
    (ok(10001, generated=16), "served, not rejected"),
    (ok(10001, generated=16, truncated=True), "silently truncated"),
    (Completion(sent_tokens=10001, max_tokens=16, streamed=False, status=None, elapsed_s=30.0, timed_out=True), "hang"),
    (refused(10001, "Internal Server Error", kind=ErrorKind.OTHER, status=500), "HTTP 500"),
])
def test_served_truncated_hung_or_5xx_over_capacity_requests_fail(completion, fragment):
    probes = run(*good_probes(**{"over-context": completion}))
    (r,) = check("overcapacity-rejected", CheckContext((snap(),), T, probes=probes, entry=PREFILL))
    assert r.status is Status.FAIL and fragment in r.message
    assert "fix: the engine must refuse a prompt over its pool or context before prefill" in r.message  # said with it


def test_placeholder_answer_200_with_one_prompt_token_is_truncation():
    placeholder = ok(10001, generated=16)
    placeholder = Completion(sent_tokens=10001, max_tokens=16, streamed=False, status=200, elapsed_s=0.1, completion_tokens=16,
                             prompt_tokens=1)
    (r,) = check("overcapacity-rejected",
                 CheckContext((snap(),), T, probes=run(*good_probes(**{"over-context": placeholder})), entry=PREFILL))
    assert r.status is Status.FAIL and "processed 1 of 10001" in r.message


def test_out_of_vocabulary_400_is_not_a_capacity_verdict():
    oov = refused(10001, "Token id 1509 is out of vocabulary", kind=ErrorKind.VOCAB)
    (r,) = check("overcapacity-rejected", CheckContext((snap(),), T, probes=run(*good_probes(**{"over-context": oov})), entry=PREFILL))
    assert r.status is Status.INCONCLUSIVE and "vocabulary" in r.message


def test_refusal_without_an_accepted_twin_is_inconclusive():
    (r,) = check("overcapacity-rejected",
                 CheckContext((snap(),), T, probes=run(*good_probes(**{"boundary-accept": refused(9992)})), entry=PREFILL))
    assert r.status is Status.INCONCLUSIVE and "twin" in r.message


def test_refusal_after_kv_reached_decode_fails():
    pd = (snap(PREFILL, Role.PREFILL), snap(DECODE, Role.DECODE))
    moved = {DECODE: CounterDelta(prompt_tokens=10001.0)}
    probes = run(("boundary-accept", ok(9992)), ("over-context", refused(10001), moved), reached=(PREFILL, DECODE))
    (r,) = check("overcapacity-rejected", CheckContext(pd, T, probes=probes, entry=ENTRY))
    assert r.status is Status.FAIL and "decode" in r.message


def test_foreign_marker_in_a_response_fails_and_is_quoted():
    leaked = ProbeResult(name="over-pool", expect=Expect.REJECT, completion=ok(15000, generated=16), purpose="test", reached=(PREFILL,),
                         counter_deltas={},
                         foreign_markers=("KVPF-TENANT-0123456789abcdef01234567",))
    probes = ProbeRun(limits=Limits(20000, 10000, 9993), probes=(
        ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, completion=ok(9992), purpose="t", reached=(PREFILL,)), leaked))
    (r,) = check("overcapacity-rejected", CheckContext((snap(pool=10000, served=20000),), T, probes=probes, entry=PREFILL))
    assert r.status is Status.FAIL and "KVPF-TENANT-0123456789abcdef01234567" in r.message


def test_engine_no_probe_reached_behind_a_router_is_inconclusive():
    pd = (snap(PREFILL, Role.PREFILL), snap(DECODE, Role.DECODE))
    probes = run(*good_probes(), reached=(PREFILL,))
    results = check("overcapacity-rejected", CheckContext(pd, T, probes=probes, entry=ENTRY))
    unreached = [r for r in results if r.endpoint == DECODE]
    assert unreached and unreached[0].status is Status.INCONCLUSIVE


def test_prompt_integrity_needs_exact_token_count():
    short = Completion(sent_tokens=9992, max_tokens=1, streamed=False, status=200, elapsed_s=0.1, completion_tokens=1, prompt_tokens=9000)
    (r,) = check("prompt-integrity", CheckContext((snap(),), T, probes=run(("boundary-accept", short)), entry=PREFILL))
    assert r.status is Status.FAIL and "9,000" in r.message
    (r,) = check("prompt-integrity", CheckContext((snap(),), T, probes=run(("boundary-accept", ok(9992))), entry=PREFILL))
    assert r.status is Status.PASS


def test_silent_max_tokens_clamp_warns_and_explicit_refusal_passes():
    clamp = Completion(sent_tokens=9985, max_tokens=23, streamed=False, status=200, elapsed_s=0.1, completion_tokens=15, prompt_tokens=9985,
                       finish_reason="length")
    (r,) = check("max-tokens-clamp", CheckContext((snap(),), T, probes=run(("clamp", clamp)), entry=PREFILL))
    assert r.status is Status.WARN and "silently cut" in r.message
    (r,) = check("max-tokens-clamp", CheckContext((snap(),), T, probes=run(("clamp", refused(9985))), entry=PREFILL))
    assert r.status is Status.PASS


def test_concurrent_5xx_fails_and_capacity_refusal_passes():
    ctx = lambda c2: CheckContext((snap(),), T, probes=run(("concurrent-1", ok(9992, max_tokens=4)), ("concurrent-2", c2)), entry=PREFILL)
    (r,) = check("concurrent-capacity", ctx(refused(9992, "Context size has been exceeded.", kind=ErrorKind.LENGTH, status=500)))
    assert r.status is Status.FAIL
    (r,) = check("concurrent-capacity", ctx(refused(9992, "busy", kind=ErrorKind.OTHER, status=429)))
    assert r.status is Status.PASS


def test_behaviour_boundary_below_the_reported_pool_fails_sources_agree():
    # misreport: the engine says 20000 but refuses at the boundary its stated pool accepts
    probes = run(("boundary-accept", refused(9992)), ("boundary-reject", refused(9993)), limits=Limits(30000, 10000, 9993))
    (r,) = check("kv-sources-agree", CheckContext((snap(pool=10000, served=30000),), T, probes=probes, entry=PREFILL))
    assert r.status is Status.FAIL and "smaller than reported" in r.message


def test_waiver_keeps_the_finding_and_the_reason():
    waiver = Waiver("kv-capacity", "context lowered in the gateway to 6000")
    (r,) = run_checks(CheckContext((snap(pool=6500),), T), ["kv-capacity"], [waiver])
    assert r.status is Status.SKIP
    assert r.evidence["status_before_waiver"] == "fail" and "gateway" in r.message


def test_verdict_and_exit_codes():
    from kvpreflight.model import CheckResult as R

    assert exit_code_of(verdict_of([R(id="a", status=Status.PASS, message=""), R(id="b", status=Status.WARN, message="")])) == 0
    assert exit_code_of(verdict_of([R(id="a", status=Status.INCONCLUSIVE, message=""), R(id="b", status=Status.PASS, message="")])) == 3
    assert exit_code_of(verdict_of([R(id="a", status=Status.INCONCLUSIVE, message=""), R(id="b", status=Status.FAIL, message="")])) == 1
    assert exit_code_of(verdict_of([])) == 3  # nothing ran: nothing proved
    assert Report("0", (), ()).exit_code == 3


def test_pd_consistency_with_an_unknown_model_is_inconclusive_not_a_pass():
    from dataclasses import replace

    pd = (snap(PREFILL, Role.PREFILL), replace(snap(DECODE, Role.DECODE), model=None))
    (r,) = check("pd-consistency", CheckContext(pd, T))
    assert r.status is Status.INCONCLUSIVE and "model unknown" in r.message
    (r,) = check("pd-consistency", CheckContext((snap(PREFILL, Role.PREFILL), snap(DECODE, Role.DECODE, served=20000)), T))
    assert r.status is Status.FAIL and "served_context differs" in r.message


def test_a_refusal_whose_window_saw_a_transfer_while_others_used_the_deployment_is_inconclusive():
    """The decode's counters moved while a probe was being refused, but another window shows a
    client that is not kvpreflight (the boundary probe's window finished two requests, one sent):
    whose KV moved cannot be told, so neither a pass nor a fail (the honest P/D trio with a third
    customer's traffic once failed here)."""
    pd = (snap(PREFILL, Role.PREFILL), snap(DECODE, Role.DECODE))
    moved = {DECODE: CounterDelta(kv_transfers=1.0, kv_transfer_tokens=384.0)}
    busy = {PREFILL: CounterDelta(requests=2.0, prompt_tokens=9992.0 + 384.0)}
    probes = run(("boundary-accept", ok(9992), busy), ("over-context", refused(10001), moved), reached=(PREFILL, DECODE))
    (r,) = check("overcapacity-rejected", CheckContext(pd, T, probes=probes, entry=ENTRY))
    assert r.status is Status.INCONCLUSIVE, r.message
    assert "other traffic was on the deployment (http://p:1 counted 10,376 prompt tokens)" in r.message
    # the same window alone, nothing else on the deployment: the transfer was the refused probe's
    quiet = run(("boundary-accept", ok(9992), {PREFILL: CounterDelta(requests=1.0, prompt_tokens=9992.0)}),
                ("over-context", refused(10001), moved), reached=(PREFILL, DECODE))
    (r,) = check("overcapacity-rejected", CheckContext(pd, T, probes=quiet, entry=ENTRY))
    assert r.status is Status.FAIL and "KV reached the decode engine first" in r.message


def test_a_refusal_sent_again_is_cleared_only_by_a_quiet_window_beside_other_traffic():
    """The prober sends a refused over-capacity probe again when a decode's counters moved in its
    window: with other traffic on the deployment a later window with nothing moving clears it;
    in a quiet run the first window already proved the KV was the probe's, whatever came after."""
    from dataclasses import replace

    pd = (snap(PREFILL, Role.PREFILL), snap(DECODE, Role.DECODE))
    moved = {DECODE: CounterDelta(kv_transfers=1.0, kv_transfer_tokens=384.0)}

    def judged(boundary_window):
        probes = run(("boundary-accept", ok(9992), boundary_window), ("over-context", refused(10001), {}),
                     reached=(PREFILL, DECODE))
        again = replace(probes.probes[1], earlier_windows=(moved, moved))
        (r,) = check("overcapacity-rejected", CheckContext(pd, T, probes=replace(probes, probes=(probes.probes[0], again)),
                                                          entry=ENTRY))
        return r

    busy = judged({PREFILL: CounterDelta(requests=2.0, prompt_tokens=9992.0 + 384.0)})
    assert busy.status is Status.PASS, busy.message
    assert "sent 3 times" in busy.message and "other traffic was on the deployment" in busy.message
    assert busy.evidence["probes"][0]["earlier_windows"] == [{DECODE: {"kv_transfers": 1.0, "kv_transfer_tokens": 384.0}}] * 2
    quiet = judged({PREFILL: CounterDelta(requests=1.0, prompt_tokens=9992.0)})
    assert quiet.status is Status.FAIL and "in its first window" in quiet.message, quiet.message
