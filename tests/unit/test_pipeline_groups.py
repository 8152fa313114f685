"""pipeline.run_check on fake engines: which engines one probe run covers, which URL the
probes go through, and what is sent (nothing at all in read-only or router-less PD runs)."""

from __future__ import annotations

from support.fake_adapter import FakeEngine, snapshot

from kvpreflight._internal.pipeline import run_check
from kvpreflight.check_plan import CheckPlan
from kvpreflight.model import Role, Status
from kvpreflight.targets import Target

PROBE_CHECKS = ("overcapacity-rejected", "prompt-integrity", "max-tokens-clamp", "concurrent-capacity", "engine-healthy-after")


def statuses(report, check_id: str) -> dict[str | None, Status]:
    return {c.endpoint: c.status for c in report.checks if c.id == check_id}


def test_each_unified_engine_is_probed_through_its_own_url():
    one, two = FakeEngine(snapshot("http://one:1")), FakeEngine(snapshot("http://two:2", pool=16384))
    report = run_check(CheckPlan(targets=(Target("http://one:1"), Target("http://two:2")), engine="fake", timeout_s=5))
    assert one.sent and {s.url for s in one.sent} == {"http://one:1"}
    assert two.sent and {s.url for s in two.sent} == {"http://two:2"}
    assert statuses(report, "overcapacity-rejected") == {"http://one:1": Status.PASS, "http://two:2": Status.PASS}
    assert statuses(report, "pd-consistency") == {None: Status.PASS}


def test_pd_behind_an_entry_probes_through_the_entry_naming_the_served_model():
    prefill = FakeEngine(snapshot("http://prefill:1", role=Role.PREFILL, model="tiny"))
    decode = FakeEngine(snapshot("http://decode:2", role=Role.DECODE, model="tiny", pool=16384))
    router = FakeEngine(snapshot("http://router:0"), forwards_to=(prefill, decode))
    options = CheckPlan(targets=(Target("http://prefill:1"), Target("http://decode:2")), entry="http://router:0/",
                        engine="fake", timeout_s=5)
    report = run_check(options)
    assert router.sent and {(s.url, s.model) for s in router.sent} == {("http://router:0", "tiny")}
    # one probe run for the whole deployment, judged at the entry
    assert statuses(report, "prompt-integrity") == {"http://router:0": Status.PASS}
    assert statuses(report, "kv-capacity").keys() == {"http://prefill:1", "http://decode:2"}


def test_pd_without_an_entry_sends_nothing_and_says_why():
    prefill = FakeEngine(snapshot("http://prefill:1", role=Role.PREFILL))
    decode = FakeEngine(snapshot("http://decode:2", role=Role.DECODE))
    report = run_check(CheckPlan(targets=(Target("http://prefill:1"), Target("http://decode:2")), engine="fake"))
    assert prefill.sent == [] and decode.sent == []
    for check_id in (*PROBE_CHECKS, "tenant-isolation", "prefix-cache-isolation"):
        (result,) = [c for c in report.checks if c.id == check_id]
        assert result.status is Status.INCONCLUSIVE and "without --entry" in result.message


def test_capacity_only_sends_nothing_and_skips_every_probe_check():
    engine = FakeEngine(snapshot("http://one:1", pool=16384))
    report = run_check(CheckPlan(targets=(Target("http://one:1"),), engine="fake", capacity_only=True))
    assert engine.sent == []
    for check_id in (*PROBE_CHECKS, "tenant-isolation", "prefix-cache-isolation"):
        assert statuses(report, check_id) == {"http://one:1": Status.SKIP}
    assert statuses(report, "kv-capacity") == {"http://one:1": Status.PASS}


def test_a_role_given_on_the_command_line_overrides_the_reported_one():
    FakeEngine(snapshot("http://one:1", role=Role.UNIFIED))
    report = run_check(CheckPlan(targets=(Target("http://one:1", Role.DECODE),), engine="fake", capacity_only=True))
    assert [e.role for e in report.engines] == [Role.DECODE]
