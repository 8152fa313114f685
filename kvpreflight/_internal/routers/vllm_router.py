"""vllm-router (vLLM's PD router, 0.1.17 seen live): GET /workers lists each worker with its
worker_type and counts them in "stats"; GET /list_workers answers {"urls": [...]} (smg has no
such route)."""

from __future__ import annotations

import re

from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.engines.log_patterns import REQUEST_ID, LogSignal
from kvpreflight._internal.routers.interface import RouterAdapter, serves_list


class VllmRouter(RouterAdapter):
    kind = "vllm-router"
    # routers/http/vllm_pd_router.rs (0.1.17): the prefill's answer carried no kv_transfer_params,
    # so the decode gets none and computes the prompt itself. The line names the prefill's URL,
    # not the request.
    log_signals = (LogSignal("No kv_transfer_params for prefill ..., decode will proceed without kv_transfer_params",
                             re.compile(rf"No kv_transfer_params for prefill \S{REQUEST_ID} decode will proceed without")),)

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        return serves_list(client, f"{url.rstrip('/')}/list_workers", "urls")
