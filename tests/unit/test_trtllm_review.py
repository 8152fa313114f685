"""`kvpreflight review` of a trtllm-serve launch and its --config / --extra_llm_api_options YAML:
the pool it will size (kvpreflight/_internal/review/engines/trtllm.py), and the warning that a KV cache too
small for max_seq_len is cut rather than refused unless --fail_fast_on_attention_window_too_large
is set (advisory KVPF-TRTLLM-2026-001)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpreflight._internal.review import review
from kvpreflight._internal.review.estimate import ReviewInputs
from kvpreflight._internal.review.interface import ReviewError
from kvpreflight.model import Status

MODELS = Path(__file__).parents[1] / "fixtures" / "review" / "models"
CLAMP = "KVPF-TRTLLM-2026-001"
TIMEOUT = "KVPF-TRTLLM-2026-002"
# A clamp-prone deployment: the model's full context promised, the KV cache capped below it.
CAPPED = "kv_cache_config:\n  free_gpu_memory_fraction: 0.9\n  max_tokens: 65536\nmax_num_tokens: 8192\nmax_batch_size: 64\n"


def deploy(tmp_path: Path, command: str, config: str | None = None) -> Path:
    if config is not None:
        (tmp_path / "llm_api.yaml").write_text(config)
    script = tmp_path / "serve.sh"
    script.write_text(f"#!/bin/sh\n{command}\n")
    return script


def findings(script: Path, **inputs):
    report = review([script], ReviewInputs(model_dir=MODELS, gpu="H100 80GB", **inputs))
    by_id: dict[str, list] = {}
    for c in report.checks:
        by_id.setdefault(c.id, []).append(c)
    return by_id


def matched(by_id) -> set[str]:
    return {m["id"] for c in by_id.get("engine-advisories", []) for m in c.evidence.get("matched", [])}


def test_a_clamp_prone_launch_fails_the_estimate_and_warns_naming_the_fail_fast_flag(tmp_path: Path):
    script = deploy(tmp_path, "trtllm-serve Llama-3.1-8B-Instruct --max_seq_len 131072 --extra_llm_api_options llm_api.yaml", CAPPED)
    by_id = findings(script)
    (estimate,) = by_id["kv-capacity-estimate"]
    assert estimate.status is Status.FAIL
    assert estimate.evidence["estimated_pool_tokens"] == 65_536  # max_tokens caps it; memory would hold more
    assert estimate.evidence["context_checked"] == 131_072 and "--max_seq_len" in estimate.evidence["context_source"]
    assert "cuts max_seq_len" in estimate.message and "--fail_fast_on_attention_window_too_large" in estimate.message
    (advisory,) = by_id["engine-advisories"]
    assert advisory.status is Status.WARN and CLAMP in matched(by_id)
    assert "fail_fast_on_attention_window_too_large" in advisory.message
    assert advisory.endpoint == f"{script}:2"


@pytest.mark.parametrize("command, config", [
    ("trtllm-serve Llama-3.1-8B-Instruct --max_seq_len 131072 --config llm_api.yaml --fail_fast_on_attention_window_too_large", CAPPED),
    ("trtllm-serve serve Llama-3.1-8B-Instruct --max_seq_len 131072 --config llm_api.yaml",
     CAPPED + "fail_fast_on_attention_window_too_large: true\n"),
])
def test_with_fail_fast_on_no_clamp_warning_and_the_engine_refuses_to_start(tmp_path: Path, command: str, config: str):
    by_id = findings(deploy(tmp_path, command, config))
    assert CLAMP not in matched(by_id)
    (estimate,) = by_id["kv-capacity-estimate"]
    assert estimate.status is Status.FAIL and "refuses to start" in estimate.message


def test_the_yaml_overrides_the_flags_and_a_fitting_pool_passes(tmp_path: Path):
    config = "kv_cache_config:\n  free_gpu_memory_fraction: 0.5\nmax_seq_len: 32768\nmax_batch_size: 64\n"
    script = deploy(tmp_path, "trtllm-serve Llama-3.1-8B-Instruct --kv_cache_free_gpu_memory_fraction 0.95 "
                              "--max_seq_len 131072 --config llm_api.yaml", config)
    (estimate,) = findings(script)["kv-capacity-estimate"]
    assert estimate.evidence["free_gpu_memory_fraction"] == 0.5
    assert estimate.evidence["context_checked"] == 32_768
    # half of ~62 GiB free after the 8B weights (15 GiB), the profiling band and 1 GiB context:
    # well over 32,768 tokens of 131,072 B, and never more than half the GPU
    assert 32_768 * 1.2 < estimate.evidence["estimated_pool_tokens"] <= estimate.evidence["estimated_pool_tokens_high"]
    assert estimate.evidence["estimated_pool_tokens_high"] * 131_072 < 0.5 * 81559 * 2**20
    assert estimate.status is Status.PASS, estimate.message


def test_without_max_seq_len_the_models_length_is_checked(tmp_path: Path):
    (estimate,) = findings(deploy(tmp_path, "trtllm-serve Llama-3.1-8B-Instruct"))["kv-capacity-estimate"]
    assert estimate.evidence["context_checked"] == 131_072
    assert any("infers it from the model config" in a for a in estimate.evidence["assumptions"])


def test_a_missing_options_file_is_one_line_naming_it(tmp_path: Path):
    script = deploy(tmp_path, "trtllm-serve Llama-3.1-8B-Instruct --config /etc/trtllm/missing.yaml")
    with pytest.raises(ReviewError, match=r"serve\.sh:2: --config /etc/trtllm/missing\.yaml: no such file") as err:
        findings(script)
    assert "\n" not in str(err.value)


def test_a_yaml_that_is_not_a_mapping_is_refused(tmp_path: Path):
    script = deploy(tmp_path, "trtllm-serve Llama-3.1-8B-Instruct --config llm_api.yaml", "- 1\n- 2\n")
    with pytest.raises(ReviewError, match="not a YAML mapping of LLM API options"):
        findings(script)


def test_the_disaggregated_router_is_not_an_engine_launch_and_its_workers_are(tmp_path: Path):
    script = deploy(tmp_path, "trtllm-serve disaggregated -c disagg.yaml &\n"
                              "trtllm-serve Llama-3.1-8B-Instruct --max_seq_len 8192 --server_role context &\n"
                              "trtllm-serve Llama-3.1-8B-Instruct --max_seq_len 8192 --server_role generation")
    by_id = findings(script)
    assert sorted(e.evidence["role"] for e in by_id["kv-capacity-estimate"]) == ["decode", "prefill"]
    assert {c.evidence["line"] for c in by_id["engine-advisories"]} == {3, 4}  # the router (line 2) is no engine
    with pytest.raises(ReviewError, match="no engine launch command"):
        findings(deploy(tmp_path, "trtllm-serve disaggregated -c disagg.yaml"))


def test_a_context_worker_gets_the_transfer_timeout_advisory_unless_the_timeout_is_off(tmp_path: Path):
    by_id = findings(deploy(tmp_path, "trtllm-serve Llama-3.1-8B-Instruct --max_seq_len 8192 --server_role context"))
    assert TIMEOUT in matched(by_id)
    assert by_id["kv-capacity-estimate"][0].evidence["role"] == "prefill"
    off = "cache_transceiver_config:\n  backend: NIXL\n  kv_transfer_timeout_ms: null\n"
    by_id = findings(deploy(tmp_path, "trtllm-serve Llama-3.1-8B-Instruct --max_seq_len 8192 --server_role context "
                                      "--config llm_api.yaml", off))
    assert TIMEOUT not in matched(by_id)
    unified = findings(deploy(tmp_path, "trtllm-serve Llama-3.1-8B-Instruct --max_seq_len 8192"))
    assert TIMEOUT not in matched(unified)
