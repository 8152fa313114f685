"""The OpenAI `/v1/completions` route, shared by engines that serve it with token-id prompts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpreflight.engines.http import HttpReply
from kvpreflight.engines.interface import EngineAdapter, EngineRequest, ReplyFacts


class OpenAICompletionsMixin(EngineAdapter):
    def build_request(self, ids: list[int], *, max_tokens: int, stream: bool,
                      extra: Mapping[str, Any] | None = None) -> EngineRequest:
        body: dict[str, Any] = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        if self.model:
            body["model"] = self.model
        if stream:
            body["stream_options"] = {"include_usage": True}
        body.update(extra or {})
        return EngineRequest(path="/v1/completions", body=body, sent_tokens=len(ids), max_tokens=max_tokens, stream=stream)

    def parse_reply(self, request: EngineRequest, reply: HttpReply) -> ReplyFacts:
        data = reply.json()
        return _facts(data, _choice_text(data))

    def parse_events(self, request: EngineRequest, events: list[Any]) -> ReplyFacts:
        text: list[str] = []
        usage_event: dict[str, Any] = {}
        finish = None
        for event in events:
            text.append(_choice_text(event))
            for choice in event.get("choices") or []:
                finish = choice.get("finish_reason") or finish
            if event.get("usage"):
                usage_event = event
        # The usage arrives in a last frame of its own; the finish reason in the frame before it.
        merged = {**usage_event, "choices": [{"finish_reason": finish}]}
        return _facts(merged, "".join(text))


def _facts(data: Mapping[str, Any], text: str) -> ReplyFacts:
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    choices = data.get("choices") or [{}]
    return ReplyFacts(
        text=text, completion_tokens=usage.get("completion_tokens"), prompt_tokens=usage.get("prompt_tokens"),
        cached_tokens=details.get("cached_tokens") if isinstance(details, dict) else None,
        finish_reason=(choices[0] or {}).get("finish_reason"),
        truncated=data.get("truncated") if isinstance(data.get("truncated"), bool) else None,
    )


def _choice_text(data: Mapping[str, Any]) -> str:
    return "".join(str((c or {}).get("text") or "") for c in data.get("choices") or [])
