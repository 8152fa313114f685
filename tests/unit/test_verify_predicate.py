"""`verify` reads a kvpreflight record's predicate through the one typed reader `watch` uses too
(`kvpreflight.record.predicate`): a damaged record is refused naming every value that does not
read, in one line; a check id this version does not know still reads."""

from __future__ import annotations

import ast
import base64
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from record_support import APP, APP_DIGEST, assert_refused, make_keys, run_cli, sample_report, verify

from kvpreflight.model import CheckResult, Status
from kvpreflight.record import FleetDeployment, FleetPredicate, build_statement, sign_statement, statement, write_record
from kvpreflight.record.errors import PredicateError
from kvpreflight.record.predicate import ReleasePredicate

SUBJECT = f"app=sha256:{APP_DIGEST}"

VERIFY_SOURCE = Path(__file__).resolve().parents[2] / "kvpreflight" / "record" / "verify.py"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "records"


@pytest.fixture()
def keys(tmp_path):
    key, _, public = make_keys(tmp_path / "keys")
    return key, public


def signed(tmp_path: Path, key: Any, change=None, report=None) -> Path:
    """A record of `report` (the sample by default) whose statement `change` edits before signing:
    what a signer of another version, or a damaged signer, could have signed."""
    statement = build_statement(report or sample_report(), command_line=["kvpreflight", "check"], subjects=[APP])
    if change is not None:
        change(statement["predicate"])
    path = tmp_path / "record.dsse.json"
    write_record(path, sign_statement(statement, key))
    return path


def _damage(predicate: dict) -> None:
    del predicate["time"]
    predicate["verdict"] = "mostly-fine"
    predicate["checks"][1]["status"] = "passed"
    predicate["engines"][0]["role"] = "router"
    predicate["waivers"][0]["check_id"] = 7


def test_a_record_damaged_in_several_places_is_refused_naming_every_one_in_one_line(tmp_path, keys):
    path = signed(tmp_path, keys[0], _damage)
    result = verify(path, keys[1], "--subject", "app=sha256:" + "0" * 64, "--allow-fail")
    assert_refused(result, "subject app has digest", "malformed release record predicate", "time is None",
                   "verdict 'mostly-fine' is not a kvpreflight verdict", "checks[1].status is 'passed', not one of pass, fail",
                   "engines[0].role is 'router'", "waivers[0].check_id is 7", "the record is damaged or not a kvpreflight record")


def test_the_predicate_reader_names_every_problem_it_finds():
    predicate = build_statement(sample_report(), command_line=[], subjects=[APP])["predicate"]
    _damage(predicate)
    with pytest.raises(PredicateError) as info:
        ReleasePredicate.from_dict(predicate)
    assert info.value.problems == (
        "engines[0].role is 'router', not one of unified, prefill, decode",
        "checks[1].status is 'passed', not one of pass, fail, warn, skip, inconclusive",
        "waivers[0].check_id is 7",
        "verdict 'mostly-fine' is not a kvpreflight verdict",
        "time is None",
    )
    assert info.value.exit_code == 2  # bad input where it is read alone; verify turns it into a refusal
    named = info.value.under("deployments[0]")  # named where it was found: the problems travel with it
    assert isinstance(named, PredicateError) and named.problems == info.value.problems
    assert str(named).startswith("deployments[0]: malformed ")


def test_a_recorded_verdict_its_checks_do_not_decide_is_refused(tmp_path, keys):
    path = signed(tmp_path, keys[0], lambda p: p.update(verdict="pass"), report=sample_report(failing=True))
    assert_refused(verify(path, keys[1], "--subject", SUBJECT, "--allow-fail"),
                   "verdict 'pass' is not the 'fail' its checks decide")


def test_a_record_of_a_newer_predicate_schema_is_refused_saying_to_upgrade(tmp_path, keys):
    path = signed(tmp_path, keys[0], lambda p: p.update(schema_version=99))
    assert_refused(verify(path, keys[1], "--subject", SUBJECT),
                   "release record predicate schema_version 99 is newer than this kvpreflight reads (2); upgrade kvpreflight")


def test_a_check_this_version_does_not_know_still_reads_and_verifies(tmp_path, keys):
    base = sample_report()
    future = CheckResult(id="kv-future-check", status=Status.PASS, message="a check of a later kvpreflight")
    path = signed(tmp_path, keys[0], report=replace(base, checks=(*base.checks, future)))
    result = verify(path, keys[1], "--subject", SUBJECT)
    assert result.returncode == 0, result.stderr
    assert "verdict    pass" in result.stdout
    # the reader's id is the string the record says, not a guess at a known check
    predicate = json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))["predicate"]
    assert ReleasePredicate.from_dict(predicate).report.checks[-1].id == "kv-future-check"


def test_a_record_written_with_predicate_schema_1_shows_its_pool_as_before():
    # schema 1 kept each engine's counting pool, not its readings
    result = run_cli("verify", EXAMPLES / "demo-pass.dsse.json", "--key", EXAMPLES / "kvpreflight.pub", "--any-subject",
                     "--max-age", "3650d", "--require", "none")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("pool 16384 tokens, context served 8192") == 2, result.stdout


def test_verify_and_watch_read_the_predicate_through_one_reader(tmp_path, keys, monkeypatch):
    from kvpreflight._internal.watch.drift import load_baseline
    from kvpreflight.record import Policy, load_public_key, read_record, verify_envelope

    read: list[ReleasePredicate] = []
    real = ReleasePredicate.from_dict.__func__  # type: ignore[attr-defined]

    def spy(cls, data):
        read.append(real(cls, data))
        return read[-1]

    monkeypatch.setattr(ReleasePredicate, "from_dict", classmethod(spy))
    path = signed(tmp_path, keys[0])
    verified = verify_envelope(read_record(path), load_public_key(keys[1]), Policy(any_subject=True))
    assert len(read) == 1 and verified.predicate is read[0]
    baseline = load_baseline(path, keys[1])
    assert len(read) == 2
    assert tuple(baseline.engines.values()) == read[1].report.engines  # the snapshots the reader built, as they are
    assert all(a is b for a, b in zip(baseline.engines.values(), read[1].report.engines, strict=True))


# Readers of the other predicate types kvpreflight verifies (an in-toto Test Result, a SLSA
# VSA): they have no typed reader, so they read their dicts by key.
OTHER_PREDICATE_READERS = {"_names", "_test_result_problems", "_summary_problems"}
# What verify reads of the in-toto statement around a predicate.
STATEMENT_KEYS = {"_type", "predicateType", "predicate", "subject"}


def _keys_looked_up(function: ast.AST) -> set[str]:
    keys = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            keys.add(node.slice.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            keys.add(node.args[0].value)
    return keys


def test_verify_looks_up_no_key_of_a_kvpreflight_predicate():
    tree = ast.parse(VERIFY_SOURCE.read_text(encoding="utf-8"))
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert OTHER_PREDICATE_READERS <= {f.name for f in functions}  # the allowance names what is there
    looked_up = {f.name: keys for f in functions if f.name not in OTHER_PREDICATE_READERS
                 if (keys := _keys_looked_up(f) - STATEMENT_KEYS)}
    assert looked_up == {}, "record/verify.py reads the predicate by key; read it through ReleasePredicate/FleetPredicate"


def test_a_fleet_record_damaged_in_several_places_is_refused_naming_every_one(tmp_path, keys):
    deployment = FleetDeployment(name="eu", verdict=Status.PASS, exit_code=0, record="eu.dsse.json")
    predicate = FleetPredicate(fleet="rel", runner="local", tool_version="0.1.0", started_at="2026-01-01T00:00:00Z",
                               finished_at="2026-01-01T00:01:00Z", verdict=Status.PASS, counts={"pass": 1},
                               deployments=(deployment,), time="2026-01-01T00:01:00Z", host="driver")
    st = statement(predicate, subjects=[APP], command_line=["kvpreflight", "fleet"])
    st["predicate"]["deployments"][0]["verdict"] = "green"
    st["predicate"]["deployments"][0]["name"] = None
    st["predicate"]["runner"] = 3
    path = tmp_path / "fleet.dsse.json"
    write_record(path, sign_statement(st, keys[0]))
    assert_refused(verify(path, keys[1], "--any-subject", "--max-age", "3650d"),
                   "malformed fleet record predicate", "deployments[0].verdict 'green' is not a kvpreflight verdict",
                   "deployments[0].name is None", "runner is 3")


def test_an_accepted_record_reads_as_before(tmp_path, keys):
    path = signed(tmp_path, keys[0])
    result = verify(path, keys[1], "--subject", f"app=sha256:{APP_DIGEST}")
    assert result.returncode == 0, result.stderr
    assert ("sglang 0.4.9 prefill at http://prefill-0:30000: model tiny-llama, pool 139264 tokens, context served 131072"
            in result.stdout)
    assert "tool       kvpreflight 0.1.0" in result.stdout


def test_the_sample_records_readme_commands_exit_as_it_says():
    block = (EXAMPLES / "README.md").read_text().split("```bash\n")[1].split("```")[0]
    for line in block.splitlines():
        command, _, said = line.partition("# exit ")
        args = [EXAMPLES / a if (EXAMPLES / a).is_file() else a for a in command.split()[1:]]
        result = run_cli(*args)
        assert result.returncode == int(said.split(":")[0]), (line, result.stdout, result.stderr)
