"""A tiny in-process HTTP server that answers fixed bodies (copied from an engine's real output)
for the engines that cannot run here. Listens on 127.0.0.1 only; always shut down by the fixture."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Body = bytes | str | dict | list
Route = tuple | Callable[[dict], tuple]  # (status, content_type, body[, headers])


def _encode(body: Body) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body).encode()


@contextlib.contextmanager
def static_server(routes: Mapping[str, Route]) -> Iterator[str]:
    """routes: "GET /path" -> (status, content_type, body) or a function of the JSON request body."""
    requests_seen: list[tuple[str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output clean
            pass

        def _answer(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                payload = json.loads(raw) if raw else {}
            except ValueError:
                payload = {}
            requests_seen.append((f"{method} {self.path}", payload))
            route = routes.get(f"{method} {self.path}")
            extra_headers: dict = {}
            if route is None:
                status, ctype, body = 404, "application/json", {"detail": "Not Found"}
            else:
                status, ctype, body, *more = route(payload) if callable(route) else route
                extra_headers = dict(more[0]) if more else {}  # an optional 4th item: response headers
            data = _encode(body)
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                for name, value in extra_headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout under test): nothing to answer

        def do_GET(self):
            self._answer("GET")

        def do_POST(self):
            self._answer("POST")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        static_server.seen = requests_seen  # type: ignore[attr-defined]
        yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        sock.close()


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def vllm_routes(metrics: str | None = None) -> dict[str, Any]:
    return {
        "GET /v1/models": (200, "application/json", (FIXTURES / "vllm" / "models.json").read_text()),
        "GET /version": (200, "application/json", (FIXTURES / "vllm" / "version.json").read_text()),
        "GET /metrics": (200, "text/plain", metrics if metrics is not None else (FIXTURES / "vllm" / "metrics.txt").read_text()),
    }
