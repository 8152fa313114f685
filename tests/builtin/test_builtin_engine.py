"""The builtin engine as a user (or a preflight) sees it: real engine processes on 127.0.0.1,
real HTTP, real KV pages moved over TCP. Each engine is started once per module and always
stopped by PID (testbed.stop_engine in the fixtures' finally).

Sizes: context 8192 tokens; prefill pool 4096 tokens, so SGLang's max_req_input_len is
min(8191, 4095) - 5 = 4090 and a 4090-token prompt is the first one refused; decode pool 16384.
"""

from __future__ import annotations

import json
import re

import pytest
import requests
from support.builtin_requests import gen
from support.builtin_testbed import start_engine, start_pd, stop_engine

from kvpreflight import __version__
from kvpreflight._internal.builtin_engine.config import FAULTS

CONTEXT = 8192
SMALL_POOL = 4096
BIG_POOL = 16384
LIMIT = min(CONTEXT - 1, SMALL_POOL - 1) - 5  # 4090
OVER_POOL_MSG = (
    f"Input length (5000 tokens) exceeds the maximum allowed length ({LIMIT} tokens). "
    "Use a shorter input or enable --allow-auto-truncate."
)
# Tenant A's canary sits past the first page (16 tokens): the page a faulty prefill does send.
TENANT_A = "tenant-a prompt: CANARY-A-5f1c9e secret roadmap " + "alpha bravo charlie delta " * 12
TIMEOUT = 30


def metric(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=TIMEOUT).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    assert len(values) == 1, f"{name} not found exactly once in {url}/metrics"
    return values[0]


def sse_frames(body: str) -> list:
    frames = []
    for chunk in body.split("\n\n"):
        chunk = chunk.strip()
        if chunk:
            assert chunk.startswith("data: "), chunk
            payload = chunk[len("data: "):]
            frames.append(payload if payload == "[DONE]" else json.loads(payload))
    return frames


@pytest.fixture(scope="module")
def unified(tmp_path_factory):
    engine = start_engine("unified", tmp_path_factory.mktemp("unified"), context_length=CONTEXT,
                          pool_tokens=SMALL_POOL, page_log=True)
    try:
        yield engine
    finally:
        stop_engine(engine)


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    trio = start_pd(tmp_path_factory.mktemp("pd"), context_length=CONTEXT, prefill_pool=SMALL_POOL, decode_pool=BIG_POOL)
    try:
        yield trio
    finally:
        for engine in trio.all():
            stop_engine(engine)


@pytest.fixture(scope="module")
def pd_leaky(tmp_path_factory):
    """The incident: pre-0.5.21 prefill abort path and a decode that does not count tokens."""
    trio = start_pd(tmp_path_factory.mktemp("pd-leaky"), context_length=CONTEXT, prefill_pool=SMALL_POOL,
                    decode_pool=BIG_POOL, prefill_faults=["reject-continues"], decode_faults=["no-transfer-check"])
    try:
        yield trio
    finally:
        for engine in trio.all():
            stop_engine(engine)


# ---- unified engine: what it says about itself ------------------------------------------------


def test_server_info_reports_sglang_fields(unified):
    info = requests.get(unified.url + "/server_info", timeout=TIMEOUT).json()
    assert info["context_length"] == CONTEXT
    assert info["max_total_num_tokens"] == SMALL_POOL
    assert info["max_req_input_len"] == LIMIT
    assert info["page_size"] == 16
    assert info["disaggregation_mode"] is None
    assert info["allow_auto_truncate"] is False
    assert info["disable_radix_cache"] is False
    assert info["internal_states"][0]["memory_usage"]["token_capacity"] == SMALL_POOL
    assert info["version"] == f"kvpreflight-builtin {__version__}"
    assert "--pool-tokens 4096" in info["launch_command"]
    assert requests.get(unified.url + "/get_server_info", timeout=TIMEOUT).json()["max_total_num_tokens"] == SMALL_POOL
    models = requests.get(unified.url + "/v1/models", timeout=TIMEOUT).json()
    assert models["data"][0]["max_model_len"] == CONTEXT
    loads = requests.get(unified.url + "/v1/loads", timeout=TIMEOUT).json()["loads"][0]
    assert loads["max_total_num_tokens"] == SMALL_POOL
    assert requests.get(unified.url + "/model_info", timeout=TIMEOUT).json()["vocab_size"] == 260


def test_startup_log_lines_are_sglangs(unified):
    log = unified.log_text()
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] KV Cache is allocated\. dtype: torch\.float32, "
                     r"#tokens: 4096, KV size: \d+\.\d\d GB$", log, re.M), log
    assert re.search(r"TP0\] max_total_num_tokens=4096, chunked_prefill_size=\d+, max_prefill_tokens=\d+, "
                     r"max_running_requests=\d+, context_len=8192, available_cpu_mem=\d+\.\d\d GB$", log, re.M), log
    assert "KV pool holds 4096 tokens, fewer than --context-length 8192. One full-length request cannot fit" in log
    assert "The server is fired up and ready to roll!" in log


def test_tokenize_counts_bytes(unified):
    body = requests.post(unified.url + "/tokenize", json={"prompt": "héllo"}, timeout=TIMEOUT).json()
    assert body == {"tokens": list("héllo".encode()), "count": 6, "max_model_len": CONTEXT}


# ---- unified engine: generation ------------------------------------------------------------------


def test_generate_echoes_prompt_with_exact_token_count(unified):
    prompt = "Repeat after me: CANARY-UNIFIED-42 and nothing else."
    r = gen(unified.url, prompt, max_new=30)
    assert r.status_code == 200
    body = r.json()
    assert body["text"] == prompt[:30]
    assert len(body["output_ids"]) == 30
    assert body["meta_info"]["completion_tokens"] == 30
    assert body["meta_info"]["prompt_tokens"] == 52
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 30}


def test_input_logprobs_echo_the_prompt_ids(unified):
    ids = list(b"logprob probe")
    body = gen(unified.url, ids=ids, max_new=1, return_logprob=True, logprob_start_len=0).json()
    echoed = body["meta_info"]["input_token_logprobs"]
    assert [row[1] for row in echoed] == ids
    assert echoed[0][0] is None and all(row[0] > -0.01 for row in echoed[1:])


def test_capacity_boundary_and_exact_messages(unified):
    before = metric(unified.url, "sglang:prompt_tokens_total")
    ok = gen(unified.url, ids=[65] * (LIMIT - 1), max_new=4)
    assert ok.status_code == 200 and ok.json()["meta_info"]["prompt_tokens"] == LIMIT - 1
    refused = gen(unified.url, ids=[65] * LIMIT, max_new=4)
    assert refused.status_code == 400
    assert refused.json() == {"error": {"message": (
        f"Input length ({LIMIT} tokens) exceeds the maximum allowed length ({LIMIT} tokens). "
        "Use a shorter input or enable --allow-auto-truncate.")}}
    over_context = gen(unified.url, ids=[65] * CONTEXT)
    assert over_context.status_code == 400
    assert over_context.json()["error"]["message"] == (
        f"The input ({CONTEXT} tokens) is longer than the model's context length ({CONTEXT} tokens).")
    # Only the accepted prompt was computed.
    assert metric(unified.url, "sglang:prompt_tokens_total") == before + LIMIT - 1


def test_streamed_rejection_is_an_error_frame_inside_http_200(unified):
    r = requests.post(unified.url + "/generate", json={"input_ids": [66] * 5000, "stream": True}, timeout=TIMEOUT)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/event-stream")
    frames = sse_frames(r.text)
    assert frames[-1] == "[DONE]" and len(frames) == 2
    assert frames[0]["error"]["message"] == OVER_POOL_MSG
    assert frames[0]["error"]["code"] == 400


def test_streamed_success_frames_then_done(unified):
    r = requests.post(unified.url + "/generate", json={"text": "stream me", "stream": True,
                                                      "sampling_params": {"max_new_tokens": 6}}, timeout=TIMEOUT)
    frames = sse_frames(r.text)
    assert frames[-1] == "[DONE]"
    assert frames[-2]["text"] == "stream" and frames[-2]["meta_info"]["finish_reason"]["type"] == "length"


def test_openai_completions_shape_and_error_body(unified):
    ok = requests.post(unified.url + "/v1/completions", json={"prompt": list(b"abcdef"), "max_tokens": 3}, timeout=TIMEOUT)
    assert ok.status_code == 200
    assert ok.json()["choices"][0]["text"] == "abc"
    assert ok.json()["usage"]["prompt_tokens"] == 6
    bad = requests.post(unified.url + "/v1/completions", json={"prompt": "x" * 5000, "max_tokens": 3}, timeout=TIMEOUT)
    assert bad.status_code == 400
    assert bad.json() == {"object": "error", "message": OVER_POOL_MSG, "type": "BadRequestError", "param": None, "code": 400}


def test_pool_accounting_returns_to_zero_and_pages_are_reused(unified):
    gen(unified.url, "first request " * 30, max_new=8, cache_salt="reuse-1")
    gen(unified.url, "second request " * 30, max_new=8, cache_salt="reuse-2")
    assert metric(unified.url, "sglang:num_used_tokens") == 0
    assert requests.get(unified.url + "/v1/loads", timeout=TIMEOUT).json()["loads"][0]["num_used_tokens"] == 0
    events = unified.page_events()
    returned = {p for e in events if e["event"] == "freed" for p in e["returned_to_pool"]}
    given_later = [e for e in events if e["event"] == "given"][-1]["pages"]
    assert returned & set(given_later), "a freed page should be handed out again"


def test_prefix_cache_is_keyed_by_salt(unified):
    prompt = "shared system prompt " * 20  # 420 tokens: 26 full pages
    first = gen(unified.url, prompt, max_new=2, cache_salt="tenant-a").json()
    again = gen(unified.url, prompt, max_new=2, cache_salt="tenant-a").json()
    other = gen(unified.url, prompt, max_new=2, cache_salt="tenant-b").json()
    assert first["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["cached_tokens"] == 26 * 16
    assert other["meta_info"]["cached_tokens"] == 0


def test_disable_radix_cache_turns_the_prefix_cache_off_and_says_so(tmp_path):
    engine = start_engine("unified", tmp_path, context_length=CONTEXT, pool_tokens=SMALL_POOL,
                          extra_args=["--disable-radix-cache"])
    try:
        assert requests.get(engine.url + "/server_info", timeout=TIMEOUT).json()["disable_radix_cache"] is True
        prompt = "shared system prompt " * 20
        cached = [gen(engine.url, prompt, max_new=2, cache_salt="a").json()["meta_info"]["cached_tokens"] for _ in range(2)]
        assert cached == [0, 0]
    finally:
        stop_engine(engine)


# ---- PD trio, correct (SGLang >= 0.5.21) ---------------------------------------------------------


def test_router_lists_workers(pd):
    workers = requests.get(pd.url + "/workers", timeout=TIMEOUT).json()["workers"]
    assert {(w["worker_type"], w["url"]) for w in workers} == {("prefill", pd.prefill.url), ("decode", pd.decode.url)}
    prefill_info = requests.get(pd.prefill.url + "/server_info", timeout=TIMEOUT).json()
    assert prefill_info["disaggregation_mode"] == "prefill"
    # As in SGLang, the prefill owns the bootstrap server; the router lists its port.
    assert isinstance(prefill_info["disaggregation_bootstrap_port"], int)
    assert [w["bootstrap_port"] for w in workers if w["worker_type"] == "prefill"] == [prefill_info["disaggregation_bootstrap_port"]]
    decode_info = requests.get(pd.decode.url + "/server_info", timeout=TIMEOUT).json()
    assert decode_info["disaggregation_mode"] == "decode"
    assert decode_info["disaggregation_bootstrap_port"] is None


def test_pd_request_moves_pages_and_echoes(pd):
    sent_before = metric(pd.prefill.url, "sglang:kv_transfers_total")
    pages_before = metric(pd.decode.url, "sglang:kv_transfer_pages_total")
    r = gen(pd.url, TENANT_A, max_new=40)
    assert r.status_code == 200
    assert r.json()["text"] == TENANT_A[:40]
    assert metric(pd.prefill.url, "sglang:kv_transfers_total") == sent_before + 1
    assert metric(pd.decode.url, "sglang:kv_transfer_pages_total") == pages_before + -(-len(TENANT_A) // 16)
    assert metric(pd.decode.url, "sglang:generation_tokens_total") >= 40
    assert metric(pd.decode.url, "sglang:num_used_tokens") == 0


def test_pd_stream_and_openai_route_through_router(pd):
    r = requests.post(pd.url + "/generate", json={"text": TENANT_A, "stream": True,
                                                  "sampling_params": {"max_new_tokens": 12}}, timeout=TIMEOUT)
    frames = sse_frames(r.text)
    assert r.status_code == 200 and frames[-1] == "[DONE]"
    assert frames[-2]["text"] == TENANT_A[:12]
    c = requests.post(pd.url + "/v1/completions", json={"prompt": "0123456789", "max_tokens": 5}, timeout=TIMEOUT)
    assert c.status_code == 200 and c.json()["choices"][0]["text"] == "01234"
    bad = requests.post(pd.url + "/v1/completions", json={"prompt": "x" * 5000}, timeout=TIMEOUT)
    assert bad.status_code == 400 and bad.json()["message"] == OVER_POOL_MSG


def test_pd_over_pool_is_refused_before_any_transfer(pd):
    gen(pd.url, TENANT_A, max_new=8)  # tenant A's KV now sits (freed) in decode pages
    transfers = metric(pd.prefill.url, "sglang:kv_transfers_total")
    decode_pages = metric(pd.decode.url, "sglang:kv_transfer_pages_total")
    given_before = sum(1 for e in pd.decode.page_events() if e["event"] == "given")
    r = gen(pd.url, ids=[66] * 5000, max_new=64)
    assert r.status_code == 400
    assert r.json() == {"error": {"message": OVER_POOL_MSG}}
    assert metric(pd.prefill.url, "sglang:kv_transfers_total") == transfers
    assert metric(pd.decode.url, "sglang:kv_transfer_pages_total") == decode_pages
    assert sum(1 for e in pd.decode.page_events() if e["event"] == "given") == given_before  # nothing reserved
    streamed = requests.post(pd.url + "/generate", json={"input_ids": [66] * 5000, "stream": True}, timeout=TIMEOUT)
    assert streamed.status_code == 200
    assert sse_frames(streamed.text)[0]["error"]["message"] == OVER_POOL_MSG


# ---- PD trio with the incident's faults ------------------------------------------------------------


def test_reject_continues_without_transfer_check_leaks_tenant_a(pd_leaky):
    a = gen(pd_leaky.url, TENANT_A, max_new=8)
    assert a.status_code == 200
    transfers = metric(pd_leaky.prefill.url, "sglang:kv_transfers_total")
    b = gen(pd_leaky.url, ids=[66] * 5000, max_new=80)
    assert b.status_code == 200  # the incident: HTTP 200 ...
    assert "CANARY-A-5f1c9e secret roadmap" in b.json()["text"]  # ... with tenant A's text
    # One page went over for a 5000-token prompt.
    assert metric(pd_leaky.prefill.url, "sglang:kv_transfers_total") == transfers + 1


def test_faults_are_invisible_from_outside(pd_leaky):
    surfaces = []
    for engine in pd_leaky.all():
        if engine.role != "router":
            surfaces.append(requests.get(engine.url + "/server_info", timeout=TIMEOUT).text)
            surfaces.append(requests.get(engine.url + "/metrics", timeout=TIMEOUT).text)
        surfaces.append(engine.log_text())
        surfaces.append(" ".join(engine.argv))
        surfaces.append(open(f"/proc/{engine.pid}/cmdline", "rb").read().decode().replace("\0", " "))
    blob = "\n".join(surfaces)
    for name in FAULTS:
        assert name not in blob


@pytest.mark.parametrize("body,message", [
    ({"text": ""}, "The input is empty: send at least one token."),
    ({"input_ids": [1, 999]}, "Token id 999 is out of vocabulary (vocab size 260)."),
    ({"text": ["a", "b"]}, "Batched text is not supported by the builtin engine: send one string per request."),
    ({"text": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens must be a non-negative integer, got -1."),
    ({}, "Either text or input_ids should be provided."),
])
def test_bad_requests_get_one_line_400(unified, body, message):
    r = requests.post(unified.url + "/generate", json=body, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json() == {"error": {"message": message}}


def test_request_body_that_is_not_json_gets_400(unified):
    r = requests.post(unified.url + "/generate", data=b"not json", timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["message"] == "The request body must be a JSON object."
