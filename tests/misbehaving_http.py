"""HTTP servers that misbehave on purpose (drip bytes, never end a body, send huge bodies, stall,
reset the connection), for the tests that bound kvpreflight's HTTP client in time and memory and
for the misbehaving-engine suite (`fake_engine`: an SGLang- or vLLM-shaped engine that is honest
except where told).

Each reads the request, then hands the socket to a behaviour, a function of (socket file, stop
event): the same one for every request (`misbehaving_server`), or one chosen per request
(`scripted_server`). Listens on 127.0.0.1 only; always shut down by the context manager, and every
behaviour ends when the client goes away or the server stops.
"""

from __future__ import annotations

import abc
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


# -- fake engines, honest except where a scenario says -------------------------------------------

FAKE_CONTEXT = 256  # the served context both fake engines state
# kvpreflight's near-limit prompts that must be served (boundary-accept, concurrent-capacity), with
# the room they leave for their answers, are this close under the limit.
AT_LIMIT_BAND = 5
FAKE_MODEL = "fake-model"
FAKE_TOKEN_IDS = [5, 6, 7, 8]
RESET_AFTER_S = 0.3


class Dialect(abc.ABC):
    """One engine's API as the fake speaks it: discovery routes, its limit, the shapes of an
    answer, a stream frame, an error frame and a refusal."""

    name = ""
    generate_path = ""
    over_limit_from = 0  # the shortest prompt the engine refuses as too long

    @abc.abstractmethod
    def routes(self) -> dict[tuple[str, str], Behaviour]:
        """The discovery routes the engine's adapter reads."""

    @abc.abstractmethod
    def read(self, body: Mapping[str, Any]) -> tuple[int, int, bool]:
        """(prompt tokens, max new tokens, stream) of a generation request."""

    @abc.abstractmethod
    def answer(self, g: Generate, tokens: int, finish: str | None, *, error: str | None = None) -> dict[str, Any]:
        """A whole answer with `tokens` generated; `error`: an error inside it, where the API has one (else None)."""

    @abc.abstractmethod
    def frames(self, g: Generate, tokens: int, finish: str | None) -> list[dict[str, Any]]:
        """The stream frames of `tokens` generated tokens; `finish` ends the stream (None: it goes on)."""

    def error_frame(self, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": "BadRequestError", "code": 400}}

    @abc.abstractmethod
    def refusal(self, g: Generate) -> dict[str, Any]:
        """The engine's HTTP 400 body for a prompt over its limit."""

    @abc.abstractmethod
    def clamp_refusal(self, g: Generate) -> dict[str, Any]:
        """The engine's HTTP 400 body for a prompt plus max_new_tokens over the context."""


class Sglang(Dialect):
    """SGLang 0.5: /server_info, /generate, cumulative frames, an abort finish inside a 200."""

    name = "sglang"
    generate_path = "/generate"
    pool = 1024
    # SGLang's own rule: max_req_input_len = min(context - 1, pool - 1) - 5, refused from there on.
    over_limit_from = min(FAKE_CONTEXT - 1, pool - 1) - 5

    def routes(self) -> dict[tuple[str, str], Behaviour]:
        info = {"model_path": FAKE_MODEL, "served_model_name": FAKE_MODEL, "context_length": FAKE_CONTEXT,
                "max_total_num_tokens": self.pool, "max_req_input_len": self.over_limit_from, "page_size": 1,
                "allow_auto_truncate": False, "disaggregation_mode": None, "internal_states": [], "version": "0.5.23"}
        return {("GET", "/server_info"): _json(info), ("GET", "/get_server_info"): _json(info),
                ("GET", "/v1/models"): _json(_models("sglang"))}

    def read(self, body: Mapping[str, Any]) -> tuple[int, int, bool]:
        return len(body["input_ids"]), body["sampling_params"]["max_new_tokens"], bool(body.get("stream"))

    def _meta(self, g: Generate, tokens: int, finish: Mapping[str, Any] | None) -> dict[str, Any]:
        return {"id": "fake", "prompt_tokens": g.prompt_tokens, "completion_tokens": tokens, "cached_tokens": 0,
                "finish_reason": None if finish is None else dict(finish)}

    def answer(self, g: Generate, tokens: int, finish: str | None, *, error: str | None = None) -> dict[str, Any]:
        reason = {"type": "abort", "message": error} if error is not None else {"type": finish, "length": tokens}
        return {"text": "ok " * tokens, "meta_info": self._meta(g, tokens, reason)}

    def frames(self, g: Generate, tokens: int, finish: str | None) -> list[dict[str, Any]]:
        frames = [{"text": "ok " * k, "meta_info": self._meta(g, k, None)} for k in range(1, tokens + 1)]
        if finish is not None:  # the frames are cumulative: the last one carries the finish
            frames[-1:] = [self.answer(g, tokens, finish)]
        return frames

    def refusal(self, g: Generate) -> dict[str, Any]:
        return {"object": "error", "message": f"The input ({g.prompt_tokens} tokens) is longer than the model's context "
                f"length ({FAKE_CONTEXT} tokens).", "type": "BadRequestError", "code": 400}

    def clamp_refusal(self, g: Generate) -> dict[str, Any]:
        return {"object": "error", "message": f"Requested token count exceeds the model's maximum context length of "
                f"{FAKE_CONTEXT} tokens. You requested a total of {g.prompt_tokens + g.max_new_tokens} tokens.",
                "type": "BadRequestError", "code": 400}


class Vllm(Dialect):
    """vLLM 0.32: /version, /v1/completions with token-id prompts, one frame a token and a usage
    frame last; no error inside a whole 200 answer."""

    name = "vllm"
    generate_path = "/v1/completions"
    over_limit_from = FAKE_CONTEXT  # vLLM refuses prompt_len >= max_model_len

    def routes(self) -> dict[tuple[str, str], Behaviour]:
        return {("GET", "/version"): _json({"version": "0.32.0"}), ("GET", "/v1/models"): _json(_models("vllm"))}

    def read(self, body: Mapping[str, Any]) -> tuple[int, int, bool]:
        return len(body["prompt"]), body["max_tokens"], bool(body.get("stream"))

    def _usage(self, g: Generate, tokens: int) -> dict[str, Any]:
        return {"prompt_tokens": g.prompt_tokens, "completion_tokens": tokens, "total_tokens": g.prompt_tokens + tokens}

    def answer(self, g: Generate, tokens: int, finish: str | None, *, error: str | None = None) -> dict[str, Any]:
        return {"id": "cmpl-fake", "object": "text_completion", "model": FAKE_MODEL,
                "choices": [{"index": 0, "text": "ok " * tokens, "finish_reason": finish}], "usage": self._usage(g, tokens)}

    def frames(self, g: Generate, tokens: int, finish: str | None) -> list[dict[str, Any]]:
        frames: list[dict[str, Any]] = [{"id": "cmpl-fake", "object": "text_completion",
                                          "choices": [{"index": 0, "text": "ok ", "finish_reason": None}]} for _ in range(tokens)]
        if finish is not None:
            frames.append({"id": "cmpl-fake", "object": "text_completion",
                           "choices": [{"index": 0, "text": "", "finish_reason": finish}]})
            frames.append({"id": "cmpl-fake", "object": "text_completion", "choices": [], "usage": self._usage(g, tokens)})
        return frames

    def refusal(self, g: Generate) -> dict[str, Any]:
        return {"error": {"message": f"This model's maximum context length is {FAKE_CONTEXT} tokens. However, your prompt "
                          f"contains {g.prompt_tokens} input tokens, which exceeds this limit even without any output tokens.",
                          "type": "BadRequestError", "param": "input_tokens", "code": 400}}

    def clamp_refusal(self, g: Generate) -> dict[str, Any]:
        return {"error": {"message": f"This model's maximum context length is {FAKE_CONTEXT} tokens. However, you requested "
                          f"{g.max_new_tokens} output tokens and your prompt contains {g.prompt_tokens} input tokens.",
                          "type": "BadRequestError", "param": "max_tokens", "code": 400}}


DIALECTS: dict[str, Dialect] = {d.name: d for d in (Sglang(), Vllm())}


@dataclass(frozen=True)
class Generate:
    """One generation request as the fake engine read it."""

    dialect: Dialect
    prompt_tokens: int
    max_new_tokens: int
    stream: bool

    @property
    def over_limit(self) -> bool:
        return self.prompt_tokens >= self.dialect.over_limit_from

    @property
    def at_limit(self) -> bool:
        # The prompt and the room it leaves for its answer (the concurrent pair's answers are scanned,
        # so its prompts are the limit less the answer: issue 14).
        size = self.prompt_tokens + max(0, self.max_new_tokens - 1)
        return self.dialect.over_limit_from - AT_LIMIT_BAND <= size < self.dialect.over_limit_from


Answer = Callable[[Generate], Behaviour]


def _models(owner: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": FAKE_MODEL, "object": "model", "owned_by": owner, "max_model_len": FAKE_CONTEXT}]}


def _json(data: Any, status: str = "200 OK") -> Behaviour:
    return fixed(json.dumps(data).encode(), status=status)


def _frame(data: Any) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"


def _event_stream(frames: list[Any], *, ended: bool = True) -> bytes:
    """A 200 event stream as engines send one (uvicorn): chunked, a chunk a frame, so each frame
    reaches the client as it is sent; when `ended`, with [DONE] and the last chunk."""
    if ended:
        frames = [*frames, b"[DONE]"]
    body = b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in map(_frame, frames))
    return head("text/event-stream", Transfer_Encoding="chunked") + body + (b"0\r\n\r\n" if ended else b"")


def _streamed(frames: list[Any]) -> Behaviour:
    def behave(out: BufferedIOBase, stop: threading.Event) -> None:
        out.write(_event_stream(frames))
        out.flush()
    return behave


def honest(g: Generate) -> Behaviour:
    """What the engine answers: a length refusal (HTTP 400) for a prompt over its limit or a
    prompt plus max_new_tokens over the context, else every token asked for."""
    if g.over_limit:
        return _json(g.dialect.refusal(g), "400 Bad Request")
    if g.prompt_tokens + g.max_new_tokens > FAKE_CONTEXT:
        return _json(g.dialect.clamp_refusal(g), "400 Bad Request")
    if g.stream:
        return _streamed(g.dialect.frames(g, g.max_new_tokens, "length"))
    return _json(g.dialect.answer(g, g.max_new_tokens, "length"))


def tokens_then_error(count: int, message: str) -> Answer:
    """`count` tokens, then an error: token frames and an error frame when streamed; when not, a
    200 whose finish is an abort carrying `message` (SGLang), or the honest answer where the API
    has no error inside a whole answer (vLLM)."""
    def answer(g: Generate) -> Behaviour:
        if g.stream:
            return _streamed([*g.dialect.frames(g, count, None), g.dialect.error_frame(message)])
        if isinstance(g.dialect, Sglang):
            return _json(g.dialect.answer(g, count, None, error=message))
        return honest(g)
    return answer


def tokens_then_frame(count: int, frame: bytes | Mapping[str, Any]) -> Answer:
    """Streamed: `count` token frames, then `frame` (raw bytes that are not JSON, or JSON of the
    wrong shape), then the stream's end. Not streamed: the honest answer."""
    def answer(g: Generate) -> Behaviour:
        if g.stream:
            return _streamed([*g.dialect.frames(g, count, None), frame])
        return honest(g)
    return answer


def text_with_count(value: Any) -> Answer:
    """A 200 answer with two generated tokens whose completion token count is `value` (not a
    sane count: negative, a string, absurd): in the whole answer, or in the stream's last frame."""
    def answer(g: Generate) -> Behaviour:
        if g.stream:
            frames = g.dialect.frames(g, 2, "length")
            counts = frames[-1]["meta_info"] if isinstance(g.dialect, Sglang) else frames[-1]["usage"]
            counts["completion_tokens"] = value
            return _streamed(frames)
        body = g.dialect.answer(g, 2, "length")
        counts = body["meta_info"] if isinstance(g.dialect, Sglang) else body["usage"]
        counts["completion_tokens"] = value
        return _json(body)
    return answer


def empty_ok(g: Generate) -> Behaviour:
    """HTTP 200 with an empty body."""
    return fixed(b"", "text/event-stream" if g.stream else "application/json")


def finished_without_tokens(finish: str) -> Answer:
    """HTTP 200 that finishes with `finish` (abort, length) and zero tokens generated."""
    def answer(g: Generate) -> Behaviour:
        if g.stream:
            return _streamed(g.dialect.frames(g, 0, finish))
        return _json(g.dialect.answer(g, 0, finish))
    return answer


def cut_off(after_tokens: int, *, reset: bool) -> Answer:
    """A 200 whose body stops part-way, after `after_tokens` token frames when streamed (half a
    JSON body when not): then the connection is reset (`reset`), or held open with nothing more
    sent until the server stops (a stall)."""
    def answer(g: Generate) -> Behaviour:
        def behave(out: BufferedIOBase, stop: threading.Event) -> None:
            if g.stream:
                out.write(_event_stream(g.dialect.frames(g, after_tokens, None), ended=False))
            else:
                body = json.dumps(g.dialect.answer(g, after_tokens, None)).encode()
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
def fake_engine(dialect: Dialect, *, over: Answer = honest, at: Answer = honest) -> Iterator[str]:
    """The URL of a fake engine speaking `dialect` (discovery, /tokenize, generation) that answers
    generation requests over its limit with `over`, those just under it with `at`, and every other
    one honestly. It serves no /metrics (as engines started without metrics)."""
    routes = {**dialect.routes(), ("GET", "/health"): fixed(b""),
              ("POST", "/tokenize"): _json({"tokens": FAKE_TOKEN_IDS, "count": len(FAKE_TOKEN_IDS), "max_model_len": FAKE_CONTEXT})}

    def script(request: Request) -> Behaviour:
        if (request.method, request.path) == ("POST", dialect.generate_path):
            g = Generate(dialect, *dialect.read(request.json()))
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
