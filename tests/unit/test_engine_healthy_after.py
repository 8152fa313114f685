"""engine-healthy-after on the small request sent after the probes: served is healthy; refused as
busy (the probes' own KV may still be held: a request the deadline abandoned keeps running in the
engine) or timed out is not measured; refused for anything else is a fail."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.check_cases import PREFILL, T, check, ok, refused, run, snap

from kvpreflight._internal.checks import CheckContext
from kvpreflight.model import Status


@pytest.mark.parametrize(("small", "status", "said"), [
    (ok(16), Status.PASS, "healthy, serving"),
    (refused(16, "The KV pool has no free pages for this request; retry later.", kind=None, status=503), Status.INCONCLUSIVE,
     "refused as busy (HTTP 503)"),
    (refused(16, "Too Many Requests", kind=None, status=429), Status.INCONCLUSIVE, "refused as busy (HTTP 429)"),
    (refused(16, "Internal Server Error", kind=None, status=500), Status.FAIL, "failed after the probes"),
    (refused(16, "bad request", kind=None, status=400), Status.FAIL, "failed after the probes"),
])
def test_the_small_request_after_the_probes(small, status, said):
    probes = replace(run(), small_request_after=small)
    (r,) = check("engine-healthy-after", CheckContext((snap(),), T, probes=probes))
    assert r.status is status and said in r.message, r.message


def test_a_small_request_the_deadline_ran_out_under_is_no_verdict():
    """The concurrent probe can end just before --deadline, and the small request then goes out
    with what is left and fails; that is the deadline's doing, not the engine's (exit 3, not 1)."""
    from kvpreflight._internal.probes.budget import Budget
    from kvpreflight.model import Completion

    now = [0.0]
    budget = Budget(timeout_s=30, fallback_tokens_per_second=1000, deadline_s=6, clock=lambda: now[0])
    failed = Completion(sent_tokens=16, max_tokens=1, streamed=False, status=None, elapsed_s=0.0,
                        transport_error="timeout must be above 0")
    now[0] = 5.0
    assert not budget.ended_by_deadline(failed) and budget.stopped is None  # a second left: the engine's answer
    now[0] = 6.0
    assert not budget.ended_by_deadline(ok(16))  # served is served
    assert budget.ended_by_deadline(failed) and budget.stopped == "stopped at --deadline of 6 s, during reading the engines"


# -- judged after the isolation probes, the check's last requests (issue 44) -----------------------

def after_isolation(**kw):
    """The capacity probes found the engine healthy, serving and idle; the isolation probes ran after them."""
    from kvpreflight._internal.probes.results import IsolationRun

    fields = {"healthy_after": {PREFILL: True}, "idle_after": {PREFILL: True}, "small_request_after": ok(16, 4), **kw}
    return CheckContext((snap(),), T, probes=run(), isolation=IsolationRun(**fields))


def test_an_engine_healthy_after_the_isolation_probes_passes():
    (r,) = check("engine-healthy-after", after_isolation())
    assert r.status is Status.PASS and r.message == "unified engine healthy, serving, and back to idle", r.message


@pytest.mark.parametrize(("wedge", "said"), [
    ({"healthy_after": {PREFILL: False}}, "unified engine is not healthy after the probes"),
    ({"idle_after": {PREFILL: False}}, "still holds KV tokens 10 s after the probes ended"),
    ({"small_request_after": refused(16, "Internal Server Error", kind=None, status=500)},
     "a small request through the entry failed after the probes"),
])
def test_what_the_isolation_probes_left_behind_is_judged_not_what_the_capacity_probes_did(wedge, said):
    (r,) = check("engine-healthy-after", after_isolation(**wedge))
    assert r.status is Status.FAIL and said in r.message, r.message


STOPPED = ("after the cancel-transfer probe stalled, an 8-token request got no answer within --timeout (5.0 s): the engine is "
           "not answering; the engine stopped answering, so it was probed no further")


def test_an_engine_that_stopped_answering_during_the_isolation_probes_fails_though_its_health_is_ok_now():
    """The wedge of issue 44: /health 200, nothing scheduled, tokens stuck in the used gauge, and
    tenant-isolation says the engine stopped answering. It was judged healthy from before."""
    from kvpreflight._internal.probes.results import Scenario

    stuck = Scenario(name="cancel-transfer", purpose="test", stopped=STOPPED, idle_after={PREFILL: False})
    (r,) = check("engine-healthy-after", after_isolation(small_request_after=None, idle_after={}, stopped=STOPPED,
                                                         not_answering=STOPPED, scenarios=(stuck,)))
    assert r.status is Status.FAIL, r.message
    assert r.message == (f"unified engine is not healthy after the probes: the deployment stopped answering during them "
                         f"({STOPPED}); its /health answers OK now, its used-token gauge stayed up after the "
                         "cancel-transfer scenario(s), but an engine that stopped answering once is not healthy: restart it, "
                         "and read its log around that request: an engine that stops answering under kvpreflight's "
                         "disconnects or load near its pool will do so under real clients")
    assert r.evidence["stuck_after_scenarios"] == ["cancel-transfer"] and r.evidence["health_ok"] is True


def test_a_deadline_stop_during_the_isolation_probes_is_inconclusive_not_a_fail():
    deadline = "stopped at --deadline of 60 s, during the load scenario"
    (r,) = check("engine-healthy-after", after_isolation(small_request_after=None, idle_after={}, stopped=deadline))
    assert r.status is Status.INCONCLUSIVE and r.message == f"not checked after the probes: {deadline}", r.message


def test_an_engine_that_wedges_on_the_prefix_cache_probes_is_not_healthy_after_them():
    """Through the whole check on a fake engine: healthy through the capacity probes and the
    scenarios, then it stops answering (its /health still 200, its used-token gauge held)."""
    from support.fake_adapter import FakeEngine, Sent, snapshot

    from kvpreflight._internal.pipeline import run_check
    from kvpreflight.check_plan import CheckPlan
    from kvpreflight.model import Completion
    from kvpreflight.targets import Target

    url = "http://engine:1"
    wedged = {"yes": False}

    def script(engine: FakeEngine, sent: Sent) -> Completion | None:
        if "SHARED" in sent.seed:  # the first prefix-cache probe
            wedged["yes"] = True
            engine.counters = replace(engine.counters, used_tokens=512)
        if not wedged["yes"]:
            return None
        return Completion(sent_tokens=sent.tokens, max_tokens=sent.max_tokens, streamed=sent.stream, status=None,
                          elapsed_s=sent.timeout_s, timed_out=True)

    FakeEngine(snapshot(url), script=script)  # registers itself under its URL
    report = run_check(CheckPlan(targets=(Target(url),), engine="fake", timeout_s=2))
    (r,) = [c for c in report.checks if c.id == "engine-healthy-after"]
    assert wedged["yes"] and r.status is Status.FAIL, r.message
    assert "the deployment stopped answering during them (after the cold prefix-cache probe stalled" in r.message, r.message
    assert "its /health answers OK now" in r.message
