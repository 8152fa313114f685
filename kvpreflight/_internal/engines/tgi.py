"""TGI (text-generation-inference; in maintenance mode). Shapes and messages copied from TGI's
source (v3.3.x; tests/fixtures/tgi/README.md says where each comes from): `router/src/server.rs`
(/info, /generate, /generate_stream, /tokenize, /metrics; `{"error", "error_type"}` bodies,
validation errors 422, errors inside a 200 event stream), `router/src/validation.rs` (length
messages), `router/src/lib.rs` (Info), `backends/v3/src/lib.rs` (warm-up log line and gauge).

Capacity: `/info max_total_tokens` is the per-request total (the served context); the KV pool is
the batch token budget every running request shares, read from the warm-up log line (allocator:
the shards measured it from free memory) and the `tgi_batch_max_total_tokens` gauge (scheduler).

TGI takes TEXT prompts. `token_ids()` returns ids from TGI's `/tokenize` and remembers the text
each came from; `complete()` rebuilds the text of a prefix of those ids and checks its length with
`/tokenize` (which counts the special tokens TGI adds exactly as its validation does) before it
sends it, so `sent_tokens` is TGI's own count.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import BodyLimit, EngineTimeout, HttpClient, HttpReply
from kvpreflight._internal.engines.interface import Counters, EngineAdapter, EngineRequest, ReplyFacts, role_of
from kvpreflight._internal.engines.log_patterns import log_lines
from kvpreflight._internal.engines.untrusted import (
    error_reply_message,
    json_object,
    log_count,
    metric_sum,
    optional_object,
    optional_text,
    positive_int,
    token_count,
)
from kvpreflight.model import EngineSnapshot, Origin, PoolReading, Role

# backends/v3/src/lib.rs (and v2) connect_backend: "Setting max batch total tokens to {N}"
ALLOCATOR_LINE = re.compile(r"Setting max batch total tokens to (?P<tokens>\d+)")
# The warm-up refused the configured per-request total and the router exits: V3Error's message,
# or as main() prints the returned error: "Error: Backend(NotEnoughMemory(N))".
NOT_ENOUGH_MEMORY = re.compile(r"Not enough memory to handle `?max_total_tokens=(\d+)|NotEnoughMemory\((\d+)\)")
# Older (non-flash) models: the budget is --max-batch-total-tokens or a default, never measured.
NOT_MEASURED = "Model does not support automatic max batch total tokens"
FINISH = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}
MAX_CALIBRATIONS = 4  # /tokenize calls per start of the text
MAX_SKIP = 3


@dataclass(frozen=True)
class _TextPlan:
    """How one seed text tokenizes when repeated: special tokens, the first copy, the steady copy."""

    seed: str
    special_head: tuple[int, ...]  # tokens TGI adds before the text (BOS), counted by its validation
    special_tail: int  # tokens added after the text
    head: tuple[tuple[int, int], ...]  # (id, end offset) of the first copy
    period: tuple[tuple[int, int], ...]  # (id, end offset within the copy) of every later copy

    def ids(self, count: int) -> list[int]:
        out = list(self.special_head) + [i for i, _ in self.head]
        while len(out) < count:
            out.extend(i for i, _ in self.period)
        return out[:count]

    def text(self, content: int, skip: int = 0) -> str:
        """The repeated seed cut after its `content`-th token, its first `skip` tokens left out."""
        start = self.head[skip - 1][1] if skip else 0
        if content <= len(self.head):
            return self.seed[start: self.head[content - 1][1]]
        q, r = divmod(content - len(self.head), len(self.period))
        tail = self.seed[: self.period[r - 1][1]] if r else ""
        return self.seed[start:] + self.seed * q + tail


class TgiAdapter(EngineAdapter):
    kind = "tgi"
    # router/src/validation.rs ValidationError::MaxTotalTokens and ::InputLength (older releases
    # write them without backticks and say "input tokens").
    length_error_patterns = (
        r"`?inputs?`? tokens \+ `?max_new_tokens`? must be <= \d+",
        r"`?inputs`? must have less than \d+ tokens",
    )

    def __init__(self, url: str, client: HttpClient, *, model: str | None = None) -> None:
        super().__init__(url, client, model=model)
        self._plans: dict[str, _TextPlan] = {}

    def with_client(self, client: HttpClient) -> Self:
        # The plans are facts of TGI's tokenizer, the same for every connection; sharing them lets
        # tenant B send a prompt whose ids tenant A's adapter made (the cross-tenant cache probe).
        other = super().with_client(client)
        other._plans = self._plans
        return other

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        info = _info(url, client, required=False)
        return (info is not None and "model_id" in info and "max_total_tokens" in info
                and ("max_input_tokens" in info or "max_input_length" in info))

    # -- reading ---------------------------------------------------------------------------
    def snapshot(self, *, role: Role | None = None, log_text: str | None = None) -> EngineSnapshot:
        info = _info(self.url, self.client, required=True)
        assert info is not None
        readings: list[PoolReading] = []
        notes: list[str] = []
        served = positive_int(info.get("max_total_tokens"), "/info max_total_tokens", self.url)
        input_key = "max_input_tokens" if "max_input_tokens" in info else "max_input_length"  # renamed in 2.1
        max_input = positive_int(info.get(input_key), f"/info {input_key}", self.url)
        if "max_batch_total_tokens" in info:  # /info carried it until 2.3
            budget = positive_int(info["max_batch_total_tokens"], "/info max_batch_total_tokens", self.url)
            if budget:
                readings.append(PoolReading("/info max_batch_total_tokens", Origin.SCHEDULER, budget))
        metrics = self.metrics()
        if metrics is None:
            notes.append("/metrics not served")
        else:
            for _, value in metrics.get("tgi_batch_max_total_tokens", []):
                budget = positive_int(value, "tgi_batch_max_total_tokens", self.url)
                if budget:
                    readings.append(PoolReading("metrics tgi_batch_max_total_tokens", Origin.SCHEDULER, budget))
        if log_text is not None:
            log_readings, log_notes = parse_tgi_log(log_text)
            readings.extend(log_readings)
            notes.extend(log_notes)
        if not readings:
            notes.append("no batch token budget found (pass --log with TGI's start-up log for the warm-up line)")
        settings: dict[str, Any] = {key: info[key] for key in ("max_concurrent_requests", "max_best_of", "max_client_batch_size",
                                               "validation_workers", "router", "model_pipeline_tag",
                                               "waiting_served_ratio", "max_waiting_tokens", "max_batch_size")
                    if key in info}
        if role is not None and role is not Role.UNIFIED:
            notes.append(f"role {role.value} given on the command line; TGI serves prefill and decode in one process")
        version = info.get("version")
        stated_role = role_of(role, None)  # the engine states no disaggregation role
        return EngineSnapshot(
            url=self.url, engine=self.kind, version=str(version) if version is not None else None,
            role=stated_role[0], role_source=stated_role[1], model=optional_text(info.get("model_id"), "/info model_id", self.url),
            served_context=served,
            pool_readings=tuple(readings), max_request_tokens=max_input, settings=settings, notes=tuple(notes),
        )

    def counters(self) -> Counters:
        metrics = self.metrics()
        return Counters(
            # tgi_request_count also counts refused requests; success counts served ones only.
            requests=metric_sum(metrics, "tgi_request_success"),
            # recorded after validation passed, so a refused prompt does not move it
            prompt_tokens=metric_sum(metrics, "tgi_request_input_length_sum"),
            generation_tokens=metric_sum(metrics, "tgi_request_generated_tokens_sum"),
            used_tokens=metric_sum(metrics, "tgi_batch_current_max_tokens"),
            extra={k: v for k in ("tgi_request_count", "tgi_request_failure", "tgi_queue_size")
                   if (v := metric_sum(metrics, k)) is not None},
        )

    def max_accepted_prompt(self, snapshot: EngineSnapshot) -> int | None:
        # validation.rs validate_input: refused when input + max_new_tokens > max_total_tokens or
        # input > max_input_tokens (the message says "less than", the code allows equal).
        limits = [n for n in (snapshot.max_request_tokens,
                              snapshot.served_context - 1 if snapshot.served_context else None) if n]
        return min(limits) if limits else None

    # -- sending ---------------------------------------------------------------------------
    def token_ids(self, count: int, seed_text: str) -> list[int]:
        plan = self._plans.get(seed_text)
        if plan is None:
            plan = self._plans[seed_text] = self._plan(seed_text)
        return plan.ids(count)

    def build_request(self, ids: list[int], *, max_tokens: int, stream: bool,
                      extra: Mapping[str, Any] | None = None) -> EngineRequest:
        text, counted = self._text_for(ids)
        params: dict[str, Any] = {"max_new_tokens": max_tokens, "details": True, "do_sample": False}
        body: dict[str, Any] = {"inputs": text, "parameters": params}
        body.update(extra or {})
        return EngineRequest(path="/generate_stream" if stream else "/generate", body=body,
                             sent_tokens=counted if counted is not None else len(ids), max_tokens=max_tokens, stream=stream)

    def parse_reply(self, request: EngineRequest, reply: HttpReply) -> ReplyFacts:
        data = reply.json()
        if isinstance(data, list):  # the compat route answers a list; /generate an object
            data = data[0] if data else {}
        data = json_object(data, "answer", reply.url)
        details = optional_object(data.get("details"), "answer details", reply.url)
        return _facts(request, details, str(data.get("generated_text") or ""),
                      _header_int(reply.headers.get("x-prompt-tokens")), reply.url, "answer details")

    def parse_events(self, request: EngineRequest, events: list[Any]) -> ReplyFacts:
        url = f"{self.url}{request.path}"
        final: dict[str, Any] = {}
        pieces: list[str] = []
        for i, event in enumerate(events):
            event = json_object(event, f"stream frame {i}", url)
            token = event.get("token")
            if isinstance(token, dict) and not token.get("special"):
                pieces.append(str(token.get("text") or ""))
            if event.get("details") is not None:
                final = event
        details = optional_object(final.get("details"), "final stream frame details", url)
        generated = str(final["generated_text"]) if final.get("generated_text") is not None else "".join(pieces)
        input_length = token_count(details.get("input_length"), "final stream frame details.input_length", url)
        return _facts(request, details, generated, input_length, url, "final stream frame details")

    # -- text prompts of an exact length -------------------------------------------------------
    def _tokenize(self, text: str) -> list[dict[str, Any]] | None:
        """TGI's tokens for `text`; None when the body is over TGI's --payload-limit (HTTP 413)."""
        reply = self.client.post(f"{self.url}/tokenize", {"inputs": text})
        if reply.status == 413:
            return None
        if reply.status != 200:
            raise EngineError(f"{self.url}/tokenize: {error_reply_message(reply.status, reply.body)}; "
                              "kvpreflight needs TGI's tokenizer to build prompts of a known length")
        tokens = reply.json()
        if not isinstance(tokens, list) or not all(_is_token(t) for t in tokens):
            raise EngineError(f"{self.url}/tokenize: no token list (each an id with its start and stop offsets) in the answer")
        return tokens

    def _plan(self, seed: str) -> _TextPlan:
        if not seed:
            raise EngineError("the probe text is empty")
        size = len(seed.encode())  # TGI's offsets are byte offsets into the UTF-8 text
        if size != len(seed):
            raise EngineError("the probe text must be ASCII for TGI (its /tokenize offsets are bytes)")
        tokens = self._tokenize(seed * 4)
        if tokens is None:
            raise EngineError(f"{self.url}/tokenize: HTTP 413 for a short text")
        spans = [(t["id"], t.get("start", 0), t.get("stop", 0)) for t in tokens]
        lead = 0
        while lead < len(spans) and spans[lead][1] == spans[lead][2]:
            lead += 1
        trail = 0
        while trail < len(spans) - lead and spans[-1 - trail][1] == spans[-1 - trail][2]:
            trail += 1
        body = spans[lead: len(spans) - trail]
        copies: list[list[tuple[int, int]]] = [[], [], [], []]
        for token_id, start, stop in body:
            # A token belongs to the copy its last byte is in (" word" takes the space before it).
            copy = (stop - 1) // size
            if start < 0 or start >= stop or copy > 3:
                raise EngineError(f"{self.url}/tokenize: token offsets outside the probe text; "
                                  "cannot build TGI prompts of an exact length from it")
            copies[copy].append((token_id, stop - copy * size))
        if not copies[0] or not copies[1] or copies[1] != copies[2]:
            raise EngineError(f"{self.url}/tokenize: the repeated probe text does not tokenize the same way each time; "
                              "cannot build TGI prompts of an exact length from it")
        return _TextPlan(seed, tuple(t[0] for t in spans[:lead]), trail, tuple(copies[0]), tuple(copies[1]))

    def _text_for(self, ids: list[int]) -> tuple[str, int | None]:
        """The text of exactly len(ids) tokens as TGI counts them, and that count (None: unverified)."""
        want = len(ids)
        plan = next((p for p in self._plans.values() if p.ids(want) == list(ids)), None)
        if plan is None:
            raise EngineError("TGI takes text prompts: send only token ids this adapter's token_ids() produced")
        fixed = len(plan.special_head) + plan.special_tail
        content = want - fixed
        if content < 1:
            raise EngineError(f"a TGI prompt needs more than {fixed} tokens (its special tokens)")
        counted: int | None = None
        # A cut inside a word can tokenize differently at the very end of the text; then move the
        # cut, and if the count jumps over the target, start the text a few tokens later too.
        for skip in range(min(MAX_SKIP, len(plan.head) - 1) + 1):
            tried: set[int] = set()
            cut = content + skip
            while cut > skip and cut not in tried and len(tried) < MAX_CALIBRATIONS:
                tried.add(cut)
                text = plan.text(cut, skip)
                tokens = self._tokenize(text)
                if tokens is None:  # over --payload-limit: /generate refuses it the same way (HTTP 413)
                    return text, None
                counted = len(tokens)
                if counted == want:
                    return text, counted
                cut += want - counted
        raise EngineError(f"{self.url}: could not build a text prompt of exactly {want:,} tokens "
                          f"(TGI's /tokenize counted {counted:,} for the nearest one)")


def parse_tgi_log(text: str) -> tuple[list[PoolReading], list[str]]:
    readings: list[PoolReading] = []
    notes: list[str] = []
    for line in log_lines(text):
        if m := ALLOCATOR_LINE.search(line):
            readings.append(PoolReading("log: Setting max batch total tokens", Origin.ALLOCATOR,
                                        log_count(m["tokens"], "max batch total tokens")))
        if m := NOT_ENOUGH_MEMORY.search(line):
            notes.append(f"engine log: not enough memory to handle max_total_tokens={m[1] or m[2]} (the warm-up refused it)")
        if NOT_MEASURED in line:
            notes.append("engine log: the model does not support automatic max batch total tokens, so the budget "
                         "is --max-batch-total-tokens or a default, not measured from free memory")
    return readings, notes


def _facts(request: EngineRequest, details: Mapping[str, Any], text: str, prompt: int | None, url: str, what: str) -> ReplyFacts:
    finish = optional_text(details.get("finish_reason"), f"{what}.finish_reason", url)
    return ReplyFacts(
        text=text, completion_tokens=token_count(details.get("generated_tokens"), f"{what}.generated_tokens", url),
        prompt_tokens=prompt, finish_reason=None if finish is None else FINISH.get(finish, finish),
        truncated=None if prompt is None else prompt < request.sent_tokens,
    )


def _header_int(value: str | None) -> int | None:
    """A count in a header (x-prompt-tokens); None when absent or not a count (13 digits at most:
    more is no token count, and Python refuses to convert thousands)."""
    digits = (value or "").strip()
    return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 13 else None


def _is_token(token: Any) -> bool:
    """One of /tokenize's tokens: an id, with whole-number offsets where it has them."""
    return (isinstance(token, dict) and _whole(token.get("id"))
            and _whole(token.get("start", 0)) and _whole(token.get("stop", 0)))


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _info(url: str, client: HttpClient, *, required: bool) -> dict[str, Any] | None:
    try:
        reply = client.get(f"{url.rstrip('/')}/info", max_bytes=BodyLimit.JSON_INFO)
    except EngineTimeout:
        raise
    except EngineError:
        if required:
            raise
        return None
    if reply.status == 200:
        try:
            return json_object(reply.json(), "/info answer", url.rstrip("/"))
        except EngineError:
            if required:
                raise
            return None
    if required:
        raise EngineError(f"{url}: no TGI /info (HTTP {reply.status}; is this a text-generation-inference server?)")
    return None
