"""The one HTTP client every adapter and probe uses.

Why a wrapper: redirects are never followed (a preflight that follows a redirect to another host
checks the wrong engine), every transport failure becomes one EngineError line, and response
bodies are read in full (never silently cut) with their length and sha256 kept for evidence.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

from kvpreflight.engines.errors import EngineError


@dataclass(frozen=True)
class HttpReply:
    url: str
    status: int
    body: bytes = field(repr=False)
    elapsed_s: float
    content_type: str = ""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)  # names lower-cased

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            snippet = "empty body" if not self.body else f"{len(self.body)} bytes, not JSON"
            raise EngineError(f"{self.url}: expected JSON, got {snippet} (HTTP {self.status})") from None

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class HttpClient:
    def __init__(
        self,
        *,
        headers: Mapping[str, str] | None = None,
        ca_bundle: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.session = requests.Session()
        self.session.headers.update({"User-Agent": "kvpreflight"})
        self.session.headers.update(dict(headers or {}))
        self.session.trust_env = False  # no proxies from the environment: talk to the engine itself
        if ca_bundle:
            self.session.verify = ca_bundle
        self.timeout_s = timeout_s

    def close(self) -> None:
        self.session.close()

    def _send(self, method: str, url: str, *, json_body: Any = None, timeout_s: float | None = None, stream: bool = False) -> requests.Response:
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        try:
            resp = self.session.request(
                method, url, json=json_body, timeout=(min(10.0, timeout), timeout), allow_redirects=False, stream=stream
            )
        except requests.exceptions.SSLError as exc:
            raise EngineError(f"{url}: TLS error ({_reason(exc)}); pass --ca-bundle PATH if the engine uses a private CA") from None
        except requests.exceptions.ConnectTimeout:
            raise EngineError(f"{url}: connection timed out after {timeout:g}s") from None
        except requests.exceptions.ReadTimeout:
            raise EngineTimeout(f"{url}: no answer within {timeout:g}s") from None
        except requests.exceptions.ConnectionError as exc:
            raise EngineError(f"{url}: cannot connect ({_reason(exc)}); is the engine running and the URL right?") from None
        except requests.exceptions.RequestException as exc:
            raise EngineError(f"{url}: request failed ({_reason(exc)})") from None
        if 300 <= resp.status_code < 400:
            location = resp.headers.get("Location", "?")
            resp.close()
            raise EngineError(f"{url}: redirected (HTTP {resp.status_code}) to {location}; not followed, point kvpreflight at the engine itself")
        return resp

    def request(self, method: str, url: str, *, json_body: Any = None, timeout_s: float | None = None) -> HttpReply:
        start = time.monotonic()
        resp = self._send(method, url, json_body=json_body, timeout_s=timeout_s)
        try:
            body = resp.content
        except requests.exceptions.RequestException as exc:
            raise EngineError(f"{url}: response body cut off ({_reason(exc)})") from None
        return HttpReply(url, resp.status_code, body, time.monotonic() - start, resp.headers.get("Content-Type", ""),
                         {k.lower(): v for k, v in resp.headers.items()})

    def get(self, url: str, *, timeout_s: float | None = None) -> HttpReply:
        return self.request("GET", url, timeout_s=timeout_s)

    def post(self, url: str, body: Any, *, timeout_s: float | None = None) -> HttpReply:
        return self.request("POST", url, json_body=body, timeout_s=timeout_s)

    def get_json(self, url: str, *, timeout_s: float | None = None) -> Any:
        reply = self.get(url, timeout_s=timeout_s)
        if reply.status != 200:
            raise EngineError(f"{url}: HTTP {reply.status}")
        return reply.json()

    def post_stream(self, url: str, body: Any, *, timeout_s: float) -> StreamReply:
        """POST and read a server-sent-event stream to its end (or the deadline)."""
        start = time.monotonic()
        resp = self._send("POST", url, json_body=body, timeout_s=timeout_s, stream=True)
        frames: list[str] = []
        raw = bytearray()
        timed_out = False
        first_frame_s = None
        try:
            for line in _iter_lines(resp, start + timeout_s):
                raw.extend(line + b"\n")
                text = line.decode("utf-8", errors="replace").strip()
                if text.startswith("data:"):
                    frames.append(text[5:].strip())
                    if first_frame_s is None:
                        first_frame_s = time.monotonic() - start
        except EngineTimeout:
            timed_out = True
        except requests.exceptions.RequestException as exc:
            if "timed out" in str(exc).lower():  # requests wraps a mid-stream read timeout
                timed_out = True
            else:
                raise EngineError(f"{url}: stream cut off ({_reason(exc)})") from None
        finally:
            resp.close()
        return StreamReply(url, resp.status_code, tuple(frames), bytes(raw), time.monotonic() - start, timed_out, first_frame_s)


class EngineTimeout(EngineError):
    """The engine did not answer in time (a hang is a finding, not a crash of ours)."""


@dataclass(frozen=True)
class StreamReply:
    url: str
    status: int
    frames: tuple[str, ...] = field(repr=False)
    body: bytes = field(repr=False)
    elapsed_s: float = 0.0
    timed_out: bool = False
    first_frame_s: float | None = None

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
            except ValueError:
                raise EngineError(f"{self.url}: stream frame is not JSON ({len(frame)} bytes)") from None


def _iter_lines(resp: requests.Response, deadline: float) -> Iterator[bytes]:
    pending = b""
    for chunk in resp.iter_content(chunk_size=None):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            yield line.rstrip(b"\r")
        if time.monotonic() > deadline:
            raise EngineTimeout(f"{resp.url}: stream still open at the deadline")
    if pending:
        yield pending


def _reason(exc: Exception) -> str:
    text = str(exc)
    errno = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if errno:
        return errno.group(1).strip()
    return " ".join(text.split())[:200]

