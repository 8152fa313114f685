"""A client that goes away mid-request: the adapter's own request, sent over a raw connection
that is shut down at a chosen moment (while the KV is being written, or after the first
streamed token). HttpClient cannot do this: it always reads an answer to its end."""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from kvpreflight._internal.engines.interface import EngineAdapter, EngineRequest

TRANSFER_START_WAIT_S = 2.0  # at least; then leave anyway (the scenario is reported unconfirmed)
UNIFIED_CANCEL_AFTER_S = 0.02  # a unified engine shows no transfer: leave during prefill
NO_GAUGE_CANCEL_AFTER_S = 0.01
GAUGE_POLL_MIN_S = 0.002
ANSWER_PEEK_BYTES = 1 << 20  # what an answer that came first is read of, to scan it like any other
ANSWER_READ_S = 5.0  # ...and for how long, once it has begun to arrive
AFTER_FIRST_TOKEN = "after the first streamed token"


@dataclass(frozen=True)
class Departure:
    """How a deliberately abandoned request went."""

    left: str | None  # when we closed the connection; None: not at the intended moment
    received: bytes  # what arrived before the close (scanned for markers like any answer)
    note: str | None = None  # why the intended moment was missed


@dataclass(frozen=True)
class RawTarget:
    """Where and how to send: the adapter's URL and request, this tenant's headers."""

    adapter: EngineAdapter
    request: EngineRequest
    headers: Mapping[str, str]
    timeout_s: float
    ca_bundle: str | None = None
    client_cert: str | None = None  # mutual TLS: PEM certificate (with the key when client_key is None)
    client_key: str | None = None


def leave_during_transfer(target: RawTarget, pages_reserved: Callable[[], bool | None], *, unified: bool,
                          wait_s: float = TRANSFER_START_WAIT_S) -> Departure:
    """Send, then close once `pages_reserved()` says the engine reserved pages for the request
    (its KV is being written), or after `wait_s` without that. `pages_reserved` answers None when
    there is no gauge to watch."""
    wait_s = max(wait_s, TRANSFER_START_WAIT_S)
    try:
        with _connection(target) as conn:
            _send(conn, target)
            if unified:
                time.sleep(UNIFIED_CANCEL_AFTER_S)
                return Departure(f"{UNIFIED_CANCEL_AFTER_S * 1000:.0f} ms after sending (during prefill)", b"")
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if (answer := _arrived(conn)) is not None:
                    # Served before the gauge showed it (a short prompt on a fast engine): nothing
                    # is left to leave, and waiting out the budget would only cost time.
                    said = "answered" if answer else "closed the connection"
                    return Departure(None, answer, f"the engine {said} before any used-token gauge rose")
                asked = time.monotonic()
                reserved = pages_reserved()
                scrape_s = time.monotonic() - asked
                if reserved:
                    return Departure("after its pages were reserved (used-token gauge rose)", b"")
                if reserved is None:
                    time.sleep(NO_GAUGE_CANCEL_AFTER_S)
                    return Departure(f"{NO_GAUGE_CANCEL_AFTER_S * 1000:.0f} ms after sending (no used-token gauge to watch)", b"")
                # Idle at least as long as the scrape took: back-to-back scrapes of a heavy /metrics
                # (vLLM's, ~60 ms each on 2 cores) kept the decode's API server busy enough that
                # the router's decode leg did not get in for the whole wait (docs/FINDINGS.md).
                time.sleep(max(GAUGE_POLL_MIN_S, scrape_s))
            return Departure(None, b"", f"no used-token gauge rose within {wait_s:.1f} s")
    except (OSError, http.client.HTTPException) as exc:
        return Departure(None, b"", f"{type(exc).__name__} before the disconnect")


def leave_after_first_token(target: RawTarget, read_budget_s: float) -> Departure:
    """Send a streamed request and close right after its first data frame."""
    received = b""
    try:
        with _connection(target) as conn:
            _send(conn, target)
            resp = conn.getresponse()
            deadline = time.monotonic() + read_budget_s
            while time.monotonic() < deadline:
                line = resp.fp.readline()
                if not line:
                    return Departure(None, received, "the answer ended before a token was streamed")
                received += line
                text = line.decode("utf-8", errors="replace").strip()
                if text.startswith("data:") and text[5:].strip() not in ("", "[DONE]"):
                    if '"error"' in text:
                        return Departure(None, received, "the engine answered with an error frame")
                    return Departure(AFTER_FIRST_TOKEN, received)
            return Departure(None, received)
    except (OSError, http.client.HTTPException) as exc:
        return Departure(None, received, f"{type(exc).__name__} before the disconnect")


def _arrived(conn: http.client.HTTPConnection) -> bytes | None:
    """None while the engine has sent nothing (never waits for it); once it has begun to answer,
    the whole answer: its body read to the end (ANSWER_PEEK_BYTES at most, within
    ANSWER_READ_S), b"" where it closed the connection instead. Not the bytes that happen to be
    there: an engine that writes its headers apart from its body would leave the body, and a
    canary in it, unscanned."""
    sock = conn.sock
    if sock is None or not select.select([sock], [], [], 0)[0]:
        return None
    deadline = time.monotonic() + ANSWER_READ_S
    body = b""
    try:
        sock.settimeout(ANSWER_READ_S)
        resp = conn.getresponse()
        while len(body) < ANSWER_PEEK_BYTES and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            chunk = resp.read1(ANSWER_PEEK_BYTES - len(body))
            if not chunk:
                break
            body += chunk
    except (OSError, http.client.HTTPException):
        pass  # closed, reset or cut short: what was read is what it said
    return body


@contextlib.contextmanager
def _connection(target: RawTarget) -> Iterator[http.client.HTTPConnection]:
    """A connection that is shut down hard (both directions) on the way out, as a client that
    goes away: the engine sees the socket close, not a polite end of the request."""
    parts = urlsplit(target.adapter.url)
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=target.ca_bundle) if target.ca_bundle else ssl.create_default_context()
        if target.client_cert:
            context.load_cert_chain(target.client_cert, target.client_key)
        conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=target.timeout_s, context=context)
    else:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=target.timeout_s)
    try:
        yield conn
    finally:
        if conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()


def _send(conn: http.client.HTTPConnection, target: RawTarget) -> None:
    path = urlsplit(target.adapter.url).path + target.request.path
    headers = {"Content-Type": "application/json", "User-Agent": "kvpreflight", **target.headers, **target.request.headers}
    conn.request("POST", path, body=json.dumps(target.request.body), headers=headers)
