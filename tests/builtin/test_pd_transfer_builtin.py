"""Roles without overrides and the pd-transfer check against real builtin prefill/decode/router
processes on 127.0.0.1 (stopped by PID by the testbed): `check --entry ROUTER` alone finds both
engines and their roles; the KV of every probe that reached the decode moved there, unless the
decode recomputes the prompt (fault decode-recompute), which only pd-transfer can see."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.schemas import parsed

from kvpreflight.builtin_engine.testbed import pd_trio

CONTEXT, POOL = 2048, 4096


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
    assert "boundary-accept: 2,041 prompt tokens sent, decode received KV for 2,041 tokens and computed 2,041 tokens itself: the decode recomputed the prompt" in message, message
