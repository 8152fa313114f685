"""Issue 26's fault classes on the builtin engine, one representative cell each, through the
real `check` CLI (engine processes on 127.0.0.1, stopped by PID): a leak confined to streamed
answers and one confined to answers that are not streamed fail tenant-isolation; a prompt
silently shortened while the answer reports its full length fails prompt-integrity on the
engine's counters; tokens and then a frame cut mid-JSON fail overcapacity-rejected quoting the
frame, and an answer with text whose token count is -1 fails it too. Honest background traffic
during the check does not fail prompt-integrity. The same faults behind the builtin router, each
on the role a P/D deployment would have it on, fail the same checks. The whole matrix (every
cell, the honest engine and the honest trio on each) is benchmarks/bench_detection.py."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import requests
from support.builtin_testbed import pd_trio, unified_engine

CONTEXT, POOL = 2048, 8192


def check(url: str, *endpoints: str) -> tuple[int, dict[str, dict]]:
    """`endpoints`: the arguments naming a P/D deployment's engines and entry, instead of `url` alone."""
    where = list(endpoints) or ["--endpoint", url]
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", *where, "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.returncode, {c["id"]: c for c in json.loads(proc.stdout)["checks"]}


def read_to_the_end(iso: dict) -> list[dict]:
    """The answers that carried another tenant's canary, of the requests read to their end."""
    return [r for r in iso["evidence"]["crossings"] if "disconnected" not in r]


def test_streamed_leak_shortened_prompt_cut_frame_and_bad_count_each_fail_their_check(tmp_path):
    faults = ["leak-streamed", "shortened-prompt", "tokens-then-garbage", "text-with-bad-count"]
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=POOL, faults=faults) as engine:
        code, checks = check(engine.url)
    assert code == 1
    over = checks["overcapacity-rejected"]
    assert over["status"] == "fail" and "over-context-stream" in over["message"], over["message"]
    assert "3 tokens were served before a part of the reply that does not read" in over["message"]
    assert "stream frame is not JSON" in over["message"]
    # Not streamed: an answer with text whose token count is -1 was served, whatever its count.
    assert "over-context (2,049 tokens): HTTP 200: an answer with text, its counts not readable" in over["message"]
    assert "completion_tokens = -1 is not a token count" in over["message"]
    integrity = checks["prompt-integrity"]
    assert integrity["status"] == "fail", integrity["message"]
    assert "the engines' counters do not" in integrity["message"] and "never computed, cached or received" in integrity["message"]
    iso = checks["tenant-isolation"]
    assert iso["status"] == "fail" and "canary crossed tenants" in iso["message"], iso["message"]
    assert read_to_the_end(iso) and all(r["stream"] for r in read_to_the_end(iso)), iso["evidence"]["crossings"]


def test_a_leak_only_when_not_streamed_fails_and_background_traffic_does_not_fail_integrity(tmp_path):
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=POOL, faults=["leak-not-streamed"]) as engine:
        stop = threading.Event()

        def background() -> None:  # another client's honest short requests all through the check
            while not stop.wait(0.3):
                try:
                    requests.post(engine.url + "/generate", json={"text": "background " * 8,
                                                                "sampling_params": {"max_new_tokens": 4}}, timeout=30)
                except requests.RequestException:
                    pass

        thread = threading.Thread(target=background, daemon=True)
        thread.start()
        try:
            code, checks = check(engine.url)
        finally:
            stop.set()
            thread.join(timeout=35)
    assert code == 1
    iso = checks["tenant-isolation"]
    assert iso["status"] == "fail" and "canary crossed tenants" in iso["message"], iso["message"]
    assert read_to_the_end(iso) and not any(r["stream"] for r in read_to_the_end(iso)), iso["evidence"]["crossings"]
    assert checks["prompt-integrity"]["status"] == "pass", checks["prompt-integrity"]["message"]
    assert checks["overcapacity-rejected"]["status"] == "pass", checks["overcapacity-rejected"]["message"]


def test_behind_the_router_each_fault_fails_its_check_where_a_pd_deployment_has_it(tmp_path):
    """One P/D cell per fault on one trio (the whole P/D matrix: bench_detection.py's PD_MATRIX):
    both leaks on the decode's answer path, the shortened prompt in the prefill's accounting (it
    tells the decode all of the KV was sent), the frame faults on both roles (the router relays
    the prefill's refusal stream, and the decode's answer once the prefill let a prompt through)."""
    frames = ["tokens-then-garbage", "text-with-bad-count"]
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=POOL, decode_pool=POOL, page_log=False,
                 prefill_faults=["shortened-prompt", *frames], decode_faults=["leak-streamed", "leak-not-streamed", *frames],
                 prefill_args=["--transfer-delay-ms", "6"]) as trio:
        code, checks = check(trio.router.url, "--endpoint", f"prefill={trio.prefill.url}", "--endpoint",
                             f"decode={trio.decode.url}", "--entry", trio.router.url)
    assert code == 1
    iso = checks["tenant-isolation"]
    assert iso["status"] == "fail" and "canary crossed tenants" in iso["message"], iso["message"]
    crossed = read_to_the_end(iso)
    assert {r["stream"] for r in crossed if r["request"].startswith("normal-")} == {True, False}, crossed
    integrity = checks["prompt-integrity"]
    assert integrity["status"] == "fail" and "never computed, cached or received" in integrity["message"], integrity["message"]
    assert integrity["evidence"]["engine_counts"]["boundary-accept"]["tally"] == "short"
    over = checks["overcapacity-rejected"]
    assert over["status"] == "fail", over["message"]
    assert ("over-context-stream (2,049 tokens): HTTP 200: 3 tokens were served before a part of the reply "
            "that does not read") in over["message"]
    assert "over-context (2,049 tokens): HTTP 200: an answer with text, its counts not readable" in over["message"]
