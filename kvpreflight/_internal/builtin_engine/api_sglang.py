"""SGLang's native endpoints: /generate, /server_info, /model_info, /v1/loads, /metrics and
/health_generate, wire-compatible with SGLang 0.5.23 (entrypoints/http_server.py and
managers/tokenizer_manager.py) for what kvpreflight reads.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from kvpreflight._internal.builtin_engine import metrics, tokenizer
from kvpreflight._internal.builtin_engine.config import GB, MAX_RUNNING_REQUESTS, Fault
from kvpreflight._internal.builtin_engine.protocol import (
    Generation,
    GenParams,
    OnToken,
    RequestError,
    disaggregation_mode,
    params_from_generate,
    prompt_ids,
    version_string,
)
from kvpreflight.model import ProcessRole

if TYPE_CHECKING:
    from kvpreflight._internal.builtin_engine.server import EngineHandler



def server_info(h: EngineHandler) -> None:
    h.reply_json(200, h.server.server_info)


def model_info(h: EngineHandler) -> None:
    e = h.engine
    h.reply_json(200, {
        "model_path": e.config.model_name, "served_model_name": e.config.model_name,
        "tokenizer_path": e.config.model_name, "is_generation": True, "preferred_sampling_params": None,
        "weight_version": "default", "load_format": "auto", "reasoning_parser": None, "tool_call_parser": None,
        "disaggregation_mode": disaggregation_mode(e.role), "has_image_understanding": False,
        "has_audio_understanding": False, "model_type": "kvpreflight_copy",
        "architectures": ["KvpreflightCopyHeadForCausalLM"], "vocab_size": tokenizer.VOCAB_SIZE,
    })


def loads(h: EngineHandler) -> None:
    e = h.engine
    pool = e.reported_pool_tokens
    used = e.used_tokens()
    h.reply_json(200, {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "version": version_string(), "accelerator": e.device, "num_accelerators": 1,
        "loads": [{
            "dp_rank": 0, "num_running_reqs": e.counters.running, "num_waiting_reqs": 0,
            "num_used_tokens": used, "num_total_tokens": used, "max_total_num_tokens": pool,
            "max_running_requests": MAX_RUNNING_REQUESTS, "token_usage": used / pool if pool else 0.0,
            "memory": {"weight_gb": round(e.model.weight_bytes / GB, 3),
                       "kv_cache_gb": round(e.allocator_kv_bytes / GB, 3), "graph_gb": 0.0, "token_capacity": pool},
        }],
    })


def metrics_page(h: EngineHandler) -> None:
    if not h.engine.config.enable_metrics:
        h.reply_json(404, {"detail": "Not Found"})
        return
    h.reply_text(200, metrics.render(h.engine))


HEALTH_CHECK_TIMEOUT_S = 20.0  # SGLang's SGLANG_HEALTH_CHECK_TIMEOUT default


def health_generate(h: EngineHandler) -> None:
    e = h.engine
    if e.wedged.is_set():
        # Fault wedge-after-disconnect: SGLang's health generation waits for a scheduler that
        # never answers, then says 503 (http_server.py health_generate).
        time.sleep(HEALTH_CHECK_TIMEOUT_S)
        h.reply_empty(503)
        return
    if e.role is ProcessRole.UNIFIED:
        try:
            e.run_unified([0], GenParams(max_new_tokens=1, rid=f"HEALTH_CHECK_{uuid.uuid4().hex}"))
        except Exception:  # noqa: BLE001 - any failure means unhealthy
            h.reply_empty(503)
            return
    h.reply_empty(200)


def generate(h: EngineHandler, body: dict[str, Any]) -> None:
    stream = bool(body.get("stream"))
    try:
        params = params_from_generate(body)
        ids = prompt_ids(body.get("text"), body.get("input_ids"))
    except RequestError as exc:
        _error(h, exc, stream)
        return
    on_token: OnToken | None = None
    if stream:
        h.start_stream()
        sent: list[int] = []

        def frame_token(token: int, logprob: float) -> None:
            sent.append(token)
            h.frame({"text": tokenizer.decode(sent), "output_ids": list(sent),
                     "meta_info": {"id": params.rid, "finish_reason": None,
                                   "prompt_tokens": len(ids), "completion_tokens": len(sent)}})

        on_token = frame_token

    started = time.monotonic()
    try:
        gen = h.run(ids, params, body, on_token)
    except RequestError as exc:
        if stream and Fault.TOKENS_THEN_GARBAGE in h.engine.faults and exc.status == 400:
            _tokens_then_garbage(h, params.rid, len(ids), exc)
            return
        if not stream and Fault.TEXT_WITH_BAD_COUNT in h.engine.faults and exc.status == 400:
            h.reply_json(200, {"text": "ok ok ok", "meta_info": {"id": params.rid, "finish_reason": {"type": "length", "length": 3},
                                                                 "prompt_tokens": len(ids), "completion_tokens": -1}})
            return
        _error(h, exc, stream, headers_sent=stream)
        return
    except (BrokenPipeError, ConnectionResetError):
        return
    if gen is None:
        return  # the client left; nothing to answer
    out = _response(gen, time.monotonic() - started)
    if stream:
        h.frame(out)
        h.done()
    else:
        h.reply_json(200, out)


def _error(h: EngineHandler, exc: RequestError, stream: bool, headers_sent: bool = False) -> None:
    """SGLang's error body; a streamed request gets it as a frame inside an HTTP 200 stream."""
    if not stream:
        h.reply_json(exc.status, {"error": {"message": str(exc)}})
        return
    if not headers_sent:
        h.start_stream()
    h.frame({"error": {"message": str(exc), "type": "invalid_request_error", "code": exc.status, "retryable": False}})
    h.done()


def _tokens_then_garbage(h: EngineHandler, rid: str, prompt_tokens: int, exc: RequestError) -> None:
    """Fault tokens-then-garbage: a refused streamed prompt is answered with tokens anyway, then
    an error frame cut off mid-JSON, as a relay that loses the end of a frame sends it."""
    sent: list[int] = []
    for token in tokenizer.encode("ok ok ")[:3]:
        sent.append(token)
        h.frame({"text": tokenizer.decode(sent), "output_ids": list(sent),
                 "meta_info": {"id": rid, "finish_reason": None, "prompt_tokens": prompt_tokens, "completion_tokens": len(sent)}})
    h.wfile.write(b'data: {"error": {"message": "' + str(exc)[:40].encode() + b"\n\n")
    h.done()


def _response(gen: Generation, latency: float) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": gen.rid,
        "finish_reason": gen.finish_reason,
        "prompt_tokens": len(gen.prompt_ids),
        "completion_tokens": len(gen.output_ids),
        "cached_tokens": gen.cached_tokens,
        "weight_version": "default",
        "e2e_latency": round(latency, 6),
    }
    if gen.input_logprobs or gen.output_logprobs:
        meta["input_token_logprobs"] = [list(x) for x in gen.input_logprobs]
        meta["output_token_logprobs"] = [list(x) for x in gen.output_logprobs]
    return {"text": gen.text, "output_ids": list(gen.output_ids), "meta_info": meta}
