"""`kvpreflight review` numbers, each worked out by hand here from the public model configs in
tests/fixtures/review/models and the engines' published sizing rules (see engines.md).

Constants used by hand below:
- H100 80GB as NVML reports it: 81,559 MiB = 81559 * 2**20 bytes; H200: 143,771 MiB.
- Llama-3.1-8B bf16 KV: 2 * 32 layers * 8 kv_heads * 128 head_dim * 2 B = 131,072 B/token.
- Llama-3.1-8B weights: 8,030,261,248 params * 2 B = 16,060,522,496 B (index metadata.total_size).
- SGLang: pool = (pre_load * mfs - weights/TP) // bytes_per_token, pre_load = GPU - 1 GiB.
- vLLM: pool = (ceil(GPU * gmu) - weights/TP - reserve) // (bpt * 16) * 16, the reserve a band
  (test_review_vllm_memory.py has its terms); the pool reported is the band's low end.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kvpreflight._internal.review import review
from kvpreflight._internal.review.engines.sglang import default_mem_fraction_static
from kvpreflight._internal.review.estimate import ReviewInputs
from kvpreflight._internal.review.hfconfig import load_model
from kvpreflight._internal.review.interface import ReviewError
from kvpreflight.model import Status

FIX = Path(__file__).parents[1] / "fixtures" / "review"
MODELS = FIX / "models"
EXAMPLES = Path(__file__).parents[2] / "examples" / "review"
H100 = 81559 * 2**20
H200 = 143771 * 2**20
GIB = 2**30


def checks(*files: Path, **inputs):
    inputs.setdefault("model_dir", MODELS)
    report = review(list(files), ReviewInputs(**inputs))
    # the estimates only; engine-advisories findings are tested in test_advisories.py
    return report, [c for c in report.checks if c.id == "kv-capacity-estimate"]


# --- bytes per token ----------------------------------------------------------------------


def test_llama_8b_bf16_is_131072_bytes_per_token():
    m = load_model(MODELS / "Llama-3.1-8B-Instruct")
    assert m.kv_bytes_per_token(2, attn_tp=1) == 2 * 32 * 8 * 128 * 2 == 131_072


def test_deepseek_v3_mla_is_70272_bytes_and_not_split_by_tp():
    m = load_model(MODELS / "DeepSeek-V3")
    assert m.kv_bytes_per_token(2, attn_tp=1) == (512 + 64) * 61 * 2 == 70_272
    assert m.kv_bytes_per_token(2, attn_tp=8) == 70_272
    assert m.kv_bytes_per_token(1, attn_tp=8) == (512 + 64) * 61 * 1 == 35_136


def test_gqa_with_tp_above_kv_heads_replicates_heads():
    # Qwen2.5-7B: 28 layers, 4 KV heads, head_dim 3584/28 = 128; TP 8 > 4 heads -> 1 head per rank
    m = load_model(MODELS / "Qwen2.5-7B-Instruct")
    assert m.kv_bytes_per_token(2, attn_tp=8) == 2 * 28 * 1 * 128 * 2 == 14_336
    assert m.kv_bytes_per_token(2, attn_tp=2) == 2 * 28 * 2 * 128 * 2 == 28_672


def test_weights_from_parameter_count_match_the_published_counts():
    # Llama-3.1-70B has no index here: 70,553,706,496 params (Meta's published count) * 2 B
    assert load_model(MODELS / "Llama-3.1-70B-Instruct").weight_bytes == 70_553_706_496 * 2
    # Qwen2.5-7B: published 7,615,616,512 params incl. q/k/v biases (28 * (3584+512+512) = 129,024),
    # which the count leaves out
    assert load_model(MODELS / "Qwen2.5-7B-Instruct").weight_bytes == (7_615_616_512 - 129_024) * 2


# --- SGLang default mem_fraction_static (srt/arg_groups/memory_hook.py, 0.5.23) ------------


def test_sglang_default_mem_fraction_on_h100_tp1():
    # chunked 8192, decode max_bs 256; prefill graph sizes up to 8192: 8 (4..32) + 14 (48..256)
    # + 8 (288..512) + 8 (576..1024) + 12 (1280..4096) + 8 (4608..8192) = 58
    # reserved = 512 + 1.5*8192 + 1*1/8*1024 + 256*2 + 58*8 = 512+12288+128+512+464 = 13904 MiB
    mfs, how = default_mem_fraction_static(81559, tp=1, pp=1, role="unified", mla=False)
    assert mfs == round((81559 - 13904) / 81559, 3) == 0.83
    assert "13904" in how


def test_sglang_default_mem_fraction_decode_hits_the_10gib_floor():
    # decode: activation max(256, 2048) = 2048 -> 512 + 3072 + 128 + 256*2 = 4224 < 10240 floor
    mfs, how = default_mem_fraction_static(81559, tp=1, pp=1, role="decode", mla=False)
    assert mfs == round((81559 - 10240) / 81559, 3) == 0.874
    assert "floor" in how


def test_sglang_default_mem_fraction_mla_prefill_on_h200_tp8():
    # H200: chunked 8192, max_bs 512 (tp>=4); prefill role: no decode graph; MLA graph 1536
    # reserved = 512 + 12288 + 8/8*1024 + 1536 = 15360
    mfs, _ = default_mem_fraction_static(143771, tp=8, pp=1, role="prefill", mla=True)
    assert mfs == round((143771 - 15360) / 143771, 3) == 0.893


# --- whole files ---------------------------------------------------------------------------


def test_incident_shape_prefill_fails_at_0_65x_and_points_at_the_context_flag():
    report, (prefill, decode) = checks(EXAMPLES / "incident-pd-lws.yaml", model_dir=MODELS / "DeepSeek-V3")
    pre_load = H200 - GIB  # 149,681,078,272
    weights = 688_586_727_753 // 8  # DeepSeek-V3 FP8 checkpoint over TP 8 = 86,073,340,969
    # prefill: --mem-fraction-static 0.895, bf16 MLA 70,272 B/token
    assert prefill.evidence["estimated_pool_tokens"] == (int(pre_load * 0.895) - weights) // 70_272 == 681_512
    assert prefill.status is Status.FAIL
    assert prefill.evidence["ratio"] == round(681_512 / 1_048_576, 4) == 0.6499
    assert prefill.evidence["role"] == "prefill"
    assert (prefill.evidence["file"], prefill.evidence["line"]) == (str(EXAMPLES / "incident-pd-lws.yaml"), 27)
    assert "1048576" in (EXAMPLES / "incident-pd-lws.yaml").read_text().splitlines()[27 - 1]
    assert "kvpreflight check" in prefill.message  # it says it is an estimate
    # decode: 0.92, fp8 KV (512+64)*61*1 = 35,136 B/token
    assert decode.evidence["estimated_pool_tokens"] == (int(pre_load * 0.92) - weights) // 35_136 == 1_469_525
    assert decode.status is Status.PASS and decode.evidence["role"] == "decode"
    assert report.exit_code == 1


def test_vllm_llama_8b_on_h100_from_the_node_selector():
    report, (c,) = checks(FIX / "k8s-llama8b-vllm.yaml")
    # ceil(0.9 * H100) - weights - the reserve's high end (workspaces 768 MiB; activations
    # 8192 x (2 x 14336 + 2 x 4096) x 2 B + 1024 x 128256 x 4 B x 3 logits copies, the forward part
    # doubled; graphs 2 x (512 MiB + 50 x 8 MiB)), whole 16-token blocks of 131,072 B
    reserve_high = 768 * 2**20 + (2 * 8192 * (2 * 14336 + 2 * 4096) * 2 + 3 * 1024 * 128256 * 4) + 2 * (512 + 50 * 8) * 2**20
    kv = math.ceil(H100 * 0.9) - 16_060_522_496 - reserve_high
    assert c.evidence["estimated_pool_tokens"] == kv // (131_072 * 16) * 16 == 422_704
    assert c.evidence["gpu"] == "H100 80GB"
    assert c.evidence["context_checked"] == 131_072 and c.status is Status.PASS
    assert report.exit_code == 0


def test_sglang_prefill_and_decode_from_a_boot_spec_with_default_fraction():
    report, (prefill, decode) = checks(FIX / "bootspec-pd.yaml", gpu="H100")
    # prefill role: reserved 512 + 12288 + 128 + 464 (prefill graphs only) = 13392 -> 0.836
    assert prefill.evidence["mem_fraction_static"] == round((81559 - 13392) / 81559, 3) == 0.836
    assert prefill.evidence["estimated_pool_tokens"] == (int((H100 - GIB) * 0.836) - 16_060_522_496) // 131_072 == 416_086
    assert prefill.evidence["context_source"] == "boot spec context_length"
    # decode: --max-total-tokens 120000 caps it below the 131,072 the spec promises -> fail
    assert decode.evidence["estimated_pool_tokens"] == 120_000
    assert decode.status is Status.FAIL
    assert decode.evidence["ratio"] == round(120_000 / 131_072, 4) == 0.9155
    assert report.exit_code == 1


def test_compose_70b_vllm_passes_and_sglang_max_total_tokens_warns():
    report, (vllm, sglang) = checks(FIX / "compose-llama70b.yml", gpu="H100 80GB")
    # 70B over TP 4: weights 141,107,412,992 / 4 = 35,276,853,248; KV 2*80*(8/4)*128*2 = 81,920 B;
    # reserve high end: workspaces 768 MiB, NCCL 1,792 MiB, activations
    # 2 x 8192 x (2 x 28672 / 4 + 2 x 8192) x 2 B + 3 x 1024 x 128256 x 4 B, graphs 2 x (512 + 50 x 8) MiB
    reserve_high = (768 + 1792) * 2**20 + 2 * 8192 * (2 * 28672 // 4 + 2 * 8192) * 2 + 3 * 1024 * 128256 * 4 + 2 * 912 * 2**20
    kv = math.ceil(H100 * 0.9) - 35_276_853_248 - reserve_high
    assert vllm.evidence["kv_bytes_per_token"] == 81_920
    assert vllm.evidence["estimated_pool_tokens"] == kv // (81_920 * 16) * 16 == 421_280
    assert vllm.status is Status.PASS
    # sglang: --tp $TP filled from the service's environment; 150,000 / 131,072 = 1.14 < 1.2
    assert sglang.evidence["tp"] == 4
    assert sglang.evidence["estimated_pool_tokens"] == 150_000
    assert sglang.status is Status.WARN
    assert report.exit_code == 0  # a warning does not block


def test_qwen_tp8_shell_script():
    report, (c,) = checks(FIX / "qwen-tp8.sh", gpu="NVIDIA-H100-80GB-HBM3")
    weights = (7_615_616_512 - 129_024) * 2 // 8
    assert c.evidence["estimated_pool_tokens"] == (int((H100 - GIB) * 0.85) - weights) // 14_336 == 4_874_172
    assert c.evidence["context_checked"] == 32_768


def test_llama_server_per_slot_context_and_unified_cache(tmp_path):
    # -c 32768 -np 4 -> 8,192 per slot; q8_0 K and V: 32*8*128 * (34/32 + 34/32) = 69,632 B/token
    _, (c,) = checks(FIX / "llama-server.sh", context_length=16_384)
    assert c.evidence["estimated_pool_tokens"] == 32_768 // 4 == 8_192
    assert c.evidence["kv_bytes_per_token"] == 32 * 8 * 128 * 34 * 2 // 32 == 69_632
    assert c.status is Status.FAIL and c.evidence["line"] == 3  # the -np line
    unified = tmp_path / "unified.sh"
    unified.write_text((FIX / "llama-server.sh").read_text().replace("-np 4", "-np 4 --kv-unified"))
    _, (u,) = checks(unified, context_length=16_384)
    assert u.evidence["estimated_pool_tokens"] == 32_768 and u.status is Status.PASS


def test_review_context_length_raises_the_checked_context():
    # vLLM's --max-model-len 131072 but users are promised 1,048,576: the larger is checked
    _, (c,) = checks(FIX / "k8s-llama8b-vllm.yaml", context_length=1_048_576)
    assert c.evidence["context_checked"] == 1_048_576
    assert c.status is Status.FAIL
    assert "refuses to start" in c.message


@pytest.mark.parametrize("dtype,bpt", [("fp8_e4m3", 2 * 32 * 8 * 128 * 1), ("bf16", 131_072)])
def test_kv_cache_dtype_flag(tmp_path, dtype, bpt):
    f = tmp_path / "run.sh"
    f.write_text(f"vllm serve meta-llama/Llama-3.1-8B-Instruct --kv-cache-dtype {dtype} --kv-cache-memory-bytes 1G\n")
    _, (c,) = checks(f)
    # 1G = 2**30 bytes; whole 16-token blocks
    assert c.evidence["kv_bytes_per_token"] == bpt
    assert c.evidence["estimated_pool_tokens"] == 2**30 // (bpt * 16) * 16


def test_dp_attention_splits_attention_tp(tmp_path):
    # Llama-3.1-70B, TP 8 with DP attention 4: attention TP 8/4 = 2 -> 8/2 = 4 KV heads per rank
    f = tmp_path / "s.sh"
    f.write_text("sglang serve --model-path meta-llama/Llama-3.1-70B-Instruct --tp 8 --dp 4 --enable-dp-attention "
                 "--max-total-tokens 1000\n")
    _, (c,) = checks(f, gpu="H200")
    assert c.evidence["kv_bytes_per_token"] == 2 * 80 * 4 * 128 * 2 == 163_840


def test_sliding_window_config_is_stated_as_an_assumption(tmp_path):
    # mistralai/Mistral-7B-v0.1's config.json declares sliding_window 4096
    model = tmp_path / "Mistral-7B-v0.1"
    model.mkdir()
    (model / "config.json").write_text(
        '{"architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,'
        ' "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,'
        ' "num_hidden_layers": 32, "num_key_value_heads": 8, "rope_theta": 10000.0,'
        ' "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32000}'
    )
    f = tmp_path / "s.sh"
    f.write_text("vllm serve mistralai/Mistral-7B-v0.1 --kv-cache-memory-bytes 8G\n")
    _, (c,) = checks(f, model_dir=tmp_path)
    assert any("sliding_window 4096" in a for a in c.evidence["assumptions"])
    # every layer counted at full length: 2 * 32 * 8 * 128 * 2 = 131,072 B/token
    assert c.evidence["kv_bytes_per_token"] == 131_072
    assert c.evidence["estimated_pool_tokens"] == 8 * 2**30 // (131_072 * 16) * 16 == 65_536


MERGED_COMPOSE = """\
x-vllm: &vllm
  image: vllm/vllm-openai:v0.32.0
  entrypoint: ["python3", "-m", "vllm.entrypoints.openai.api_server"]
  command: [--model, meta-llama/Llama-3.1-70B-Instruct, --tensor-parallel-size, "4", --max-model-len, "131072"]
x-gpu: &gpu
  deploy: {resources: {reservations: {devices: [{capabilities: [gpu]}]}}}
services:
  vllm:
    <<: [*vllm, *gpu]
  vllm-long:
    <<: *vllm
    command: [--model, meta-llama/Llama-3.1-70B-Instruct, --tensor-parallel-size, "4", --max-model-len, "1048576"]
"""

MERGED_K8S = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: llama8b}
spec:
  template:
    spec:
      nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
      containers:
        - &engine
          name: vllm
          image: vllm/vllm-openai:v0.32.0
          command: ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
          args: [--max-model-len, "131072"]
        - <<: *engine
          name: vllm-long
          args: [--max-model-len, "4194304"]
"""


def test_a_compose_launch_from_an_anchor_through_a_merge_key_is_estimated(tmp_path):
    manifest = tmp_path / "compose.yml"
    manifest.write_text(MERGED_COMPOSE)
    report, (plain, long) = checks(manifest, gpu="H100 80GB")
    assert plain.evidence["kv_bytes_per_token"] == 81_920 and plain.status is Status.PASS
    assert long.status is Status.FAIL  # its own command, not the anchor's, is the one estimated
    assert report.exit_code == 1


def test_a_kubernetes_container_merged_from_another_is_estimated_with_its_own_args(tmp_path):
    manifest = tmp_path / "deploy.yaml"
    manifest.write_text(MERGED_K8S)
    report, (plain, long) = checks(manifest)
    assert plain.status is Status.PASS and long.status is Status.FAIL
    assert report.exit_code == 1


# --- SGLang on --device cpu (the live specs in examples/specs/) -----------------------------

SPECS = Path(__file__).parents[2] / "examples" / "specs"


@pytest.mark.parametrize(("spec", "pools", "status"), [
    ("sglang-single-cpu.yaml", {"unified": 9216}, Status.PASS),
    ("sglang-pd-nixl-cpu.yaml", {"prefill": 9216, "decode": 9216}, Status.PASS),
    ("sglang-pd-incident-cpu.yaml", {"prefill": 2560, "decode": 9216}, Status.FAIL),
])
def test_sglang_on_cpu_takes_max_total_tokens_as_the_pool_without_asking_for_a_gpu(spec, pools, status):
    # SGLang sizes a CPU pool from the host's available RAM, capped by --max-total-tokens: the pools
    # the live engines log (tests/real/test_sglang_live.py compares them with these)
    report, found = checks(SPECS / spec, model_dir=MODELS / "echo")
    assert {c.evidence["role"]: c.evidence["estimated_pool_tokens"] for c in found} == pools
    assert all(c.evidence["kv_bytes_per_token"] == 512 and c.evidence["gpu"] == "cpu (host RAM)" for c in found)
    assert {c.status for c in found} == ({Status.PASS} if status is Status.PASS else {Status.PASS, status})
    assert "mem_fraction_static" not in found[0].message and "GiB/GPU" not in found[0].message, found[0].message


def test_sglang_on_cpu_without_max_total_tokens_names_the_flag_to_pass(tmp_path):
    # as a launch without a GPU: a usage error (exit 2) naming what to pass, not a guess
    launch = tmp_path / "run.sh"
    launch.write_text("python3 -m sglang.launch_server --model-path echo --device cpu --context-length 4096\n")
    with pytest.raises(ReviewError, match=r"run\.sh:1: --device cpu without --max-total-tokens: .* pass --max-total-tokens N$"):
        checks(launch, model_dir=MODELS)
