"""The TensorRT-LLM adapter against bodies and log lines copied from TensorRT-LLM's source and a
published start-up log (tests/fixtures/trtllm/README.md says where each comes from). TensorRT-LLM
needs a GPU; it does not run on this machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from static_server import static_server
from support.cli import invoke

from kvpreflight._internal.engines import HttpClient, open_adapter
from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.trtllm import TrtllmAdapter
from kvpreflight._internal.engines.vllm import VllmAdapter
from kvpreflight.model import ContextHazard, ErrorKind, Origin

FIX = Path(__file__).parents[1] / "fixtures" / "trtllm"
JSON = "application/json"
PROMETHEUS = """# HELP trtllm_request_success_total Count of successfully processed requests.
# TYPE trtllm_request_success_total counter
trtllm_request_success_total{engine_type="undefined",finished_reason="length",model_name="undefined"} 3.0
# HELP trtllm_prompt_tokens_total Cumulative number of prompt (input) tokens processed.
# TYPE trtllm_prompt_tokens_total counter
trtllm_prompt_tokens_total{engine_type="undefined",model_name="undefined"} 1200.0
"""


def body(name: str) -> str:
    return (FIX / name).read_text()


def routes(*, metrics: str = "metrics.json", completions=None, tokenize=None, prometheus: bool = False):
    """What trtllm-serve serves (tensorrt_llm/serve/openai_server.py register_routes)."""
    r = {
        "GET /health": (200, JSON, b""),
        "GET /v1/models": (200, JSON, body("models.json")),
        "GET /version": (200, JSON, body("version.json")),
        "GET /metrics": (200, JSON, body(metrics)),
    }
    if completions is not None:
        r["POST /v1/completions"] = completions
    if tokenize is not None:
        r["POST /_internal/tokenize"] = tokenize
    if prometheus:
        r["GET /prometheus/metrics"] = (200, "text/plain; version=0.0.4", PROMETHEUS)
    return r


def test_auto_detection_takes_trtllm_serve_and_no_other_adapter_claims_it():
    # newer builds also answer /server_info (openai_server.py get_server_info), which SGLang's
    # detection asks: {"disaggregated_params": ...}
    with static_server({**routes(), "GET /server_info": (200, JSON, {"disaggregated_params": None})}) as url:
        adapter = open_adapter(url, HttpClient())
        assert isinstance(adapter, TrtllmAdapter) and adapter.kind == "trtllm"
        assert not VllmAdapter.detect(url, HttpClient())  # it serves /version and /v1/models too


def test_a_vllm_model_list_is_not_taken_for_tensorrt_llm():
    vllm_models = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm", "max_model_len": 4096}]}
    with static_server({**routes(), "GET /v1/models": (200, JSON, vllm_models)}) as url:
        assert not TrtllmAdapter.detect(url, HttpClient())


def stats(max_blocks: int) -> list[dict]:
    """One iteration stat of metrics.json with another maxNumBlocks."""
    stat = json.loads(body("metrics.json"))[-1]
    return [{**stat, "kvCacheStats": {**stat["kvCacheStats"], "maxNumBlocks": max_blocks}}]


def test_the_iteration_stats_blocks_alone_are_not_taken_for_the_gpu_pool():
    # kvCacheManager.h getMaxNumBlocks counts every block, host-offload ones too: without the log
    # (its allocator line, or the secondary pool's size) a pass on it would not hold.
    with static_server(routes()) as url:
        snap = TrtllmAdapter(url, HttpClient()).read()
    assert snap.engine == "trtllm" and snap.version == "1.2.1" and snap.model == "Llama-3.1-8B-Instruct"
    assert snap.pool_readings == () and snap.page_size == 32
    assert any("3,240,192 tokens" in n and "host-offload" in n and "--log" in n for n in snap.notes)
    assert snap.served_context is None


def test_beside_the_log_the_iteration_stats_blocks_are_a_second_source_less_the_secondary_pool():
    with static_server({**routes(), "GET /metrics": (200, JSON, stats(1_280))}) as url:
        snap = TrtllmAdapter(url, HttpClient()).read(log_text=body("startup_fits.log"))
    assert sorted((r.origin, r.tokens) for r in snap.pool_readings) == [(Origin.ALLOCATOR, 40_960), (Origin.SCHEDULER, 40_960)]
    offload = body("startup_fits.log") + ("[TensorRT-LLM][INFO] Number of blocks in KV cache secondary pool: 256, "
                                          "onboard blocks to primary memory before reuse: true\n")
    with static_server({**routes(), "GET /metrics": (200, JSON, stats(1_280 + 256))}) as url:
        snap = TrtllmAdapter(url, HttpClient()).read(log_text=offload)
    assert sorted(r.tokens for r in snap.pool_readings) == [40_960, 40_960]


def test_no_iteration_stats_yet_is_said_and_no_pool_is_made_up():
    with static_server(routes(metrics="metrics_empty.json")) as url:
        snap = TrtllmAdapter(url, HttpClient()).read()
    assert snap.pool_readings == ()
    assert any("enable_iter_perf_stats" in n for n in snap.notes)


def test_the_clamped_start_up_log_gives_the_allocated_pool_the_kept_length_and_the_clamp_warnings():
    with static_server(routes(metrics="metrics_empty.json")) as url:
        snap = TrtllmAdapter(url, HttpClient()).read(log_text=body("startup_clamp.log"))
    # the last allocator line: the trial cache (8,224) is rebuilt after profiling
    assert [(r.tokens, r.origin) for r in snap.pool_readings] == [(86_720, Origin.ALLOCATOR)]
    assert snap.served_context == 86_720 and snap.max_request_tokens == 8_192  # chunked prefill off
    assert snap.settings["max_seq_len_inferred"] == 131_072
    hazards = {(w.hazard, w.tokens) for w in snap.context_warnings}
    assert hazards == {(ContextHazard.WINDOW, 86_720), (ContextHazard.SEQUENCE, 86_720)}
    assert TrtllmAdapter(url, HttpClient()).max_accepted_prompt(snap) == 8_192


def test_the_trial_caches_clamps_do_not_count_when_the_real_cache_holds_max_seq_len():
    with static_server(routes(metrics="metrics_empty.json")) as url:
        snap = TrtllmAdapter(url, HttpClient()).read(log_text=body("startup_fits.log"))
    assert snap.context_warnings == ()
    assert any("trial KV cache" in n for n in snap.notes)
    assert [r.tokens for r in snap.pool_readings] == [40_960] and snap.served_context == 32_768


@pytest.mark.parametrize("log, pool", [("startup_clamp.log", 86_720), ("startup_trt_backend_clamp.log", 5_184)])
def test_a_clamp_in_the_log_fails_kv_capacity_even_without_probes(log: str, pool: int):
    with static_server(routes(metrics="metrics_empty.json")) as url:
        proc = invoke("check", "--endpoint", url, "--capacity-only", "--log", f"{url}={FIX / log}", "--format", "json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    by_id = {c["id"]: c for c in report["checks"]}
    assert by_id["kv-capacity"]["status"] == "fail"
    assert "--fail_fast_on_attention_window_too_large" in by_id["kv-capacity"]["message"]
    assert report["engines"][0]["engine"] == "trtllm" and report["engines"][0]["kv_pool_tokens"] == pool


def test_a_log_whose_real_cache_holds_the_context_passes_kv_capacity():
    with static_server(routes(metrics="metrics_empty.json")) as url:
        proc = invoke("check", "--endpoint", url, "--capacity-only", "--log", f"{url}={FIX / 'startup_fits.log'}",
                      "--format", "json")
    report = json.loads(proc.stdout)
    by_id = {c["id"]: c for c in report["checks"]}
    assert by_id["kv-capacity"]["status"] == "pass", by_id["kv-capacity"]["message"]
    assert proc.returncode in (0, 3), proc.stderr  # nothing failed; what was not sent is not a pass


@pytest.mark.parametrize("fixture", ["error_max_num_tokens.json", "error_max_seq_len.json", "error_default_max_tokens.json"])
def test_each_over_length_refusal_is_a_length_error(fixture: str):
    with static_server(routes(completions=(400, JSON, body(fixture)))) as url:
        c = TrtllmAdapter(url, HttpClient()).complete(list(range(10)), max_tokens=1, stream=False, timeout_s=5)
    assert c.status == 400 and c.error_kind is ErrorKind.LENGTH and c.rejected
    assert c.error_message == json.loads(body(fixture))["message"]


def test_another_bad_request_is_not_a_length_error():
    other = {"object": "error", "message": "Invalid action: keep", "type": "InvalidRequestError", "param": None, "code": 400}
    with static_server(routes(completions=(400, JSON, other))) as url:
        c = TrtllmAdapter(url, HttpClient()).complete([1, 2], max_tokens=1, stream=False, timeout_s=5)
    assert c.error_kind is ErrorKind.OTHER


def completions(req: dict):
    """trtllm-serve's /v1/completions as its source has it: CompletionRequest needs `model`, forbids
    fields it does not know (`cache_salt` among them: HTTP 400 from the validation handler), and
    the PyTorch backend refuses a prompt over max_num_tokens (8,192) while chunked prefill is off."""
    n = len(req.get("prompt") or [])
    if "model" not in req or set(req) - {"model", "prompt", "max_tokens", "temperature", "stream", "stream_options"}:
        return 400, JSON, {"error": "1 validation error for CompletionRequest: Extra inputs are not permitted"}
    if n > 8192:
        return 400, JSON, body("error_max_num_tokens.json").replace("8193.0", f"{n}.0")
    return 200, JSON, body("completion.json").replace("PROMPT_TOKENS", str(n)).replace("TOTAL_TOKENS", str(n + 1))


def test_an_answer_is_read_with_its_usage_and_the_model_it_requires_is_named():
    seen: list[dict] = []

    def answer(req: dict):
        seen.append(req)
        return completions(req)

    with static_server(routes(completions=answer)) as url:
        c = TrtllmAdapter(url, HttpClient()).complete(list(range(50)), max_tokens=1, stream=False, timeout_s=5)
    assert c.status == 200 and c.prompt_tokens == 50 and c.completion_tokens == 1 and c.text == " PROBE"
    assert c.cached_tokens == 0 and c.finish_reason == "length" and not c.rejected
    assert seen[0]["model"] == "Llama-3.1-8B-Instruct" and seen[0]["prompt"] == list(range(50))


def test_a_full_check_refuses_for_length_and_says_tenants_cannot_be_salted():
    r = routes(metrics="metrics_empty.json", completions=completions, tokenize=(200, JSON, {"count": 3, "tokens": [11, 12, 13]}))
    with static_server(r) as url:
        proc = invoke("check", "--endpoint", url, "--log", f"{url}={FIX / 'startup_fits.log'}", "--format", "json",
                      "--timeout", "5")
    report = json.loads(proc.stdout)
    by_id = {c["id"]: c for c in report["checks"]}
    assert by_id["overcapacity-rejected"]["status"] == "pass", by_id["overcapacity-rejected"]["message"]
    for check in ("tenant-isolation", "prefix-cache-isolation"):
        assert by_id[check]["status"] == "inconclusive" and "cache_salt" in by_id[check]["message"]
        assert "--tenant-header" in by_id[check]["message"]
    assert proc.returncode != 0  # isolation was not measured: never a pass


def test_token_ids_come_from_its_tokenizer_route_and_its_absence_is_named():
    with static_server(routes(tokenize=(200, JSON, {"count": 3, "tokens": [11, 12, 13]}))) as url:
        assert TrtllmAdapter(url, HttpClient()).token_ids(7, "seed") == [11, 12, 13, 11, 12, 13, 11]
    with static_server(routes()) as url, pytest.raises(EngineError, match="_internal/tokenize.*no tokenizer route"):
        TrtllmAdapter(url, HttpClient()).token_ids(7, "seed")


def test_counters_come_from_the_prometheus_route_and_are_none_without_it():
    with static_server(routes(prometheus=True)) as url:
        counters = TrtllmAdapter(url, HttpClient()).counters()
    assert counters.requests == 3 and counters.prompt_tokens == 1200 and counters.generation_tokens is None
    with static_server(routes()) as url:
        assert TrtllmAdapter(url, HttpClient()).counters().requests is None


def test_a_malformed_iteration_stat_is_an_engine_error_naming_it():
    with static_server({**routes(), "GET /metrics": (200, JSON, [{"kvCacheStats": [1, 2]}])}) as url, \
            pytest.raises(EngineError, match=r"/metrics\[0\]\.kvCacheStats"):
        TrtllmAdapter(url, HttpClient()).read()
