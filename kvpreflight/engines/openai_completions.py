"""The OpenAI `/v1/completions` route, shared by engines that serve it with token-id prompts."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any, Mapping

from kvpreflight.engines.interface import (
    Completion,
    EngineAdapter,
    completion_from_error,
    error_message_of,
)


class OpenAICompletionsMixin(EngineAdapter):
    model_name: str | None = None

    def complete(self, ids: list[int], *, max_tokens: int, stream: bool, timeout_s: float,
                 extra: Mapping[str, Any] | None = None) -> Completion:
        body: dict[str, Any] = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        if self.model_name:
            body["model"] = self.model_name
        if stream:
            body["stream_options"] = {"include_usage": True}
        body.update(extra or {})
        sent = len(ids)
        reply = self.send("/v1/completions", body, sent=sent, max_tokens=max_tokens, stream=stream, timeout_s=timeout_s)
        if isinstance(reply, Completion):
            return reply
        digest = hashlib.sha256(reply.body).hexdigest()
        if not stream:
            if reply.status != 200:
                message = error_message_of(reply.body) or f"HTTP {reply.status} without an error message"
                return completion_from_error(sent, max_tokens, False, reply, message, self.classify_error(message))
            data = reply.json()
            return self._completion(sent, max_tokens, False, reply.status, reply.elapsed_s, reply.body, digest,
                                    data, _choice_text(data), None)
        if reply.status != 200:
            message = error_message_of(reply.body) or f"HTTP {reply.status} without an error message"
            return completion_from_error(sent, max_tokens, True, reply, message, self.classify_error(message))
        events, early = self.stream_events(reply, sent, max_tokens)
        if early is not None:
            return early
        text: list[str] = []
        usage_event: dict[str, Any] = {}
        finish = None
        for event in events:
            text.append(_choice_text(event))
            for choice in event.get("choices") or []:
                finish = choice.get("finish_reason") or finish
            if event.get("usage"):
                usage_event = event
        merged = dict(usage_event)
        merged.setdefault("choices", [{"finish_reason": finish}])
        if finish is not None:
            merged["choices"] = [{"finish_reason": finish}]
        result = self._completion(sent, max_tokens, True, reply.status, reply.elapsed_s, reply.body, digest,
                                  merged, "".join(text), reply.first_frame_s)
        if reply.timed_out:
            return replace(result, timed_out=True)
        return result

    def _completion(self, sent: int, max_tokens: int, stream: bool, status: int, elapsed: float, body: bytes,
                    digest: str, data: Mapping[str, Any], text: str, ttft: float | None) -> Completion:
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        choices = data.get("choices") or [{}]
        return Completion(
            sent_tokens=sent, max_tokens=max_tokens, streamed=stream, status=status, elapsed_s=elapsed,
            completion_tokens=usage.get("completion_tokens"), prompt_tokens=usage.get("prompt_tokens"),
            cached_tokens=details.get("cached_tokens") if isinstance(details, dict) else None,
            finish_reason=(choices[0] or {}).get("finish_reason"),
            truncated=data.get("truncated") if isinstance(data.get("truncated"), bool) else None,
            body_bytes=len(body), body_sha256=digest, ttft_s=ttft, text=text,
        )


def _choice_text(data: Mapping[str, Any]) -> str:
    return "".join(str((c or {}).get("text") or "") for c in data.get("choices") or [])
