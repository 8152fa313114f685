"""`verify`'s rules between options live in the library (`kvpreflight.record.verify_options`): each
holds when called directly, and the CLI says the same one line with exit 2."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pytest
import typer
from record_support import APP_DIGEST, make_keys, run_cli, sample_report, write_signed

from kvpreflight._internal.cli import app
from kvpreflight.record import RecordError
from kvpreflight.record.gate import verify_files
from kvpreflight.record.verify import DEFAULT_MAX_AGE
from kvpreflight.record.verify_options import VerifyOptions, build_verify_plan, check_verify_fields, verify_options_from

SUBJECT = f"app=sha256:{APP_DIGEST}"
ONE = (Path("record.dsse.json"),)

# Each cross-option rule: the options that break it and the fragment of its one-line error.
RULES = [
    (dict(allow_fail=True, require_pass=True), "--allow-fail and --require-pass contradict each other"),
    (dict(records=(Path("a"), Path("b")), vsa=Path("v.json"), resource_uri="oci://app"), "--vsa summarizes one release record"),
    (dict(vsa=Path("v.json"), deep=Path("d"), resource_uri="oci://app"), "pass one RECORD and no --deep"),
    (dict(vsa=Path("v.json"), allow_fail=True, resource_uri="oci://app"), "drop --allow-fail"),
    (dict(vsa=Path("v.json")), "--vsa needs --resource-uri"),
    (dict(sign_key="k.key"), "--sign-key only makes sense with --vsa FILE"),
]


@pytest.mark.parametrize(("given", "fragment"), RULES)
def test_each_rule_between_verify_options_holds_in_the_library(given, fragment):
    options = VerifyOptions(**{"records": ONE, "key": Path("k.pub"), **given})
    with pytest.raises(RecordError, match=fragment) as info:
        check_verify_fields(options)
    assert info.value.exit_code == 2


@pytest.mark.parametrize(("given", "fragment"), RULES)
def test_the_cli_says_each_rule_in_one_line_with_exit_2(tmp_path, given, fragment):
    key, _, public = make_keys(tmp_path / "keys")
    records = [tmp_path / f"r{i}.dsse.json" for i in range(len(given.get("records", ONE)))]
    for record in records:
        write_signed(record, key)
    args: list[object] = ["verify", *records, "--key", public, "--subject", SUBJECT]
    flags = {"allow_fail": "--allow-fail", "require_pass": "--require-pass"}
    for name, value in given.items():
        if name in flags:
            args.append(flags[name])
        elif name != "records":
            args += [f"--{name.replace('_', '-')}", tmp_path / value if isinstance(value, Path) else value]
    proc = run_cli(*args, env={"KVPREFLIGHT_SIGN_KEY": ""})
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvpreflight: error: ") and fragment in lines[0], proc.stderr
    assert not (tmp_path / "v.json").exists()


def test_a_library_user_gets_the_gate_without_the_cli(tmp_path):
    key, _, public = make_keys(tmp_path / "keys")
    record = tmp_path / "record.dsse.json"
    write_signed(record, key)
    plan = build_verify_plan(VerifyOptions(records=(record,), key=public, subjects=(SUBJECT,)))
    assert plan.policy.max_age.total_seconds() == 24 * 3600 and plan.summary is None
    out: list[str] = []
    err: list[str] = []
    assert verify_files(plan, out=out.append, err=err.append) == 0
    assert err == [f"OK: {record}\n"] and out[0].startswith(f"verified {record}")
    # --expect-model with only other kinds of files to read is not a pass: nothing showed the engines
    wanting = build_verify_plan(VerifyOptions(records=(record,), key=public, subjects=(SUBJECT,), expect_model="other"))
    assert wanting.needs_record and verify_files(wanting, out=out.append, err=err.append) == 1


def test_verify_parameters_are_the_options_fields_and_the_default_age_is_the_librarys():
    """`verify`'s parameters are VerifyOptions' fields (besides the command line the command adds),
    so `verify_options_from(locals())` drops none, and --help shows the library's --max-age default."""
    command = typer.main.get_command(app).commands["verify"]  # type: ignore[attr-defined]
    params = {p.name for p in command.params}
    assert params == {f.name for f in dataclasses.fields(VerifyOptions)} - {"command_line"}
    built = verify_options_from({name: None for name in params} | {"records": ["r"], "key": Path("k")})
    assert built.subjects == () and built.required == () and built.records == ("r",)
    (max_age,) = [p for p in command.params if p.name == "max_age"]
    assert max_age.default is None and f"[default: {DEFAULT_MAX_AGE}]" in max_age.help


def test_deep_and_vsa_refuse_files_that_are_not_a_release_record(tmp_path):
    """Rules that need the file read: --deep verifies a fleet record's deployments (a Test Result has
    none), and --vsa summarizes one deployment's release record (not a fleet record)."""
    from kvpreflight.check_plan import OutputPlan
    from kvpreflight.model import Status
    from kvpreflight.preflight import prepare_record, publish
    from kvpreflight.record import FleetDeployment, FleetPredicate, parse_subject, sign_statement, statement, write_record

    key, private, public = make_keys(tmp_path / "keys")
    record, tested = tmp_path / "record.dsse.json", tmp_path / "record.test-result.dsse.json"
    plan = prepare_record(record, sign_key=str(private), subjects=(SUBJECT,), unsigned=False, command_line=("kvpreflight", "check"),
                          reads_files=False, test_result=tested)
    publish(sample_report(), OutputPlan(format="json", path=tmp_path / "report.json", record=plan))
    deep = build_verify_plan(VerifyOptions(records=(tested,), key=public, subjects=(SUBJECT,), deep=tmp_path, required=("none",),
                                           allow_warned=True))
    with pytest.raises(RecordError, match=rf"^--deep needs a kvpreflight record; {tested} is a ") as info:
        verify_files(deep, out=print, err=print)
    assert info.value.exit_code == 2

    fleet = tmp_path / "fleet.dsse.json"
    predicate = FleetPredicate(fleet="rel", runner="local", tool_version="0.1.0", started_at="2026-01-01T00:00:00Z",
                               finished_at="2026-01-01T00:01:00Z", verdict=Status.PASS, counts={"pass": 1},
                               deployments=(FleetDeployment(name="eu", verdict=Status.PASS, exit_code=0, host="n", record="eu.dsse.json"),),
                               time=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), host="driver")
    write_record(fleet, sign_statement(statement(predicate, subjects=[parse_subject(SUBJECT)], command_line=["kvpreflight", "fleet"]), key))
    summary = build_verify_plan(VerifyOptions(records=(fleet,), key=public, subjects=(SUBJECT,), vsa=tmp_path / "vsa.json",
                                              resource_uri="oci://app", sign_key=str(private)))
    with pytest.raises(RecordError, match="^--vsa summarizes a release record; this is a fleet record$"):
        verify_files(summary, out=print, err=print)
    assert not (tmp_path / "vsa.json").exists()
