"""The one complete() every adapter shares: how a hang, a transport failure, a refusal (as an
HTTP error or as an error frame inside a 200 stream), a broken stream and an answer each become
a Completion, whatever the engine. Replies are canned; nothing is sent."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import EngineTimeout, HttpReply, StreamReply
from kvpreflight._internal.engines.sglang import SglangAdapter
from kvpreflight._internal.engines.vllm import VllmAdapter
from kvpreflight.model import ErrorKind

LENGTH_MESSAGE = "Input length (9000 tokens) exceeds the maximum allowed length (8185 tokens)."


class CannedClient:
    """Answers every POST with one canned reply, or raises it."""

    def __init__(self, answer: HttpReply | StreamReply | Exception) -> None:
        self.answer = answer
        self.posted: list[tuple[str, Any]] = []
        self.headers: list[Any] = []

    def _reply(self, url: str, body: Any, headers: Any = None) -> Any:
        self.posted.append((url, body))
        self.headers.append(dict(headers or {}))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def post(self, url: str, body: Any, *, timeout_s: float | None = None, headers: Any = None) -> HttpReply:
        return self._reply(url, body, headers)

    def post_stream(self, url: str, body: Any, *, timeout_s: float, headers: Any = None) -> StreamReply:
        return self._reply(url, body, headers)


def sglang(answer: HttpReply | StreamReply | Exception, *, stream: bool = False, sent: int = 9000):
    client = CannedClient(answer)
    adapter = SglangAdapter("http://e:1", client)  # type: ignore[arg-type]  # a canned stand-in for HttpClient
    return adapter.complete(list(range(sent)), max_tokens=4, stream=stream, timeout_s=1), client


def frames(*events: Any, timed_out: bool = False, status: int = 200, cut_off: str | None = None) -> StreamReply:
    texts = tuple(e if isinstance(e, str) else json.dumps(e) for e in events)
    body = "".join(f"data: {t}\n\n" for t in texts).encode()
    return StreamReply("http://e:1/generate", status, texts, body, 0.5, timed_out, 0.01, cut_off)


def test_a_hang_is_timed_out_and_a_transport_failure_says_why():
    c, _ = sglang(EngineTimeout("no answer"))
    assert c.timed_out and c.status is None and not c.rejected
    c, _ = sglang(EngineError("cannot connect"))
    assert c.transport_error == "cannot connect" and not c.timed_out and not c.served


def test_an_http_refusal_is_classified_by_the_engines_own_messages():
    body = json.dumps({"error": {"message": LENGTH_MESSAGE}}).encode()
    c, client = sglang(HttpReply("http://e:1/generate", 400, body, 0.01))
    assert client.posted[0][0] == "http://e:1/generate"
    assert (c.status, c.error_message, c.error_kind) == (400, LENGTH_MESSAGE, ErrorKind.LENGTH)
    assert c.body_sha256 == hashlib.sha256(body).hexdigest() and c.sent_tokens == 9000
    c, _ = sglang(HttpReply("http://e:1/generate", 503, b"", 0.01))
    assert c.error_message == "HTTP 503 without an error message" and c.error_kind is ErrorKind.OTHER


def test_a_plain_text_error_body_is_quoted_by_its_first_line():
    """A router's refusal is often plain text (vllm-router, axum: "HTTP 503" with a bare reason);
    the report said "without an error message" and dropped why. Its first line is quoted, cut at
    200 characters, control characters removed; an empty one still says there was none."""
    c, _ = sglang(HttpReply("http://e:1/generate", 503, b"No available workers (all circuits open or unhealthy)\nmore", 0.01))
    assert c.error_message == "HTTP 503: No available workers (all circuits open or unhealthy)"
    assert c.error_kind is ErrorKind.OTHER and c.rejected
    c, _ = sglang(HttpReply("http://e:1/generate", 502, b"\x1b[31m" + b"x" * 500, 0.01))
    assert c.error_message is not None and c.error_message.startswith("HTTP 502: [31m" + "x" * 190) and "\x1b" not in c.error_message
    assert len(c.error_message) < 230
    c, _ = sglang(HttpReply("http://e:1/generate", 400, LENGTH_MESSAGE.encode(), 0.01))  # the engine's own words, as text
    assert c.error_kind is ErrorKind.LENGTH, c.error_message


def test_an_error_frame_inside_a_200_stream_is_a_refusal():
    c, _ = sglang(frames({"error": {"message": LENGTH_MESSAGE}}), stream=True)
    assert c.status == 200 and c.rejected and c.error_kind is ErrorKind.LENGTH and c.streamed


@pytest.mark.parametrize("before", [
    ({"text": "he", "meta_info": {"completion_tokens": 2}}, {"text": "hello", "meta_info": {"completion_tokens": 3}}),
    ({"text": "he"}, {"text": "hello"}),  # no usage in the frames: the frames that carried text count
])
def test_tokens_then_an_error_frame_are_counted_and_fail_the_rejection(before):
    """Issue 12, defect 1: an over-context request answered with tokens and *then* an error frame was
    taken for a clean refusal ("zero tokens generated"). Any token means the engine served it."""
    from kvpreflight._internal.checks.probe_common import refusal_verdict
    from kvpreflight.model import Status

    c, _ = sglang(frames(*before, {"error": {"message": LENGTH_MESSAGE}}), stream=True)
    assert c.error_kind is ErrorKind.LENGTH and c.completion_tokens in (2, 3)
    status, message = refusal_verdict(c)
    assert status is Status.FAIL and "tokens were generated" in message
    clean, _ = sglang(frames({"error": {"message": LENGTH_MESSAGE}}), stream=True)
    assert refusal_verdict(clean)[0] is Status.PASS and clean.completion_tokens is None


def test_a_frame_that_is_not_json_marks_the_reply_malformed_and_keeps_what_came_before():
    c, _ = sglang(frames("{not json"), stream=True)
    assert c.malformed and "not JSON (9 bytes: {... ...)" in c.malformed and not c.served
    assert c.completion_tokens is None and not c.transport_error
    # Issue 26: the tokens before it were received, and count.
    before = {"text": "hello", "meta_info": {"prompt_tokens": 9000, "completion_tokens": 2}}
    c, _ = sglang(frames(before, '{"text": "hello another tenant', "[DONE]"), stream=True)
    assert c.malformed and c.completion_tokens == 2 and c.text == "hello" and not c.served
    # The frame is quoted by its shape: what it says may be another tenant's data.
    assert '{"text": "...' in c.malformed and "another tenant" not in c.malformed


@pytest.mark.parametrize("timed_out", [False, True])
def test_a_streamed_answer_keeps_its_first_frame_time_and_whether_the_deadline_cut_it(timed_out):
    last = {"text": "hello", "meta_info": {"prompt_tokens": 9000, "completion_tokens": 4, "cached_tokens": 0,
                                           "finish_reason": {"type": "length"}}}
    c, _ = sglang(frames({"text": "he"}, last, "[DONE]", timed_out=timed_out), stream=True)
    assert (c.prompt_tokens, c.completion_tokens, c.finish_reason, c.text, c.ttft_s) == (9000, 4, "length", "hello", 0.01)
    assert c.timed_out is timed_out and c.served is not timed_out


def test_an_abort_inside_a_200_answer_is_a_refusal():
    answer = {"text": "", "meta_info": {"finish_reason": {"type": "abort", "message": LENGTH_MESSAGE}}}
    c, _ = sglang(HttpReply("http://e:1/generate", 200, json.dumps(answer).encode(), 0.01))
    assert c.rejected and c.error_kind is ErrorKind.LENGTH and c.finish_reason == "abort"


def test_the_openai_route_merges_usage_and_finish_from_their_own_frames():
    events = ({"choices": [{"text": "a", "finish_reason": None}]}, {"choices": [{"text": "b", "finish_reason": "length"}]},
              {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2,
                                        "prompt_tokens_details": {"cached_tokens": 8}}}, "[DONE]")
    client = CannedClient(frames(*events))
    c = VllmAdapter("http://v:2", client, model="tiny").complete(  # type: ignore[arg-type]
        list(range(10)), max_tokens=2, stream=True, timeout_s=1)
    assert (c.text, c.finish_reason, c.prompt_tokens, c.completion_tokens, c.cached_tokens) == ("ab", "length", 10, 2, 8)
    assert client.posted[0][1]["model"] == "tiny"


@pytest.mark.parametrize("answer", [HttpReply("http://e:1/generate", 200, b"", 0.01), frames()],
                         ids=["answer", "stream"])
def test_an_empty_200_is_neither_served_nor_a_refusal(answer):
    """An HTTP 200 with nothing in it is an answer not served, not an error that stops every probe
    ("expected JSON, got empty body")."""
    c, _ = sglang(answer, stream=isinstance(answer, StreamReply))
    assert c.empty_body and c.status == 200 and not c.served and not c.rejected
    assert c.evidence()["empty_body"] is True


def test_a_stream_cut_off_keeps_the_tokens_that_came_before_the_break():
    cut = "http://e:1/generate: response body cut off (Connection reset by peer)"
    c, _ = sglang(frames({"text": "he", "meta_info": {"completion_tokens": 2}}, cut_off=cut), stream=True)
    assert (c.transport_error, c.completion_tokens, c.status) == (cut, 2, 200) and not c.served
    c, _ = sglang(frames(cut_off=cut), stream=True)  # broken before any frame: no token is known
    assert c.transport_error == cut and c.completion_tokens is None and not c.empty_body


def test_each_request_carries_a_fresh_id_where_the_engine_reads_one_and_the_completion_keeps_it():
    """The id names the request in the engine's log, so a danger line ties to its probe: SGLang
    reads `rid` from the body, vLLM the X-Request-Id header (over the body's request_id)."""
    answer = HttpReply("http://e:1/generate", 503, b"", 0.01)
    first, client = sglang(answer)
    second, _ = sglang(answer)
    (_, body), = client.posted
    assert body["rid"] == first.request_id and first.request_id.startswith("kvpreflight-")
    assert second.request_id != first.request_id and first.evidence()["request_id"] == first.request_id
    vclient = CannedClient(HttpReply("http://e:1/v1/completions", 503, b"", 0.01))
    vllm = VllmAdapter("http://e:1", vclient)  # type: ignore[arg-type]
    c = vllm.complete([1, 2, 3], max_tokens=4, stream=False, timeout_s=1)
    assert vclient.headers == [{"X-Request-Id": c.request_id}] and "request_id" not in vclient.posted[0][1]
