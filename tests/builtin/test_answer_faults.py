"""Issue 44's engine faults on the builtin engine, each in two shapes, read with raw requests (what
the engine does) and through the real `check` CLI (what kvpreflight says): a decode whose own
prefix cache ignores the salt (the cross-tenant hit moves the decode's counters while the answer
says cached_tokens 0), a context served past the model's positions (noise past them; SGLang's
warning, or none) and an attention window below the context (a long prompt's answer is copied
from its tail; TensorRT-LLM's clamp warning, or none). Engines on 127.0.0.1, stopped by PID."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import requests
from support.builtin_testbed import pd_trio, unified_engine

from kvpreflight._internal.builtin_engine.config import ATTENTION_WINDOW_ENV, POSITIONS_ENV

CONTEXT, POOL, PAGE = 2048, 8192, 16
TIMEOUT = 30
HEAD = list(b"KVPF-HEAD-0123456789abcdef01234567 ")
# What SGLang 0.5.23 logs (srt/configs/model_config.py) and TensorRT-LLM logs
# (cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp) for these two configurations.
SGLANG_WARNING = ("Warning: User-specified context_length (2048) is greater than the derived context_length (1024). This "
                  "may lead to incorrect model outputs or CUDA errors. Note that the derived context_length may differ "
                  "from max_position_embeddings in the model's config.")
TRTLLM_WARNING = ("[TensorRT-LLM][WARNING] maxAttentionWindowVec too large to fit at least one sequence in kvCache. "
                  "Old: (2048), New: (512)")


def gen(url: str, ids: list[int], max_new: int = 24, salt: str | None = None) -> dict:
    body: dict = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new}}
    if salt is not None:
        body["cache_salt"] = salt
    r = requests.post(url + "/generate", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in requests.get(url + "/metrics", timeout=TIMEOUT).text.splitlines():
        if not line.startswith("#"):
            out[line.split("{")[0]] = out.get(line.split("{")[0], 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def shares_8_bytes(answer: str, prompt: list[int]) -> bool:
    text, source = answer.encode(), bytes(prompt)
    return any(text[i:i + 8] in source for i in range(max(0, len(text) - 7)))


def check(*where: str) -> tuple[int, dict[str, dict], str]:
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", *where, "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.returncode, {c["id"]: c for c in json.loads(proc.stdout)["checks"]}, proc.stdout


# ---- what the engine does -------------------------------------------------------------------------------

SHARED = list(b"SHARED-PREFIX-5e1f ") + [ord("q")] * (128 - 19)  # 8 pages


@pytest.mark.parametrize("fault, hit_tokens, lookups", [(None, 0, 0), ("decode-cache-no-salt", 112, 1),
                                                        ("decode-cache-no-salt-partial", 48, 0)])
def test_a_decode_cache_without_the_salt_reuses_another_tenants_prefix_and_only_its_counters_say_so(
        tmp_path, fault, hit_tokens, lookups):
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=POOL, decode_pool=POOL,
                 decode_faults=[fault] if fault else []) as trio:
        first = gen(trio.url, SHARED, salt="tenant-a")
        before = metrics(trio.decode.url)
        cross = gen(trio.url, SHARED, salt="tenant-b")  # another tenant, the same prompt
        decode = moved(before, metrics(trio.decode.url))
        assert requests.get(trio.decode.url + "/server_info", timeout=TIMEOUT).json()[
            "disaggregation_decode_enable_radix_cache"] is (fault is not None)
    assert cross["text"] == first["text"] == bytes(SHARED[:24]).decode()
    # The answer reports the prefill's figure: tenant B's prompt is not in the prefill's (salted) cache.
    assert cross["meta_info"]["cached_tokens"] == 0
    # The decode's own counters: the reused tokens as cached (and, in full, a lookup that hit);
    # the prefill sent only the rest.
    assert decode["sglang:cached_tokens_total"] == hit_tokens
    assert decode["sglang:prefix_cache_hits_total"] == lookups
    assert decode["sglang:kv_transfer_tokens_total"] == len(SHARED) - hit_tokens
    assert decode["sglang:prompt_tokens_total"] - decode["sglang:cached_tokens_total"] == 0  # computed nothing itself


@pytest.mark.parametrize("fault", [None, "positions-overridden", "positions-overridden-silent"])
def test_prompts_past_the_models_positions_are_served_counted_and_answered_with_noise(tmp_path, monkeypatch, fault):
    monkeypatch.setenv(POSITIONS_ENV, "1024")
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=POOL, faults=[fault] if fault else []) as engine:
        short = HEAD + [ord("s")] * 200
        long = HEAD + [ord("l")] * (1900 - len(HEAD))
        short_out, long_out = gen(engine.url, short), gen(engine.url, long)
        log = engine.log_text()
    assert short_out["text"] == bytes(short[:24]).decode()  # within the positions: the copy head echoes
    assert long_out["meta_info"]["prompt_tokens"] == 1900  # served and counted in full
    if fault is None:
        assert long_out["text"] == bytes(long[:24]).decode()
        assert "derived context_length" not in log
        return
    assert len(long_out["text"]) == 24 and not shares_8_bytes(long_out["text"], long), long_out["text"]
    assert (SGLANG_WARNING in log) is (fault == "positions-overridden"), log[-2000:]


@pytest.mark.parametrize("fault", [None, "attention-window", "attention-window-silent"])
def test_an_attention_window_copies_a_long_prompts_answer_from_its_tail(tmp_path, monkeypatch, fault):
    monkeypatch.setenv(ATTENTION_WINDOW_ENV, "512")
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=POOL, faults=[fault] if fault else []) as engine:
        short = HEAD + [ord("s")] * 400  # within the window
        long = HEAD + [ord("m")] * 1000 + list(b"TAIL-WINDOW-START-9c3b") + [ord("t")] * 500
        short_out, long_out = gen(engine.url, short), gen(engine.url, long)
        log = engine.log_text()
    assert short_out["text"] == bytes(short[:24]).decode()
    assert long_out["meta_info"]["prompt_tokens"] == len(long)
    if fault is None:
        assert long_out["text"] == bytes(long[:24]).decode()
        assert "maxAttentionWindow" not in log
        return
    assert long_out["text"] == bytes(long[len(long) - 512:][:24]).decode()  # step i read position len - 512 + i
    assert bytes(HEAD[:10]).decode() not in long_out["text"]
    assert (TRTLLM_WARNING in log) is (fault == "attention-window"), log[-2000:]


# ---- what kvpreflight says (issue 44: these wait for the checks' side) -----------------------------------

@pytest.mark.parametrize("fault", ["decode-cache-no-salt", "decode-cache-no-salt-partial"])
def test_an_unsalted_decode_cache_fails_prefix_cache_isolation_behind_the_router(tmp_path, fault):
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=POOL, decode_pool=POOL, decode_faults=[fault],
                 page_log=False) as trio:
        code, checks, _ = check("--endpoint", f"prefill={trio.prefill.url}", "--endpoint", f"decode={trio.decode.url}",
                                "--entry", trio.router.url)
    cache = checks["prefix-cache-isolation"]
    assert code == 1 and cache["status"] == "fail", cache["message"]
    cross = [p for p in cache["evidence"]["probes"] if p["kind"] == "cross"]
    assert cross and all(p["cached_tokens"] == 0 for p in cross)  # the answers said no hit; the decode's counters did


@pytest.mark.parametrize("fault", ["positions-overridden", "positions-overridden-silent"])
def test_a_context_past_the_models_positions_fails(tmp_path, monkeypatch, fault):
    monkeypatch.setenv(POSITIONS_ENV, "1024")
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=POOL, faults=[fault]) as engine:
        code, checks, _ = check("--endpoint", engine.url, "--log", f"{engine.url}={engine.log_path}")
    assert code == 1
    failed = {k: c["message"] for k, c in checks.items() if c["status"] == "fail"}
    # Near-context answers repeat nothing of their prompt while short ones echo: both shapes.
    assert {"prompt-integrity", "tenant-isolation"} & failed.keys(), failed
    if fault == "positions-overridden":
        assert any("derived context_length" in m for m in failed.values()), failed  # the engine's own warning


@pytest.mark.parametrize("fault", ["attention-window", "attention-window-silent"])
def test_an_attention_window_below_the_context_fails_prompt_integrity(tmp_path, monkeypatch, fault):
    monkeypatch.setenv(ATTENTION_WINDOW_ENV, "512")
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=POOL, faults=[fault]) as engine:
        code, checks, _ = check("--endpoint", engine.url, "--log", f"{engine.url}={engine.log_path}")
    assert code == 1
    integrity = checks["prompt-integrity"]
    assert integrity["status"] == "fail", integrity["message"]  # the near-context answers lack their head
    if fault == "attention-window":
        failed = {k: c["message"] for k, c in checks.items() if c["status"] == "fail"}
        assert any("maxAttentionWindowVec" in m for m in failed.values()), failed  # the engine's own warning
