"""TensorRT-LLM `trtllm-serve MODEL ... --config FILE.yaml` (PyTorch backend, the default).

How it sizes its KV cache (tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator, as its
start-up log shows it: tests/fixtures/trtllm/startup_clamp.log): it loads the weights, builds a
trial cache, runs a profiling pass and measures the peak, then gives the KV cache
``kv_cache_config.free_gpu_memory_fraction`` (default 0.9) of the memory still FREE (vLLM and
SGLang take a fraction of the total), capped by ``kv_cache_config.max_tokens`` when both are set
("The smaller value will be used"), in blocks of ``tokens_per_block`` (32). What the profiling pass
takes is measured on the GPU; here it is vLLM's band of the same terms (activations of one
``max_num_tokens`` step, sampler logits for ``max_batch_size`` rows, workspaces, NCCL), assumed.

The context it must hold is ``max_seq_len`` (flag or YAML; else the model's length, as it infers
it). A cache too small for it does not stop the engine: it cuts max_seq_len and the attention window
to what fits and logs a warning, unless ``fail_fast_on_attention_window_too_large`` is set; the
advisory KVPF-TRTLLM-2026-001 says so for every launch without it.

The YAML (``--config``, or its older name ``--extra_llm_api_options``) overrides the flags. It is
read beside the deployment file, or at the path the command gives.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvpreflight._internal.fields import load_yaml
from kvpreflight._internal.files import FileKind, read_bytes
from kvpreflight._internal.review.engines.vllm_memory import reserve_terms
from kvpreflight._internal.review.estimate import GIB, Estimate, ReviewInputs, checked_context, kv_dtype_bytes, resolve_gpu, resolve_model
from kvpreflight._internal.review.flags import ParsedArgs, parse_args
from kvpreflight._internal.review.interface import Launch, ReviewError
from kvpreflight.errors import ConfigError

DEFAULT_FREE_FRACTION = 0.9  # llmapi/llm_args.py KvCacheConfig.free_gpu_memory_fraction
TOKENS_PER_BLOCK = 32  # KvCacheConfig.tokens_per_block
DEFAULT_MAX_NUM_TOKENS = 8192  # trtllm-serve --max_num_tokens
DEFAULT_MAX_BATCH_SIZE = 2048  # trtllm-serve --max_batch_size
CUDA_CONTEXT_BYTES = 1 * GIB  # CUDA context and NCCL before the engine measures
FAIL_FAST = "fail_fast_on_attention_window_too_large"
SUBCOMMANDS = ("serve",)  # `trtllm-serve serve MODEL` is `trtllm-serve MODEL`
NOT_SERVING = ("disaggregated", "disaggregated_mpi_worker", "mm_embedding_serve")

ALIASES = {
    "--max_seq_len": "max_seq_len", "--max_num_tokens": "max_num_tokens", "--max_batch_size": "max_batch_size",
    "--tp_size": "tp", "--tensor_parallel_size": "tp", "--pp_size": "pp", "--pipeline_parallel_size": "pp",
    "--kv_cache_free_gpu_memory_fraction": "fraction", "--free_gpu_memory_fraction": "fraction",
    "--kv_cache_dtype": "kv_dtype", "--config": "config", "--extra_llm_api_options": "config",
    "--server_role": "role", "--backend": "backend",
    f"--{FAIL_FAST}": "fail_fast", "--trust_remote_code": "_switch", "--enable_chunked_prefill": "_switch",
    "--grpc": "_switch",
}
SWITCHES = frozenset({"fail_fast", "_switch"})
ROLES = {"context": "prefill", "generation": "decode"}


def config_file(launch: Launch, a: ParsedArgs) -> tuple[Path | None, dict[str, Any]]:
    """The YAML the launch names (``--config`` / ``--extra_llm_api_options``) and what it holds."""
    name = a.value("config")
    if name is None:
        return None, {}
    line = a.line("config")
    here = Path(launch.site.file).parent
    candidates = list(dict.fromkeys([Path(name), here / name, here / posixpath.basename(name)]))
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        raise ReviewError(f"{launch.site.file}:{line}: {a.flags['config'].name} {name}: no such file (looked in "
                          f"{', '.join(map(str, candidates))}); put the YAML beside the deployment file")
    try:
        data = load_yaml(read_bytes(path, FileKind.REVIEW_INPUT), str(path))
    except ConfigError as exc:
        raise ReviewError(f"{launch.site.file}:{line}: {exc}") from None
    if data is None:
        return path, {}
    if not isinstance(data, dict):
        raise ReviewError(f"{launch.site.file}:{line}: {path} is not a YAML mapping of LLM API options")
    return path, data


def config_settings(launch: Launch) -> tuple[Mapping[str, str], int]:
    """The YAML's options as settings for the advisories (``section_key`` for a nested one,
    e.g. ``cache_transceiver_config_kv_transfer_timeout_ms``), and the line of the flag naming
    it; nothing when it cannot be read (the estimate says why)."""
    try:
        a = parse_args(launch, ALIASES, SWITCHES)
        _, data = config_file(launch, a)
    except ReviewError:
        return {}, launch.line
    out: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update({f"{key}_{k}": str(v) for k, v in value.items() if not isinstance(v, (dict, list))})
        elif not isinstance(value, list):
            out[str(key)] = str(value)
    return out, a.line("config") or launch.line


def _number(data: Mapping[str, Any], key: str, where: str, kind: type = int) -> Any:
    """A count (a positive integer) or, with kind float, a finite number; None when not set."""
    value = data.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or (kind is int and (not float(value).is_integer() or value < 1))):
        raise ReviewError(f"{where}: {key} {value!r:.60} is not {'a positive integer' if kind is int else 'a number'}")
    return kind(value)


def _text(data: Mapping[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ReviewError(f"{where}: {key} {value!r:.60} is not a name (e.g. auto, fp8)")
    return value


def serves_model(launch: Launch) -> bool:
    """`trtllm-serve disaggregated` (the router in front of the context and generation workers),
    its MPI worker launcher and the multimodal-embedding server hold no KV cache of their own."""
    first = next((t.text for t in launch.args if not t.text.startswith("-")), None)
    return first not in NOT_SERVING


def estimate(launch: Launch, inputs: ReviewInputs, models: dict) -> Estimate:
    a = parse_args(launch, ALIASES, SWITCHES)
    positional = [t.text for t in a.positional]
    if positional and positional[0] in SUBCOMMANDS:
        positional = positional[1:]
    path, yaml_options = config_file(launch, a)
    where = f"{path}" if path else launch.site.file
    kv_config = yaml_options.get("kv_cache_config") or {}
    if not isinstance(kv_config, dict):
        raise ReviewError(f"{where}: kv_cache_config is not a mapping")
    model = resolve_model(launch, positional[0] if positional else None, inputs, models)
    gpu = resolve_gpu(launch, inputs)
    assert gpu is not None

    def setting(flag: str, key: str, section: Mapping[str, Any] = yaml_options, kind: type = int) -> tuple[Any, str | None]:
        """The YAML's value (it overrides the flag), else the flag's; and which of them said it."""
        value = _number(section, key, where, kind)
        if value is not None:
            return value, f"{path.name if path else 'YAML'} {key}"
        flagged = a.number(launch, flag, kind)
        if flagged is not None and kind is int and flagged < 1:
            raise ReviewError(f"{launch.site.file}:{a.line(flag)}: {a.flags[flag].name} {flagged} is not a positive integer")
        return (flagged, a.flags[flag].name) if flagged is not None else (None, None)

    assumptions: list[str] = []
    tp = int(setting("tp", "tensor_parallel_size")[0] or 1)
    pp = int(setting("pp", "pipeline_parallel_size")[0] or 1)
    fraction, fraction_from = setting("fraction", "free_gpu_memory_fraction", kv_config, float)
    if fraction is None:
        fraction = DEFAULT_FREE_FRACTION
        assumptions.append(f"kv_cache_config.free_gpu_memory_fraction {DEFAULT_FREE_FRACTION} (TensorRT-LLM's default)")
    if not 0 < fraction <= 1:
        raise ReviewError(f"{where}: free_gpu_memory_fraction {fraction} must be between 0 and 1")
    max_tokens = _number(kv_config, "max_tokens", where)
    block = _number(kv_config, "tokens_per_block", where) or TOKENS_PER_BLOCK
    kv_b, kv_note = kv_dtype_bytes(_text(kv_config, "dtype", where) or a.value("kv_dtype"), model, launch, "kv_cache_config.dtype")
    assumptions.append(kv_note)
    bpt = model.kv_bytes_per_token(kv_b, tp, pp)
    num_tokens = int(setting("max_num_tokens", "max_num_tokens")[0] or DEFAULT_MAX_NUM_TOKENS)
    batch = int(setting("max_batch_size", "max_batch_size")[0] or DEFAULT_MAX_BATCH_SIZE)
    # CUDA graphs are on by default in the PyTorch backend (its PyTorchConfig: use_cuda_graph=True).
    terms = reserve_terms(model, tp=tp, pp=pp, enforce_eager=False, max_num_batched_tokens=num_tokens,
                          max_num_seqs=batch, blackwell=gpu.name.startswith("B"))
    low_reserve, high_reserve = sum(t.low for t in terms), sum(t.high for t in terms)
    weights = model.weight_bytes // (tp * pp)
    free_high = gpu.memory_bytes - CUDA_CONTEXT_BYTES - weights - low_reserve
    free_low = gpu.memory_bytes - CUDA_CONTEXT_BYTES - weights - high_reserve
    assumptions.append(
        f"GPU {gpu.name}: {gpu.memory_mib:,} MiB; free after 1 GiB CUDA context, weights {model.weight_bytes:,} B "
        f"({model.weight_source}) over TP {tp} x PP {pp} and {low_reserve / GIB:.2f}-{high_reserve / GIB:.2f} GiB the "
        "profiling pass takes (vLLM's band of the same terms, assumed; TensorRT-LLM measures it): "
        + "; ".join(f"{t.how}: {t.low / GIB:.2f}-{t.high / GIB:.2f} GiB" for t in terms))
    pool_high = int(max(free_high, 0) * fraction) // bpt // block * block
    pool_low = int(max(free_low, 0) * fraction) // bpt // block * block
    if max_tokens is not None:
        assumptions.append(f"kv_cache_config.max_tokens {max_tokens:,} caps the pool (the smaller of it and the memory's share is used)")
        pool_high, pool_low = min(pool_high, max_tokens // block * block), min(pool_low, max_tokens // block * block)
    if model.sliding_note:
        assumptions.append(model.sliding_note)
    seq, seq_from = setting("max_seq_len", "max_seq_len")
    context, source = checked_context(inputs, launch, seq, seq_from or "max_seq_len", model)
    if seq is None:
        assumptions.append("max_seq_len not set: TensorRT-LLM infers it from the model config")
    role = ROLES.get((a.value("role") or "").lower(), launch.site.role or "unified")
    fail_fast = a.has("fail_fast") or str(yaml_options.get(FAIL_FAST, "")).lower() == "true"
    consequence = (
        "TensorRT-LLM refuses to start (fail_fast_on_attention_window_too_large)" if fail_fast else
        "TensorRT-LLM starts anyway: it cuts max_seq_len and the attention window to what the cache holds and says so "
        "only in its log, so it serves less than stated; start it with --fail_fast_on_attention_window_too_large")
    return Estimate(
        engine="trtllm", role=role, file=launch.site.file,
        line=(a.line("max_seq_len") or a.line("config") or launch.line), where=launch.site.where,
        model=model.name, gpu=gpu.name, pool_tokens=pool_low, kv_bytes_per_token=bpt,
        kv_bytes_formula=model.formula(kv_b, tp, pp), weights_bytes_per_gpu=weights,
        context_checked=context, context_source=source, assumptions=tuple(assumptions),
        numbers={"tp": tp, "pp": pp, "free_gpu_memory_fraction": fraction, "tokens_per_block": block,
                 "kv_cache_max_tokens": max_tokens, "max_num_tokens": num_tokens, "max_batch_size": batch,
                 "gpu_memory_bytes": gpu.memory_bytes, "fail_fast_on_attention_window_too_large": fail_fast,
                 "config_file": str(path) if path else None, "fraction_from": fraction_from},
        flag_lines={f.name: f.line for f in a.flags.values()},
        consequence=consequence, pool_tokens_high=pool_high if pool_high != pool_low else None,
    )
