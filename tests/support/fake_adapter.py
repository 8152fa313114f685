"""A scripted engine behind the real EngineAdapter interface, for unit tests that run in
milliseconds: a canned snapshot, counters that move with the requests it serves, and answers
decided per request by a script.

The default script is a well-behaved SGLang-like engine: it refuses a prompt over its stated
limit, or a prompt plus max_tokens over its context, for length; echoes the text its prompt was
made from (so canaries come back), and keeps a prefix cache keyed by (cache_salt, prompt) that
reports `cached_tokens`.

    engine = FakeEngine(snapshot(url, pool=4096, context=8192))
    adapter = FakeAdapter(url, client)  # looks the engine up by URL in ENGINES
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from kvpreflight._internal.engines.http import HttpClient, HttpReply
from kvpreflight._internal.engines.interface import Counters, EngineAdapter, EngineRequest, PrefillLeg, ReplyFacts, SplitLegs
from kvpreflight._internal.engines.log_patterns import LogSignal
from kvpreflight._internal.engines.vllm import PREFILL_LEG_PARAMS, VllmAdapter, prefill_handoff
from kvpreflight.model import (
    Completion,
    EngineSnapshot,
    ErrorKind,
    Origin,
    PoolReading,
    Role,
)

ENGINES: dict[str, FakeEngine] = {}  # url -> engine; a fixture fills and clears it
ID_BASE = 1_000_000  # token id = seed number * ID_BASE + position: the seed text is recoverable


@dataclass(frozen=True)
class Sent:
    """One request as the fake engine received it."""

    url: str  # the adapter's URL (the entry the request went through)
    tokens: int
    max_tokens: int
    stream: bool
    extra: Mapping[str, Any]
    model: str | None
    seed: str  # the text the prompt's ids were made from (a tenant's: its head, then its canary)
    timeout_s: float = 0.0  # the budget kvpreflight gave the request
    request_id: str | None = None  # the id kvpreflight gave it (the fake takes SGLang's `rid`)


def snapshot(url: str, *, pool: int | None = 4096, context: int | None = 8192, role: Role = Role.UNIFIED,
             engine: str = "fake", model: str = "m", **fields: Any) -> EngineSnapshot:
    readings = () if pool is None else (PoolReading("fake pool", Origin.SCHEDULER, pool),)
    return EngineSnapshot(url=url, engine=engine, version="1", role=role, model=model, served_context=context,
                          pool_readings=readings, **fields)


@dataclass
class FakeEngine:
    snap: EngineSnapshot
    # The answer to one request; the default is `well_behaved`. Return a Completion to answer
    # exactly that, or None for the default answer.
    script: Callable[[FakeEngine, Sent], Completion | None] = lambda engine, sent: None
    healthy: bool = True
    forwards_to: tuple[FakeEngine, ...] = ()  # a router: each engine behind it serves the request in turn
    sent: list[Sent] = field(default_factory=list)
    counters: Counters = field(default_factory=lambda: Counters(requests=0, prompt_tokens=0, generation_tokens=0,
                                                                prefix_cache_hits=0, used_tokens=0))
    cache: set[tuple[str | None, str, int]] = field(default_factory=set)  # (cache_salt, seed, tokens)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        ENGINES[self.snap.url] = self

    @property
    def limit(self) -> int:
        """The longest prompt this engine accepts (SGLang's rule: min(context - 1, pool - 1) - 6)."""
        pool, ctx = self.snap.pool_tokens(), self.snap.served_context
        assert ctx is not None
        return min(ctx - 1, (pool or ctx) - 1) - 6

    def answer(self, sent: Sent) -> Completion:
        with self.lock:
            self.sent.append(sent)
        if self.forwards_to:
            return [engine.answer(sent) for engine in self.forwards_to][-1]
        with self.lock:
            scripted = self.script(self, sent)
            return scripted if scripted is not None else self.well_behaved(sent)

    def well_behaved(self, sent: Sent) -> Completion:
        base = Completion(sent_tokens=sent.tokens, max_tokens=sent.max_tokens, streamed=sent.stream, status=200,
                          elapsed_s=0.001, ttft_s=0.001 if sent.stream else None)
        if sent.tokens > self.limit:
            message = f"Input length ({sent.tokens} tokens) exceeds the maximum allowed length ({self.limit} tokens)."
            return replace(base, status=400, error_message=message, error_kind=ErrorKind.LENGTH)
        ctx = self.snap.served_context or 0
        if sent.tokens + sent.max_tokens > ctx:
            message = f"Requested token count exceeds the model's maximum context length of {ctx} tokens."
            return replace(base, status=400, error_message=message, error_kind=ErrorKind.LENGTH)
        generated = sent.max_tokens
        key = (sent.extra.get("cache_salt"), sent.seed, sent.tokens)
        cached = sent.tokens - 1 if key in self.cache else 0
        self.cache.add(key)
        c = self.counters
        self.counters = replace(c, requests=(c.requests or 0) + 1, prompt_tokens=(c.prompt_tokens or 0) + sent.tokens,
                                generation_tokens=(c.generation_tokens or 0) + generated,
                                prefix_cache_hits=(c.prefix_cache_hits or 0) + (1 if cached else 0))
        return replace(base, completion_tokens=generated, prompt_tokens=sent.tokens, cached_tokens=cached,
                       finish_reason="length", text=sent.seed * 3)


class FakeAdapter(EngineAdapter):
    kind = "fake"
    request_id_field = "rid"
    # vLLM's own lease lines too (a late read, an expiry), matched as the vLLM adapter matches them.
    log_signals = (LogSignal("Decode transfer failed for request",
                             re.compile(r"Decode transfer failed for request rid=(?P<rid>\S+)")), *VllmAdapter.log_signals)
    seeds: ClassVar[list[str]] = []  # every seed text token_ids() was asked for (shared, like a tokenizer)

    @property
    def engine(self) -> FakeEngine:
        return ENGINES[self.url]

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        return url.rstrip("/") in ENGINES

    def snapshot(self, *, role: Role | None = None, log_text: str | None = None) -> EngineSnapshot:
        snap = self.engine.snap
        return snap if role is None else replace(snap, role=role)

    def counters(self) -> Counters:
        return self.engine.counters

    def healthy(self) -> bool:
        return self.engine.healthy

    def max_accepted_prompt(self, snapshot: EngineSnapshot) -> int | None:
        limit = snapshot.max_request_tokens
        if limit is None:
            pool, ctx = snapshot.pool_tokens(), snapshot.served_context
            if ctx is None:
                return None
            limit = min(ctx - 1, (pool or ctx) - 1) - 5
        return limit - 1

    def token_ids(self, count: int, seed_text: str) -> list[int]:
        if seed_text not in self.seeds:
            self.seeds.append(seed_text)
        number = self.seeds.index(seed_text)
        return [number * ID_BASE + i for i in range(count)]

    def build_request(self, ids: list[int], *, max_tokens: int, stream: bool,
                      extra: Mapping[str, Any] | None = None) -> EngineRequest:
        body: dict[str, Any] = {"input_ids": ids, "max_new_tokens": max_tokens, "stream": stream, **(extra or {})}
        if self.model:
            body["model"] = self.model
        return EngineRequest(path="/generate", body=body, sent_tokens=len(ids), max_tokens=max_tokens, stream=stream)

    def complete(self, ids: list[int], *, max_tokens: int, stream: bool, timeout_s: float,
                 extra: Mapping[str, Any] | None = None) -> Completion:
        request = self.with_request_id(self.build_request(ids, max_tokens=max_tokens, stream=stream, extra=extra))
        seed = "".join(dict.fromkeys(self.seeds[i // ID_BASE] for i in ids))  # each seed its prompt was made of, in order
        answer = self.engine.answer(Sent(self.url, request.sent_tokens, max_tokens, stream, dict(extra or {}),
                                         self.model, seed, timeout_s, request.request_id))
        return replace(answer, request_id=request.request_id)

    def parse_reply(self, request: EngineRequest, reply: HttpReply) -> ReplyFacts:
        raise AssertionError("the fake engine answers in complete(); nothing is parsed")

    def parse_events(self, request: EngineRequest, events: list[Any]) -> ReplyFacts:
        raise AssertionError("the fake engine answers in complete(); nothing is parsed")


# vLLM 0.32's prefill answer to a prefill leg (nixl/pull_scheduler.py request_finished's
# kv_transfer_params, as the real pair of tests/real/test_vllm_pd_real.py answered one): the
# fake split-leg adapter hands it on as the real adapter does (VllmAdapter.send_prefill_leg).
VLLM_PREFILL_LEG_ANSWER: dict[str, Any] = {
    "id": "cmpl-kvpreflight-0f3a9c2e1b7d4e65-0-9a1b2c3d", "object": "text_completion", "created": 1764696000,
    "model": "tiny-llama",
    "choices": [{"index": 0, "text": " x", "logprobs": None, "finish_reason": "length", "stop_reason": None,
                 "prompt_logprobs": None}],
    "usage": {"prompt_tokens": 64, "total_tokens": 65, "completion_tokens": 1, "prompt_tokens_details": None},
    "kv_transfer_params": {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[7]],
                           "remote_engine_id": "f2b4c6d8-1a3e-4b5c-9d7e-0f1a2b3c4d5e",
                           "remote_request_id": "cmpl-kvpreflight-0f3a9c2e1b7d4e65-0-9a1b2c3d",
                           "remote_host": "127.0.0.1", "remote_port": 5611, "tp_size": 1, "dcp_size": 1, "pp_size": 1,
                           "remote_num_tokens": 64, "remote_blocks_expiry_time": None, "transfer_mode": "pull"},
}


class FakeSplitLegsAdapter(FakeAdapter, SplitLegs):
    """A fake engine whose prefill/decode legs kvpreflight sends itself, as vLLM NIXL's are: the
    prefill leg answers with vLLM's recorded handoff; the decode leg reaches the decode engine's
    script with the handoff in `extra["kv_transfer_params"]`."""

    held_kv_lease = VllmAdapter.held_kv_lease

    def send_prefill_leg(self, ids: list[int], *, timeout_s: float, extra: Mapping[str, Any] | None = None) -> PrefillLeg:
        completion = self.complete(ids, max_tokens=1, stream=False, timeout_s=timeout_s,
                                   extra={**(extra or {}), "kv_transfer_params": PREFILL_LEG_PARAMS})
        handoff = prefill_handoff(VLLM_PREFILL_LEG_ANSWER, self.url) if completion.served else None
        return PrefillLeg(completion, handoff)

    def send_decode_leg(self, ids: list[int], handoff: Mapping[str, Any], *, max_tokens: int, timeout_s: float,
                        extra: Mapping[str, Any] | None = None) -> Completion:
        return self.complete(ids, max_tokens=max_tokens, stream=False, timeout_s=timeout_s,
                             extra={**(extra or {}), "kv_transfer_params": dict(handoff)})
