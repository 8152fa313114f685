"""Roles without overrides and the pd-transfer check against real builtin prefill/decode/router
processes on 127.0.0.1 (stopped by PID by the testbed): `check --entry ROUTER` alone finds both
engines and their roles; the KV of every probe that reached the decode moved there, unless the
decode recomputes the prompt (fault decode-recompute), which only pd-transfer can see."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support.builtin_testbed import pd_trio
from support.schemas import parsed

CONTEXT, POOL = 2048, 4096
CANARY_PREFILL_POOL = 1024  # smaller than the context: the over-pool probe meets reject-continues


def check(*args: str) -> tuple[int, dict, str]:
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--format", "json", "--timeout", "20", *args],
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, parsed(proc.stdout) if proc.stdout.strip() else {}, proc.stderr


def result(report: dict, check_id: str) -> dict:
    (found,) = [c for c in report["checks"] if c["id"] == check_id]
    return found


def test_entry_alone_finds_both_engines_with_their_roles_and_the_kv_moved(tmp_path: Path) -> None:
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=POOL, decode_pool=POOL) as trio:
        code, report, err = check("--entry", trio.router.url)
    assert code == 0, ({c["id"]: c["message"] for c in report.get("checks", []) if c["status"] != "pass"}, err[-1500:])
    engines = {e["url"]: (e["role"], e["role_source"]) for e in report["engines"]}
    assert engines == {trio.prefill.url: ("prefill", "engine"), trio.decode.url: ("decode", "engine")}
    transfer = result(report, "pd-transfer")
    assert transfer["status"] == "pass"
    assert "boundary-accept: 2,041 prompt tokens sent, decode received KV for 2,041 tokens and computed 0" in transfer["message"]
    assert all(p["verdict"] == "moved" and p["decode_computed_tokens"] == 0 for p in transfer["evidence"]["probes"])


def test_overrides_still_win_and_say_so(tmp_path: Path) -> None:
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=POOL, decode_pool=POOL) as trio:
        code, report, err = check("--entry", trio.router.url, "--capacity-only",
                                  "--endpoint", f"prefill={trio.prefill.url}", "--endpoint", f"prefill={trio.decode.url}")
    assert code in (0, 3), err[-1500:]
    decode = next(e for e in report["engines"] if e["url"] == trio.decode.url)
    assert (decode["role"], decode["role_source"]) == ("prefill", "override")
    assert "role prefill given on the command line; the engine reports decode" in decode["notes"]
    assert any("lists it as decode; kept prefill (override)" in note for note in decode["notes"])


def test_a_decode_that_recomputes_the_prompt_fails_pd_transfer_and_nothing_else(tmp_path: Path) -> None:
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=POOL, decode_pool=POOL,
                 decode_faults=["decode-recompute"]) as trio:
        code, report, err = check("--entry", trio.router.url)
    assert code == 1, err[-1500:]
    failed = {c["id"] for c in report["checks"] if c["status"] == "fail"}
    assert failed == {"pd-transfer"}, failed
    message = result(report, "pd-transfer")["message"]
    # exactly the probe's own tokens: the calibration requests sent just before are not counted to it
    assert ("boundary-accept: 2,041 prompt tokens sent, decode received KV for 2,041 tokens and computed 2,041 tokens itself: "
            "the decode recomputed the prompt") in message, message


def test_a_kv_canary_violation_fails_the_check_it_falls_in(tmp_path: Path) -> None:
    """The engine's own KV canary (SGLang --kv-canary, which the builtin engine takes too): with
    the incident's faults (a prefill that lets an over-pool prompt flow on as a 1-token
    placeholder, a decode that does not count what arrived) the decode reads KV that is not the
    request's, its canary logs SGLang's violation line, and pd-transfer fails quoting slot and
    position. (With the canary off, engine-advisories' notes name --kv-canary: the unit tier shows
    that, tests/unit/test_sglang_adapter.py.)"""
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=CANARY_PREFILL_POOL, decode_pool=POOL,
                 prefill_faults=["reject-continues"], decode_faults=["no-transfer-check"],
                 decode_args=["--kv-canary", "log"]) as trio:
        code, report, err = check("--entry", trio.router.url, "--log", f"{trio.decode.url}={trio.decode.log_path}")
        decode_log = trio.decode.log_text()
    assert code == 1, err[-1500:]
    decode = next(e for e in report["engines"] if e["url"] == trio.decode.url)
    assert decode["settings"]["kv_canary"] == "log"
    assert "kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=verify_token slot_idx=" in decode_log
    transfer = result(report, "pd-transfer")
    assert transfer["status"] == "fail", transfer["message"]
    assert "the engine's own KV canary found KV slots not holding what was written" in transfer["message"]
    assert f'{trio.decode.url} log: "kv_canary violation (slot_idx=' in transfer["message"]
    assert "fail_reason=verify_token" in transfer["message"]
    advisories = next(c for c in report["checks"] if c["id"] == "engine-advisories" and c["endpoint"] == trio.decode.url)
    assert "KVPF-BUILTIN-0003" not in [n["id"] for n in advisories["evidence"]["notes"]]  # on: nothing to recommend


def test_plan_says_before_sending_that_a_near_context_prompt_outlives_the_decodes_pd_wait(tmp_path: Path, monkeypatch) -> None:
    """A prefill throttled to 500 tokens/s (a slow accelerator) and a decode that waits 2 s for
    the KV (SGLANG_DISAGGREGATION_WAITING_TIMEOUT, which the builtin engine states): `--plan`
    measures the speed with its one calibration request and says, before any probe is sent, that
    a prompt at the limit outlives the setting. (A check then fails pd-transfer naming it: the next
    test.)"""
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "2")
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=POOL, decode_pool=POOL,
                 prefill_args=["--prefill-tokens-per-second", "500"]) as trio:
        proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--entry", trio.router.url, "--plan"],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-1500:]
    (said,) = [line for line in proc.stdout.splitlines() if "before sending:" in line]
    assert "a prompt of 2,041 tokens takes about" in said, said
    assert f"longer than SGLANG_DISAGGREGATION_WAITING_TIMEOUT 2 s at {trio.decode.url}: every prompt that long outlives it" in said


def test_a_stated_pd_wait_shorter_than_a_prompt_at_the_limit_fails_pd_transfer_naming_it(tmp_path: Path, monkeypatch) -> None:
    """Issue 27, item 2, end to end: the same throttled prefill (1,000 tokens/s) and a decode that
    waits 1 s for the KV. `check` sends the prompt at the limit, times it (about 2 s), and fails
    pd-transfer naming the setting and the fix: the deployment would abort every prompt that long.
    Only the boundary isolation scenario runs (its requests are the capacity probes'): the slow
    prefills are what is tested, not the scenarios."""
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "1")
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=POOL, decode_pool=POOL,
                 prefill_args=["--prefill-tokens-per-second", "1000"]) as trio:
        code, report, err = check("--entry", trio.router.url, "--scenario", "boundary", "--deadline", "120")
    assert report, err[-1500:]
    transfer = result(report, "pd-transfer")
    assert code == 1 and transfer["status"] == "fail", (code, transfer["message"], err[-1500:])
    (said,) = transfer["evidence"]["outlived_deadlines"]
    # answered or aborted by the decode's 1 s wait, it is said as it went
    assert re.search(r"a prompt of 2,041 tokens (was answered in|ran) \d+\.\d s( and was not answered)? \(sent and timed\)", said), said
    assert transfer["evidence"]["near_context_time"].startswith("measured: the 2,041-token prompt at the limit "), transfer["evidence"]
    assert f"longer than SGLANG_DISAGGREGATION_WAITING_TIMEOUT 1 s at {trio.decode.url}" in said
    assert "raise SGLANG_DISAGGREGATION_WAITING_TIMEOUT above the longest prompt's time" in transfer["message"]
