"""pd-transfer on probe results built by hand: the decode's own counters over each served probe
say whether the prompt's KV moved from prefill to decode (the counters' names are the adapters'
business: kv_transfer_tokens received, prefilled_tokens computed on the decode itself)."""

from __future__ import annotations

from typing import Any

import pytest

from kvpreflight.checkdata import load_thresholds
from kvpreflight.checks import CheckContext, run_checks
from kvpreflight.model import TRANSFER_SECONDS, TRANSFERS_TIMED, CheckResult, Completion, EngineSnapshot, Role, Status
from kvpreflight.probes.results import Expect, Limits, ProbeResult, ProbeRun

PREFILL, DECODE, ENTRY = "http://p:1", "http://d:2", "http://router:3"
PD = (PREFILL, DECODE)


def snap(url: str, role: Role) -> EngineSnapshot:
    return EngineSnapshot(url=url, engine="vllm", version="0.32.0", role=role, model="m", served_context=1024, page_size=16)


def served(sent: int) -> Completion:
    return Completion(sent_tokens=sent, max_tokens=1, streamed=False, status=200, elapsed_s=0.1, completion_tokens=1,
                      prompt_tokens=sent)


def probe(name: str, sent: int, decode: dict[str, float], reached: tuple[str, ...] = PD,
          completion: Completion | None = None) -> ProbeResult:
    return ProbeResult(name=name, expect=Expect.ACCEPT, completion=completion or served(sent), purpose="test",
                       reached=reached, counter_deltas={DECODE: decode, PREFILL: {"prompt_tokens": sent}})


def judge(*probes: ProbeResult, snapshots: tuple[EngineSnapshot, ...] = (snap(PREFILL, Role.PREFILL), snap(DECODE, Role.DECODE)),
          run: ProbeRun | None = None) -> CheckResult:
    run = run or ProbeRun(limits=Limits(1024, 4096, 1023), probes=probes)
    (result,) = run_checks(CheckContext(snapshots, load_thresholds(), probes=run, entry=ENTRY), ["pd-transfer"])
    return result


def test_kv_received_in_full_passes_and_says_how_much_and_how_fast() -> None:
    result = judge(probe("boundary-accept", 1000, {"kv_transfer_tokens": 999, "prefilled_tokens": 1,
                                                   TRANSFER_SECONDS: 0.5, TRANSFERS_TIMED: 1}))
    assert result.status is Status.PASS, result.message
    assert "1,000 prompt tokens sent, decode received KV for 999 tokens and computed 1 tokens itself" in result.message
    assert "KV transfer 0.500 s each" in result.message


def test_a_decode_that_computed_the_prompt_fails_quoting_the_deltas() -> None:
    result = judge(probe("boundary-accept", 1000, {"kv_transfer_tokens": 0, "prefilled_tokens": 1000}))
    assert result.status is Status.FAIL
    assert "decode received KV for 0 tokens and computed 1,000 tokens itself" in result.message
    assert "recomputed the prompt (computed 1,000 > 16 allowed); no KV arrived (the transfer was skipped)" in result.message


def test_concurrent_probes_share_one_window_and_one_allowance_per_request() -> None:
    deltas = {"kv_transfer_tokens": 1960, "prefilled_tokens": 30}  # two requests: 2 x 16 tokens allowed
    result = judge(probe("concurrent-1", 990, deltas), probe("concurrent-2", 990, deltas))
    assert result.status is Status.PASS, result.message
    assert "concurrent (x2): 1,980 prompt tokens sent" in result.message


def test_kv_short_of_the_prompt_with_no_compute_counter_fails() -> None:
    result = judge(probe("boundary-accept", 1000, {"kv_transfer_tokens": 500}))
    assert result.status is Status.FAIL
    assert "the KV of 500 prompt tokens never reached the decode" in result.message


def test_nothing_counted_is_inconclusive_never_a_pass() -> None:
    result = judge(probe("boundary-accept", 1000, {"requests": 1}))
    assert result.status is Status.INCONCLUSIVE
    assert "counts neither KV received nor prompt tokens it computed itself" in result.message


def test_probes_that_did_not_reach_the_decode_or_were_not_served_prove_nothing() -> None:
    refused = Completion(sent_tokens=2000, max_tokens=1, streamed=False, status=400, elapsed_s=0.1, error_message="too long")
    result = judge(probe("boundary-accept", 1000, {"prefilled_tokens": 1000}, reached=(PREFILL,)),
                   probe("concurrent-1", 2000, {"prefilled_tokens": 2000}, completion=refused))
    assert result.status is Status.INCONCLUSIVE
    assert "no probe is known to have reached a decode engine" in result.message


@pytest.mark.parametrize("roles", [(Role.UNIFIED,), (Role.UNIFIED, Role.UNIFIED), (Role.DECODE,)])
def test_a_deployment_without_a_prefill_decode_pair_is_skipped(roles: tuple[Role, ...]) -> None:
    snapshots = tuple(snap(f"http://e:{i}", role) for i, role in enumerate(roles))
    result = judge(probe("boundary-accept", 1000, {"prefilled_tokens": 1000}), snapshots=snapshots)
    assert result.status is Status.SKIP and "not a prefill/decode deployment" in result.message


def test_capacity_only_and_unsent_probes_say_why() -> None:
    (skipped,) = run_checks(CheckContext((snap(PREFILL, Role.PREFILL), snap(DECODE, Role.DECODE)), load_thresholds(),
                                         probes=None, entry=ENTRY), ["pd-transfer"])
    assert skipped.status is Status.SKIP and "--capacity-only" in skipped.message
    unsent: Any = ProbeRun(limits=None, not_run="probes could not run: boom")
    assert judge(run=unsent).status is Status.INCONCLUSIVE
