"""Small helpers shared by the engine and router HTTP handlers (stdlib http.server)."""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def send_json(handler: BaseHTTPRequestHandler, status: int, obj: object) -> None:
    send_bytes(handler, status, json.dumps(obj).encode(), "application/json")


def send_bytes(handler: BaseHTTPRequestHandler, status: int, data: bytes, content_type: str) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def client_gone(sock: socket.socket) -> bool:
    """True once the peer closed its end. Connections carry one request (HTTP/1.0), so any
    readable byte would be unexpected; an orderly EOF is how a disconnect shows."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def serve_until_stopped(httpd: ThreadingHTTPServer, on_close: Callable[[], None] | None = None) -> int:
    """Serve until Ctrl-C, then close the listening sockets (SIGTERM simply ends the process)."""
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        if on_close is not None:
            on_close()
    return 0
