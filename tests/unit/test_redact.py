"""Redaction by value: a secret the run knows is removed from reports, records and logs in every
form it could take there (raw, JSON-escaped, URL-encoded, base64), and URL credentials always."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from urllib.parse import quote, quote_plus

import pytest
from record_support import sample_report

from kvpreflight._internal.redact import REDACTED, env_secrets, redact, redact_report, secrets_of
from kvpreflight.formats import write_report
from kvpreflight.model import Status

SECRET = "sk-tenant-a/7f3e91+Zq=="  # '/', '+' and '=' change under URL encoding and base64


def test_a_raw_secret_is_removed_wherever_it_stands():
    assert redact(f"sent Authorization: Bearer {SECRET} to the router", [SECRET]) == \
        f"sent Authorization: Bearer {REDACTED} to the router"


def test_a_json_escaped_secret_is_removed():
    secret = 'pa"ss\\wörd-0123'
    body = json.dumps({"api_key": secret})  # what an echoed request body carries
    assert secret not in body  # the escaped form differs from the raw one
    assert json.dumps({"api_key": secret})[13:-1] not in redact(body, [secret])
    assert redact(body, [secret]) == json.dumps({"api_key": REDACTED})
    ascii_body = json.dumps({"k": secret}, ensure_ascii=True)
    assert redact(ascii_body, [secret]) == json.dumps({"k": REDACTED})


@pytest.mark.parametrize("encode", [quote, lambda s: quote(s, safe=""), lambda s: quote_plus(s, safe="")])
def test_a_url_encoded_secret_is_removed(encode):
    encoded = encode(SECRET)
    assert encoded != SECRET
    out = redact(f"GET /v1/models?tenant={encoded}&x=1", [SECRET])
    assert encoded not in out and REDACTED in out and out.endswith("&x=1")


def test_a_lower_case_percent_encoding_is_removed():
    encoded = quote(SECRET, safe="").replace("%2F", "%2f").replace("%2B", "%2b").replace("%3D", "%3d")
    assert redact(f"u={encoded}", [SECRET]) == f"u={REDACTED}"


@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
def test_a_base64_secret_is_removed_whole_and_unpadded(encode):
    whole = encode(SECRET.encode()).decode()
    assert redact(f"token={whole};", [SECRET]) == f"token={REDACTED};"
    assert redact(f"token={whole.rstrip('=')};", [SECRET]) == f"token={REDACTED};"


@pytest.mark.parametrize("user", ["", "a", "ab", "abc", "tenant-a"])  # every offset in a 3-byte group
def test_a_secret_inside_a_longer_base64_text_is_removed(user):
    basic = base64.b64encode(f"{user}:{SECRET}".encode()).decode()
    out = redact(f"Authorization: Basic {basic}", [SECRET])
    before, after = out.removeprefix("Authorization: Basic ").split(REDACTED)
    # what is left is the user's own characters and at most one shared edge character each side
    assert len(before) <= -(-len(f"{user}:") * 4 // 3) and len(after) <= 3
    assert basic.startswith(before) and basic.endswith(after)


def test_url_credentials_are_removed_without_knowing_them():
    url = "http://admin:hunter2hunter2@prefill-0:30000/v1?api_key=sk-abcdefgh&x=1"
    assert redact(url) == f"http://{REDACTED}@prefill-0:30000/v1?api_key={REDACTED}&x=1"


def test_short_or_empty_secrets_do_not_erase_ordinary_text():
    assert redact("the KV pool holds 131,072 tokens", ["", "a", "KV"]) == "the KV pool holds 131,072 tokens"


def test_secrets_of_collects_keys_secret_headers_and_url_credentials():
    found = secrets_of(
        values=["sk-explicit-1234", None],
        headers={"Authorization": "Bearer sk-bearer-5678", "X-Tenant": "tenant-a", "X-Api-Key": "k-9999"},
        urls=["https://user:pw-secret@h/", "https://tok-only-abcd@h/", "http://h/?token=t-0000&model=m", None],
    )
    assert {"sk-explicit-1234", "Bearer sk-bearer-5678", "sk-bearer-5678", "k-9999", "user:pw-secret", "pw-secret",
            "tok-only-abcd", "t-0000"} == set(found)
    assert "tenant-a" not in found and "user" not in found and "m" not in found


def test_env_secrets_are_chosen_by_name_and_length():
    env = {"OPENAI_API_KEY": "sk-env-0123456789", "HF_TOKEN": "hf_abcdefgh", "PATH": "/usr/bin:/bin",
           "MY_SECRET": "short"}
    assert sorted(env_secrets(env)) == ["hf_abcdefgh", "sk-env-0123456789"]


def test_redact_report_removes_a_secret_from_every_string_and_keeps_the_types():
    report = sample_report()
    engine = replace(report.engines[0], url=f"http://x:{SECRET}@prefill-0:30000", notes=(f"key {SECRET} refused",),
                     settings={"api_key": SECRET, SECRET: 1})
    check = replace(report.checks[0], message=f"echoed {base64.b64encode(SECRET.encode()).decode()}",
                    evidence={"headers": {"authorization": f"Bearer {SECRET}"}, "probes": ({"sent": SECRET},), "n": 3})
    leaky = replace(report, engines=(engine, *report.engines[1:]), checks=(check, *report.checks[1:]),
                    entry=f"http://router:8000/?tenant={quote(SECRET, safe='')}")
    clean = redact_report(leaky, [SECRET])
    assert SECRET not in repr(clean) and quote(SECRET, safe="") not in repr(clean)
    assert base64.b64encode(SECRET.encode()).decode() not in repr(clean)
    assert clean.engines[0].url == f"http://{REDACTED}@prefill-0:30000"
    assert clean.engines[0].settings == {"api_key": REDACTED, REDACTED: 1}
    assert clean.checks[0].evidence["probes"] == ({"sent": REDACTED},) and clean.checks[0].evidence["n"] == 3
    assert clean.checks[0].status is Status.PASS and clean.engines[0].role is report.engines[0].role
    assert clean.verdict is leaky.verdict and clean.engines[0].pool_tokens() == report.engines[0].pool_tokens()
    assert redact_report(report, [SECRET]) == report  # nothing to remove: the same report


@pytest.mark.parametrize("fmt", ["json", "table", "markdown", "junit", "sarif", "github"])
def test_write_report_removes_the_secrets_it_is_given_in_every_format(tmp_path, fmt):
    report = sample_report(failing=True)  # every format shows a failed check's message
    failed = replace(report.checks[1], message=f"over-capacity request got HTTP 200 for key {SECRET}")
    leaky = replace(report, checks=(report.checks[0], failed, report.checks[2]))
    out = tmp_path / f"report.{fmt}"
    write_report(leaky, fmt, out, secrets=[SECRET])
    text = out.read_text()
    assert SECRET not in text and json.dumps(SECRET)[1:-1] not in text
    assert "redacted" in text  # "<redacted>", escaped as each format escapes text
    write_report(leaky, fmt, tmp_path / "plain", secrets=[])
    assert SECRET in (tmp_path / "plain").read_text()  # the check above can fail: the secret was there
