"""kvpreflight's builtin engine (`kvpreflight engine serve`), a small SGLang stand-in that runs
on a CPU. Its model is fixed and documented: K and V of 16 float32 per token (128 B/token) and
a 260 x 16 float32 token codebook as "weights" (16,640 B). It sizes its pool the SGLang way over
``--mem-budget-bytes`` (the memory it may use; nothing is taken before): ``rest = (budget -
weights) - budget * (1 - mem_fraction_static)``, whole ``--page-size`` pages (default 16);
``--pool-tokens`` sets the pool outright. Review restates these facts instead of importing the
engine, so a running builtin engine is an independent check of this estimate.
"""

from __future__ import annotations

from kvpreflight._internal.review.estimate import Estimate, ReviewInputs, checked_context
from kvpreflight._internal.review.flags import parse_args
from kvpreflight._internal.review.hfconfig import ModelShape
from kvpreflight._internal.review.interface import Launch, ReviewError

CELL_BYTES = 2 * 16 * 4
WEIGHT_BYTES = 260 * 16 * 4
DEFAULT_PAGE = 16
MODEL = ModelShape(
    name="kvpreflight-builtin", config_path="(builtin)", model_type="builtin", num_layers=1, num_kv_heads=1,
    head_dim=16, kv_lora_rank=None, qk_rope_head_dim=None, max_position_embeddings=None, dtype_bytes=4,
    weight_bytes=WEIGHT_BYTES, weight_source="the builtin engine's token codebook", sliding_note=None,
)

ALIASES = {
    "--role": "role", "--context-length": "context", "--pool-tokens": "pool", "--mem-budget-bytes": "budget",
    "--mem-fraction-static": "mfs", "--page-size": "page",
    "--enable-metrics": "_switch", "--disable-radix-cache": "_switch",
}
SWITCHES = frozenset({"_switch"})


def estimate(launch: Launch, inputs: ReviewInputs, models: dict) -> Estimate:
    a = parse_args(launch, ALIASES, SWITCHES)
    role = a.value("role") or launch.site.role or "unified"
    page = int(a.number(launch, "page") or DEFAULT_PAGE)
    assumptions = [f"builtin engine model: {CELL_BYTES} B/token (K and V, 16 float32 each), weights {WEIGHT_BYTES:,} B"]
    numbers: dict[str, object] = {"page_size": page}
    if a.has("pool"):
        pool = int(a.number(launch, "pool") or 0) // page * page
        assumptions.append("--pool-tokens sets the pool")
    elif a.has("budget") and a.has("mfs"):
        budget, mfs = int(a.number(launch, "budget") or 0), float(a.number(launch, "mfs", float) or 0)
        rest = (budget - WEIGHT_BYTES) - budget * (1.0 - mfs)
        pool = max(int(rest // CELL_BYTES), 0) // page * page
        numbers.update(mem_budget_bytes=budget, mem_fraction_static=mfs, kv_pool_bytes=max(int(rest), 0))
    else:
        raise ReviewError(
            f"{launch.site.file}:{launch.line}: the builtin engine's pool depends on memory review cannot see; "
            "give --pool-tokens N or --mem-budget-bytes B with --mem-fraction-static F"
        )
    ctx = a.number(launch, "context")
    context, source = checked_context(inputs, launch, int(ctx) if ctx else None, "--context-length", MODEL)
    line = a.line("context") if source.startswith("engine flag") else None
    return Estimate(
        engine="builtin", role=role, file=launch.site.file, line=line or launch.line, where=launch.site.where,
        model=MODEL.name, gpu=None, pool_tokens=pool, kv_bytes_per_token=CELL_BYTES,
        kv_bytes_formula="K and V: 2 * 16 float32 * 4 B", weights_bytes_per_gpu=WEIGHT_BYTES,
        context_checked=context, context_source=source, assumptions=tuple(assumptions), numbers=numbers,
        flag_lines={f.name: f.line for f in a.flags.values()},
        consequence="the builtin engine, like SGLang 0.5.23, warns and serves the promised context",
    )
