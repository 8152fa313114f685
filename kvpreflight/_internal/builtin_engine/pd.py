"""The prefill/decode handoff: the bootstrap fields of a request and the TCP wire between the
prefill's side (pd_prefill.py: its bootstrap server, prefill, send the pages) and the decode's
side (pd_decode.py: fetch the room's pages from the prefill, decode). The engine (core.py) only
computes and owns pages; these three modules are what a different handoff protocol replaces.

SGLang's PD protocol (sglang/srt/disaggregation/ of 0.5.23): the router sends each request to one
prefill and to the decode at once, adding `bootstrap_host`/`bootstrap_port` (the PREFILL's
bootstrap server, SGLang's `--disaggregation-bootstrap-port`) and a random `bootstrap_room`. The
decode connects to that bootstrap server and registers the room; the prefill joins the room once
its KV is computed, the decode then reserves pages for ITS prompt and the prefill writes its KV
into them (SGLang's deferred decode allocation: DeferredBootstrap in common/bootstrap.py). A
room the prefill refused leaves a tombstone, so a decode asking for it later is told at once
instead of waiting out its timeout. SGLang splits the bootstrap server (HTTP /route) from the
transfer endpoint (ZMQ, then RDMA); here one TCP port does both.

Wire format: one JSON header line per message, page data as raw float32 bytes after a `pages`
header. Decode -> prefill's bootstrap port:

  {"op": "register", "room": R, "rid": ...}
      prefill answers {"op": "ready", "num_tokens": N, "cached_tokens": C} once its KV is
      computed, or {"op": "failed", "error": ..., "status": S} (refused, unknown room, timed out)
  {"op": "destinations", "reserved_tokens": M, "pages": P}   decode reserved P pages for ITS
      prompt of M tokens (the two counts can differ), or {"op": "abort", "error": ..., "status": S}
  prefill -> {"op": "pages", "first_page": k, "count": c, "nbytes": b} + b bytes  (bounded batches)
  prefill -> {"op": "done", "status": "ok"|"failed", "tokens_sent": T}   decode answers {"ok": true}

  {"op": "abort", "room": R, "error": ..., "status": S} as the first message: decode refused the
      request itself; the prefill's request gets that answer. Prefill answers {"ok": true}.

A connection that sends nothing is a router checking that the port is up (smg does, at start).

Decode writes each batch straight into the pages it reserved for the room (like an RDMA write
into addresses handed out at bootstrap), so a write that is still in flight lands wherever those
pages are now, even if they were freed and handed to someone else.

No torch here: the engine is passed in.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvpreflight._internal.builtin_engine.protocol import RequestError

if TYPE_CHECKING:
    pass

BATCH_PAGES = 8
CONNECT_TIMEOUT_S = 10.0
TRANSFER_IO_TIMEOUT_S = 120.0
REFUSAL_MEMORY_S = 300.0  # how long a room that will never transfer is remembered (a tombstone)
# How long decode keeps a request the prefill refused before answering it with the refusal: the
# router answers the client from the prefill and drops the decode's request (smg and the builtin
# router do), so the client sees the prefill's error, not decode's echo of it.
PREFILL_REFUSAL_GRACE_S = 5.0
# --transfer-fail-every's default under fault transfer-fail-as-drained: the flaky backend it models.
FLAKY_TRANSFER_EVERY = 3
POLL_S = 0.02


# ---- the request's bootstrap fields ------------------------------------------------------------


@dataclass(frozen=True)
class Bootstrap:
    """The prefill's bootstrap server (`host`, `port`) and which room is this request's."""

    host: str
    port: int
    room: int


def bootstrap_from(body: dict[str, Any]) -> Bootstrap:
    room = body.get("bootstrap_room")
    host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
    if not isinstance(room, int) or not isinstance(host, str) or not isinstance(port, int):
        raise RequestError(
            "This engine runs with a disaggregation mode and needs bootstrap_host, bootstrap_port and "
            "bootstrap_room: send requests through the router."
        )
    return Bootstrap(host, port, room)


@dataclass(frozen=True)
class Refusal:
    message: str
    status: int
    at: float  # time.monotonic()


class TransferError(Exception):
    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


def shutdown_socket(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


# ---- the wire --------------------------------------------------------------------------------------


def send_json(sock: socket.socket, obj: dict[str, Any], payload: bytes = b"") -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n" + payload)


class Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def line(self) -> dict[str, Any] | None:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\n", 1)
        message = json.loads(raw)
        if not isinstance(message, dict):
            raise ValueError("a handoff message is not a JSON object")
        return message

    def exactly(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buf)))
            if not chunk:
                return None
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data
