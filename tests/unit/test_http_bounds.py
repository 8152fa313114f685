"""The HTTP client every adapter and probe uses is bounded in time and memory against servers that
misbehave (issue 12, items 3 and 4), and talks to gateways that require client certificates.

- time: `timeout_s` is the whole request, body included; a server that drips bytes (each read
  inside a per-read timeout) is cut at the deadline, not kept reading for minutes;
- memory: each kind of body has a cap, read incrementally; an endless or 60 MB body ends with an
  error naming the cap, never a silently cut body and never hundreds of MB held;
- mTLS: `HttpClient(client_cert=, client_key=)`, files checked when the client is built, their
  paths and contents in no message.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BufferedIOBase
from pathlib import Path
from typing import Any, TypeVar

import pytest
from misbehaving_http import PeakRss, chunked, drip_body, drip_headers, drip_stream, drip_tls_handshake, fixed, misbehaving_server, sized
from support.cli import invoke

from kvpreflight._internal.engines.errors import EngineConfigError, EngineError
from kvpreflight._internal.engines.http import BodyLimit, BodyTooLarge, EngineTimeout, HttpClient
from kvpreflight.errors import ConfigError

TIMEOUT_S = 2.0
GRACE_S = 2.0  # "ends within its timeout, plus a small grace"
MEMORY_BOUND_MB = 100  # issue 12's target for a 60 MB and an endless body
BIG = 60_000_000
T = TypeVar("T")


def timed(call: Callable[[], T]) -> tuple[T | EngineError, float]:
    """What `call` returned or the EngineError it raised, and how long it took."""
    start = time.monotonic()
    try:
        return call(), time.monotonic() - start
    except EngineError as exc:
        return exc, time.monotonic() - start


# -- time: every request ends by its deadline --------------------------------------------------------

@pytest.mark.parametrize("method", ["get", "get_json", "post"])
def test_a_body_dripped_a_byte_at_a_time_ends_at_the_deadline(method: str) -> None:
    # A byte every 0.5 s: each read is inside any per-read timeout, so only a total deadline ends it.
    with misbehaving_server(drip_body(0.5)) as url:
        client = HttpClient(timeout_s=TIMEOUT_S)
        call = {"get": lambda: client.get(f"{url}/metrics"), "get_json": lambda: client.get_json(f"{url}/v1/models"),
                "post": lambda: client.post(f"{url}/v1/completions", {"prompt": [1]})}[method]
        error, elapsed = timed(call)
    assert isinstance(error, EngineTimeout), error
    assert "within 2s" in str(error) and "total" in str(error)
    assert TIMEOUT_S - 0.1 <= elapsed <= TIMEOUT_S + GRACE_S


def test_headers_dripped_a_byte_at_a_time_end_at_the_deadline() -> None:
    with misbehaving_server(drip_headers(0.5)) as url:
        error, elapsed = timed(lambda: HttpClient(timeout_s=TIMEOUT_S).get(f"{url}/health"))
    assert isinstance(error, EngineTimeout), error
    assert elapsed <= TIMEOUT_S + GRACE_S


def test_a_tls_handshake_dripped_a_byte_at_a_time_ends_at_the_deadline() -> None:
    with misbehaving_server(drip_tls_handshake(0.5), read_request=False) as url:
        error, elapsed = timed(lambda: HttpClient(timeout_s=TIMEOUT_S).get(url.replace("http:", "https:") + "/health"))
    assert isinstance(error, EngineTimeout), error
    assert elapsed <= TIMEOUT_S + GRACE_S


def test_a_per_call_timeout_is_the_total_too() -> None:
    with misbehaving_server(drip_body(0.3)) as url:
        error, elapsed = timed(lambda: HttpClient(timeout_s=60).post(f"{url}/generate", {}, timeout_s=1.5))
    assert isinstance(error, EngineTimeout) and "within 1.5s" in str(error)
    assert elapsed <= 1.5 + GRACE_S


def test_a_dripping_stream_ends_at_the_deadline_keeping_the_frames_before_it() -> None:
    with misbehaving_server(drip_stream(0.3)) as url:
        reply, elapsed = timed(lambda: HttpClient().post_stream(f"{url}/v1/completions", {}, timeout_s=TIMEOUT_S))
    assert not isinstance(reply, EngineError), reply
    assert reply.timed_out
    assert reply.frames[0] == '{"text": "a"}'  # the frame that came before the deadline is evidence
    assert elapsed <= TIMEOUT_S + GRACE_S


def test_an_endless_slow_body_ends_at_the_deadline_before_its_cap() -> None:
    # 64 KiB every 0.1 s never reaches the 16 MiB cap in 2 s: the deadline ends it.
    def slow_endless(out: BufferedIOBase, stop: threading.Event) -> None:
        out.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while not stop.wait(0.1):
            out.write(b"10000\r\n" + b"x" * 65536 + b"\r\n")
            out.flush()

    with misbehaving_server(slow_endless) as url:
        error, elapsed = timed(lambda: HttpClient(timeout_s=TIMEOUT_S).get(f"{url}/metrics"))
    assert isinstance(error, EngineTimeout), error
    assert elapsed <= TIMEOUT_S + GRACE_S


# -- memory: a cap per kind of body ------------------------------------------------------------------

def test_an_endless_chunked_metrics_ends_at_its_cap_with_bounded_memory() -> None:
    with misbehaving_server(chunked(None)) as url:
        with PeakRss() as memory:
            error, elapsed = timed(lambda: HttpClient(timeout_s=TIMEOUT_S).get(f"{url}/metrics", max_bytes=BodyLimit.METRICS))
    assert isinstance(error, BodyTooLarge), error
    assert "16.0 MiB limit for metrics text" in str(error)
    assert error.exit_code == 3  # nothing measured: inconclusive
    assert elapsed <= TIMEOUT_S + GRACE_S
    assert memory.growth_mb < MEMORY_BOUND_MB, memory.growth_mb


@pytest.mark.parametrize("declare", [True, False], ids=["content-length", "no-length"])
def test_a_60_mb_metrics_is_refused_naming_the_cap_with_bounded_memory(declare: bool) -> None:
    with misbehaving_server(sized(BIG, declare=declare)) as url:
        with PeakRss() as memory:
            error, _ = timed(lambda: HttpClient(timeout_s=TIMEOUT_S).get(f"{url}/metrics", max_bytes=BodyLimit.METRICS))
    assert isinstance(error, BodyTooLarge), error
    message = str(error)
    assert "16.0 MiB limit for metrics text" in message
    # how big: the declared size when the server said it, else how far it was read
    assert ("Content-Length 57.2 MiB" in message) if declare else ("stopped reading after 16.1 MiB" in message)
    assert memory.growth_mb < MEMORY_BOUND_MB, memory.growth_mb


def test_a_60_mb_chunked_body_to_a_post_stops_at_the_completion_cap() -> None:
    with misbehaving_server(chunked(BIG, "application/json")) as url:
        with PeakRss() as memory:
            error, _ = timed(lambda: HttpClient(timeout_s=TIMEOUT_S).post(f"{url}/v1/completions", {}))
    assert isinstance(error, BodyTooLarge) and "8.0 MiB limit for a completion" in str(error), error
    assert memory.growth_mb < MEMORY_BOUND_MB, memory.growth_mb


def test_a_plain_get_is_capped_at_16_mib_naming_no_kind() -> None:
    with misbehaving_server(chunked(None)) as url:
        error, _ = timed(lambda: HttpClient(timeout_s=TIMEOUT_S).get(f"{url}/health"))
    assert isinstance(error, BodyTooLarge) and "over the 16.0 MiB limit (stopped reading" in str(error), error


def test_get_json_caps_json_info_at_4_mib() -> None:
    with misbehaving_server(sized(5 * 1024 * 1024, "application/json")) as url:
        error, _ = timed(lambda: HttpClient(timeout_s=TIMEOUT_S).get_json(f"{url}/v1/models"))
    assert isinstance(error, BodyTooLarge) and "4.0 MiB limit for JSON info" in str(error), error


def test_an_endless_event_stream_is_refused_at_its_cap() -> None:
    frame = b'data: {"choices": [{"text": "' + b"y" * 400 + b'"}]}\n\n'
    with misbehaving_server(chunked(None, "text/event-stream", frame * 256)) as url:
        with PeakRss() as memory:
            error, elapsed = timed(lambda: HttpClient().post_stream(f"{url}/v1/completions", {}, timeout_s=TIMEOUT_S,
                                                                      max_bytes=4 * 1024 * 1024))
    assert isinstance(error, BodyTooLarge), error
    assert "over the 4.0 MiB limit" in str(error)
    assert elapsed <= TIMEOUT_S + GRACE_S
    assert memory.growth_mb < MEMORY_BOUND_MB, memory.growth_mb


def test_a_stream_of_tiny_frames_is_refused_before_its_objects_outgrow_its_bytes() -> None:
    # "data:\n" is 6 bytes but a frame kept as a Python string costs ~60: frames are capped too.
    with misbehaving_server(chunked(None, "text/event-stream", b"data:\n" * 10000)) as url:
        with PeakRss() as memory:
            error, _ = timed(lambda: HttpClient().post_stream(f"{url}/v1/completions", {}, timeout_s=TIMEOUT_S))
    assert isinstance(error, BodyTooLarge) and "more than 196,608 frames" in str(error), error
    assert memory.growth_mb < MEMORY_BOUND_MB, memory.growth_mb


# -- honest replies are unaffected ------------------------------------------------------------------

def test_a_body_exactly_at_its_cap_is_read_whole_and_one_byte_more_is_refused() -> None:
    body = b"x" * 1000  # what sized() sends
    for declare in (True, False):
        with misbehaving_server(sized(len(body), declare=declare)) as url:
            assert HttpClient().get(url, max_bytes=1000).body == body
            error, _ = timed(lambda: HttpClient().get(url, max_bytes=999))
        assert isinstance(error, BodyTooLarge) and "999 bytes limit" in str(error), error


def test_honest_json_chunked_and_streamed_replies_read_in_full() -> None:
    models = {"data": [{"id": "m", "max_model_len": 4096}]}
    with misbehaving_server(fixed(json.dumps(models).encode())) as url:
        assert HttpClient().get_json(f"{url}/v1/models") == models
    with misbehaving_server(chunked(3_000_000, block=b"# HELP x\n" * 1000)) as url:
        reply = HttpClient().get(f"{url}/metrics")
    assert reply.status == 200 and len(reply.body) == 3_000_000
    frames = b"".join(b'data: {"i": %d}\r\n\r\n' % i for i in range(2000)) + b"data: [DONE]\n\n"
    with misbehaving_server(fixed(frames, "text/event-stream")) as url:
        stream = HttpClient().post_stream(f"{url}/v1/completions", {}, timeout_s=TIMEOUT_S)
    assert not stream.timed_out
    assert [event["i"] for event in stream.events()] == list(range(2000))
    assert stream.body == frames.replace(b"\r\n", b"\n")


def test_a_deadline_never_ends_the_next_request_on_a_reused_connection() -> None:
    """Keep-alive: after each request its deadline is disarmed, so a later request on the same
    pooled connection is not shut when an earlier request's deadline comes round."""
    connections: set[int] = set()

    class KeepAlive(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            connections.add(id(self.connection))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    server = ThreadingHTTPServer(("127.0.0.1", 0), KeepAlive)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/health"
        client = HttpClient()
        for _ in range(10):
            assert client.get(url, timeout_s=0.3).body == b"ok"
        time.sleep(0.5)  # every deadline above has come and gone
        for _ in range(10):
            assert client.get(url, timeout_s=5).body == b"ok"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert len(connections) == 1  # one connection served all twenty


def test_a_timeout_a_request_cannot_keep_is_a_configuration_error() -> None:
    for bad in (math.nan, math.inf, 0.0, -1.0):
        with pytest.raises(EngineConfigError, match="finite number of seconds above 0") as caught:
            HttpClient().get("http://127.0.0.1:9/health", timeout_s=bad)
        assert caught.value.exit_code == 2


# -- client certificates (mutual TLS) ------------------------------------------------------------------

def test_a_gateway_requiring_a_client_certificate_refuses_a_client_without_one(pki: dict[str, Path], mtls_url: str) -> None:
    with pytest.raises(EngineError) as caught:
        HttpClient(ca_bundle=str(pki["ca"]), timeout_s=5).get_json(f"{mtls_url}/v1/models")
    assert "--client-cert" in str(caught.value)  # the message says what to pass
    assert not isinstance(caught.value, EngineTimeout)


@pytest.mark.parametrize("key", ["separate", "in the certificate file"])
def test_with_the_client_certificate_the_request_succeeds(pki: dict[str, Path], mtls_url: str, key: str) -> None:
    if key == "separate":
        client = HttpClient(ca_bundle=str(pki["ca"]), client_cert=str(pki["client_cert"]), client_key=str(pki["client_key"]))
    else:
        client = HttpClient(ca_bundle=str(pki["ca"]), client_cert=str(pki["client_both"]))
    assert client.get_json(f"{mtls_url}/v1/models") == {"client": "kvpreflight client"}


def _config_error(pki: dict[str, Path], *, client_cert: str | None = None, client_key: str | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        HttpClient(ca_bundle=str(pki["ca"]), client_cert=client_cert, client_key=client_key)
    assert isinstance(caught.value, EngineConfigError) and caught.value.exit_code == 2
    message = str(caught.value)
    assert "\n" not in message
    for path in (client_cert, client_key):
        assert path is None or (path not in message and Path(path).name not in message)
    return message


def test_a_missing_or_unreadable_certificate_file_is_a_configuration_error_naming_the_flag(
        pki: dict[str, Path], tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-cert.pem")
    message = _config_error(pki, client_cert=missing, client_key=str(pki["client_key"]))
    assert message.startswith("--client-cert:") and "no such file" in message
    message = _config_error(pki, client_cert=str(pki["client_cert"]), client_key=missing)
    assert message.startswith("--client-key:") and "no such file" in message
    message = _config_error(pki, client_cert=str(tmp_path), client_key=str(pki["client_key"]))
    assert message.startswith("--client-cert:") and "not a regular file" in message
    assert _config_error(pki, client_key=str(pki["client_key"])).startswith("--client-key needs --client-cert")


def test_a_certificate_file_that_is_not_a_certificate_is_refused_without_showing_it(pki: dict[str, Path],
                                                                                      tmp_path: Path) -> None:
    secret = "sk-live-THIS-MUST-NEVER-BE-PRINTED-0123456789"
    not_pem = tmp_path / "key.txt"
    not_pem.write_text(f"-----BEGIN PRIVATE KEY-----\n{secret}\n-----END PRIVATE KEY-----\n")
    message = _config_error(pki, client_cert=str(pki["client_cert"]), client_key=str(not_pem))
    assert "not a PEM certificate" in message and secret not in message
    message = _config_error(pki, client_cert=str(pki["client_cert"]), client_key=str(pki["stranger_key"]))
    assert "does not belong to the --client-cert certificate" in message
    message = _config_error(pki, client_cert=str(pki["client_cert"]), client_key=str(pki["encrypted_key"]))
    assert "encrypted" in message


def test_a_certificate_file_gone_after_the_client_was_built_is_one_line_without_its_path(
        pki: dict[str, Path], mtls_url: str, tmp_path: Path) -> None:
    cert = tmp_path / "short-lived-cert.pem"
    cert.write_bytes(pki["client_cert"].read_bytes())
    client = HttpClient(ca_bundle=str(pki["ca"]), client_cert=str(cert), client_key=str(pki["client_key"]))
    cert.unlink()
    with pytest.raises(EngineError) as caught:
        client.get_json(f"{mtls_url}/v1/models")
    assert "--client-cert" in str(caught.value) and str(tmp_path) not in str(caught.value)


def test_check_passes_the_client_certificate_to_every_request(pki: dict[str, Path], mtls_url: str) -> None:
    """`check --client-cert/--client-key` end to end: without them the gateway refuses the TLS
    handshake (inconclusive, saying what to pass); with them the engine is reached (what it then
    answers is not an engine, so still inconclusive, but no longer for TLS)."""

    def check(*extra: str) -> dict[str, Any]:
        proc = invoke("check", "--endpoint", mtls_url, "--engine", "vllm",
                               "--capacity-only", "--ca-bundle", str(pki["ca"]), "--format", "json", "--timeout", "5", *extra)
        assert proc.returncode == 3, proc.stderr
        assert str(pki["client_key"]) not in proc.stdout + proc.stderr  # paths never shown
        return json.loads(proc.stdout)

    refused = " ".join(c["message"] for c in check()["checks"])
    assert "--client-cert" in refused
    with_key = check("--client-cert", str(pki["client_cert"]), "--client-key", str(pki["client_key"]))
    reached = " ".join(c["message"] for c in with_key["checks"])
    assert "--client-cert" not in reached and "TLS" not in reached, reached


# -- a connection never made is tried once more -------------------------------------------------

class _Answer(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b'{"choices": [{"text": "ok"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


def test_a_connection_refused_before_anything_was_sent_is_tried_once_more_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """The port is bound but not listening (refused) until the client pauses before its one retry:
    the request then reaches the engine, and the reply says it was sent twice."""
    import types

    import kvpreflight._internal.engines.http as http_module

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer, bind_and_activate=False)
    server.server_bind()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    pauses: list[float] = []

    def pause(seconds: float) -> None:  # the retry's pause: the engine comes up now
        pauses.append(seconds)
        server.server_activate()
        thread.start()

    monkeypatch.setattr(http_module, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=pause))
    host, port = server.server_address[:2]
    try:
        reply = HttpClient(timeout_s=TIMEOUT_S).post(f"http://{host}:{port}/v1/completions", {"prompt": [1]})
    finally:
        if thread.is_alive():
            server.shutdown()
        server.server_close()
    assert reply.status == 200 and json.loads(reply.body)["choices"][0]["text"] == "ok"
    assert pauses == [http_module.RECONNECT_PAUSE_S]
    assert reply.reconnected is not None and "failed before anything was sent (Connection refused); sent again once" in reply.reconnected


def test_a_connection_refused_twice_is_the_usual_error_after_one_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import kvpreflight._internal.engines.http as http_module

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer, bind_and_activate=False)
    server.server_bind()  # never listens
    pauses: list[float] = []
    monkeypatch.setattr(http_module, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=pauses.append))
    host, port = server.server_address[:2]
    try:
        error, _ = timed(lambda: HttpClient(timeout_s=TIMEOUT_S).post(f"http://{host}:{port}/v1/completions", {"prompt": [1]}))
    finally:
        server.server_close()
    assert isinstance(error, EngineError) and "cannot connect (Connection refused)" in str(error), error
    assert len(pauses) == 1
