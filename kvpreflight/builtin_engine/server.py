"""The engine process: start-up (pool sizing, SGLang's start-up log lines) and the HTTP surface,
wire-compatible with SGLang 0.5.23 for the endpoints kvpreflight reads.

Shapes follow sglang/srt/entrypoints/http_server.py, openai/serving_base.py and
managers/tokenizer_manager.py of 0.5.23.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kvpreflight import __version__
from kvpreflight.builtin_engine import tokenizer
from kvpreflight.builtin_engine.httputil import client_gone, send_bytes, send_json, serve_until_stopped
from kvpreflight.builtin_engine.config import CELL_BYTES, EngineConfig, EngineConfigError, derive_pool_tokens

GB = 1 << 30
CHUNKED_PREFILL_SIZE = 8192
MAX_PREFILL_TOKENS = 16384
MAX_RUNNING_REQUESTS = 64
TRANSFER_BACKEND = "kvpreflight_tcp"
DEFAULT_MAX_NEW_TOKENS = 128


def log(message: str, tp: bool = True) -> None:
    """SGLang's log format: `[YYYY-mm-dd HH:MM:SS TP0] message` on stderr."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"[{stamp}{' TP0' if tp else ''}] {message}\n")
    sys.stderr.flush()


def _available_cpu_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def resolve_pool_tokens(config: EngineConfig, device: str) -> int:
    ps = config.page_size
    if config.pool_tokens is not None:
        return config.pool_tokens // ps * ps
    if device == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info()
        if config.mem_budget_bytes is not None:
            total, free = config.mem_budget_bytes, min(free, config.mem_budget_bytes)
        return derive_pool_tokens(total, free, config.mem_fraction_static, ps)
    if config.mem_budget_bytes is None:
        raise EngineConfigError(
            "--mem-fraction-static on CPU needs --mem-budget-bytes B (the memory the engine may use); or give --pool-tokens N"
        )
    return derive_pool_tokens(config.mem_budget_bytes, config.mem_budget_bytes, config.mem_fraction_static, ps)


class EngineServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, engine, transfer_port: int | None) -> None:
        self.engine = engine
        self.transfer_port = transfer_port
        self.started_at = time.time()
        super().__init__(address, EngineHandler)


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class EngineHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection: a closed socket means the client left
    server_version = "kvpreflight-builtin"
    sys_version = ""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass  # no access log: request bodies may carry tenant data

    # ---- plumbing ----------------------------------------------------------------------------

    @property
    def engine(self):
        return self.server.engine

    def _json(self, status: int, obj: object) -> None:
        send_json(self, status, obj)

    def _text(self, status: int, text: str, ctype: str = "text/plain; version=0.0.4; charset=utf-8") -> None:
        send_bytes(self, status, text.encode(), ctype)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

    def _frame(self, obj: object) -> None:
        self.wfile.write(_sse(obj))
        self.wfile.flush()

    def _done(self) -> None:
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def client_gone(self) -> bool:
        return client_gone(self.connection)

    def _body(self) -> dict | None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    # ---- routes ------------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        routes = {
            "/server_info": self._server_info,
            "/get_server_info": self._server_info,
            "/v1/models": self._models,
            "/model_info": self._model_info,
            "/get_model_info": self._model_info,
            "/v1/loads": self._loads,
            "/metrics": self._metrics,
            "/health": lambda: self._empty(200),
            "/health_generate": self._health_generate,
            "/ready": lambda: self._empty(200),
        }
        handler = routes.get(path)
        if handler is None:
            self._json(404, {"detail": "Not Found"})
            return
        handler()

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        routes = {
            "/generate": self._generate,
            "/v1/completions": self._completions,
            "/tokenize": self._tokenize,
            "/v1/tokenize": self._tokenize,
        }
        handler = routes.get(path)
        if handler is None:
            self._json(404, {"detail": "Not Found"})
            return
        body = self._body()
        if body is None:
            self._json(400, {"error": {"message": "The request body must be a JSON object."}})
            return
        try:
            handler(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_PUT = do_POST

    def _empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    # ---- info endpoints ------------------------------------------------------------------------

    def _server_info(self) -> None:
        self._json(200, build_server_info(self.server))

    def _models(self) -> None:
        e = self.engine
        self._json(200, {
            "object": "list",
            "data": [{
                "id": e.config.model_name, "object": "model", "created": int(self.server.started_at),
                "owned_by": "sglang", "root": e.config.model_name, "parent": None, "max_model_len": e.context_len,
            }],
        })

    def _model_info(self) -> None:
        e = self.engine
        self._json(200, {
            "model_path": e.config.model_name, "served_model_name": e.config.model_name,
            "tokenizer_path": e.config.model_name, "is_generation": True, "preferred_sampling_params": None,
            "weight_version": "default", "load_format": "auto", "reasoning_parser": None, "tool_call_parser": None,
            "disaggregation_mode": _disagg_mode(e.role), "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": "kvpreflight_copy",
            "architectures": ["KvpreflightCopyHeadForCausalLM"], "vocab_size": tokenizer.VOCAB_SIZE,
        })

    def _loads(self) -> None:
        e = self.engine
        pool = e.reported_pool_tokens
        used = e.used_tokens()
        self._json(200, {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "version": version_string(), "accelerator": e.device, "num_accelerators": 1,
            "loads": [{
                "dp_rank": 0, "num_running_reqs": e.counters.running, "num_waiting_reqs": 0,
                "num_used_tokens": used, "num_total_tokens": used, "max_total_num_tokens": pool,
                "max_running_requests": MAX_RUNNING_REQUESTS, "token_usage": used / pool if pool else 0.0,
                "memory": {"weight_gb": round(e.model.weight_bytes / GB, 3),
                           "kv_cache_gb": round(e.pool.nbytes / GB, 3), "graph_gb": 0.0, "token_capacity": pool},
            }],
        })

    def _metrics(self) -> None:
        if not self.engine.config.enable_metrics:
            self._json(404, {"detail": "Not Found"})
            return
        from kvpreflight.builtin_engine.metrics import render

        self._text(200, render(self.engine))

    def _health_generate(self) -> None:
        e = self.engine
        if e.role == "unified":
            from kvpreflight.builtin_engine.core import GenParams

            try:
                e.run_unified([0], GenParams(max_new_tokens=1, rid=f"HEALTH_CHECK_{uuid.uuid4().hex}"))
            except Exception:  # noqa: BLE001 - any failure means unhealthy
                self._empty(503)
                return
        self._empty(200)

    def _tokenize(self, body: dict) -> None:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = tokenizer.encode(prompt)
            self._json(200, {"tokens": ids, "count": len(ids), "max_model_len": self.engine.context_len})
        elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            tokens = [tokenizer.encode(p) for p in prompt]
            self._json(200, {"tokens": tokens, "count": [len(t) for t in tokens], "max_model_len": self.engine.context_len})
        else:
            self._json(400, _openai_error("prompt must be a string or a list of strings."))

    # ---- generation ------------------------------------------------------------------------------

    def _generate(self, body: dict) -> None:
        from kvpreflight.builtin_engine.core import RequestError

        stream = bool(body.get("stream"))
        try:
            params = _params_from_generate(body)
            ids = self.engine.tokenize(body.get("text"), body.get("input_ids"))
        except RequestError as exc:
            self._generate_error(exc, stream)
            return
        if stream:
            self._start_stream()
            sent: list[int] = []

            def on_token(token: int, logprob: float) -> None:
                sent.append(token)
                self._frame({"text": tokenizer.decode(sent), "output_ids": list(sent),
                             "meta_info": {"id": params.rid, "finish_reason": None,
                                           "prompt_tokens": len(ids), "completion_tokens": len(sent)}})
        else:
            on_token = None
        started = time.monotonic()
        try:
            gen = self._run(ids, params, body, on_token)
        except RequestError as exc:
            self._generate_error(exc, stream, headers_sent=stream)
            return
        except (BrokenPipeError, ConnectionResetError):
            return
        if gen is None:
            return  # the client left; nothing to answer
        out = _generate_response(gen, time.monotonic() - started)
        if stream:
            self._frame(out)
            self._done()
        else:
            self._json(200, out)

    def _generate_error(self, exc, stream: bool, headers_sent: bool = False) -> None:
        if not stream:
            self._json(exc.status, {"error": {"message": str(exc)}})
            return
        if not headers_sent:
            self._start_stream()
        self._frame({"error": {"message": str(exc), "type": "invalid_request_error", "code": exc.status, "retryable": False}})
        self._done()

    def _run(self, ids: list[int], params, body: dict, on_token):
        """Dispatch by role. Returns a Generation, or None when the client disconnected."""
        role = self.engine.role
        if role == "unified":
            return self.engine.run_unified(ids, params, on_token)
        if role == "prefill":
            return run_prefill_pd(self.engine, ids, params, body)
        return run_decode_pd(self.engine, ids, params, body, self.client_gone, on_token)

    def _completions(self, body: dict) -> None:
        from kvpreflight.builtin_engine.core import RequestError

        stream = bool(body.get("stream"))
        model = self.engine.config.model_name
        created = int(time.time())
        cid = f"cmpl-{uuid.uuid4().hex}"
        try:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]
            if isinstance(prompt, str):
                ids = self.engine.tokenize(prompt, None)
            elif isinstance(prompt, list):
                ids = self.engine.tokenize(None, prompt)
            else:
                raise RequestError("prompt must be a string, a list of token ids, or a one-element list of either.")
            gen_body = {
                "sampling_params": {"max_new_tokens": body.get("max_tokens", 16), "stop": body.get("stop"),
                                    "stop_token_ids": body.get("stop_token_ids"), "ignore_eos": body.get("ignore_eos", False)},
                "return_logprob": False, "cache_salt": body.get("cache_salt"), "rid": body.get("rid"),
                "bootstrap_host": body.get("bootstrap_host"), "bootstrap_port": body.get("bootstrap_port"),
                "bootstrap_room": body.get("bootstrap_room"),
            }
            params = _params_from_generate(gen_body)
        except RequestError as exc:
            self._openai_error(exc, stream, False)
            return
        on_token = None
        if stream:
            self._start_stream()

            def on_token(token: int, logprob: float) -> None:
                self._frame({"id": cid, "object": "text_completion", "created": created, "model": model,
                             "choices": [{"index": 0, "text": tokenizer.decode([token]), "logprobs": None,
                                          "finish_reason": None, "matched_stop": None}]})
        try:
            gen = self._run(ids, params, gen_body, on_token)
        except RequestError as exc:
            self._openai_error(exc, stream, stream)
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
            self._frame({"id": cid, "object": "text_completion", "created": created, "model": model,
                         "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish,
                                      "matched_stop": matched}], "usage": usage})
            self._done()
            return
        self._json(200, {"id": cid, "object": "text_completion", "created": created, "model": model,
                         "choices": [{"index": 0, "text": gen.text, "logprobs": None, "finish_reason": finish,
                                      "matched_stop": matched}], "usage": usage})

    def _openai_error(self, exc, stream: bool, headers_sent: bool) -> None:
        err_type = "BadRequestError" if exc.status == 400 else "InternalServerError"
        body = _openai_error(str(exc), err_type, exc.status)
        if not stream:
            self._json(exc.status, body)
            return
        if not headers_sent:
            self._start_stream()
        self._frame({"error": body})
        self._done()


def _openai_error(message: str, err_type: str = "BadRequestError", code: int = 400) -> dict:
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def _disagg_mode(role: str) -> str | None:
    return role if role in ("prefill", "decode") else None


def version_string() -> str:
    return f"kvpreflight-builtin {__version__}"


def _params_from_generate(body: dict):
    from kvpreflight.builtin_engine.core import GenParams, RequestError, new_rid

    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise RequestError("sampling_params must be an object.")
    max_new = sp.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if max_new is None:
        max_new = DEFAULT_MAX_NEW_TOKENS
    if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
        raise RequestError(f"max_new_tokens must be a non-negative integer, got {max_new!r}.")
    stop = sp.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    salt = body.get("cache_salt", body.get("extra_key"))
    if salt is not None and not isinstance(salt, str):
        raise RequestError("cache_salt must be a string.")
    start = body.get("logprob_start_len", -1)
    if start is None:
        start = -1
    return GenParams(
        max_new_tokens=max_new,
        stop=tuple(str(s) for s in stop),
        stop_token_ids=tuple(int(t) for t in (sp.get("stop_token_ids") or ())),
        ignore_eos=bool(sp.get("ignore_eos", False)),
        return_logprob=bool(body.get("return_logprob", False)),
        logprob_start_len=int(start) if body.get("return_logprob") else -1,
        cache_salt=salt,
        rid=str(body.get("rid") or new_rid()),
        stream=bool(body.get("stream")),
    )


def _generate_response(gen, latency: float) -> dict:
    meta = {
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


def _bootstrap(body: dict, need_host: bool):
    from kvpreflight.builtin_engine.core import RequestError

    room = body.get("bootstrap_room")
    host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
    if not isinstance(room, int) or (need_host and (not isinstance(host, str) or not isinstance(port, int))):
        raise RequestError(
            "This engine runs with a disaggregation mode and needs bootstrap_host, bootstrap_port and "
            "bootstrap_room: send requests through the router."
        )
    return host, port, room


def run_prefill_pd(engine, ids: list[int], params, body: dict):
    from kvpreflight.builtin_engine import transfer
    from kvpreflight.builtin_engine.core import Generation, RequestError

    host, port, room = _bootstrap(body, need_host=True)
    try:
        ids, pending_abort = engine.admit(ids, params.max_new_tokens)
    except RequestError as exc:
        # Refused before bootstrap: decode reserves nothing and no page moves.
        transfer.send_abort(host, port, room, str(exc))
        raise
    pages, cached = engine.prefill(ids, params)
    with engine.counter_lock:
        engine.transfer_seq += 1
        seq = engine.transfer_seq
    every = engine.config.transfer_fail_every
    if not every and "transfer-fail-as-drained" in engine.faults:
        every = 3  # the flaky backend this fault models
    lose = bool(every) and seq % every == 0
    try:
        status = transfer.send_pages(
            engine, host, port, room, params.rid, pages, len(ids), cached,
            delay_s=engine.config.transfer_delay_ms / 1000.0,
            lose_after_first_batch=lose,
            report_lost_as_drained="transfer-fail-as-drained" in engine.faults,
        )
    except transfer.TransferError as exc:
        engine.count(bootstrap_failed=1)
        raise RequestError(str(exc), status=exc.status) from None
    except OSError as exc:
        engine.count(transfer_failed=1)
        raise RequestError(f"KV transfer failed for request {params.rid}: {exc}", status=500) from None
    finally:
        engine.finish_prefill_pages(ids, pages, params)
    if status != "ok":
        engine.count(transfer_failed=1)
        raise RequestError(f"KV transfer failed for request {params.rid} (bootstrap room {room}): {status}.", status=500)
    engine.count(transfers_sent=1, num_requests=1)
    finish = {"type": "length", "length": 0}
    if pending_abort is not None:
        finish = {"type": "abort", "message": pending_abort, "status_code": 400}
    return Generation(rid=params.rid, prompt_ids=tuple(ids), output_ids=(), finish_reason=finish, cached_tokens=cached)


def run_decode_pd(engine, ids: list[int], params, body: dict, client_gone, on_token):
    from kvpreflight.builtin_engine.core import BOOTSTRAP_WAIT_S, RequestError

    _, _, room_id = _bootstrap(body, need_host=False)
    try:
        ids, _ = engine.admit(ids, params.max_new_tokens)  # decode's own limits
    except RequestError as exc:
        engine.refuse_room(room_id, str(exc), exc.status)  # the prefill's bootstrap gets this answer
        raise
    room = engine.open_room(room_id, params.rid, ids)
    deadline = time.monotonic() + BOOTSTRAP_WAIT_S
    while not room.bootstrapped.wait(0.02):
        if client_gone():
            engine.cancel_room(room)
            return None
        if time.monotonic() > deadline:
            engine.close_room(room)
            engine.count(bootstrap_failed=1)
            raise RequestError(f"Bootstrap with the prefill engine timed out for request {params.rid}.", status=500)
    if room.error is not None:
        engine.close_room(room)
        raise RequestError(room.error, status=400)
    while not room.done.wait(0.02):
        if client_gone():
            engine.cancel_room(room)
            return None
    return engine.decode_after_transfer(room, ids, params, on_token)


def build_server_info(server: EngineServer) -> dict:
    e = server.engine
    c = e.config
    pool = e.reported_pool_tokens
    return {
        "model_path": c.model_name,
        "tokenizer_path": c.model_name,
        "served_model_name": c.model_name,
        "host": c.host,
        "port": server.server_address[1],
        "context_length": c.context_length,
        "page_size": c.page_size,
        "mem_fraction_static": c.mem_fraction_static,
        "max_total_tokens": pool if c.pool_tokens is not None else None,
        "chunked_prefill_size": CHUNKED_PREFILL_SIZE,
        "max_prefill_tokens": MAX_PREFILL_TOKENS,
        "max_running_requests": MAX_RUNNING_REQUESTS,
        "allow_auto_truncate": False,
        "disable_radix_cache": e.prefix_cache is None,
        "device": e.device,
        "dtype": "float32",
        "kv_cache_dtype": "auto",
        "tp_size": 1,
        "pp_size": 1,
        "dp_size": 1,
        "enable_metrics": c.enable_metrics,
        "disaggregation_mode": _disagg_mode(e.role),
        "disaggregation_transfer_backend": TRANSFER_BACKEND,
        "disaggregation_bootstrap_port": server.transfer_port,
        "launch_command": c.launch_command,
        "max_total_num_tokens": pool,
        "max_req_input_len": e.max_req_input_len,
        "max_req_len": min(e.context_len - 1, pool - 1),
        "vocab_size": tokenizer.VOCAB_SIZE,
        "status": "ready",
        "startup_time": server.started_at,
        "internal_states": [{
            "dp_rank": 0,
            "last_gen_throughput": 0.0,
            "memory_usage": {
                "weight": round(e.model.weight_bytes / GB, 3),
                "kvcache": round(pool * CELL_BYTES / GB, 3),
                "startup_available": 0.0,
                "token_capacity": pool,
                "graph": {},
            },
        }],
        "version": version_string(),
        "frontend": "python",
    }


def serve(config: EngineConfig) -> int:
    """Runs an engine role until killed. Returns an exit code."""
    config.validate()
    if config.role == "router":
        from kvpreflight.builtin_engine.router import serve_router

        return serve_router(config)
    warnings.filterwarnings("ignore")  # torch's "numpy missing" notice is not our log
    from kvpreflight.builtin_engine.core import Engine, device_for

    device = device_for(config.device)
    pool_tokens = resolve_pool_tokens(config, device)
    engine = Engine(config, pool_tokens, device)
    real = engine.real_pool_tokens
    log(f"KV Cache is allocated. dtype: torch.float32, #tokens: {real}, KV size: {engine.pool.nbytes / GB:.2f} GB")
    reported = engine.reported_pool_tokens
    if reported < engine.context_len:
        log(
            f"KV pool holds {reported} tokens, fewer than --context-length {engine.context_len}. One "
            "full-length request cannot fit, so long requests will be "
            "refused or truncated at serving time. Lower --context-length, "
            "raise --mem-fraction-static, or free memory taken before the "
            "pool is sized."
        )
    if device == "cuda":
        import torch

        available = f"available_gpu_mem={torch.cuda.mem_get_info()[0] / GB:.2f} GB"
    else:
        available = f"available_cpu_mem={_available_cpu_bytes() / GB:.2f} GB"
    log(
        f"max_total_num_tokens={reported}, chunked_prefill_size={CHUNKED_PREFILL_SIZE}, "
        f"max_prefill_tokens={MAX_PREFILL_TOKENS}, max_running_requests={MAX_RUNNING_REQUESTS}, "
        f"context_len={engine.context_len}, {available}"
    )
    transfer_server = None
    if config.role == "decode":
        from kvpreflight.builtin_engine.transfer import TransferServer

        transfer_server = TransferServer(engine, config.host, config.bootstrap_port)
        transfer_server.start()
    try:
        httpd = EngineServer((config.host, config.port), engine, transfer_server.port if transfer_server else None)
    except OSError as exc:
        raise EngineConfigError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    log(f"Uvicorn running on http://{config.host}:{httpd.server_address[1]} (Press CTRL+C to quit)", tp=False)
    log("The server is fired up and ready to roll!", tp=False)
    return serve_until_stopped(httpd, transfer_server.close if transfer_server is not None else None)

