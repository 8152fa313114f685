"""HTTP servers that misbehave on purpose (drip bytes, never end a body, send huge bodies), for
the tests that bound kvpreflight's HTTP client in time and memory.

Each answers every request the same way: it reads the request, then hands the socket to a
behaviour, a function of (socket file, stop event). Listens on 127.0.0.1 only; always shut down
by the context manager, and every behaviour ends when the client goes away or the server stops.
"""

from __future__ import annotations

import contextlib
import socketserver
import threading
from collections.abc import Callable, Iterator
from io import BufferedIOBase

Behaviour = Callable[[BufferedIOBase, threading.Event], None]

BLOCK = b"x" * 65536  # written over and over: a server of endless bodies holds no more than this


@contextlib.contextmanager
def misbehaving_server(behaviour: Behaviour, *, read_request: bool = True) -> Iterator[str]:
    """The URL of a server on 127.0.0.1 that answers every request with `behaviour`, after reading
    the HTTP request (unless `read_request` is False: a TLS client's hello is not one)."""
    stop = threading.Event()

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            length = 0
            while read_request and (line := self.rfile.readline(65537)) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            self.rfile.read(length)
            try:
                behaviour(self.wfile, stop)
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


def head(content_type: str = "text/plain", **headers: str) -> bytes:
    """A 200's head that closes the connection after the body; `headers` spelt with _ for -."""
    lines = ["HTTP/1.1 200 OK", f"Content-Type: {content_type}", "Connection: close"]
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


def fixed(body: bytes, content_type: str = "application/json") -> Behaviour:
    """An honest reply: `body` with its length."""
    def behave(out: BufferedIOBase, stop: threading.Event) -> None:
        out.write(head(content_type=content_type, Content_Length=str(len(body))) + body)
        out.flush()
    return behave


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
