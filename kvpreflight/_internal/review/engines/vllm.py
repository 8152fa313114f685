"""vLLM: how `vllm serve` / `python -m vllm.entrypoints.openai.api_server` sizes its KV cache.

``kv_bytes = ceil(total * gpu_memory_utilization) - (weights + workspaces and NCCL buffers +
activation peak + CUDA-graph estimate)``, vLLM 0.32's ``determine_available_memory`` term by
term (``vllm_memory``); ``--kv-cache-memory-bytes`` replaces the whole computation. vLLM
measures every term but the weights at start-up, so review gives the pool as a band and the
check judges its low end. The pool is whole blocks of ``--block-size`` tokens. vLLM refuses to
start when one max-model-len request does not fit (``ValueError: To serve at least one request
...``).
"""

from __future__ import annotations

from kvpreflight._internal.review.context_limit import context_limit
from kvpreflight._internal.review.engines.vllm_memory import batch_defaults, requested_bytes, reserve_terms
from kvpreflight._internal.review.estimate import (
    GIB,
    Estimate,
    ReviewInputs,
    checked_context,
    kv_dtype_bytes,
    parse_size,
    resolve_gpu,
    resolve_model,
)
from kvpreflight._internal.review.flags import parse_args
from kvpreflight._internal.review.interface import Launch, ReviewError

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_BLOCK_SIZE = 16

ALIASES = {
    "--model": "model",
    "--tensor-parallel-size": "tp", "-tp": "tp",
    "--pipeline-parallel-size": "pp", "-pp": "pp",
    "--data-parallel-size": "dp", "-dp": "dp",
    "--gpu-memory-utilization": "gmu",
    "--max-model-len": "context",
    "--kv-cache-dtype": "kv_dtype",
    "--block-size": "block",
    "--kv-cache-memory-bytes": "kv_bytes",
    "--kv-cache-memory": "kv_bytes",
    "--max-num-batched-tokens": "max_batched", "--max-num-seqs": "max_seqs",
    "--enforce-eager": "eager",
    "--trust-remote-code": "_switch", "--enable-prefix-caching": "_switch",
    "--enable-chunked-prefill": "_switch", "--disable-log-requests": "_switch", "--enable-expert-parallel": "_switch",
}
SWITCHES = frozenset({"_switch", "eager"})


def _normalise(flag: str) -> str:
    # vLLM's FlexibleArgumentParser takes --max_model_len for --max-model-len
    return flag.replace("_", "-") if flag.startswith("--") else flag


def estimate(launch: Launch, inputs: ReviewInputs, models: dict) -> Estimate:
    a = parse_args(launch, ALIASES, SWITCHES, _normalise)
    model_arg = a.value("model") or (a.positional[0].text if a.positional else None)
    model = resolve_model(launch, model_arg, inputs, models)
    tp = int(a.number(launch, "tp") or 1)
    pp = int(a.number(launch, "pp") or 1)
    dp = int(a.number(launch, "dp") or 1)
    assumptions: list[str] = []
    kv_b, kv_note = kv_dtype_bytes(a.value("kv_dtype"), model, launch, "--kv-cache-dtype")
    assumptions.append(kv_note)
    bpt = model.kv_bytes_per_token(kv_b, tp, pp)
    block = int(a.number(launch, "block") or DEFAULT_BLOCK_SIZE)
    if not a.has("block"):
        assumptions.append(f"block size {DEFAULT_BLOCK_SIZE} (vLLM's default on CUDA)")
    weights = model.weight_bytes // (tp * pp)
    gpu = None
    numbers: dict[str, object] = {"tp": tp, "pp": pp, "dp": dp, "block_size": block}
    pool_high: int | None = None
    if a.has("kv_bytes"):
        kv_bytes = parse_size(a.value("kv_bytes") or "", launch, "--kv-cache-memory-bytes")
        assumptions.append(f"--kv-cache-memory-bytes {kv_bytes:,} sets the pool; GPU memory not consulted")
        gpu = resolve_gpu(launch, inputs, required=False)
    else:
        gpu = resolve_gpu(launch, inputs)
        assert gpu is not None
        gmu_flag = a.number(launch, "gmu", float)
        gmu = float(gmu_flag) if gmu_flag is not None else DEFAULT_GPU_MEMORY_UTILIZATION
        if not 0 < gmu <= 1:
            raise ReviewError(f"{launch.site.file}:{a.line('gmu')}: --gpu-memory-utilization {gmu} must be between 0 and 1")
        if gmu_flag is None:
            assumptions.append(f"gpu_memory_utilization {DEFAULT_GPU_MEMORY_UTILIZATION} (vLLM's default)")
        defaults = batch_defaults(gpu.memory_bytes, gpu.name)
        batched = int(a.number(launch, "max_batched") or defaults.max_num_batched_tokens)
        seqs = int(a.number(launch, "max_seqs") or defaults.max_num_seqs)
        if not a.has("max_batched") or not a.has("max_seqs"):
            assumptions.append(f"max_num_batched_tokens {batched:,}, max_num_seqs {seqs:,} ({defaults.how})")
        eager = a.has("eager") and (a.value("eager") or "true").lower() != "false"
        terms = reserve_terms(model, tp=tp, pp=pp, enforce_eager=eager, max_num_batched_tokens=batched,
                              max_num_seqs=seqs, blackwell=gpu.name.startswith("B"))
        requested = requested_bytes(gpu.memory_bytes, gmu)
        reserve_low, reserve_high = sum(t.low for t in terms), sum(t.high for t in terms)
        assumptions.append(
            f"GPU {gpu.name}: {gpu.memory_mib:,} MiB as NVML reports it; vLLM requests ceil(total x {gmu}) = "
            f"{requested:,} B and takes from it weights and {reserve_low / GIB:.2f}-{reserve_high / GIB:.2f} GiB it "
            "measures at start-up: " + "; ".join(f"{t.how}: {t.low / GIB:.2f}-{t.high / GIB:.2f} GiB" for t in terms)
        )
        if eager:
            assumptions.append("--enforce-eager: no CUDA graphs, no graph memory")
        assumptions.append(f"weights {model.weight_bytes:,} B ({model.weight_source}) split evenly over TP {tp} x PP {pp}")
        kv_bytes = requested - weights - reserve_high
        kv_bytes_high = requested - weights - reserve_low
        numbers["gpu_memory_utilization"] = gmu
        numbers["gpu_memory_bytes"] = gpu.memory_bytes
        numbers["requested_bytes"] = requested
        numbers["max_num_batched_tokens"] = batched
        numbers["max_num_seqs"] = seqs
        numbers["enforce_eager"] = eager
        numbers["reserve_bytes"] = {t.name: [t.low, t.high] for t in terms}
        numbers["kv_pool_bytes_high"] = max(kv_bytes_high, 0)
        pool_high = max(kv_bytes_high, 0) // (bpt * block) * block
    pool = max(kv_bytes, 0) // (bpt * block) * block
    numbers["kv_pool_bytes"] = max(kv_bytes, 0)
    if model.sliding_note:
        assumptions.append(model.sliding_note)
    ctx_flag = a.value("context")
    ctx = parse_size(ctx_flag, launch, "--max-model-len") if ctx_flag else None
    context, source = checked_context(inputs, launch, ctx, "--max-model-len", model)
    line = a.line("context") if source.startswith("engine flag") else None
    limit = None
    if ctx is not None and ctx > 0:
        limit = context_limit("vllm", model, ctx, "--max-model-len", a.line("context") or launch.line, launch.env)
    return Estimate(
        engine="vllm", role=launch.site.role or "unified", file=launch.site.file,
        line=line or a.line("gmu") or a.line("kv_bytes") or launch.line, where=launch.site.where,
        model=model.name, gpu=gpu.name if gpu else None, pool_tokens=pool, kv_bytes_per_token=bpt,
        kv_bytes_formula=model.formula(kv_b, tp, pp), weights_bytes_per_gpu=weights,
        context_checked=context, context_source=source, assumptions=tuple(assumptions), numbers=numbers,
        flag_lines={f.name: f.line for f in a.flags.values()},
        pool_tokens_high=pool_high, context_limit=limit,
        consequence="vLLM refuses to start (\"To serve at least one request with the model's max seq len ...\")",
    )
