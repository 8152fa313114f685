"""The typed predicates and the report schema: what is signed reads back as what was meant, with
one set of key names, and a record written before the rename still reads."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path

import pytest
from record_support import APP, sample_report

from kvpreflight.formats import get_format
from kvpreflight.model import Status
from kvpreflight.record import (
    FLEET_PREDICATE_TYPE,
    PREDICATE_TYPE,
    FleetDeployment,
    FleetPredicate,
    RecordError,
    ReleasePredicate,
    build_statement,
    statement,
)
from kvpreflight.schema import SchemaError, report_from_dict, report_to_dict

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "records"


def test_a_report_reads_back_from_its_json_unchanged():
    report = replace(sample_report(failing=True), gpus=({"index": 0, "name": "NVIDIA H200"},))
    text = get_format("json").render(report)
    assert report_from_dict(json.loads(text)) == report


def test_the_report_and_the_record_use_one_key_for_the_served_context_and_one_rank_spelling():
    report = sample_report()
    engine = report_to_dict(report)["engines"][1]
    predicate = build_statement(report, command_line=[], subjects=[APP])["predicate"]
    assert predicate["engines"][1] == engine
    assert engine["context_length"] == 131072 and "context_served" not in engine
    assert engine["kv_pool_sources"] == {report.engines[1].pool_readings[0].label: 150000}


def test_a_release_predicate_reads_back_from_the_signed_statement():
    st = build_statement(sample_report(), command_line=["kvpreflight", "check", "--api-key", "sk-abcdefgh12"],
                         subjects=[APP])
    predicate = ReleasePredicate.from_dict(st["predicate"])
    assert predicate.to_dict() == st["predicate"]
    assert predicate.verdict is Status.PASS and predicate.command_line == ("kvpreflight", "check", "--api-key", "<redacted>")
    # response text is omitted before signing, in the typed predicate too
    assert predicate.report.checks[1].evidence["response_text"]["omitted"] == "response text is never recorded"


def test_a_fleet_predicate_reads_back_and_carries_its_own_type():
    deployment = FleetDeployment(name="eu", verdict=Status.FAIL, exit_code=1, host="node-1", record="eu.dsse.json",
                                 not_passed=({"id": "kv-capacity", "status": "fail"},))
    predicate = FleetPredicate(fleet="rel", runner="local", tool_version="0.1.0", started_at="2026-01-01T00:00:00Z",
                               finished_at="2026-01-01T00:01:00Z", verdict=Status.FAIL, counts={"pass": 0, "fail": 1},
                               deployments=(deployment,), time="2026-01-01T00:01:00Z", host="driver")
    st = statement(predicate, subjects=[APP], command_line=["kvpreflight", "fleet", "fleet.yaml"])
    assert st["predicateType"] == FLEET_PREDICATE_TYPE and st["predicate"]["exit_code"] == 1
    assert FleetPredicate.from_dict(st["predicate"]) == replace(predicate, command_line=("kvpreflight", "fleet", "fleet.yaml"))


def test_the_statement_builder_removes_the_secrets_it_is_given_from_the_whole_predicate():
    secret = "tenant-b-key-0c44d2"
    report = sample_report()
    leaky = replace(report, checks=(replace(report.checks[0], evidence={"sent": {"x-api-key": secret}}), *report.checks[1:]))
    text = json.dumps(build_statement(leaky, command_line=[], subjects=[APP], secrets=[secret]))
    assert secret not in text and "<redacted>" in text
    assert secret in json.dumps(build_statement(leaky, command_line=[], subjects=[APP]))  # it was there to remove


def test_a_record_written_with_predicate_schema_1_still_reads():
    envelope = json.loads((EXAMPLES / "demo-pass.dsse.json").read_text())
    st = json.loads(base64.b64decode(envelope["payload"]))
    assert st["predicateType"] == PREDICATE_TYPE and st["predicate"]["schema_version"] == 1
    predicate = ReleasePredicate.from_dict(st["predicate"])
    assert predicate.verdict is Status.PASS and predicate.verdict.value == st["predicate"]["verdict"]
    assert [e.served_context for e in predicate.report.engines] == [e["context_served"] for e in st["predicate"]["engines"]]


def test_an_unknown_status_is_an_error_not_a_guess():
    data = report_to_dict(sample_report())
    data["checks"][0]["status"] = "mostly-fine"
    with pytest.raises(SchemaError, match=r"checks\[0\].status is 'mostly-fine', not one of pass, fail"):
        report_from_dict(data)
    predicate = build_statement(sample_report(), command_line=[], subjects=[APP])["predicate"]
    predicate["engines"][0]["role"] = "router"
    with pytest.raises(RecordError, match="malformed release record predicate: .*role"):
        ReleasePredicate.from_dict(predicate)


def test_a_newer_predicate_schema_is_refused_with_what_to_do():
    predicate = build_statement(sample_report(), command_line=[], subjects=[APP])["predicate"]
    with pytest.raises(RecordError, match="schema_version 99 is newer .*upgrade kvpreflight"):
        ReleasePredicate.from_dict({**predicate, "schema_version": 99})


def test_a_signed_record_whose_verdict_is_not_a_kvpreflight_verdict_is_refused_even_with_allow_fail(tmp_path):
    from kvpreflight.record import Policy, generate, sign_statement, verify_envelope
    from kvpreflight.record.dsse import envelope_from_dict

    key = generate()
    st = build_statement(sample_report(), command_line=[], subjects=[APP])
    st["predicate"]["verdict"] = "mostly-fine"
    envelope = envelope_from_dict(sign_statement(st, key))
    with pytest.raises(RecordError, match="verdict 'mostly-fine' is not a kvpreflight verdict") as info:
        verify_envelope(envelope, key.public, Policy(any_subject=True, allow_fail=True))
    assert info.value.exit_code == 1
    st["predicate"]["verdict"] = "pass"
    ok = verify_envelope(envelope_from_dict(sign_statement(st, key)), key.public, Policy(any_subject=True))
    assert ok.verdict is Status.PASS


def test_a_damaged_report_is_one_error_naming_every_value_that_does_not_read():
    data = report_to_dict(sample_report())
    data["checks"][0]["status"] = "mostly-fine"
    data["engines"][1]["kv_pool_readings"][0]["tokens"] = "many"
    data["cost"] = {"requests": 3}
    with pytest.raises(SchemaError) as info:
        report_from_dict(data)
    assert str(info.value) == (
        "malformed report: engines[1].kv_pool_readings[0].tokens is 'many'; "
        "checks[0].status is 'mostly-fine', not one of pass, fail, warn, skip, inconclusive; "
        "cost.prompt_tokens_submitted is None; cost.prefilled_tokens is None; "
        "the file is damaged or not a kvpreflight report")
