"""smg (Shepherd Model Gateway 1.13.0, SGLang's PD router) in front of a builtin prefill/decode
pair: the builtin engine speaks SGLang's PD protocol (bootstrap server owned by the prefill, KV
found by room), so smg fronts it as it fronts SGLang. Real processes on 127.0.0.1, stopped by PID.

These tests need the smg binary (scripts/setup_engines.sh --only smg) and fail, never
skip, when it is not installed (the suite's setup installs it).

Sizes as in test_builtin_engine.py: context 8192; prefill pool 4096 (a 5000-token prompt is over
it), decode pool 16384.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from support.builtin_requests import gen
from support.builtin_testbed import HOST, RunningEngine, free_port, start_engine, stop_engine
from support.demo_runs import run_demo, statuses, unpassed

from kvpreflight._internal.demo import find_smg
from kvpreflight.errors import ConfigError

CONTEXT = 8192
SMALL_POOL = 4096
BIG_POOL = 16384
TENANT_A = "tenant-a prompt: CANARY-A-5f1c9e secret roadmap " + "alpha bravo charlie delta " * 12
OVER_POOL_MSG = ("Input length (5000 tokens) exceeds the maximum allowed length (4090 tokens). "
                 "Use a shorter input or enable --allow-auto-truncate.")
TIMEOUT = 30


@pytest.fixture(scope="module")
def smg() -> str:
    try:
        return find_smg()
    except ConfigError as exc:
        pytest.fail(f"smg is not installed (scripts/setup_engines.sh installs it): {exc}", pytrace=False)


@dataclass
class SmgPair:
    prefill: RunningEngine
    decode: RunningEngine
    router: subprocess.Popen
    url: str
    bootstrap_port: int


def _start_smg(binary: str, workdir: Path, prefill: RunningEngine, bootstrap_port: int, decode: RunningEngine,
               router_args: Sequence[str] = ()) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [binary, "launch", "--pd-disaggregation", "--prefill", prefill.url, str(bootstrap_port),
            "--decode", decode.url, "--backend", "sglang", "--host", HOST, "--port", str(port),
            "--prometheus-host", HOST, "--prometheus-port", str(free_port()), *router_args]
    with open(workdir / "smg.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"smg exited with {proc.returncode}: {(workdir / 'smg.log').read_text()[-2000:]}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url + "/readiness", timeout=2).status_code == 200:
                return proc, url
        time.sleep(0.2)
    _stop(proc)
    raise RuntimeError(f"smg at {url} not ready after 60 s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@contextlib.contextmanager
def smg_pair(binary: str, workdir: Path, *, prefill_faults: Sequence[str] = (), decode_faults: Sequence[str] = (),
             prefill_args: Sequence[str] = (), decode_args: Sequence[str] = (),
             router_args: Sequence[str] = ()) -> Iterator[SmgPair]:
    bootstrap_port = free_port()
    started: list[RunningEngine] = []
    router = None
    try:
        prefill = start_engine("prefill", workdir, context_length=CONTEXT, pool_tokens=SMALL_POOL, faults=prefill_faults,
                               page_log=True, extra_args=["--disaggregation-bootstrap-port", str(bootstrap_port), *prefill_args])
        started.append(prefill)
        decode = start_engine("decode", workdir, context_length=CONTEXT, pool_tokens=BIG_POOL, faults=decode_faults,
                              page_log=True, extra_args=decode_args)
        started.append(decode)
        router, url = _start_smg(binary, workdir, prefill, bootstrap_port, decode, router_args)
        yield SmgPair(prefill, decode, router, url, bootstrap_port)
    finally:
        if router is not None:
            _stop(router)
        for engine in reversed(started):
            stop_engine(engine)


def metric(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=TIMEOUT).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def wait_for(predicate, timeout_s: float = 15.0) -> None:  # noqa: ANN001 - any zero-argument callable
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def events(engine: RunningEngine, kind: str, rid: str | None = None) -> list[dict]:
    return [e for e in engine.page_events() if e["event"] == kind and (rid is None or e["rid"] == rid)]


# ---- a correct pair behind smg ----------------------------------------------------------------------


# The tests that share the module's pair run in one worker (scripts/test.sh runs this tier's modules
# three at a time, `--dist loadgroup`): the pair boots once; the demos, each with its own engines, spread.
SMG_PAIR_WORKER = pytest.mark.xdist_group("smg-pair")


@pytest.fixture(scope="module")
def pair(smg: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmgPair]:
    with smg_pair(smg, tmp_path_factory.mktemp("smg-pair")) as running:
        yield running


@SMG_PAIR_WORKER
def test_completion_through_smg_takes_its_kv_from_the_prefills_bootstrap_server(pair: SmgPair):
    info = requests.get(pair.prefill.url + "/server_info", timeout=TIMEOUT).json()
    assert info["disaggregation_bootstrap_port"] == pair.bootstrap_port  # the port smg was told
    sent = metric(pair.prefill.url, "sglang:kv_transfers_total")
    pages = metric(pair.decode.url, "sglang:kv_transfer_pages_total")
    r = gen(pair.url, TENANT_A, max_new=40, rid="through-smg")
    assert r.status_code == 200, r.text
    assert r.json()["text"] == TENANT_A[:40]
    assert metric(pair.prefill.url, "sglang:kv_transfers_total") == sent + 1
    assert metric(pair.decode.url, "sglang:kv_transfer_pages_total") == pages + -(-len(TENANT_A) // 16)
    # smg chose the room; the decode found the prefill's pages under it.
    (decode_start,) = events(pair.decode, "transfer_start", "through-smg")
    (prefill_start,) = events(pair.prefill, "transfer_start", "through-smg")
    assert decode_start["room"] == prefill_start["room"]
    assert metric(pair.decode.url, "sglang:num_used_tokens") == 0
    c = requests.post(pair.url + "/v1/completions", json={"model": "kvpreflight-builtin-copy", "prompt": "0123456789",
                                                          "max_tokens": 5}, timeout=TIMEOUT)
    assert c.status_code == 200 and c.json()["choices"][0]["text"] == "01234"


@SMG_PAIR_WORKER
def test_prefill_refusal_reaches_the_client_as_smgs_400_and_the_decode_holds_no_room(pair: SmgPair):
    given = len(events(pair.decode, "given"))
    pages = metric(pair.decode.url, "sglang:kv_transfer_pages_total")
    started = time.monotonic()
    r = gen(pair.url, ids=[66] * 5000, max_new=8)
    assert time.monotonic() - started < 5
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "prefill_bad_request"
    assert OVER_POOL_MSG in error["message"]
    # The decode got the request too (smg sends to both at once) and let it go at once: nothing
    # reserved, nothing moved, nothing running, no bootstrap counted as failed.
    wait_for(lambda: metric(pair.decode.url, "sglang:num_running_reqs") == 0, timeout_s=5)
    assert len(events(pair.decode, "given")) == given
    assert metric(pair.decode.url, "sglang:kv_transfer_pages_total") == pages
    assert metric(pair.decode.url, "sglang:num_used_tokens") == 0
    assert metric(pair.decode.url, "sglang:num_bootstrap_failed_reqs_total") == 0
    assert gen(pair.url, "still serving", max_new=4).json()["text"] == "stil"


# ---- smg and a client that leaves mid-transfer --------------------------------------------------------


def _abandon(url: str, body: dict, after_s: float) -> None:
    parts = urllib.parse.urlsplit(url)
    data = json.dumps(body).encode()
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        time.sleep(after_s)


def test_smg_cancels_the_decode_for_a_plain_request_but_not_for_a_stream(smg: str, tmp_path: Path):
    # 150 ms before each 8-page batch: a 3000-token prompt (188 pages) takes ~3.5 s to move; the
    # client leaves after 1 s, mid-transfer.
    with smg_pair(smg, tmp_path, prefill_args=["--transfer-delay-ms", "150"], decode_args=["--disable-radix-cache"]) as p:
        _abandon(p.url, {"text": "A" * 3000, "rid": "plain-left", "sampling_params": {"max_new_tokens": 4}}, 1.0)
        wait_for(lambda: events(p.decode, "freed", "plain-left"), timeout_s=20)
        _abandon(p.url, {"text": "B" * 3000, "rid": "stream-left", "stream": True,
                         "sampling_params": {"max_new_tokens": 4}}, 1.0)
        wait_for(lambda: events(p.decode, "freed", "stream-left"), timeout_s=20)
        # Plain: smg drops the decode's connection, the decode cancels and defers the release
        # until the transfer drained.
        assert events(p.decode, "cancel", "plain-left")
        assert [e["reason"] for e in events(p.decode, "freed", "plain-left")] == ["deferred_release"]
        # Streamed: smg 1.13.0 keeps the decode's request open after the client left, so the
        # decode runs it to the end (no cancel reaches it while the KV is being written).
        assert events(p.decode, "cancel", "stream-left") == []
        assert "finished" in [e["reason"] for e in events(p.decode, "freed", "stream-left")]
        wait_for(lambda: metric(p.decode.url, "sglang:num_used_tokens") == 0)


def test_prefill_dying_mid_transfer_behind_smg(smg: str, tmp_path: Path):
    with smg_pair(smg, tmp_path, prefill_args=["--transfer-delay-ms", "150"], decode_args=["--disable-radix-cache"]) as p:
        answers: list[requests.Response] = []
        client = threading.Thread(target=lambda: answers.append(gen(p.url, "C" * 3000, max_new=4, rid="prefill-dies")))
        client.start()
        wait_for(lambda: events(p.decode, "transfer_write", "prefill-dies"))
        os.kill(p.prefill.pid, signal.SIGKILL)
        client.join(timeout=TIMEOUT)
        (r,) = answers
        assert r.status_code == 502
        assert p.prefill.url in r.json()["error"]["message"]
        # The decode saw the transfer break, failed the request and gave its pages back at once.
        (end,) = events(p.decode, "transfer_end", "prefill-dies")
        assert end["status"] == "failed: connection closed mid-transfer"
        assert events(p.decode, "freed", "prefill-dies")
        assert metric(p.decode.url, "sglang:num_transfer_failed_reqs_total") == 1
        wait_for(lambda: metric(p.decode.url, "sglang:num_used_tokens") == 0)
        # smg 1.13.0 retried the whole PD request (5 attempts by default); the retries that reached
        # the decode before smg gave up on them could not reach the dead prefill's bootstrap server.
        assert metric(p.decode.url, "sglang:num_bootstrap_failed_reqs_total") >= 1


def test_hung_prefill_behind_smg(smg: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The decode's wait for its prefill, under SGLang's name for it (300 s in SGLang, 60 s by
    # default here): shortened so the test spends seconds, not minutes, on a known timeout.
    decode_wait_s = 15
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(decode_wait_s))
    # smg's retries off: by default (5 attempts, ~10 s each against the hung prefill) they only
    # lengthen the wait before the same 502; what is asserted is the decode's side of the hang
    with smg_pair(smg, tmp_path, router_args=["--disable-retries"]) as p:
        assert gen(p.url, "warm", max_new=2).status_code == 200
        os.kill(p.prefill.pid, signal.SIGSTOP)  # the prefill hangs: it accepts connections, answers nothing
        try:
            answers: list[requests.Response] = []
            started = time.monotonic()
            client = threading.Thread(target=lambda: answers.append(
                requests.post(p.url + "/generate", json={"text": "hang", "sampling_params": {"max_new_tokens": 2}},
                              timeout=300)))
            client.start()
            used = []
            while client.is_alive() and time.monotonic() - started < 280:
                used.append(metric(p.decode.url, "sglang:num_used_tokens"))
                time.sleep(1)
            client.join(timeout=30)
            waited = time.monotonic() - started
        finally:
            os.kill(p.prefill.pid, signal.SIGCONT)
        (r,) = answers
        # The decode gives up on the room after its wait, and smg 1.13.0 (retries off) relays the
        # decode's own error. (With its default retries it tries the whole request 5 times against
        # the hung prefill, ~10 s each, then answers 502 naming the prefill: 70 s of the suite.)
        error = r.json()["error"]
        assert r.status_code == 500 and error["code"] == "decode_internal_error", (r.status_code, r.text[:500])
        assert "Bootstrap with the prefill engine timed out" in error["message"]
        assert decode_wait_s <= waited < decode_wait_s + 60
        # The decode reserves pages only once the prefill says its KV is ready: it held none.
        assert set(used) == {0.0}
        assert metric(p.decode.url, "sglang:num_running_reqs") == 0


# ---- the incident's faults behind smg -------------------------------------------------------------


def test_incident_faults_leak_through_smg_and_the_transfer_check_stops_them(smg: str, tmp_path: Path):
    with smg_pair(smg, tmp_path / "leaky", prefill_faults=["reject-continues"], decode_faults=["no-transfer-check"]) as p:
        assert gen(p.url, TENANT_A, max_new=8).status_code == 200
        leaked = gen(p.url, ids=[66] * 5000, max_new=80)
        assert leaked.status_code == 200  # the incident: HTTP 200 through the real router ...
        assert "CANARY-A-5f1c9e secret roadmap" in leaked.json()["text"]  # ... with tenant A's text
    with smg_pair(smg, tmp_path / "checked", prefill_faults=["reject-continues"]) as p:
        gen(p.url, TENANT_A, max_new=8)
        stopped = gen(p.url, ids=[66] * 5000, max_new=80)
        assert stopped.status_code == 500
        assert "Context corruption detected: received KV for 1 tokens but 5000 tokens were reserved" \
            in stopped.json()["error"]["message"]
        wait_for(lambda: metric(p.decode.url, "sglang:num_used_tokens") == 0)


# ---- kvpreflight demo --router smg --------------------------------------------------------------------


def _demo(tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    return run_demo(tmp_path, "smg", *args)


# Once each here; the same demos several times in a row: benchmarks/bench_demo_stability.py.
def test_demo_behind_smg_passes(smg: str, tmp_path: Path):
    code, report, err = _demo(tmp_path)
    assert code == 0, (unpassed(report), err[-300:])
    assert report["verdict"] == "pass"
    assert [e["role"] for e in report["engines"]] == ["prefill", "decode"]
    found = statuses(report)
    assert all(s <= {"pass", "warn"} for s in found.values()), found
    assert found["overcapacity-rejected"] == {"pass"}
    # Only the cancel-during-transfer scenario may stay unconfirmed: smg does not pass a
    # streamed client's disconnect on to the decode (see the test above).
    iso = next(c for c in report["checks"] if c["id"] == "tenant-isolation")
    assert iso["status"] == "pass" or iso["message"].startswith("cancel-transfer: unconfirmed"), iso["message"]


def test_demo_incident_behind_smg_fails_rejection_and_isolation(smg: str, tmp_path: Path):
    code, report, err = _demo(tmp_path, "--incident")
    assert code == 1, err[-2000:]
    found = statuses(report)
    assert found["overcapacity-rejected"] == {"fail"}
    assert found["tenant-isolation"] == {"fail"}
    iso = next(c for c in report["checks"] if c["id"] == "tenant-isolation")
    assert "canary crossed tenants" in iso["message"]


@pytest.mark.parametrize("args,check_ids", [
    (("--fault", "transfer-fail-as-drained"), ("tenant-isolation",)),
    # three faults that touch three different checks, in one demo (one boot instead of three, as in
    # tests/builtin/test_demo.py): each is still caught by its own check
    (("--fault", "prefix-cache-no-salt", "--fault", "misreport-pool", "--fault", "decode-recompute"),
     ("prefix-cache-isolation", "kv-sources-agree", "pd-transfer")),
    (("--pool-ratio", "0.65", "--fault", "auto-truncate"), ("overcapacity-rejected",)),
    # smg 1.13.0 does not pass a streamed client's disconnect on to the decode: the cancel-transfer
    # probe disconnects from a plain request, which it does pass on.
    (("--fault", "early-free-on-cancel"), ("tenant-isolation",)),
])
def test_each_fault_behind_smg_fails_its_check(smg: str, tmp_path: Path, args: tuple[str, ...], check_ids: tuple[str, ...]):
    code, report, err = _demo(tmp_path, *args)
    assert code == 1, (statuses(report), err[-2000:])
    found = statuses(report)
    assert {c: "fail" in found[c] for c in check_ids} == dict.fromkeys(check_ids, True), found


def _check_entry_alone(url: str) -> tuple[int, dict, str]:
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--entry", url, "--format", "json", "--timeout", "20"],
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr


@SMG_PAIR_WORKER
@pytest.mark.parametrize("decode_faults,transfer", [((), "pass"), (("decode-recompute",), "fail")])
def test_entry_alone_behind_smg_finds_both_engines_and_judges_the_transfer(smg: str, tmp_path: Path, pair: SmgPair,
                                                                            decode_faults: tuple[str, ...], transfer: str):
    """smg lists its workers (GET /workers), so --entry alone names both engines; the decode's
    counters tell whether each probe's KV moved to it. The correct pair is the module's (last in
    the module, so its check's requests touch no other test's counters)."""
    with contextlib.ExitStack() as stack:
        if decode_faults:
            pair = stack.enter_context(smg_pair(smg, tmp_path, decode_faults=decode_faults))
        code, report, err = _check_entry_alone(pair.url)
    assert report, err[-2000:]
    engines = {e["url"]: e["role"] for e in report["engines"]}
    assert engines == {pair.prefill.url: "prefill", pair.decode.url: "decode"}
    (check,) = [c for c in report["checks"] if c["id"] == "pd-transfer"]
    assert check["status"] == transfer, check["message"]
    if transfer == "fail":
        assert "the decode recomputed the prompt" in check["message"] and code == 1
