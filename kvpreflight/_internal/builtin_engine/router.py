"""The router role: the one client-facing URL of a PD deployment, like sglang_router / smg with
--pd-disaggregation. Each request goes to one prefill (round robin) and to the decode engine at
once, tagged with SGLang's bootstrap fields: the chosen prefill's bootstrap server (its host, and
the `disaggregation_bootstrap_port` its /server_info reports) and a random room. The prefill's
answer decides first: if it refused the request, the client gets the prefill's error; otherwise
the decode's answer is relayed.

A client disconnect is passed on to the decode engine (its connection is closed), the way a
load balancer turns a disconnect into a cancel; the prefill's in-flight transfer is not stopped.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kvpreflight._internal.builtin_engine.config import EngineConfig, ServeConfigError
from kvpreflight._internal.builtin_engine.httputil import client_gone, send_bytes, send_json, serve_until_stopped

POLL_S = 0.02
WORKERS_PATH = "/_kvpreflight/workers"  # tests only: replace the prefill workers at run time (loopback only)
LOOPBACK = "127.0.0.1"
UPSTREAM_TIMEOUT_S = 600.0


def _log(message: str) -> None:
    sys.stderr.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def _host_port(url: str, flag: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ServeConfigError(f"{flag} {url!r} is not an http://HOST:PORT URL")
    return parts.hostname, parts.port or 80


class _Upstream(threading.Thread):
    """One request to an engine, read in the background; `close()` drops the connection."""

    def __init__(self, url: str, path: str, body: bytes, read_all: bool) -> None:
        super().__init__(daemon=True)
        host, port = _host_port(url, "upstream")
        self.conn = http.client.HTTPConnection(host, port, timeout=UPSTREAM_TIMEOUT_S)
        self.path, self.body, self.read_all = path, body, read_all
        self.response: http.client.HTTPResponse | None = None
        self.data = b""
        self.error: Exception | None = None
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            self.conn.request("POST", self.path, body=self.body, headers={"Content-Type": "application/json"})
            self.response = self.conn.getresponse()
            if self.read_all:
                self.data = self.response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.error = exc
        finally:
            self.ready.set()

    def reply(self) -> http.client.HTTPResponse:
        """The response; read it once `ready` is set and `error` is None."""
        assert self.response is not None, "no response: check ready and error first"
        return self.response

    def close(self) -> None:
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conn.close()


class RouterServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], config: EngineConfig) -> None:
        assert config.decode_url is not None  # EngineConfig.validate() requires it for the router
        for url in config.prefill_urls:
            _host_port(url, "--prefill-url")
        self.config = config
        self.prefill_urls = [u.rstrip("/") for u in config.prefill_urls]
        self.decode_url = config.decode_url.rstrip("/")
        _host_port(self.decode_url, "--decode-url")
        self._next = 0
        self._lock = threading.Lock()
        self._bootstrap: dict[str, tuple[str, int]] = {}  # prefill URL -> its bootstrap server
        super().__init__(address, RouterHandler)

    def set_prefills(self, urls: list[str]) -> None:
        with self._lock:
            self.prefill_urls = [u.rstrip("/") for u in urls]

    def pick_prefill(self) -> str:
        with self._lock:
            url = self.prefill_urls[self._next % len(self.prefill_urls)]
            self._next += 1
            return url

    def bootstrap_of(self, prefill_url: str) -> tuple[str, int] | None:
        """The prefill's bootstrap server (host, port), from its /server_info; None when unknown."""
        with self._lock:
            known = self._bootstrap.get(prefill_url)
        if known is not None:
            return known
        try:
            with urllib.request.urlopen(prefill_url + "/server_info", timeout=10) as resp:
                info = json.loads(resp.read())
        except (OSError, ValueError):
            return None
        port = info.get("disaggregation_bootstrap_port") if isinstance(info, dict) else None
        if not isinstance(port, int) or isinstance(port, bool):
            return None
        found = (_host_port(prefill_url, "--prefill-url")[0], port)
        with self._lock:
            self._bootstrap[prefill_url] = found
        return found


class RouterHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server_version = "kvpreflight-builtin-router"
    sys_version = ""
    server: RouterServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass

    def _json(self, status: int, obj: object) -> None:
        send_json(self, status, obj)

    def client_gone(self) -> bool:
        return client_gone(self.connection)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        if path == "/workers":
            workers: list[dict[str, Any]] = [
                {"url": u, "worker_type": "prefill", "bootstrap_port": (self.server.bootstrap_of(u) or (None, None))[1],
                 "is_healthy": True}
                for u in self.server.prefill_urls
            ]
            workers.append({"url": self.server.decode_url, "worker_type": "decode", "is_healthy": True})
            self._json(200, {"workers": workers, "total": len(workers)})
        elif path in ("/health", "/liveness", "/readiness"):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/v1/models":
            self._proxy_get(self.server.decode_url + path)
        else:
            self._json(404, {"detail": "Not Found"})

    def _proxy_get(self, url: str) -> None:
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                self._json(resp.status, json.loads(resp.read()))
        except (OSError, ValueError) as exc:
            self._json(502, {"error": {"message": f"upstream {url} failed: {exc}"}})

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path in ("/tokenize", "/v1/tokenize"):
            self._relay_plain(self.server.pick_prefill(), path, raw)
            return
        if path == WORKERS_PATH:
            self._set_workers(raw)
            return
        if path not in ("/generate", "/v1/completions"):
            self._json(404, {"detail": "Not Found"})
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            self._json(400, {"error": {"message": "The request body must be a JSON object."}})
            return
        prefill_url = self.server.pick_prefill()
        bootstrap = self.server.bootstrap_of(prefill_url)
        if bootstrap is None:
            self._json(503, {"error": {"message": f"prefill worker {prefill_url} reports no bootstrap port"}})
            return
        body.update(bootstrap_host=bootstrap[0], bootstrap_port=bootstrap[1], bootstrap_room=random.getrandbits(63))
        data = json.dumps(body).encode()
        stream = bool(body.get("stream"))
        prefill = _Upstream(prefill_url, path, data, read_all=True)
        decode = _Upstream(self.server.decode_url, path, data, read_all=False)
        decode.start()
        prefill.start()
        try:
            self._answer(prefill, decode, stream)
        except (BrokenPipeError, ConnectionResetError):
            decode.close()

    def _answer(self, prefill: _Upstream, decode: _Upstream, stream: bool) -> None:
        while not prefill.ready.wait(POLL_S):
            if self.client_gone():
                decode.close()
                return
        if prefill.error is not None:
            decode.close()
            self._json(502, {"error": {"message": f"prefill worker failed: {prefill.error}"}})
            return
        answer = prefill.reply()
        refused = answer.status != 200 or (stream and b'data: {"error"' in prefill.data)
        if refused:
            decode.close()
            send_bytes(self, answer.status, prefill.data, answer.getheader("Content-Type", "application/json"))
            return
        while not decode.ready.wait(POLL_S):
            if self.client_gone():
                decode.close()
                return
        if decode.error is not None:
            self._json(502, {"error": {"message": f"decode worker failed: {decode.error}"}})
            return
        resp = decode.reply()
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.getheader("Content-Type", "application/json"))
        self.end_headers()
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            self.wfile.write(chunk)
            self.wfile.flush()
        decode.close()

    def _set_workers(self, raw: bytes) -> None:
        """Test only: POST {"prefill_urls": [URL, ...]} replaces the prefill workers from now on (a
        worker added behind the router while a watcher runs). Refused unless the router listens on
        127.0.0.1, like the engines' fault switch (admin.py)."""
        if self.server.server_address[0] != LOOPBACK:
            self._json(403, {"error": {"message": f"{WORKERS_PATH} is for tests on {LOOPBACK} only"}})
            return
        try:
            body = json.loads(raw or b"{}")
            urls = body["prefill_urls"]
            if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
                raise ValueError
            for url in urls:
                _host_port(url, "prefill_urls")
        except (ValueError, KeyError, TypeError, ServeConfigError):
            self._json(400, {"error": {"message": 'send {"prefill_urls": ["http://HOST:PORT", ...]} (at least one)'}})
            return
        self.server.set_prefills(urls)
        _log(f"prefill workers now {','.join(self.server.prefill_urls)}")
        self._json(200, {"prefill_urls": self.server.prefill_urls})

    def _relay_plain(self, url: str, path: str, raw: bytes) -> None:
        up = _Upstream(url, path, raw, read_all=True)
        up.run()
        if up.error is not None:
            self._json(502, {"error": {"message": f"upstream {url} failed: {up.error}"}})
            return
        resp = up.reply()
        send_bytes(self, resp.status, up.data, resp.getheader("Content-Type", "application/json"))


def serve_router(config: EngineConfig) -> int:
    try:
        httpd = RouterServer((config.host, config.port), config)
    except OSError as exc:
        raise ServeConfigError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    _log(f"Router running on http://{config.host}:{httpd.server_address[1]} "
         f"prefill={','.join(httpd.prefill_urls)} decode={httpd.decode_url}")
    return serve_until_stopped(httpd)
