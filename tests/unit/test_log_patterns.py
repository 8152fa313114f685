"""Log patterns are linear in the line (issue 28): engines log request text, so a tenant can write
a line of start-up phrases repeated without end. Every pattern kvpreflight reads an engine's or a
router's log with reads such a 10 MiB line in under a second, and a whole log as long as the read
cap, made of such lines as long as the line cap, in a few seconds (a pattern that rescans to the
end of the line from every repetition takes minutes on either)."""

from __future__ import annotations

import re
import time

import pytest

from kvpreflight._internal.engines import ENGINES, adapter_class, llamacpp, sglang, tgi, vllm
from kvpreflight._internal.engines.log_patterns import MAX_LOG_LINE_CHARS, log_lines
from kvpreflight._internal.files import FileKind
from kvpreflight._internal.routers import ROUTERS, router_class

TEN_MIB = 10 << 20

# Each start-up pattern with the phrase a hostile line repeats (its fixed start, what it waits for missing).
PATTERNS: dict[str, tuple[re.Pattern[str], str]] = {
    "sglang KV Cache is allocated": (sglang.ALLOCATOR_LINE, "] KV Cache is allocated. "),
    "sglang KV Cache VA upper bound": (sglang.VA_BOUND_LINE, "] KV Cache VA upper bound. "),
    "sglang max_total_num_tokens": (sglang.SCHEDULER_LINE, "max_total_num_tokens=5,"),
    "sglang small pool warning": (sglang.SMALL_POOL_WARNING, "KV pool holds 5 tokens, "),
    "llama.cpp llama_kv_cache": (llamacpp.ALLOCATOR_LINE, "llama_kv_cache: size = ( 5 cells,"),
    "llama.cpp n_slots": (llamacpp.SLOTS_LINE, "n_slots = 1, n_ctx_slot = 2, "),
    "vllm KV cache size": (vllm.ALLOCATOR_LINE, "GPU KV cache size: 1,"),
    "vllm kv_role": (vllm.KV_ROLE_LINE, "kv_role = '"),
    "tgi max batch total tokens": (tgi.ALLOCATOR_LINE, "Setting max batch total tokens to "),
}


def _signals() -> dict[str, tuple[re.Pattern[str], str]]:
    out = {}
    for name in ENGINES:
        for signal in adapter_class(name).log_signals:
            out[f"{name} signal {signal.what}"] = (signal.pattern, signal.what.split("...")[0])
    for name in ROUTERS:
        for signal in router_class(name).log_signals:
            out[f"{name} signal {signal.what}"] = (signal.pattern, signal.what.split("...")[0])
    return out


ALL = {**PATTERNS, **_signals()}


def _read(pattern: re.Pattern[str], text: str) -> None:
    for line in log_lines(text):  # as the adapters and the log watch read a log
        pattern.search(line)


@pytest.mark.parametrize("name", sorted(ALL))
def test_a_10_mib_line_of_one_phrase_repeated_is_read_in_under_a_second(name: str) -> None:
    pattern, phrase = ALL[name]
    line = phrase * (TEN_MIB // len(phrase)) + "\n"
    started = time.process_time()
    _read(pattern, line)
    assert time.process_time() - started < 1.0


@pytest.mark.parametrize("name", ["sglang KV Cache is allocated", "llama.cpp llama_kv_cache", "sglang max_total_num_tokens"])
def test_a_whole_log_of_line_cap_long_hostile_lines_is_read_in_seconds(name: str) -> None:
    """The line cap bounds a line; within it the pattern itself must be linear."""
    pattern, phrase = ALL[name]
    line = phrase * (MAX_LOG_LINE_CHARS // len(phrase)) + "\n"
    started = time.process_time()
    _read(pattern, line * (FileKind.LOG.cap // len(line)))
    assert time.process_time() - started < 10.0


def test_the_adapters_still_read_their_real_lines_through_the_bounded_patterns() -> None:
    readings, _ = sglang.parse_sglang_log(
        "[2026-01-01 00:00:00 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 681280, K size: 1 GB\n"
        + "x" * (MAX_LOG_LINE_CHARS * 2) + "\n"  # a tenant's long line between
        + "[2026-01-01 00:00:01 TP0] max_total_num_tokens=681280, chunked_prefill_size=16384, max_prefill_tokens=16384, "
          "max_running_requests=48, context_len=131072, available_gpu_mem=10.5 GB\n")
    assert sorted(r.tokens for r in readings) == [681280, 681280], readings
    m = llamacpp.ALLOCATOR_LINE.search("llama_kv_cache: size =    0.50 MiB (  4096 cells,   2 layers,  4/4 seqs), K (f16)")
    assert m is not None and (m["cells"], m["seqs"], m["maxseqs"]) == ("4096", "4", "4")
