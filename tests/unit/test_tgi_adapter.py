"""The TGI adapter against bodies and log lines copied from TGI's source (v3.3.x;
tests/fixtures/tgi/README.md says where each comes from). TGI cannot run on this machine.

TGI takes text prompts, so the static server here also answers /tokenize like TGI does (a list of
{id, text, start, stop}, the BOS token with an empty span first) with a small byte-level
pre-tokenizer, and /generate counts the text it got the same way."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from static_server import static_server
from support.cli import invoke

from kvpreflight._internal.engines import HttpClient, open_adapter
from kvpreflight._internal.engines.builtin import BuiltinAdapter
from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.llamacpp import LlamaCppAdapter
from kvpreflight._internal.engines.sglang import SglangAdapter
from kvpreflight._internal.engines.tgi import TgiAdapter
from kvpreflight._internal.engines.vllm import VllmAdapter
from kvpreflight.model import ErrorKind, Origin

FIXTURES = Path(__file__).parents[1] / "fixtures"
FIX = FIXTURES / "tgi"
JSON = "application/json"
SSE = "text/event-stream"
BOS = 128000
# GPT-2's pre-tokenizer pattern, ASCII only: each piece is one token.
PIECES = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
SEED = "kvpreflight capacity probe PROBE-1a2b. Repeat this marker: PROBE-1a2b.\n"


def tokenize(text: str, *, split_final_dot: bool = False) -> list[dict]:
    """What TGI's /tokenize answers (router/src/server.rs encoding_to_tokens)."""
    out = [{"id": BOS, "text": "", "start": 0, "stop": 0}]
    for m in PIECES.finditer(text):
        piece_id = 1000 + int(hashlib.sha256(m.group().encode()).hexdigest()[:6], 16) % 100_000
        out.append({"id": piece_id, "text": m.group(), "start": m.start(), "stop": m.end()})
    if split_final_dot and text.endswith("."):  # a tokenizer that merges differently at the very end
        out.append({"id": 13, "text": "", "start": len(text), "stop": len(text)})
    return out


def routes(info: str = "info.json", *, generate=None, stream=None, tok=tokenize):
    r = {
        "GET /health": (200, JSON, b""),
        "GET /info": (200, JSON, (FIX / info).read_text()),
        "GET /metrics": (200, "text/plain", (FIX / "metrics.txt").read_text()),
        "POST /tokenize": lambda body: (200, JSON, tok(body.get("inputs", ""))),
    }
    if generate is not None:
        r["POST /generate"] = generate
    if stream is not None:
        r["POST /generate_stream"] = stream
    return r


def served_like_tgi(body: dict):
    """/generate: the prompt counted like TGI's validation, the count in x-prompt-tokens."""
    count = len(tokenize(body["inputs"]))
    return 200, JSON, (FIX / "generate.json").read_text(), {"x-prompt-tokens": str(count)}


# -- detection -------------------------------------------------------------------------------
def test_a_tgi_server_is_detected_as_tgi_and_not_as_any_other_engine():
    with static_server(routes()) as url:
        client = HttpClient()
        assert open_adapter(url, client).kind == "tgi"
        for other in (SglangAdapter, VllmAdapter, LlamaCppAdapter, BuiltinAdapter):
            assert not other.detect(url, client), other.kind


@pytest.mark.parametrize("other", [
    {"GET /version": (200, JSON, (FIXTURES / "vllm" / "version.json").read_text()),
     "GET /v1/models": (200, JSON, (FIXTURES / "vllm" / "models.json").read_text())},
    {"GET /props": (200, JSON, (FIXTURES / "llamacpp" / "props.json").read_text())},
    {"GET /server_info": (200, JSON, (FIXTURES / "sglang" / "server_info_prefill.json").read_text())},
], ids=["vllm", "llamacpp", "sglang"])
def test_other_engines_are_not_detected_as_tgi(other):
    with static_server({"GET /health": (200, JSON, b""), **other}) as url:
        assert not TgiAdapter.detect(url, HttpClient())
        assert open_adapter(url, HttpClient()).kind != "tgi"


# -- snapshot --------------------------------------------------------------------------------
def test_snapshot_reads_the_batch_budget_from_the_gauge_and_the_warmup_line_with_their_origins():
    with static_server(routes()) as url:
        adapter = open_adapter(url, HttpClient())
        snap = adapter.snapshot(log_text=(FIX / "warmup.log").read_text())
    assert (snap.engine, snap.version, snap.model) == ("tgi", "3.3.6-dev0", "meta-llama/Llama-3.1-8B-Instruct")
    assert snap.served_context == 32_768  # /info max_total_tokens
    assert snap.max_request_tokens == 32_767  # /info max_input_tokens
    readings = {(r.source, r.origin, r.tokens) for r in snap.pool_readings}
    assert readings == {("metrics tgi_batch_max_total_tokens", Origin.SCHEDULER, 21_504),
                        ("log: Setting max batch total tokens", Origin.ALLOCATOR, 21_504)}
    assert snap.pool_tokens() == 21_504
    assert adapter.max_accepted_prompt(snap) == 32_767


def test_tgi_before_2_1_info_shape_is_read_too():
    # /info had max_input_length (renamed max_input_tokens in 2.1) and max_batch_total_tokens (until 2.3)
    with static_server(routes("info_v2.0.json")) as url:
        adapter = open_adapter(url, HttpClient())
        snap = adapter.snapshot()
    assert adapter.kind == "tgi" and snap.max_request_tokens == 4_095 and snap.served_context == 4_096
    assert ("/info max_batch_total_tokens", Origin.SCHEDULER, 2_048) in {(r.source, r.origin, r.tokens) for r in snap.pool_readings}
    assert adapter.max_accepted_prompt(snap) == 4_095


def test_a_refused_warmup_in_the_log_is_a_note():
    with static_server(routes()) as url:
        snap = open_adapter(url, HttpClient()).snapshot(log_text=(FIX / "not_enough_memory.log").read_text())
    assert any("max_total_tokens=131072" in n for n in snap.notes)
    assert all(r.origin is not Origin.ALLOCATOR for r in snap.pool_readings)


def test_check_cli_capacity_only_fails_when_the_batch_budget_is_below_max_total_tokens():
    with static_server(routes()) as url:
        proc = invoke("check", "--endpoint", url, "--capacity-only",
             "--log", f"{url}={FIX / 'warmup.log'}", "--format", "json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    statuses = {c["id"]: c for c in report["checks"]}
    assert report["verdict"] == "fail"
    assert statuses["kv-capacity"]["status"] == "fail"
    assert "21,504" in statuses["kv-capacity"]["message"]
    assert statuses["overcapacity-rejected"]["status"] == "skip"  # read-only: nothing sent
    engine = report["engines"][0]
    assert engine["engine"] == "tgi" and engine["kv_pool_tokens"] == 21_504


# -- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fixture,kind", [
    ("error_max_total_tokens.json", ErrorKind.LENGTH),
    ("error_input_length.json", ErrorKind.LENGTH),
    ("error_temperature.json", ErrorKind.OTHER),
])
def test_validation_errors_are_length_only_when_tgi_says_so(fixture, kind):
    body = (FIX / fixture).read_text()
    with static_server(routes(generate=(422, JSON, body))) as url:
        adapter = open_adapter(url, HttpClient())
        c = adapter.complete(adapter.token_ids(40, SEED), max_tokens=1, stream=False, timeout_s=5)
    assert c.status == 422 and c.rejected
    assert c.error_kind == kind
    assert c.error_message == json.loads(body)["error"]


def test_overloaded_429_is_not_a_length_rejection():
    with static_server(routes(generate=(429, JSON, (FIX / "error_overloaded.json").read_text()))) as url:
        adapter = open_adapter(url, HttpClient())
        c = adapter.complete(adapter.token_ids(40, SEED), max_tokens=1, stream=False, timeout_s=5)
    assert c.status == 429 and c.error_kind == ErrorKind.OTHER and c.error_message == "Model is overloaded"


def test_error_event_inside_a_200_stream_is_read_as_a_length_rejection():
    with static_server(routes(stream=(200, SSE, (FIX / "stream_error.txt").read_text()))) as url:
        adapter = open_adapter(url, HttpClient())
        c = adapter.complete(adapter.token_ids(40, SEED), max_tokens=16, stream=True, timeout_s=5)
    assert c.status == 200
    assert c.rejected and c.error_kind == ErrorKind.LENGTH
    assert "must be <= 32768" in c.error_message


# -- sending text of an exact length ---------------------------------------------------------------
@pytest.mark.parametrize("seed", [SEED, "KVPF-WARMUP-1a2b "], ids=["newline", "trailing-space"])
@pytest.mark.parametrize("n", [2, 5, 17, 40, 333])
def test_complete_sends_text_that_tgi_counts_as_exactly_the_requested_tokens(n, seed):
    with static_server(routes(generate=served_like_tgi)) as url:
        adapter = open_adapter(url, HttpClient())
        ids = adapter.token_ids(400, seed)
        c = adapter.complete(ids[:n], max_tokens=2, stream=False, timeout_s=5)
        (_, sent), = [s for s in static_server.seen if s[0] == "POST /generate"]
    assert ids[0] == BOS and len(ids) == 400
    assert len(tokenize(sent["inputs"])) == n  # what TGI's validation will count
    assert sent["parameters"]["max_new_tokens"] == 2 and sent["parameters"]["details"] is True
    assert "temperature" not in sent["parameters"]  # TGI refuses temperature 0
    assert not c.rejected and c.status == 200
    assert (c.sent_tokens, c.prompt_tokens, c.completion_tokens, c.finish_reason) == (n, n, 2, "length")
    assert c.truncated is False


def test_stream_reports_tgi_input_length_and_a_short_count_is_truncation():
    def stream(body):
        counted = len(tokenize(body["inputs"]))
        return 200, SSE, (FIX / "generate_stream.txt").read_text().replace("INPUT_LENGTH", str(counted - 3))
    with static_server(routes(stream=stream)) as url:
        adapter = open_adapter(url, HttpClient())
        c = adapter.complete(adapter.token_ids(60, SEED), max_tokens=2, stream=True, timeout_s=5)
    assert c.status == 200 and not c.rejected
    assert (c.sent_tokens, c.prompt_tokens, c.completion_tokens) == (60, 57, 2)
    assert c.truncated is True and c.text == " the marker"


def test_text_is_recalibrated_when_the_end_of_the_text_tokenizes_differently():
    tok = lambda text: tokenize(text, split_final_dot=True)  # noqa: E731
    with static_server(routes(generate=served_like_tgi, tok=tok)) as url:
        adapter = open_adapter(url, HttpClient())
        ids = adapter.token_ids(200, SEED)
        # find a length whose natural cut ends in "." so the first try is one token over
        for n in range(3, 80):
            adapter.complete(ids[:n], max_tokens=2, stream=False, timeout_s=5)
            sent = [s for s in static_server.seen if s[0] == "POST /generate"][-1][1]["inputs"]
            assert len(tok(sent)) == n, n


def test_no_tokenizer_is_a_one_line_error():
    no_tok = routes()
    no_tok["POST /tokenize"] = (404, JSON, {"error": "No fast tokenizer available"})
    with static_server(no_tok) as url:
        adapter = open_adapter(url, HttpClient())
        with pytest.raises(EngineError) as err:
            adapter.token_ids(10, SEED)
    assert "No fast tokenizer available" in str(err.value) and "\n" not in str(err.value)


def test_ids_it_did_not_make_are_refused_not_guessed():
    with static_server(routes(generate=served_like_tgi)) as url:
        adapter = open_adapter(url, HttpClient())
        with pytest.raises(EngineError, match="text prompts"):
            adapter.complete([BOS, 5, 6, 7], max_tokens=1, stream=False, timeout_s=5)


def test_the_raw_disconnect_request_is_the_generation_and_tenants_share_the_text_plans():
    # A raw client sends build_request's request: the streamed generation of the exact text,
    # not the /tokenize call made while building it. A tenant's adapter (with_client) can send
    # ids another tenant's adapter made, as the cross-tenant cache probe does.
    with static_server(routes()) as url:
        adapter = open_adapter(url, HttpClient())
        ids = adapter.token_ids(120, SEED)
        request = adapter.with_client(HttpClient(headers={"X-Tenant": "b"})).build_request(ids, max_tokens=3, stream=True)
    assert (request.path, request.sent_tokens, request.stream) == ("/generate_stream", 120, True)
    assert len(tokenize(request.body["inputs"])) == 120 and request.body["parameters"]["max_new_tokens"] == 3
