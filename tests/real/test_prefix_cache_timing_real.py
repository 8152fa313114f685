"""The prefix-cache timing audit against real engines behind the cache-hiding gateway: the builtin
engine's test (tests/builtin/test_prefix_cache_timing.py) on engines we did not write. vLLM: the
session's shared server (prefix caching on). llama.cpp: the session's shared llama-server behind a
gateway that also forces `cache_prompt` false, so nothing is cached and timing has nothing to find."""

from __future__ import annotations

from typing import Any

import pytest
from realengines import EngineProcess
from support.cache_hiding import SILENT, check, prefix_cache
from support.rewriting_proxy import Rewrites, rewriting_proxy

pytestmark = pytest.mark.alone  # a timing audit on real vLLM


def audited_check(url: str, rewrites: Rewrites, *args: str) -> dict:
    with rewriting_proxy(url, rewrites) as hidden:
        code, report, err = check(hidden, *args)
    cache = prefix_cache(report)
    # a fail decides the exit code, an inconclusive one without a fail; a pass does not (the other
    # checks through the cache-hiding gateway are not what this module tests)
    expected = {"fail": 1, "inconclusive": 3}.get(cache["status"])
    assert expected is None or code == expected, (code, cache["message"], err[-1500:])
    return cache


# vLLM's cache saves only 2-6 ms of a 12-24 ms first token on this tiny model (512-token samples;
# the rest is fixed per-request overhead), and how much varies from run to run. The audit's positive
# control (a same-tenant repeat is faster than a cold prompt) then needs many samples: KS p was
# 0.0025 at 30 per kind, 0.0046 at 60 (cold 12.3 ms, warm 9.6 ms) and 0.011 at 120 (cold 17.4 ms,
# warm 15.0 ms) in three runs, each correctly inconclusive. The smallest of those
# effects (KS distance about 0.29) at 240 per kind gives p about 6e-5, 16 times under the 0.001
# bar. Both tests need that control before the audit says anything (without a salt too: at 60 per
# kind the unsalted case ended inconclusive once), so both take 240 (about 20 s each).
VLLM_SAMPLES = ("--timing-samples", "240")


def test_vllm_with_a_salt_per_tenant_shows_no_sharing_from_timing_alone(vllm_server: EngineProcess) -> None:
    cache = audited_check(vllm_server.url, SILENT, *VLLM_SAMPLES)
    assert cache["status"] == "pass", cache["message"]
    assert "a cache_salt per tenant" in cache["message"] and "tenant B's requests are not warm" in cache["message"]
    assert all(p["cached_tokens"] is None for p in cache["evidence"]["probes"])


def test_vllm_without_a_salt_shares_the_prefix_and_timing_catches_it(vllm_server: EngineProcess) -> None:
    # Tenants told apart by a header vLLM ignores: kvpreflight sends no cache_salt.
    cache = audited_check(vllm_server.url, SILENT, "--tenant-header", "X-Tenant", *VLLM_SAMPLES)
    assert cache["status"] == "fail" and "as fast as tenant A's warm repeats" in cache["message"], cache["message"]


def without_prompt_cache(path: str, _headers: Any, body: Any) -> Any:
    return {**body, "cache_prompt": False} if isinstance(body, dict) and path.startswith("/completion") else body


def test_llama_cpp_without_a_prompt_cache_timing_is_inconclusive(llama_server: EngineProcess) -> None:
    """No engine caches here, and none says so: timing cannot show that a cache isolates tenants,
    so the audit decides nothing: inconclusive, never a pass, never a fail. llama.cpp here answers
    the repeats of a sample up to 1 ms sooner than the sample's first (cold) request with nothing
    cached; judged against cold, that once failed this honest engine (docs/FINDINGS.md), so the
    references are fresh prompts sent in the repeats' places."""
    # llama.cpp states reuse in timings.cache_n / tokens_cached; the gateway hides them with the rest
    hidden = Rewrites(request=without_prompt_cache, reply=SILENT.reply, metrics=SILENT.metrics)
    cache = audited_check(llama_server.url, hidden, "--timing-samples", "20")
    assert cache["status"] == "inconclusive", cache["message"]
    assert cache["message"].startswith("the engine reports no cache hits, so time to first token decided nothing: "), cache["message"]
    assert cache["evidence"]["timing_audit"]["samples"] == {"cold": 20, "warm": 20, "cross": 20, "fresh": 20, "cross-fresh": 20}
    assert all(p["cached_tokens"] is None for p in cache["evidence"]["probes"])
