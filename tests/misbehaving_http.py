"""HTTP servers that misbehave on purpose (drip bytes, never end a body, send huge bodies, stall,
reset the connection), for the tests that bound kvpreflight's HTTP client in time and memory and
for the misbehaving-engine suite (`fake_sglang`: an engine that is honest except where told).

Each reads the request, then hands the socket to a behaviour, a function of (socket file, stop
event): the same one for every request (`misbehaving_server`), or one chosen per request
(`scripted_server`). Listens on 127.0.0.1 only; always shut down by the context manager, and every
behaviour ends when the client goes away or the server stops.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import struct
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from io import BufferedIOBase
from typing import Any

Behaviour = Callable[[BufferedIOBase, threading.Event], None]


@dataclass(frozen=True)
class Request:
    """What a scripted server read: `POST /generate` and its body."""

    method: str
    path: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else {}


Script = Callable[[Request], Behaviour]


class ResetConnection(Exception):
    """Raised by a behaviour: the server resets the connection (TCP RST), as a crashed engine does."""

BLOCK = b"x" * 65536  # written over and over: a server of endless bodies holds no more than this


@contextlib.contextmanager
def misbehaving_server(behaviour: Behaviour, *, read_request: bool = True) -> Iterator[str]:
    """The URL of a server on 127.0.0.1 that answers every request with `behaviour`, after reading
    the HTTP request (unless `read_request` is False: a TLS client's hello is not one)."""
    with scripted_server(lambda _request: behaviour, read_request=read_request) as url:
        yield url


@contextlib.contextmanager
def scripted_server(script: Script, *, read_request: bool = True) -> Iterator[str]:
    """The URL of a server on 127.0.0.1 that answers each request with the behaviour `script`
    picks for it."""
    stop = threading.Event()

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            length = 0
            request_line = self.rfile.readline(65537).decode("latin-1").split() if read_request else []
            while read_request and (line := self.rfile.readline(65537)) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            body = self.rfile.read(length)
            method, path = (request_line + ["", ""])[:2]
            try:
                script(Request(method, path, body))(self.wfile, stop)
            except ResetConnection:
                # Linger on, for 0 s: close() then sends RST instead of FIN.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up: the point of most of these servers

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def head(content_type: str = "text/plain", *, status: str = "200 OK", **headers: str) -> bytes:
    """A head (a 200's by default) that closes the connection after the body; `headers` spelt
    with _ for -."""
    lines = [f"HTTP/1.1 {status}", f"Content-Type: {content_type}", "Connection: close"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def drip_body(every_s: float) -> Behaviour:
    """Headers at once (a 1 MB body promised), then one byte every `every_s` seconds."""
    def behave(out: BufferedIOBase, stop: threading.Event) -> None:
        out.write(head(Content_Length="1000000"))
        out.flush()
        while not stop.wait(every_s):
            out.write(b"x")
            out.flush()
    return behave


def drip_headers(every_s: float) -> Behaviour:
    """The status line, then header bytes one every `every_s` seconds, never a complete head."""
    def behave(out: BufferedIOBase, stop: threading.Event) -> None:
        out.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        out.flush()
        while not stop.wait(every_s):
            out.write(b"x")
            out.flush()
    return behave


def drip_tls_handshake(every_s: float) -> Behaviour:
    """To a TLS client: a handshake record header promising 16 KiB, then a byte every `every_s`."""
    def behave(out: BufferedIOBase, stop: threading.Event) -> None:
        out.write(bytes([0x16, 0x03, 0x03, 0x40, 0x00]))
        out.flush()
        while not stop.wait(every_s):
            out.write(b"\x00")
            out.flush()
    return behave


def drip_stream(every_s: float) -> Behaviour:
    """An event stream whose frames come a byte every `every_s` seconds."""
    frame = b'data: {"text": "a"}\n\n'

    def behave(out: BufferedIOBase, stop: threading.Event) -> None:
        out.write(head(content_type="text/event-stream"))
        out.write(frame)
        out.flush()
        for byte in frame * 1000:
            if stop.wait(every_s):
                return
            out.write(bytes([byte]))
            out.flush()
    return behave


def chunked(total: int | None, content_type: str = "text/plain", block: bytes = BLOCK) -> Behaviour:
    """A chunked body of `total` bytes (None: endless), written as fast as the client reads."""
    def behave(out: BufferedIOBase, stop: threading.Event) -> None:
        out.write(head(content_type=content_type, Transfer_Encoding="chunked"))
        sent = 0
        while not stop.is_set() and (total is None or sent < total):
            piece = block if total is None else block[:total - sent]
            out.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += len(piece)
        out.write(b"0\r\n\r\n")
        out.flush()
    return behave


def sized(total: int, content_type: str = "text/plain", declare: bool = True) -> Behaviour:
    """A body of `total` bytes, its length declared (Content-Length) or not (ended by closing)."""
    def behave(out: BufferedIOBase, stop: threading.Event) -> None:
        out.write(head(content_type, Content_Length=str(total)) if declare else head(content_type))
        sent = 0
        while not stop.is_set() and sent < total:
            piece = BLOCK[:total - sent]
            out.write(piece)
            sent += len(piece)
        out.flush()
    return behave


def fixed(body: bytes, content_type: str = "application/json", *, status: str = "200 OK") -> Behaviour:
    """An honest reply: `body` with its length."""
    def behave(out: BufferedIOBase, stop: threading.Event) -> None:
        out.write(head(content_type, status=status, Content_Length=str(len(body))) + body)
        out.flush()
    return behave


# -- a fake SGLang engine, honest except where a scenario says ----------------------------------

# What the fake engine states: a 256-token context and a pool that holds it, so SGLang's own rule
# (max_req_input_len = min(context - 1, pool - 1) - 5) makes every prompt of 250 tokens or more
# over the limit, and 249 the longest one accepted.
FAKE_CONTEXT = 256
FAKE_POOL = 1024
FAKE_MAX_INPUT = min(FAKE_CONTEXT - 1, FAKE_POOL - 1) - 5
# kvpreflight's near-limit prompts that must be served (boundary-accept, concurrent-capacity) are
# this close under the limit; the isolation probes' prompts leave room for a longer answer.
AT_LIMIT_BAND = 5
FAKE_MODEL = "fake-sglang"
FAKE_TOKEN_IDS = [5, 6, 7, 8]
RESET_AFTER_S = 0.3


@dataclass(frozen=True)
class Generate:
    """One POST /generate as the fake engine read it."""

    prompt_tokens: int
    max_new_tokens: int
    stream: bool

    @property
    def over_limit(self) -> bool:
        return self.prompt_tokens >= FAKE_MAX_INPUT

    @property
    def at_limit(self) -> bool:
        return FAKE_MAX_INPUT - AT_LIMIT_BAND <= self.prompt_tokens < FAKE_MAX_INPUT


Answer = Callable[[Generate], Behaviour]


def _json(data: Any, status: str = "200 OK") -> Behaviour:
    return fixed(json.dumps(data).encode(), status=status)


def _meta(g: Generate, generated: int, finish: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"id": "fake", "prompt_tokens": g.prompt_tokens, "completion_tokens": generated, "cached_tokens": 0,
            "finish_reason": dict(finish) if finish is not None else None}


def _frame(data: Any) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"


def _token_frames(g: Generate, count: int) -> list[bytes]:
    """SGLang's frames are cumulative: each carries the text and counts so far."""
    return [_frame({"text": "ok " * k, "meta_info": _meta(g, k, None)}) for k in range(1, count + 1)]


def _event_stream(frames: list[bytes], *, ended: bool = True) -> bytes:
    """A 200 event stream as engines send one (uvicorn): chunked, a chunk a frame, so each frame
    reaches the client as it is sent; unless `ended`, without the last chunk."""
    body = b"".join(b"%x\r\n%s\r\n" % (len(frame), frame) for frame in frames)
    return head("text/event-stream", Transfer_Encoding="chunked") + body + (b"0\r\n\r\n" if ended else b"")


def _streamed(frames: list[bytes]) -> Behaviour:
    def behave(out: BufferedIOBase, stop: threading.Event) -> None:
        out.write(_event_stream(frames))
        out.flush()
    return behave


def honest(g: Generate) -> Behaviour:
    """What SGLang 0.5 answers: a length refusal (HTTP 400) for a prompt over its limit or a
    prompt plus max_new_tokens over the context, else every token asked for."""
    if g.over_limit:
        return _json({"object": "error", "message": f"The input ({g.prompt_tokens} tokens) is longer than the model's "
                      f"context length ({FAKE_CONTEXT} tokens).", "type": "BadRequestError", "code": 400}, "400 Bad Request")
    if g.prompt_tokens + g.max_new_tokens > FAKE_CONTEXT:
        return _json({"object": "error", "message": f"Requested token count exceeds the model's maximum context length of "
                      f"{FAKE_CONTEXT} tokens. You requested a total of {g.prompt_tokens + g.max_new_tokens} tokens.",
                      "type": "BadRequestError", "code": 400}, "400 Bad Request")
    done = {"type": "length", "length": g.max_new_tokens}
    if not g.stream:
        return _json({"text": "ok " * g.max_new_tokens, "meta_info": _meta(g, g.max_new_tokens, done)})
    last = {"text": "ok " * g.max_new_tokens, "meta_info": _meta(g, g.max_new_tokens, done)}
    return _streamed([*_token_frames(g, g.max_new_tokens - 1), _frame(last), _frame(b"[DONE]")])


def tokens_then_error(count: int, message: str) -> Answer:
    """`count` tokens, then an error: frames and then an error frame when streamed; a 200 whose
    finish is an abort carrying `message` (SGLang's in-answer error) when not."""
    def answer(g: Generate) -> Behaviour:
        if g.stream:
            return _streamed([*_token_frames(g, count), _frame({"error": {"message": message}})])
        return _json({"text": "ok " * count, "meta_info": _meta(g, count, {"type": "abort", "message": message})})
    return answer


def empty_ok(g: Generate) -> Behaviour:
    """HTTP 200 with an empty body."""
    return fixed(b"", "text/event-stream" if g.stream else "application/json")


def finished_without_tokens(finish: Mapping[str, Any]) -> Answer:
    """HTTP 200, `finish` as the finish reason, zero tokens generated."""
    def answer(g: Generate) -> Behaviour:
        data = {"text": "", "meta_info": _meta(g, 0, finish)}
        if g.stream:
            return _streamed([_frame(data), _frame(b"[DONE]")])
        return _json(data)
    return answer


def cut_off(after_tokens: int, *, reset: bool) -> Answer:
    """A 200 whose body stops part-way, after `after_tokens` token frames when streamed (half a
    JSON body when not): then the connection is reset (`reset`), or held open with nothing more
    sent until the server stops (a stall)."""
    def answer(g: Generate) -> Behaviour:
        def behave(out: BufferedIOBase, stop: threading.Event) -> None:
            if g.stream:
                out.write(_event_stream(_token_frames(g, after_tokens), ended=False))
            else:
                body = json.dumps({"text": "ok " * after_tokens, "meta_info": _meta(g, after_tokens, None)}).encode()
                out.write(head("application/json", Content_Length=str(len(body))) + body[:len(body) // 2])
            out.flush()
            if reset:
                # A moment first: a reset throws away what the client has not read yet.
                stop.wait(RESET_AFTER_S)
                raise ResetConnection
            stop.wait()
        return behave
    return answer


@contextlib.contextmanager
def fake_sglang(*, over: Answer = honest, at: Answer = honest) -> Iterator[str]:
    """The URL of a fake SGLang engine (discovery, /tokenize, /generate) that answers generation
    requests over its limit with `over`, those just under it with `at`, and every other one
    honestly. It serves no /metrics (SGLang without --enable-metrics)."""
    info = {"model_path": FAKE_MODEL, "served_model_name": FAKE_MODEL, "context_length": FAKE_CONTEXT,
            "max_total_num_tokens": FAKE_POOL, "max_req_input_len": FAKE_MAX_INPUT, "page_size": 1,
            "allow_auto_truncate": False, "disaggregation_mode": None, "internal_states": [], "version": "0.5.23"}
    models = {"object": "list", "data": [{"id": FAKE_MODEL, "object": "model", "owned_by": "sglang", "max_model_len": FAKE_CONTEXT}]}
    routes: dict[tuple[str, str], Behaviour] = {
        ("GET", "/health"): fixed(b""),
        ("GET", "/server_info"): _json(info),
        ("GET", "/get_server_info"): _json(info),
        ("GET", "/v1/models"): _json(models),
        ("POST", "/tokenize"): _json({"tokens": FAKE_TOKEN_IDS, "count": len(FAKE_TOKEN_IDS), "max_model_len": FAKE_CONTEXT}),
    }

    def script(request: Request) -> Behaviour:
        if (request.method, request.path) == ("POST", "/generate"):
            body = request.json()
            g = Generate(len(body["input_ids"]), body["sampling_params"]["max_new_tokens"], bool(body.get("stream")))
            return (over if g.over_limit else at if g.at_limit else honest)(g)
        return routes.get((request.method, request.path), _json({"detail": "Not Found"}, "404 Not Found"))

    with scripted_server(script) as url:
        yield url


def rss_kib(field: str = "VmRSS") -> int:
    """This process's resident memory (VmRSS) or its peak since the last reset (VmHWM), in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


class PeakRss:
    """Peak resident memory of this process inside a `with`, above what it held at the start.

    The kernel's own peak (VmHWM, reset through /proc/self/clear_refs) where that may be written;
    a 5 ms sampler of VmRSS besides, which is all there is where it may not.
    """

    def __enter__(self) -> PeakRss:
        self.start_kib = rss_kib()
        try:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")
            self._kernel_peak = True
        except OSError:
            self._kernel_peak = False
        self._sampled_kib = self.start_kib
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self._sampled_kib = max(self._sampled_kib, rss_kib())

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._sampler.join()
        peak = max(self._sampled_kib, rss_kib("VmHWM") if self._kernel_peak else 0)
        self.growth_mb = (peak - self.start_kib) * 1024 / 1e6
