"""Danger lines through a whole check on the fake engine (kvpreflight._internal.probes.logs): a line in an
engine's log that names one of kvpreflight's request ids says which request it names, in the
check that request bears on (tenant-isolation's scenarios here), whenever it was logged."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fake_adapter import FakeEngine, Sent, snapshot

from kvpreflight._internal.pipeline import run_check
from kvpreflight._internal.probes import isolation
from kvpreflight._internal.probes.disconnect import AFTER_FIRST_TOKEN, Departure, RawTarget
from kvpreflight.check_plan import CheckPlan
from kvpreflight.model import Completion, Status
from kvpreflight.targets import Target

URL = "http://engine:1"


def test_a_line_naming_a_tenants_request_ties_to_that_request_in_its_scenario(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("started\n")

    def script(engine: FakeEngine, sent: Sent) -> Completion | None:
        if "cache_salt" in sent.extra and sent.max_tokens > 1:  # the tenants' requests, not the cache probes
            with log.open("a") as fh:
                fh.write(f"Decode transfer failed for request rid={sent.request_id} bootstrap_room=1\n")
        return None

    engine = FakeEngine(snapshot(URL), script=script)
    report = run_check(CheckPlan(targets=(Target(URL),), engine="fake", timeout_s=5, logs={URL: log}))  # type: ignore[arg-type]
    assert all(s.request_id and s.request_id.startswith("kvpreflight-") for s in engine.sent)
    assert len({s.request_id for s in engine.sent}) == len(engine.sent)  # fresh for every request
    (iso,) = [c for c in report.checks if c.id == "tenant-isolation"]
    assert iso.status is Status.WARN, iso.message
    normal = next(s for s in iso.evidence["scenarios"] if s["scenario"] == "normal")
    named = {d["names"] for d in normal["danger_lines"]}
    assert named == {f"tenant {r['tenant']}'s request {r['request']}" for r in normal["requests"]}, normal
    assert all(d["when"] == "logged during the normal scenario" and d["source"] == URL for d in normal["danger_lines"])
    assert 'the logs say: http://engine:1 log: "Decode transfer failed for request"' in iso.message


def test_a_line_logged_after_its_scenario_is_kept_and_still_names_its_request(tmp_path: Path) -> None:
    """vLLM logs "unrecognized request" up to a lease after the request: a line that lands while no
    scenario runs (here: during the prefix-cache probes) is quoted, naming the scenario's request,
    instead of being dropped."""
    log = tmp_path / "engine.log"
    log.write_text("started\n")
    first: list[str] = []

    def script(engine: FakeEngine, sent: Sent) -> Completion | None:
        if "cache_salt" in sent.extra and sent.max_tokens > 1 and not first:
            first.append(sent.request_id or "")
        elif "cache_salt" in sent.extra and sent.stream and sent.max_tokens == 1 and len(first) == 1:  # a prefix-cache probe
            first.append("logged")
            with log.open("a") as fh:
                fh.write(f"Decode transfer failed for request rid={first[0]} bootstrap_room=1\n")
        return None

    FakeEngine(snapshot(URL), script=script)
    report = run_check(CheckPlan(targets=(Target(URL),), engine="fake", timeout_s=5, logs={URL: log}))  # type: ignore[arg-type]
    (iso,) = [c for c in report.checks if c.id == "tenant-isolation"]
    assert iso.status is Status.WARN, iso.message
    (late,) = iso.evidence["danger_lines_between_scenarios"]
    # the first tenant request is one of the capacity probes' concurrent pair, which the boundary
    # scenario carries; the two are sent at once, so which one the engine saw first is a race
    (logged,) = [r for sc in iso.evidence["scenarios"] if sc["scenario"] == "boundary" for r in sc.get("requests", [])
                 if r.get("request_id") == first[0]]
    assert late["request_id"] == first[0] and late["names"] in {
        "tenant a's request concurrent-1-a (boundary)", "tenant b's request concurrent-2-b (boundary)"}, late
    assert late["names"].startswith(f"tenant {logged['tenant']}'s request"), (late, logged)
    assert ("no scenario was running; the logs say: http://engine:1 log: \"Decode transfer failed for request\" (logged "
            f"between the scenarios or during the prefix-cache probes, naming {late['names']})") in iso.message
    assert all("danger_lines" not in s for s in iso.evidence["scenarios"])


# vLLM 0.32's prefill, distributed/kv_transfer/kv_connector/v1/nixl/pull_worker.py (logger.error);
# the engine decorates the client's id: cmpl-<id>-0-<8 random characters>.
LATE_READ = ("(EngineCore_DP0 pid=7) ERROR 12-02 01:50:00 [pull_worker.py:667] Potentially invalid KV blocks for unrecognized "
             "request cmpl-{rid}-0-1a2b3c4d were retrieved by a decode worker. They may have expired.\n")


def test_a_late_read_of_an_answered_request_fails_tenant_isolation_naming_it_and_the_fix(tmp_path: Path) -> None:
    log = tmp_path / "prefill.log"
    log.write_text("started\n")
    named: list[str] = []

    def script(engine: FakeEngine, sent: Sent) -> Completion | None:
        if "cache_salt" in sent.extra and sent.max_tokens > 1 and not named and sent.tokens < 2000:  # the first normal request
            named.append(sent.request_id or "")
            with log.open("a") as fh:
                fh.write(LATE_READ.format(rid=sent.request_id))
        return None

    FakeEngine(snapshot(URL), script=script)
    report = run_check(CheckPlan(targets=(Target(URL),), engine="fake", timeout_s=5, logs={URL: log}))  # type: ignore[arg-type]
    (iso,) = [c for c in report.checks if c.id == "tenant-isolation"]
    assert iso.status is Status.FAIL, iso.message
    assert "the client got HTTP 200 with text computed from pages that may by then hold another request's KV" in iso.message
    assert "Potentially invalid KV blocks for unrecognized request ... were retrieved by a decode worker" in iso.message
    assert "naming tenant a's request normal-a1" in iso.message
    assert "the lease in force: not read" in iso.message  # the fake states no lease
    assert "fix: raise kv_connector_extra_config.kv_lease_duration" in iso.message
    assert report.exit_code == 1


def test_a_late_read_of_a_request_whose_client_left_warns_naming_the_cancel_path(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A disconnect scenario: the prefill freed the abandoned request's KV on the abort while the
    decode still read it. Nothing read reached a client: a warning that names the class."""
    log = tmp_path / "prefill.log"
    log.write_text("started\n")

    def during_transfer(target: RawTarget, pages_reserved: object, *, unified: bool, wait_s: float) -> Departure:
        with log.open("a") as fh:
            fh.write(LATE_READ.format(rid=target.request.request_id))
        return Departure("after its pages were reserved (used-token gauge rose)", b"")

    monkeypatch.setattr(isolation, "leave_during_transfer", during_transfer)
    monkeypatch.setattr(isolation, "leave_after_first_token",
                        lambda target, read_budget_s: Departure(AFTER_FIRST_TOKEN, b'data: {"text": "x"}\n'))
    FakeEngine(snapshot(URL))
    report = run_check(CheckPlan(targets=(Target(URL),), engine="fake", timeout_s=5, logs={URL: log},  # type: ignore[arg-type]
                                 allow_disruptive=True))
    (iso,) = [c for c in report.checks if c.id == "tenant-isolation"]
    assert iso.status is Status.WARN, iso.message
    cancel = next(s for s in iso.evidence["scenarios"] if s["scenario"] == "cancel-transfer")
    assert {d["hazard"] for d in cancel["danger_lines"]} == {"late-read"} and len(cancel["danger_lines"]) == 2
    assert ("cancel-transfer: a decode read KV of a request its client had abandoned after the prefill freed it on the abort: "
            "the cancel path frees KV under a transfer in flight (the incident's class)") in iso.message
    assert "naming tenant a's request cancel-transfer-a-left" in iso.message
