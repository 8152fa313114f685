"""SGLang's OpenAI-compatible endpoints: /v1/completions, /v1/models and /tokenize, with the
shapes of sglang/srt/entrypoints/openai/serving_base.py and serving_completions.py of 0.5.23.
A completion is translated into a /generate body and runs the same path.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from kvpreflight._internal.builtin_engine import tokenizer
from kvpreflight._internal.builtin_engine.protocol import OnToken, RequestError, params_from_generate, prompt_ids

if TYPE_CHECKING:
    from kvpreflight._internal.builtin_engine.server import EngineHandler


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def models(h: EngineHandler) -> None:
    e = h.engine
    h.reply_json(200, {
        "object": "list",
        "data": [{
            "id": e.config.model_name, "object": "model", "created": int(h.server.started_at),
            "owned_by": "sglang", "root": e.config.model_name, "parent": None, "max_model_len": e.context_len,
        }],
    })


def tokenize(h: EngineHandler, body: dict[str, Any]) -> None:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
        h.reply_json(200, {"tokens": ids, "count": len(ids), "max_model_len": h.engine.context_len})
    elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        tokens = [tokenizer.encode(p) for p in prompt]
        h.reply_json(200, {"tokens": tokens, "count": [len(t) for t in tokens], "max_model_len": h.engine.context_len})
    else:
        h.reply_json(400, error_body("prompt must be a string or a list of strings."))


def completions(h: EngineHandler, body: dict[str, Any]) -> None:
    stream = bool(body.get("stream"))
    model = h.engine.config.model_name
    created = int(time.time())
    cid = f"cmpl-{uuid.uuid4().hex}"
    try:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = prompt_ids(prompt, None)
        elif isinstance(prompt, list):
            ids = prompt_ids(None, prompt)
        else:
            raise RequestError("prompt must be a string, a list of token ids, or a one-element list of either.")
        gen_body = {
            "sampling_params": {"max_new_tokens": body.get("max_tokens", 16), "stop": body.get("stop"),
                                "stop_token_ids": body.get("stop_token_ids"), "ignore_eos": body.get("ignore_eos", False)},
            "return_logprob": False, "cache_salt": body.get("cache_salt"), "rid": body.get("rid"),
            "bootstrap_host": body.get("bootstrap_host"), "bootstrap_port": body.get("bootstrap_port"),
            "bootstrap_room": body.get("bootstrap_room"),
        }
        params = params_from_generate(gen_body)
    except RequestError as exc:
        _error(h, exc, stream, headers_sent=False)
        return
    on_token: OnToken | None = None
    if stream:
        h.start_stream()

        def frame_token(token: int, logprob: float) -> None:
            h.frame({"id": cid, "object": "text_completion", "created": created, "model": model,
                     "choices": [{"index": 0, "text": tokenizer.decode([token]), "logprobs": None,
                                  "finish_reason": None, "matched_stop": None}]})

        on_token = frame_token
    try:
        gen = h.run(ids, params, gen_body, on_token)
    except RequestError as exc:
        _error(h, exc, stream, headers_sent=stream)
        return
    except (BrokenPipeError, ConnectionResetError):
        return
    if gen is None:
        return
    finish = gen.finish_reason.get("type")
    matched = gen.finish_reason.get("matched") if finish == "stop" else None
    usage = {"prompt_tokens": len(gen.prompt_ids), "completion_tokens": len(gen.output_ids),
             "total_tokens": len(gen.prompt_ids) + len(gen.output_ids),
             "prompt_tokens_details": {"cached_tokens": gen.cached_tokens}}
    if stream:
        h.frame({"id": cid, "object": "text_completion", "created": created, "model": model,
                 "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish,
                              "matched_stop": matched}], "usage": usage})
        h.done()
        return
    h.reply_json(200, {"id": cid, "object": "text_completion", "created": created, "model": model,
                       "choices": [{"index": 0, "text": gen.text, "logprobs": None, "finish_reason": finish,
                                    "matched_stop": matched}], "usage": usage})


def _error(h: EngineHandler, exc: RequestError, stream: bool, headers_sent: bool) -> None:
    err_type = "BadRequestError" if exc.status == 400 else "InternalServerError"
    body = error_body(str(exc), err_type, exc.status)
    if not stream:
        h.reply_json(exc.status, body)
        return
    if not headers_sent:
        h.start_stream()
    h.frame({"error": body})
    h.done()
