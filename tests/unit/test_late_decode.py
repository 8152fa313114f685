"""The isolation scenario late-decode (issue 27, item 3) on fake engines: A's prefill leg straight
to the prefill, its decode leg held past the prefill's KV lease while B's requests take the freed
pages, then sent to the decode with vLLM's recorded handoff. A crossing fails tenant-isolation, a
late read without one fails pd-transfer; a lease longer than the scenario's wait is not probed; a
deployment whose legs cannot be sent apart is not applicable; --plan states the wait."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.fake_adapter import FakeAdapter, FakeEngine, FakeSplitLegsAdapter, Sent, snapshot

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks import CheckContext, run_checks
from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.engines.vllm import LEASE_SETTING, prefill_handoff
from kvpreflight._internal.probes import isolation
from kvpreflight._internal.probes.budget import Budget
from kvpreflight._internal.probes.isolation import IsolationSettings, run_isolation
from kvpreflight._internal.probes.isolation_sizes import IsolationSizes
from kvpreflight._internal.probes.results import IsolationRun, Limits, ProbeRun, Scenario, ScenarioName
from kvpreflight._internal.probes.scenarios import LATE_DECODE_CONDITION, Leg, declared, isolation_sizes
from kvpreflight._internal.probes.session import Connection, ProbeSession
from kvpreflight._internal.request_plan import GroupPlan
from kvpreflight.model import Completion, EngineSnapshot, KvDeadline, Role, Status

ROUTER, PREFILL, DECODE = "http://router:1", "http://prefill:1", "http://decode:1"
LIMITS = Limits(served_context=1024, pool_tokens=2304, max_accepted=1023)


def lease(seconds: float) -> KvDeadline:
    return KvDeadline(seconds=seconds, setting=LEASE_SETTING, stated=True)


class Pair:
    """A vLLM-like NIXL pair behind a router; `decode_leg` answers the held decode leg."""

    def __init__(self, lease_s: float | None = 0.01, page_size: int = 128) -> None:
        self.prefill = FakeEngine(snapshot(PREFILL, pool=2304, context=1024, role=Role.PREFILL, page_size=page_size,
                                           kv_lease=None if lease_s is None else lease(lease_s)))
        self.prefill.counters = replace(self.prefill.counters, stale_kv_reads=0)
        self.decode = FakeEngine(snapshot(DECODE, pool=2304, context=1024, role=Role.DECODE, page_size=page_size),
                                 script=self._decode)
        self.router = FakeEngine(snapshot(ROUTER, pool=None, context=1024), forwards_to=(self.prefill, self.decode))
        self.legs: list[Sent] = []
        self.late_read = False  # the decode leg moves the prefill's stale-KV-read counter
        self.serves_b_pages = False  # the decode leg's answer echoes the last B prompt it saw

    def _decode(self, engine: FakeEngine, sent: Sent) -> Completion | None:
        if "kv_transfer_params" not in sent.extra:
            return None
        self.legs.append(sent)
        if self.late_read:
            c = self.prefill.counters
            self.prefill.counters = replace(c, stale_kv_reads=(c.stale_kv_reads or 0) + 1)
        answer = engine.well_behaved(sent)
        if self.serves_b_pages:
            b = [s for s in engine.sent if "tenant-b" in s.extra.get("cache_salt", "")]
            answer = replace(answer, text=b[-1].seed * 3)
        return answer

    @property
    def snaps(self) -> tuple[EngineSnapshot, ...]:
        return (self.prefill.snap, self.decode.snap)


def late_decode(pair: Pair, adapter: type[FakeAdapter] = FakeSplitLegsAdapter) -> IsolationRun:
    client = HttpClient()
    engines = {e.snap.url: adapter(e.snap.url, client) for e in (pair.prefill, pair.decode)}
    sizes = IsolationSizes.of(LIMITS, pair.snaps)
    only = [s for s in declared(sizes) if s.name == ScenarioName.LATE_DECODE]
    session = ProbeSession(entry=FakeAdapter(ROUTER, client), engines=engines, snapshots=pair.snaps, limits=LIMITS,
                           budget=Budget(timeout_s=5, fallback_tokens_per_second=20000), connection=Connection(timeout_s=5))
    return run_isolation(session, IsolationSettings(churn_allowed=True), scenarios=only)


def judged(run: IsolationRun, snaps: tuple[EngineSnapshot, ...], check_id: str):
    ctx = CheckContext(snaps, load_thresholds(), probes=ProbeRun(limits=LIMITS), entry=ROUTER, isolation=run)
    (result,) = run_checks(ctx, [check_id])
    return result


def the_scenario(run: IsolationRun) -> Scenario:
    (scenario,) = run.scenarios
    return scenario


@pytest.fixture(autouse=True)
def no_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation, "LATE_DECODE_MARGIN_S", 0.0)  # the fake lease is 10 ms


def test_the_decode_leg_carries_the_prefill_handoff_and_b_follows_on_the_prefill():
    pair = Pair()
    scenario = the_scenario(late_decode(pair))
    assert [r.name for r in scenario.requests] == ["late-decode-a-prefill", "late-decode-b1", "late-decode-b2",
                                                   "late-decode-a", "late-decode-b3"]
    # A's prefill leg went straight to the prefill, asking it to hold the KV for a decode...
    (held,) = [s for s in pair.prefill.sent if s.url == PREFILL]
    assert held.extra["kv_transfer_params"]["do_remote_decode"] is True and held.max_tokens == 1
    assert held.tokens < 128  # inside one page: the page vLLM hands out again first
    # ...the decode leg to the decode with vLLM's handoff, and B's requests through the router around it
    (leg,) = pair.legs
    assert leg.url == DECODE and leg.extra["kv_transfer_params"]["remote_block_ids"] == [[7]]
    assert [(s.url, "tenant-b" in s.extra["cache_salt"]) for s in pair.prefill.sent[1:4]] == [(ROUTER, True)] * 3
    assert "tenant-a" in leg.extra["cache_salt"] and scenario.occurred is True
    assert "past the lease (kv_transfer_config kv_connector_extra_config.kv_lease_duration 0.01 s" in scenario.occurrence


def test_a_b_canary_in_the_held_decode_answer_fails_tenant_isolation():
    pair = Pair()
    pair.serves_b_pages = pair.late_read = True
    run = late_decode(pair)
    result = judged(run, pair.snaps, "tenant-isolation")
    assert result.status is Status.FAIL
    assert result.message.startswith("canary crossed tenants: tenant A's late-decode-a (late-decode) carried")
    assert [c["request"] for c in result.evidence["crossings"]] == ["late-decode-a"]
    assert the_scenario(run).occurrence.endswith("A's answer did not repeat A's own canary (the pages read no longer held "
                                                  "A's prompt)")


def test_a_late_read_without_a_crossing_fails_pd_transfer_with_the_lease_and_the_fix():
    pair = Pair()
    pair.late_read = True
    run = late_decode(pair)
    assert not [r for r in the_scenario(run).requests if r.crossings]
    result = judged(run, pair.snaps, "pd-transfer")
    assert result.status is Status.FAIL
    assert "a decode read KV its prefill had already released" in result.message
    assert f"a decode read 1 request(s)' KV that {PREFILL} no longer held" in result.message
    assert "during the late-decode scenario" in result.message
    assert f"the lease in force: {LEASE_SETTING} 0.01 s at {PREFILL}" in result.message and "fix:" in result.message
    assert result.evidence["late_decode_reads"]["stale_kv_reads"] == [{"engine": PREFILL, "reads": 1}]
    assert "the prefill counted 1 late read(s)" in the_scenario(run).occurrence
    assert the_scenario(run).occurrence.endswith("A's answer repeated A's own canary")


def test_an_engine_that_reads_no_released_kv_leaves_pd_transfer_unfailed():
    pair = Pair()
    run = late_decode(pair)
    assert "the prefill counted and logged no late read" in the_scenario(run).occurrence
    assert judged(run, pair.snaps, "pd-transfer").status is not Status.FAIL
    assert judged(run, pair.snaps, "tenant-isolation").status is Status.PASS


def test_a_lease_longer_than_the_wait_is_not_probed_neither_warn_nor_fail():
    pair = Pair(lease_s=30)
    run = late_decode(pair)
    scenario = the_scenario(run)
    assert not scenario.requests and not pair.legs and not [s for s in pair.prefill.sent if s.url == PREFILL]
    assert scenario.not_probed is not None and scenario.not_probed.startswith(
        "not probed: the lease outlasts the scenario's wait (kv_transfer_config kv_connector_extra_config.kv_lease_duration 30 s")
    result = judged(run, pair.snaps, "tenant-isolation")
    assert result.status not in (Status.WARN, Status.FAIL) and "late-decode" not in result.message
    (evidence,) = result.evidence["scenarios"]
    assert evidence["not_probed"] == scenario.not_probed
    assert judged(run, pair.snaps, "pd-transfer").status is not Status.FAIL


@pytest.mark.parametrize("case", ["unified", "not-vllm", "no-lease"])
def test_where_the_legs_cannot_be_sent_apart_it_is_not_applicable(case: str):
    pair = Pair(lease_s=None if case == "no-lease" else 0.01)
    if case == "unified":
        pair.prefill.snap = replace(pair.prefill.snap, role=Role.UNIFIED)
    run = late_decode(pair, FakeAdapter if case == "not-vllm" else FakeSplitLegsAdapter)
    scenario = the_scenario(run)
    assert not scenario.requests and not pair.legs and not [s for s in pair.prefill.sent if s.url == PREFILL]
    assert scenario.not_applicable is not None and scenario.not_applicable.startswith("not applicable:")
    result = judged(run, pair.snaps, "tenant-isolation")
    assert result.status not in (Status.WARN, Status.FAIL) and "late-decode" not in result.message
    assert result.evidence["scenarios"][0]["not_applicable"] == scenario.not_applicable


def test_plan_states_the_maximum_wait_and_counts_the_scenario_only_where_it_can_run():
    sizes = IsolationSizes.of(LIMITS, Pair().snaps)
    planned = [p for p in isolation_sizes(sizes, churn=True) if p.name == ScenarioName.LATE_DECODE]
    assert len(planned) == 5 and {p.only_if for p in planned} == {LATE_DECODE_CONDITION}
    assert not [p for p in isolation_sizes(sizes, churn=False) if p.name == ScenarioName.LATE_DECODE]
    plan = GroupPlan(entry=ROUTER, engines=(PREFILL, DECODE), limits=LIMITS, requests=tuple(planned))
    said = plan.conditional_text()
    assert "up to 5 more requests" in said
    assert "KV lease of at most 18 s (late-decode waits the lease + 2 s, 20 s at most)" in said
    assert plan.request_count == len(plan.calibration)  # not counted as sent: it runs only where the lease allows


def test_the_declared_legs_are_one_prefill_leg_then_its_decode_leg():
    (spec,) = [s for s in declared(IsolationSizes.of(LIMITS, Pair().snaps)) if s.name == ScenarioName.LATE_DECODE]
    legs = [(r.tenant.value, r.leg) for step in spec.steps for r in step.requests if r.leg]
    assert legs == [("a", Leg.PREFILL), ("a", Leg.DECODE)] and spec.churn
    assert spec.steps[0].outwait_lease and not any(s.outwait_lease for s in spec.steps[1:])


def test_the_prefill_handoff_is_read_from_vllms_answer_and_refused_when_it_names_no_blocks():
    from support.fake_adapter import VLLM_PREFILL_LEG_ANSWER

    handoff = prefill_handoff(VLLM_PREFILL_LEG_ANSWER, PREFILL)
    assert handoff is not None and handoff["remote_port"] == 5611
    assert prefill_handoff({**VLLM_PREFILL_LEG_ANSWER, "kv_transfer_params": None}, PREFILL) is None
    empty = {**VLLM_PREFILL_LEG_ANSWER["kv_transfer_params"], "remote_block_ids": []}
    assert prefill_handoff({**VLLM_PREFILL_LEG_ANSWER, "kv_transfer_params": empty}, PREFILL) is None
