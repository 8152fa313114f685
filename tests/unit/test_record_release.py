"""The calls `check` makes: a signer chosen before anything runs, a record written after."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from record_support import APP, APP_DIGEST, make_keys, record_text, sample_report

from kvpreflight.record import (
    Policy,
    RecordError,
    emit_record,
    load_public_key,
    parse_subjects,
    prepare_signer,
    read_record,
    verify_envelope,
)


def test_a_record_is_signed_unless_unsigned_is_asked_for(monkeypatch):
    monkeypatch.delenv("KVPREFLIGHT_SIGN_KEY", raising=False)
    with pytest.raises(RecordError) as info:
        prepare_signer(None, unsigned=False)
    assert "--sign-key PATH" in str(info.value) and "KVPREFLIGHT_SIGN_KEY" in str(info.value) and "--unsigned" in str(info.value)
    assert info.value.exit_code == 2
    assert prepare_signer(None, unsigned=True) is None


def test_unsigned_and_sign_key_together_is_a_usage_error(tmp_path):
    _, private, _ = make_keys(tmp_path)
    with pytest.raises(RecordError, match="contradict"):
        prepare_signer(str(private), unsigned=True)


def test_signing_key_from_env_path_signs_a_record_that_verifies(tmp_path, monkeypatch):
    key, private, public = make_keys(tmp_path / "k")
    monkeypatch.setenv("KVPREFLIGHT_SIGN_KEY", str(private))
    signer = prepare_signer(None, unsigned=False)
    assert signer.keyid == key.keyid
    log = tmp_path / "engine.log"
    log.write_text("KV Cache is allocated. #tokens: 140000\n")
    out = emit_record(sample_report(), path=tmp_path / "out" / "record.dsse.json", signer=signer,
                      command_line=["kvpreflight", "check", "--sign-key", str(private)],
                      subjects=parse_subjects([f"app=sha256:{APP_DIGEST}"]), files_read=[log])
    verified = verify_envelope(read_record(out), load_public_key(public), Policy(subjects=(APP,)))
    assert verified.verdict == "pass"
    assert f"file:{log}" in {s.name for s in verified.subjects}
    assert str(private) not in record_text(out)


def test_missing_signing_key_file_fails_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("KVPREFLIGHT_SIGN_KEY", raising=False)
    with pytest.raises(RecordError, match="does not exist; create one with `kvpreflight keygen"):
        prepare_signer(str(tmp_path / "missing.key"), unsigned=False)


def test_unsigned_record_is_marked_and_refused(tmp_path):
    _, _, public = make_keys(tmp_path / "k")
    out = emit_record(sample_report(), path=tmp_path / "r.json", signer=None, command_line=[], subjects=[APP])
    data = json.loads(out.read_text())
    assert data["signatures"] == [] and data["unsigned"].startswith("UNSIGNED")
    with pytest.raises(RecordError, match="record is unsigned") as info:
        verify_envelope(read_record(out), load_public_key(public), Policy(subjects=(APP,), allow_fail=True))
    assert info.value.exit_code == 1


def test_credentials_in_engine_urls_never_reach_the_record(tmp_path):
    report = sample_report()
    leaky = replace(report.engines[0], url="http://admin:hunter2hunter2@prefill-0:30000/?api_key=sk-abcdefgh&x=1")
    out = emit_record(replace(report, engines=(leaky,)), path=tmp_path / "r.json", signer=None, command_line=[], subjects=[APP])
    payload = json.dumps(read_record(out).payload.decode())
    assert "hunter2" not in payload and "sk-abcdefgh" not in payload
    assert "http://<redacted>@prefill-0:30000/?api_key=<redacted>&x=1" in read_record(out).payload.decode()
