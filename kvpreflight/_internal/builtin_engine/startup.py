"""Starting an engine role: pool sizing, SGLang's start-up log lines, the fixed /server_info and
the listening sockets. `serve(config)` is what `kvpreflight engine serve` runs.

torch is imported here only inside `serve` (and for CUDA's free memory): importing this module,
as `kvpreflight engine serve --help` does, stays torch-free.
"""

from __future__ import annotations

import sys
import time
import warnings
from typing import TYPE_CHECKING, Any

from kvpreflight._internal.builtin_engine import tokenizer
from kvpreflight._internal.builtin_engine.config import (
    CELL_BYTES,
    CHUNKED_PREFILL_SIZE,
    GB,
    MAX_PREFILL_TOKENS,
    MAX_RUNNING_REQUESTS,
    EngineConfig,
    ServeConfigError,
    derive_pool_tokens,
)
from kvpreflight._internal.builtin_engine.httputil import serve_until_stopped
from kvpreflight._internal.builtin_engine.pd_decode import DecodeHandoff
from kvpreflight._internal.builtin_engine.pd_prefill import PrefillBootstrap
from kvpreflight._internal.builtin_engine.protocol import disaggregation_mode, version_string
from kvpreflight._internal.builtin_engine.router import serve_router
from kvpreflight._internal.builtin_engine.server import EngineServer
from kvpreflight._internal.files import read_system
from kvpreflight.model import ProcessRole

if TYPE_CHECKING:
    from kvpreflight._internal.builtin_engine.core import Engine

TRANSFER_BACKEND = "kvpreflight_tcp"


def log(message: str, tp: bool = True) -> None:
    """SGLang's log format: `[YYYY-mm-dd HH:MM:SS TP0] message` on stderr."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"[{stamp}{' TP0' if tp else ''}] {message}\n")
    sys.stderr.flush()


def _available_cpu_bytes() -> int:
    for line in (read_system("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def resolve_pool_tokens(config: EngineConfig, device: str) -> int:
    ps = config.page_size
    if config.pool_tokens is not None:
        return config.pool_tokens // ps * ps
    # validate(): without --pool-tokens, --mem-fraction-static is given.
    assert config.mem_fraction_static is not None
    if device == "cuda":
        import torch  # the engine process only

        free, total = torch.cuda.mem_get_info()
        if config.mem_budget_bytes is not None:
            total, free = config.mem_budget_bytes, min(free, config.mem_budget_bytes)
        return derive_pool_tokens(total, free, config.mem_fraction_static, ps)
    if config.mem_budget_bytes is None:
        raise ServeConfigError(
            "--mem-fraction-static on CPU needs --mem-budget-bytes B (the memory the engine may use); or give --pool-tokens N"
        )
    return derive_pool_tokens(config.mem_budget_bytes, config.mem_budget_bytes, config.mem_fraction_static, ps)


def log_model_warnings(engine: Engine) -> None:
    """What the engines print at start-up about the faults positions-overridden and
    attention-window (their -silent forms print nothing), copied from the engines' sources."""
    from kvpreflight._internal.builtin_engine.config import Fault

    if Fault.POSITIONS_OVERRIDDEN in engine.faults and engine.positions is not None:
        # SGLang 0.5.23, srt/configs/model_config.py ModelConfig._derive_context_length, logged
        # with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (then the longer context is served);
        # the model config is built in the tokenizer manager and again in each scheduler (TP0).
        msg = (f"Warning: User-specified context_length ({engine.context_len}) is greater than the derived context_length "
               f"({engine.positions}). This may lead to incorrect model outputs or CUDA errors. Note that the derived "
               "context_length may differ from max_position_embeddings in the model's config.")
        log(msg, tp=False)
        log(msg)
    if Fault.ATTENTION_WINDOW in engine.faults and engine.attention_window is not None:
        # TensorRT-LLM, cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp
        # clampWindowSizesToFitAtLeastOneSequence (TLLM_LOG_WARNING, common::vec2str), logged when
        # --fail_fast_on_attention_window_too_large is off (the default).
        sys.stderr.write("[TensorRT-LLM][WARNING] maxAttentionWindowVec too large to fit at least one sequence in kvCache. "
                         f"Old: ({engine.context_len}), New: ({engine.attention_window})\n")
        sys.stderr.flush()


def build_server_info(engine: Engine, port: int, bootstrap_port: int | None, started_at: float) -> dict[str, Any]:
    """SGLang's /server_info: the resolved server args plus the scheduler's fields."""
    c = engine.config
    pool = engine.reported_pool_tokens
    return {
        "model_path": c.model_name,
        "tokenizer_path": c.model_name,
        "served_model_name": c.model_name,
        "host": c.host,
        "port": port,
        "context_length": c.context_length,
        "page_size": c.page_size,
        "mem_fraction_static": c.mem_fraction_static,
        "max_total_tokens": pool if c.pool_tokens is not None else None,
        "chunked_prefill_size": CHUNKED_PREFILL_SIZE,
        "max_prefill_tokens": MAX_PREFILL_TOKENS,
        "max_running_requests": MAX_RUNNING_REQUESTS,
        "allow_auto_truncate": False,
        "disable_radix_cache": engine.prefix_cache is None,
        "device": engine.device,
        "dtype": "float32",
        "kv_cache_dtype": "auto",
        "tp_size": 1,
        "pp_size": 1,
        "dp_size": 1,
        "enable_metrics": c.enable_metrics,
        "kv_canary": c.kv_canary,  # SGLang 0.5.13+: none | log | raise, with the two below
        "kv_canary_real_data": "none",
        "kv_canary_sweep_interval": 0,
        "disaggregation_mode": disaggregation_mode(engine.role),
        "disaggregation_transfer_backend": TRANSFER_BACKEND,
        "disaggregation_bootstrap_port": bootstrap_port,
        # SGLang PR #19746: the decode's own radix cache (faults decode-cache-no-salt* turn it on).
        "disaggregation_decode_enable_radix_cache": engine.role is ProcessRole.DECODE and engine.prefix_cache is not None,
        # Not SGLang's: it takes them from the environment and does not say (PD_WAIT_ENVS).
        **({"disaggregation_bootstrap_timeout_s": round(c.pd_wait_s)} if engine.role is ProcessRole.PREFILL else {}),
        **({"disaggregation_waiting_timeout_s": round(c.pd_wait_s)} if engine.role is ProcessRole.DECODE else {}),
        "launch_command": c.launch_command,
        "max_total_num_tokens": pool,
        "max_req_input_len": engine.max_req_input_len,
        "max_req_len": min(engine.context_len - 1, pool - 1),
        "vocab_size": tokenizer.VOCAB_SIZE,
        "status": "ready",
        "startup_time": started_at,
        "internal_states": [{
            "dp_rank": 0,
            "last_gen_throughput": 0.0,
            "memory_usage": {
                "weight": round(engine.model.weight_bytes / GB, 3),
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
    if config.role is ProcessRole.ROUTER:
        return serve_router(config)
    warnings.filterwarnings("ignore")  # torch's "numpy missing" notice is not our log
    from kvpreflight._internal.builtin_engine.core import (  # torch: the engine process only
        Engine,
        device_for,
    )

    device = device_for(config.device)
    pool_tokens = resolve_pool_tokens(config, device)
    engine = Engine(config, pool_tokens, device)
    # The allocator's line states the pool it holds, or under fault pool-in-another-unit the same
    # stated unit as every other source.
    allocated = engine.allocator_pool_tokens
    log(f"KV Cache is allocated. dtype: torch.float32, #tokens: {allocated}, KV size: {engine.allocator_kv_bytes / GB:.2f} GB")
    reported = engine.reported_pool_tokens
    if reported < engine.context_len:
        log(
            f"KV pool holds {reported} tokens, fewer than --context-length {engine.context_len}. One "
            "full-length request cannot fit, so long requests will be "
            "refused or truncated at serving time. Lower --context-length, "
            "raise --mem-fraction-static, or free memory taken before the "
            "pool is sized."
        )
    log_model_warnings(engine)
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
    handoff: PrefillBootstrap | DecodeHandoff | None = None
    bootstrap_port = None
    if config.role is ProcessRole.PREFILL:
        # SGLang's prefill owns the bootstrap server the decode engines take the KV from.
        try:
            bootstrap = PrefillBootstrap(engine, config.host, config.bootstrap_port)
        except OSError as exc:
            raise ServeConfigError(f"cannot listen on --disaggregation-bootstrap-port {config.bootstrap_port}: "
                                    f"{exc.strerror or exc}") from None
        bootstrap.start()
        handoff, bootstrap_port = bootstrap, bootstrap.port
        log(f"Bootstrap server started on {config.host}:{bootstrap_port}")
    elif config.role is ProcessRole.DECODE:
        handoff = DecodeHandoff(engine)
    try:
        httpd = EngineServer((config.host, config.port), engine, handoff)
    except OSError as exc:
        raise ServeConfigError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    port = httpd.server_address[1]
    httpd.server_info = build_server_info(engine, port, bootstrap_port, httpd.started_at)
    log(f"Uvicorn running on http://{config.host}:{port} (Press CTRL+C to quit)", tp=False)
    log("The server is fired up and ready to roll!", tp=False)
    return serve_until_stopped(httpd, handoff.close if handoff is not None else None)
