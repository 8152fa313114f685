"""The one HTTP client every adapter and probe uses.

Why a wrapper: redirects are never followed (a preflight that follows a redirect to another host
checks the wrong engine), every transport failure becomes one EngineError line, and response
bodies are read in full (never silently cut) with their length and sha256 kept for evidence.

Everything an engine sends is untrusted, so every request is bounded twice:
- in time: `timeout_s` is the whole request's deadline, body included. requests only bounds each
  read, so a server that drips a byte a second would hold a read-by-read timeout forever; at the
  deadline a watchdog shuts the request's socket, which ends a blocked read at once;
- in size: each kind of body has a cap (`BodyLimit`), read incrementally, and a body over it is an
  error saying which cap and how big, never a silently cut body.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import re
import ssl
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests
import requests.adapters
import urllib3

from kvpreflight._internal.engines.deadline import Deadline, DeadlineAdapter, EngineTimeout, current_request
from kvpreflight._internal.engines.errors import EngineConfigError, EngineError
from kvpreflight._internal.engines.untrusted import shape
from kvpreflight._internal.redact import cut
from kvpreflight.targets import REQUEST_TIMEOUT_S

MiB = 1 << 20


class BodyLimit(enum.IntEnum):
    """The most bytes of each kind of reply body kvpreflight reads (bodies are held in memory,
    then parsed). Each is far above what an honest engine sends and far below what would hurt
    the CI runner kvpreflight runs on."""

    # /v1/models, /version, /server_info, /props, /info: a few KiB from every engine we know;
    # 4 MiB still holds a model list of thousands of entries.
    JSON_INFO = 4 * MiB
    # A non-streamed completion or a /tokenize of a seed text: probes ask for a few tokens, and
    # even 32k tokens with their ids and top-5 logprobs (~200 bytes a token) is ~6.5 MiB.
    COMPLETION = 8 * MiB
    # Prometheus text from /metrics: vLLM, SGLang, TGI serve 20-200 KiB; per-model and per-LoRA
    # labels multiply that, and 16 MiB leaves ~100x room.
    METRICS = 16 * MiB
    # A server-sent-event stream: one 150-400 byte JSON frame a token (~700 bytes with top-5
    # logprobs); 24 MiB holds 32k tokens even so, and probes ask for 256 at most. A stream is
    # held twice (its body, and its frames as text), ~2.3x this at the worst: under 100 MB.
    EVENT_STREAM = 24 * MiB

    @property
    def kind(self) -> str:
        return _BODY_KINDS[self]


_BODY_KINDS = {
    BodyLimit.JSON_INFO: "JSON info",
    BodyLimit.COMPLETION: "a completion",
    BodyLimit.METRICS: "metrics text",
    BodyLimit.EVENT_STREAM: "an event stream",
}

# A stream's frames are kept as Python strings (~60 bytes of object each beyond their text), so a
# stream of tiny frames ("data:\n" is 6 bytes) would hold ten times its size: a stream may have
# one frame per this many bytes of its cap (a real token frame is 150 bytes or more).
_MIN_FRAME_BYTES = 128
# A GET's default cap: the largest kind fetched by GET, as a plain number (a GET is not always
# metrics, so its message names no kind).
_GET_MAX_BYTES = int(BodyLimit.METRICS)
_CHUNK_BYTES = 64 * 1024  # each read of a body; a fixed size, so no single read holds a whole body
_CERT_FILE_MAX_BYTES = 1 * MiB  # a PEM certificate chain or key is a few KiB
RECONNECT_PAUSE_S = 0.2  # before the one retry of a request whose connection was never made


class BodyTooLarge(EngineError):
    """A reply body over its cap: nothing was measured from it (exit 3), and nothing was cut."""


@dataclass(frozen=True)
class HttpReply:
    url: str
    status: int
    body: bytes = field(repr=False)
    elapsed_s: float
    content_type: str = ""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)  # names lower-cased
    reconnected: str | None = None  # sent a second time: why (`HttpClient._send`)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python reads
            snippet = "empty body" if not self.body else f"{len(self.body)} bytes, not JSON"
            raise EngineError(f"{self.url}: expected JSON, got {snippet} (HTTP {self.status})") from None

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class HttpClient:
    """One HTTP session to the engines: bounded reads, no proxies from the environment, mutual TLS if asked."""

    def __init__(
        self,
        *,
        headers: Mapping[str, str] | None = None,
        ca_bundle: str | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
        client_cert: str | None = None,
        client_key: str | None = None,
    ) -> None:
        """`client_cert` (PEM, with the key in it when `client_key` is None) and `client_key` are
        the `--client-cert` / `--client-key` files for a gateway that requires mutual TLS; they
        are checked here, before any request, and no message ever shows their path or content."""
        cert = client_certificate(client_cert, client_key)
        self.session = requests.Session()
        self.session.headers.update({"User-Agent": "kvpreflight"})
        self.session.headers.update(dict(headers or {}))
        self.session.trust_env = False  # no proxies from the environment: talk to the engine itself
        if ca_bundle:
            self.session.verify = ca_bundle
        if cert is not None:
            self.session.cert = cert
        for scheme in ("http://", "https://"):
            self.session.mount(scheme, DeadlineAdapter())
        self.timeout_s = timeout_s

    def close(self) -> None:
        self.session.close()

    def _send(self, method: str, url: str, *, json_body: Any, timeout_s: float | None,
              headers: Mapping[str, str] | None = None) -> tuple[requests.Response, Deadline, str | None]:
        """Send and read the headers; the returned deadline is running and the caller ends it. A
        connection that failed before anything was sent (refused, reset while connecting: the
        engine never saw the request) is tried once more, and the third value says so; a loaded
        2-core machine refused 1 of 28 connections to a healthy llama-server once."""
        reconnected = None
        while True:
            deadline = Deadline(timeout_s if timeout_s is not None else self.timeout_s)
            current_request.deadline = deadline
            try:
                resp = self.session.request(method, url, json=json_body, timeout=(deadline.connect_s, deadline.timeout_s),
                                            allow_redirects=False, stream=True, headers=dict(headers) if headers else None)
                break
            except Exception as exc:
                deadline.end()
                if reconnected is None and _never_connected(exc):
                    reconnected = f"the first connection failed before anything was sent ({_reason(exc)}); sent again once"
                    time.sleep(RECONNECT_PAUSE_S)
                    continue
                error = _transport_error(url, exc, deadline, client_cert=self.session.cert is not None)
                if error is None:
                    raise
                raise error from None
            finally:
                current_request.deadline = None
        if 300 <= resp.status_code < 400:
            deadline.end()
            location = resp.headers.get("Location", "?")
            resp.close()
            raise EngineError(f"{url}: redirected (HTTP {resp.status_code}) to {location}; "
                              "not followed, point kvpreflight at the engine itself")
        return resp, deadline, reconnected

    def request(self, method: str, url: str, *, json_body: Any = None, timeout_s: float | None = None,
                max_bytes: int = BodyLimit.COMPLETION, headers: Mapping[str, str] | None = None) -> HttpReply:
        """One request read in full within `timeout_s` (else EngineTimeout) and `max_bytes` (else
        BodyTooLarge)."""
        start = time.monotonic()
        resp, deadline, reconnected = self._send(method, url, json_body=json_body, timeout_s=timeout_s, headers=headers)
        try:
            _refuse_declared_size(url, resp, max_bytes)
            body = bytearray()
            for chunk in _body_chunks(url, resp, deadline):
                body += chunk
                if len(body) > max_bytes:
                    raise _too_large(url, max_bytes, f"stopped reading after {_size(len(body))}")
        finally:
            deadline.end()
            resp.close()
        return HttpReply(url, resp.status_code, bytes(body), time.monotonic() - start, resp.headers.get("Content-Type", ""),
                         {k.lower(): v for k, v in resp.headers.items()}, reconnected)

    def get(self, url: str, *, timeout_s: float | None = None, max_bytes: int = _GET_MAX_BYTES) -> HttpReply:
        """A GET; by default capped at the largest kind of body fetched by GET (metrics). Pass
        `max_bytes=BodyLimit.METRICS` (or `.JSON_INFO`) to have the kind named when it is hit."""
        return self.request("GET", url, timeout_s=timeout_s, max_bytes=max_bytes)

    def post(self, url: str, body: Any, *, timeout_s: float | None = None, max_bytes: int = BodyLimit.COMPLETION,
             headers: Mapping[str, str] | None = None) -> HttpReply:
        return self.request("POST", url, json_body=body, timeout_s=timeout_s, max_bytes=max_bytes, headers=headers)

    def get_json(self, url: str, *, timeout_s: float | None = None, max_bytes: int = BodyLimit.JSON_INFO) -> Any:
        reply = self.get(url, timeout_s=timeout_s, max_bytes=max_bytes)
        if reply.status != 200:
            raise EngineError(f"{url}: HTTP {reply.status}")
        return reply.json()

    def post_stream(self, url: str, body: Any, *, timeout_s: float, max_bytes: int = BodyLimit.EVENT_STREAM,
                    headers: Mapping[str, str] | None = None) -> StreamReply:
        """POST and read a server-sent-event stream to its end, the deadline (then `timed_out`) or
        a broken connection (then `cut_off` says how), with the frames that came before. No
        headers by the deadline is EngineTimeout; a stream over `max_bytes` (or with more frames
        than one per _MIN_FRAME_BYTES of it) is BodyTooLarge."""
        start = time.monotonic()
        resp, deadline, reconnected = self._send("POST", url, json_body=body, timeout_s=timeout_s, headers=headers)
        frames: list[str] = []
        max_frames = max(1, max_bytes // _MIN_FRAME_BYTES)
        raw = bytearray()
        timed_out = False
        cut_off = None
        first_frame_s = None
        try:
            _refuse_declared_size(url, resp, max_bytes)
            for line in _lines(url, resp, deadline, max_bytes):
                raw += line
                raw += b"\n"
                text = line.decode("utf-8", errors="replace").strip()
                if text.startswith("data:"):
                    if len(frames) >= max_frames:
                        raise BodyTooLarge(f"{url}: event stream of more than {max_frames:,} frames (one per {_MIN_FRAME_BYTES} "
                                           f"bytes of its {_size(max_bytes)} limit) in {_size(len(raw))}; nothing was measured from it")
                    frames.append(text[5:].strip())
                    if first_frame_s is None:
                        first_frame_s = time.monotonic() - start
        except EngineTimeout:
            timed_out = True
        except BodyTooLarge:
            raise
        except EngineError as exc:  # the frames before the break were sent: a finding, kept
            cut_off = str(exc)
        finally:
            deadline.end()
            resp.close()
        return StreamReply(url, resp.status_code, tuple(frames), bytes(raw), time.monotonic() - start, timed_out, first_frame_s,
                           cut_off, reconnected)


@dataclass(frozen=True)
class StreamReply:
    url: str
    status: int
    frames: tuple[str, ...] = field(repr=False)
    body: bytes = field(repr=False)
    elapsed_s: float = 0.0
    timed_out: bool = False
    first_frame_s: float | None = None
    cut_off: str | None = None  # the connection broke before the stream ended: how
    reconnected: str | None = None  # sent a second time: why (`HttpClient._send`)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()

    def events(self) -> Iterator[Any]:
        """Each data frame as JSON; `[DONE]` ends the stream; a non-JSON frame is an error."""
        for frame in self.frames:
            if frame == "[DONE]":
                return
            try:
                yield json.loads(frame)
            except (ValueError, RecursionError):
                raise EngineError(f"{self.url}: stream frame is not JSON ({len(frame)} bytes: {shape(frame)})") from None


# -- reading bodies -------------------------------------------------------------------------------

def _body_chunks(url: str, resp: requests.Response, deadline: Deadline) -> Iterator[bytes]:
    """The body in reads of at most _CHUNK_BYTES; EngineTimeout at the deadline, EngineError if cut."""
    try:
        for chunk in resp.iter_content(chunk_size=_CHUNK_BYTES):
            yield chunk  # it came by the deadline (a stream keeps what did)
            if deadline.passed():
                raise deadline.timeout(url)
    except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        if deadline.passed():
            raise deadline.timeout(url) from None
        raise EngineError(f"{url}: response body cut off ({_reason(exc)})") from None
    if deadline.fired:  # the watchdog's shutdown reads as the end of a body without a length
        raise deadline.timeout(url)


def _lines(url: str, resp: requests.Response, deadline: Deadline, max_bytes: int) -> Iterator[bytes]:
    """The body's lines (without their line ends), up to `max_bytes` of body."""
    pending = bytearray()
    received = 0
    for chunk in _body_chunks(url, resp, deadline):
        received += len(chunk)
        if received > max_bytes:
            raise _too_large(url, max_bytes, f"stopped reading after {_size(received)}")
        scanned = len(pending)  # the bytes before the new chunk hold no newline: search only the chunk
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", scanned)) >= 0:
            yield bytes(pending[start:end]).rstrip(b"\r")
            start = scanned = end + 1
        del pending[:start]
    if pending:
        yield bytes(pending)


def _refuse_declared_size(url: str, resp: requests.Response, max_bytes: int) -> None:
    declared = resp.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(url, max_bytes, f"Content-Length {_size(int(declared))}; not read")


def _too_large(url: str, max_bytes: int, how: str) -> BodyTooLarge:
    limit = f"the {_size(max_bytes)} limit for {max_bytes.kind}" if isinstance(max_bytes, BodyLimit) else f"the {_size(max_bytes)} limit"
    return BodyTooLarge(f"{url}: reply body over {limit} ({how}); nothing was measured from it")


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n:,} bytes"


# -- client certificates --------------------------------------------------------------------------

def client_certificate(cert: str | None, key: str | None, *, names: tuple[str, str] = ("--client-cert", "--client-key"),
                       ) -> str | tuple[str, str] | None:
    """requests' `cert=` for these files, checked: each a readable regular file, together a PEM
    certificate and its unencrypted private key. Messages name the setting (`names`: the
    certificate's and the key's, the flags by default), never the path."""
    cert_name, key_name = names
    if cert is None and key is None:
        return None
    if cert is None:
        raise EngineConfigError(f"{key_name} needs {cert_name} (the certificate the key belongs to)")
    _check_cert_file(cert_name, cert)
    if key is not None:
        _check_cert_file(key_name, key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_cert_chain(cert, key, password=_refuse_passphrase)
    except _EncryptedKey:
        raise EngineConfigError(f"{key_name}: the private key is encrypted; give an unencrypted PEM key") from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise EngineConfigError(f"{key_name}: the private key does not belong to the {cert_name} certificate") from None
        which = cert_name if key is None else f"{cert_name}/{key_name}"
        raise EngineConfigError(f"{which}: not a PEM certificate and its PEM private key") from None
    return cert if key is None else (cert, key)


def _check_cert_file(flag: str, path: str) -> None:
    try:
        info = os.stat(path)
    except OSError as exc:
        raise EngineConfigError(f"{flag}: cannot read the file ({(exc.strerror or 'not found').lower()})") from None
    if not stat.S_ISREG(info.st_mode):
        raise EngineConfigError(f"{flag}: not a regular file; give a PEM file")
    if info.st_size > _CERT_FILE_MAX_BYTES:
        raise EngineConfigError(f"{flag}: {_size(info.st_size)}, too large for a PEM certificate or key")
    if not os.access(path, os.R_OK):
        raise EngineConfigError(f"{flag}: cannot read the file (permission denied)")


class _EncryptedKey(Exception):
    pass


def _refuse_passphrase() -> bytes:
    """OpenSSL asks for a passphrase only for an encrypted key; without this it would prompt."""
    raise _EncryptedKey


# -- messages -------------------------------------------------------------------------------------

def _transport_error(url: str, exc: Exception, deadline: Deadline, *, client_cert: bool) -> EngineError | None:
    """The one line for a request that failed before its headers arrived (None: not ours to say)."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):  # unreachable: a transport failure, not a hang
        return EngineError(f"{url}: connection timed out after {deadline.connect_s:g}s")
    if deadline.fired or isinstance(exc, requests.exceptions.ReadTimeout):
        return deadline.timeout(url)
    if isinstance(exc, requests.exceptions.SSLError) or (isinstance(exc, requests.exceptions.ConnectionError) and _tls_alert(exc)):
        return EngineError(f"{url}: TLS error ({_reason(exc)}); {_tls_hint(exc, client_cert=client_cert)}")
    if isinstance(exc, requests.exceptions.ConnectionError):
        return EngineError(f"{url}: cannot connect ({_reason(exc)}); is the engine running and the URL right?")
    if isinstance(exc, requests.exceptions.RequestException):
        return EngineError(f"{url}: request failed ({_reason(exc)})")
    if isinstance(exc, OSError):
        # requests reads --ca-bundle / --client-cert / --client-key as it connects, and its
        # message holds the path: not shown
        return EngineError(f"{url}: a TLS file (--ca-bundle, --client-cert or --client-key) could not be read")
    return None


def _never_connected(exc: Exception) -> bool:
    """No connection was made, so no byte of the request left: refused or reset while connecting
    (urllib3's NewConnectionError). Not a timeout (that is waited out once, never twice), not TLS."""
    if not isinstance(exc, requests.exceptions.ConnectionError) or isinstance(exc, requests.exceptions.ConnectTimeout):
        return False
    inner: Any = exc.args[0] if exc.args else None
    return isinstance(getattr(inner, "reason", inner), urllib3.exceptions.NewConnectionError) and not _tls_alert(exc)


def _tls_alert(exc: Exception) -> bool:
    return "alert" in str(exc).lower() and "ssl" in str(exc).lower()


def _tls_hint(exc: Exception, *, client_cert: bool) -> str:
    if "certificate verify failed" in str(exc).lower():  # the engine's certificate, not ours
        return "pass --ca-bundle PATH if the engine uses a private CA"
    # A gateway that wants a client certificate often just ends the handshake, without saying why.
    if client_cert:
        return "the engine's gateway may not accept the --client-cert certificate; if it uses a private CA, pass --ca-bundle PATH"
    return "if the engine's gateway requires a client certificate, pass --client-cert PATH --client-key PATH; " \
           "if it uses a private CA, --ca-bundle PATH"


def _reason(exc: Exception) -> str:
    """The cause in a few words: an errno's text, else the innermost exception's (requests and
    urllib3 wrap it two or three deep, each adding the pool's repr)."""
    errno = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", str(exc))
    if errno:
        return errno.group(1).strip()
    inner: BaseException = exc
    for _ in range(8):
        nested = getattr(inner, "reason", None)
        if not isinstance(nested, BaseException):
            # urllib3's ProtocolError("Connection broken: ...", ConnectionResetError(...)) holds its cause second
            nested = next((a for a in inner.args if isinstance(a, BaseException)), None)
        if nested is None:
            break
        inner = nested
    if isinstance(inner, ConnectionError) and inner.strerror:  # "Connection reset by peer", not its repr
        return inner.strerror
    text = re.sub(r"\s*\(_ssl\.c:\d+\)", "", str(inner))
    return cut(" ".join(text.split()), 200)
