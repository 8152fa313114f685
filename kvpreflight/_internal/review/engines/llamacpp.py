"""llama.cpp `llama-server`: the KV cache holds exactly ``-c`` cells; without ``--kv-unified``
each of the ``-np`` slots gets ``n_ctx / np`` of them, and a request longer than its slot is
rejected (``exceeds the available context size``). The pool does not depend on GPU memory
(llama.cpp fails to start when the cells do not fit), so the GPU is optional here.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

from kvpreflight._internal.review.estimate import Estimate, ReviewInputs, checked_context, parse_size, resolve_gpu, resolve_model
from kvpreflight._internal.review.flags import parse_args
from kvpreflight._internal.review.interface import Launch, ReviewError

DEFAULT_CTX = 4096
# bytes per element of llama.cpp's cache types (block formats: bytes per block / 32 elements)
CACHE_TYPES = {
    "f32": Fraction(4), "f16": Fraction(2), "bf16": Fraction(2), "q8_0": Fraction(34, 32),
    "q4_0": Fraction(18, 32), "q4_1": Fraction(20, 32), "q5_0": Fraction(22, 32), "q5_1": Fraction(24, 32),
    "iq4_nl": Fraction(18, 32),
}

ALIASES = {
    "-m": "model", "--model": "model",
    "-c": "ctx", "--ctx-size": "ctx",
    "-np": "np", "--parallel": "np",
    "--kv-unified": "unified", "-kvu": "unified",
    "-ctk": "ctk", "--cache-type-k": "ctk",
    "-ctv": "ctv", "--cache-type-v": "ctv",
    "--metrics": "_switch", "--cont-batching": "_switch", "-fa": "_flash", "--flash-attn": "_flash",
    "--no-webui": "_switch", "--jinja": "_switch", "--embedding": "_switch",
}
SWITCHES = frozenset({"unified", "_switch"})


def estimate(launch: Launch, inputs: ReviewInputs, models: dict) -> Estimate:
    a = parse_args(launch, ALIASES, SWITCHES)
    model = resolve_model(launch, a.value("model"), inputs, models)
    gpu = resolve_gpu(launch, inputs, required=False)
    assumptions: list[str] = []
    ctx_text = a.value("ctx")  # a value flag: present exactly when it has a value
    n_ctx = parse_size(ctx_text, launch, "-c") if ctx_text is not None else DEFAULT_CTX
    if not a.has("ctx"):
        assumptions.append(f"-c not set: llama-server's default {DEFAULT_CTX} cells")
    if n_ctx == 0:
        n_ctx = int(model.max_position_embeddings or 0)
        assumptions.append(f"-c 0: the model's training context ({n_ctx:,}) from config.json")
    n_par = int(a.number(launch, "np") or 1)
    if n_par < 1:
        n_par = 1
        assumptions.append("-np auto: counted as one slot per request (llama.cpp then uses a unified cache)")
    elif not a.has("np"):
        assumptions.append("-np not set: one slot (newer builds pick several slots with a unified cache: same per-request limit)")
    unified = a.has("unified")
    per_request = n_ctx if unified or n_par == 1 else n_ctx // n_par
    types = []
    for key, flag in (("ctk", "-ctk"), ("ctv", "-ctv")):
        name = (a.value(key) or "f16").lower()
        if name not in CACHE_TYPES:
            raise ReviewError(f"{launch.site.file}:{a.line(key)}: {flag} {name!r} is not a llama.cpp cache type; "
                              f"use one of {', '.join(CACHE_TYPES)}")
        types.append(name)
    k_b, v_b = CACHE_TYPES[types[0]], CACHE_TYPES[types[1]]
    if model.is_mla:
        assert model.kv_lora_rank is not None and model.qk_rope_head_dim is not None
        bpt = math.ceil((model.kv_lora_rank + model.qk_rope_head_dim) * model.num_layers * k_b)
        formula = f"MLA: ({model.kv_lora_rank} + {model.qk_rope_head_dim}) * {model.num_layers} layers * {types[0]}"
    else:
        per = model.num_layers * model.num_kv_heads * model.head_dim
        bpt = math.ceil(per * (k_b + v_b))
        formula = f"{model.num_layers} layers * {model.num_kv_heads} kv_heads * head_dim {model.head_dim} * (K {types[0]} + V {types[1]})"
    numbers: dict[str, object] = {"n_ctx": n_ctx, "n_parallel": n_par, "kv_unified": unified, "kv_pool_bytes": n_ctx * bpt}
    weights, source = model.weight_bytes, model.weight_source
    gguf = Path(a.value("model") or "")
    if gguf.suffix == ".gguf" and gguf.is_file():
        weights, source = gguf.stat().st_size, f"size of {gguf}"
    if gpu is not None:
        assumptions.append(f"weights {weights:,} B ({source})")
        need = n_ctx * bpt + weights
        numbers["gpu_memory_bytes"] = gpu.memory_bytes
        if need > gpu.memory_bytes:
            assumptions.append(
                f"KV {n_ctx * bpt:,} B + weights {weights:,} B exceed one {gpu.name} ({gpu.memory_bytes:,} B): "
                "llama-server will fail to allocate unless layers are split over more GPUs"
            )
    if model.sliding_note:
        assumptions.append(model.sliding_note)
    context, source = checked_context(inputs, launch, None, "", model)
    np_line = a.line("np")
    return Estimate(
        engine="llamacpp", role=launch.site.role or "unified", file=launch.site.file,
        line=np_line if per_request < n_ctx and np_line else (a.line("ctx") or launch.line),
        where=launch.site.where, model=model.name, gpu=gpu.name if gpu else None,
        pool_tokens=per_request, kv_bytes_per_token=bpt, kv_bytes_formula=formula, weights_bytes_per_gpu=None,
        context_checked=context, context_source=source, assumptions=tuple(assumptions), numbers=numbers,
        flag_lines={f.name: f.line for f in a.flags.values()},
        consequence="llama-server rejects longer prompts with HTTP 400 exceed_context_size_error (per slot)",
    )
