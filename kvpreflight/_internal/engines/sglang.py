"""SGLang (0.5.x). Shapes and messages copied from SGLang 0.5.23's source:
`srt/entrypoints/http_server.py` (/server_info, /generate, SSE error frames),
`srt/managers/tp_worker.py` (max_req_input_len, the small-pool warning),
`srt/managers/utils.py` validate_input_length, `srt/managers/tokenizer_manager.py`
(context-length messages), `srt/mem_cache/memory_pool.py` (allocator log line),
`srt/observability/metrics_collector.py` (metric names).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import BodyLimit, EngineTimeout, HttpClient, HttpReply
from kvpreflight._internal.engines.interface import Counters, EngineAdapter, EngineRequest, ReplyFacts, role_of, transfer_time
from kvpreflight._internal.engines.log_patterns import REQUEST_ID, LogSignal, gap, log_lines
from kvpreflight._internal.engines.tokenize import tokenized
from kvpreflight._internal.engines.untrusted import (
    json_list,
    json_object,
    log_count,
    metric_sum,
    optional_object,
    optional_text,
    positive_int,
    served_model,
    token_count,
)
from kvpreflight.model import EngineSnapshot, Hazard, KvDeadline, Origin, PoolReading, Role

# memory_pool.py: "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 681280, KV size: 12.34 GB"
# Only the main pool: labelled pools ("draft KV Cache", "MiniMax ... KV Cache") are other caches.
ALLOCATOR_LINE = re.compile(rf"(?:^|\] )KV Cache is allocated\. {gap('KV Cache is allocated. ')}#tokens: (?P<tokens>\d+)")
# The VA-reservation mode prints an upper bound, not an allocation: noted, never counted.
VA_BOUND_LINE = re.compile(rf"(?:^|\] )KV Cache VA upper bound\. {gap('KV Cache VA upper bound. ')}#tokens: (?P<tokens>\d+)")
# scheduler.py (tp_rank 0): "max_total_num_tokens=681280, chunked_prefill_size=..., context_len=1048576, ..."
SCHEDULER_LINE = re.compile(rf"max_total_num_tokens=(?P<tokens>\d+),{gap('max_total_num_tokens=')}context_len=(?P<ctx>\d+)")
# tp_worker.py (0.5.23): "KV pool holds %d tokens, fewer than --context-length %d."
SMALL_POOL_WARNING = re.compile(r"KV pool holds (\d+) tokens, fewer than --context-length (\d+)")
RANK_PREFIX = re.compile(r"\b((?:DP|TP|PP|EP)\d+(?:\s+(?:DP|TP|PP|EP)\d+)*)\]?")


class SglangAdapter(EngineAdapter):
    kind = "sglang"
    request_id_field = "rid"  # GenerateReqInput.rid (0.5.23): the id its log lines name
    log_signals = (
        # srt/disaggregation/common/conn.py (0.5.23): _check_waiting_timeout (decode: the KV did not
        # arrive within SGLANG_DISAGGREGATION_WAITING_TIMEOUT, KVPoll.WaitingForInput) and
        # _check_bootstrap_timeout (prefill or decode: the other side did not answer within
        # SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, KVPoll.Bootstrapping) fail the request, whose
        # "... transfer failed for request" line quotes the record_failure reason; each also logs a
        # warning once a process. Before the generic transfer lines: the first signal a line matches counts.
        *(LogSignal(f"{side} transfer failed for request: timed out in KVPoll.{poll}", re.compile(
            rf"{side} transfer failed for request {gap(side + ' transfer failed for request ')}rid='?(?P<rid>[^'\s]{REQUEST_ID})"
            rf".{{0,400}}?timed out after [\d.]+s in KVPoll\.{poll}"), Hazard.HANDOFF_TIMEOUT, setting=setting)
          for side in ("Decode", "Prefill")
          for poll, setting in (("WaitingForInput", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"),
                                ("Bootstrapping", "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"))),
        LogSignal("Some requests fail to receive KV Cache transfer done signal after bootstrapping",
                  re.compile(r"Some requests fail to receive KV Cache transfer done signal after bootstrapping"),
                  Hazard.HANDOFF_TIMEOUT, setting="SGLANG_DISAGGREGATION_WAITING_TIMEOUT"),
        LogSignal("Some requests timed out when bootstrapping", re.compile(r"Some requests timed out when bootstrapping"),
                  Hazard.HANDOFF_TIMEOUT, setting="SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"),
    ) + tuple(LogSignal(what, re.compile(pattern)) for what, pattern in (
        # srt/disaggregation/decode.py and prefill.py (0.5.23): each aborts the request it names.
        ("Decode handshake failed for request",
         rf"Decode handshake failed for request {gap('Decode handshake failed for request ')}rid='?(?P<rid>[^'\s]{REQUEST_ID})"),
        ("Decode transfer failed for request",
         rf"Decode transfer failed for request {gap('Decode transfer failed for request ')}rid='?(?P<rid>[^'\s]{REQUEST_ID})"),
        ("Prefill transfer failed for request",
         rf"Prefill transfer failed for request {gap('Prefill transfer failed for request ')}rid='?(?P<rid>[^'\s]{REQUEST_ID})"),
        ("Context corruption detected", rf"Context corruption detected: Request (?P<rid>\S{REQUEST_ID})"),
    )) + (
        # srt/disaggregation/decode.py (0.5.23) _verify_kv_checksums, with
        # --disaggregation-enable-kv-checksum: logger.error, then the request is aborted (HTTP 500).
        LogSignal("KV checksum mismatch", re.compile(
            rf"KV checksum mismatch (?:on a peer rank )?req=(?P<rid>\S{REQUEST_ID}) bootstrap_room="), Hazard.KV_CORRUPT),
        # srt/kv_canary/runner/violation_reporter.py (0.5.23) _format_violation, "Format frozen":
        # one line per violation, logged (--kv-canary log) or raised (raise); reasons are FailReason
        # names, lower case, "_mismatch" dropped, joined by "+".
        LogSignal("kv_canary violation", re.compile(
            r"kv_canary violation: launch_tag=(?P<launch_tag>\w+(?:\(\d+\))?) fail_reason=(?P<fail_reason>[a-z_+]+) "
            r"slot_idx=(?P<slot_idx>\d+) position=(?P<position>-?\d+) stored_token=(?P<stored_token>-?\d+) "
            r"expected_token=(?P<expected_token>-?\d+)"),
            Hazard.KV_CANARY, ("slot_idx", "position", "fail_reason", "stored_token", "expected_token", "launch_tag")),
        # srt/kv_canary/runner/stats_logger.py (0.5.23), every SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS
        # steps: the violations counted so far (a stats line with none is no signal).
        LogSignal("[canary] ... violations=N (counted so far)", re.compile(
            r"\[canary\] step=\d+ protected_tokens=\d+ sweep_passes=\d+ violations=(?P<violations>[1-9]\d*)"),
            Hazard.KV_CANARY, ("violations",)),
    )
    length_error_patterns = (
        r"is longer than the model's context length",
        r"exceeds the maximum allowed length",
        r"exceeds the model's maximum context length",
        r"exceeds the maximum number of tokens",
        r"context length",
    )

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        info = _server_info(url, client, required=False)
        return info is not None and "max_total_num_tokens" in info and not _is_builtin(info)

    # -- reading ---------------------------------------------------------------------------
    def snapshot(self, *, role: Role | None = None, log_text: str | None = None) -> EngineSnapshot:
        info = _server_info(self.url, self.client, required=True)
        assert info is not None
        readings: list[PoolReading] = []
        notes: list[str] = []

        tokens = positive_int(info.get("max_total_num_tokens"), "/server_info max_total_num_tokens", self.url)
        if tokens:
            readings.append(PoolReading("/server_info max_total_num_tokens", Origin.SCHEDULER, tokens))
        for i, state in enumerate(json_list(info.get("internal_states") or [], "/server_info internal_states", self.url)):
            where = f"/server_info internal_states[{i}]"
            usage = optional_object(optional_object(state, where, self.url).get("memory_usage"), f"{where}.memory_usage", self.url)
            cap = positive_int(usage.get("token_capacity"), f"{where}.memory_usage.token_capacity", self.url)
            if cap:
                readings.append(PoolReading("/server_info internal_states.memory_usage.token_capacity", Origin.SCHEDULER, cap, f"dp{i}"))

        metrics = self.metrics()
        metric_role = None
        metric_context = None
        page_size = positive_int(info.get("page_size"), "/server_info page_size", self.url)
        if metrics is None:
            notes.append("/metrics not served (start SGLang with --enable-metrics for a second scheduler view)")
        else:
            for labels, value in metrics.get("sglang:max_total_num_tokens", []):
                rank = _rank_of(labels)
                readings.append(PoolReading("metrics sglang:max_total_num_tokens", Origin.SCHEDULER,
                                            positive_int(value, "sglang:max_total_num_tokens", self.url) or 0, rank))
                metric_role = metric_role or labels.get("engine_type")
            for _, value in metrics.get("sglang:context_len", []):
                metric_context = positive_int(value, "sglang:context_len", self.url)
            if page_size is None:
                for _, value in metrics.get("sglang:page_size", []):
                    page_size = positive_int(value, "sglang:page_size", self.url)

        if log_text is not None:
            log_readings, log_notes = parse_sglang_log(log_text)
            readings.extend(log_readings)
            notes.extend(log_notes)

        models = self.client.get_json(f"{self.url}/v1/models", max_bytes=BodyLimit.JSON_INFO)
        model_name, served = served_model(models, self.url)
        if served is None:
            served = positive_int(info.get("context_length"), "/server_info context_length", self.url) or metric_context

        # disaggregation_mode "prefill" | "decode" | "null" (not disaggregated); the metrics' engine_type says the same.
        mode = str(info.get("disaggregation_mode") or metric_role or "").lower()
        reported_role = {"prefill": Role.PREFILL, "decode": Role.DECODE}.get(mode, Role.UNIFIED) if mode else None
        settings: dict[str, Any] = {
            key: info.get(key)
            for key in (
                "allow_auto_truncate", "disable_radix_cache", "disaggregation_mode", "disaggregation_transfer_backend",
                "disaggregation_enable_kv_checksum", "kv_canary", "enable_metrics", "max_total_tokens",
                "mem_fraction_static", "tp_size", "dp_size", "page_size", "chunked_prefill_size",
            )
            if key in info
        }
        # srt/arg_groups/fields/observability.py (0.5.14 to 0.5.23): kv_canary none|log|raise, default
        # "none"; absent from builds before the canary.
        canary = optional_text(info.get("kv_canary"), "/server_info kv_canary", self.url)
        for key in ("kv_canary_real_data", "kv_canary_sweep_interval"):
            if key in info:
                settings[key] = info[key]
        radix_off = info.get("disable_radix_cache")  # --disable-radix-cache turns the prefix cache off
        if role is not None and reported_role is not None and role != reported_role:
            notes.append(f"role {role.value} given on the command line; the engine reports {reported_role.value}")
        final_role, role_source = role_of(role, reported_role)
        return EngineSnapshot(
            url=self.url,
            engine=self.kind,
            version=str(info.get("version")) if info.get("version") is not None else None,
            role=final_role,
            role_source=role_source,
            model=(model_name or optional_text(info.get("served_model_name"), "/server_info served_model_name", self.url)
                   or optional_text(info.get("model_path"), "/server_info model_path", self.url)),
            served_context=served,
            pool_readings=tuple(readings),
            page_size=page_size,
            max_request_tokens=positive_int(info.get("max_req_input_len"), "/server_info max_req_input_len", self.url),
            settings=settings,
            notes=tuple(notes),
            prefix_caching=not radix_off if isinstance(radix_off, bool) else None,
            kv_canary=canary.lower() if canary is not None else None,
            pd_timeouts=pd_timeouts(info, final_role, self.url),
        )

    def counters(self) -> Counters:
        metrics = self.metrics()
        prompt = metric_sum(metrics, "sglang:prompt_tokens_total")
        cached = metric_sum(metrics, "sglang:cached_tokens_total")  # tokens; prompt_tokens_total includes them
        computed = prompt - cached if prompt is not None and cached is not None else None
        # What this engine's own prefill batches computed and found in its cache: SGLang's
        # realtime_tokens_total, counted per prefill batch (srt/observability/metrics_collector.py
        # increment_realtime_tokens; modes prefill_compute, prefill_cache, decode). Seen live (0.5.23,
        # P/D over Mooncake and NIXL): a decode's prompt_tokens_total and cached_tokens_total repeat
        # the prefill's numbers for every transferred request (4,000 and 3,999 on the decode for a
        # prompt the prefill had cached), while its prefill_compute never moves: prompt - cached is
        # the decode's own compute only where this family is missing (older builds, the builtin engine).
        if metrics and metrics.get("sglang:realtime_tokens_total"):
            modes = [(labels.get("mode"), value) for labels, value in metrics["sglang:realtime_tokens_total"]]
            computed = sum(v for mode, v in modes if mode == "prefill_compute")
            cached = sum(v for mode, v in modes if mode == "prefill_cache")
        latency_ms = metric_sum(metrics, "sglang:kv_transfer_latency_ms_sum")  # observability/metrics_collector.py (0.5.23)

        def counted_from_first(name: str) -> float | None:
            # srt/observability/metrics_collector.py (0.5.23): these counters carry labels, and a
            # labelled prometheus_client counter is on the page only from its first increment (seen
            # live: no sample, no HELP line until then). On a page SGLang serves (its pool gauge on
            # it), an absent one has counted nothing: read as 0, so a first failure during a check
            # is a delta, not an unknown.
            value = metric_sum(metrics, name)
            return 0.0 if value is None and metrics and metrics.get("sglang:max_total_num_tokens") else value

        return Counters(
            requests=metric_sum(metrics, "sglang:num_requests_total"),
            # srt/observability/metrics_collector.py (0.5.23), counted by the tokenizer manager on abort.
            aborted_requests=counted_from_first("sglang:num_aborted_requests_total"),
            prompt_tokens=prompt,
            prefilled_tokens=computed,
            cached_prompt_tokens=cached,
            generation_tokens=metric_sum(metrics, "sglang:generation_tokens_total"),
            transfer_failures=counted_from_first("sglang:num_transfer_failed_reqs_total"),
            bootstrap_failures=counted_from_first("sglang:num_bootstrap_failed_reqs_total"),
            deferred_releases=counted_from_first("sglang:decode_deferred_kv_release_total"),
            kv_transfers=metric_sum(metrics, "sglang:kv_transfers_total"),
            kv_transfer_tokens=metric_sum(metrics, "sglang:kv_transfer_tokens_total"),
            prefix_cache_hits=metric_sum(metrics, "sglang:prefix_cache_hits_total", "sglang:cached_tokens_total"),
            used_tokens=metric_sum(metrics, "sglang:num_used_tokens"),
            extra=transfer_time(None if latency_ms is None else latency_ms / 1000,
                                metric_sum(metrics, "sglang:kv_transfer_latency_ms_count")),
        )

    def max_accepted_prompt(self, snapshot: EngineSnapshot) -> int | None:
        # tp_worker.py: max_req_input_len = min(context_len - 1, pool - 1) - 5, and
        # validate_input_length refuses len >= max_req_input_len.
        limit = snapshot.max_request_tokens
        if limit is None:
            pool, ctx = snapshot.pool_tokens(), snapshot.served_context
            if pool is None or ctx is None:
                return None
            limit = min(ctx - 1, pool - 1) - 5
        return limit - 1

    # -- sending ---------------------------------------------------------------------------
    def token_ids(self, count: int, seed_text: str) -> list[int]:
        return tokenized(self.client, self.url, {"prompt": seed_text, "add_special_tokens": False}, count)

    def build_request(self, ids: list[int], *, max_tokens: int, stream: bool,
                      extra: Mapping[str, Any] | None = None) -> EngineRequest:
        body: dict[str, Any] = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0},
            "stream": stream,
        }
        body.update(extra or {})
        return EngineRequest(path="/generate", body=body, sent_tokens=len(ids), max_tokens=max_tokens, stream=stream)

    def parse_reply(self, request: EngineRequest, reply: HttpReply) -> ReplyFacts:
        data = reply.json()
        if isinstance(data, list):  # batch answers; we send one prompt
            data = data[0] if data else {}
        return _facts(data, reply.url, "answer")

    def parse_events(self, request: EngineRequest, events: list[Any]) -> ReplyFacts:
        # SGLang's frames are cumulative: the last says it all
        return _facts(events[-1] if events else {}, f"{self.url}{request.path}", "last stream frame")


def _facts(data: Any, url: str, what: str) -> ReplyFacts:
    data = json_object(data, what, url)
    meta = optional_object(data.get("meta_info"), f"{what} meta_info", url)
    finish = meta.get("finish_reason")
    text = str(data.get("text") or "")
    completion = token_count(meta.get("completion_tokens"), f"{what} meta_info.completion_tokens", url)
    prompt = token_count(meta.get("prompt_tokens"), f"{what} meta_info.prompt_tokens", url)
    if isinstance(finish, dict):
        finish_type = optional_text(finish.get("type"), f"{what} meta_info.finish_reason.type", url)
        if finish_type == "abort":  # a refusal inside a 200 answer
            return ReplyFacts(text=text, error_message=str(finish.get("message") or "aborted"), finish_reason="abort",
                              completion_tokens=completion, prompt_tokens=prompt)
    else:
        finish_type = optional_text(finish, f"{what} meta_info.finish_reason", url)
    return ReplyFacts(
        text=text, completion_tokens=completion, prompt_tokens=prompt,
        cached_tokens=token_count(meta.get("cached_tokens"), f"{what} meta_info.cached_tokens", url), finish_reason=finish_type,
    )


def parse_sglang_log(text: str) -> tuple[list[PoolReading], list[str]]:
    readings: list[PoolReading] = []
    notes: list[str] = []
    for line in log_lines(text):
        rank = _rank_in_line(line)
        if m := ALLOCATOR_LINE.search(line):
            readings.append(PoolReading("log: KV Cache is allocated #tokens", Origin.ALLOCATOR,
                                        log_count(m["tokens"], "KV Cache #tokens"), rank))
        elif m := VA_BOUND_LINE.search(line):
            notes.append(f"log reports a KV VA upper bound of {log_count(m['tokens'], 'KV VA upper bound #tokens')} tokens "
                         "(a reservation, not an allocation; not counted)")
        if m := SCHEDULER_LINE.search(line):
            readings.append(PoolReading("log: scheduler max_total_num_tokens", Origin.SCHEDULER,
                                        log_count(m["tokens"], "max_total_num_tokens"), rank))
        if m := SMALL_POOL_WARNING.search(line):
            notes.append(f"engine log warns: KV pool holds {m[1]} tokens, fewer than --context-length {m[2]}")
    return readings, notes


def _rank_in_line(line: str) -> str | None:
    head = line[:80]
    m = re.search(r"\b(DP\d+)?\s*(TP\d+)\b", head)
    if not m:
        return None
    return " ".join(p for p in m.groups() if p).lower()


def _rank_of(labels: Mapping[str, str]) -> str | None:
    parts = [f"{k.split('_')[0]}{labels[k]}" for k in ("dp_rank", "tp_rank", "pp_rank") if k in labels and labels[k] != ""]
    return " ".join(parts) or None


# srt/environ.py (0.5.23): EnvInt(300) each; the prefill waits BOOTSTRAP_TIMEOUT for its decode,
# the decode WAITING_TIMEOUT for the KV. SGLang's /server_info does not state them (an environment
# setting); the builtin engine does, under these keys.
PD_TIMEOUTS = {Role.PREFILL: ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "disaggregation_bootstrap_timeout_s"),
               Role.DECODE: ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "disaggregation_waiting_timeout_s")}
DEFAULT_PD_TIMEOUT_S = 300


def pd_timeouts(info: Mapping[str, Any], role: Role, url: str) -> tuple[KvDeadline, ...]:
    if role not in PD_TIMEOUTS:
        return ()
    setting, key = PD_TIMEOUTS[role]
    stated = positive_int(info.get(key), f"/server_info {key}", url)
    return (KvDeadline(seconds=stated if stated is not None else DEFAULT_PD_TIMEOUT_S, setting=setting, stated=stated is not None),)


def _server_info(url: str, client: HttpClient, *, required: bool) -> dict[str, Any] | None:
    for path in ("/server_info", "/get_server_info"):
        try:
            reply = client.get(f"{url.rstrip('/')}{path}", max_bytes=BodyLimit.JSON_INFO)
        except EngineTimeout:
            raise
        except EngineError:
            if required:
                raise
            return None
        if reply.status == 200:
            try:
                return json_object(reply.json(), f"{path} answer", url.rstrip("/"))
            except EngineError:
                if required:
                    raise
                return None
    if required:
        raise EngineError(f"{url}: no /server_info (is this an SGLang server?)")
    return None


def _is_builtin(info: Mapping[str, Any]) -> bool:
    return str(info.get("version", "")).startswith("kvpreflight-builtin")
