"""vLLM 0.32's KV budget term by term, and each engine's context limit, against the engines' own
functions. tests/fixtures/review/engine_reference.json holds what those functions returned:
``benchmarks/engine_reference.py`` ran them with vLLM 0.32's Python (CUDA-graph capture sizes,
batch defaults, ``_get_and_verify_max_len``) and SGLang 0.5.23's ``get_context_length`` taken
verbatim from its wheel, no GPU needed. The terms vLLM measures on the GPU are bands whose
formulas are in kvpreflight/_internal/review/engines/vllm_memory.py (file and function cited there)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvpreflight._internal.review import review
from kvpreflight._internal.review.context_limit import sglang_limit, vllm_limit
from kvpreflight._internal.review.engines.vllm_memory import (
    batch_defaults,
    cudagraph_capture_sizes,
    requested_bytes,
    reserve_terms,
)
from kvpreflight._internal.review.estimate import ReviewInputs
from kvpreflight._internal.review.gpus import lookup
from kvpreflight._internal.review.hfconfig import load_model
from kvpreflight.model import Status

FIX = Path(__file__).parents[1] / "fixtures" / "review"
MODELS = FIX / "models"
EXAMPLES = Path(__file__).parents[2] / "examples" / "review"
REFERENCE = json.loads((FIX / "engine_reference.json").read_text())
MIB, GIB = 2**20, 2**30
H100 = 81559 * MIB


def results(*files: Path, **inputs):
    inputs.setdefault("model_dir", MODELS)
    return review(list(files), ReviewInputs(**inputs))


def by_id(report, check_id):
    return [c for c in report.checks if c.id == check_id]


# --- terms from vLLM's own functions ------------------------------------------------------


@pytest.mark.parametrize("key,seqs,tokens,blackwell", [
    ("h100_defaults_1024_8192", 1024, 8192, False),
    ("small_gpu_defaults_256_2048", 256, 2048, False),
    ("b200_defaults_1024_16384", 1024, 16384, True),
    ("seqs_64_tokens_4096", 64, 4096, False),
])
def test_cudagraph_capture_sizes_are_vllms(key, seqs, tokens, blackwell):
    assert cudagraph_capture_sizes(seqs, tokens, blackwell) == REFERENCE["capture_sizes"][key]


@pytest.mark.parametrize("gpu", ["H100 80GB", "A100 80GB", "L40S 48GB", "B200 180GB"])
def test_batch_defaults_are_vllms(gpu):
    g = lookup(gpu)
    assert g is not None
    d = batch_defaults(g.memory_bytes, g.name)
    assert [d.max_num_batched_tokens, d.max_num_seqs] == REFERENCE["batch_defaults"][gpu]


def test_requested_memory_is_ceil_of_total_times_utilisation():
    # v1/worker/utils.py request_memory: math.ceil(total * gpu_memory_utilization)
    assert requested_bytes(H100, 0.9) == math.ceil(H100 * 0.9) == 76_968_728_986


# --- the reserve at TP 1, 2, 4, 8, with and without --enforce-eager ----------------------


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("eager", [False, True])
def test_reserve_terms_for_llama_70b(tp, eager):
    m = load_model(MODELS / "Llama-3.1-70B-Instruct")  # hidden 8192, intermediate 28672, vocab 128256
    terms = {t.name: (t.low, t.high) for t in
             reserve_terms(m, tp=tp, pp=1, enforce_eager=eager, max_num_batched_tokens=8192, max_num_seqs=1024)}
    assert terms["workspaces"] == (256 * MIB, 768 * MIB)
    # NCCL buffers exist only with a TP group: set up in the profiling run's first all-reduce
    assert ("nccl_tp" in terms) is (tp > 1)
    if tp > 1:
        assert terms["nccl_tp"] == (768 * MIB, 1792 * MIB)
    # activations: 8192 tokens x (gate_up 2 x 28672 / TP + 2 x hidden 8192) x 2 B, plus float32
    # logits for 1,024 sampler rows; high end doubles the forward part and adds two logits copies
    forward = 8192 * (2 * 28672 // tp + 2 * 8192) * 2
    logits = 1024 * 128256 * 4
    assert terms["activations"] == (forward + logits, 2 * forward + 3 * logits)
    # CUDA graphs (gpu_model_runner.py profile_cudagraph_memory): none under --enforce-eager;
    # else 51 piecewise + 51 full-decode graphs, >= 1 MiB each, <= 512 MiB + 50 x 8 MiB per mode
    if eager:
        assert "cudagraph" not in terms
    else:
        assert terms["cudagraph"] == (102 * MIB, 2 * (512 + 50 * 8) * MIB)


def test_pipeline_parallel_adds_point_to_point_buffers():
    m = load_model(MODELS / "Llama-3.1-8B-Instruct")
    names = [t.name for t in reserve_terms(m, tp=1, pp=2, enforce_eager=True, max_num_batched_tokens=2048, max_num_seqs=256)]
    assert names == ["workspaces", "nccl_pp", "activations"]


# --- whole manifests ----------------------------------------------------------------------


def _llama70b_tp2(tmp_path, extra=""):
    f = tmp_path / "serve.sh"
    f.write_text(f"vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 2 --max-model-len 16384{extra}\n")
    return f


def test_tp2_pool_near_the_context_is_not_a_pass(tmp_path):
    """70B bf16 over TP 2 on H100: 65.7 GiB of weights per GPU leave a few GiB, and what vLLM
    measures at start-up decides whether a 16,384-token request fits."""
    (c,) = by_id(results(_llama70b_tp2(tmp_path), gpu="H100"), "kv-capacity-estimate")
    weights = 141_107_412_992 // 2
    bpt = 2 * 80 * 4 * 128 * 2  # 163,840 B
    # the old flat 2 GiB reserve said 26,032 tokens = 1.59x: pass
    assert (int(H100 * 0.9) - weights - 2 * GIB) // (bpt * 16) * 16 == 26_032
    low = c.evidence["estimated_pool_tokens"]
    high = c.evidence["estimated_pool_tokens_high"]
    reserve = c.evidence["reserve_bytes"]
    assert high == (math.ceil(H100 * 0.9) - weights - sum(lo for lo, _ in reserve.values())) // (bpt * 16) * 16
    assert low == max(math.ceil(H100 * 0.9) - weights - sum(hi for _, hi in reserve.values()), 0) // (bpt * 16) * 16
    assert low / 16_384 < 1.0 <= 1.2 <= high / 16_384
    assert c.status is Status.WARN
    assert "depends on memory vllm measures at start-up" in c.message
    assert f"{low:,}-{high:,} tokens" in c.message


def test_enforce_eager_frees_the_graph_reserve(tmp_path):
    (graphs,) = by_id(results(_llama70b_tp2(tmp_path), gpu="H100"), "kv-capacity-estimate")
    (eager,) = by_id(results(_llama70b_tp2(tmp_path, " --enforce-eager"), gpu="H100"), "kv-capacity-estimate")
    assert "cudagraph" in graphs.evidence["reserve_bytes"] and "cudagraph" not in eager.evidence["reserve_bytes"]
    lo, hi = graphs.evidence["reserve_bytes"]["cudagraph"]
    # the band's low end gains the graphs' high estimate (here from a pool of 0: weights and the
    # high reserve leave nothing), the high end their low one
    assert graphs.evidence["kv_pool_bytes"] == 0 < eager.evidence["kv_pool_bytes"]
    assert eager.evidence["kv_pool_bytes_high"] - graphs.evidence["kv_pool_bytes_high"] == lo
    assert eager.evidence["estimated_pool_tokens"] > graphs.evidence["estimated_pool_tokens"]
    assert hi > lo


def test_a_pool_well_clear_of_the_context_still_passes(tmp_path):
    f = tmp_path / "serve.sh"
    f.write_text("vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 32768\n")
    (c,) = by_id(results(f, gpu="H100"), "kv-capacity-estimate")
    assert c.status is Status.PASS and c.evidence["estimated_pool_tokens"] / 32_768 > 1.2


# --- context limits -----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REFERENCE["models"]))
def test_context_limits_are_the_engines_own(name, tmp_path):
    config = json.loads((MODELS / name / "config.json").read_text()) if (MODELS / name).is_dir() else None
    if config is None:  # a rope variant of Qwen2.5-7B, as engine_reference.py builds it
        base, _, variant = name.partition("+")
        assert base == "qwen"
        config = json.loads((MODELS / "Qwen2.5-7B-Instruct" / "config.json").read_text())
        rope = {"dynamic4": {"rope_type": "dynamic", "factor": 4.0},
                "yarn4": {"rope_type": "yarn", "factor": 4.0},
                "yarn4+orig": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}[variant]
        config["rope_scaling"] = rope
    (tmp_path / "config.json").write_text(json.dumps(config))
    m = load_model(tmp_path)
    want = REFERENCE["models"][name]
    assert vllm_limit(m)[0] == want["vllm"]["derived"]
    assert sglang_limit(m)[0] == want["sglang"]


def test_deepseek_incident_fails_naming_the_sglang_override():
    report = results(EXAMPLES / "incident-pd-lws.yaml", model_dir=MODELS / "DeepSeek-V3")
    limits = by_id(report, "model-context-limit")
    assert [c.status for c in limits] == [Status.FAIL, Status.FAIL]
    for c in limits:
        assert "1,048,576 is over the 163,840 tokens" in c.message
        assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in c.message and "Lower --context-length to 163,840" in c.message
    assert [c.evidence["line"] for c in limits] == [27, 64]


@pytest.mark.parametrize("how", ["env", "export", "prefix"])
def test_deepseek_over_the_limit_with_the_override_set_warns(tmp_path, how):
    f = tmp_path / "serve.sh"
    launch = "python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8 --context-length 524288"
    f.write_text({
        "env": f"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1\n{launch}\n",
        "export": f"export SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=true\n{launch}\n",
        "prefix": f"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 {launch}\n",
    }[how])
    (c,) = by_id(results(f, model_dir=MODELS / "DeepSeek-V3", gpu="H200"), "model-context-limit")
    assert c.status is Status.WARN and "is set, so it starts" in c.message


def test_sglang_override_inside_a_kubernetes_sh_c_script_warns(tmp_path):
    text = (EXAMPLES / "incident-pd-lws.yaml").read_text().replace(
        "python3 -m sglang.launch_server \\",
        "export SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1\n"
        "                python3 -m sglang.launch_server \\")
    f = tmp_path / "m.yaml"
    f.write_text(text)
    prefill, decode = by_id(results(f, model_dir=MODELS / "DeepSeek-V3"), "model-context-limit")
    assert prefill.status is Status.WARN  # the export is in the prefill's script
    assert decode.status is Status.FAIL  # the decode container sets nothing


def test_vllm_max_model_len_over_the_model_fails_naming_its_override(tmp_path):
    f = tmp_path / "serve.sh"
    f.write_text("vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 262144 --kv-cache-memory-bytes 80G\n")
    (c,) = by_id(results(f), "model-context-limit")
    assert c.status is Status.FAIL
    assert "over the 131,072 tokens" in c.message and "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in c.message
    assert "rope type llama3: factor not applied" in c.evidence["derivation"]
    f.write_text("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 " + f.read_text())
    (c,) = by_id(results(f), "model-context-limit")
    assert c.status is Status.WARN


def test_a_context_within_the_model_has_no_limit_finding():
    report = results(FIX / "k8s-llama8b-vllm.yaml")  # --max-model-len 131072 = the model's own
    assert by_id(report, "model-context-limit") == []


def test_a_band_that_fails_at_its_low_end_and_warns_at_its_high_end_fails(tmp_path):
    # 70B at TP 2 with 20,480 tokens: the high end, 24,224 tokens, is 1.18x (warn), the low end 0
    (c,) = by_id(results(_context(tmp_path, 20_480), gpu="H100"), "kv-capacity-estimate")
    assert c.evidence["estimated_pool_tokens_high"] / 20_480 < 1.2
    assert c.status is Status.FAIL and "(band up to 24,224)" in c.message


def _context(tmp_path, tokens):
    f = tmp_path / "serve.sh"
    f.write_text(f"vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 2 --max-model-len {tokens}\n")
    return f
