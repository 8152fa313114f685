"""The prefill's side of the handoff (protocol and wire: pd.py): its bootstrap server, where
decodes register rooms, and the sender that writes a computed prompt's KV into the pages a decode
reserved."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvpreflight._internal.builtin_engine.config import Fault
from kvpreflight._internal.builtin_engine.pd import (
    BATCH_PAGES,
    FLAKY_TRANSFER_EVERY,
    POLL_S,
    REFUSAL_MEMORY_S,
    TRANSFER_IO_TIMEOUT_S,
    Reader,
    Refusal,
    TransferError,
    bootstrap_from,
    send_json,
)
from kvpreflight._internal.builtin_engine.protocol import Generation, GenParams, RequestError

if TYPE_CHECKING:
    from kvpreflight._internal.builtin_engine.core import Engine


# ---- prefill side: the bootstrap server and the sender -----------------------------------------


@dataclass
class _Peer:
    """A decode engine's registration for one room, waiting for the prefill's request to join."""

    conn: socket.socket
    reader: Reader
    rid: str
    taken: bool = False  # by the prefill's request, or refused


class PrefillBootstrap:
    """The prefill engine's bootstrap server: decode engines register rooms on it and take the
    rooms' pages from it. `start()` listens; `port` is the bootstrap port to report."""

    def __init__(self, engine: Engine, host: str, port: int) -> None:
        self.engine = engine
        self._waiting: dict[int, _Peer] = {}
        self._refused: dict[int, Refusal] = {}
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
        # Fault shortened-prompt: the prefill is where a P/D deployment computes (and counts)
        # prompts; it computes half, and tells the decode the whole prompt's KV was sent, so the
        # decode's received-equals-reserved check passes and the answer reports the full length.
        # Fault pool-in-another-unit: a prompt over the true pool is a 1-token placeholder whose
        # page table (stale past its first slot) is sent as the whole prompt's KV.
        placeholder = engine.over_true_pool(len(ids))
        computed = ids if placeholder else engine.shortened_prompt(ids)
        if placeholder:
            pages, cached = engine.prefill_placeholder(ids, params)[0], 0
        else:
            pages, cached = engine.prefill(computed, params)
        every = engine.config.transfer_fail_every
        if not every and Fault.TRANSFER_FAIL_AS_DRAINED in engine.faults:
            every = FLAKY_TRANSFER_EVERY
        try:
            peer = self._claim(room, params.rid, client_gone)
            if peer is None:
                return None
            seq = engine.next_transfer_seq()
            status, sent_tokens = send_pages(
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
            if placeholder:
                engine.release(pages, params.rid)  # garbage past the first slot: not cached
            else:
                engine.finish_prefill_pages(computed, pages, params)
        if status != "ok":
            engine.count(transfer_failed=1)
            raise RequestError(f"KV transfer failed for request {params.rid} (bootstrap room {room}): {status}.", status=500)
        engine.count(transfers_sent=1, transfer_tokens=sent_tokens, num_requests=1)
        finish = {"type": "length", "length": 0}
        if pending_abort is not None:
            finish = {"type": "abort", "message": pending_abort, "status_code": 400}
        return Generation(rid=params.rid, prompt_ids=tuple(ids), output_ids=(), finish_reason=finish, cached_tokens=cached)

    def _claim(self, room: int, rid: str, client_gone: Callable[[], bool]) -> _Peer | None:
        """The decode's registration for the room, once it came. None when the client left."""
        deadline = time.monotonic() + self.engine.config.pd_wait_s
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
        self._refused[room] = Refusal(message, status, now)

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
            reader = Reader(conn)
            hello = reader.line()
            if hello is None:
                return  # a router checking that the port accepts connections
            room = int(hello.get("room", -1))
            if hello.get("op") == "abort":
                with self._lock:
                    self._remember_refusal(room, str(hello.get("error") or "aborted by decode"), int(hello.get("status", 500)))
                    self._lock.notify_all()
                send_json(conn, {"ok": True})
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
                send_json(conn, {"op": "failed", "error": refused.message, "status": refused.status})
                return
            handed_over = True  # from here the prefill's request (or the timeout below) owns conn
            deadline = time.monotonic() + self.engine.config.pd_wait_s
            with self._lock:
                while not peer.taken and time.monotonic() < deadline:
                    self._lock.wait(POLL_S * 5)
                if peer.taken:
                    return
                self._waiting.pop(room, None)
            self.engine.count(bootstrap_failed=1)
            _fail_peer(peer, f"no prefill request joined bootstrap room {room} within {self.engine.config.pd_wait_s:.0f} s", 500)
        except (OSError, ValueError):
            pass
        finally:
            if not handed_over:
                conn.close()


def _fail_peer(peer: _Peer, message: str, status: int) -> None:
    try:
        send_json(peer.conn, {"op": "failed", "error": message, "status": status})
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
) -> tuple[str, int]:
    """Tell the decode the KV is ready, write the pages into the ones it reserved. Returns the
    status reported to decode ("ok" or "failed: ...") and the prompt tokens whose KV was sent:
    the pages past the prefix the decode's own prefix cache holds (`prefix_pages` in its reply,
    SGLang's decode prefix length; 0 without a decode-side cache)."""
    with peer.conn as sock:
        send_json(sock, {"op": "ready", "num_tokens": num_tokens, "cached_tokens": cached_tokens})
        reply = peer.reader.line()
        if reply is None:
            raise TransferError(f"the decode engine closed bootstrap room {room} before taking its pages")
        if reply.get("op") != "destinations":
            raise TransferError(str(reply.get("error") or "decode refused bootstrap"), status=int(reply.get("status", 500)))
        skip = min(max(int(reply.get("prefix_pages", 0)), 0), len(pages))
        num_tokens = max(num_tokens - skip * engine.page_size, 0)
        engine.page_log.event("transfer_start", rid, pages[skip:], room=room)
        lost = False
        for first in range(skip, len(pages), BATCH_PAGES):
            if lose_after_first_batch and first > skip:
                lost = True  # these sends never reach decode
                break
            if delay_s:
                time.sleep(delay_s)
            batch = pages[first : first + BATCH_PAGES]
            data = engine.pool.read_pages(batch)
            send_json(sock, {"op": "pages", "first_page": first, "count": len(batch), "nbytes": len(data)}, data)
        status = "failed: send error on page batch 2" if lost and not report_lost_as_drained else "ok"
        send_json(sock, {"op": "done", "status": status, "tokens_sent": num_tokens})
        peer.reader.line()
        engine.page_log.event("transfer_end", rid, pages[skip:], room=room, status=status, tokens=num_tokens)
        return status, num_tokens
