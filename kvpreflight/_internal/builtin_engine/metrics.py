"""Prometheus text for /metrics with SGLang 0.5.23's metric names and labels.

Names checked against sglang/srt/observability/metrics_collector.py (0.5.23). Our own additions
keep the `sglang:` prefix and say so in their help text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvpreflight._internal.builtin_engine.core import Engine


@dataclass
class ServedCounters:
    """What /metrics reports; mutated only through `Engine.count`, under its counter lock."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_requests: int = 0
    cached_tokens: int = 0
    cache_queries: int = 0
    cache_hits: int = 0
    transfers_sent: int = 0
    transfers_received: int = 0
    transfer_pages: int = 0
    transfer_tokens: int = 0  # prompt tokens whose KV this engine sent (prefill) or received (decode)
    transfer_failed: int = 0
    bootstrap_failed: int = 0
    deferred_release: int = 0
    deferred_release_seconds: float = 0.0
    running: int = 0
    aborted_requests: int = 0  # the client left before the answer was complete
    retracted: int = 0  # decoding requests that gave their pages back to wait for more (Engine.grow)


def _fmt(value: float) -> str:
    return repr(float(value))


def render(engine: Engine) -> str:
    c = engine.counters
    labels = (
        f'model_name="{engine.config.model_name}",engine_type="{engine.role.value}",tp_rank="0",pp_rank="0"'
    )
    pool = engine.reported_pool_tokens
    # misreport-pool: the used/available numbers stay consistent with the (false) total.
    used = engine.used_tokens()
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, value: float, extra: str = "") -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lab = labels + ("," + extra if extra else "")
        lines.append(f"{name}{{{lab}}} {_fmt(value)}")

    metric("sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.", pool)
    metric("sglang:context_len", "gauge", "Context length of the served model.", engine.context_len)
    metric("sglang:page_size", "gauge", "Number of tokens per KV cache page.", engine.page_size)
    metric("sglang:num_pages", "gauge", "Number of KV cache pages.", pool // engine.page_size)
    metric("sglang:token_usage", "gauge", "The token usage.", used / pool if pool else 0.0)
    metric("sglang:num_used_tokens", "gauge", "The number of used tokens.", used)
    metric("sglang:kv_available_tokens", "gauge", "Available KV cache tokens.", pool - used)
    metric("sglang:num_running_reqs", "gauge", "The number of running requests.", c.running)
    metric("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", c.cache_hits / c.cache_queries if c.cache_queries else 0.0)
    streaming = 'is_streaming="false"'
    metric("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", c.prompt_tokens, streaming)
    metric("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", c.generation_tokens, streaming)
    metric("sglang:num_requests_total", "counter", "Number of requests processed.", c.num_requests, streaming)
    metric("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.", c.aborted_requests)
    metric("sglang:cached_tokens_total", "counter", "Number of cached prompt tokens by source (device/host/storage).", c.cached_tokens,
           'cache_source="device"')
    metric("sglang:num_transfer_failed_reqs_total", "counter", "Number of requests whose KV transfer failed.", c.transfer_failed)
    metric("sglang:num_bootstrap_failed_reqs_total", "counter", "Number of requests whose bootstrap failed.", c.bootstrap_failed)
    metric("sglang:decode_deferred_kv_release_total", "counter", "Decode KV releases deferred until the transfer drained.",
           c.deferred_release)
    name = "sglang:decode_deferred_kv_release_seconds"
    lines.append(f"# HELP {name} Time a cancelled request's decode KV release was deferred until its transfer drained.")
    lines.append(f"# TYPE {name} histogram")
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {_fmt(c.deferred_release)}')
    lines.append(f"{name}_sum{{{labels}}} {_fmt(c.deferred_release_seconds)}")
    lines.append(f"{name}_count{{{labels}}} {_fmt(c.deferred_release)}")
    metric("sglang:kv_transfers_total", "counter", "kvpreflight-builtin: KV transfers completed (sent on prefill, received on decode).",
           c.transfers_sent + c.transfers_received)
    metric("sglang:kv_transfer_tokens_total", "counter",
           "kvpreflight-builtin: prompt tokens whose KV moved by transfers (sent on prefill, received on decode).", c.transfer_tokens)
    metric("sglang:kv_transfer_pages_total", "counter", "kvpreflight-builtin: KV pages written by transfers on this engine.",
           c.transfer_pages)
    metric("sglang:prefix_cache_queries_total", "counter", "kvpreflight-builtin: prefix cache lookups.", c.cache_queries)
    metric("sglang:prefix_cache_hits_total", "counter", "kvpreflight-builtin: prefix cache lookups that reused at least one page.",
           c.cache_hits)
    return "\n".join(lines) + "\n"
