"""`kvpreflight verify`, the release gate as a pipeline sees it (in-process: tests/support/cli.py;
its process-level import guarantee is tests/builtin/test_verify_imports.py)."""

from __future__ import annotations

import base64
import json
import subprocess
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from record_support import APP, APP_DIGEST, assert_refused, load, make_keys, run_cli, sample_report, verify, write_signed

from kvpreflight.model import CheckResult, Report, Status, Waiver
from kvpreflight.record import build_statement, load_signing_key, sign_statement, unsigned_envelope, write_record

SUBJECT = f"app=sha256:{APP_DIGEST}"


@pytest.fixture()
def keys(tmp_path):
    key, private_path, public_path = make_keys(tmp_path / "keys")
    return key, public_path


@pytest.fixture()
def record(tmp_path, keys):
    path = tmp_path / "record.dsse.json"
    write_signed(path, keys[0])
    return path


def assert_bad_input(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("kvpreflight: error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def rewrite(path: Path, change) -> None:
    env = load(path)
    change(env)
    path.write_text(json.dumps(env))


def test_round_trip_keygen_sign_verify(tmp_path):
    gen = run_cli("keygen", "--out", tmp_path / "k")
    assert gen.returncode == 0, gen.stderr
    key = load_signing_key(tmp_path / "k" / "kvpreflight.key")
    path = tmp_path / "record.dsse.json"
    write_signed(path, key)
    ok = verify(path, tmp_path / "k" / "kvpreflight.pub", "--subject", SUBJECT)
    assert ok.returncode == 0, ok.stderr
    assert ok.stderr == f"OK: {path}\n"
    assert "verified" in ok.stdout and "verdict    pass" in ok.stdout
    assert f"app=sha256:{APP_DIGEST[:16]}" in ok.stdout
    assert "sglang 0.4.9 prefill at http://prefill-0:30000" in ok.stdout and "pool 139264 tokens" in ok.stdout
    assert key.keyid[:16] in ok.stdout and key.keyid[:16] in gen.stdout


def test_require_pass_is_accepted_as_the_explicit_default(record, keys):
    assert verify(record, keys[1], "--subject", SUBJECT, "--require-pass").returncode == 0


def test_changed_payload_byte_is_refused(record, keys):
    def change(env):
        body = base64.b64decode(env["payload"]).replace(b'"verdict":"pass"', b'"verdict":"Pass"')
        env["payload"] = base64.b64encode(body).decode()
    rewrite(record, change)
    assert_refused(verify(record, keys[1], "--subject", SUBJECT), "signature does not verify", "altered")


def test_changed_payload_type_is_refused(record, keys):
    rewrite(record, lambda env: env.update(payloadType="application/json"))
    assert_refused(verify(record, keys[1], "--subject", SUBJECT), "payloadType is 'application/json'")


def test_changed_signature_byte_is_refused(record, keys):
    def change(env):
        sig = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
        sig[-1] ^= 0x01  # inside the ECDSA s value: still well-formed DER, just wrong
        env["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    rewrite(record, change)
    assert_refused(verify(record, keys[1], "--subject", SUBJECT), "signature does not verify")


def test_signature_by_another_key_is_refused(record, tmp_path):
    _, _, other_public = make_keys(tmp_path / "other")
    assert_refused(verify(record, other_public, "--subject", SUBJECT), "record is signed by keyid", "not by the --key")


def test_signature_without_keyid_by_another_key_is_refused(record, tmp_path):
    _, _, other_public = make_keys(tmp_path / "other")
    rewrite(record, lambda env: env["signatures"][0].update(keyid=""))
    assert_refused(verify(record, other_public, "--subject", SUBJECT), "signature does not verify")


def test_stale_record_is_refused_and_max_age_widens_the_window(tmp_path, keys):
    path = tmp_path / "old.json"
    write_signed(path, keys[0], now=datetime.now(UTC) - timedelta(hours=30))
    assert_refused(verify(path, keys[1], "--subject", SUBJECT), "record is 30h old, older than --max-age 24h")
    assert verify(path, keys[1], "--subject", SUBJECT, "--max-age", "2d").returncode == 0
    assert_refused(verify(path, keys[1], "--subject", SUBJECT, "--max-age", "90m"), "older than --max-age 90m")


def test_record_from_the_future_is_refused(tmp_path, keys):
    path = tmp_path / "future.json"
    write_signed(path, keys[0], now=datetime.now(UTC) + timedelta(hours=2))
    assert_refused(verify(path, keys[1], "--subject", SUBJECT), "in the future", "clock")


def test_missing_subject_is_refused(record, keys):
    assert_refused(verify(record, keys[1], "--subject", SUBJECT, "--subject", "other=sha256:" + "0" * 64),
                   "subject other is not in the record (it names: app, engine:http://decode-0:30001, engine:http://prefill-0:30000)")


def test_wrong_digest_is_refused(record, keys):
    assert_refused(verify(record, keys[1], "--subject", "app=sha256:" + "0" * 64),
                   f"subject app has digest sha256:{APP_DIGEST} in the record, not sha256:{'0' * 64}")


def test_failed_verdict_is_refused_unless_allow_fail(tmp_path, keys):
    path = tmp_path / "fail.json"
    write_signed(path, keys[0], failing=True)
    assert_refused(verify(path, keys[1], "--subject", SUBJECT), "verdict is 'fail'", "overcapacity-rejected")
    ok = verify(path, keys[1], "--subject", SUBJECT, "--allow-fail")
    assert ok.returncode == 0 and "verdict    fail" in ok.stdout


def test_every_failed_condition_is_named_at_once(tmp_path, keys):
    path = tmp_path / "bad.json"
    write_signed(path, keys[0], failing=True, now=datetime.now(UTC) - timedelta(days=3))
    result = verify(path, keys[1], "--subject", "app=sha256:" + "0" * 64)
    assert_refused(result, "subject app has digest", "older than --max-age", "verdict is 'fail'")


def test_unsigned_record_never_passes(tmp_path, keys):
    path = tmp_path / "unsigned.json"
    statement = build_statement(sample_report(), command_line=[], subjects=[APP])
    write_record(path, unsigned_envelope(statement))
    assert "UNSIGNED" in load(path)["unsigned"]
    assert_refused(verify(path, keys[1], "--subject", SUBJECT, "--allow-fail"), "record is unsigned")


def test_other_predicate_type_is_refused(tmp_path, keys):
    statement = build_statement(sample_report(), command_line=[], subjects=[APP])
    statement["predicateType"] = "https://slsa.dev/provenance/v1"
    path = tmp_path / "slsa.json"
    write_record(path, sign_statement(statement, keys[0]))
    assert_refused(verify(path, keys[1], "--subject", SUBJECT), "predicateType is 'https://slsa.dev/provenance/v1'")


def test_no_subject_is_a_usage_error_unless_any_subject(record, keys):
    assert_bad_input(verify(record, keys[1]), "at least one --subject", "--any-subject")
    assert verify(record, keys[1], "--any-subject").returncode == 0


@pytest.mark.parametrize("bad, fragment", [("24", "not a duration"), ("1w", "not a duration"), ("0h", "not a duration")])
def test_bad_max_age_is_a_usage_error(record, keys, bad, fragment):
    assert_bad_input(verify(record, keys[1], "--subject", SUBJECT, "--max-age", bad), fragment)


def test_bad_subject_is_a_usage_error(record, keys):
    assert_bad_input(verify(record, keys[1], "--subject", "app=sha256:abc"), "64 hex digits")


def test_missing_and_malformed_inputs_are_bad_input(tmp_path, record, keys):
    assert_bad_input(verify(tmp_path / "nope.json", keys[1], "--subject", SUBJECT), "nope.json does not exist")
    (tmp_path / "trunc.json").write_text(record.read_text()[:50])
    assert_bad_input(verify(tmp_path / "trunc.json", keys[1], "--subject", SUBJECT), "is not JSON")
    rewrite(record, lambda env: env.update(payload="not base64!"))
    assert_bad_input(verify(record, keys[1], "--subject", SUBJECT), "payload is not valid base64")
    assert_bad_input(verify(record, tmp_path / "none.pub", "--subject", SUBJECT), "public key", "does not exist")
    assert_bad_input(verify(record, tmp_path / "keys" / "kvpreflight.key", "--subject", SUBJECT), "is a private key")
    (tmp_path / "junk.pub").write_text("hello")
    assert_bad_input(verify(record, tmp_path / "junk.pub", "--subject", SUBJECT), "not a PEM public key")


# -- the gate must not accept a record that proved nothing (verify --require, waiver expiry) --------

def _with(check_id: str, status: Status, message: str, *, waiver: Waiver | None = None) -> Report:
    base = sample_report()
    checks = tuple(
        CheckResult(id=c.id, status=status, message=message, endpoint=c.endpoint,
                    evidence={"waiver": waiver.reason} if waiver else {}) if c.id == check_id else c
        for c in base.checks)
    return replace(base, checks=checks, waivers=(*base.waivers, *((waiver,) if waiver else ())))


@pytest.mark.parametrize(("status", "message", "waived", "expected"), [
    (Status.SKIP, "--capacity-only: no request was sent (read-only mode)", False, "required check tenant-isolation is skip"),
    (Status.INCONCLUSIVE, "model does not echo", False, "required check tenant-isolation is inconclusive"),
    (Status.SKIP, "waived: canaries next sprint (found: fail: canary crossed)", True,
     "required check tenant-isolation was waived (canaries next sprint)"),
])
def test_a_record_whose_required_check_proved_nothing_is_refused_naming_it(tmp_path, keys, status, message, waived, expected):
    path = tmp_path / "record.dsse.json"
    waiver = Waiver("tenant-isolation", "canaries next sprint") if waived else None
    write_signed(path, keys[0], report=_with("tenant-isolation", status, message, waiver=waiver))
    assert_refused(verify(path, keys[1], "--subject", SUBJECT), expected)
    # the pipeline that knowingly accepts it says so (an inconclusive check still fails the verdict)
    for opt_out in ("none", "kv-capacity,overcapacity-rejected"):
        result = verify(path, keys[1], "--subject", SUBJECT, "--require", opt_out)
        if status is Status.SKIP:
            assert result.returncode == 0, result.stderr
        else:
            assert_refused(result, "verdict is 'inconclusive'")


def test_a_required_check_absent_from_the_record_is_refused(record, keys):
    assert_refused(verify(record, keys[1], "--subject", SUBJECT, "--require", "prompt-integrity"),
                   "required check prompt-integrity is not in the record")


def test_an_unknown_required_check_is_bad_input(record, keys):
    assert_bad_input(verify(record, keys[1], "--subject", SUBJECT, "--require", "tenant-isolaton"),
                     "--require tenant-isolaton: not a check id")


@pytest.mark.parametrize(("days", "accepted"), [(-1, False), (0, True), (30, True)])
def test_a_record_with_an_expired_waiver_is_refused(tmp_path, keys, days, accepted):
    until = (datetime.now(UTC).date() + timedelta(days=days)).isoformat()
    report = replace(sample_report(), waivers=(Waiver("engine-advisories", "baseline lands next sprint", until),))
    path = tmp_path / "record.dsse.json"
    write_signed(path, keys[0], report=report)
    result = verify(path, keys[1], "--subject", SUBJECT)
    if accepted:
        assert result.returncode == 0, result.stderr
    else:
        assert_refused(result, f"waiver of engine-advisories expired on {until}")


@pytest.mark.parametrize(("until", "expected"), [
    ("2026-02-30", "'2026-02-30' is not a day"),
    ("next week", "'next week' is not a day"),
])
def test_check_refuses_a_waiver_expiry_that_is_not_a_day(until, expected):
    result = run_cli("check", "--endpoint", "http://127.0.0.1:9", "--skip", "tenant-isolation", "--reason", "r",
                     "--until", until)
    assert_bad_input(result, expected)


@pytest.mark.parametrize(("days", "refused"), [(-1, True), (0, False)])
def test_check_refuses_an_expired_waiver_at_once_instead_of_a_record_verify_refuses(days, refused):
    until = (datetime.now(UTC).date() + timedelta(days=days)).isoformat()
    result = run_cli("check", "--endpoint", "http://127.0.0.1:9", "--skip", "tenant-isolation", "--reason", "staging",
                     "--until", until)
    if refused:  # exit 2 before any engine is contacted (port 9 would make it 3)
        assert_bad_input(result, f"the waiver of tenant-isolation expired on {until} (staging)")
    else:  # the waiver holds through its last day: the run goes on and finds no engine
        assert result.returncode == 3, result.stderr


@pytest.mark.parametrize(("flags", "refusal"), [
    (("--expect-model", "tiny-llama"), None),
    (("--expect-engine-version", "0.4.9"), None),
    (("--expect-model", "llama-70b"), "engine http://prefill-0:30000 reported model 'tiny-llama', not 'llama-70b' (--expect-model)"),
    (("--expect-engine-version", "0.5.20"),
     "engine http://decode-0:30001 reported version '0.4.9', not '0.5.20' (--expect-engine-version)"),
])
def test_a_record_from_another_model_or_engine_version_is_refused(record, keys, flags, refusal):
    result = verify(record, keys[1], "--subject", SUBJECT, *flags)
    if refusal is None:
        assert result.returncode == 0, result.stderr
    else:
        assert_refused(result, refusal)


def test_vsa_refuses_a_world_readable_signing_key_and_an_unwritable_summary_path(tmp_path, record, keys):
    _, private, public = make_keys(tmp_path / "vsa-keys")
    base = ("--subject", SUBJECT, "--resource-uri", "oci://registry/app")
    (tmp_path / "a-file").write_text("x")
    assert_bad_input(verify(record, keys[1], *base, "--vsa", tmp_path / "a-file" / "vsa.json", "--sign-key", private),
                     "--vsa", "is not a folder")
    private.chmod(0o644)
    assert_bad_input(verify(record, keys[1], *base, "--vsa", tmp_path / "vsa.json", "--sign-key", private),
                     "chmod 600", "--allow-insecure-key")
    assert not (tmp_path / "vsa.json").exists()
    ok = verify(record, keys[1], *base, "--vsa", tmp_path / "vsa.json", "--sign-key", private, "--allow-insecure-key")
    assert ok.returncode == 0 and (tmp_path / "vsa.json").exists(), ok.stderr


def _signed_payload(body: bytes, key) -> dict:
    from kvpreflight.record.dsse import IN_TOTO_PAYLOAD_TYPE, Envelope, Signature, pae

    return Envelope(body, IN_TOTO_PAYLOAD_TYPE, (Signature(keyid=key.keyid, sig=key.sign(pae(IN_TOTO_PAYLOAD_TYPE, body))),)).to_dict()


@pytest.mark.parametrize("where", ["envelope", "signature"])
def test_an_envelope_naming_a_key_twice_is_bad_input(tmp_path, record, keys, where):
    text = record.read_text()
    assert verify(record, keys[1], "--subject", SUBJECT).returncode == 0  # the record itself verifies
    if where == "envelope":  # a verifier keeping the first "payloadType" reads another envelope
        forged = text.replace("{", '{"payloadType": "text/plain",', 1)
        key = "payloadType"
    else:
        forged = text.replace('"keyid":', '"keyid": "someone-else", "keyid":', 1)
        key = "keyid"
    assert json.loads(forged) == json.loads(text)  # Python alone would read the same document
    record.write_text(forged)
    assert_bad_input(verify(record, keys[1], "--subject", SUBJECT), f"names the key '{key}' twice")


@pytest.mark.parametrize("field", ["predicateType", "verdict"])
def test_a_signed_statement_naming_a_key_twice_is_refused(tmp_path, keys, field):
    key, public = keys
    statement = build_statement(sample_report(), command_line=["kvpreflight", "check"], subjects=[APP])
    body = json.dumps(statement, sort_keys=True, separators=(",", ":"))
    if field == "predicateType":
        body = body.replace('"predicateType":', '"predicateType":"https://example.com/other","predicateType":', 1)
    else:
        assert '"predicate":{' in body
        body = body.replace('"predicate":{', '"predicate":{"verdict":"fail",', 1)
    assert json.loads(body)["predicateType"] == statement["predicateType"]  # the last wins in Python
    path = tmp_path / "dup.dsse.json"
    write_record(path, _signed_payload(body.encode(), key))
    assert_refused(verify(path, public, "--subject", SUBJECT), f"names the key '{field}' twice")
