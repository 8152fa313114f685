"""One HTTP request's total deadline, body included (see http.py for why): a watchdog that shuts
the request's socket at the deadline, and the urllib3 connection and pool classes that let it find
that socket. requests only bounds each read; a server that drips a byte a second would otherwise
hold a request forever."""

from __future__ import annotations

import math
import socket
import threading
import time
from typing import Any

import requests.adapters
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from kvpreflight._internal.engines.errors import EngineConfigError, EngineError


class EngineTimeout(EngineError):
    """The engine did not answer in time (a hang is a finding, not a crash of ours)."""


current_request = threading.local()  # the deadline of the request this thread is sending, for _DeadlinePool
_deadlines_lock = threading.Lock()  # guards which deadline owns a pooled connection
_OWNER = "_kvpreflight_deadline"  # the attribute naming a connection's current deadline
_RECHECK_S = 0.05  # at the deadline with no socket yet (still connecting): look again this soon


class Deadline:
    """One request's total time. At the deadline a watchdog shuts the request's socket (never
    another request's: a pooled connection is owned by the deadline that last took it), so a read
    or write blocked on a server that drips bytes ends at once."""

    def __init__(self, timeout_s: float) -> None:
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise EngineConfigError(f"timeout {timeout_s!r}: not a finite number of seconds above 0")
        self.timeout_s = timeout_s
        self.connect_s = min(10.0, timeout_s)
        self.at = time.monotonic() + timeout_s
        self.fired = False
        self._ended = False
        self._conn: Any = None
        self._timer = self._arm(timeout_s)

    def _arm(self, delay_s: float) -> threading.Timer:
        timer = threading.Timer(delay_s, self._fire)
        timer.daemon = True
        timer.start()
        return timer

    def own(self, conn: Any) -> None:
        with _deadlines_lock:
            self._conn = conn
            setattr(conn, _OWNER, self)

    def passed(self) -> bool:
        return self.fired or time.monotonic() >= self.at

    def timeout(self, url: str) -> EngineTimeout:
        return EngineTimeout(f"{url}: no complete answer within {self.timeout_s:g}s (the total for the request, body included)")

    def end(self) -> None:
        with _deadlines_lock:
            self._ended = True
            self._timer.cancel()

    def _fire(self) -> None:
        with _deadlines_lock:
            if self._ended:
                return
            self.fired = True
            conn = self._conn
            if conn is not None and getattr(conn, _OWNER, None) is not self:
                return  # the connection went back to the pool: another request's now
            sock = getattr(conn, "kvpreflight_socket", None)
            if sock is None:  # not connected yet: the connect timeout ends that, then shut it
                self._timer = self._arm(_RECHECK_S)
                return
            try:
                # socket.socket's own shutdown: SSLSocket.shutdown would also drop its TLS state
                # under the reading thread
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass  # already closed: nothing left to end


class _DeadlineConnectionMixin:
    """Keeps its socket for the deadline to shut, even after http.client forgets `sock` (once a
    reply says the connection will close, the response reads on from it). The connection itself,
    TLS handshake included, is bounded by the connect timeout (Python bounds a handshake in total)."""

    kvpreflight_socket: socket.socket | None = None

    def connect(self) -> None:
        # A mixin: super() and `sock` are HTTPConnection's, which mypy cannot see from here.
        super().connect()  # type: ignore[misc]
        self.kvpreflight_socket = self.sock  # type: ignore[attr-defined]


class _DeadlineHTTPConnection(_DeadlineConnectionMixin, HTTPConnection):
    pass


class _DeadlineHTTPSConnection(_DeadlineConnectionMixin, HTTPSConnection):
    pass


class _DeadlinePoolMixin:
    """Hands each connection, as a request takes it, to that request's deadline."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]  # a mixin over urllib3's pool (see above)
        deadline = getattr(current_request, "deadline", None)
        if deadline is not None:
            deadline.own(conn)
        return conn


class _DeadlineHTTPPool(_DeadlinePoolMixin, HTTPConnectionPool):
    ConnectionCls = _DeadlineHTTPConnection


class _DeadlineHTTPSPool(_DeadlinePoolMixin, HTTPSConnectionPool):
    ConnectionCls = _DeadlineHTTPSConnection


class DeadlineAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter with connection pools that hand each connection to its request's deadline."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _DeadlineHTTPPool, "https": _DeadlineHTTPSPool}
