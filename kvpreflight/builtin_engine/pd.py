"""The prefill/decode handoff, all of it: the bootstrap fields of a request, the prefill's side
(its bootstrap server, prefill, send the pages), the decode's side (fetch the room's pages from
the prefill, decode) and the TCP wire between them. The engine (core.py) only computes and owns
pages; this module is what a different handoff protocol replaces.

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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvpreflight.builtin_engine.config import Fault
from kvpreflight.builtin_engine.protocol import BOOTSTRAP_WAIT_S, Generation, GenParams, OnToken, RequestError

if TYPE_CHECKING:
    from kvpreflight.builtin_engine.core import Engine

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
class _Refusal:
    message: str
    status: int
    at: float  # time.monotonic()


class TransferError(Exception):
    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


# ---- prefill side: the bootstrap server and the sender -----------------------------------------


@dataclass
class _Peer:
    """A decode engine's registration for one room, waiting for the prefill's request to join."""

    conn: socket.socket
    reader: _Reader
    rid: str
    taken: bool = False  # by the prefill's request, or refused


class PrefillBootstrap:
    """The prefill engine's bootstrap server: decode engines register rooms on it and take the
    rooms' pages from it. `start()` listens; `port` is the bootstrap port to report."""

    def __init__(self, engine: Engine, host: str, port: int) -> None:
        self.engine = engine
        self._waiting: dict[int, _Peer] = {}
        self._refused: dict[int, _Refusal] = {}
        self._lock = threading.Condition()
        self._sock = socket.create_server((host, port))
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name="bootstrap-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._sock.close()

    # -- the HTTP request's side

    def run(self, ids: list[int], params: GenParams, body: dict[str, Any], client_gone: Callable[[], bool]) -> Generation | None:
        """Prefill the prompt and send its pages to the decode that registered the room; the
        answer carries no output tokens. None when the client disconnected."""
        engine = self.engine
        room = bootstrap_from(body).room
        try:
            ids, pending_abort = engine.admit(ids, params.max_new_tokens)
        except RequestError as exc:
            # Refused before bootstrap: the decode asking for this room is told, reserves nothing
            # and no page moves.
            self._refuse(room, str(exc), exc.status)
            raise
        pages, cached = engine.prefill(ids, params)
        every = engine.config.transfer_fail_every
        if not every and Fault.TRANSFER_FAIL_AS_DRAINED in engine.faults:
            every = FLAKY_TRANSFER_EVERY
        try:
            peer = self._claim(room, params.rid, client_gone)
            if peer is None:
                return None
            seq = engine.next_transfer_seq()
            status = send_pages(
                engine, peer, room, params.rid, pages, len(ids), cached,
                delay_s=engine.config.transfer_delay_ms / 1000.0,
                lose_after_first_batch=bool(every) and seq % every == 0,
                report_lost_as_drained=Fault.TRANSFER_FAIL_AS_DRAINED in engine.faults,
            )
        except TransferError as exc:
            engine.count(bootstrap_failed=1)
            raise RequestError(str(exc), status=exc.status) from None
        except (OSError, ValueError) as exc:
            engine.count(transfer_failed=1)
            raise RequestError(f"KV transfer failed for request {params.rid}: {exc}", status=500) from None
        finally:
            engine.finish_prefill_pages(ids, pages, params)
        if status != "ok":
            engine.count(transfer_failed=1)
            raise RequestError(f"KV transfer failed for request {params.rid} (bootstrap room {room}): {status}.", status=500)
        engine.count(transfers_sent=1, num_requests=1)
        finish = {"type": "length", "length": 0}
        if pending_abort is not None:
            finish = {"type": "abort", "message": pending_abort, "status_code": 400}
        return Generation(rid=params.rid, prompt_ids=tuple(ids), output_ids=(), finish_reason=finish, cached_tokens=cached)

    def _claim(self, room: int, rid: str, client_gone: Callable[[], bool]) -> _Peer | None:
        """The decode's registration for the room, once it came. None when the client left."""
        deadline = time.monotonic() + BOOTSTRAP_WAIT_S
        with self._lock:
            while True:
                peer = self._waiting.pop(room, None)
                if peer is not None:
                    peer.taken = True
                    return peer
                refused = self._refused.pop(room, None)
                if refused is not None:  # the decode refused the request itself
                    raise TransferError(refused.message, status=refused.status)
                if client_gone():
                    self._remember_refusal(room, "the prefill request was cancelled", 500)
                    return None
                if time.monotonic() > deadline:
                    self._remember_refusal(room, "the prefill timed out waiting for the decode", 500)
                    raise TransferError(f"Bootstrap with the decode engine timed out for request {rid} (bootstrap room {room}).")
                self._lock.wait(POLL_S * 5)

    def _refuse(self, room: int, message: str, status: int) -> None:
        with self._lock:
            peer = self._waiting.pop(room, None)
            if peer is None:
                self._remember_refusal(room, message, status)
                self._lock.notify_all()
                return
            peer.taken = True
            self._lock.notify_all()
        _fail_peer(peer, message, status)

    def _remember_refusal(self, room: int, message: str, status: int) -> None:
        """A tombstone (SGLang's DeferredBootstrap keeps one too): a late registration for a room
        that will never transfer is told so at once. Caller holds the lock."""
        now = time.monotonic()
        for key in [k for k, v in self._refused.items() if now - v.at > REFUSAL_MEMORY_S]:
            del self._refused[key]
        self._refused[room] = _Refusal(message, status, now)

    # -- the decode engines' side

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_peer, args=(conn,), daemon=True).start()

    def _serve_peer(self, conn: socket.socket) -> None:
        handed_over = False
        try:
            conn.settimeout(TRANSFER_IO_TIMEOUT_S)
            reader = _Reader(conn)
            hello = reader.line()
            if hello is None:
                return  # a router checking that the port accepts connections
            room = int(hello.get("room", -1))
            if hello.get("op") == "abort":
                with self._lock:
                    self._remember_refusal(room, str(hello.get("error") or "aborted by decode"), int(hello.get("status", 500)))
                    self._lock.notify_all()
                _send_json(conn, {"ok": True})
                return
            if hello.get("op") != "register":
                return
            peer = _Peer(conn, reader, str(hello.get("rid", "")))
            with self._lock:
                refused = self._refused.pop(room, None)
                if refused is None:
                    self._waiting[room] = peer
                    self._lock.notify_all()
            if refused is not None:
                _send_json(conn, {"op": "failed", "error": refused.message, "status": refused.status})
                return
            handed_over = True  # from here the prefill's request (or the timeout below) owns conn
            deadline = time.monotonic() + BOOTSTRAP_WAIT_S
            with self._lock:
                while not peer.taken and time.monotonic() < deadline:
                    self._lock.wait(POLL_S * 5)
                if peer.taken:
                    return
                self._waiting.pop(room, None)
            self.engine.count(bootstrap_failed=1)
            _fail_peer(peer, f"no prefill request joined bootstrap room {room} within {BOOTSTRAP_WAIT_S:.0f} s", 500)
        except (OSError, ValueError):
            pass
        finally:
            if not handed_over:
                conn.close()


def _fail_peer(peer: _Peer, message: str, status: int) -> None:
    try:
        _send_json(peer.conn, {"op": "failed", "error": message, "status": status})
    except OSError:
        pass
    peer.conn.close()


def send_pages(
    engine: Engine,
    peer: _Peer,
    room: int,
    rid: str,
    pages: list[int],
    num_tokens: int,
    cached_tokens: int,
    *,
    delay_s: float,
    lose_after_first_batch: bool,
    report_lost_as_drained: bool,
) -> str:
    """Tell the decode the KV is ready, write the pages into the ones it reserved. Returns the
    status reported to decode ("ok" or "failed: ...")."""
    with peer.conn as sock:
        _send_json(sock, {"op": "ready", "num_tokens": num_tokens, "cached_tokens": cached_tokens})
        reply = peer.reader.line()
        if reply is None:
            raise TransferError(f"the decode engine closed bootstrap room {room} before taking its pages")
        if reply.get("op") != "destinations":
            raise TransferError(str(reply.get("error") or "decode refused bootstrap"), status=int(reply.get("status", 500)))
        engine.page_log.event("transfer_start", rid, pages, room=room)
        lost = False
        for first in range(0, len(pages), BATCH_PAGES):
            if lose_after_first_batch and first > 0:
                lost = True  # these sends never reach decode
                break
            if delay_s:
                time.sleep(delay_s)
            batch = pages[first : first + BATCH_PAGES]
            data = engine.pool.read_pages(batch)
            _send_json(sock, {"op": "pages", "first_page": first, "count": len(batch), "nbytes": len(data)}, data)
        status = "failed: send error on page batch 2" if lost and not report_lost_as_drained else "ok"
        _send_json(sock, {"op": "done", "status": status, "tokens_sent": num_tokens})
        peer.reader.line()
        engine.page_log.event("transfer_end", rid, pages, room=room, status=status, tokens=num_tokens)
        return status


# ---- decode side -----------------------------------------------------------------------------------


@dataclass
class Room:
    """Decode-side state of one handoff (SGLang's bootstrap room)."""

    room: int
    rid: str
    reserved_tokens: int
    bootstrapped: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    pages: list[int] = field(default_factory=list)
    pages_released: bool = False
    error: str | None = None
    error_status: int = 500
    refused_by_prefill: bool = False
    transfer_status: str | None = None
    tokens_sent: int = 0
    cached_tokens: int = 0
    cancelled_at: float | None = None
    sock: socket.socket | None = None


class DecodeHandoff:
    """The decode engine's side: for each request, fetch its room's pages from the prefill's
    bootstrap server named in the request, then decode."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()

    def close(self) -> None:
        pass  # nothing listens on the decode side

    # -- the HTTP request's side

    def run(
        self,
        ids: list[int],
        params: GenParams,
        body: dict[str, Any],
        client_gone: Callable[[], bool],
        on_token: OnToken | None,
    ) -> Generation | None:
        """Wait for the prefill's pages, then decode. None when the client disconnected."""
        engine = self.engine
        boot = bootstrap_from(body)
        try:
            ids, _ = engine.admit(ids, params.max_new_tokens)  # decode's own limits
        except RequestError as exc:
            # The prefill's request for this room gets this answer (in the background: the
            # client's answer does not wait for the prefill).
            threading.Thread(target=_send_abort, args=(boot, str(exc), exc.status), daemon=True).start()
            raise
        room = Room(room=boot.room, rid=params.rid, reserved_tokens=len(ids))
        threading.Thread(target=self._fetch, args=(room, boot), name="kv-fetch", daemon=True).start()
        deadline = time.monotonic() + BOOTSTRAP_WAIT_S
        while not room.bootstrapped.wait(POLL_S):
            if client_gone():
                self._cancel(room)
                return None
            if time.monotonic() > deadline:
                self._cancel(room)
                engine.count(bootstrap_failed=1)
                raise RequestError(f"Bootstrap with the prefill engine timed out for request {params.rid}.", status=500)
        if room.error is not None:
            if room.refused_by_prefill:
                grace = time.monotonic() + PREFILL_REFUSAL_GRACE_S
                while time.monotonic() < grace:
                    if client_gone():
                        return None
                    time.sleep(POLL_S)
            raise RequestError(room.error, status=room.error_status)
        while not room.done.wait(POLL_S):
            if client_gone():
                self._cancel(room)
                return None
        return self._decode_after_transfer(room, ids, params, on_token)

    def _release_pages(self, room: Room, **fields: object) -> None:
        with self._lock:
            if room.pages_released or not room.pages:
                room.pages_released = True
                return
            room.pages_released = True
            pages = list(room.pages)
        self.engine.release(pages, room.rid, room=room.room, **fields)

    def _cancel(self, room: Room) -> None:
        """The client went away. Pages are released only once the transfer drained (deferred
        release), unless fault early-free-on-cancel frees them while writes are in flight."""
        with self._lock:
            room.cancelled_at = time.monotonic()
            bootstrapped = room.bootstrapped.is_set()
        self.engine.page_log.event("cancel", room.rid, room.pages, room=room.room, transfer_done=room.done.is_set())
        if not bootstrapped:
            # Nothing reserved yet: stop waiting for the prefill (the fetch sees the cancel).
            if room.sock is not None:
                _shutdown(room.sock)
        elif room.done.is_set() or Fault.EARLY_FREE_ON_CANCEL in self.engine.faults:
            self._release_pages(room, reason="cancelled")
        # else: the fetch releases them when the transfer ends (see _transfer_ended).

    def _transfer_ended(self, room: Room, status: str, tokens_sent: int) -> None:
        room.transfer_status = status
        room.tokens_sent = tokens_sent
        self.engine.page_log.event("transfer_end", room.rid, room.pages, room=room.room, status=status, tokens=tokens_sent)
        room.done.set()
        if room.cancelled_at is not None and not room.pages_released:
            waited = time.monotonic() - room.cancelled_at
            self.engine.count(deferred_release=1, deferred_release_seconds=waited)
            self._release_pages(room, reason="deferred_release", waited_s=round(waited, 4))

    def _decode_after_transfer(
        self, room: Room, ids: list[int], params: GenParams, on_token: OnToken | None
    ) -> Generation:
        engine = self.engine
        try:
            if room.transfer_status != "ok":
                engine.count(transfer_failed=1)
                raise RequestError(
                    f"KV transfer failed for request {room.rid} (bootstrap room {room.room}): {room.transfer_status}.",
                    status=500,
                )
            if Fault.NO_TRANSFER_CHECK not in engine.faults and room.tokens_sent != room.reserved_tokens:
                raise RequestError(
                    f"Context corruption detected: received KV for {room.tokens_sent} tokens but "
                    f"{room.reserved_tokens} tokens were reserved for request {room.rid}.",
                    status=500,
                )
            pages = list(room.pages)
            try:
                return engine.generate_from_pages(ids, pages, params, room.cached_tokens, on_token)
            finally:
                # Pages added for generated tokens go back even when the client disconnected
                # mid-decode (found by the isolation probes: 16 tokens leaked per disconnect).
                extra = pages[len(room.pages):]
                if extra:
                    engine.release(extra, room.rid)
        finally:
            self._release_pages(room, reason="finished")

    # -- the fetch: register the room at the prefill, reserve pages, receive them

    def _fetch(self, room: Room, boot: Bootstrap) -> None:
        engine = self.engine
        ended = False
        try:
            try:
                sock = socket.create_connection((boot.host, boot.port), timeout=CONNECT_TIMEOUT_S)
            except OSError as exc:
                engine.count(bootstrap_failed=1)
                self._fail(room, f"cannot reach the prefill's bootstrap server {boot.host}:{boot.port}: {exc}", 500)
                return
            room.sock = sock
            with sock:
                sock.settimeout(BOOTSTRAP_WAIT_S + TRANSFER_IO_TIMEOUT_S)
                reader = _Reader(sock)
                _send_json(sock, {"op": "register", "room": room.room, "rid": room.rid})
                ready = reader.line()
                if ready is None or ready.get("op") != "ready":
                    status = int((ready or {}).get("status", 500))
                    room.refused_by_prefill = status == 400
                    if not room.refused_by_prefill and room.cancelled_at is None:
                        # A refusal is the prefill's answer, and a cancel the client's: neither is a failed bootstrap.
                        engine.count(bootstrap_failed=1)
                    self._fail(room, str((ready or {}).get("error") or "the prefill closed the bootstrap connection"), status)
                    return
                if room.cancelled_at is not None:
                    _send_json(sock, {"op": "abort", "error": "request was cancelled", "status": 499})
                    self._fail(room, "cancelled", 499)
                    return
                try:
                    pages = engine.alloc_pages(-(-room.reserved_tokens // engine.page_size), room.rid)
                except RequestError as exc:
                    engine.count(bootstrap_failed=1)
                    _send_json(sock, {"op": "abort", "error": str(exc), "status": exc.status})
                    self._fail(room, str(exc), exc.status)
                    return
                with self._lock:
                    cancelled = room.cancelled_at is not None
                    if not cancelled:
                        room.pages = pages
                        room.cached_tokens = int(ready.get("cached_tokens", 0))
                        room.bootstrapped.set()
                if cancelled:
                    engine.release(pages, room.rid, room=room.room, reason="cancelled")
                    _send_json(sock, {"op": "abort", "error": "request was cancelled", "status": 499})
                    self._fail(room, "cancelled", 499)
                    return
                engine.page_log.event("transfer_start", room.rid, room.pages, room=room.room)
                _send_json(sock, {"op": "destinations", "reserved_tokens": room.reserved_tokens, "pages": len(pages)})
                while True:
                    msg = reader.line()
                    if msg is None:
                        break
                    if msg.get("op") == "pages":
                        first, count = int(msg["first_page"]), int(msg["count"])
                        data = reader.exactly(int(msg["nbytes"]))
                        if data is None:
                            break
                        targets = room.pages[first : first + count]
                        if len(targets) != count:
                            break  # more pages than decode reserved: refuse the rest of the stream
                        engine.pool.write_pages(targets, data)
                        engine.count(transfer_pages=count)
                        engine.page_log.event("transfer_write", room.rid, targets, room=room.room)
                    elif msg.get("op") == "done":
                        engine.count(transfers_received=1)
                        self._transfer_ended(room, str(msg.get("status")), int(msg.get("tokens_sent", 0)))
                        ended = True
                        _send_json(sock, {"ok": True})
                        break
        except (OSError, ValueError, KeyError) as exc:
            if not room.bootstrapped.is_set():
                if room.cancelled_at is None:
                    engine.count(bootstrap_failed=1)
                self._fail(room, f"bootstrap with the prefill engine failed: {exc}", 500)
        finally:
            if room.bootstrapped.is_set() and room.error is None and not ended:
                # The sender is gone: no more writes can arrive on this connection.
                self._transfer_ended(room, "failed: connection closed mid-transfer", room.tokens_sent)

    @staticmethod
    def _fail(room: Room, message: str, status: int) -> None:
        room.error, room.error_status = message, status
        room.bootstrapped.set()


def _send_abort(boot: Bootstrap, error: str, status: int) -> None:
    try:
        with socket.create_connection((boot.host, boot.port), timeout=CONNECT_TIMEOUT_S) as sock:
            _send_json(sock, {"op": "abort", "room": boot.room, "error": error, "status": status})
            _Reader(sock).line()
    except (OSError, ValueError):
        pass


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


# ---- the wire --------------------------------------------------------------------------------------


def _send_json(sock: socket.socket, obj: dict[str, Any], payload: bytes = b"") -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n" + payload)


class _Reader:
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
