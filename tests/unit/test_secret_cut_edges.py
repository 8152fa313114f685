"""The secret-echo suite's cut-edge case (issue 28): every place that quotes an untrusted text cuts
it short, and a key an engine echoed may straddle the cut. Whatever the cut leaves of the key (8 or
more of its characters touching the cut) is gone once the output is redacted with the keys the run
knows, at every offset of the cut inside the key, for every place that cuts."""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.cli import invoke
from support.echo_engine import echo_engine

from kvpreflight._internal.engines import http, untrusted
from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.redact import CUT_MARK, MIN_FRAGMENT_CHARS, REDACTED, Redactor, cut, secret_forms
from kvpreflight.boot.progress import clip
from kvpreflight.fleet import job, report
from kvpreflight.fleet.runners import ray
from kvpreflight.model import CheckResult, Report, Status

# '"' and '\' change under JSON escaping and repr, '/', '+' and '=' under URL encoding.
KEY = 'sk-live"7f/3e+91\\Zq==Aa0123456789abcd'


def fragments(secret: str) -> set[str]:
    """Every run of MIN_FRAGMENT_CHARS characters of every form of `secret`."""
    return {f[i:i + MIN_FRAGMENT_CHARS] for f in secret_forms(secret) for i in range(len(f) - MIN_FRAGMENT_CHARS + 1)}


def leaked(text: str) -> list[str]:
    return sorted(f for f in fragments(KEY) if f in text)


def _excerpt(filler: str) -> str:
    with pytest.raises(EngineError) as caught:
        untrusted.token_count(filler + KEY, "usage.completion_tokens", "http://127.0.0.1:1")
    return str(caught.value)


def _error_body(filler: str) -> str:
    body = json.dumps({"error": {"code": 400, "detail": filler + KEY + " is not allowed here"}}).encode()
    return untrusted.error_message_of(body) or ""


def _metrics(filler: str) -> str:
    with pytest.raises(EngineError) as caught:
        untrusted.parse_metrics("http://127.0.0.1:1", f"metric 1 {filler}{KEY}\n")  # the parser quotes the bad value
    return str(caught.value)


def _reason(filler: str) -> str:
    return http._reason(ValueError(filler + KEY + " broke the connection"))


def _ray(filler: str) -> str:
    return ray._one_line(RuntimeError(filler + KEY + " died"))


def _fleet_reason(filler: str) -> str:
    checks = (CheckResult(id="kv-capacity", status=Status.INCONCLUSIVE, message=filler + KEY + " was not measured", endpoint="http://e"),)
    outcome = job.Outcome("d", Status.INCONCLUSIVE, 3, report=Report(tool_version="0", engines=(), checks=checks))
    return report.problems(outcome)


def _progress(filler: str) -> str:
    return clip("loading " + filler + KEY, 120)


def _worker_log(filler: str, tmp_path: Path) -> str:
    log = tmp_path / "worker.log"
    log.write_text(f"kvpreflight: error: {filler}{KEY} refused\n")
    return job._last_line(log)


# (what cuts, where the cut falls: the characters before the key that put the cut at offset 0)
PLACES: dict[str, tuple[Callable[[str], str], int]] = {
    "excerpt of an engine's value": (_excerpt, 60 - 1),  # repr adds the opening quote
    "error object without a message": (_error_body, 300 - len('{"code": 400, "detail": "')),
    "malformed Prometheus text": (_metrics, 120 - len("could not convert string to float: '")),
    "transport failure reason": (_reason, 200),
    "Ray task failure": (_ray, 400),
    "fleet's inconclusive reason": (_fleet_reason, 160),
    "boot progress line": (_progress, 119 - len("loading ")),
}


def _places() -> list[tuple[str, int]]:
    return [(name, offset) for name in PLACES for offset in (MIN_FRAGMENT_CHARS, 17, len(KEY) - 1)]


@pytest.mark.parametrize(("place", "offset"), _places())
def test_a_key_cut_by_a_quote_leaves_no_fragment_after_redaction(place: str, offset: int) -> None:
    quote, edge = PLACES[place]
    filler = "x" * max(0, edge - offset)
    said = quote(filler)
    assert CUT_MARK in said, said  # the test can fail: the quote was cut inside the key
    assert leaked(said), said  # ... and left a fragment of it before redaction
    out = Redactor([KEY]).text(said)
    assert leaked(out) == [], out
    assert REDACTED in out


@pytest.mark.parametrize("offset", [MIN_FRAGMENT_CHARS, len(KEY) - 1])
def test_a_failed_workers_line_cut_through_a_key_leaves_no_fragment(tmp_path: Path, offset: int) -> None:
    said = _worker_log("x" * (400 - offset), tmp_path)
    assert CUT_MARK in said and leaked(said)
    assert leaked(Redactor([KEY]).text(said)) == []


@pytest.mark.parametrize("limit", [40, 55])
def test_a_cut_keeping_the_end_loses_the_keys_head_and_the_rest_is_scrubbed(limit: int) -> None:
    said = cut(KEY + " and the rest of the line", limit, keep_end=True)
    assert said.startswith(CUT_MARK) and leaked(said)
    assert leaked(Redactor([KEY]).text(said)) == []


def test_text_that_only_looks_like_a_keys_start_is_kept_when_it_is_shorter_than_a_fragment() -> None:
    short = KEY[:MIN_FRAGMENT_CHARS - 1]
    assert Redactor([KEY]).text(f"{short}{CUT_MARK} more") == f"{short}{CUT_MARK} more"
    assert Redactor([KEY]).text("plain words before a cut" + CUT_MARK) == "plain words before a cut" + CUT_MARK


# Property: whatever the key, the text around it and where the cut falls, a redacted cut leaves
# no run of MIN_FRAGMENT_CHARS of the key (the filler's alphabet shares no character with the key).
keys = st.text(alphabet=string.ascii_letters.replace("x", "") + string.digits + "-_/+=\"\\'.", min_size=12, max_size=48)
fillers = st.text(alphabet="x ", max_size=120)


@given(keys, fillers, fillers, st.integers(0, 250), st.booleans(), st.sampled_from(["plain", "repr", "json"]))
def test_no_cut_of_any_text_leaves_a_fragment_of_a_known_key(key: str, before: str, after: str, limit: int,
                                                            keep_end: bool, quoting: str) -> None:
    text = before + key + after
    quoted = {"plain": text, "repr": repr(text), "json": json.dumps(text)}[quoting]
    out = Redactor([key]).text(f"engine said: {cut(quoted, limit, keep_end=keep_end)} (and more)")
    windows = {key[i:i + MIN_FRAGMENT_CHARS] for i in range(len(key) - MIN_FRAGMENT_CHARS + 1)}
    forms = {w for f in secret_forms(key) for w in (f[i:i + MIN_FRAGMENT_CHARS] for i in range(len(f) - MIN_FRAGMENT_CHARS + 1))}
    assert not [w for w in windows | forms if w in out and not set(w) <= set("x ")], out


def test_a_check_against_an_engine_whose_refusal_is_cut_through_the_key_leaks_no_part_of_it() -> None:
    """Issue 28's case end to end: an error object without a message, cut at 300 characters in
    the middle of the API key the engine echoes, quoted in overcapacity-rejected's evidence."""
    with echo_engine(cut_edge=True) as (url, seen):
        result = invoke("check", "--endpoint", url, "--api-key-env", "KVPF_SERVING",
                        "--timeout", "5", "--format", "json", env={"KVPF_SERVING": KEY})
    assert f"Bearer {KEY}" in seen and result.returncode in (0, 1, 3), result.stderr[-2000:]
    report = json.loads(result.stdout)
    quoted = json.dumps([c for c in report["checks"] if c["id"] == "overcapacity-rejected"], ensure_ascii=False)
    assert "for key" in quoted and CUT_MARK in quoted  # the refusal was quoted, and cut
    windows = {KEY[i:i + MIN_FRAGMENT_CHARS] for i in range(len(KEY) - MIN_FRAGMENT_CHARS + 1)}
    for where, text in (("stdout", result.stdout), ("stderr", result.stderr), ("stdout, JSON unescaped", str(report))):
        assert not [w for w in windows if w in text], where
