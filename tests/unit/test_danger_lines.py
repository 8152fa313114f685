"""Danger lines through a whole check on the fake engine (kvpreflight.probes.logs): a line in an
engine's log that names one of kvpreflight's request ids says which request it names, in the
check that request bears on (tenant-isolation's scenarios here), whenever it was logged."""

from __future__ import annotations

from pathlib import Path

from support.fake_adapter import FakeEngine, Sent, snapshot

from kvpreflight.model import Completion, Status
from kvpreflight.pipeline import run_check
from kvpreflight.plan import CheckPlan
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
