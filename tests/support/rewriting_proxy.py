"""A test gateway in front of one engine that rewrites what passes through it: request bodies
(JSON) on the way in, JSON answers and stream frames and /metrics text on the way out. Streams are
relayed frame by frame, so time to first token still means what it means at the engine. Listens
on 127.0.0.1 only, in a thread of the test process; stopped when the `with` block ends."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from support.threaded_server import serving

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
UPSTREAM_TIMEOUT_S = 600


def _same(_path: str, value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Rewrites:
    """request(path, headers, body) -> body; reply(path, JSON value) -> value (whole answers and each
    `data:` frame); metrics(text) -> text (the /metrics answer)."""

    request: Callable[[str, Mapping[str, str], Any], Any] = lambda _path, _headers, body: body
    reply: Callable[[str, Any], Any] = _same
    metrics: Callable[[str], str] = lambda text: text


@contextmanager
def rewriting_proxy(upstream: str, rewrites: Rewrites) -> Iterator[str]:
    target = urlsplit(upstream)
    host, port = target.hostname or "127.0.0.1", target.port

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # each answer ends when the connection closes: no framing to redo

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
            pass

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            self._relay(None)

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                self._relay(raw)
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            self._relay(json.dumps(rewrites.request(self.path, headers, body)).encode())

        def _relay(self, body: bytes | None) -> None:
            conn = http.client.HTTPConnection(host, port, timeout=UPSTREAM_TIMEOUT_S)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                conn.request(self.command, self.path, body=body, headers=headers)
                reply = conn.getresponse()
                self.send_response(reply.status)
                kind = reply.getheader("Content-Type") or ""
                for name, value in reply.getheaders():
                    if name.lower() not in HOP_HEADERS:
                        self.send_header(name, value)
                self.end_headers()
                if "text/event-stream" in kind:
                    while line := reply.readline():
                        self.wfile.write(self._frame(line))
                        self.wfile.flush()
                    return
                data = reply.read()
                if self.path.startswith("/metrics"):
                    data = rewrites.metrics(data.decode()).encode()
                elif "json" in kind:
                    data = json.dumps(rewrites.reply(self.path, json.loads(data))).encode()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client left (the disconnect probes do it on purpose)
            finally:
                conn.close()

        def _frame(self, line: bytes) -> bytes:
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                return line
            return b"data: " + json.dumps(rewrites.reply(self.path, json.loads(line[5:]))).encode() + b"\n"

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with serving(server) as url:
        yield url
