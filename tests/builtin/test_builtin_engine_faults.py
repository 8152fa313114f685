"""Each injected fault acts, and the correct engine does not: the testbed's promise that every
check has a real bug to catch. Real engine processes on 127.0.0.1, stopped by PID in finally.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.parse

import pytest
import requests
from support.builtin_testbed import pd_trio, unified_engine

from kvpreflight._internal.builtin_engine.config import derive_pool_tokens, max_req_input_len

CONTEXT = 8192
SMALL_POOL = 4096
BIG_POOL = 16384
TIMEOUT = 30


def gen(url: str, text: str | None = None, ids: list[int] | None = None, max_new: int = 32, **extra) -> requests.Response:
    body = {"sampling_params": {"max_new_tokens": max_new}, **extra}
    body.update({"input_ids": ids} if ids is not None else {"text": text})
    return requests.post(url + "/generate", json=body, timeout=TIMEOUT)


def metric(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=TIMEOUT).text
    (value,) = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    return value


def info(url: str) -> dict:
    return requests.get(url + "/server_info", timeout=TIMEOUT).json()


# ---- pure sizing rules (SGLang's) -------------------------------------------------------------------


def test_sglang_sizing_rules():
    # (1,000,000 - 16,640 weights) - 1,000,000 * 0.5 = 483,360 B; // 128 B per token = 3,776 tokens
    assert derive_pool_tokens(1_000_000, 1_000_000, 0.5, 16) == 3_776
    # The incident's prefill: 681,280-token pool under a 1,048,576 context; refused from 681,274 on.
    assert max_req_input_len(1_048_576, 681_280) == 681_274
    assert max_req_input_len(8192, 100_000) == 8186


# ---- CLI errors are one line ------------------------------------------------------------------------


@pytest.mark.parametrize("args,expected", [
    (["--role", "unified", "--port", "0"], "--role unified needs --context-length N (at least 2), --pool-tokens N"),
    (["--role", "unified", "--port", "0", "--context-length", "64", "--pool-tokens", "64", "--fault", "bogus"], "unknown fault bogus"),
    (["--role", "decode", "--port", "0", "--context-length", "64", "--mem-fraction-static", "0.5"], "needs --mem-budget-bytes"),
    (["--role", "unified", "--port", "0", "--context-length", "64", "--mem-budget-bytes", "20000", "--mem-fraction-static", "0.1"],
     "Not enough memory. Please try to increase --mem-fraction-static."),
    (["--role", "router", "--port", "0"], "--role router needs --decode-url"),
])
def test_bad_engine_settings_fail_with_one_line(args, expected):
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "engine", "serve", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("kvpreflight: error: ") and expected in lines[0], proc.stderr


# ---- unified engines with faults ---------------------------------------------------------------------


def test_auto_truncate_and_unsalted_prefix_cache(tmp_path):
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=SMALL_POOL,
                        faults=["auto-truncate", "prefix-cache-no-salt"]) as engine:
        assert info(engine.url)["allow_auto_truncate"] is False  # the setting is not shown ...
        r = gen(engine.url, ids=[67] * 5000, max_new=4)
        assert r.status_code == 200  # ... but an over-pool prompt is silently cut
        assert r.json()["meta_info"]["prompt_tokens"] == max_req_input_len(CONTEXT, SMALL_POOL)
        prompt = "system prompt shared by nobody " * 10
        gen(engine.url, prompt, max_new=1, cache_salt="tenant-a")
        other = gen(engine.url, prompt, max_new=1, cache_salt="tenant-b").json()
        assert other["meta_info"]["cached_tokens"] == len(prompt) // 16 * 16  # tenant b hits tenant a's pages


def test_fault_flag_leaves_no_trace_in_argv_or_launch_command(tmp_path):
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=SMALL_POOL,
                        extra_args=["--fault", "auto-truncate"]) as engine:
        cmdline = open(f"/proc/{engine.pid}/cmdline", "rb").read().decode()
        assert "fault" not in cmdline and "auto-truncate" not in cmdline
        launch = info(engine.url)["launch_command"]
        assert launch.startswith("kvpreflight engine serve --role unified") and "fault" not in launch
        assert gen(engine.url, ids=[67] * 5000, max_new=1).status_code == 200  # yet the fault acts


def test_misreported_pool_differs_from_allocator_log_and_behaviour(tmp_path):
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=SMALL_POOL, faults=["misreport-pool"]) as engine:
        reported = info(engine.url)
        assert reported["max_total_num_tokens"] == 2 * SMALL_POOL
        assert reported["internal_states"][0]["memory_usage"]["token_capacity"] == 2 * SMALL_POOL
        assert metric(engine.url, "sglang:max_total_num_tokens") == 2 * SMALL_POOL
        assert f"#tokens: {SMALL_POOL}, KV size" in engine.log_text()  # the allocator's own line is true
        r = gen(engine.url, ids=[68] * 5000, max_new=4)
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "Request prompt exceeds the KV memory budget: input_len=5000."


# ---- PD trios with faults (slow: three processes each) ------------------------------------------------

TENANT_A = "tenant-a: CANARY-A-77d2 quarterly numbers " + "one two three four five " * 15  # ~420 tokens


def test_reject_continues_caught_by_decode_transfer_check(tmp_path):
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=SMALL_POOL, decode_pool=BIG_POOL,
                 prefill_faults=["reject-continues"]) as trio:
        gen(trio.url, TENANT_A, max_new=4)
        r = gen(trio.url, ids=[66] * 5000, max_new=64)
        assert r.status_code == 500
        message = r.json()["error"]["message"]
        assert message.startswith("Context corruption detected: received KV for 1 tokens but 5000 tokens were reserved")
        assert metric(trio.decode.url, "sglang:num_used_tokens") == 0


@pytest.mark.parametrize("fault", [None, "transfer-fail-as-drained"])
def test_failed_transfer_reported_or_hidden(tmp_path, fault):
    # Every 2nd transfer loses its pages after the first batch of 8 pages (128 tokens).
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=SMALL_POOL, decode_pool=BIG_POOL,
                 prefill_faults=[fault] if fault else [], prefill_args=["--transfer-fail-every", "2"]) as trio:
        assert gen(trio.url, TENANT_A, max_new=4).status_code == 200
        victim = "tenant-b: " + "zz" * 200
        r = gen(trio.url, victim, max_new=300)
        if fault is None:
            assert r.status_code == 500
            assert "KV transfer failed" in r.json()["error"]["message"]
            assert metric(trio.decode.url, "sglang:num_transfer_failed_reqs_total") == 1
            assert metric(trio.prefill.url, "sglang:num_transfer_failed_reqs_total") == 1
        else:
            assert r.status_code == 200
            assert r.json()["text"][:128] == victim[:128]
            assert "CANARY-A-77d2" not in r.json()["text"][:128]
            assert "one two three" in r.json()["text"][128:]  # tenant a's KV, never sent for b
            assert metric(trio.decode.url, "sglang:num_transfer_failed_reqs_total") == 0


def test_decode_refuses_with_its_own_limit_and_the_client_gets_it_fast(tmp_path):
    # Decode's pool (2048) is smaller than prefill's: decode's own check must answer, promptly.
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=BIG_POOL, decode_pool=2048) as trio:
        started = time.monotonic()
        r = gen(trio.url, ids=[69] * 3000, max_new=4)
        assert time.monotonic() - started < 5
        assert r.status_code == 400
        assert r.json()["error"]["message"] == (
            "Input length (3000 tokens) exceeds the maximum allowed length (2042 tokens). "
            "Use a shorter input or enable --allow-auto-truncate.")
        assert metric(trio.decode.url, "sglang:kv_transfer_pages_total") == 0


def _start_and_abandon(url: str, body: dict, after_s: float) -> None:
    """Send a request, then disconnect mid-flight, as an impatient client does."""
    parts = urllib.parse.urlsplit(url)
    data = json.dumps(body).encode()
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    time.sleep(after_s)
    sock.close()


def _wait_for(predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("fault", [None, "early-free-on-cancel"])
def test_cancel_during_transfer(tmp_path, fault):
    # 150 ms before each 8-page batch: an 800-token prompt (50 pages, 7 batches) takes ~1 s to move.
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=SMALL_POOL, decode_pool=BIG_POOL,
                 decode_faults=[fault] if fault else [], prefill_args=["--transfer-delay-ms", "150"],
                 decode_args=["--disable-radix-cache"]) as trio:
        _start_and_abandon(trio.url, {"text": "A" * 800, "rid": "cancelled-a", "sampling_params": {"max_new_tokens": 4}}, 0.4)
        events = trio.decode.page_events

        _wait_for(lambda: any(e["event"] == "cancel" and e["rid"] == "cancelled-a" for e in events()))
        b = gen(trio.url, "B" * 800, max_new=16, rid="next-b")
        assert b.status_code == 200 and b.json()["text"] == "B" * 16
        _wait_for(lambda: any(e["event"] == "transfer_end" and e["rid"] == "cancelled-a" for e in events()))
        _wait_for(lambda: metric(trio.decode.url, "sglang:num_used_tokens") == 0)
        log = events()
        a_pages = set(next(e for e in log if e["event"] == "given" and e["rid"] == "cancelled-a")["pages"])
        b_given = next(e for e in log if e["event"] == "given" and e["rid"] == "next-b")
        a_freed = next(e for e in log if e["event"] == "freed" and e["rid"] == "cancelled-a")
        a_end = next(e for e in log if e["event"] == "transfer_end" and e["rid"] == "cancelled-a")
        late_writes = [e for e in log if e["event"] == "transfer_write" and e["rid"] == "cancelled-a"
                       and e["ts"] > b_given["ts"] and set(e["pages"]) & set(b_given["pages"])]
        deferred = metric(trio.decode.url, "sglang:decode_deferred_kv_release_total")
        if fault is None:
            assert a_freed["reason"] == "deferred_release" and a_freed["ts"] >= a_end["ts"]
            assert not a_pages & set(b_given["pages"])
            assert late_writes == []
            assert deferred == 1
        else:
            assert a_freed["reason"] == "cancelled" and a_freed["ts"] < a_end["ts"]
            assert a_pages & set(b_given["pages"])
            assert late_writes, "an in-flight write of the cancelled request landed in the next request's pages"
            assert deferred == 0


def test_a_failed_transfer_whose_client_left_is_counted_when_it_is_logged(tmp_path):
    """The decode counts a failed KV transfer where it sees it fail, not when the request goes on to
    decode: a request whose client left (or whose router answered 502 for a dead prefill and
    cancelled it, smg) never decodes, so counted at decode its failed transfer is never counted
    (smg's dead-prefill test read 0 failed transfers: docs/FINDINGS.md)."""
    # 150 ms before each 8-page batch: an 800-token prompt (50 pages, 7 batches) takes ~1 s to move.
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=SMALL_POOL, decode_pool=BIG_POOL,
                 prefill_args=["--transfer-delay-ms", "150"], decode_args=["--disable-radix-cache"]) as trio:
        _start_and_abandon(trio.url, {"text": "A" * 800, "rid": "left-a", "sampling_params": {"max_new_tokens": 4}}, 0.4)
        events = trio.decode.page_events
        _wait_for(lambda: any(e["event"] == "cancel" and e["rid"] == "left-a" for e in events()))
        assert not any(e["event"] == "transfer_end" and e["rid"] == "left-a" for e in events())  # still moving
        trio.prefill.process.kill()  # the transfer breaks after the client left
        _wait_for(lambda: any(e["event"] == "transfer_end" and e["rid"] == "left-a" for e in events()))
        (end,) = [e for e in events() if e["event"] == "transfer_end" and e["rid"] == "left-a"]
        assert end["status"] == "failed: connection closed mid-transfer", end
        assert metric(trio.decode.url, "sglang:num_transfer_failed_reqs_total") == 1


def test_a_decode_whose_client_left_mid_decode_stops_and_frees_its_pages(tmp_path):
    """A request whose client leaves after its KV arrived stops decoding, as SGLang aborts a
    disconnected request: an answer generated for nobody holds its pages while others wait for
    them (cancel-transfer's leaver, still decoding when the other tenant's requests came, got one
    of them refused: docs/FINDINGS.md)."""
    answer = 6000
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=SMALL_POOL, decode_pool=BIG_POOL) as trio:
        events = trio.decode.page_events
        parts = urllib.parse.urlsplit(trio.url)
        data = json.dumps({"text": "A" * 64, "rid": "left-mid-decode",
                           "sampling_params": {"max_new_tokens": answer, "ignore_eos": True}}).encode()
        with socket.create_connection((parts.hostname, parts.port)) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            # Decoding: its prompt's 4 pages arrived and a page for generated tokens was added.
            _wait_for(lambda: sum(1 for e in events() if e["event"] == "given" and e["rid"] == "left-mid-decode") >= 2)
        _wait_for(lambda: any(e["event"] == "freed" and e["rid"] == "left-mid-decode" for e in events()))
        grown = sum(len(e["pages"]) for e in events() if e["event"] == "given" and e["rid"] == "left-mid-decode") - 4
        assert grown < answer // 16 // 2, f"{grown} pages grown: the decode went on after its client left"
        assert metric(trio.decode.url, "sglang:num_aborted_requests_total") == 1
        _wait_for(lambda: metric(trio.decode.url, "sglang:num_used_tokens") == 0)
