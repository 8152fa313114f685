"""The in-toto statement a record carries: subjects, what the predicate says, what it never says."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from record_support import APP, APP_DIGEST, sample_report

from kvpreflight.record import PREDICATE_TYPE, STATEMENT_TYPE, RecordError, build_statement, parse_subject, redact_command_line

FAKE_KEY = "sk-live-FAKE0123456789abcdefSECRET"


def test_parse_subject_accepts_exact_form_and_lowercases_hex():
    s = parse_subject("ghcr.io/acme/app:1.2=sha256:" + "AB" * 32)
    assert (s.name, s.sha256) == ("ghcr.io/acme/app:1.2", "ab" * 32)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("app", "no NAME="),
        ("=sha256:" + "a" * 64, "no NAME="),
        ("app=" + "a" * 64, "must start with sha256:"),
        ("app=sha512:" + "a" * 64, "must start with sha256:"),
        ("app=sha256:" + "a" * 63, "exactly 64 hex digits"),
        ("app=sha256:" + "g" * 64, "exactly 64 hex digits"),
        ("my app=sha256:" + "a" * 64, "whitespace"),
    ],
)
def test_parse_subject_rejects_anything_else_with_usage(text, fragment):
    with pytest.raises(RecordError) as info:
        parse_subject(text)
    assert fragment in str(info.value) and "NAME=sha256:" in str(info.value)
    assert info.value.exit_code == 2


def identity_digest(engine: dict) -> str:
    """What an engine subject digests, recomputed here: kind, version, model, launch settings."""
    identity = {k: engine.get(k) for k in ("engine", "version", "model", "settings")}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_an_engine_subject_changes_with_what_ran():
    base = sample_report()
    other = replace(base, engines=(replace(base.engines[0], version="0.5.20"), base.engines[1]))
    first, second = (build_statement(r, command_line=["kvpreflight"], subjects=[APP]) for r in (base, other))
    digests = [{s["name"]: s["digest"]["sha256"] for s in st["subject"]} for st in (first, second)]
    assert digests[0]["engine:http://prefill-0:30000"] != digests[1]["engine:http://prefill-0:30000"]
    assert digests[0]["engine:http://decode-0:30001"] == digests[1]["engine:http://decode-0:30001"]


def test_statement_shape_and_predicate_content(tmp_path):
    config = tmp_path / "boot.yaml"
    config.write_text("engines: []\n")
    log = tmp_path / "prefill.log"
    log.write_bytes(b"KV Cache is allocated. #tokens: 140000\n")
    moment = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    st = build_statement(sample_report(), command_line=["kvpreflight", "check", "--config", str(config)],
                         subjects=[APP], files_read=[config, log], now=moment, host="ci-runner-7")
    assert st["_type"] == STATEMENT_TYPE and st["predicateType"] == PREDICATE_TYPE
    assert st["subject"] == [
        {"name": "app", "digest": {"sha256": APP_DIGEST}},
        {"name": f"file:{config}", "digest": {"sha256": hashlib.sha256(b"engines: []\n").hexdigest()}},
        {"name": f"file:{log}", "digest": {"sha256": hashlib.sha256(log.read_bytes()).hexdigest()}},
        *({"name": f"engine:{e['url']}", "digest": {"sha256": identity_digest(e)}} for e in st["predicate"]["engines"]),
    ]
    p = st["predicate"]
    assert p["schema_version"] == 2 and p["tool"] == {"name": "kvpreflight", "version": "0.1.0"}
    assert p["time"] == "2026-03-01T12:00:00Z" and p["host"] == "ci-runner-7"
    assert p["command_line"] == ["kvpreflight", "check", "--config", str(config)]
    prefill = p["engines"][0]
    assert prefill["url"] == "http://prefill-0:30000" and prefill["role"] == "prefill" and prefill["version"] == "0.4.9"
    # the same key as the JSON report for the served context; the promised one is said once
    assert prefill["context_length"] == 131072 and p["context_length_promised"] == 131072
    assert prefill["kv_pool_tokens"] == 139264
    assert prefill["kv_pool_sources"] == {"log:KV Cache is allocated": 140000, "/server_info max_total_num_tokens": 139264}
    assert p["engines"][1]["kv_pool_sources"] == {"log:KV Cache is allocated [dp0]": 150000}
    assert [(c["id"], c["status"]) for c in p["checks"]] == [
        ("kv-capacity", "pass"), ("overcapacity-rejected", "pass"), ("tenant-isolation", "pass"), ("engine-advisories", "warn")]
    assert p["checks"][0]["evidence"] == {"pool_tokens": 139264, "context": 131072}
    assert p["waivers"] == [{"check_id": "engine-advisories", "reason": "baseline lands next sprint"}]
    assert p["verdict"] == "pass" and p["exit_code"] == 0
    assert p["gpus"] == [] and p["gpu_summary"] == "no NVIDIA GPU/driver visible"


def test_gpu_inventory_is_recorded_when_present():
    report = replace(sample_report(), gpus=({"index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771},))
    p = build_statement(report, command_line=[], subjects=[APP])["predicate"]
    assert p["gpus"] == [{"index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771}]
    assert p["gpu_summary"] == "1 GPU(s)"


def test_response_text_never_enters_the_record():
    st = build_statement(sample_report(), command_line=[], subjects=[APP])
    text = json.dumps(st)
    assert "fluent text from another tenant" not in text
    evidence = st["predicate"]["checks"][1]["evidence"]
    assert evidence["http_status"] == 400
    assert evidence["response_text"]["omitted"] == "response text is never recorded"
    assert evidence["response_text"]["sha256"] == hashlib.sha256(b"fluent text from another tenant").hexdigest()


def test_secrets_from_argv_headers_and_env_never_appear(monkeypatch):
    monkeypatch.setenv("KVPREFLIGHT_API_KEY", FAKE_KEY + "-env")
    argv = ["kvpreflight", "check", "--api-key", FAKE_KEY, "--api-key-file=/run/secrets/k",
            "--sign-key", "/keys/kvpreflight.key", "--header", f"Authorization: Bearer {FAKE_KEY}B",
            "-H", f"X-Api-Key={FAKE_KEY}C", "--header", "X-Trace: keep-me", "--subject", "app=sha256:" + APP_DIGEST]
    report = replace(sample_report(), checks=sample_report().checks + (
        # a check that (wrongly) echoes the key it was given, and one echoing the env key
        replace(sample_report().checks[0], id="echo", message=f"sent Authorization: Bearer {FAKE_KEY}B"),
        replace(sample_report().checks[0], id="echo-env", evidence={"header": FAKE_KEY + "-env"}),
    ))
    st = build_statement(report, command_line=argv, subjects=[APP])
    text = json.dumps(st)
    assert FAKE_KEY not in text
    assert "/keys/kvpreflight.key" not in text and "/run/secrets/k" not in text
    assert st["predicate"]["command_line"] == [
        "kvpreflight", "check", "--api-key", "<redacted>", "--api-key-file=<redacted>",
        "--sign-key", "<redacted>", "--header", "Authorization: <redacted>",
        "-H", "X-Api-Key=<redacted>", "--header", "X-Trace: keep-me", "--subject", "app=sha256:" + APP_DIGEST]
    assert "<redacted>" in st["predicate"]["checks"][-2]["message"]


def test_redaction_does_not_swallow_the_next_option():
    argv, dropped = redact_command_line(["--api-key", "--subject", "a=b"])
    assert argv == ["--api-key", "--subject", "a=b"] and dropped == []


def test_record_needs_a_subject():
    with pytest.raises(RecordError, match="at least one subject"):
        build_statement(sample_report(), command_line=[], subjects=[])


def test_same_subject_with_two_digests_is_refused():
    other = replace(APP, sha256="00" * 32)
    with pytest.raises(RecordError, match="given twice with different digests"):
        build_statement(sample_report(), command_line=[], subjects=[APP, other])


def test_unreadable_file_read_is_a_clear_error(tmp_path):
    with pytest.raises(RecordError, match="cannot hash .*missing.log"):
        build_statement(sample_report(), command_line=[], subjects=[APP], files_read=[tmp_path / "missing.log"])
