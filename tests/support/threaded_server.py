"""Serve a socketserver-style test server on a daemon thread for the length of a `with` block."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serving(server: socketserver.BaseServer, scheme: str = "http") -> Iterator[str]:
    """The server's URL while it serves; shut down, closed and its thread joined afterwards."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]  # type: ignore[misc]  # TCP servers: (host, port)
        yield f"{scheme}://{host}:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
