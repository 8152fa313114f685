"""The engines' own start-up warnings about the context they serve: a context overridden past the
model's positions (SGLang, vLLM) and TensorRT-LLM's clamps of its attention window, its longest
sequence and its longest input. Each is read as a `ContextWarning` (its fixed wording, its
numbers, the fix in the engine's settings), never as the line itself; the checks decide which
check each one fails (checks/engine_warnings.py).

Every engine's wording is read in any engine's start-up log, whatever the adapter's kind
(`EngineAdapter.read`): the wordings cannot be confused with one another, and the builtin
engine's faults copy them. TensorRT-LLM's adapter (engines/trtllm.py) gives only the lines of the
KV cache that serves: its PyTorch backend's trial cache logs clamps of its own. A tenant's text
that an engine logs can only add a warning (a fail), never hide one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kvpreflight._internal.engines.log_patterns import log_lines
from kvpreflight.model import ContextHazard, ContextWarning

# The same words raised as the error that stopped a start-up (the override was not allowed): that
# engine served nothing, so no danger. SGLang and vLLM both end the raised message so.
REFUSED = re.compile(r"To allow overriding this maximum")

N = r"\d{1,12}"  # a count a warning states (bounded: a tenant's digits cost linear time)


@dataclass(frozen=True)
class ContextSignal:
    """One engine's warning, as a pattern with named groups `stated` and `tokens` (a number, or a
    list of numbers of which the largest counts)."""

    what: str
    pattern: re.Pattern[str]
    hazards: tuple[ContextHazard, ...]
    fix: Callable[[int | None], str]  # the fix, given the limit that really holds
    refused_if: re.Pattern[str] | None = None  # the line is the raised error instead: no danger


def _positions_fix(setting: str, override: str) -> Callable[[int | None], str]:
    def fix(tokens: int | None) -> str:
        to = f"to {tokens:,} (the model's positions)" if tokens else "to the model's positions"
        return (f"lower {setting} {to} and unset {override}, or serve a model (or a RoPE scaling of it) "
                "whose positions reach the context")
    return fix


# The TensorRT engine path honours it (trtGptModelInflightBatching.cpp throws instead of cutting);
# whether every PyTorch-backend release does is not read here, hence "where its backend honours it".
_FAIL_FAST = ("start it with --fail_fast_on_attention_window_too_large (trtllm-serve; the LLM API's "
              "fail_fast_on_attention_window_too_large, where its backend honours it) so that it refuses to start "
              "instead of cutting")


def _window_fix(tokens: int | None) -> str:
    return ("give the KV cache room for one whole sequence (a larger kv_cache_config.free_gpu_memory_fraction or "
            f"max_tokens, fewer other allocations) or lower --max_seq_len to what it holds, and {_FAIL_FAST}")


def _sequence_fix(tokens: int | None) -> str:
    held = f"{tokens:,} tokens" if tokens else "what it holds"
    return (f"give the KV cache room for one sequence of the context you serve, or lower --max_seq_len and the "
            f"stated context to {held}; and {_FAIL_FAST}")


SIGNALS = (
    # SGLang python/sglang/srt/configs/model_config.py _derive_context_length (0.5.23; 0.4.6 has
    # the same first two sentences, without "Note that ..."): logged as a warning when
    # SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN allows the override (0.4.6: allowed by default),
    # raised with "To allow overriding this maximum, ..." when not. The draft model's variant
    # ("Target model's context_length ...") is left out: the target verifies every draft token.
    ContextSignal(
        "User-specified context_length ... is greater than the derived context_length ... "
        "This may lead to incorrect model outputs or CUDA errors.",
        re.compile(rf"User-specified context_length \((?P<stated>{N})\) is greater than the derived "
                   rf"context_length \((?P<tokens>{N})\)\. This may lead to incorrect model outputs"),
        (ContextHazard.POSITIONS,),
        _positions_fix("--context-length", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"), REFUSED),
    # vLLM _get_and_verify_max_len: vllm/config/model.py (0.32), logger.warning_once("%s %s", msg,
    # "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. ..."); vllm/config.py (0.8.5),
    # "%s Make sure the value is correct and within the model context size." (msg ending "This may
    # lead to incorrect model outputs or CUDA errors."). Both only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1;
    # otherwise raised with "To allow overriding this maximum, ...". The derived length is a float
    # after a RoPE scaling factor ("131072.0").
    ContextSignal(
        "User-specified max_model_len ... is greater than the derived max_model_len ...",
        re.compile(rf"User-specified max_model_len \((?P<stated>{N})\) is greater than the derived "
                   rf"max_model_len \((?P<key>\w{{1,100}})=(?P<tokens>{N})(?:\.\d{{1,6}})?[ )]"),
        (ContextHazard.POSITIONS,),
        _positions_fix("--max-model-len", "VLLM_ALLOW_LONG_MAX_MODEL_LEN"), REFUSED),
    # TensorRT-LLM cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp (NVIDIA/TensorRT-LLM
    # b35ac1b, version 1.2.0rc2), adjustMaxAttentionWindow, TLLM_LOG_WARNING, unless
    # failFastOnAttentionWindowTooLarge: "maxAttentionWindowVec too large to fit at least one
    # sequence in kvCache. Old: %s, New: %s" (common::vec2str), then, where the longest sequence
    # exceeds the new largest window, "maxSequenceLen is reduced to maxAttentionWindow: %d" and
    # "maxInputLen is reduced to %d".
    ContextSignal(
        "maxAttentionWindowVec too large to fit at least one sequence in kvCache.",
        re.compile(r"maxAttentionWindowVec too large to fit at least one sequence in kvCache\. "
                   r"Old: [\[(](?P<stated>[\d, ]{1,400})[\])], "
                   r"New: [\[(](?P<tokens>[\d, ]{1,400})[\])]"),
        (ContextHazard.WINDOW,), _window_fix),
    ContextSignal(
        "maxSequenceLen is reduced to maxAttentionWindow: N",
        re.compile(rf"maxSequenceLen is reduced to maxAttentionWindow: (?P<tokens>{N})"),
        (ContextHazard.SEQUENCE,), _sequence_fix),
    ContextSignal(
        "maxInputLen is reduced to N",
        re.compile(rf"maxInputLen is reduced to (?P<tokens>{N})"),
        (ContextHazard.SEQUENCE,), _sequence_fix),
    # The same clamp in one line: trtGptModelInflightBatching.cpp of earlier releases (TLLM_LOG_WARNING
    # "... they are reduced to %d", then "maxInputLen is reduced to %d") and the PyTorch backend's
    # KVCacheManager (tensorrt_llm/_torch/pyexecutor/resource_manager.py, logger.warning(f"...
    # They are reduced to {max_atten_window_upper_bound}")). Both the window and the longest
    # sequence are cut, so it concerns both.
    ContextSignal(
        "maxAttentionWindow and maxSequenceLen are too large for at least one sequence to fit in kvCache. "
        "They are reduced to N",
        re.compile(rf"maxAttentionWindow and maxSequenceLen are too large for at least one sequence to fit in "
                   rf"kvCache\. [Tt]hey are reduced to (?P<tokens>{N})"),
        (ContextHazard.WINDOW, ContextHazard.SEQUENCE), _window_fix),
    # The PyTorch backend's later wording (resource_manager.py _validate_and_adjust_attention_windows,
    # NVIDIA/TensorRT-LLM main): "Attention window size %d exceeds upper bound %d for available
    # blocks. Reducing to %d.", then "Adjusted max_seq_len to %d".
    ContextSignal(
        "Attention window size ... exceeds upper bound ... for available blocks. Reducing to N.",
        re.compile(rf"Attention window size (?P<stated>{N}) exceeds upper bound (?P<tokens>{N}) for available blocks"),
        (ContextHazard.WINDOW,), _window_fix),
    ContextSignal(
        "Adjusted max_seq_len to N",
        re.compile(rf"Adjusted max_seq_len to (?P<tokens>{N})\b"),
        (ContextHazard.SEQUENCE,), _sequence_fix),
)


def context_warnings(text: str) -> tuple[ContextWarning, ...]:
    """Every context warning of any engine in a start-up log, each once (every rank prints its own)."""
    found: dict[ContextWarning, None] = {}
    for line in log_lines(text):
        for signal in SIGNALS:
            m = signal.pattern.search(line)
            if m is None or (signal.refused_if is not None and signal.refused_if.search(line, m.end())):
                continue
            tokens, stated = _largest(m.group("tokens")), _largest(m.groupdict().get("stated"))
            for hazard in signal.hazards:
                fix = (_sequence_fix if hazard is ContextHazard.SEQUENCE else signal.fix)(tokens)
                found[ContextWarning(what=signal.what, hazard=hazard, tokens=tokens, stated=stated, fix=fix)] = None
    return tuple(found)


def _largest(numbers: str | None) -> int | None:
    """The largest count in a number or a list of them (each at most 12 digits, so plausible)."""
    counts = [int(d) for d in re.findall(N, numbers or "")]
    return max(counts) if counts else None
