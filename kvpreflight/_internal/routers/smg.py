"""smg, the Shepherd Model Gateway (SGLang's PD router; 1.13.0 seen live): GET /workers lists
each worker with its worker_type. Its other answers change while it polls its workers (/get_loads,
the fields of each /workers entry, even its 404 bodies), so it is recognised by that list alone,
after the routers with a mark of their own (the builtin router, vllm-router) were ruled out:
asked last (kvpreflight._internal.routers.ROUTERS)."""

from __future__ import annotations

from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.routers.interface import RouterAdapter, serves_list


class SmgRouter(RouterAdapter):
    kind = "smg"

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        return serves_list(client, f"{url.rstrip('/')}/workers", "workers")
