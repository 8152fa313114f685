"""The engine-adapter interface. Adapters read and send; they never judge.

An adapter knows one engine kind's endpoints, log lines and error messages. Each capacity number
it reads is a PoolReading that keeps its source and origin, so checks can tell independent
sources from two views of one computation.
"""

from __future__ import annotations

import abc
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from kvpreflight.engines.errors import EngineError
from kvpreflight.engines.http import EngineTimeout, HttpClient, HttpReply, StreamReply
from kvpreflight.model import EngineSnapshot, Role

# Kinds of error an engine gives for a refused prompt. Only LENGTH is a capacity verdict.
ERROR_LENGTH = "length"
ERROR_VOCAB = "vocab"
ERROR_OTHER = "other"


@dataclass(frozen=True)
class Completion:
    """What one probe request got back, as a client saw it. `text` is never serialized."""

    sent_tokens: int
    max_tokens: int
    streamed: bool
    status: int | None  # HTTP status; None when nothing came back
    elapsed_s: float
    timed_out: bool = False
    transport_error: str | None = None
    error_message: str | None = None  # the engine's own error message
    error_kind: str | None = None  # ERROR_LENGTH | ERROR_VOCAB | ERROR_OTHER
    completion_tokens: int | None = None
    prompt_tokens: int | None = None  # what the engine says it processed
    cached_tokens: int | None = None
    finish_reason: str | None = None
    truncated: bool | None = None  # the engine said it truncated the prompt
    body_bytes: int = 0
    body_sha256: str = ""
    ttft_s: float | None = None
    text: str = field(default="", repr=False)

    @property
    def rejected(self) -> bool:
        return self.error_message is not None and not self.timed_out

    def evidence(self) -> dict[str, Any]:
        """Numbers only, plus the engine's error message; never the generated text."""
        out: dict[str, Any] = {
            "sent_tokens": self.sent_tokens,
            "max_tokens": self.max_tokens,
            "stream": self.streamed,
            "http_status": self.status,
            "elapsed_s": round(self.elapsed_s, 3),
        }
        for key in ("timed_out", "transport_error", "error_message", "error_kind", "completion_tokens",
                    "prompt_tokens", "cached_tokens", "finish_reason", "truncated"):
            value = getattr(self, key)
            if value not in (None, False):
                out[key] = value
        if self.body_bytes:
            out["response_bytes"] = self.body_bytes
            out["response_sha256"] = self.body_sha256
        return out


@dataclass(frozen=True)
class Counters:
    """Monotonic counters and gauges read from /metrics; None where the engine has none."""

    requests: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    transfer_failures: float | None = None
    used_tokens: float | None = None  # gauge: tokens held in the pool right now
    extra: Mapping[str, float] = field(default_factory=dict)

    def moved_since(self, before: "Counters") -> bool | None:
        """Did any request/token counter move? None when there is nothing to compare."""
        pairs = [(getattr(self, k), getattr(before, k)) for k in ("requests", "prompt_tokens", "generation_tokens")]
        known = [(a, b) for a, b in pairs if a is not None and b is not None]
        if not known:
            return None
        return any(a != b for a, b in known)


class EngineAdapter(abc.ABC):
    kind: str = ""
    # Regexes (case-insensitive) that mark an error message as about prompt LENGTH.
    length_error_patterns: tuple[str, ...] = ()
    vocab_error_patterns: tuple[str, ...] = (r"out of vocabulary", r"token id .* (invalid|out of range)", r"invalid tokens")

    def __init__(self, url: str, client: HttpClient) -> None:
        self.url = url.rstrip("/")
        self.client = client

    # -- reading ---------------------------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        """Whether the server at url is this kind (by what it answers, never by its URL)."""

    @abc.abstractmethod
    def snapshot(self, *, role: Role | None = None, log_text: str | None = None) -> EngineSnapshot:
        """Everything the engine says about its capacity. `role` overrides the reported one."""

    def counters(self) -> Counters:
        return Counters()

    # -- sending ---------------------------------------------------------------------------
    @abc.abstractmethod
    def token_ids(self, count: int, seed_text: str) -> list[int]:
        """`count` token ids that the engine's own tokenizer produced (so all are valid)."""

    @abc.abstractmethod
    def complete(self, ids: list[int], *, max_tokens: int, stream: bool, timeout_s: float,
                 extra: Mapping[str, Any] | None = None) -> Completion:
        """Send one real generation request to this URL (an engine or the entry in front of it)."""

    @abc.abstractmethod
    def max_accepted_prompt(self, snapshot: EngineSnapshot) -> int | None:
        """The longest prompt the engine's stated limits say it accepts (with max_tokens=1)."""

    def healthy(self) -> bool:
        try:
            return self.client.get(f"{self.url}/health", timeout_s=10).status == 200
        except EngineError:
            return False

    # -- shared helpers --------------------------------------------------------------------
    def stream_events(self, reply: StreamReply, sent: int, max_tokens: int) -> tuple[list[Any], Completion | None]:
        """The events of a stream, or the Completion it already amounts to: an error frame
        inside the (HTTP 200) stream is a rejection; a frame that is not JSON is a transport error."""
        events: list[Any] = []
        try:
            for event in reply.events():
                if (message := error_in_event(event)) is not None:
                    return events, completion_from_error(sent, max_tokens, True, reply, message, self.classify_error(message))
                events.append(event)
        except EngineError as exc:
            return events, Completion(sent, max_tokens, True, reply.status, reply.elapsed_s, transport_error=str(exc),
                                      body_bytes=len(reply.body), body_sha256=hashlib.sha256(reply.body).hexdigest())
        return events, None

    def send(self, path: str, body: Mapping[str, Any], *, sent: int, max_tokens: int, stream: bool,
             timeout_s: float) -> HttpReply | StreamReply | Completion:
        """POST a probe. A hang or a transport failure comes back as a Completion (a finding)."""
        url = f"{self.url}{path}"
        start = time.monotonic()
        try:
            if stream:
                return self.client.post_stream(url, body, timeout_s=timeout_s)
            return self.client.post(url, body, timeout_s=timeout_s)
        except EngineTimeout:
            return Completion(sent, max_tokens, stream, None, time.monotonic() - start, timed_out=True)
        except EngineError as exc:
            return Completion(sent, max_tokens, stream, None, time.monotonic() - start, transport_error=str(exc))

    def classify_error(self, message: str) -> str:
        for pattern in self.length_error_patterns:
            if re.search(pattern, message, re.IGNORECASE):
                return ERROR_LENGTH
        for pattern in self.vocab_error_patterns:
            if re.search(pattern, message, re.IGNORECASE):
                return ERROR_VOCAB
        return ERROR_OTHER

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]] | None:
        """/metrics parsed with prometheus_client's parser: name -> [(labels, value)].

        None when the engine serves no metrics (404); malformed text is an EngineError.
        """
        reply = self.client.get(f"{self.url}/metrics", timeout_s=15)
        if reply.status == 404:
            return None
        if reply.status != 200:
            raise EngineError(f"{self.url}/metrics: HTTP {reply.status}")
        return parse_metrics(reply.url, reply.text())


def parse_metrics(url: str, text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise EngineError(f"{url}: malformed Prometheus text ({' '.join(str(exc).split())[:120]})") from None
    return out


def metric_sum(metrics: Mapping[str, list[tuple[dict[str, str], float]]] | None, *names: str) -> float | None:
    """Sum of every sample of the first name present (counters are split by labels)."""
    if not metrics:
        return None
    for name in names:
        if name in metrics:
            return sum(v for _, v in metrics[name])
    return None


def completion_from_error(sent: int, max_tokens: int, stream: bool, reply: HttpReply | StreamReply,
                          message: str, kind: str) -> Completion:
    return Completion(
        sent_tokens=sent, max_tokens=max_tokens, streamed=stream, status=reply.status,
        elapsed_s=reply.elapsed_s, error_message=message, error_kind=kind,
        body_bytes=len(reply.body), body_sha256=hashlib.sha256(reply.body).hexdigest(),
    )


def cycle_to(ids: Iterable[int], count: int) -> list[int]:
    base = list(ids)
    if not base:
        raise EngineError("the engine's tokenizer returned no tokens for the probe text")
    return (base * (count // len(base) + 1))[:count]


def positive_int(value: Any, what: str, url: str) -> int | None:
    """A sane token count, or None when absent; negative or absurd values are an error."""
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise EngineError(f"{url}: {what} is not a number ({value!r})") from None
    if number != float(value) or number <= 0 or number > 1 << 40:
        raise EngineError(f"{url}: {what} = {value!r} is not a plausible token count")
    return number


def error_message_of(body: bytes) -> str | None:
    """The error message in an engine's JSON error body, in any of the engines' shapes."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return _message_in(data)


def _message_in(data: Any) -> str | None:
    if isinstance(data, dict):
        if "error" in data:
            err = data["error"]
            if isinstance(err, dict):
                return str(err.get("message") or json.dumps(err)[:300])
            return str(err)
        if "message" in data:  # OpenAI routes: {"object": "error", "message": ...}
            return str(data["message"])
        if "detail" in data:
            return str(data["detail"])
    return None


def error_in_event(event: Any) -> str | None:
    """An error frame inside a 200 event stream (SGLang, vLLM send them)."""
    if isinstance(event, dict) and ("error" in event or event.get("object") == "error"):
        return _message_in(event)
    return None
