"""The decode's side of the handoff (protocol and wire: pd.py): register the room at the
prefill's bootstrap server, reserve pages once its KV is ready, receive them, decode."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvpreflight._internal.builtin_engine.config import Fault
from kvpreflight._internal.builtin_engine.pd import (
    CONNECT_TIMEOUT_S,
    POLL_S,
    PREFILL_REFUSAL_GRACE_S,
    TRANSFER_IO_TIMEOUT_S,
    Bootstrap,
    Reader,
    bootstrap_from,
    send_json,
    shutdown_socket,
)
from kvpreflight._internal.builtin_engine.protocol import Generation, GenParams, OnToken, RequestError

if TYPE_CHECKING:
    from kvpreflight._internal.builtin_engine.core import Engine


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
    ids: list[int] = field(default_factory=list)  # the prompt (the decode's own prefix cache looks it up)
    salt: str | None = None
    prefix_tokens: int = 0  # tokens whose KV the decode's own prefix cache held: not transferred


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
        # Faults leak-*: which other tenant's prompt this answer would be decoded over, picked on
        # arrival (a request that leaves mid-transfer still held its pages: it is leaked from).
        leaked = engine.leaked_prompt(ids, params, streamed=on_token is not None)
        room = Room(room=boot.room, rid=params.rid, reserved_tokens=len(ids), ids=ids, salt=params.cache_salt)
        threading.Thread(target=self._fetch, args=(room, boot), name="kv-fetch", daemon=True).start()
        deadline = time.monotonic() + engine.config.pd_wait_s
        while not room.bootstrapped.wait(POLL_S):
            if client_gone():
                engine.wedge_on_disconnect()  # the fetch goes on: the pages it takes stay held
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
                engine.wedge_on_disconnect()
                self._cancel(room)
                return None
        return self._decode_after_transfer(room, ids, params, on_token, leaked, client_gone)

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
                shutdown_socket(room.sock)
        elif room.done.is_set() or (Fault.EARLY_FREE_ON_CANCEL in self.engine.faults and self.engine.fault_fires()):
            self._release_pages(room, reason="cancelled")
        # else: the fetch releases them when the transfer ends (see _transfer_ended).

    def _transfer_ended(self, room: Room, status: str, tokens_sent: int) -> None:
        room.transfer_status = status
        room.tokens_sent = tokens_sent
        if status != "ok":
            # Counted where the failure is seen, before anyone can observe its events: the request
            # may never reach decoding (a router that answered 502 for a dead prefill cancelled
            # it), and a failed transfer must count all the same (SGLang counts it in its queue).
            self.engine.count(transfer_failed=1)
        self.engine.page_log.event("transfer_end", room.rid, room.pages, room=room.room, status=status, tokens=tokens_sent)
        room.done.set()
        if room.cancelled_at is not None and not room.pages_released:
            waited = time.monotonic() - room.cancelled_at
            self.engine.count(deferred_release=1, deferred_release_seconds=waited)
            self._release_pages(room, reason="deferred_release", waited_s=round(waited, 4))

    def _decode_after_transfer(
        self, room: Room, ids: list[int], params: GenParams, on_token: OnToken | None, leaked: list[int],
        client_gone: Callable[[], bool],
    ) -> Generation | None:
        engine = self.engine
        try:
            if room.transfer_status != "ok":  # counted in _transfer_ended
                raise RequestError(
                    f"KV transfer failed for request {room.rid} (bootstrap room {room.room}): {room.transfer_status}.",
                    status=500,
                )
            if Fault.NO_TRANSFER_CHECK not in engine.faults and room.prefix_tokens + room.tokens_sent != room.reserved_tokens:
                raise RequestError(
                    f"Context corruption detected: received KV for {room.tokens_sent} tokens but "
                    f"{room.reserved_tokens} tokens were reserved for request {room.rid}.",
                    status=500,
                )
            # The room's own list: the decode loop grows it, and moves it when it retracts the
            # request (Engine.grow), so that what is released below is what the request holds.
            pages = room.pages
            # Faults leak-*: the tail of the KV this answer is decoded over is another tenant's
            # (pages handed to two requests), on the decode's own answer path.
            same = next((i for i, (a, b) in enumerate(zip(ids, leaked, strict=True)) if a != b), None)
            if same is not None:
                engine.write_kv(leaked, pages, start=same)
            if Fault.DECODE_RECOMPUTE in engine.faults:
                # The KV that arrived is thrown away and the prompt computed again on decode (PD
                # degraded to unified: the answer is the same, the prefill's work is wasted).
                engine.write_kv(ids, pages)
                engine.count(prompt_tokens=len(ids))
            # A client that left stops its decode, as SGLang aborts a disconnected request: a
            # request decoded for nobody held its pages while others waited for them.
            # The answer's cached_tokens is the prefill's figure, whatever the decode's own cache reused.
            generated = engine.generate_from_pages(ids, pages, params, room.cached_tokens, on_token, client_gone)
            engine.decode_cache_insert(ids, params.cache_salt, pages)  # a decode-side cache only
            return generated
        finally:
            # Prompt pages and those added for generated tokens, also when the client
            # disconnected mid-decode (found by the isolation probes: 16 tokens leaked per disconnect).
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
                sock.settimeout(engine.config.pd_wait_s + TRANSFER_IO_TIMEOUT_S)
                reader = Reader(sock)
                send_json(sock, {"op": "register", "room": room.room, "rid": room.rid})
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
                    send_json(sock, {"op": "abort", "error": "request was cancelled", "status": 499})
                    self._fail(room, "cancelled", 499)
                    return
                # Faults decode-cache-no-salt*: the decode's own cache may hold a prefix; only the
                # rest is asked of the prefill (SGLang's decode radix cache, PR #19746).
                prefix = engine.decode_cache_lookup(room.ids, room.salt, room.rid)
                try:
                    pages = prefix + engine.alloc_pages(-(-room.reserved_tokens // engine.page_size) - len(prefix), room.rid)
                except RequestError as exc:
                    if prefix:
                        engine.release(prefix, room.rid, room=room.room, reason="refused")
                    engine.count(bootstrap_failed=1)
                    send_json(sock, {"op": "abort", "error": str(exc), "status": exc.status})
                    self._fail(room, str(exc), exc.status)
                    return
                with self._lock:
                    cancelled = room.cancelled_at is not None
                    if not cancelled:
                        room.pages = pages
                        room.prefix_tokens = len(prefix) * engine.page_size
                        room.cached_tokens = int(ready.get("cached_tokens", 0))
                        room.bootstrapped.set()
                if cancelled:
                    engine.release(pages, room.rid, room=room.room, reason="cancelled")
                    send_json(sock, {"op": "abort", "error": "request was cancelled", "status": 499})
                    self._fail(room, "cancelled", 499)
                    return
                engine.page_log.event("transfer_start", room.rid, room.pages, room=room.room)
                send_json(sock, {"op": "destinations", "reserved_tokens": room.reserved_tokens, "pages": len(pages),
                                 "prefix_pages": len(prefix)})
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
                        received = int(msg.get("tokens_sent", 0)) if msg.get("status") == "ok" else 0
                        engine.count(transfers_received=1, transfer_tokens=received)
                        self._transfer_ended(room, str(msg.get("status")), int(msg.get("tokens_sent", 0)))
                        ended = True
                        send_json(sock, {"ok": True})
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
            send_json(sock, {"op": "abort", "room": boot.room, "error": error, "status": status})
            Reader(sock).line()
    except (OSError, ValueError):
        pass
