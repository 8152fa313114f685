"""The raw disconnect probes send the adapter's own request, its request-id header included (vLLM
takes the id as `X-Request-Id`), so a danger line naming an abandoned request can say which."""

from __future__ import annotations

import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.engines.vllm import VllmAdapter
from kvpreflight._internal.probes import disconnect
from kvpreflight._internal.probes.disconnect import AFTER_FIRST_TOKEN, RawTarget, leave_after_first_token, leave_during_transfer


def test_an_abandoned_request_carries_the_adapters_request_id_header() -> None:
    seen: dict[str, str] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
            pass

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.update({k.lower(): v for k, v in self.headers.items()})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        adapter = VllmAdapter(f"http://127.0.0.1:{server.server_address[1]}", HttpClient())
        request = adapter.with_request_id(adapter.build_request([1, 2, 3], max_tokens=4, stream=True))
        departure = leave_after_first_token(RawTarget(adapter, request, {"X-Tenant": "a"}, timeout_s=5), read_budget_s=5)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert departure.left == AFTER_FIRST_TOKEN
    assert request.request_id and request.request_id.startswith("kvpreflight-")
    assert seen["x-request-id"] == request.request_id and seen["x-tenant"] == "a"


def test_waiting_for_the_gauge_leaves_the_engine_idle_as_long_as_each_scrape_took(monkeypatch: pytest.MonkeyPatch) -> None:
    """A heavy /metrics (vLLM's, ~60 ms on 2 cores) scraped back to back kept the decode's API
    server too busy to take the router's decode leg for the whole wait: the poll idles at least as
    long as each scrape took, so the scrapes hold the engine at most about half the time. On a
    simulated clock (each scrape 50 ms, each idle as long as the poll sleeps): no wall-clock
    figure, so a loaded machine cannot move it. The engine holds its answer meanwhile (one that
    has answered ends the wait: the test below)."""
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
            pass

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            release.wait(10)
            self.send_response(200)
            self.end_headers()

    now = [0.0]
    idled: list[float] = []
    scrapes: list[float] = []

    def sleep(seconds: float) -> None:
        idled.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(disconnect, "time", types.SimpleNamespace(monotonic=lambda: now[0], sleep=sleep))

    def slow_gauge() -> bool:
        scrapes.append(0.05)  # one scrape of a heavy /metrics
        now[0] += 0.05
        return False

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        adapter = VllmAdapter(f"http://127.0.0.1:{server.server_address[1]}", HttpClient())
        request = adapter.build_request([1, 2, 3], max_tokens=4, stream=False)
        departure = leave_during_transfer(RawTarget(adapter, request, {}, timeout_s=5), slow_gauge, unified=False, wait_s=2.0)
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert departure.left is None and departure.note == "no used-token gauge rose within 2.0 s"
    # back to back, 2 s of 50 ms scrapes would be 40; idling as long as each took leaves 20
    assert len(scrapes) == 20 and idled == pytest.approx([0.05] * 20), (len(scrapes), idled)
    assert sum(scrapes) / now[0] == pytest.approx(0.5)


def test_an_engine_that_answers_before_its_gauge_rises_ends_the_wait_with_what_it_said() -> None:
    """A short prompt on a fast engine is served before any used-token gauge shows it (the vLLM
    pair with one OpenMP thread per engine: the leaver's whole answer in under a second). The
    probe stops waiting as soon as the answer is there, keeps it for the scan, and says why the
    disconnect missed its moment; before, it waited out the budget (62 s in one real check)."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
            pass

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"choices": [{"text": "KVPF-TENANTB-0123"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.flush()
            # The body apart from the headers, as an engine under load may send them: a canary in
            # the body must be found even though only the headers had arrived when the probe
            # started reading (docs/FINDINGS.md, "cancel-transfer scanned the headers alone").
            time.sleep(0.2)
            self.wfile.write(body[:20])
            self.wfile.flush()
            time.sleep(0.1)
            self.wfile.write(body[20:])

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scrapes = []
    try:
        adapter = VllmAdapter(f"http://127.0.0.1:{server.server_address[1]}", HttpClient())
        request = adapter.build_request([1, 2, 3], max_tokens=4, stream=False)
        started = time.monotonic()
        departure = leave_during_transfer(RawTarget(adapter, request, {}, timeout_s=30), lambda: scrapes.append(1) or False,
                                          unified=False, wait_s=30.0)
        waited = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert departure.left is None and departure.note == "the engine answered before any used-token gauge rose"
    assert b"KVPF-TENANTB-0123" in departure.received
    assert waited < 10, f"waited {waited:.1f} s of a 30 s budget for an answer that had arrived"
