"""pd-transfer on probe results built by hand: the decode's own counters over each served probe
say whether the prompt's KV moved from prefill to decode (the counters' names are the adapters'
business: kv_transfer_tokens received, prefilled_tokens computed on the decode itself)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks import CheckContext, run_checks
from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.engines.log_patterns import LogSignal
from kvpreflight._internal.engines.sglang import SglangAdapter
from kvpreflight._internal.engines.untrusted import parse_metrics
from kvpreflight._internal.engines.vllm import LEASE_SETTING, VllmAdapter
from kvpreflight._internal.probes.logs import LogWatch, named_by_request_id
from kvpreflight._internal.probes.results import DangerLine, Expect, Limits, ProbeResult, ProbeRun
from kvpreflight._internal.routers.vllm_router import VllmRouter
from kvpreflight.model import (
    TRANSFER_SECONDS,
    TRANSFERS_TIMED,
    CheckResult,
    Completion,
    CounterDelta,
    EngineSnapshot,
    Hazard,
    KvDeadline,
    Role,
    Status,
    Waiver,
)

PREFILL, DECODE, ENTRY = "http://p:1", "http://d:2", "http://router:3"
PD = (PREFILL, DECODE)


def snap(url: str, role: Role) -> EngineSnapshot:
    return EngineSnapshot(url=url, engine="vllm", version="0.32.0", role=role, model="m", served_context=1024, page_size=16)


def served(sent: int) -> Completion:
    return Completion(sent_tokens=sent, max_tokens=1, streamed=False, status=200, elapsed_s=0.1, completion_tokens=1,
                      prompt_tokens=sent)


def probe(name: str, sent: int, decode: CounterDelta, reached: tuple[str, ...] = PD,
          completion: Completion | None = None) -> ProbeResult:
    return ProbeResult(name=name, expect=Expect.ACCEPT, completion=completion or served(sent), purpose="test",
                       reached=reached, counter_deltas={DECODE: decode, PREFILL: CounterDelta(prompt_tokens=sent)})


def judge(*probes: ProbeResult, snapshots: tuple[EngineSnapshot, ...] = (snap(PREFILL, Role.PREFILL), snap(DECODE, Role.DECODE)),
          run: ProbeRun | None = None) -> CheckResult:
    run = run or ProbeRun(limits=Limits(1024, 4096, 1023), probes=probes)
    (result,) = run_checks(CheckContext(snapshots, load_thresholds(), probes=run, entry=ENTRY), ["pd-transfer"])
    return result


def test_kv_received_in_full_passes_and_says_how_much_and_how_fast() -> None:
    result = judge(probe("boundary-accept", 1000, CounterDelta(kv_transfer_tokens=999, prefilled_tokens=1,
                                                               extra={TRANSFER_SECONDS: 0.5, TRANSFERS_TIMED: 1})))
    assert result.status is Status.PASS, result.message
    assert "1,000 prompt tokens sent, decode received KV for 999 tokens and computed 1 tokens itself" in result.message
    assert "KV transfer 0.500 s each" in result.message


def test_a_decode_that_computed_the_prompt_fails_quoting_the_deltas() -> None:
    result = judge(probe("boundary-accept", 1000, CounterDelta(kv_transfer_tokens=0, prefilled_tokens=1000)))
    assert result.status is Status.FAIL
    assert "decode received KV for 0 tokens and computed 1,000 tokens itself" in result.message
    assert "recomputed the prompt (computed 1,000 > 16 allowed); no KV arrived (the transfer was skipped)" in result.message


def test_concurrent_probes_share_one_window_and_one_allowance_per_request() -> None:
    deltas = CounterDelta(kv_transfer_tokens=1960, prefilled_tokens=30)  # two requests: 2 x 16 tokens allowed
    result = judge(probe("concurrent-1", 990, deltas), probe("concurrent-2", 990, deltas))
    assert result.status is Status.PASS, result.message
    assert "concurrent (x2): 1,980 prompt tokens sent" in result.message


def test_kv_short_of_the_prompt_with_no_compute_counter_fails() -> None:
    result = judge(probe("boundary-accept", 1000, CounterDelta(kv_transfer_tokens=500)))
    assert result.status is Status.FAIL
    assert "the KV of 500 prompt tokens never reached the decode" in result.message


def test_nothing_counted_is_inconclusive_never_a_pass() -> None:
    result = judge(probe("boundary-accept", 1000, CounterDelta(requests=1)))
    assert result.status is Status.INCONCLUSIVE
    assert "counts neither KV received nor prompt tokens it computed itself" in result.message


def test_probes_that_did_not_reach_the_decode_or_were_not_served_prove_nothing() -> None:
    refused = Completion(sent_tokens=2000, max_tokens=1, streamed=False, status=400, elapsed_s=0.1, error_message="too long")
    result = judge(probe("boundary-accept", 1000, CounterDelta(prefilled_tokens=1000), reached=(PREFILL,)),
                   probe("concurrent-1", 2000, CounterDelta(prefilled_tokens=2000), completion=refused))
    assert result.status is Status.INCONCLUSIVE
    assert "no probe is known to have reached a decode engine" in result.message


@pytest.mark.parametrize("roles", [(Role.UNIFIED,), (Role.UNIFIED, Role.UNIFIED), (Role.DECODE,)])
def test_a_deployment_without_a_prefill_decode_pair_is_skipped(roles: tuple[Role, ...]) -> None:
    snapshots = tuple(snap(f"http://e:{i}", role) for i, role in enumerate(roles))
    result = judge(probe("boundary-accept", 1000, CounterDelta(prefilled_tokens=1000)), snapshots=snapshots)
    assert result.status is Status.SKIP and "not a prefill/decode deployment" in result.message


def test_capacity_only_and_unsent_probes_say_why() -> None:
    (skipped,) = run_checks(CheckContext((snap(PREFILL, Role.PREFILL), snap(DECODE, Role.DECODE)), load_thresholds(),
                                         probes=None, entry=ENTRY), ["pd-transfer"])
    assert skipped.status is Status.SKIP and "--capacity-only" in skipped.message
    unsent: Any = ProbeRun(limits=None, not_run="probes could not run: boom")
    assert judge(run=unsent).status is Status.INCONCLUSIVE


# -- danger lines --------------------------------------------------------------------------------

UNRECOGNIZED = DangerLine(source=PREFILL, what=VllmAdapter.log_signals[0].what, request_id="cmpl-1-0", hazard=Hazard.LATE_READ)
FAILED_SEND = DangerLine(source=PREFILL, what=SglangAdapter.log_signals[2].what, request_id="r-1")


def test_a_danger_line_by_itself_warns_and_is_quoted_with_its_probe() -> None:
    moved = ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, completion=served(1000), purpose="test", reached=PD,
                        counter_deltas={DECODE: CounterDelta(kv_transfer_tokens=1000, prefilled_tokens=0)},
                        danger_lines=(FAILED_SEND, FAILED_SEND))
    result = judge(run=ProbeRun(limits=Limits(1024, 4096, 1023), probes=(moved,), untied_danger_lines=(FAILED_SEND,)))
    assert result.status is Status.WARN, result.message
    assert f'{PREFILL} log: "{FAILED_SEND.what}" x2 (logged during probe boundary-accept)' in result.message
    assert "(logged between probes)" in result.message
    assert result.evidence["danger_lines_count"] == 3 and result.evidence["danger_lines"][0]["request_id"] == "r-1"


def test_a_late_read_on_a_served_probe_fails_quoting_the_line_the_lease_and_the_fix() -> None:
    """vLLM's prefill logs "Potentially invalid KV blocks for unrecognized request" when a decode
    finished reading KV after the lease ran out; the probe was answered (HTTP 200): a failure."""
    moved = ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, completion=served(1000), purpose="test", reached=PD,
                        counter_deltas={DECODE: CounterDelta(kv_transfer_tokens=1000, prefilled_tokens=0)},
                        danger_lines=(UNRECOGNIZED,))
    prefill = replace(snap(PREFILL, Role.PREFILL), kv_lease=KvDeadline(seconds=6, setting=LEASE_SETTING, stated=True))
    result = judge(moved, snapshots=(prefill, snap(DECODE, Role.DECODE)))
    assert result.status is Status.FAIL, result.message
    assert "the client got HTTP 200" in result.message
    assert f'{PREFILL} log: "{UNRECOGNIZED.what}" (logged during probe boundary-accept)' in result.message
    assert f"the lease in force: {LEASE_SETTING} 6 s at {PREFILL} (stated in its start-up log)" in result.message
    assert "fix: raise kv_connector_extra_config.kv_lease_duration" in result.message
    assert "VLLM_NIXL_ABORT_REQUEST_TIMEOUT" in result.message
    assert result.evidence["danger_lines"][0]["hazard"] == "late-read"
    unread = judge(moved)  # no log given: the lease was not read, and it says how to read it
    assert unread.status is Status.FAIL and "the lease in force: not read (give the prefill's log with --log" in unread.message


def test_a_late_read_fails_even_where_the_transfer_itself_was_not_measured() -> None:
    unmeasured = ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, completion=served(1000), purpose="test",
                             reached=(PREFILL,), counter_deltas={PREFILL: CounterDelta(prompt_tokens=1000)})
    result = judge(run=ProbeRun(limits=Limits(1024, 4096, 1023), probes=(unmeasured,), untied_danger_lines=(UNRECOGNIZED,)))
    assert result.status is Status.FAIL and "(logged between probes)" in result.message, result.message


def test_a_late_read_can_be_waived_with_a_reason_and_the_finding_stays() -> None:
    moved = ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, completion=served(1000), purpose="test", reached=PD,
                        counter_deltas={DECODE: CounterDelta(kv_transfer_tokens=1000, prefilled_tokens=0),
                                        PREFILL: CounterDelta(prompt_tokens=1000, stale_kv_reads=1)})
    ctx = CheckContext((snap(PREFILL, Role.PREFILL), snap(DECODE, Role.DECODE)), load_thresholds(),
                       probes=ProbeRun(limits=Limits(1024, 4096, 1023), probes=(moved,)), entry=ENTRY)
    (result,) = run_checks(ctx, ["pd-transfer"], (Waiver("pd-transfer", "lease raised in the next release"),))
    assert result.status is Status.SKIP and result.evidence["status_before_waiver"] == "fail"
    assert "waived: lease raised in the next release (found: fail:" in result.message


def test_a_kv_canary_violation_during_a_probe_fails_pd_transfer() -> None:
    violation = DangerLine(source=DECODE, what="kv_canary violation", hazard=Hazard.KV_CANARY,
                           detail="slot_idx=7 position=3 fail_reason=verify_chain_hash")
    moved = ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, completion=served(1000), purpose="test", reached=PD,
                        counter_deltas={DECODE: CounterDelta(kv_transfer_tokens=1000, prefilled_tokens=0)}, danger_lines=(violation,))
    result = judge(moved)
    assert result.status is Status.FAIL, result.message
    assert (f'{DECODE} log: "kv_canary violation (slot_idx=7 position=3 fail_reason=verify_chain_hash)" '
            "(logged during probe boundary-accept)") in result.message


def test_an_expired_lease_without_a_late_read_warns_naming_the_cost() -> None:
    moved = ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, completion=served(1000), purpose="test", reached=PD,
                        counter_deltas={DECODE: CounterDelta(kv_transfer_tokens=1000, prefilled_tokens=0),
                                        PREFILL: CounterDelta(prompt_tokens=1000, expired_kv=1)})
    result = judge(moved)
    assert result.status is Status.WARN, result.message
    assert "recomputes the prompt" in result.message and f"{PREFILL} counted 1 request(s) whose KV lease ran out unread" in result.message
    assert result.evidence["expired_kv_leases"] == [{"engine": PREFILL, "requests": 1, "when": "during boundary-accept"}]


def test_a_line_naming_a_probes_request_id_says_which_request_whenever_it_was_logged() -> None:
    """vLLM's prefill logs "unrecognized request" when a KV lease ran out, up to 30 s after the
    request: the id it names (vLLM decorates kvpreflight's: cmpl-<id>-0-<random>) ties it to its
    probe even between probes; an id of another kvpreflight request and a stranger's are told apart."""
    rid = "kvpreflight-0123456789abcdef"
    boundary = ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, purpose="test", reached=PD,
                           completion=replace(served(1000), request_id=rid),
                           counter_deltas={DECODE: CounterDelta(kv_transfer_tokens=1000, prefilled_tokens=0)})
    late = replace(UNRECOGNIZED, request_id=f"cmpl-{rid}-0-1a2b3c4d")
    calibration = replace(UNRECOGNIZED, request_id="cmpl-kvpreflight-fedcba9876543210-0-00000000")
    stranger = replace(UNRECOGNIZED, request_id="cmpl-4f1c-0-99999999")
    probes, untied = named_by_request_id([boundary], (late, calibration, stranger))
    assert [d.names for d in untied] == ["probe boundary-accept's request",
                                         "one of kvpreflight's requests other than the probes (calibration, health)", None]
    result = judge(run=ProbeRun(limits=Limits(1024, 4096, 1023), probes=tuple(probes), untied_danger_lines=untied))
    assert result.status is Status.FAIL
    assert "x1" not in result.message and "(logged between probes, naming probe boundary-accept's request)" in result.message
    assert result.evidence["danger_lines"][0] == {"source": PREFILL, "what": UNRECOGNIZED.what, "request_id": late.request_id,
                                                  "when": "logged between probes", "names": "probe boundary-accept's request",
                                                  "hazard": "late-read"}
    assert "names" not in result.evidence["danger_lines"][2]


def test_a_stale_kv_read_counted_by_the_prefill_fails_without_any_log() -> None:
    """vLLM's prefill counts the reads its "unrecognized request" line logs: with no --log the
    counter alone turns a pass into a failure, naming the engine and the probe."""
    moved = ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, completion=served(1000), purpose="test", reached=PD,
                        counter_deltas={DECODE: CounterDelta(kv_transfer_tokens=1000, prefilled_tokens=0),
                                        PREFILL: CounterDelta(prompt_tokens=1000, stale_kv_reads=2)})
    result = judge(moved)
    assert result.status is Status.FAIL, result.message
    assert (f"the counters say: a decode read 2 request(s)' KV that {PREFILL} no longer held, so those pages may have "
            "been reused (during boundary-accept)") in result.message
    assert result.evidence["stale_kv_reads"] == [{"engine": PREFILL, "reads": 2, "when": "during boundary-accept"}]
    quiet = replace(moved, counter_deltas={**moved.counter_deltas, PREFILL: CounterDelta(prompt_tokens=1000, stale_kv_reads=0)})
    assert judge(quiet).status is Status.PASS


def test_vllm_maps_its_notifications_after_expiry_counter_to_stale_kv_reads() -> None:
    metrics = ('vllm:nixl_num_notifications_after_expiry_total{engine="0",model_name="m"} 3.0\n'
               'vllm:prompt_tokens_total{engine="0",model_name="m"} 10.0\n')
    adapter = VllmAdapter("http://p:1", HttpClient())
    adapter.metrics = lambda: parse_metrics("http://p:1/metrics", metrics)  # type: ignore[method-assign]
    assert adapter.counters().stale_kv_reads == 3.0


def test_vllm_maps_its_expired_kv_and_aborted_requests_counters() -> None:
    """vLLM 0.32's nixl/stats.py registers vllm:nixl_num_kv_expired_reqs (a Counter: /metrics
    says _total); tests/unit/test_roles.py reads the lease."""
    metrics = ('vllm:nixl_num_kv_expired_reqs_total{engine="0",model_name="m"} 4.0\n'
               # v1/metrics/loggers.py: one series per FinishReason (v1/engine/__init__.py), str() of it
               'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 5.0\n'
               'vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 2.0\n')
    adapter = VllmAdapter("http://p:1", HttpClient())
    adapter.metrics = lambda: parse_metrics("http://p:1/metrics", metrics)  # type: ignore[method-assign]
    counters = adapter.counters()
    assert (counters.expired_kv, counters.aborted_requests, counters.requests) == (4.0, 2.0, 7.0)


def test_sglang_maps_its_aborted_requests_counter() -> None:
    metrics = 'sglang:num_aborted_requests_total{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 3.0\n'
    adapter = SglangAdapter("http://s:1", HttpClient())
    adapter.metrics = lambda: parse_metrics("http://s:1/metrics", metrics)  # type: ignore[method-assign]
    assert adapter.counters().aborted_requests == 3.0


def test_a_danger_line_beside_a_recompute_is_part_of_the_failure() -> None:
    skipped = DangerLine(source=ENTRY, what=VllmRouter.log_signals[0].what)
    recomputed = ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, completion=served(1000), purpose="test",
                             reached=PD, counter_deltas={DECODE: CounterDelta(kv_transfer_tokens=0, prefilled_tokens=1000)},
                             danger_lines=(skipped,))
    result = judge(recomputed)
    assert result.status is Status.FAIL
    assert "the decode recomputed the prompt" in result.message and "decode will proceed without kv_transfer_params" in result.message


@pytest.mark.parametrize("signals,line,what,rid,hazard", [
    (VllmAdapter.log_signals, "(EngineCore_DP0 pid=7) ERROR 11-30 17:01:02 [pull_worker.py:667] Potentially invalid KV blocks "
     "for unrecognized request cmpl-abc-0 were retrieved by a decode worker. They may have expired.",
     "Potentially invalid KV blocks for unrecognized request ... were retrieved by a decode worker", "cmpl-abc-0", Hazard.LATE_READ),
    # nixl/base_worker.py (vLLM 0.32), logger.warning when a lease runs out
    (VllmAdapter.log_signals, "(EngineCore_DP0 pid=7) WARNING 11-30 17:01:32 [base_worker.py:3032] Releasing expired KV blocks "
     "for request cmpl-abc-0 which were retrieved by 0 remote worker(s) before lease expired.",
     "Releasing expired KV blocks for request ... which were retrieved by ... worker(s)", "cmpl-abc-0", Hazard.KV_EXPIRED),
    (VllmRouter.log_signals, "2026-11-30 17:01:02  WARN vllm_router_rs::routers::http::vllm_pd_router: No kv_transfer_params "
     "for prefill http://127.0.0.1:45469, decode will proceed without kv_transfer_params",
     "No kv_transfer_params for prefill ..., decode will proceed without kv_transfer_params", None, Hazard.TRANSFER),
    (SglangAdapter.log_signals, "[2026-11-30 17:01:02 DP0 TP0] Decode transfer failed for request rank=0 "
     "decode_req.req.rid='r-5' decode_req.req.bootstrap_room=42", "Decode transfer failed for request", "r-5", Hazard.TRANSFER),
    (SglangAdapter.log_signals, "Prefill transfer failed for request rank=0 req.rid='r-6' req.bootstrap_room=7",
     "Prefill transfer failed for request", "r-6", Hazard.TRANSFER),
])
def test_each_signal_names_the_request_and_only_new_whole_lines_count(tmp_path: Path, signals: tuple[LogSignal, ...],
                                                                      line: str, what: str, rid: str | None, hazard: Hazard) -> None:
    log = tmp_path / "engine.log"
    log.write_text(line + "\n")  # before the watch began: not the probes'
    watch = LogWatch({"http://e:1": (log, signals)})
    assert watch.take() == ()
    with log.open("a") as fh:
        fh.write("an ordinary line\n" + line + "\n" + line[:20])  # the last line is still being written
    assert watch.take() == (DangerLine(source="http://e:1", what=what, request_id=rid, hazard=hazard),)
    assert watch.take() == ()


def test_prompt_found_in_the_decodes_own_prefix_cache_needed_no_transfer() -> None:
    # Seen on vLLM 0.32 over NIXL: the concurrent probes repeat the boundary probe's prefix, so
    # the decode serves most of it from its own cache and receives only the rest.
    deltas = CounterDelta(kv_transfer_tokens=246, cached_prompt_tokens=1792, prefilled_tokens=0)
    result = judge(probe("concurrent-1", 1019, deltas), probe("concurrent-2", 1019, deltas))
    assert result.status is Status.PASS, result.message
    assert "decode received KV for 246 tokens, found 1,792 in its own prefix cache and computed 0 tokens itself" in result.message


def test_a_stated_handoff_deadline_shorter_than_a_near_context_prompt_fails_and_an_unstated_default_warns() -> None:
    """The prompt at the limit took 45 s: a decode that waits 20 s for its KV (stated) aborts
    every such prompt in production; vLLM's lease at its unstated default of 30 s would run out
    under it too, but the setting may differ from the default: a warning."""
    moved = ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, completion=replace(served(1000), elapsed_s=45.0),
                        purpose="test", reached=PD, counter_deltas={DECODE: CounterDelta(kv_transfer_tokens=1000, prefilled_tokens=0)})
    run = ProbeRun(limits=Limits(1024, 4096, 1023), probes=(moved,), near_context_s=45.0)
    waiting = KvDeadline(seconds=20, setting="SGLANG_DISAGGREGATION_WAITING_TIMEOUT", stated=True)
    decode = replace(snap(DECODE, Role.DECODE), pd_timeouts=(waiting,))
    prefill = replace(snap(PREFILL, Role.PREFILL), kv_lease=KvDeadline(seconds=30, setting=LEASE_SETTING, stated=False))
    result = judge(run=run, snapshots=(prefill, decode))
    assert result.status is Status.FAIL, result.message
    assert (f"a prompt of 1,023 tokens was answered in 45.0 s (sent and timed), longer than SGLANG_DISAGGREGATION_WAITING_TIMEOUT "
            f"20 s at {DECODE}: every prompt that long outlives it; raise SGLANG_DISAGGREGATION_WAITING_TIMEOUT") in result.message
    assert len(result.evidence["outlived_deadlines"]) == 2
    assert result.evidence["near_context_time"] == "measured: the 1,023-token prompt at the limit was answered in 45.0 s"
    assumed = judge(run=run, snapshots=(prefill, snap(DECODE, Role.DECODE)))
    assert assumed.status is Status.WARN
    assert f"{LEASE_SETTING} 30 s at {PREFILL} (its default: the setting was not stated)" in assumed.message
    fast = replace(run, probes=(replace(moved, completion=served(1000)),))
    assert judge(run=fast, snapshots=(prefill, decode)).status is Status.PASS
    # the prompt at the limit not sent (here: another probe carried the transfer): the speed's prediction
    # is said, as --plan said it before the probes, but only a measurement fails
    predicted = replace(run, probes=(replace(moved, name="concurrent-1"),))
    result = judge(run=predicted, snapshots=(prefill, decode))
    assert result.status is Status.WARN and "a prompt of 1,023 tokens takes about 45.0 s at the measured speed" in result.message
    assert result.evidence["near_context_time"].startswith("predicted from the measured speed")
    # sent and aborted by the engine after running past the decode's wait: measured, a fail
    aborted = replace(moved, completion=Completion(sent_tokens=1000, max_tokens=1, streamed=True, status=500, elapsed_s=21.5,
                                                    error_message="KV transfer timed out"))
    result = judge(run=replace(run, probes=(aborted, replace(moved, name="concurrent-1"))), snapshots=(prefill, decode))
    assert result.status is Status.FAIL and "a prompt of 1,023 tokens ran 21.5 s and was not answered (sent and timed)" in result.message
    assert result.evidence["near_context_time"] == ("measured: the 1,023-token prompt at the limit ran 21.5 s and was not "
                                                    "answered; predicted from the measured speed: 45.0 s")
    # the lease's unstated 30 s lies between what it ran (21.5 s) and the prediction (45 s): said, not failed
    assert any("takes about 45.0 s" in said and LEASE_SETTING in said for said in result.evidence["outlived_deadlines"])
    # refused or cut in under the prediction: how long it ran proves nothing, the prediction warns
    quick = replace(aborted, completion=replace(aborted.completion, elapsed_s=0.2))
    result = judge(run=replace(run, probes=(quick, replace(moved, name="concurrent-1"))), snapshots=(prefill, decode))
    assert result.status is Status.WARN and "takes about 45.0 s at the measured speed" in result.message, result.message
    assert "ran 0.2 s and was not answered" in result.evidence["near_context_time"]
    assert judge(run=replace(predicted, near_context_s=10.0), snapshots=(prefill, decode)).status is Status.PASS
    assert judge(run=replace(predicted, near_context_s=None), snapshots=(prefill, decode)).status is Status.PASS  # no speed


def test_a_calibration_that_stalled_is_no_evidence_against_the_prompt_at_the_limit_served_in_time() -> None:
    """One 8-token calibration request can wait out the prefill's 30 s lease (it did on the real
    vLLM NIXL pair: docs/FINDINGS.md); the speed it measures then predicts 110 s for the
    1,023-token prompt at the limit, while that very prompt is served in 0.4 s. pd-transfer must
    not fail "every prompt that long outlives" the stated lease on that prediction: the
    measurement decides."""
    at_limit = probe("boundary-accept", 1023, CounterDelta(kv_transfer_tokens=1023, prefilled_tokens=0),
                     completion=replace(served(1023), elapsed_s=0.4, ttft_s=0.4, streamed=True))
    run = ProbeRun(limits=Limits(1024, 4096, 1023), probes=(at_limit,), near_context_s=110.4)
    prefill = replace(snap(PREFILL, Role.PREFILL), kv_lease=KvDeadline(seconds=30, setting=LEASE_SETTING, stated=True))
    result = judge(run=run, snapshots=(prefill, snap(DECODE, Role.DECODE)))
    assert result.status is Status.PASS, result.message
    assert "outlived_deadlines" not in result.evidence


def test_sglang_pd_roles_carry_their_pd_timeout_stated_or_at_sglangs_default() -> None:
    from kvpreflight._internal.engines.sglang import pd_timeouts

    assert pd_timeouts({}, Role.DECODE, "http://d:2") == (
        KvDeadline(seconds=300, setting="SGLANG_DISAGGREGATION_WAITING_TIMEOUT", stated=False),)
    assert pd_timeouts({"disaggregation_bootstrap_timeout_s": 5}, Role.PREFILL, "http://p:1") == (
        KvDeadline(seconds=5, setting="SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", stated=True),)
    assert pd_timeouts({}, Role.UNIFIED, "http://u:1") == ()


def test_a_handoff_timeout_logged_during_the_check_fails_pd_transfer_naming_the_setting() -> None:
    """SGLang's decode gave up on a request's KV at SGLANG_DISAGGREGATION_WAITING_TIMEOUT: even
    where every counted probe moved its KV, the timeout ran out on a request of the check."""
    timeout = DangerLine(source=DECODE, what="Some requests fail to receive KV Cache transfer done signal after bootstrapping",
                         hazard=Hazard.HANDOFF_TIMEOUT, detail="setting=SGLANG_DISAGGREGATION_WAITING_TIMEOUT")
    moved = ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, completion=served(1000), purpose="test", reached=PD,
                        counter_deltas={DECODE: CounterDelta(kv_transfer_tokens=1000, prefilled_tokens=0)})
    result = judge(moved, run=ProbeRun(limits=Limits(1024, 4096, 1023), probes=(moved,), untied_danger_lines=(timeout,)))
    assert result.status is Status.FAIL, result.message
    assert "a prefill/decode handoff timed out during the check" in result.message
    assert "raise SGLANG_DISAGGREGATION_WAITING_TIMEOUT above the longest prefill" in result.message
    assert result.message.count("Some requests fail to receive KV Cache") == 1, result.message


def test_a_kv_checksum_mismatch_fails_pd_transfer_whatever_the_counters_say(tmp_path: Path) -> None:
    """SGLang's --disaggregation-enable-kv-checksum: the decode's KV did not hash as the prefill's
    (tests/fixtures/sglang/kv_checksum.log): the transfer moved, and moved wrong KV."""
    log = tmp_path / "decode.log"
    log.write_text("")
    watch = LogWatch({DECODE: (log, SglangAdapter.log_signals)})
    log.write_text((Path(__file__).parents[1] / "fixtures" / "sglang" / "kv_checksum.log").read_text())
    lines = watch.take()
    assert [(d.hazard, d.request_id) for d in lines] == [(Hazard.KV_CORRUPT, "kvpreflight-3d8e44a0a4f5e123")] * 2
    moved = ProbeResult(name="boundary-accept", expect=Expect.ACCEPT, completion=served(1000), purpose="test", reached=PD,
                        counter_deltas={DECODE: CounterDelta(kv_transfer_tokens=1000, prefilled_tokens=0)}, danger_lines=lines)
    result = judge(moved)
    assert result.status is Status.FAIL, result.message
    assert "a decode received KV other than what its prefill sent" in result.message
    assert f'{DECODE} log: "KV checksum mismatch" x2 (logged during probe boundary-accept)' in result.message
