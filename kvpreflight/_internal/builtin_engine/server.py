"""The engine's HTTP server: routing, request plumbing and the dispatch of a generation by role.
The endpoints themselves are in api_sglang.py and api_openai.py, the PD handoff in pd.py, pd_prefill.py and pd_decode.py.

No torch here: the engine object is built by startup.py and handed in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from kvpreflight._internal.builtin_engine import admin, api_openai, api_sglang
from kvpreflight._internal.builtin_engine.httputil import client_gone, send_bytes, send_json
from kvpreflight._internal.builtin_engine.pd_decode import DecodeHandoff
from kvpreflight._internal.builtin_engine.pd_prefill import PrefillBootstrap
from kvpreflight._internal.builtin_engine.protocol import Generation, GenParams, OnToken
from kvpreflight.model import ProcessRole

if TYPE_CHECKING:
    from kvpreflight._internal.builtin_engine.core import Engine

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class EngineServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], engine: Engine,
                 handoff: PrefillBootstrap | DecodeHandoff | None) -> None:
        self.engine = engine
        self.handoff = handoff  # the prefill's or the decode's side of the PD handoff
        self.started_at = time.time()
        # Everything /server_info reports is fixed at start-up; startup.py fills it once bound.
        self.server_info: Mapping[str, object] = {}
        super().__init__(address, EngineHandler)


class EngineHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection: a closed socket means the client left
    server_version = "kvpreflight-builtin"
    sys_version = ""
    server: EngineServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass  # no access log: request bodies may carry tenant data

    # ---- plumbing for the API modules ------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        return self.server.engine

    def reply_json(self, status: int, obj: object) -> None:
        send_json(self, status, obj)

    def reply_text(self, status: int, text: str, content_type: str = PROMETHEUS_TEXT) -> None:
        send_bytes(self, status, text.encode(), content_type)

    def reply_empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

    def frame(self, obj: object) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()

    def done(self) -> None:
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def client_gone(self) -> bool:
        return client_gone(self.connection)

    def run(self, ids: list[int], params: GenParams, body: dict[str, Any], on_token: OnToken | None) -> Generation | None:
        """Generate by this engine's role. Returns None when the client disconnected."""
        engine = self.engine
        if engine.never_scheduled(self.client_gone):  # fault wedge-after-disconnect
            return None
        if engine.role is ProcessRole.UNIFIED:
            return engine.run_unified(ids, params, on_token, self.client_gone)
        handoff = self.server.handoff
        if isinstance(handoff, PrefillBootstrap):
            return handoff.run(ids, params, body, self.client_gone)
        assert isinstance(handoff, DecodeHandoff)  # startup.py gives each PD role its handoff
        return handoff.run(ids, params, body, self.client_gone, on_token)

    def _body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    # ---- routes ------------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        handler = GET_ROUTES.get(path)
        if handler is None:
            self.reply_json(404, {"detail": "Not Found"})
            return
        handler(self)

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        handler = POST_ROUTES.get(path)
        if handler is None:
            self.reply_json(404, {"detail": "Not Found"})
            return
        body = self._body()
        if body is None:
            self.reply_json(400, {"error": {"message": "The request body must be a JSON object."}})
            return
        try:
            handler(self, body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_PUT = do_POST


def _ok(handler: EngineHandler) -> None:
    handler.reply_empty(200)


GET_ROUTES: Mapping[str, Callable[[EngineHandler], None]] = {
    "/server_info": api_sglang.server_info,
    "/get_server_info": api_sglang.server_info,
    "/v1/models": api_openai.models,
    "/model_info": api_sglang.model_info,
    "/get_model_info": api_sglang.model_info,
    "/v1/loads": api_sglang.loads,
    "/metrics": api_sglang.metrics_page,
    "/health": _ok,
    "/health_generate": api_sglang.health_generate,
    "/ready": _ok,
}

POST_ROUTES: Mapping[str, Callable[[EngineHandler, dict[str, Any]], None]] = {
    "/generate": api_sglang.generate,
    "/v1/completions": api_openai.completions,
    "/tokenize": api_openai.tokenize,
    "/v1/tokenize": api_openai.tokenize,
    admin.FAULTS_PATH: admin.set_faults,  # tests only, refused unless bound to 127.0.0.1
}
