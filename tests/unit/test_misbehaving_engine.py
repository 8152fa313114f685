"""Issue 12's "Expected verdicts", row by row: the real `kvpreflight check --timeout 2` against the
project's own fake engines (tests/misbehaving_http.py `fake_engine`: SGLang- and vLLM-shaped,
honest except on the prompts a row names), asserting each verdict and the words a user reads in
the report.

"Must be rejected" is every prompt over the stated limit (over-context, boundary-reject, the
isolation probes' over-capacity requests), judged by overcapacity-rejected; "must be accepted" is
the near-limit prompts of prompt-integrity (boundary-accept) and concurrent-capacity. Every other
request is answered honestly, so each row shows only its own verdict moving.

A stall on a request that must be rejected fails once and ends the probing (the checks that
needed later probes say so). The last row of the table, a slow but progressing honest engine past
a constant budget and within the measured one, needs an engine slow on every prompt in proportion
to its size: tests/builtin/test_budgets_slow_engine.py runs it on the builtin engine throttled to 1,500
prompt tokens/s (and tests/unit/test_budgets.py on fake engines).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from misbehaving_http import (
    DIALECTS,
    FAKE_CONTEXT,
    Answer,
    cut_off,
    empty_ok,
    fake_engine,
    finished_without_tokens,
    honest,
    text_with_count,
    tokens_then_error,
    tokens_then_frame,
)
from support.cli import invoke

REJECT = "overcapacity-rejected"
ACCEPT = ("prompt-integrity", "concurrent-capacity")
LENGTH_MESSAGE = f"The input ({FAKE_CONTEXT + 1} tokens) is longer than the model's context length ({FAKE_CONTEXT} tokens)."
TIMEOUT_S = 2
OVER = f"over-context-stream ({FAKE_CONTEXT + 1} tokens): "  # the streamed over-context probe's line
OVER_WHOLE = f"over-context ({FAKE_CONTEXT + 1} tokens): "  # the non-streamed one's
SERVED_THEN_BAD = "tokens were served before a part of the reply that does not read"
# A frame of the wrong shape in each dialect: a count that is not one (SGLang), choices that are not a list (vLLM).
WRONG_SHAPE = {"sglang": {"text": "ok ok ok ok", "meta_info": {"completion_tokens": -4, "prompt_tokens": 1}},
               "vllm": {"id": "cmpl-fake", "object": "text_completion", "choices": "ok ok"}}


@dataclass(frozen=True)
class Row:
    """One behaviour of the engine and the verdicts (status, words in the message) it must get."""

    over: Answer = honest  # how prompts over the limit are answered
    at: Answer = honest  # how the near-limit prompts that must be served are answered
    verdicts: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    exit_code: int = 1
    dialects: tuple[str, ...] = tuple(DIALECTS)  # the engine APIs that can misbehave this way


def check(dialect: str, row: Row, tmp_path: Path) -> tuple[int, dict[str, dict]]:
    report = tmp_path / "report.json"
    with fake_engine(DIALECTS[dialect], over=row.over, at=row.at) as url:
        proc = invoke("check", "--endpoint", url, "--engine", dialect,
                               "--timeout", str(TIMEOUT_S), "--format", "json", "--output", str(report))
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    checks = {c["id"]: c for c in json.loads(report.read_text())["checks"]}
    return proc.returncode, checks


def served_honestly(*ids: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The probes a row leaves alone still pass: the row's misbehaviour is all that moved."""
    words = {REJECT: ("refused for length",), "prompt-integrity": ("served with every token processed",),
             "concurrent-capacity": ("concurrent-1: served; concurrent-2: served",)}
    return {i: ("pass", words[i]) for i in ids}


ROWS = {
    "honest engine": Row(verdicts=served_honestly(REJECT, *ACCEPT), exit_code=3),  # 3: tenant-isolation needs an echoing model
    # -- must be rejected --------------------------------------------------------------------------
    "reject: tokens, then an error frame": Row(
        over=tokens_then_error(3, LENGTH_MESSAGE),
        verdicts={REJECT: ("fail", (OVER + "error reported but 3 tokens were generated",)), **served_honestly(*ACCEPT)}),
    "reject: empty HTTP 200": Row(
        over=empty_ok,
        verdicts={REJECT: ("fail", (OVER + "HTTP 200 with an empty body", "served, not rejected")), **served_honestly(*ACCEPT)}),
    "reject: 200, finish_reason abort, zero tokens": Row(
        over=finished_without_tokens("abort"),
        verdicts={REJECT: ("fail", (OVER + "HTTP 200", "abort", "served, not rejected")), **served_honestly(*ACCEPT)}),
    "reject: 200, finish_reason length, zero tokens": Row(
        over=finished_without_tokens("length"),
        verdicts={REJECT: ("fail", (OVER + "HTTP 200 with 0 generated tokens (finish_reason length)", "served, not rejected")),
                  **served_honestly(*ACCEPT)}),
    "reject: connection reset after tokens": Row(
        over=cut_off(2, reset=True),
        verdicts={REJECT: ("fail", (OVER + "HTTP 200: 2 tokens were generated before the connection broke",
                                    "Connection reset by peer", "served, not rejected")),
                  **served_honestly(*ACCEPT)}),
    "reject: stall mid-body, past the rejection budget": Row(
        over=cut_off(1, reset=False),
        verdicts={REJECT: ("fail", ("over-context (", "a hang, not a rejection")),
                  "prompt-integrity": ("inconclusive", ("was not sent", "probed no further")),
                  "concurrent-capacity": ("inconclusive", ("was not sent", "probed no further")),
                  "tenant-isolation": ("inconclusive", ("probed no further",))}),
    # Issue 26: what came before a frame that does not read was served (two shapes of frame).
    "reject: tokens, then a frame that is not JSON": Row(
        over=tokens_then_frame(3, b'{"text": "ok ok ok", "meta_info": {'),
        verdicts={REJECT: ("fail", (OVER + "HTTP 200: 3 " + SERVED_THEN_BAD, "stream frame is not JSON",
                                    "served, not rejected")), **served_honestly(*ACCEPT)}),
    **{f"reject: tokens, then a {dialect} frame of the wrong shape": Row(
        over=tokens_then_frame(3, frame), dialects=(dialect,),
        verdicts={REJECT: ("fail", (OVER + "HTTP 200: 3 " + SERVED_THEN_BAD, "stream frame", "served, not rejected")),
                  **served_honestly(*ACCEPT)}) for dialect, frame in WRONG_SHAPE.items()},
    # A malformed count voids that reply's counts only: its text still shows it was served, and
    # every other probe's verdict stands.
    "reject: text with a negative token count": Row(
        over=text_with_count(-1),
        verdicts={REJECT: ("fail", (OVER_WHOLE + "HTTP 200: an answer with text, its counts not readable",
                                    "completion_tokens = -1 is not a token count", "served, not rejected")),
                  **served_honestly(*ACCEPT)}),
    "reject: text with a token count that is a string": Row(
        over=text_with_count("2"),
        verdicts={REJECT: ("fail", (OVER_WHOLE + "HTTP 200: an answer with text, its counts not readable",
                                    "completion_tokens = '2' is not a token count")),
                  **served_honestly(*ACCEPT)}),
    "reject: connection reset before any token": Row(
        over=cut_off(0, reset=True), exit_code=3,
        verdicts={REJECT: ("inconclusive", (OVER + "transport failure, nothing measured", "Connection reset by peer")),
                  **served_honestly(*ACCEPT)}),
    # -- must be accepted --------------------------------------------------------------------------
    "accept: tokens, then an error": Row(
        at=tokens_then_error(3, "Internal server error"), dialects=("sglang",),  # vLLM has no error inside a whole answer
        verdicts={"prompt-integrity": ("fail", ("-token prompt within the stated limits was not served",
                                                "an error after 3 generated tokens: Internal server error")),
                  "concurrent-capacity": ("fail", ("concurrent-1: not served (HTTP 200: an error after 3 generated tokens",
                                                   "concurrent-2: not served"))}),
    "accept: abort": Row(
        at=finished_without_tokens("abort"),
        verdicts={"prompt-integrity": ("fail", ("-token prompt within the stated limits was not served (HTTP 200", "abort")),
                  "concurrent-capacity": ("fail", ("concurrent-1: not served (HTTP 200", "concurrent-2: not served"))}),
    "accept: empty HTTP 200": Row(
        at=empty_ok,
        verdicts={"prompt-integrity": ("fail", ("was not served (HTTP 200 with an empty body)",)),
                  "concurrent-capacity": ("fail", ("concurrent-1: not served (HTTP 200 with an empty body)", "concurrent-2: not served"))}),
    "accept: a token count that is not a count": Row(
        at=text_with_count(1e300), exit_code=3,
        verdicts={"prompt-integrity": ("inconclusive", ("the reply does not read, nothing measured from it", "is not a token count")),
                  "concurrent-capacity": ("inconclusive", ("concurrent-1: the reply does not read",)),
                  REJECT: ("pass", ("refused for length",))}),
    "accept: stall": Row(
        at=cut_off(1, reset=False), exit_code=3,
        verdicts={"prompt-integrity": ("inconclusive", ("stalled: no complete answer within its", "nothing measured")),
                  "concurrent-capacity": ("inconclusive", ("concurrent-1: stalled", "concurrent-2: stalled"))}),
    "accept: connection reset": Row(
        at=cut_off(1, reset=True), exit_code=3,
        verdicts={"prompt-integrity": ("inconclusive", ("the connection broke, nothing measured", "Connection reset by peer")),
                  "concurrent-capacity": ("inconclusive", ("concurrent-1: the connection broke", "concurrent-2: the connection broke"))}),
}
CASES = [pytest.param(dialect, name, id=f"{dialect}: {name}") for name, row in ROWS.items() for dialect in row.dialects]


@pytest.mark.parametrize("dialect,name", CASES)
def test_expected_verdicts(dialect: str, name: str, tmp_path: Path) -> None:
    row = ROWS[name]
    start = time.monotonic()
    exit_code, checks = check(dialect, row, tmp_path)
    for check_id, (status, words) in row.verdicts.items():
        result = checks[check_id]
        assert result["status"] == status, (check_id, result["message"])
        for word in words:
            assert word in result["message"], (check_id, word, result["message"])
    assert exit_code == row.exit_code
    # Bounded by --timeout: a stalled request costs its budget once, not a wait per retry.
    assert time.monotonic() - start < 20
