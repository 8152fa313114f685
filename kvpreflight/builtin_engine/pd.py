"""The prefill/decode handoff, all of it: the bootstrap fields of a request, the prefill's side
(prefill, send the pages), the decode's side (rooms waiting for pages, the page receiver, decode)
and the TCP wire between them. The engine (core.py) only computes and owns pages; this module is
what a different handoff protocol replaces.

The router sends each request to one prefill and to the decode at once, tagged with the same
bootstrap room. Decode opens a room and waits; the prefill connects to decode's bootstrap port,
decode reserves pages for ITS prompt, and the prefill writes its KV into them.

Wire format: one JSON header line per message, page data as raw float32 bytes after a `pages`
header. Prefill -> decode:

  {"op": "bootstrap", "room": R, "rid": ..., "num_tokens": N, "cached_tokens": C}
      decode answers {"ok": true, "reserved_tokens": M} once it reserved pages for ITS prompt
      (M is decode's own count; the two can differ), or {"ok": false, "error": ...}
  {"op": "pages", "first_page": k, "count": c, "nbytes": b} + b bytes   (bounded batches)
  {"op": "done", "status": "ok"|"failed", "tokens_sent": T}   decode answers {"ok": true}
  {"op": "abort", "room": R, "error": ...}   prefill refused the request: decode reserves nothing

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
FIND_ROOM_WAIT_S = 10.0  # the router sends to both at once, so the prefill may knock first
REFUSAL_MEMORY_S = 300.0  # how long decode remembers a room that will never bootstrap
# --transfer-fail-every's default under fault transfer-fail-as-drained: the flaky backend it models.
FLAKY_TRANSFER_EVERY = 3
POLL_S = 0.02


# ---- the request's bootstrap fields ------------------------------------------------------------


@dataclass(frozen=True)
class Bootstrap:
    """Where the decode engine takes pages (`host`, `port`) and which room is this request's."""

    host: str | None
    port: int | None
    room: int


def bootstrap_from(body: dict[str, Any], need_host: bool) -> Bootstrap:
    room = body.get("bootstrap_room")
    host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
    if not isinstance(room, int) or (need_host and (not isinstance(host, str) or not isinstance(port, int))):
        raise RequestError(
            "This engine runs with a disaggregation mode and needs bootstrap_host, bootstrap_port and "
            "bootstrap_room: send requests through the router."
        )
    return Bootstrap(host, port, room)


# ---- prefill side ----------------------------------------------------------------------------------


def run_prefill(engine: Engine, ids: list[int], params: GenParams, body: dict[str, Any]) -> Generation:
    """Prefill the prompt and send its pages to decode; the answer carries no output tokens."""
    boot = bootstrap_from(body, need_host=True)
    assert boot.host is not None and boot.port is not None  # need_host=True checked them
    host, port, room = boot.host, boot.port, boot.room
    try:
        ids, pending_abort = engine.admit(ids, params.max_new_tokens)
    except RequestError as exc:
        # Refused before bootstrap: decode reserves nothing and no page moves.
        send_abort(host, port, room, str(exc))
        raise
    pages, cached = engine.prefill(ids, params)
    every = engine.config.transfer_fail_every
    if not every and Fault.TRANSFER_FAIL_AS_DRAINED in engine.faults:
        every = FLAKY_TRANSFER_EVERY
    seq = engine.next_transfer_seq()
    lose = bool(every) and seq % every == 0
    try:
        status = send_pages(
            engine, host, port, room, params.rid, pages, len(ids), cached,
            delay_s=engine.config.transfer_delay_ms / 1000.0,
            lose_after_first_batch=lose,
            report_lost_as_drained=Fault.TRANSFER_FAIL_AS_DRAINED in engine.faults,
        )
    except TransferError as exc:
        engine.count(bootstrap_failed=1)
        raise RequestError(str(exc), status=exc.status) from None
    except OSError as exc:
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


class TransferError(Exception):
    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


def send_pages(
    engine: Engine,
    host: str,
    port: int,
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
    """Returns the status reported to decode ("ok" or "failed: ...")."""
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise TransferError(f"cannot reach decode bootstrap {host}:{port}: {exc}") from exc
    with sock:
        sock.settimeout(120.0)
        reader = _Reader(sock)
        _send_json(sock, {"op": "bootstrap", "room": room, "rid": rid, "num_tokens": num_tokens, "cached_tokens": cached_tokens})
        reply = reader.line()
        if not reply or not reply.get("ok"):
            if reply and reply.get("status") == 400:
                raise TransferError(str(reply.get("error")), status=400)  # decode's own length check
            raise TransferError(f"decode refused bootstrap: {(reply or {}).get('error', 'connection closed')}")
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
        reader.line()
        engine.page_log.event("transfer_end", rid, pages, room=room, status=status, tokens=num_tokens)
        return status


def send_abort(host: str, port: int, room: int, error: str) -> None:
    """Tell decode the request was refused, so it stops waiting; no page moves. In the
    background: the client's answer does not wait for decode."""
    threading.Thread(target=_send_abort, args=(host, port, room, error), daemon=True).start()


def _send_abort(host: str, port: int, room: int, error: str) -> None:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as sock:
            _send_json(sock, {"op": "abort", "room": room, "error": error})
            _Reader(sock).line()
    except OSError:
        pass


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
    transfer_status: str | None = None
    tokens_sent: int = 0
    cached_tokens: int = 0
    cancelled_at: float | None = None


@dataclass(frozen=True)
class _Refusal:
    message: str
    status: int
    at: float  # time.monotonic()


class DecodeHandoff:
    """The decode engine's side: rooms by bootstrap room id, and the TCP receiver that lands
    the prefills' pages in them. `start()` listens; `port` is the bootstrap port to report."""

    def __init__(self, engine: Engine, host: str, port: int) -> None:
        self.engine = engine
        self._rooms: dict[int, Room] = {}
        self._refused: dict[int, _Refusal] = {}
        self._lock = threading.Condition()
        self._sock = socket.create_server((host, port))
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name="kv-transfer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._sock.close()

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
        room_id = bootstrap_from(body, need_host=False).room
        try:
            ids, _ = engine.admit(ids, params.max_new_tokens)  # decode's own limits
        except RequestError as exc:
            self._refuse(room_id, str(exc), exc.status)  # the prefill's bootstrap gets this answer
            raise
        room = self._open(room_id, params.rid, ids)
        deadline = time.monotonic() + BOOTSTRAP_WAIT_S
        while not room.bootstrapped.wait(POLL_S):
            if client_gone():
                self._cancel(room)
                return None
            if time.monotonic() > deadline:
                self._close(room)
                engine.count(bootstrap_failed=1)
                raise RequestError(f"Bootstrap with the prefill engine timed out for request {params.rid}.", status=500)
        if room.error is not None:
            self._close(room)
            raise RequestError(room.error, status=400)
        while not room.done.wait(POLL_S):
            if client_gone():
                self._cancel(room)
                return None
        return self._decode_after_transfer(room, ids, params, on_token)

    def _open(self, room_id: int, rid: str, ids: list[int]) -> Room:
        room = Room(room=room_id, rid=rid, reserved_tokens=len(ids))
        with self._lock:
            refused = self._refused.pop(room_id, None)
            if refused is not None:
                # The prefill refused (and said so) before this request reached decode.
                room.error = refused.message
                room.bootstrapped.set()
            else:
                self._rooms[room_id] = room
            self._lock.notify_all()
        return room

    def _refuse(self, room_id: int, message: str, status: int = 400) -> None:
        """Remember that a room will never bootstrap, so the other side need not wait for it."""
        with self._lock:
            room = self._rooms.get(room_id)
            if room is not None:
                room.error = message
                room.bootstrapped.set()
            else:
                now = time.monotonic()
                for key in [k for k, v in self._refused.items() if now - v.at > REFUSAL_MEMORY_S]:
                    del self._refused[key]
                self._refused[room_id] = _Refusal(message, status, now)
            self._lock.notify_all()

    def _find(self, room_id: int, wait_s: float = FIND_ROOM_WAIT_S) -> Room | _Refusal:
        """The room once the decode request arrived, or why it never will."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            while room_id not in self._rooms:
                refused = self._refused.pop(room_id, None)
                if refused is not None:
                    return refused
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return _Refusal("unknown bootstrap room", 500, time.monotonic())
                self._lock.wait(remaining)
            return self._rooms[room_id]

    def _close(self, room: Room) -> None:
        with self._lock:
            self._rooms.pop(room.room, None)

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
        room.cancelled_at = time.monotonic()
        self.engine.page_log.event("cancel", room.rid, room.pages, room=room.room, transfer_done=room.done.is_set())
        if room.done.is_set() or not room.bootstrapped.is_set():
            self._release_pages(room, reason="cancelled")
            self._close(room)
        elif Fault.EARLY_FREE_ON_CANCEL in self.engine.faults:
            self._release_pages(room, reason="cancelled")
        # else: the receiver releases them when the transfer ends (see _transfer_ended).

    def _transfer_ended(self, room: Room, status: str, tokens_sent: int) -> None:
        room.transfer_status = status
        room.tokens_sent = tokens_sent
        self.engine.page_log.event("transfer_end", room.rid, room.pages, room=room.room, status=status, tokens=tokens_sent)
        room.done.set()
        if room.cancelled_at is not None:
            if not room.pages_released:
                waited = time.monotonic() - room.cancelled_at
                self.engine.count(deferred_release=1, deferred_release_seconds=waited)
                self._release_pages(room, reason="deferred_release", waited_s=round(waited, 4))
            self._close(room)

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
            self._close(room)

    # -- the prefills' side: the page receiver

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._receive, args=(conn,), daemon=True).start()

    def _receive(self, conn: socket.socket) -> None:
        engine = self.engine
        room = None
        ended = False
        try:
            reader = _Reader(conn)
            hello = reader.line()
            if hello is None:
                return
            if hello.get("op") == "abort":
                # A deliberate refusal by the prefill, not a bootstrap failure.
                self._refuse(int(hello.get("room", -1)), str(hello.get("error") or "aborted by prefill"))
                _send_json(conn, {"ok": True})
                return
            found = self._find(int(hello.get("room", -1)))
            if isinstance(found, _Refusal):
                engine.count(bootstrap_failed=1)
                _send_json(conn, {"ok": False, "error": found.message, "status": found.status})
                return
            room = found
            if room.cancelled_at is not None:
                _send_json(conn, {"ok": False, "error": "request was cancelled"})
                room.error = "cancelled"
                room.bootstrapped.set()
                return
            try:
                room.pages = engine.alloc_pages(-(-room.reserved_tokens // engine.page_size), room.rid)
            except RequestError as exc:
                room.error = str(exc)
                engine.count(bootstrap_failed=1)
                room.bootstrapped.set()
                _send_json(conn, {"ok": False, "error": str(exc)})
                return
            room.cached_tokens = int(hello.get("cached_tokens", 0))
            engine.page_log.event("transfer_start", room.rid, room.pages, room=room.room)
            _send_json(conn, {"ok": True, "reserved_tokens": room.reserved_tokens})
            room.bootstrapped.set()
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
                    _send_json(conn, {"ok": True})
                    break
        except (OSError, ValueError, KeyError):
            pass
        finally:
            if room is not None and not ended and room.bootstrapped.is_set() and room.error is None:
                # The sender is gone: no more writes can arrive on this connection.
                self._transfer_ended(room, "failed: connection closed mid-transfer", room.tokens_sent)
            conn.close()


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
