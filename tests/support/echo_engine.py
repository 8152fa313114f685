"""An engine that leaks its callers' credentials: it speaks enough of SGLang 0.5.23's wire format for
a whole `kvpreflight check` (server info, models, metrics, /tokenize, /generate streamed or not,
length refusals) and echoes the request's Authorization header, in every form a secret can take
(raw, JSON-escaped, URL-encoded, base64), into everything it sends back: the model name, error
bodies, event-stream frames (error frames and token frames), a response header, and a line of its
start-up log. Listens on 127.0.0.1 only; always stopped by the context manager."""

from __future__ import annotations

import base64
import contextlib
import html
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

CONTEXT = 2048
POOL = 8192
MAX_INPUT = min(CONTEXT - 1, POOL - 1) - 5  # SGLang's max_req_input_len: prompts of this many tokens or more are refused


def secret_forms(secret: str) -> dict[str, str]:
    """Every form of `secret` an output could carry it in."""
    raw = secret.encode()
    forms = {
        "raw": secret,
        "json": json.dumps(secret)[1:-1],
        "json-ascii": json.dumps(secret, ensure_ascii=True)[1:-1],
        "url": quote(secret, safe=""),
        "url-path": quote(secret),
        "url-plus": quote_plus(secret, safe=""),
        "base64": base64.b64encode(raw).decode(),
        "base64-unpadded": base64.b64encode(raw).decode().rstrip("="),
        "base64-url": base64.urlsafe_b64encode(raw).decode(),
        "html": html.escape(secret),
    }
    return forms


def echo_of(authorization: str) -> str:
    """What the engine says back: the header and the key in it, in each form."""
    key = authorization.removeprefix("Bearer ")
    parts = [f"{name}={form}" for name, form in secret_forms(authorization).items()]
    parts += [f"key-{name}={form}" for name, form in secret_forms(key).items()]
    parts.append("basic=" + base64.b64encode(f"tenant:{key}".encode()).decode())  # inside a longer base64 text
    return "request credentials " + " ".join(parts)


class _Engine:
    def __init__(self, log_path: Path | None) -> None:
        self.log_path = log_path
        self.lock = threading.Lock()
        self.seen: set[str] = set()  # every Authorization header received
        self.requests = 0
        self.prompt_tokens = 0
        self.generated = 0
        if log_path is not None:
            log_path.write_text(f"[TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {POOL}, KV size: 1.00 GB\n")

    def saw(self, authorization: str) -> None:
        with self.lock:
            if authorization and authorization not in self.seen:
                self.seen.add(authorization)
                if self.log_path is not None:
                    with self.log_path.open("a") as log:
                        log.write(f"[TP0] INFO new client: {echo_of(authorization)}\n")


def _metrics(engine: _Engine, echo: str) -> str:
    label = echo.replace("\\", "\\\\").replace('"', '\\"')
    return "\n".join([
        "# TYPE sglang:max_total_num_tokens gauge",
        f'sglang:max_total_num_tokens{{engine_type="unified",tp_rank="0",client="{label}"}} {POOL}',
        "# TYPE sglang:num_requests_total counter",
        f"sglang:num_requests_total {engine.requests}",
        "# TYPE sglang:prompt_tokens_total counter",
        f"sglang:prompt_tokens_total {engine.prompt_tokens}",
        "# TYPE sglang:generation_tokens_total counter",
        f"sglang:generation_tokens_total {engine.generated}",
        "# TYPE sglang:num_used_tokens gauge",
        "sglang:num_used_tokens 0",
        "",
    ])


@contextlib.contextmanager
def echo_engine(log_path: Path | None = None, *, cut_edge: bool = False) -> Iterator[tuple[str, set[str]]]:
    """(URL, the Authorization headers it received so far) of a running echoing engine; with
    `log_path`, it writes its start-up log there (the echo in a line of it). With `cut_edge`, a
    refusal is an error object without a message whose key stands where kvpreflight cuts such an
    object (300 characters of its JSON), the cut falling inside the key."""
    engine = _Engine(log_path)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Echo-Authorization", self.headers.get("Authorization", ""))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, data: Any) -> None:
            self._send(status, json.dumps(data).encode())

        def _echo(self) -> str:
            authorization = self.headers.get("Authorization", "")
            engine.saw(authorization)
            return echo_of(authorization)

        def do_GET(self) -> None:
            echo = self._echo()
            if self.path == "/health":
                self._send(200, b"")
            elif self.path in ("/server_info", "/get_server_info"):
                self._json(200, {"version": "0.5.23", "max_total_num_tokens": POOL, "context_length": CONTEXT,
                                 "max_req_input_len": MAX_INPUT, "page_size": 1, "disaggregation_mode": "null",
                                 "served_model_name": f"echo {echo}", "internal_states": []})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": f"echo-model {echo}", "max_model_len": CONTEXT}]})
            elif self.path == "/metrics":
                self._send(200, _metrics(engine, echo).encode(), "text/plain; version=0.0.4")
            else:
                self._json(404, {"detail": f"Not Found {echo}"})

        def do_POST(self) -> None:
            echo = self._echo()
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/tokenize":
                words = str(body.get("prompt", "")).split() or ["x"]
                self._json(200, {"tokens": [100 + len(w) + 7 * i % 50 for i, w in enumerate(words)], "count": len(words)})
                return
            if self.path != "/generate":
                self._json(404, {"detail": f"Not Found {echo}"})
                return
            ids = body.get("input_ids") or []
            wanted = int((body.get("sampling_params") or {}).get("max_new_tokens") or 1)
            stream = bool(body.get("stream"))
            refusal = None
            if len(ids) >= MAX_INPUT:
                refusal = f"Input length ({len(ids)} tokens) exceeds the maximum allowed length ({MAX_INPUT} tokens). {echo}"
            elif len(ids) + wanted > CONTEXT:
                refusal = f"Requested token count exceeds the model's maximum context length of {CONTEXT} tokens. {echo}"
            if refusal is not None:
                if stream:  # SGLang refuses inside a 200 event stream
                    self._send(200, f"data: {json.dumps({'error': {'message': refusal}})}\n\ndata: [DONE]\n\n".encode(),
                               "text/event-stream")
                elif cut_edge:
                    key = self.headers.get("Authorization", "").removeprefix("Bearer ")
                    head = f"{refusal.split('. ')[0]}. for key "
                    pad = 300 - len('{"code": 400, "detail": "') - len(json.dumps(head)[1:-1]) - len(json.dumps(key)[1:-1]) // 2
                    self._json(400, {"error": {"code": 400, "detail": head + "x" * pad + key + " refused"}})
                else:
                    self._json(400, {"error": {"message": refusal, "type": "BadRequestError", "code": 400}})
                return
            with engine.lock:
                engine.requests += 1
                engine.prompt_tokens += len(ids)
                engine.generated += wanted
            meta = {"prompt_tokens": len(ids), "completion_tokens": wanted, "cached_tokens": 0,
                    "finish_reason": {"type": "length", "length": wanted}}
            if stream:
                frames = [{"text": f" {echo}", "meta_info": {**meta, "completion_tokens": 1, "finish_reason": None}},
                          {"text": f" {echo} ok", "meta_info": meta}]
                self._send(200, "".join(f"data: {json.dumps(f)}\n\n" for f in frames).encode() + b"data: [DONE]\n\n",
                           "text/event-stream")
            else:
                self._json(200, {"text": f" {echo} ok", "meta_info": meta})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", engine.seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
