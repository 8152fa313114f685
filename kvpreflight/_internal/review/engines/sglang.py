"""SGLang 0.5.23: how `python -m sglang.launch_server` / `sglang serve` sizes its KV pool.

From the engine's source (``srt/mem_cache/kv_cache_configurator.py``
``_profile_available_bytes``): ``rest = available_after_weights - pre_load * (1 -
mem_fraction_static)``; ``max_total_num_tokens = rest // cell_size``, rounded down to the page
size; ``--max-total-tokens`` lowers it (a larger value is ignored with a warning). Because
``available_after_weights = pre_load - weights``, ``rest = pre_load * mfs - weights``.

The default ``mem_fraction_static`` follows ``srt/arg_groups/memory_hook.py``
``handle_gpu_memory_settings`` (CUDA, no DP attention, no DeepEP, no speculative decoding,
post-capture sizing off as by default):
  reserved_mib = 512 + 1.5 * activation_tokens + tp*pp/8 * 1024 + cuda-graph reserve,
  at least 10,240 on GPUs over 60 GiB; mfs = round((gpu_mib - reserved_mib) / gpu_mib, 3).
"""

from __future__ import annotations

from kvpreflight._internal.review.context_limit import context_limit
from kvpreflight._internal.review.estimate import (
    GIB,
    Estimate,
    ReviewInputs,
    checked_context,
    kv_dtype_bytes,
    resolve_gpu,
    resolve_model,
)
from kvpreflight._internal.review.flags import parse_args
from kvpreflight._internal.review.interface import Launch, ReviewError

# CUDA context, NCCL and allocator memory already used when SGLang measures free memory.
CUDA_CONTEXT_BYTES = 1 * GIB

ALIASES = {
    "--model-path": "model", "--model": "model",
    "--tp-size": "tp", "--tp": "tp", "--tensor-parallel-size": "tp",
    "--dp-size": "dp", "--dp": "dp", "--data-parallel-size": "dp",
    "--pp-size": "pp", "--pp": "pp", "--pipeline-parallel-size": "pp",
    "--mem-fraction-static": "mfs",
    "--context-length": "context",
    "--kv-cache-dtype": "kv_dtype",
    "--page-size": "page",
    "--max-total-tokens": "max_total_tokens",
    "--disaggregation-mode": "role",
    "--device": "device",
    "--chunked-prefill-size": "chunked",
    "--max-running-requests": "max_running",
    "--enable-dp-attention": "dp_attention",
    "--disable-cuda-graph": "no_graph",
    "--trust-remote-code": "_switch", "--enable-metrics": "_switch", "--allow-auto-truncate": "_switch",
    "--disaggregation-enable-kv-checksum": "_switch", "--enable-mixed-chunk": "_switch",
    "--skip-server-warmup": "_switch", "--enable-torch-compile": "_switch",
}
SWITCHES = frozenset({"dp_attention", "no_graph", "_switch"})


def prefill_graph_sizes(max_bs: int) -> list[int]:
    """``generate_prefill_cuda_graph_batch_sizes`` (srt/arg_groups/cuda_graph_hook.py)."""
    sizes = (
        list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
        + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512))
    )
    return [s for s in sizes if s <= max_bs]


def default_mem_fraction_static(
    gpu_mib: int, tp: int, pp: int, role: str, mla: bool,
    chunked: int | None = None, max_running: int | None = None, cuda_graph: bool = True,
) -> tuple[float, str]:
    """SGLang 0.5.23's default and how it was reached (MiB)."""
    if gpu_mib < 20 * 1024:
        d_chunk, max_bs = 2048, 8
    elif gpu_mib < 35 * 1024:
        d_chunk, max_bs = 4096, 48 if tp < 4 else 160
    elif gpu_mib < 60 * 1024:
        d_chunk, max_bs = 4096, 32 if tp < 4 else 160
    elif gpu_mib < 160 * 1024:
        d_chunk, max_bs = 8192, 256 if tp < 4 else 512
    else:
        d_chunk, max_bs = 16384, 512
    chunked = chunked or d_chunk
    if max_running is not None and max_bs > max_running:
        max_bs = max_running
    if role == "decode":
        activation = max(max_running or max_bs, 2048)
    else:
        activation = max(chunked, 2048)
    reserved = 512 + activation * 1.5 + tp * pp / 8 * 1024
    graph = 0.0
    if cuda_graph:
        if role != "prefill":
            graph += max_bs * 2
        if role != "decode":
            graph += 1.5 * 1024 if mla else len(prefill_graph_sizes(min(8192, chunked) if mla else chunked)) * 8
    reserved += graph
    floor = gpu_mib > 60 * 1024 and reserved < 10 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    mfs = round((gpu_mib - reserved) / gpu_mib, 3)
    how = (
        f"mem_fraction_static not set: SGLang 0.5.23 default {mfs} = round(({gpu_mib} MiB - reserved {reserved:g} MiB)"
        f" / {gpu_mib} MiB, 3), reserved = 512 + 1.5 x {activation} activation tokens + TP {tp} x PP {pp} / 8 x 1024"
        f" + {graph:g} cuda-graph" + (" (raised to the 10,240 MiB floor)" if floor else "")
    )
    return mfs, how


def estimate(launch: Launch, inputs: ReviewInputs, models: dict) -> Estimate:
    a = parse_args(launch, ALIASES, SWITCHES)
    model_arg = a.value("model") or (a.positional[0].text if a.positional else None)
    model = resolve_model(launch, model_arg, inputs, models)
    on_cpu = (a.value("device") or "").lower() == "cpu"
    gpu = None if on_cpu else resolve_gpu(launch, inputs)
    tp = int(a.number(launch, "tp") or 1)
    dp = int(a.number(launch, "dp") or 1)
    pp = int(a.number(launch, "pp") or 1)
    role = a.value("role") or launch.site.role or "unified"
    if role in ("null", "none", "None"):
        role = "unified"
    if role not in ("unified", "prefill", "decode"):
        raise ReviewError(f"{launch.site.file}:{a.line('role')}: --disaggregation-mode {role!r}; SGLang takes prefill or decode")
    assumptions: list[str] = []
    attn_tp = tp
    if a.has("dp_attention") and dp > 1:
        attn_tp = max(tp // dp, 1)
        assumptions.append(f"DP attention: attention TP = TP {tp} / DP {dp} = {attn_tp}")
    kv_b, kv_note = kv_dtype_bytes(a.value("kv_dtype"), model, launch, "--kv-cache-dtype")
    assumptions.append(kv_note)
    bpt = model.kv_bytes_per_token(kv_b, attn_tp, pp)
    page = int(a.number(launch, "page") or 1)
    if not a.has("page"):
        assumptions.append("page size 1 (SGLang's default; some attention backends force a larger page)")
    mtt = a.number(launch, "max_total_tokens")
    weights = model.weight_bytes // (tp * pp)
    if gpu is None:
        # srt/utils/common.py get_available_gpu_memory: on --device cpu the "free memory" SGLang
        # sizes the pool from is psutil's available host RAM at start-up, which no file states.
        if mtt is None:
            raise ReviewError(f"{launch.site.file}:{launch.line}: --device cpu without --max-total-tokens: SGLang sizes the "
                              "pool from the host's free RAM at start-up, which no file states; pass --max-total-tokens N")
        pool = int(mtt) // page * page
        rest = pool * bpt
        assumptions.append(f"--device cpu: --max-total-tokens {int(mtt):,} caps the pool; SGLang takes it whole when the "
                           f"host's available RAM holds {pool * bpt:,} B of KV beyond the weights (else it logs a warning "
                           "and takes less)")
    else:
        mfs_flag = a.number(launch, "mfs", float)
        if mfs_flag is not None:
            mfs = float(mfs_flag)
            if not 0 < mfs <= 1:
                raise ReviewError(f"{launch.site.file}:{a.line('mfs')}: --mem-fraction-static {mfs} must be between 0 and 1")
        else:
            mfs, how = default_mem_fraction_static(
                gpu.memory_mib, tp, pp, role, model.is_mla,
                chunked=a.number(launch, "chunked"), max_running=a.number(launch, "max_running"),
                cuda_graph=not a.has("no_graph"),
            )
            assumptions.append(how)
        assumptions.append(f"weights {model.weight_bytes:,} B ({model.weight_source}) split evenly over TP {tp} x PP {pp}")
        pre_load = gpu.memory_bytes - CUDA_CONTEXT_BYTES
        assumptions.append(
            f"GPU {gpu.name}: {gpu.memory_mib:,} MiB as NVML reports it; 1 GiB taken by CUDA context and NCCL before SGLang measures"
        )
        rest = int(pre_load * mfs) - weights
        computed = max(rest, 0) // bpt // page * page
        pool = computed
        if mtt is not None and int(mtt) < computed:
            pool = int(mtt) // page * page
            assumptions.append(f"--max-total-tokens {int(mtt):,} caps the pool (memory would allow {computed:,})")
        elif mtt is not None:
            assumptions.append(f"--max-total-tokens {int(mtt):,} is above what memory allows; SGLang ignores it with a warning")
    if rest <= 0:
        assumptions.append("weights do not fit in mem_fraction_static of the GPU: SGLang will not start")
    if model.sliding_note:
        assumptions.append(model.sliding_note)
    ctx_flag = a.number(launch, "context")
    context, source = checked_context(inputs, launch, int(ctx_flag) if ctx_flag else None, "--context-length", model)
    line = a.line("context") if source.startswith("engine flag") else None
    limit = None
    if ctx_flag:
        limit = context_limit("sglang", model, int(ctx_flag), "--context-length", a.line("context") or launch.line, launch.env)
    return Estimate(
        engine="sglang", role=role, file=launch.site.file,
        line=line or a.line("mfs") or launch.line, where=launch.site.where,
        model=model.name, gpu=gpu.name if gpu else "cpu (host RAM)", pool_tokens=pool, kv_bytes_per_token=bpt,
        kv_bytes_formula=model.formula(kv_b, attn_tp, pp), weights_bytes_per_gpu=None if gpu is None else weights,
        context_checked=context, context_source=source, assumptions=tuple(assumptions),
        numbers={
            "tp": tp, "dp": dp, "pp": pp, "page_size": page, "kv_pool_bytes": max(rest, 0),
            **({"device": "cpu"} if gpu is None else {"mem_fraction_static": mfs, "gpu_memory_bytes": gpu.memory_bytes}),
        },
        flag_lines={f.name: f.line for f in a.flags.values()},
        context_limit=limit,
        consequence=(
            "SGLang 0.5.23 only logs a warning and serves the promised context; before 0.5.21 an over-pool "
            "prompt in PD mode leaked other requests' KV (the incident)"
        ),
    )
