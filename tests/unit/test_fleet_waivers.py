"""A fleet deployment's waivers reach its record whole: the worker that boots a boot or builtin
deployment once got only each waiver's check and reason, so an inventory waiver's `until` never
reached the record and `verify` could not refuse it once expired. And a fleet with an expired
waiver is refused at once, as `check` refuses one, before anything boots."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest

from kvpreflight import preflight
from kvpreflight._internal.builtin_engine.deployment import BuiltinDeployment
from kvpreflight._internal.demo import demo_spec
from kvpreflight.errors import ConfigError
from kvpreflight.fleet import worker
from kvpreflight.fleet.errors import FleetError
from kvpreflight.fleet.inventory import BootTarget
from kvpreflight.fleet.job import WorkerJob
from kvpreflight.fleet.run import FleetRequest, execute
from kvpreflight.model import RouterKind, Waiver

WAIVERS = (Waiver("engine-advisories", "patched image, advisory not yet updated", "2027-01-31"),
           Waiver("prefix-cache-isolation", "one tenant per replica"))


def job() -> WorkerJob:
    return WorkerJob(name="chat", target=BuiltinDeployment(context_length=1024, faults=("reject-continues",)), waivers=WAIVERS,
                     subjects=("image=sha256:" + "ab" * 32,), command_line=("kvpreflight", "fleet", "f.yaml"),
                     record="/nonexistent/r.json", report="/nonexistent/report.json", log_dir="/nonexistent/logs")


def test_the_worker_checks_with_each_waiver_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def booted(_spec, plan, **_kw):
        seen["waivers"] = plan.waivers
        raise ConfigError("stop before booting")

    monkeypatch.setattr(preflight, "prepare_record", lambda *_a, **_kw: None)
    monkeypatch.setattr(preflight, "run_booted", booted)
    monkeypatch.setattr(worker, "_spec", lambda _job: None)
    monkeypatch.setattr("sys.stdin", io.StringIO(job().to_json()))
    assert worker._run() == 2
    assert seen["waivers"] == WAIVERS  # the expiry included: the record carries it, verify refuses it once past


def test_the_job_is_plain_json_that_reads_back_equal() -> None:
    text = job().to_json()
    assert json.loads(text)["waivers"][0] == {"check_id": "engine-advisories", "reason": WAIVERS[0].reason, "until": "2027-01-31"}
    assert WorkerJob.from_json(text) == job()
    boot = replace(job(), target=BootTarget(spec_path="/srv/spec.yaml", spec_text="engines: []\n", fixed_ports=(30000, 30001)))
    assert WorkerJob.from_json(boot.to_json()) == boot


def test_the_worker_boots_the_builtin_deployment_it_was_given_whole() -> None:
    """The job once carried its target as a dict the worker read key by key, so a field the
    worker did not name (the router, the incident) was dropped on the way."""
    given = BuiltinDeployment(context_length=1024, incident=True)
    spec = worker._spec(WorkerJob.from_json(replace(job(), target=given).to_json()))
    assert spec == demo_spec(given) != demo_spec(BuiltinDeployment(context_length=1024))
    routed = replace(job(), target=BuiltinDeployment(router=RouterKind.SMG))
    assert WorkerJob.from_json(routed.to_json()).target == routed.target


def test_a_fleet_with_an_expired_waiver_is_refused_before_anything_runs(tmp_path) -> None:
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(json.dumps({"deployments": [
        {"name": "fine", "builtin": {"context_length": 1024}},
        {"name": "stale", "builtin": {"context_length": 1024},
         "skip": [{"id": "engine-advisories", "reason": "until the patch", "until": "2020-01-31"}]}]}))
    with pytest.raises(FleetError) as refused:
        execute(FleetRequest(inventory=inventory, work_dir=tmp_path / "work"))
    message = str(refused.value)
    assert "deployment stale" in message and "expired on 2020-01-31" in message and "renew the waiver" in message
    assert "\n" not in message and not (tmp_path / "work").exists()
