"""The standard attestations beside our record: an in-toto Test Result written by `check --record
--test-result`, a SLSA Verification Summary written by `verify --vsa`, and `verify` judging all three."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
from record_support import APP, APP_DIGEST, load, make_keys, record_text, run_cli, sample_report, write_signed

from kvpreflight._internal.checkdata import data_dir
from kvpreflight.check_plan import OutputPlan
from kvpreflight.errors import ConfigError
from kvpreflight.model import CheckResult, Report, Status, Waiver
from kvpreflight.preflight import prepare_record, publish
from kvpreflight.record import RecordError
from kvpreflight.record.attest import TEST_RESULT_PREDICATE_TYPE, VSA_PREDICATE_TYPE, TestResultPredicate

SUBJECT = f"app=sha256:{APP_DIGEST}"
URI = "oci://registry.example/chat@sha256:" + "ab" * 32


def payload(path: Path) -> dict:
    return json.loads(base64.b64decode(load(path)["payload"]))


def with_checks(*checks: CheckResult, waivers: tuple[Waiver, ...] = ()) -> Report:
    return replace(sample_report(), checks=checks, waivers=waivers)


PASS = CheckResult(id="kv-capacity", status=Status.PASS, message="pool holds the context", endpoint="http://prefill-0:30000")
REJECTED = CheckResult(id="overcapacity-rejected", status=Status.PASS, message="HTTP 400")
ISOLATED = CheckResult(id="tenant-isolation", status=Status.PASS, message="no canary crossed")
WAIVED = CheckResult(id="tenant-isolation", status=Status.SKIP, message="waived: shared pool (found: fail: canary crossed)",
                     evidence={"waiver": "shared pool", "status_before_waiver": "fail"})


@pytest.mark.parametrize(("checks", "waivers", "result", "lists"), [
    ((PASS, REJECTED, ISOLATED), (), "PASSED",
     {"passedTests": ["kv-capacity (http://prefill-0:30000)", "overcapacity-rejected", "tenant-isolation"],
      "warnedTests": [], "failedTests": []}),
    ((PASS, REJECTED, replace(ISOLATED, status=Status.WARN)), (), "WARNED",
     {"warnedTests": ["tenant-isolation"], "failedTests": []}),
    ((PASS, replace(REJECTED, status=Status.SKIP, message="--capacity-only")), (), "WARNED",
     {"warnedTests": ["overcapacity-rejected [skipped]"], "failedTests": []}),
    ((PASS, REJECTED, WAIVED), (Waiver("tenant-isolation", "shared pool"),), "WARNED",
     {"passedTests": ["kv-capacity (http://prefill-0:30000)", "overcapacity-rejected"], "warnedTests": ["tenant-isolation [waived]"]}),
    ((PASS, replace(REJECTED, status=Status.FAIL), replace(ISOLATED, status=Status.WARN)), (), "FAILED",
     {"failedTests": ["overcapacity-rejected"], "warnedTests": ["tenant-isolation"]}),
    ((PASS, REJECTED, replace(ISOLATED, status=Status.INCONCLUSIVE)), (), "FAILED",
     {"failedTests": ["tenant-isolation"], "warnedTests": []}),
])
def test_the_test_result_says_passed_only_for_a_clean_pass(checks, waivers, result, lists):
    predicate = TestResultPredicate.of(with_checks(*checks, waivers=waivers), ()).to_dict()
    assert predicate["result"] == result
    for field, names in lists.items():
        assert predicate[field] == names, field


def _publish(tmp_path: Path, report: Report, private: Path, *, advisories: tuple[Path, ...] = (),
             spec: Path | None = None) -> tuple[Path, Path]:
    record, tested = tmp_path / "record.dsse.json", tmp_path / "record.test-result.dsse.json"
    plan = prepare_record(record, sign_key=str(private), subjects=(SUBJECT,), unsigned=False,
                          command_line=("kvpreflight", "check", "--api-key-file", "k"), reads_files=False,
                          test_result=tested, advisory_dirs=advisories, spec=spec)
    publish(report, OutputPlan(format="json", path=tmp_path / "report.json", record=plan),
            secrets={"sk-live-0123456789abcdef"})
    return record, tested


def test_check_writes_a_test_result_beside_the_record_with_its_subjects_and_configuration(tmp_path):
    key, private, public = make_keys(tmp_path / "k")
    extra = tmp_path / "my-advisories"
    extra.mkdir()
    (extra / "ours.yaml").write_text("[]\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("deployment: chat\n")
    report = replace(sample_report(), entry="http://ops:sk-live-0123456789abcdef@router:8000")
    record, tested = _publish(tmp_path, report, private, advisories=(extra,), spec=spec)

    ours, theirs = payload(record), payload(tested)
    assert theirs["_type"] == "https://in-toto.io/Statement/v1" and theirs["predicateType"] == TEST_RESULT_PREDICATE_TYPE
    assert theirs["subject"] == ours["subject"]  # --subject and engine:<url>, the same digests
    assert any(s["name"].startswith("engine:") for s in theirs["subject"])
    assert load(tested)["signatures"][0]["keyid"] == load(record)["signatures"][0]["keyid"] == key.keyid
    config = {c["name"]: c["digest"]["sha256"] for c in theirs["predicate"]["configuration"]}
    thresholds = hashlib.sha256((data_dir() / "thresholds.yaml").read_bytes()).hexdigest()
    assert config["kvpreflight:checks/thresholds.yaml"] == thresholds
    assert "kvpreflight:checks/advisories/vllm.yaml" in config
    assert config[str(extra / "ours.yaml")] == hashlib.sha256(b"[]\n").hexdigest()
    assert config[str(spec)] == hashlib.sha256(b"deployment: chat\n").hexdigest()
    assert "sk-live-0123456789abcdef" not in record_text(tested) + record_text(record)

    # sample_report warns and waives: WARNED, refused by default, accepted with --allow-warned
    pair = run_cli("verify", record, tested, "--key", public, "--subject", SUBJECT)
    assert pair.returncode == 1, pair.stderr
    assert f"OK: {record}\n" in pair.stderr and f"FAIL: {tested}: refused: Test Result is WARNED" in pair.stderr
    assert "--allow-warned" in pair.stderr and "verified" in pair.stdout
    ok = run_cli("verify", record, tested, "--key", public, "--subject", SUBJECT, "--allow-warned")
    assert ok.returncode == 0, ok.stderr
    assert ok.stderr == f"OK: {record}\nOK: {tested}\n"
    assert "verdict    pass" in ok.stdout  # the detailed summary of our record stays


def test_a_clean_pass_verifies_without_flags_and_a_tampered_test_result_fails(tmp_path):
    _, private, public = make_keys(tmp_path / "k")
    _, tested = _publish(tmp_path, with_checks(PASS, REJECTED, ISOLATED), private)
    assert payload(tested)["predicate"]["result"] == "PASSED"
    ok = run_cli("verify", tested, "--key", public, "--subject", SUBJECT)
    assert ok.returncode == 0 and ok.stderr == f"OK: {tested}\n", ok.stderr

    envelope = load(tested)
    statement = payload(tested)
    statement["predicate"]["result"] = "PASSED"
    statement["predicate"]["failedTests"] = ["smuggled"]
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    tested.write_text(json.dumps(envelope))
    bad = run_cli("verify", tested, "--key", public, "--subject", SUBJECT)
    assert bad.returncode == 1 and bad.stderr.startswith(f"FAIL: {tested}: refused: signature does not verify"), bad.stderr


def test_a_warned_test_result_with_a_waived_required_check_is_refused_even_with_allow_warned(tmp_path):
    _, private, public = make_keys(tmp_path / "k")
    _, tested = _publish(tmp_path, with_checks(PASS, REJECTED, WAIVED, waivers=(Waiver("tenant-isolation", "shared pool"),)), private)
    refused = run_cli("verify", tested, "--key", public, "--subject", SUBJECT, "--allow-warned")
    assert refused.returncode == 1
    assert "required check tenant-isolation did not pass in the Test Result (tenant-isolation [waived])" in refused.stderr
    assert run_cli("verify", tested, "--key", public, "--subject", SUBJECT, "--allow-warned", "--require", "kv-capacity").returncode == 0


def test_a_test_result_needs_a_record(tmp_path):
    with pytest.raises(ConfigError, match="own file"):
        prepare_record(tmp_path / "r.json", sign_key=None, subjects=(SUBJECT,), unsigned=True, command_line=(),
                       reads_files=False, test_result=tmp_path / "r.json")
    proc = run_cli("check", "--endpoint", "http://127.0.0.1:9", "--test-result", tmp_path / "t.json")
    assert proc.returncode == 2 and "--test-result only make sense with --record" in proc.stderr, proc.stderr


def vsa(record: Path, public: Path, private: Path, out: Path, *extra: str):
    return run_cli("verify", record, "--key", public, "--subject", SUBJECT, "--vsa", out, "--resource-uri", URI,
                   "--sign-key", private, *extra, env={"KVPREFLIGHT_SIGN_KEY": ""})


def test_verify_writes_a_passed_vsa_that_verify_then_accepts(tmp_path):
    key, private, public = make_keys(tmp_path / "k")
    record, out = tmp_path / "record.dsse.json", tmp_path / "record.vsa.dsse.json"
    write_signed(record, key)
    done = vsa(record, public, private, out)
    assert done.returncode == 0, done.stderr
    assert f"OK: {record}" in done.stderr and "verified" in done.stdout

    statement = payload(out)
    p = statement["predicate"]
    assert statement["predicateType"] == VSA_PREDICATE_TYPE
    assert statement["subject"] == payload(record)["subject"]
    assert p["verificationResult"] == "PASSED" and p["resourceUri"] == URI
    assert p["verifier"]["id"] and p["timeVerified"].endswith("Z")
    assert p["verifiedLevels"] == ["KVPREFLIGHT_RECORD_VERIFIED", "KVPREFLIGHT_CAPACITY_VERIFIED",
                                   "KVPREFLIGHT_OVERCAPACITY_REJECTED", "KVPREFLIGHT_TENANT_ISOLATION_VERIFIED"]
    assert not any(level.startswith("SLSA_") for level in p["verifiedLevels"])
    assert p["inputAttestations"] == [{"name": str(record), "digest": {"sha256": hashlib.sha256(record.read_bytes()).hexdigest()}}]
    assert len(p["policy"]["digest"]["sha256"]) == 64 and p["policy"]["uri"]
    # the policy digest changes with the policy: --require none is not the default gate
    other = tmp_path / "none.vsa.json"
    assert vsa(record, public, private, other, "--require", "none").returncode == 0
    assert payload(other)["predicate"]["policy"] != p["policy"]
    assert payload(other)["predicate"]["verifiedLevels"] == ["KVPREFLIGHT_RECORD_VERIFIED"]

    ok = run_cli("verify", out, "--key", public, "--subject", SUBJECT, "--resource-uri", URI)
    assert ok.returncode == 0 and ok.stderr == f"OK: {out}\n", ok.stderr
    elsewhere = run_cli("verify", out, "--key", public, "--subject", SUBJECT, "--resource-uri", "oci://other")
    assert elsewhere.returncode == 1 and "not --resource-uri 'oci://other'" in elsewhere.stderr
    unchecked = run_cli("verify", record, "--key", public, "--subject", SUBJECT, "--resource-uri", URI)
    assert unchecked.returncode == 1 and "--resource-uri is checked in a Verification Summary" in unchecked.stderr
    weaker = run_cli("verify", other, "--key", public, "--subject", SUBJECT)
    assert weaker.returncode == 1 and "verifiedLevels lack KVPREFLIGHT_CAPACITY_VERIFIED" in weaker.stderr


def test_a_refused_record_gets_a_failed_vsa_that_verify_refuses(tmp_path):
    key, private, public = make_keys(tmp_path / "k")
    record, out = tmp_path / "record.dsse.json", tmp_path / "vsa.json"
    write_signed(record, key, report=with_checks(PASS, REJECTED, WAIVED))
    done = vsa(record, public, private, out)
    assert done.returncode == 1 and f"FAIL: {record}: refused: required check tenant-isolation was waived" in done.stderr
    p = payload(out)["predicate"]
    assert p["verificationResult"] == "FAILED" and p["verifiedLevels"] == ["FAILED"]
    refused = run_cli("verify", out, "--key", public, "--subject", SUBJECT)
    assert refused.returncode == 1 and "verificationResult is 'FAILED'" in refused.stderr


@pytest.mark.parametrize(("drop", "fragment"), [("--resource-uri", "--vsa needs --resource-uri"),
                                                ("--sign-key", "--vsa needs --sign-key")])
def test_a_vsa_without_resource_uri_or_key_is_bad_input(tmp_path, drop, fragment):
    key, private, public = make_keys(tmp_path / "k")
    record = tmp_path / "record.dsse.json"
    write_signed(record, key)
    args = ["verify", record, "--key", public, "--subject", SUBJECT, "--vsa", tmp_path / "v.json",
            "--resource-uri", URI, "--sign-key", private]
    i = args.index(drop)
    del args[i:i + 2]
    proc = run_cli(*args, env={"KVPREFLIGHT_SIGN_KEY": ""})
    assert proc.returncode == 2 and fragment in proc.stderr and proc.stdout == "", proc.stderr
    assert not (tmp_path / "v.json").exists()


def test_expect_model_needs_the_record_among_the_files(tmp_path):
    _, private, public = make_keys(tmp_path / "k")
    record, tested = _publish(tmp_path, with_checks(PASS, REJECTED, ISOLATED), private)
    alone = run_cli("verify", tested, "--key", public, "--subject", SUBJECT, "--expect-model", "tiny-llama")
    assert alone.returncode == 1 and "pass the record too" in alone.stderr
    both = run_cli("verify", record, tested, "--key", public, "--subject", SUBJECT, "--expect-model", "tiny-llama")
    assert both.returncode == 0, both.stderr


def test_our_record_is_still_refused_by_the_record_only_api(tmp_path):
    from kvpreflight.record import Policy, load_public_key, read_record, verify_envelope

    _, private, public = make_keys(tmp_path / "k")
    _, tested = _publish(tmp_path, with_checks(PASS, REJECTED, ISOLATED), private)
    with pytest.raises(RecordError, match="not a kvpreflight release record"):
        verify_envelope(read_record(tested), load_public_key(public), Policy(subjects=(APP,)))


def test_allow_warned_accepts_the_test_result_of_a_run_whose_record_verify_accepts(tmp_path):
    # A required check that warned decided: the record passes verify, and so must its Test Result
    # with --allow-warned; a skipped one decided nothing and is refused by both.
    _, private, public = make_keys(tmp_path / "k")
    warned = with_checks(PASS, REJECTED, replace(ISOLATED, status=Status.WARN, message="cancel-transfer unconfirmed"))
    record, tested = _publish(tmp_path, warned, private)
    assert run_cli("verify", record, "--key", public, "--subject", SUBJECT).returncode == 0
    ok = run_cli("verify", tested, "--key", public, "--subject", SUBJECT, "--allow-warned")
    assert ok.returncode == 0, ok.stderr
    skipped = with_checks(PASS, REJECTED, replace(ISOLATED, status=Status.SKIP, message="--capacity-only"))
    record, tested = _publish(tmp_path / "skipped", skipped, private)
    assert run_cli("verify", record, "--key", public, "--subject", SUBJECT).returncode == 1
    refused = run_cli("verify", tested, "--key", public, "--subject", SUBJECT, "--allow-warned")
    assert refused.returncode == 1 and "tenant-isolation [skipped]" in refused.stderr
