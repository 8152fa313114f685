"""KV page transfer between a prefill and a decode engine over a real TCP socket.

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
"""

from __future__ import annotations

import json
import socket
import threading
import time

BATCH_PAGES = 8
CONNECT_TIMEOUT_S = 10.0


def _send_json(sock: socket.socket, obj: dict, payload: bytes = b"") -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n" + payload)


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def line(self) -> dict | None:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\n", 1)
        return json.loads(raw)

    def exactly(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buf)))
            if not chunk:
                return None
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data


class TransferServer:
    """Decode side: accepts prefill connections and lands their pages in the pool."""

    def __init__(self, engine, host: str, port: int) -> None:
        self.engine = engine
        self.sock = socket.create_server((host, port))
        self.port = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name="kv-transfer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
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
                engine.refuse_room(int(hello.get("room", -1)), str(hello.get("error") or "aborted by prefill"))
                _send_json(conn, {"ok": True})
                return
            found, refusal = engine.find_room(int(hello.get("room", -1)))
            if found is None:
                engine.count(bootstrap_failed=1)
                _send_json(conn, {"ok": False, "error": refusal[0], "status": refusal[1]})
                return
            room = found
            if room.cancelled_at is not None:
                _send_json(conn, {"ok": False, "error": "request was cancelled"})
                room.error = "cancelled"
                room.bootstrapped.set()
                return
            from kvpreflight.builtin_engine.core import RequestError

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
                    engine.transfer_ended(room, str(msg.get("status")), int(msg.get("tokens_sent", 0)))
                    ended = True
                    _send_json(conn, {"ok": True})
                    break
        except (OSError, ValueError, KeyError):
            pass
        finally:
            if room is not None and not ended and room.bootstrapped.is_set() and room.error is None:
                # The sender is gone: no more writes can arrive on this connection.
                engine.transfer_ended(room, "failed: connection closed mid-transfer", room.tokens_sent)
            conn.close()

    def close(self) -> None:
        self.sock.close()


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


class TransferError(Exception):
    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


def send_pages(
    engine,
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
    """Prefill side. Returns the status reported to decode ("ok" or "failed: ...")."""
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
