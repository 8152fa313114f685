"""`kvpreflight review` beside the public planners and the engines' own sizing, on the same inputs.

    .venv/bin/python benchmarks/bench_review.py --planners-venv /tmp/planners

The planners go in a throwaway venv of their own, not the project's:
``python3 -m venv /tmp/planners && /tmp/planners/bin/pip install kvfit==0.3.0 'llm-d-planner[estimation]==0.3.3'``
(the extra brings the transformers it reads configs with; this run had transformers 5.24.0).
Each is fed the local config.json from tests/fixtures/review/models (no hub download) and the
same weight bytes review uses (both planners otherwise read safetensors metadata from the hub),
so the table compares sizing rules, not weight look-ups. Nothing here needs a GPU.

Columns (KV tokens one engine's pool holds, per GPU rank):
- kvpreflight: the pool review reports (for vLLM the band, low end judged) and its verdict;
- engine source: SGLang 0.5.23's own rule (``_profile_available_bytes``, which review follows
  term by term); for vLLM, 0.32's ``determine_available_memory`` with the terms llm-d-planner
  measured on H100 for vLLM 0.19 (non-torch 0.27 GiB at TP 1, 2.10 GiB at TP >= 2; activations
  per architecture, CUDA graphs inside them);
- kvfit 0.3.0 (``estimate_cache`` + ``plan_topologies``, no runtime reserve, nominal GiB);
- llm-d-planner 0.3.3 (``total_kv_cache_blocks`` x 16; it models vLLM only).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))

from kvpreflight._internal.review import review  # noqa: E402
from kvpreflight._internal.review.estimate import ReviewInputs  # noqa: E402
from kvpreflight._internal.review.gpus import lookup  # noqa: E402
from kvpreflight._internal.review.hfconfig import load_model  # noqa: E402
from kvpreflight.model import Status  # noqa: E402

MODELS = ROOT / "tests" / "fixtures" / "review" / "models"
GIB = 1 << 30
TIMEOUT_S = 120
# llm-d-planner's vLLM 0.19 H100 calibration (planner/data/configuration/vllm_memory_constants.json)
MEASURED_NON_TORCH_GIB = {1: 0.27, 2: 2.10}
MEASURED_ACTIVATION_GIB = {"LlamaForCausalLM": 1.89, "Qwen2ForCausalLM": 2.25, "DeepseekV3ForCausalLM": 2.50}


@dataclass(frozen=True)
class Case:
    name: str
    engine: str
    model: str
    gpu: str
    tp: int
    context: int
    fraction: float  # gpu_memory_utilization (vLLM) or mem_fraction_static (SGLang)
    kv_dtype: str = "auto"
    extra: str = ""


CASES = (
    Case("Llama-8B vLLM TP 1", "vllm", "Llama-3.1-8B-Instruct", "H100", 1, 131_072, 0.9),
    Case("Llama-70B vLLM TP 2, 16k", "vllm", "Llama-3.1-70B-Instruct", "H100", 2, 16_384, 0.9),
    Case("Llama-70B vLLM TP 2, 32k", "vllm", "Llama-3.1-70B-Instruct", "H100", 2, 32_768, 0.9),
    Case("Llama-70B vLLM TP 4", "vllm", "Llama-3.1-70B-Instruct", "H100", 4, 131_072, 0.9),
    Case("Qwen-7B SGLang TP 4 (4 KV heads)", "sglang", "Qwen2.5-7B-Instruct", "H100", 4, 32_768, 0.85),
    Case("DeepSeek-V3 SGLang prefill bf16", "sglang", "DeepSeek-V3", "H200", 8, 1_048_576, 0.895),
    Case("DeepSeek-V3 SGLang decode fp8", "sglang", "DeepSeek-V3", "H200", 8, 1_048_576, 0.92, "fp8_e4m3"),
    Case("DeepSeek-V3 vLLM TP 8 fp8", "vllm", "DeepSeek-V3", "H200", 8, 163_840, 0.9, "fp8_e4m3"),
)

PLANNER_DRIVER = r'''
import json, math, sys
req = json.load(sys.stdin)
cfg = json.load(open(req["config"]))
out = {}
try:
    from kvfit.architectures import estimate_cache
    from kvfit.hardware import parse_hardware
    from kvfit.planner import plan_topologies
    cache = estimate_cache(cfg, context_tokens=req["context"], kv_bytes=req["kv_bytes"])
    (layout,) = plan_topologies(cache, weight_bytes=req["weights"], hardware=parse_hardware(req["kvfit_gpu"]),
                                gpus=req["tp"], utilization=req["fraction"], tensor_parallel=req["tp"])
    free = layout.budget_per_rank_bytes - layout.weights_per_rank_bytes - layout.fixed_cache_per_rank_bytes
    per_token = layout.kv_per_sequence_per_rank_bytes / req["context"]
    out["kvfit"] = {"tokens": max(0, math.floor(free / per_token)), "verdict": layout.verdict}
except Exception as exc:
    out["kvfit"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
try:
    from transformers import AutoConfig
    import planner.capacity_planner as cp
    config = AutoConfig.from_pretrained(req["dir"])
    cp.model_memory_req = lambda *a, **k: req["weights"] / 2**30  # the hub look-up, replaced
    blocks = cp.total_kv_cache_blocks(req["model"], config, req["context"], req["planner_gpu_gib"],
                                      gpu_mem_util=req["fraction"], tp=req["tp"])
    fits = cp.max_concurrent_requests(req["model"], config, req["context"], req["planner_gpu_gib"],
                                      gpu_mem_util=req["fraction"], tp=req["tp"])
    out["planner"] = {"tokens": blocks * 16, "verdict": "fits" if fits >= 1 else "does not fit"}
except Exception as exc:
    out["planner"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
print(json.dumps(out))
'''


def kvpreflight_row(case: Case, scratch: Path) -> dict:
    f = scratch / f"{case.name.replace(' ', '_').replace(',', '')}.sh"
    if case.engine == "vllm":
        line = (f"vllm serve {case.model} --tensor-parallel-size {case.tp} --max-model-len {case.context} "
                f"--gpu-memory-utilization {case.fraction} --kv-cache-dtype {case.kv_dtype} {case.extra}")
    else:
        line = (f"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 python -m sglang.launch_server --model-path {case.model} "
                f"--tp {case.tp} --context-length {case.context} --mem-fraction-static {case.fraction} "
                f"--kv-cache-dtype {case.kv_dtype} {case.extra}")
    f.write_text(line + "\n")
    report = review([f], ReviewInputs(model_dir=MODELS, gpu=case.gpu))
    (c,) = [c for c in report.checks if c.id == "kv-capacity-estimate"]
    return {"low": c.evidence["estimated_pool_tokens"], "high": c.evidence.get("estimated_pool_tokens_high"),
            "status": c.status, "bpt": c.evidence["kv_bytes_per_token"], "weights": c.evidence["weights_bytes_per_gpu"]}


def engine_source_tokens(case: Case, row: dict) -> int:
    """The pool by the engine's own sizing code (see the module docstring)."""
    if case.engine == "sglang":
        return int(row["low"])  # review follows SGLang 0.5.23's rule term by term
    gpu = lookup(case.gpu)
    assert gpu is not None
    model = load_model(MODELS / case.model)
    arch = json.loads((MODELS / case.model / "config.json").read_text()).get("architectures", ["?"])[0]
    reserve = (MEASURED_NON_TORCH_GIB[min(case.tp, 2)] + MEASURED_ACTIVATION_GIB.get(arch, 2.0)) * GIB
    kv = math.ceil(gpu.memory_bytes * case.fraction) - model.weight_bytes // case.tp - reserve
    return int(max(kv, 0) // (row["bpt"] * 16) * 16)


def planner_rows(case: Case, row: dict, venv: Path) -> dict:
    model = load_model(MODELS / case.model)
    kv_bytes = 1 if case.kv_dtype.startswith("fp8") else model.dtype_bytes
    req = {
        "config": str(MODELS / case.model / "config.json"), "dir": str(MODELS / case.model), "model": case.model,
        "context": case.context, "kv_bytes": kv_bytes, "weights": model.weight_bytes, "tp": case.tp,
        "fraction": case.fraction, "kvfit_gpu": case.gpu.lower(),
        "planner_gpu_gib": 80 if case.gpu == "H100" else 141,
    }
    done = subprocess.run([str(venv / "bin" / "python"), "-c", PLANNER_DRIVER], input=json.dumps(req),
                          capture_output=True, text=True, timeout=TIMEOUT_S, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        return {"kvfit": {"error": done.stderr[-200:]}, "planner": {"error": done.stderr[-200:]}}
    return json.loads(done.stdout.strip().splitlines()[-1])


def cell(planner: dict, source: int) -> str:
    if "error" in planner:
        return f"error: {planner['error'][:60]}"
    return f"{planner['tokens']:,} ({planner['verdict']}, {planner['tokens'] / max(source, 1):.2f}x)"


def verdict(tokens: int, context: int) -> str:
    ratio = tokens / context
    return "fail" if ratio < 1.0 else "warn" if ratio < 1.2 else "pass"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planners-venv", type=Path, required=True)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            row = kvpreflight_row(case, Path(tmp))
            source = engine_source_tokens(case, row)
            others = planner_rows(case, row, args.planners_venv)
            rows.append({"case": case, "row": row, "source": source, **others})
    print("| configuration | context | engine source | kvpreflight | kvfit 0.3.0 | llm-d-planner 0.3.3 |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        case, row, source = r["case"], r["row"], r["source"]
        band = f"{row['low']:,}" if row["high"] is None else f"{row['low']:,}-{row['high']:,}"
        status = Status(row["status"]).value

        print(f"| {case.name} | {case.context:,} | {source:,} ({verdict(source, case.context)}) | {band} ({status}) "
              f"| {cell(r['kvfit'], source)} | {cell(r['planner'], source)} |")
    if args.json:
        print(json.dumps([{**{k: v for k, v in r.items() if k != "case"}, "case": r["case"].name} for r in rows],
                         default=str, indent=1))


if __name__ == "__main__":
    main()
