"""The engine-adapter interface. Adapters read and send; they never judge.

An adapter knows one engine kind's endpoints, log lines, metric names and error messages, and
turns them into typed facts (EngineSnapshot, Counters, Completion in kvpreflight.model), so no
probe or check names an engine's metric or setting. Each capacity number it reads is a
PoolReading that keeps its source and origin, so checks can tell independent sources from two
views of one computation.
"""

from __future__ import annotations

import abc
import json
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, ClassVar, Self

from kvpreflight._internal.engines.context_warnings import context_warnings
from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import BodyLimit, EngineTimeout, HttpClient, HttpReply, StreamReply
from kvpreflight._internal.engines.log_patterns import LogSignal
from kvpreflight._internal.engines.untrusted import answer_text, error_in_event, error_reply_message, parse_metrics, shape
from kvpreflight.model import (
    TRANSFER_SECONDS,
    TRANSFERS_TIMED,
    Completion,
    CounterDelta,
    CounterField,
    CounterValues,
    EngineSnapshot,
    ErrorKind,
    KvDeadline,
    Role,
    RoleSource,
)


@dataclass(frozen=True, kw_only=True)
class EngineRequest:
    """One generation request in an engine's own API, built and not yet sent."""

    path: str  # e.g. /generate, appended to the adapter's URL
    body: Mapping[str, Any]
    sent_tokens: int  # the prompt's length as the engine counts it
    max_tokens: int
    stream: bool
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    request_id: str | None = None  # the id kvpreflight gave it, where the engine takes one


@dataclass(frozen=True, kw_only=True)
class ReplyFacts:
    """What an answered (HTTP 200) request says in the engine's own fields; `complete()` adds
    the status, timing, size and digest every engine shares."""

    text: str = ""
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    truncated: bool | None = None
    error_message: str | None = None  # an error inside a 200 answer (SGLang's abort finish)
    model: str | None = None  # the OpenAI answer's `model`: who says they answered


@dataclass(frozen=True, kw_only=True)
class Counters(CounterValues):
    """Monotonic counters and gauges read from /metrics; None where the engine has none.

    The adapter maps each engine's metric names onto these fields, so probes and checks never
    name an engine's metric."""

    used_tokens: float | None = None  # gauge: tokens held in the pool right now
    extra: Mapping[str, float] = field(default_factory=dict)  # other engine counters, for evidence only

    def moved_since(self, before: Counters) -> bool | None:
        """Did any request/token counter move? None when there is nothing to compare."""
        pairs = [(self.get(k), before.get(k)) for k in (CounterField.REQUESTS, CounterField.PROMPT_TOKENS,
                                                         CounterField.GENERATION_TOKENS)]
        known = [(a, b) for a, b in pairs if a is not None and b is not None]
        if not known:
            return None
        return any(a != b for a, b in known)

    def deltas_since(self, before: Counters) -> CounterDelta:
        """How much each counter moved; None for one not known at both moments (the used-token
        gauge is not a counter)."""
        moved = {f: round(a - b, 3) for f in CounterField if (a := self.get(f)) is not None and (b := before.get(f)) is not None}
        extra = {key: round(value - before.extra[key], 3) for key, value in self.extra.items() if key in before.extra}
        return CounterDelta.of(moved, extra)


def transfer_time(seconds: float | None, count: float | None) -> dict[str, float]:
    """The extra counters for an engine's KV-transfer time histogram (sum in seconds, count)."""
    return {TRANSFER_SECONDS: seconds, TRANSFERS_TIMED: count} if seconds is not None and count is not None else {}


class EngineAdapter(abc.ABC):
    """One engine kind's endpoints, request shapes and messages. Stateless apart from the
    connection it was given: a tenant's adapter is `entry.with_client(tenant_client)`."""

    kind: ClassVar[str] = ""
    # Where the engine takes a client's request id (a header, or a body field): the id kvpreflight
    # gives each request then names it in the engine's log, so a danger line ties to its probe.
    request_id_header: ClassVar[str | None] = None
    request_id_field: ClassVar[str | None] = None
    # Regexes (case-insensitive) that mark an error message as about prompt LENGTH.
    length_error_patterns: ClassVar[tuple[str, ...]] = ()
    vocab_error_patterns: ClassVar[tuple[str, ...]] = (
        r"out of vocabulary", r"token id .* (invalid|out of range)", r"invalid tokens")
    # Request fields that let a request read and fill the engine's prefix cache where the
    # adapter's requests leave it off by default (llama.cpp's cache_prompt); the prefix-cache
    # probes add them.
    prefix_cache_fields: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    log_signals: ClassVar[tuple[LogSignal, ...]] = ()  # danger lines in the engine's log
    metrics_path: ClassVar[str] = "/metrics"  # where its Prometheus text is served
    # Whether the requests this adapter sends take a `cache_salt` field (the isolation probes bind
    # tenants A and B with one where the deployment does not bind them itself).
    takes_cache_salt: ClassVar[bool] = True
    # A prefill that reads its decodes' transfer notifications only when it steps (vLLM's NIXL
    # prefill): a late read on the last request it served is logged and counted only at its
    # next request, so the check sends it one before its last read of logs and counters.
    notices_late_reads_when_stepping: ClassVar[bool] = False

    def __init__(self, url: str, client: HttpClient, *, model: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.client = client
        self.model = model  # the served model's name, for APIs whose requests name it

    def with_client(self, client: HttpClient) -> Self:
        """The same engine through another connection (another tenant's credentials)."""
        return type(self)(self.url, client, model=self.model)

    # -- reading ---------------------------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        """Whether the server at url is this kind (by what it answers, never by its URL). An
        EngineTimeout goes through: a server that hangs is not asked again as another kind."""

    @abc.abstractmethod
    def snapshot(self, *, role: Role | None = None, log_text: str | None = None) -> EngineSnapshot:
        """Everything the engine says about its capacity. `role` overrides the reported one."""

    def read(self, *, role: Role | None = None, log_text: str | None = None) -> EngineSnapshot:
        """`snapshot`, with what the start-up log warns about the context served: every engine's
        wording, whatever this adapter's kind (engines/context_warnings.py says why)."""
        snap = self.snapshot(role=role, log_text=log_text)
        if not log_text:
            return snap
        return replace(snap, context_warnings=snap.context_warnings + context_warnings(self.serving_log(log_text)))

    def serving_log(self, log_text: str) -> str:
        """The part of a start-up log about the engine that serves (all of it, unless the engine
        logs a trial start of its own first)."""
        return log_text

    def counters(self) -> Counters:
        return Counters()

    @abc.abstractmethod
    def max_accepted_prompt(self, snapshot: EngineSnapshot) -> int | None:
        """The longest prompt the engine's stated limits say it accepts (with max_tokens=1)."""

    def healthy(self) -> bool:
        try:
            return self.client.get(f"{self.url}/health", max_bytes=BodyLimit.JSON_INFO).status == 200
        except EngineError:
            return False

    # -- sending ---------------------------------------------------------------------------
    @abc.abstractmethod
    def token_ids(self, count: int, seed_text: str) -> list[int]:
        """`count` token ids that the engine's own tokenizer produced (so all are valid)."""

    @abc.abstractmethod
    def build_request(self, ids: list[int], *, max_tokens: int, stream: bool,
                      extra: Mapping[str, Any] | None = None) -> EngineRequest:
        """The request `complete` would send; a raw connection may send it and walk away."""

    @abc.abstractmethod
    def parse_reply(self, request: EngineRequest, reply: HttpReply) -> ReplyFacts:
        """The facts of a non-streamed HTTP 200 answer."""

    @abc.abstractmethod
    def parse_events(self, request: EngineRequest, events: list[Any]) -> ReplyFacts:
        """The facts of a streamed HTTP 200 answer (every data frame, none of them an error)."""

    def complete(self, ids: list[int], *, max_tokens: int, stream: bool, timeout_s: float,
                 extra: Mapping[str, Any] | None = None) -> Completion:
        """Send one real generation request to this URL (an engine or the entry in front of it).
        A hang, a transport failure or a refusal comes back as a Completion (a finding)."""
        request = self.with_request_id(self.build_request(ids, max_tokens=max_tokens, stream=stream, extra=extra))
        completion = self._send(request, timeout_s)
        return completion if request.request_id is None else replace(completion, request_id=request.request_id)

    def with_request_id(self, request: EngineRequest) -> EngineRequest:
        """A fresh id, where this engine kind takes one (a caller's own id in `extra` is kept)."""
        if self.request_id_field is not None:
            if self.request_id_field in request.body:
                return replace(request, request_id=str(request.body[self.request_id_field]))
            rid = new_request_id()
            return replace(request, body={**request.body, self.request_id_field: rid}, request_id=rid)
        if self.request_id_header is not None:
            rid = new_request_id()
            return replace(request, headers={**request.headers, self.request_id_header: rid}, request_id=rid)
        return request

    def _send(self, request: EngineRequest, timeout_s: float) -> Completion:
        url = f"{self.url}{request.path}"
        start = time.monotonic()
        reply: HttpReply | StreamReply
        try:
            if request.stream:
                reply = self.client.post_stream(url, request.body, timeout_s=timeout_s, headers=request.headers)
            else:
                reply = self.client.post(url, request.body, timeout_s=timeout_s, headers=request.headers)
        except EngineTimeout:
            return _unanswered(request, time.monotonic() - start, timed_out=True)
        except EngineError as exc:
            return _unanswered(request, time.monotonic() - start, transport_error=str(exc))
        completion = self._from_reply(request, reply)
        return completion if reply.reconnected is None else replace(completion, reconnected=reply.reconnected)

    def _from_reply(self, request: EngineRequest, reply: HttpReply | StreamReply) -> Completion:
        if reply.status != 200:
            return self._refused(request, reply, error_reply_message(reply.status, reply.body))
        if isinstance(reply, HttpReply):
            if not reply.body:
                return self._empty(request, reply)
            try:
                facts = self.parse_reply(request, reply)
            except EngineError as exc:  # one bad field voids this reply's counts, not its text
                return self._malformed(request, reply, str(exc), ReplyFacts(text=answer_text(reply.body)), None)
            return self._answered(request, reply, facts, ttft_s=None, timed_out=False)
        if not reply.body and not reply.timed_out and reply.cut_off is None:
            return self._empty(request, reply)
        events: list[Any] = []
        try:
            for event in reply.events():
                if (message := error_in_event(event)) is not None:  # an error inside the 200 stream
                    return self._error_after(request, reply, message, events)
                events.append(event)
        except EngineError as exc:  # a frame that is not JSON: the frames before it were received
            return self._malformed(request, reply, str(exc), *self._readable(request, events)[1:])
        readable, facts, generated = self._readable(request, events)
        if readable < len(events):  # a frame of the wrong shape: what came before it counts
            return self._malformed(request, reply, readable_error(self, request, events[readable]), facts, generated)
        answered = self._answered(request, reply, facts, ttft_s=reply.first_frame_s, timed_out=reply.timed_out)
        if reply.cut_off is not None:  # what came before the break counts (tokens mean it was served)
            return replace(answered, transport_error=reply.cut_off, completion_tokens=self._generated(request, events))
        return answered

    def classify_error(self, message: str) -> ErrorKind:
        for pattern in self.length_error_patterns:
            if re.search(pattern, message, re.IGNORECASE):
                return ErrorKind.LENGTH
        for pattern in self.vocab_error_patterns:
            if re.search(pattern, message, re.IGNORECASE):
                return ErrorKind.VOCAB
        return ErrorKind.OTHER

    def _refused(self, request: EngineRequest, reply: HttpReply | StreamReply, message: str) -> Completion:
        return Completion(
            sent_tokens=request.sent_tokens, max_tokens=request.max_tokens, streamed=request.stream,
            status=reply.status, elapsed_s=reply.elapsed_s, error_message=message, error_kind=self.classify_error(message),
            body_bytes=len(reply.body), body_sha256=reply.sha256,
            retry_after_s=retry_after(reply.headers.get("retry-after")) if isinstance(reply, HttpReply) else None,
        )

    def _error_after(self, request: EngineRequest, reply: StreamReply, message: str, events: list[Any]) -> Completion:
        """An error frame, and the frames before it. With none, a refusal. With tokens before it,
        the engine processed and answered the request: the tokens are counted, never dropped (a
        length error after generating is not a rejection)."""
        refused = self._refused(request, reply, message)
        if not events:
            return refused
        facts = self.parse_events(request, events)
        return replace(refused, completion_tokens=self._generated(request, events), prompt_tokens=facts.prompt_tokens,
                       finish_reason=facts.finish_reason, ttft_s=reply.first_frame_s)

    def _readable(self, request: EngineRequest, events: list[Any]) -> tuple[int, ReplyFacts, int | None]:
        """How many frames from the first read cleanly, their facts, and the tokens they carried:
        a frame of the wrong shape ends what is believed, never what was received before it."""
        try:
            return len(events), self.parse_events(request, events), self._generated(request, events)
        except EngineError:
            pass
        good = 0
        for event in events:
            try:
                self.parse_events(request, [event])
            except EngineError:
                break
            good += 1
        try:
            return good, self.parse_events(request, events[:good]), self._generated(request, events[:good])
        except EngineError:  # frames that read alone but not together: none is believed
            return 0, ReplyFacts(), None

    def _malformed(self, request: EngineRequest, reply: HttpReply | StreamReply, what: str, facts: ReplyFacts,
                   generated: int | None) -> Completion:
        """A 200 reply that could not be read whole: `what` says why; the text and tokens before it count."""
        streamed = isinstance(reply, StreamReply)
        return Completion(
            sent_tokens=request.sent_tokens, max_tokens=request.max_tokens, streamed=request.stream,
            status=reply.status, elapsed_s=reply.elapsed_s, malformed=what, text=facts.text,
            completion_tokens=generated if streamed else None, prompt_tokens=facts.prompt_tokens if streamed else None,
            finish_reason=facts.finish_reason, body_bytes=len(reply.body), body_sha256=reply.sha256,
            ttft_s=reply.first_frame_s if isinstance(reply, StreamReply) else None,
        )

    def _generated(self, request: EngineRequest, events: list[Any]) -> int | None:
        """Tokens generated in these frames: as the engine counts them, else the frames that carried text."""
        if not events:
            return None
        generated = self.parse_events(request, events).completion_tokens
        if generated is None:
            generated = sum(1 for e in events if isinstance(e, dict) and self.parse_events(request, [e]).text) or None
        return generated

    def _empty(self, request: EngineRequest, reply: HttpReply | StreamReply) -> Completion:
        return Completion(sent_tokens=request.sent_tokens, max_tokens=request.max_tokens, streamed=request.stream,
                          status=reply.status, elapsed_s=reply.elapsed_s, empty_body=True, body_sha256=reply.sha256)

    def _answered(self, request: EngineRequest, reply: HttpReply | StreamReply, facts: ReplyFacts, *,
                  ttft_s: float | None, timed_out: bool) -> Completion:
        message = facts.error_message
        return Completion(
            sent_tokens=request.sent_tokens, max_tokens=request.max_tokens, streamed=request.stream,
            status=reply.status, elapsed_s=reply.elapsed_s, timed_out=timed_out, error_message=message,
            error_kind=None if message is None else self.classify_error(message),
            completion_tokens=facts.completion_tokens, prompt_tokens=facts.prompt_tokens,
            cached_tokens=facts.cached_tokens, finish_reason=facts.finish_reason, truncated=facts.truncated,
            body_bytes=len(reply.body), body_sha256=reply.sha256, ttft_s=ttft_s, text=facts.text,
            answer_model=facts.model,
        )

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]] | None:
        """`metrics_path` (/metrics) parsed with prometheus_client's parser: name -> [(labels, value)].

        None when the engine serves no metrics (404); malformed text is an EngineError.
        """
        reply = self.client.get(f"{self.url}{self.metrics_path}", max_bytes=BodyLimit.METRICS)
        if reply.status == 404:
            return None
        if reply.status != 200:
            raise EngineError(f"{self.url}{self.metrics_path}: HTTP {reply.status}")
        return parse_metrics(reply.url, reply.text())


@dataclass(frozen=True)
class PrefillLeg:
    """A prefill's answer to the first leg of a prefill/decode request sent alone: its own
    completion, and the handoff the decode leg carries to read the KV the prefill holds (the
    engine's own fields; None where the answer carried none)."""

    completion: Completion
    handoff: Mapping[str, Any] | None


class SplitLegs(abc.ABC):
    """A capability of adapters whose prefill/decode pairs kvpreflight can drive leg by leg, as
    the deployment's router does (vLLM NIXL: `kv_transfer_params`): the prefill computes the
    prompt and holds its KV for a decode, and the decode leg, sent later to the decode engine,
    reads it. The isolation scenario late-decode holds the decode leg past the prefill's KV lease.
    Adapters of engines whose legs only their router can send do not implement it."""

    @abc.abstractmethod
    def held_kv_lease(self, snapshot: EngineSnapshot) -> KvDeadline | None:
        """How long this prefill holds a handed-off request's KV for its decode; None where the
        engine is not a prefill whose legs this adapter sends."""

    @abc.abstractmethod
    def send_prefill_leg(self, ids: list[int], *, timeout_s: float, extra: Mapping[str, Any] | None = None) -> PrefillLeg:
        """The prefill leg, to this (prefill) engine: a refusal or a hang is a completion, as `complete`'s."""

    @abc.abstractmethod
    def send_decode_leg(self, ids: list[int], handoff: Mapping[str, Any], *, max_tokens: int, timeout_s: float,
                        extra: Mapping[str, Any] | None = None) -> Completion:
        """The decode leg, to this (decode) engine, carrying the prefill's handoff."""


def readable_error(adapter: EngineAdapter, request: EngineRequest, event: Any) -> str:
    """What is wrong with one stream frame, as its parser says it."""
    try:
        adapter.parse_events(request, [event])
    except EngineError as exc:
        return str(exc)
    return f"{adapter.url}{request.path}: stream frame {shape(json.dumps(event))} does not read with the frames before it"


LOG_ID_PREFIX = "kvpreflight-"


def retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (RFC 9110: delay-seconds; an HTTP date is not read), capped at an hour."""
    if value is None or not value.strip().isdigit():
        return None
    return float(min(int(value.strip()), 3600))


def new_request_id() -> str:
    """Unique, and recognisable as kvpreflight's in an engine's log."""
    return f"{LOG_ID_PREFIX}{secrets.token_hex(8)}"


def _unanswered(request: EngineRequest, elapsed_s: float, *, timed_out: bool = False,
                transport_error: str | None = None) -> Completion:
    return Completion(sent_tokens=request.sent_tokens, max_tokens=request.max_tokens, streamed=request.stream,
                      status=None, elapsed_s=elapsed_s, timed_out=timed_out, transport_error=transport_error)


def role_of(override: Role | None, reported: Role | None) -> tuple[Role, RoleSource]:
    """An engine's role and where it came from: the user's override wins, then what the engine
    said; with neither, a plain (unified) engine is assumed (a router may know better)."""
    if override is not None:
        return override, RoleSource.OVERRIDE
    if reported is not None:
        return reported, RoleSource.ENGINE
    return Role.UNIFIED, RoleSource.ASSUMED


def cycle_to(ids: Iterable[int], count: int) -> list[int]:
    base = list(ids)
    if not base:
        raise EngineError("the engine's tokenizer returned no tokens for the probe text")
    return (base * (count // len(base) + 1))[:count]
