"""vllm-router (vLLM's PD router, 0.1.17 seen live): GET /workers lists each worker with its
worker_type and counts them in "stats"; GET /list_workers answers {"urls": [...]} (smg has no
such route)."""

from __future__ import annotations

from kvpreflight.engines.http import HttpClient
from kvpreflight.routers.interface import RouterAdapter, serves_list


class VllmRouter(RouterAdapter):
    kind = "vllm-router"

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        return serves_list(client, f"{url.rstrip('/')}/list_workers", "urls")
