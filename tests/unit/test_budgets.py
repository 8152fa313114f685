"""Request budgets from the engine's measured speed (probes/budget.py), through the whole check on
fake engines: calibration right after the over-capacity probes, a slow honest engine is never failed, a hang on a request that
must be refused fails and ends the probing, an engine that stops answering is probed no further,
and the deadline stops the run naming where."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.fake_adapter import FakeEngine, Sent, snapshot

from kvpreflight._internal.pipeline import preview, run_check
from kvpreflight._internal.probes.budget import SLACK, TINY_TOKENS, Budget, PlannedRequest, Speed
from kvpreflight._internal.probes.results import Expect
from kvpreflight.check_plan import CheckPlan
from kvpreflight.model import Completion, Report, Status
from kvpreflight.targets import Target

URL = "http://engine:1"
MAX_ACCEPTED = 4089  # the fake engine's limit with a 4,096-token pool (see fake_adapter.FakeEngine.limit)
SHORT = MAX_ACCEPTED // 16
PROBE_CHECKS = ("overcapacity-rejected", "prompt-integrity", "max-tokens-clamp", "concurrent-capacity",
                "engine-healthy-after", "tenant-isolation", "prefix-cache-isolation")


def slow(overhead_s: float, tokens_per_s: float):
    """An honest engine that takes overhead + tokens / rate, as its answers say."""
    def script(engine: FakeEngine, sent: Sent) -> Completion:
        answer = engine.well_behaved(sent)
        took = overhead_s + sent.tokens / tokens_per_s
        return replace(answer, elapsed_s=took + sent.max_tokens * 0.001, ttft_s=took if sent.stream else None)
    return script


def hang(sent: Sent) -> Completion:
    return Completion(sent_tokens=sent.tokens, max_tokens=sent.max_tokens, streamed=sent.stream, status=None,
                      elapsed_s=sent.timeout_s, timed_out=True)


def check(engine: FakeEngine, **plan: object) -> Report:
    return run_check(CheckPlan(targets=(Target(URL),), engine="fake", timeout_s=5, **plan))  # type: ignore[arg-type]


def result(report: Report, check_id: str):
    (found,) = [c for c in report.checks if c.id == check_id]
    return found


def test_calibration_follows_the_over_capacity_probes_and_accepted_prompts_get_time_for_the_measured_speed():
    engine = FakeEngine(snapshot(URL), script=slow(0.5, 1000))
    report = check(engine)
    # Over-capacity first, so stale pages hold what ran before the preflight, not calibration prompts.
    assert [s.tokens for s in engine.sent[:4]] == [6144, 6144, 8193, 8193]
    warm_up, first, second = engine.sent[4:7]
    assert (warm_up.tokens, warm_up.max_tokens, warm_up.timeout_s) == (TINY_TOKENS, 1, 15)  # unmeasured, 3x --timeout
    assert (first.tokens, first.max_tokens, first.stream) == (TINY_TOKENS, 1, False)
    assert (second.tokens, second.stream) == (SHORT, True)
    # 0.508 s for 8 tokens, 0.5 + 255/1000 to the first token of 255: about 1,030 tokens/s measured
    boundary = next(s for s in engine.sent if s.tokens == MAX_ACCEPTED)
    expected = 0.508 + MAX_ACCEPTED / (SHORT / (0.5 + SHORT / 1000 - 0.508))
    assert boundary.timeout_s == pytest.approx(5 + SLACK * expected, rel=0.02)
    assert boundary.timeout_s > 5 + MAX_ACCEPTED / 20000 + 10  # far past the old constant budget
    assert engine.sent[0].timeout_s == pytest.approx(5 + 6144 / 1e6)  # before calibration: --timeout and the upload
    reject = next(s for s in engine.sent if s.tokens == MAX_ACCEPTED + 1)
    assert reject.timeout_s == pytest.approx(5 + SLACK * 0.508 + reject.tokens / 1e6, rel=0.01)  # no prefill needed
    assert result(report, "prompt-integrity").status is Status.PASS


def test_a_hang_on_a_request_that_must_be_refused_fails_and_nothing_more_is_sent():
    def script(engine: FakeEngine, sent: Sent) -> Completion | None:
        return hang(sent) if sent.tokens == 6144 else None  # the first over-pool probe
    engine = FakeEngine(snapshot(URL), script=script)
    report = check(engine)
    assert [s.tokens for s in engine.sent] == [6144]  # the hung probe, then nothing
    over = result(report, "overcapacity-rejected")
    assert over.status is Status.FAIL and "a hang, not a rejection" in over.message
    for check_id in PROBE_CHECKS[1:]:
        found = result(report, check_id)
        assert found.status is Status.INCONCLUSIVE, (check_id, found.message)
        assert "probed no further" in found.message, (check_id, found.message)


def test_a_stalled_accepted_prompt_is_inconclusive_and_an_engine_still_answering_is_probed_on():
    def script(engine: FakeEngine, sent: Sent) -> Completion | None:
        return hang(sent) if sent.tokens == MAX_ACCEPTED else None
    engine = FakeEngine(snapshot(URL), script=script)
    report = check(engine)
    sizes = [s.tokens for s in engine.sent]
    after = sizes[sizes.index(MAX_ACCEPTED) + 1:]
    assert after[0] == TINY_TOKENS and MAX_ACCEPTED + 1 in after  # a liveness request, then the next probe
    integrity = result(report, "prompt-integrity")
    assert integrity.status is Status.INCONCLUSIVE
    assert "stalled" in integrity.message and "prompt tokens/s" in integrity.message  # the measured speed
    assert result(report, "overcapacity-rejected").status is Status.INCONCLUSIVE  # the twin was not served


def test_an_engine_that_stops_answering_is_probed_no_further():
    stalled = {"yes": False}

    def script(engine: FakeEngine, sent: Sent) -> Completion | None:
        if sent.tokens == MAX_ACCEPTED:
            stalled["yes"] = True
        return hang(sent) if stalled["yes"] else None
    engine = FakeEngine(snapshot(URL), script=script)
    report = check(engine)
    sizes = [s.tokens for s in engine.sent]
    assert sizes[sizes.index(MAX_ACCEPTED):] == [MAX_ACCEPTED, TINY_TOKENS]  # one liveness request, then silence
    assert "stopped answering" in result(report, "concurrent-capacity").message
    # no evidence, no fail; but an engine that stopped answering is not healthy after the probes (issue 44)
    assert all(result(report, check_id).status is not Status.FAIL for check_id in PROBE_CHECKS
               if check_id != "engine-healthy-after")
    healthy_after = result(report, "engine-healthy-after")
    assert healthy_after.status is Status.FAIL and "the deployment stopped answering during them" in healthy_after.message


def test_an_engine_that_cannot_answer_the_calibration_is_probed_no_further():
    engine = FakeEngine(snapshot(URL), script=lambda engine, sent: hang(sent) if sent.tokens <= SHORT else None)
    report = check(engine)
    assert [s.tokens for s in engine.sent] == [6144, 6144, 8193, 8193, TINY_TOKENS]
    assert result(report, "overcapacity-rejected").status is Status.INCONCLUSIVE  # refused, but the twin never ran
    for check_id in PROBE_CHECKS:
        found = result(report, check_id)
        assert found.status is Status.INCONCLUSIVE and "not answering" in found.message, (check_id, found.message)


def test_an_engine_that_died_while_probing_stopped_fails_engine_healthy_after():
    """vLLM's P/D decode died on the calibration warm-up (docs/FINDINGS.md): probing stops, and the
    engine that was up when the check read it is down now. That is measured, not inconclusive."""
    def died(engine: FakeEngine, sent: Sent) -> Completion | None:
        if sent.tokens > SHORT:
            return None  # the over-capacity probes are refused as they should be
        engine.healthy = False
        return Completion(sent_tokens=sent.tokens, max_tokens=sent.max_tokens, streamed=sent.stream, status=500,
                          elapsed_s=0.01, error_message="EngineCore encountered an issue.")
    report = check(FakeEngine(snapshot(URL), script=died))
    healthy_after = result(report, "engine-healthy-after")
    assert healthy_after.status is Status.FAIL and "not healthy after the probes, which stopped" in healthy_after.message
    assert "HTTP 500: EngineCore encountered an issue." in healthy_after.message
    assert result(report, "prompt-integrity").status is Status.INCONCLUSIVE  # nothing else is claimed


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


SPEED = Speed(overhead_s=1.0, prefill_tokens_per_second=1000.0, decode_s_per_token=0.01, measured_on="test")


def test_the_deadline_cuts_budgets_and_a_request_it_cut_short_stops_the_run_naming_the_stage():
    clock = Clock()
    budget = Budget(timeout_s=5, fallback_tokens_per_second=20000, deadline_s=20, clock=clock)
    budget.calibrated(SPEED, [PlannedRequest("x", 1000, 1, Expect.ACCEPT)])
    assert budget.deadline_s == 20  # given: kept
    assert budget.natural_s(4000, Expect.ACCEPT) == pytest.approx(5 + SLACK * 5)
    clock.now = 12
    assert budget.request_s(4000, Expect.ACCEPT) == pytest.approx(8)  # what is left of the deadline
    budget.enter("the capacity probe boundary-accept")
    clock.now = 20
    cut = Completion(sent_tokens=4000, max_tokens=1, streamed=False, status=None, elapsed_s=8, timed_out=True)
    assert budget.ended_by_deadline(cut, budget.natural_s(4000, Expect.ACCEPT))
    assert not budget.may_send()
    assert budget.stopped == "stopped at --deadline of 20 s, during the capacity probe boundary-accept"


def test_without_a_deadline_one_is_derived_from_the_estimate():
    budget = Budget(timeout_s=5, fallback_tokens_per_second=20000, clock=Clock())
    estimate = budget.calibrated(SPEED, [PlannedRequest("a", 1000, 11, Expect.ACCEPT),
                                         PlannedRequest("r", 9000, 96, Expect.REJECT)])
    assert estimate == pytest.approx((1 + 1 + 0.1) + (1 + 0.009))
    assert budget.deadline_s is not None and budget.deadline_s > SLACK * estimate
    assert budget.may_send()


def test_without_a_measured_speed_the_assumed_rate_is_used_and_said():
    budget = Budget(timeout_s=5, fallback_tokens_per_second=20000)
    assert budget.natural_s(40000, Expect.ACCEPT) == pytest.approx(7)
    assert budget.natural_s(40000, Expect.REJECT) == pytest.approx(5.04)
    assert "assumed 20,000" in budget.rate_note()


def test_a_calibration_request_left_unanswered_once_is_sent_again_fresh_and_said():
    """A vLLM P/D pair once left one 8-token request unanswered for 30 s and served the rest: one
    silence in calibration costs one fresh request, not the whole check; it is said on stderr."""
    calls = {"tiny": 0}

    def script(engine: FakeEngine, sent: Sent) -> Completion | None:
        if sent.tokens == TINY_TOKENS:
            calls["tiny"] += 1
            if calls["tiny"] == 2:  # the warm-up is served; the first measured one is not
                return hang(sent)
        return None
    engine = FakeEngine(snapshot(URL), script=script)
    said: list[str] = []
    report = run_check(CheckPlan(targets=(Target(URL),), engine="fake", timeout_s=5), progress=said.append)  # type: ignore[arg-type]
    sizes = [s.tokens for s in engine.sent]
    assert sizes[4:8] == [TINY_TOKENS, TINY_TOKENS, TINY_TOKENS, SHORT]  # warm-up, silence, fresh retry, streamed
    assert engine.sent[5].seed != engine.sent[6].seed  # fresh: not served from a cache the first one filled
    assert any("an 8-token calibration request got no answer within --timeout" in line and "a fresh one was sent" in line
               for line in said), said
    assert result(report, "prompt-integrity").status is Status.PASS


def test_a_calibration_request_unanswered_twice_means_the_engine_is_not_answering():
    calls = {"tiny": 0}

    def script(engine: FakeEngine, sent: Sent) -> Completion | None:
        if sent.tokens == TINY_TOKENS:
            calls["tiny"] += 1
            if calls["tiny"] > 1:
                return hang(sent)
        return None
    engine = FakeEngine(snapshot(URL), script=script)
    report = check(engine)
    assert [s.tokens for s in engine.sent][4:] == [TINY_TOKENS, TINY_TOKENS, TINY_TOKENS]
    assert "not answering" in result(report, "prompt-integrity").message


def test_a_plan_sends_one_calibration_request_and_estimates_an_upper_bound():
    """`check --plan` (issue 14): exactly one completion, streamed and short; one request cannot
    separate the fixed cost from prefill, so both are bounded from above and the duration is never
    below what the three-request calibration of `check` would estimate."""
    engine = FakeEngine(snapshot(URL), script=slow(0.5, 1000))
    (group,) = preview(CheckPlan(targets=(Target(URL),), engine="fake", timeout_s=5), measure=True)  # type: ignore[arg-type]
    (sent,) = engine.sent
    assert (sent.tokens, sent.max_tokens, sent.stream, sent.timeout_s) == (SHORT, 8, True, 15)
    assert group.calibration == f"sent {SHORT}-token request, max_tokens 8 (streamed)"
    assert group.speed is not None and "an upper estimate" in group.speed.describe()
    # the first token came 0.5 + 255/1000 s in: the fixed cost is taken as that whole time
    assert group.speed.overhead_s == pytest.approx(0.5 + SHORT / 1000)
    assert group.speed.prefill_tokens_per_second == pytest.approx(SHORT / (0.5 + SHORT / 1000))
    truth = Speed(overhead_s=0.5, prefill_tokens_per_second=1000, decode_s_per_token=0.001, measured_on="the script")
    assert group.estimate_s is not None
    assert group.estimate_s >= sum(truth.expected_s(p.prompt_tokens, p.max_tokens, p.concurrent)
                                   for p in group.plan.requests if p.expect is Expect.ACCEPT)


def test_a_plan_whose_calibration_request_hangs_sends_no_second_one():
    engine = FakeEngine(snapshot(URL), script=lambda engine, sent: hang(sent))
    (group,) = preview(CheckPlan(targets=(Target(URL),), engine="fake", timeout_s=5), measure=True)  # type: ignore[arg-type]
    assert len(engine.sent) == 1 and group.speed is None and group.estimate_s is None
    assert "got no answer within --timeout (15.0 s): the engine is not answering" in group.calibration


def test_a_small_request_after_the_probes_that_times_out_is_inconclusive_never_a_fail():
    """An honest engine still busy (or slow on a loaded machine) when the check sends its small
    request after the probes: the engine is healthy, the request ran out of time. Not measured as
    broken: inconclusive (seen on the builtin engine at 1,500 prompt tokens/s under a --deadline)."""
    health = []

    def busy_after_the_probes(engine: FakeEngine, sent: Sent) -> Completion | None:
        if sent.seed.startswith("kvpreflight health check"):
            health.append(sent)
            return hang(sent)
        return None
    report = check(FakeEngine(snapshot(URL), script=busy_after_the_probes))
    healthy_after = result(report, "engine-healthy-after")
    # one after the capacity probes, one after the isolation probes: the check's last request, judged
    assert [s.seed.startswith("kvpreflight health check after the isolation probes") for s in health] == [False, True]
    assert healthy_after.status is Status.INCONCLUSIVE and "timed out after the probes" in healthy_after.message, healthy_after.message
