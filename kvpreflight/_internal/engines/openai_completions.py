"""The OpenAI `/v1/completions` route, shared by engines that serve it with token-id prompts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import BodyLimit, EngineTimeout, HttpClient, HttpReply
from kvpreflight._internal.engines.interface import EngineAdapter, EngineRequest, ReplyFacts
from kvpreflight._internal.engines.untrusted import json_list, json_object, optional_object, optional_text, token_count

# LiteLLM's proxy (1.110.2, litellm/exceptions.py ContextWindowExceededError, HTTP 400): it turns
# an upstream's length refusal into "litellm.ContextWindowExceededError: ..." in an OpenAI error
# body ({"error": {"message", "type": "invalid_request_error", "code": "400"}}), keeping the
# upstream's own message inside, which a gateway may reword.
GATEWAY_LENGTH_PATTERNS = (r"\bContextWindowExceededError\b",)


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
        data = json_object(reply.json(), "answer", reply.url)
        return _facts(data, _choice_text(data, reply.url, "answer"), reply.url, "answer")

    def parse_events(self, request: EngineRequest, events: list[Any]) -> ReplyFacts:
        url = f"{self.url}{request.path}"
        text: list[str] = []
        usage_event: dict[str, Any] = {}
        finish = None
        model = None
        for i, event in enumerate(events):
            what = f"stream frame {i}"
            event = json_object(event, what, url)
            text.append(_choice_text(event, url, what))
            for choice in _choices(event, url, what):
                finish = optional_text(choice.get("finish_reason"), f"{what} choices[].finish_reason", url) or finish
            model = _model(event) or model
            if event.get("usage"):
                usage_event = event
        # The usage arrives in a last frame of its own; the finish reason in the frame before it.
        merged = {**usage_event, "model": model, "choices": [{"finish_reason": finish}]}
        return _facts(merged, "".join(text), url, "usage frame")


def _facts(data: Mapping[str, Any], text: str, url: str, what: str) -> ReplyFacts:
    usage = optional_object(data.get("usage"), f"{what} usage", url)
    details = usage.get("prompt_tokens_details")
    choices = _choices(data, url, what) or [{}]
    return ReplyFacts(
        text=text, completion_tokens=token_count(usage.get("completion_tokens"), f"{what} usage.completion_tokens", url),
        prompt_tokens=token_count(usage.get("prompt_tokens"), f"{what} usage.prompt_tokens", url),
        cached_tokens=(token_count(details.get("cached_tokens"), f"{what} usage.prompt_tokens_details.cached_tokens", url)
                       if isinstance(details, dict) else None),
        finish_reason=optional_text(choices[0].get("finish_reason"), f"{what} choices[0].finish_reason", url),
        truncated=data.get("truncated") if isinstance(data.get("truncated"), bool) else None,
        model=_model(data),
    )


def _model(data: Mapping[str, Any]) -> str | None:
    """The answer's `model`, where it is a name (it is evidence of who answered, not a count:
    another shape is not a malformed reply)."""
    model = data.get("model")
    return model if isinstance(model, str) and model else None


def _choices(data: Mapping[str, Any], url: str, what: str) -> list[dict[str, Any]]:
    """`choices`, each an object (a null choice counts as empty, as engines have sent)."""
    listed = json_list(data.get("choices") or [], f"{what} choices", url)
    return [optional_object(c, f"{what} choices[{i}]", url) for i, c in enumerate(listed)]


def _choice_text(data: Mapping[str, Any], url: str, what: str) -> str:
    return "".join(str(c.get("text") or "") for c in _choices(data, url, what))


def owned_with_version(url: str, client: HttpClient, owner: str) -> bool:
    """Whether the server lists its first model as `owned_by` this owner and answers /version
    with a version (vLLM: "vllm"; TensorRT-LLM: "tensorrt_llm"). A hang goes through (detection)."""
    base = url.rstrip("/")
    try:
        version = client.get(f"{base}/version", max_bytes=BodyLimit.JSON_INFO)
        models = client.get(f"{base}/v1/models", max_bytes=BodyLimit.JSON_INFO)
    except EngineTimeout:
        raise
    except EngineError:
        return False
    if version.status != 200 or models.status != 200:
        return False
    try:
        return "version" in version.json() and models.json()["data"][0].get("owned_by") == owner
    except (EngineError, KeyError, IndexError, TypeError, AttributeError):
        return False


def openai_entry(engine: type[EngineAdapter]) -> type[EngineAdapter]:
    """An engine kind's adapter on the OpenAI completions route, for a gateway in front of it that
    serves only the OpenAI API: the engine's own length messages, as the gateway relays them, plus
    the gateway's. No request-id field: a gateway may refuse a body field it does not know."""
    if issubclass(engine, OpenAICompletionsMixin):
        base: tuple[type[EngineAdapter], ...] = (engine,)
    else:
        base = (OpenAICompletionsMixin, engine)
    return type(f"OpenAIEntry{engine.__name__}", base, {
        "request_id_field": None, "request_id_header": None,
        "length_error_patterns": (*engine.length_error_patterns, *GATEWAY_LENGTH_PATTERNS),
    })
