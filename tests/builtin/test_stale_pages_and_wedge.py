"""Issue 44's engine faults on the builtin engine (processes on 127.0.0.1, stopped by PID).

pool-in-another-unit is the incident as it happens in production: the pool is stated as per-rank
tokens times a parallel size, consistently in /server_info, the metrics, /v1/loads and both
start-up log lines, so no source contradicts another; a prompt over the true pool (under the
stated one) is not refused but prefilled as a 1-token placeholder and answered, HTTP 200 and
fast, from stale pages that hold a third customer's text (BackgroundTraffic), with every count
reporting the full prompt. Two shapes: unified with P=2, and the prefill of a P/D trio behind the
builtin router with P=4. wedge-after-disconnect: after a client leaves a request in flight the
engine schedules nothing more, /health 200, new requests hang, the used-token gauge stuck; on a
unified engine and on the decode of a trio.

Each fault is shown twice: at the engine, with raw requests (what the engine does, whatever the
checks decide), and through `kvpreflight check` as a user runs it (the verdict the issue asks
for: exit 1 from the named checks; the honest engine with the same background traffic exit 0).
The planted customer marker never reaches any output of a check whose answers carried it.
"""

from __future__ import annotations

import html
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
from proctags import processes_tagged
from record_support import record_text
from support.builtin_testbed import BackgroundTraffic, pd_trio, unified_engine
from support.rewriting_proxy import Rewrites, rewriting_proxy

from kvpreflight._internal.builtin_engine.config import CELL_BYTES, PARALLEL_SIZE_ENV
from kvpreflight.formats import FORMATS, get_format
from kvpreflight.schema import report_from_dict

pytestmark = pytest.mark.alone  # the checks judge answer speeds; the faults' answers are timed here too

CONTEXT = 2048
TRUE_POOL = 1024  # below the context
UNIFIED_P, PD_P = 2, 4  # stated pools 2,048 and 4,096 tokens
HONEST_POOL = 8192
FAST_S = 1.0  # a placeholder answer comes in tens of ms here; computing a prompt takes longer on a loaded host


def metric(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def generate(url: str, text: str, max_new_tokens: int = 64, timeout: float = 60) -> tuple[requests.Response, float]:
    started = time.monotonic()
    resp = requests.post(url + "/generate", json={"text": text, "sampling_params": {"max_new_tokens": max_new_tokens}},
                         timeout=timeout)
    return resp, time.monotonic() - started


def assert_one_unit_everywhere(url: str, log: str, stated: int) -> None:
    """Every source states the same pool: nothing to contradict (misreport-pool's allocator line does)."""
    info = requests.get(url + "/server_info", timeout=10).json()
    assert info["max_total_num_tokens"] == stated and info["internal_states"][0]["memory_usage"]["token_capacity"] == stated
    load = requests.get(url + "/v1/loads", timeout=10).json()["loads"][0]
    assert load["max_total_num_tokens"] == stated and load["memory"]["token_capacity"] == stated
    assert metric(url, "sglang:max_total_num_tokens") == stated
    assert metric(url, "sglang:num_pages") * info["page_size"] == stated
    assert f"KV Cache is allocated. dtype: torch.float32, #tokens: {stated}, KV size: {stated * CELL_BYTES / 2**30:.2f} GB" in log
    assert f"max_total_num_tokens={stated}, " in log and f"context_len={CONTEXT}" in log


def assert_placeholder_answer(entry: str, counting: str, traffic: BackgroundTraffic, n: int) -> None:
    """A prompt over the true pool: HTTP 200, fast, counted in full, answered with the third
    customer's text from stale pages (none of its own prompt)."""
    before = metric(counting, "sglang:prompt_tokens_total")
    own = "q" * n
    resp, took = generate(entry, own)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["meta_info"]["prompt_tokens"] == n
    assert metric(counting, "sglang:prompt_tokens_total") - before >= n
    assert traffic.marker in out["text"], out["text"]
    assert "q" not in out["text"]
    assert took < FAST_S, took


# ---- pool-in-another-unit at the engine ----------------------------------------------------------


def test_unified_pool_in_another_unit_states_one_unit_and_answers_over_the_true_pool_from_stale_pages(tmp_path: Path) -> None:
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=TRUE_POOL, faults=["pool-in-another-unit"],
                        env={PARALLEL_SIZE_ENV: str(UNIFIED_P)}) as engine:
        assert_one_unit_everywhere(engine.url, engine.log_text(), TRUE_POOL * UNIFIED_P)
        with BackgroundTraffic(engine.url) as traffic:
            time.sleep(2)  # the customer's prompts fill (and leave) the pool's pages
            under, _ = generate(engine.url, "u" * 600)  # under the true pool: computed, its own answer
            assert under.status_code == 200 and under.json()["text"] == "u" * 64
            time.sleep(1)
            assert_placeholder_answer(engine.url, engine.url, traffic, 1900)
        assert traffic.sent > 5 and traffic.failed == 0, (traffic.sent, traffic.failed)
        assert all(answer.startswith("order ") for answer in traffic.answers)  # the customer's own answers are honest


def test_pd_prefill_pool_in_another_unit_answers_from_stale_pages_behind_the_router(tmp_path: Path) -> None:
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=TRUE_POOL, decode_pool=HONEST_POOL, page_log=False,
                 prefill_faults=["pool-in-another-unit"], prefill_env={PARALLEL_SIZE_ENV: str(PD_P)}) as trio:
        assert_one_unit_everywhere(trio.prefill.url, trio.prefill.log_text(), TRUE_POOL * PD_P)
        with BackgroundTraffic(trio.url) as traffic:
            time.sleep(2)
            received = metric(trio.decode.url, "sglang:kv_transfer_tokens_total")
            assert_placeholder_answer(trio.url, trio.prefill.url, traffic, 1900)
            # The decode's transfer check passes: the prefill says it sent the whole prompt's KV.
            assert metric(trio.decode.url, "sglang:kv_transfer_tokens_total") - received >= 1900
        assert traffic.failed == 0


# ---- pool-in-another-unit through `kvpreflight check` ------------------------------------------------


def check(*where: str, extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", *where, "--format", "json", *extra],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc


def failing(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """What a wrong exit code is explained by: each failed or inconclusive check and its message."""
    return [f"{c['id']} {c['status']}: {c['message']}" for c in json.loads(proc.stdout)["checks"]
            if c["status"] in ("fail", "inconclusive")]


def statuses(proc: subprocess.CompletedProcess[str]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for c in json.loads(proc.stdout)["checks"]:
        found.setdefault(c["id"], set()).add(c["status"])
    return found


NAMED = ("tenant-isolation", "prompt-integrity", "concurrent-capacity")


def assert_incident_caught(proc: subprocess.CompletedProcess[str], marker: str) -> None:
    found = statuses(proc)
    assert proc.returncode == 1, (proc.returncode, found)
    assert {c for c in NAMED if "fail" in found.get(c, set())} == set(NAMED), found
    assert marker not in proc.stdout and marker not in proc.stderr


def test_check_fails_unified_pool_in_another_unit_with_a_customer_in_the_stale_pages(tmp_path: Path) -> None:
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=TRUE_POOL, faults=["pool-in-another-unit"],
                        env={PARALLEL_SIZE_ENV: str(UNIFIED_P)}) as engine, BackgroundTraffic(engine.url) as traffic:
        proc = check("--endpoint", engine.url)
    assert_incident_caught(proc, traffic.marker)


def test_check_fails_pd_prefill_pool_in_another_unit_with_a_customer_in_the_stale_pages(tmp_path: Path) -> None:
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=TRUE_POOL, decode_pool=HONEST_POOL, page_log=False,
                 prefill_faults=["pool-in-another-unit"], prefill_env={PARALLEL_SIZE_ENV: str(PD_P)},
                 prefill_args=["--transfer-delay-ms", "6"]) as trio, BackgroundTraffic(trio.url) as traffic:
        proc = check("--endpoint", f"prefill={trio.prefill.url}", "--endpoint", f"decode={trio.decode.url}",
                     "--entry", trio.url)
    assert_incident_caught(proc, traffic.marker)


def test_honest_engine_with_the_same_customer_traffic_passes(tmp_path: Path) -> None:
    """The same stated pool (2,048 tokens), truly held: the background customer fails nothing."""
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=TRUE_POOL * UNIFIED_P) as engine, \
            BackgroundTraffic(engine.url) as traffic:
        proc = check("--endpoint", engine.url)
    assert proc.returncode == 0, failing(proc)
    assert traffic.sent > 5 and traffic.failed == 0


def test_honest_trio_with_the_same_customer_traffic_fails_nothing(tmp_path: Path) -> None:
    """The honest P/D trio with the third customer's traffic: no check fails. The customer's KV
    transfers land in the refused probes' counter windows at random (4 of 7 runs once failed
    overcapacity-rejected for it); such a probe is sent again, each time in a window of its own,
    and passes on one with nothing moving. Only all three windows moving is inconclusive (exit 3,
    named as other traffic)."""
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=TRUE_POOL * PD_P, decode_pool=HONEST_POOL, page_log=False,
                 prefill_args=["--transfer-delay-ms", "6"]) as trio, BackgroundTraffic(trio.url) as traffic:
        proc = check("--endpoint", f"prefill={trio.prefill.url}", "--endpoint", f"decode={trio.decode.url}",
                     "--entry", trio.url)
    assert traffic.sent > 5 and traffic.failed == 0
    assert proc.returncode in (0, 3), failing(proc)
    unsure = {c["id"]: c["message"] for c in json.loads(proc.stdout)["checks"] if c["status"] == "inconclusive"}
    assert set(unsure) <= {"overcapacity-rejected"}, unsure
    assert all("while other traffic was on the deployment" in m and "in each of its 3 windows" in m
               for m in unsure.values()), unsure
    assert (proc.returncode == 3) == bool(unsure)


# ---- the planted marker reaches no output ---------------------------------------------------------


def marker_forms(marker: str) -> dict[str, str]:
    """The marker, and the parts any quote of 32 characters or more of the customer's text holds."""
    hexpart = marker.rsplit("-", 1)[1]
    return {"marker": marker, "its hex": hexpart, "customer": "CUSTOMER-SECRET", "secret": "SECRET-"}


def seen_in(outputs: dict[str, str], marker: str) -> list[str]:
    found = []
    for where, text in outputs.items():
        for view in (text, html.unescape(text), json.dumps(text), text.encode("unicode_escape").decode()):
            found += [f"{name} in {where}" for name, form in marker_forms(marker).items() if form in view]
    return sorted(set(found))


def _texts(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return [value] if isinstance(value, str) else []


def test_a_customer_marker_in_the_stale_pages_reaches_no_output(tmp_path: Path) -> None:
    """The check's own answers carried another customer's text (a proxy in front of the engine
    records them: if they did not, this test proves nothing and fails); none of it appears on
    stdout, in the stderr progress lines, in the report in any format, in the GitHub step
    summary, in the signed record (its payload decoded) or in any file the check wrote."""
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "kvpreflight", "keygen", "--out", str(keys)], check=True, capture_output=True,
                   timeout=60)
    out = tmp_path / "out"
    out.mkdir()
    received: list[str] = []

    def keep(_path: str, value: Any) -> Any:
        received.extend(_texts(value))
        return value

    tag = uuid.uuid4().hex
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(out / "step-summary.md"), "KVPREFLIGHT_TEST_TAG": tag}
    with unified_engine(tmp_path / "engine", context_length=CONTEXT, pool_tokens=TRUE_POOL, faults=["pool-in-another-unit"],
                        env={PARALLEL_SIZE_ENV: str(UNIFIED_P)}) as engine, \
            rewriting_proxy(engine.url, Rewrites(reply=keep)) as entry, BackgroundTraffic(engine.url) as traffic:
        time.sleep(1)
        proc = check("--endpoint", entry, env=env,
                     extra=("--record", str(out / "record.dsse.json"), "--sign-key", str(keys / "kvpreflight.key"),
                            "--subject", "image=sha256:" + "a" * 64))
    assert processes_tagged(tag) == set(), "processes left behind"
    # The test can fail: answers the check read carried the customer's marker.
    stale = [text for text in received if traffic.marker in text]
    assert stale, "no answer to the check held the customer's text"
    # ... and the search below finds such an answer, or any 32 characters of it, wherever it is quoted
    # (every cut of the customer's text is tried on its prompt: an answer may stop a few characters
    # after the marker, and the rest of a stale answer need not be the customer's).
    assert seen_in({"a quoted answer": json.dumps({"text": stale[0]})}, traffic.marker)
    sample = traffic.prompt(0)
    uncaught = [sample[i:i + 32] for i in range(len(sample) - 31) if not seen_in({"a cut quote": sample[i:i + 32]},
                                                                                 traffic.marker)]
    assert not uncaught, uncaught[:3]
    assert proc.returncode in (0, 1, 3), proc.stderr[-2000:]
    outputs = {"stdout (json)": proc.stdout, "stderr": proc.stderr}
    report = report_from_dict(json.loads(proc.stdout))
    for fmt in FORMATS:  # every format renders this report
        outputs[f"--format {fmt}"] = get_format(fmt).render(report)
    for path in out.iterdir():
        outputs[path.name] = record_text(path) if path.name.startswith("record") else path.read_text()
    assert "record.dsse.json" in outputs and "step-summary.md" in outputs, sorted(outputs)
    assert seen_in(outputs, traffic.marker) == []


# ---- wedge-after-disconnect ---------------------------------------------------------------------------------


def abandon(url: str, n: int = 1000) -> None:
    """A streamed request whose client leaves once its first bytes came (as the cancel probes do)."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    body = json.dumps({"text": "y" * n, "stream": True,
                       "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert sock.recv(200).startswith(b"HTTP/1.")


def assert_wedged(entry: str, engine: str, abandoned: int) -> None:
    resp, _ = generate(entry, "hello before", max_new_tokens=8)
    assert resp.status_code == 200 and resp.json()["text"] == "hello be"
    assert metric(engine, "sglang:num_used_tokens") == 0
    abandon(entry, abandoned)
    time.sleep(1.5)
    assert requests.get(engine + "/health", timeout=5).status_code == 200
    used = metric(engine, "sglang:num_used_tokens")
    assert used >= abandoned
    with pytest.raises(requests.Timeout):
        generate(entry, "hello after", max_new_tokens=8, timeout=8)
    assert requests.get(engine + "/health", timeout=5).status_code == 200
    assert metric(engine, "sglang:num_used_tokens") == used  # stuck at the abandoned request's tokens


def test_unified_wedge_after_disconnect_health_200_requests_hang_gauge_stuck(tmp_path: Path) -> None:
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=HONEST_POOL, faults=["wedge-after-disconnect"]) as engine:
        assert_wedged(engine.url, engine.url, 1000)


def test_pd_decode_wedge_after_disconnect_behind_the_router(tmp_path: Path) -> None:
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=HONEST_POOL, decode_pool=HONEST_POOL, page_log=False,
                 decode_faults=["wedge-after-disconnect"]) as trio:
        assert_wedged(trio.url, trio.decode.url, 1000)
        assert requests.get(trio.url + "/health", timeout=5).status_code == 200


UNMEASURABLE = ("tenant-isolation", "prefix-cache-isolation")  # their probes run after the first disconnect


def assert_wedge_caught(proc: subprocess.CompletedProcess[str]) -> None:
    found = statuses(proc)
    assert proc.returncode == 1, (proc.returncode, found)
    assert "fail" in found["engine-healthy-after"], found
    assert not any("pass" in found.get(c, set()) for c in UNMEASURABLE), found


def test_check_fails_engine_healthy_after_on_a_unified_wedge(tmp_path: Path) -> None:
    with unified_engine(tmp_path, context_length=CONTEXT, pool_tokens=HONEST_POOL, faults=["wedge-after-disconnect"]) as engine:
        proc = check("--endpoint", engine.url, extra=("--timeout", "10"))
    assert_wedge_caught(proc)


def test_check_fails_engine_healthy_after_on_a_pd_decode_wedge(tmp_path: Path) -> None:
    with pd_trio(tmp_path, context_length=CONTEXT, prefill_pool=HONEST_POOL, decode_pool=HONEST_POOL, page_log=False,
                 decode_faults=["wedge-after-disconnect"], prefill_args=["--transfer-delay-ms", "6"]) as trio:
        proc = check("--endpoint", f"prefill={trio.prefill.url}", "--endpoint", f"decode={trio.decode.url}",
                     "--entry", trio.url, extra=("--timeout", "10"))
    assert_wedge_caught(proc)
