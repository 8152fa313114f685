"""vLLM 0.32's KV budget, term by term, as ``v1/worker/gpu_worker.py``
``Worker.determine_available_memory`` computes it on CUDA:

    requested = ceil(total * gpu_memory_utilization)        (v1/worker/utils.py request_memory)
    kv = requested - non_kv_cache_memory - cudagraph_estimate
    non_kv_cache_memory = total_consumed + transient_peak_headroom   (utils/mem_utils.py memory_profiling)

``total_consumed`` is the free memory lost between the worker's first snapshot (taken after NCCL
is initialised, so the communicators' start-up memory is outside the budget) and the end of the
profiling run: the weights, persistent buffers, and non-torch memory that appears while
profiling (cuBLAS and attention workspaces; NCCL buffers, which NCCL's runtime connection sets up
at the first large collective, i.e. inside the profiling run at TP > 1). The headroom is the
activation peak of one ``max_num_batched_tokens`` forward pass plus the dummy sampler over
``max_num_seqs`` rows. The CUDA-graph estimate (``gpu_model_runner.py``
``profile_cudagraph_memory``; applied since ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults
to 1) is, per graph mode, the first capture plus (graphs - 1) x the second capture, at least 1 MiB
per graph; ``--enforce-eager`` captures none.

Only the graph count and the weights follow from the files; every other term is measured on the
GPU at start-up, so each is a band (low, high) here and the pool is a band too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpreflight._internal.review.hfconfig import ModelShape

MIB = 1 << 20
GIB = 1 << 30

# v1/worker/gpu_model_runner.py profile_cudagraph_memory: "at least 1 MiB per graph".
GRAPH_FLOOR_BYTES = 1 * MIB
# The high end per graph mode: a first capture of 512 MiB and 8 MiB for each further graph.
# Assumed (vLLM measures it); it gives about 1 GiB per mode at the default 51 sizes.
GRAPH_FIRST_HIGH_BYTES = 512 * MIB
GRAPH_EACH_HIGH_BYTES = 8 * MIB
# Workspaces present at any TP (cuBLAS/cuBLASLt, attention backend, sampler buffers): assumed band.
WORKSPACE_BAND = (256 * MIB, 768 * MIB)
# NCCL buffers and channels set up during the profiling run's first all-reduce at TP > 1
# (custom all-reduce's IPC buffers are allocated before the snapshot and are not counted).
# Assumed band; the comparison put the whole non-torch term near 2 GiB at TP >= 2.
NCCL_TP_BAND = (768 * MIB, 1792 * MIB)
# Point-to-point NCCL channels between pipeline stages: assumed band.
NCCL_PP_BAND = (128 * MIB, 512 * MIB)
# The dummy sampler keeps float32 logits for max_num_seqs rows; top-k/top-p work on copies.
LOGITS_BYTES = 4
SAMPLER_COPIES_HIGH = 2


@dataclass(frozen=True)
class ReserveTerm:
    """One term vLLM takes from ``requested`` before the KV cache, per GPU, as a band."""

    name: str
    low: int
    high: int
    how: str


@dataclass(frozen=True)
class BatchDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int
    how: str


def batch_defaults(gpu_memory_bytes: int, gpu_name: str) -> BatchDefaults:
    """``engine/arg_utils.py`` ``EngineArgs.get_batch_defaults`` for the OpenAI server."""
    if gpu_memory_bytes >= 160 * GIB:
        return BatchDefaults(16384, 1024, "vLLM's OpenAI-server default on GPUs with >= 160 GiB")
    if gpu_memory_bytes >= 70 * GIB and "a100" not in gpu_name.lower():
        return BatchDefaults(8192, 1024, "vLLM's OpenAI-server default on H100/H200-class GPUs")
    return BatchDefaults(2048, 256, "vLLM's OpenAI-server default on GPUs under 70 GiB and A100")


def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, blackwell: bool = False) -> list[int]:
    """``config/vllm.py`` ``VllmConfig._set_cudagraph_sizes`` without speculative decoding
    (decode query length 1) and without an explicit capture list."""
    ceiling = min(max_num_seqs * 2, 1024 if blackwell else 512)
    uniform_decode = [max_num_seqs] if max_num_seqs <= ceiling else []
    top = min(max_num_batched_tokens, ceiling)
    sizes = [s for s in (1, 2, 4) if s <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    if max_num_batched_tokens <= top:
        sizes.append(max_num_batched_tokens)
    sizes += [s for s in uniform_decode if s <= max_num_batched_tokens]
    return sorted(set(sizes))


def cudagraph_term(sizes: list[int], max_num_seqs: int) -> ReserveTerm:
    """FULL_AND_PIECEWISE (vLLM's default mode): a piecewise graph per size and a full decode
    graph per size up to max_num_seqs; each mode is estimated on its own."""
    modes = [len(sizes), len([s for s in sizes if s <= max_num_seqs])]
    modes = [n for n in modes if n]
    low = sum(n * GRAPH_FLOOR_BYTES for n in modes)
    high = sum(GRAPH_FIRST_HIGH_BYTES + (n - 1) * GRAPH_EACH_HIGH_BYTES for n in modes)
    return ReserveTerm(
        "cudagraph", low, high,
        f"CUDA-graph estimate for {' + '.join(map(str, modes))} graphs (piecewise + full decode, capture sizes "
        f"{sizes[0]}..{sizes[-1]}): at least 1 MiB each (vLLM's floor), at most {GRAPH_FIRST_HIGH_BYTES // MIB} MiB "
        f"first capture + {GRAPH_EACH_HIGH_BYTES // MIB} MiB per further graph per mode (assumed); vLLM measures it",
    )


def activation_term(model: ModelShape, tp: int, tokens: int, max_num_seqs: int) -> ReserveTerm:
    """The profiling run's transient peak: one MLP's widest output for ``tokens`` tokens (dense
    gate_up, or the fused-MoE intermediate of top-k experts) beside the residual stream, plus the
    dummy sampler's float32 logits for ``max_num_seqs`` rows. The high end doubles the forward
    part (other live tensors) and counts the sampler's copies."""
    width = max(model.intermediate_size * 2 // tp, model.moe_intermediate_size * 2 * model.experts_per_token // tp)
    forward = tokens * (width + 2 * model.hidden_size) * model.dtype_bytes
    logits = max_num_seqs * model.vocab_size * LOGITS_BYTES
    return ReserveTerm(
        "activations", forward + logits, 2 * forward + (1 + SAMPLER_COPIES_HIGH) * logits,
        f"activation peak of the profiling run for max_num_batched_tokens {tokens:,} ({tokens:,} x ({width:,} MLP/TP + 2 x "
        f"{model.hidden_size:,} hidden) x {model.dtype_bytes} B) and sampler logits ({max_num_seqs:,} x vocab "
        f"{model.vocab_size:,} x 4 B); high end 2x the forward part and {SAMPLER_COPIES_HIGH} more logits copies; vLLM measures it",
    )


def reserve_terms(
    model: ModelShape, *, tp: int, pp: int, enforce_eager: bool,
    max_num_batched_tokens: int, max_num_seqs: int, blackwell: bool = False,
) -> tuple[ReserveTerm, ...]:
    """Everything vLLM 0.32 takes from ``requested`` besides the weights, per GPU."""
    terms = [ReserveTerm("workspaces", *WORKSPACE_BAND,
                         "cuBLAS, attention-backend and sampler workspaces created while profiling (assumed band)")]
    if tp > 1:
        terms.append(ReserveTerm("nccl_tp", *NCCL_TP_BAND,
                                 f"NCCL buffers set up during profiling at TP {tp} (assumed band)"))
    if pp > 1:
        terms.append(ReserveTerm("nccl_pp", *NCCL_PP_BAND,
                                 f"NCCL point-to-point channels between {pp} pipeline stages (assumed band)"))
    terms.append(activation_term(model, tp, max_num_batched_tokens, max_num_seqs))
    if not enforce_eager:
        terms.append(cudagraph_term(cudagraph_capture_sizes(max_num_seqs, max_num_batched_tokens, blackwell), max_num_seqs))
    return tuple(terms)


def requested_bytes(total: int, gpu_memory_utilization: float) -> int:
    """``v1/worker/utils.py`` ``request_memory``: ceil(total * gpu_memory_utilization)."""
    return math.ceil(total * gpu_memory_utilization)
