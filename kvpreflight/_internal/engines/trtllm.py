"""TensorRT-LLM (`trtllm-serve`, PyTorch backend by default). It needs a GPU, so this adapter is
built from its source and tested against bodies and log lines copied from it
(tests/fixtures/trtllm/README.md says where each comes from): `tensorrt_llm/serve/openai_server.py`
(routes, `ErrorResponse` bodies), `serve/openai_protocol.py` (`ModelCard.owned_by`
"tensorrt_llm"; `CompletionRequest` needs `model` and takes no `cache_salt`), `llmapi/llm.py` `_check_arguments` (length refusals),
`cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp` (the allocator line) and the iteration-stats
JSON of `/metrics` (`kvCacheStats`).

Capacity: the allocator's start-up line "[MemUsageChange] Allocated X GiB for max tokens in paged
KV cache (N)." (the last one counts: the PyTorch backend sizes a trial cache first, measures, and
rebuilds it) and, beside it, `/metrics` `kvCacheStats.maxNumBlocks * tokensPerBlock` (a count of
every block, host-offload ones too, so never the GPU pool on its own). Neither is served at
start-up over HTTP: `/metrics` holds iteration stats only after a request (and, on the PyTorch
backend, only with `enable_iter_perf_stats: true`); reading it drains them.

What it serves: `/v1/models` states no context length; the executor's line "max_seq_len=N,
max_num_requests=..., max_num_tokens=N" states the one it kept after its clamps. By default a KV
cache too small for max_seq_len does not stop it: it cuts max_seq_len (and the attention window)
to what fits and says so only in its log (engines/context_warnings.py reads those lines; they fail
kv-capacity), unless started with --fail_fast_on_attention_window_too_large.

Prompts are token ids on `/v1/completions`; the ids come from `POST /_internal/tokenize`, which
releases after 1.2 serve; without it, no prompt of a known length can be built and the probes are
not measured (the capacity reading still is).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from kvpreflight._internal.engines.context_warnings import context_warnings
from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import BodyLimit, HttpClient
from kvpreflight._internal.engines.interface import Counters, EngineRequest, cycle_to, role_of
from kvpreflight._internal.engines.log_patterns import log_lines
from kvpreflight._internal.engines.openai_completions import OpenAICompletionsMixin, owned_with_version
from kvpreflight._internal.engines.untrusted import (
    error_reply_message,
    json_list,
    json_object,
    log_count,
    metric_sum,
    optional_object,
    positive_int,
    served_model,
)
from kvpreflight.model import EngineSnapshot, Origin, PoolReading, Role

# cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp allocatePools: TLLM_LOG_INFO("[MemUsageChange]
# Allocated %0.2f GiB for max tokens in paged KV cache (%d).", ..., blocksInPrimaryPool * tokensPerBlock)
ALLOCATOR_LINE = re.compile(r"Allocated \d{1,9}(?:\.\d{1,6})? GiB for max tokens in paged KV cache \((?P<tokens>\d{1,13})\)")
# The PyTorch backend's info line once its KV cache is built (as a 1.1.0rc3 start-up log prints it,
# tests/fixtures/trtllm): the max_seq_len it kept after its clamps, and the most tokens one step
# computes (a longer prompt is refused while chunked prefill is off).
LIMITS_LINE = re.compile(r"\bmax_seq_len=(?P<seq>\d{1,12}), max_num_requests=\d{1,12}, max_num_tokens=(?P<tokens>\d{1,12})")
# "AttentionRuntimeFeatures(chunked_prefill=False, ...)": whether a prompt may exceed max_num_tokens.
CHUNKED_LINE = re.compile(r"AttentionRuntimeFeatures\(chunked_prefill=(?P<on>True|False)\b")
# kvCacheManager.cpp (TensorRT backend): "Number of blocks in KV cache secondary pool: N, onboard blocks
# to primary memory before reuse: ...": the host-offload blocks /metrics' maxNumBlocks counts too.
SECONDARY_LINE = re.compile(r"Number of blocks in KV cache secondary pool: (?P<blocks>\d{1,12})")
# "max_seq_len is not specified, using inferred value N": the model config's length was taken.
INFERRED_LINE = re.compile(r"max_seq_len is not specified, using inferred value (?P<seq>\d{1,12})")
# The PyTorch backend sizes its KV cache twice (tensorrt_llm/_torch/pyexecutor/_util.py
# KvCacheCreator): a trial cache of about max_num_tokens, a profiling run, this line, then the real
# cache. The trial cache is cut below max_seq_len whenever the model is longer than it, so its clamp
# lines say nothing about the cache that serves (a 1.1.0rc3 log: "Adjusted max_seq_len to 8224",
# then the real cache, 86720).
TRIAL_END_LINE = re.compile(r"Estimated max memory in KV cache : ")
# The iteration stats `/metrics` answers (executor IterationStats as JSON; the TensorRT backend
# always, the PyTorch backend with enable_iter_perf_stats).
STATS_HINT = ("no KV-cache stats in /metrics yet (it holds iteration stats only after a request; the PyTorch backend "
              "needs enable_iter_perf_stats: true in --config/--extra_llm_api_options); pass --log with the start-up "
              "log for the allocator's line")


class TrtllmAdapter(OpenAICompletionsMixin):
    kind = "trtllm"
    # Prometheus text is mounted at /prometheus/metrics (only with return_perf_metrics); /metrics is
    # the iteration stats' JSON (`iteration_stats`).
    metrics_path = "/prometheus/metrics"
    # serve/openai_protocol.py: only ChatCompletionRequest has `cache_salt`; CompletionRequest (the
    # token-id route) has none and forbids fields it does not know (HTTP 400), so tenants cannot be
    # salted on /v1/completions.
    takes_cache_salt = False
    # llmapi/llm.py _check_arguments: the PyTorch backend refuses a prompt over max_num_tokens
    # while chunked prefill is off ("The sum of prompt length (P), query length (Q) should not
    # exceed max_num_tokens (N)"; later "The prompt length (P) should not exceed max_num_tokens (N)"),
    # the TensorRT backend prompt + max_tokens over max_seq_len ("... should not exceed max_seq_len (N)");
    # executor/base_worker.py _deduce_max_tokens, a prompt that leaves no room for one token
    # ("`default_max_tokens` (-N) must be greater than 0, ..."; older: "Deduced max_tokens -N is
    # less than 0, because prompt length P plus query length Q is larger than max_seq_len N").
    length_error_patterns = (
        r"should not exceed max_num_tokens \(\d+\)",
        r"should not exceed max_seq_len \(\d+\)",
        r"`default_max_tokens` \(-?\d+\) (?:must|should) be greater than 0",
        r"is larger than max_seq_len \d+",
    )

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        # serve/openai_protocol.py ModelCard: owned_by "tensorrt_llm"; /version {"version": ...}.
        return owned_with_version(url, client, "tensorrt_llm")

    # -- reading ---------------------------------------------------------------------------
    def serving_log(self, log_text: str) -> str:
        # Only the context warnings of the cache that serves count: those of the PyTorch backend's
        # trial cache (before its last "Estimated max memory in KV cache") say nothing of it.
        return served_pass(log_text)[0]

    def snapshot(self, *, role: Role | None = None, log_text: str | None = None) -> EngineSnapshot:
        model_name, _ = served_model(self.client.get_json(f"{self.url}/v1/models", max_bytes=BodyLimit.JSON_INFO), self.url)
        version = json_object(self.client.get_json(f"{self.url}/version", max_bytes=BodyLimit.JSON_INFO),
                              "/version answer", self.url).get("version")
        readings: list[PoolReading] = []
        notes: list[str] = []
        settings: dict[str, Any] = {}
        page_size = None
        log = parse_trtllm_log(log_text) if log_text is not None else None
        stats = self.iteration_stats()
        if stats is None:
            notes.append("/metrics not served")
        else:
            kv = _last_kv_stats(stats, self.url)
            if kv is None:
                notes.append(STATS_HINT)
            else:
                blocks = positive_int(kv.get("maxNumBlocks"), "/metrics kvCacheStats.maxNumBlocks", self.url)
                page_size = positive_int(kv.get("tokensPerBlock"), "/metrics kvCacheStats.tokensPerBlock", self.url)
                if blocks and page_size:
                    # maxNumBlocks is every block the BlockManager holds (kvCacheManager.h getMaxNumBlocks:
                    # mAllBlocksById), host-offload (secondary) blocks too: the GPU pool only once the log
                    # states the secondary pool, or beside the allocator's line (the smaller counts).
                    secondary = log.secondary_blocks if log is not None else None
                    if secondary is not None:
                        readings.append(PoolReading("metrics kvCacheStats (maxNumBlocks - secondary pool blocks)*tokensPerBlock",
                                                    Origin.SCHEDULER, max(blocks - secondary, 0) * page_size))
                    elif log is not None and log.readings:
                        readings.append(PoolReading("metrics kvCacheStats maxNumBlocks*tokensPerBlock", Origin.SCHEDULER,
                                                    blocks * page_size))
                    else:
                        notes.append(f"/metrics kvCacheStats holds {blocks * page_size:,} tokens of blocks, host-offload "
                                     "blocks included where kv_cache_config.host_cache_size is set, so it is not taken for "
                                     "the GPU pool; pass --log with the start-up log for the allocator's line")
        served: int | None = None
        max_request: int | None = None
        if log is not None and log_text is not None:
            readings.extend(log.readings)
            notes.extend(log.notes)
            settings.update(log.settings)
            served = log.max_seq_len
            if context_warnings(served_pass(log_text)[1]):
                notes.append("clamp warnings of the PyTorch backend's trial KV cache (before \"Estimated max memory in KV "
                             "cache\") are not counted: it measures memory and rebuilds the cache after them")
            if log.chunked_prefill is False and log.max_num_tokens:
                max_request = log.max_num_tokens
        else:
            notes.append("trtllm-serve states the max_seq_len it kept only in its start-up log; pass --log with it")
        if not readings:
            notes.append("no KV pool size read (pass --log with trtllm-serve's start-up log for the allocator's line)")
        if role is not None and role is not Role.UNIFIED:
            notes.append(f"role {role.value} given on the command line; trtllm-serve states no role over HTTP "
                         "(a disaggregated worker is started with --server_role context|generation)")
        stated_role = role_of(role, None)
        return EngineSnapshot(
            url=self.url, engine=self.kind, version=str(version) if version is not None else None,
            role=stated_role[0], role_source=stated_role[1], model=model_name, served_context=served,
            pool_readings=tuple(readings), page_size=page_size, max_request_tokens=max_request,
            settings=settings, notes=tuple(notes),
        )

    def iteration_stats(self) -> list[Any] | None:
        """`GET /metrics`: the executor's iteration stats (a JSON list, drained by each read); None
        when not served (404)."""
        reply = self.client.get(f"{self.url}/metrics", max_bytes=BodyLimit.METRICS)
        if reply.status == 404:
            return None
        if reply.status != 200:
            raise EngineError(f"{self.url}/metrics: HTTP {reply.status}")
        return json_list(reply.json(), "/metrics answer (iteration stats)", self.url)

    def counters(self) -> Counters:
        metrics = self.metrics()
        # metrics/collector.py MetricsCollector (prometheus_client counters, "_total" names)
        return Counters(
            requests=metric_sum(metrics, "trtllm_request_success_total"),
            prompt_tokens=metric_sum(metrics, "trtllm_prompt_tokens_total"),
            generation_tokens=metric_sum(metrics, "trtllm_generation_tokens_total"),
        )

    def max_accepted_prompt(self, snapshot: EngineSnapshot) -> int | None:
        # prompt + max_tokens (1) must fit max_seq_len; while chunked prefill is off the PyTorch
        # backend also refuses a prompt over max_num_tokens (llmapi/llm.py _check_arguments).
        limits = [n for n in (snapshot.served_context - 1 if snapshot.served_context else None,
                              snapshot.max_request_tokens) if n]
        return min(limits) if limits else None

    # -- sending ---------------------------------------------------------------------------
    def build_request(self, ids: list[int], *, max_tokens: int, stream: bool,
                      extra: Mapping[str, Any] | None = None) -> EngineRequest:
        if not self.model:  # CompletionRequest.model is required: the name /v1/models lists, once
            self.model, _ = served_model(self.client.get_json(f"{self.url}/v1/models", max_bytes=BodyLimit.JSON_INFO), self.url)
        return super().build_request(ids, max_tokens=max_tokens, stream=stream, extra=extra)

    def token_ids(self, count: int, seed_text: str) -> list[int]:
        # serve/openai_server.py (after 1.2): POST /_internal/tokenize {"prompt"} -> {"count", "tokens"}
        reply = self.client.post(f"{self.url}/_internal/tokenize", {"prompt": seed_text})
        if reply.status != 200:
            raise EngineError(
                f"{self.url}/_internal/tokenize: {error_reply_message(reply.status, reply.body)}; this trtllm-serve serves "
                "no tokenizer route (releases up to 1.2 have none), and kvpreflight builds its token-id prompts from "
                "the engine's own tokenizer")
        tokens = json_object(reply.json(), "/_internal/tokenize answer", self.url).get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise EngineError(f"{self.url}/_internal/tokenize: no token list in the answer")
        return cycle_to(tokens, count)


class TrtllmLog:
    """What trtllm-serve's start-up log says about its KV cache and its limits."""

    def __init__(self) -> None:
        self.readings: list[PoolReading] = []
        self.notes: list[str] = []
        self.settings: dict[str, Any] = {}
        self.max_seq_len: int | None = None
        self.max_num_tokens: int | None = None
        self.chunked_prefill: bool | None = None
        self.secondary_blocks: int | None = None  # host-offload blocks, where the log states them


def parse_trtllm_log(text: str) -> TrtllmLog:
    """The last allocator line (the PyTorch backend first builds a trial cache, then the real one),
    the limits the executor kept, and the settings those lines state."""
    out = TrtllmLog()
    allocated: int | None = None
    for line in log_lines(text):
        if m := ALLOCATOR_LINE.search(line):
            allocated = log_count(m["tokens"], "max tokens in paged KV cache")
        if m := LIMITS_LINE.search(line):
            out.max_seq_len = log_count(m["seq"], "max_seq_len")
            out.max_num_tokens = log_count(m["tokens"], "max_num_tokens")
        if m := CHUNKED_LINE.search(line):
            out.chunked_prefill = out.settings["enable_chunked_prefill"] = m["on"] == "True"
        if m := SECONDARY_LINE.search(line):
            out.secondary_blocks = log_count(m["blocks"], "blocks in KV cache secondary pool")
        if m := INFERRED_LINE.search(line):
            out.settings["max_seq_len_inferred"] = log_count(m["seq"], "inferred max_seq_len")
    if allocated is not None:
        out.readings.append(PoolReading("log: Allocated ... for max tokens in paged KV cache", Origin.ALLOCATOR, allocated))
    if out.max_seq_len is not None:
        out.settings["max_seq_len"] = out.max_seq_len
        out.settings["max_num_tokens"] = out.max_num_tokens
    return out


def served_pass(text: str) -> tuple[str, str]:
    """The log from the PyTorch backend's real KV cache on, and the trial before it ("" when the
    log shows no trial: every line then counts)."""
    last = next(reversed(list(TRIAL_END_LINE.finditer(text))), None)
    if last is None:
        return text, ""
    return text[last.end():], text[:last.start()]


def _last_kv_stats(stats: list[Any], url: str) -> dict[str, Any] | None:
    """The newest iteration's kvCacheStats (each entry an object, or its JSON text as
    LLM.get_stats documents it); None when no iteration carries one."""
    for i in range(len(stats) - 1, -1, -1):
        entry = stats[i]
        if isinstance(entry, str):
            try:
                entry = json.loads(entry)
            except ValueError:
                raise EngineError(f"{url}/metrics: iteration stat {i} is text that is not JSON") from None
        entry = json_object(entry, f"/metrics[{i}]", url)
        kv = optional_object(entry.get("kvCacheStats"), f"/metrics[{i}].kvCacheStats", url)
        if kv:
            return kv
    return None

