"""Router adapters: one module per PD router kind, one registry line each. They tell which
engines stand behind an entry and in which role (`check --entry ROUTER` without --endpoint)."""

from __future__ import annotations

import importlib

from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.routers.interface import RouterAdapter, RouterListing, RouterWorker

# Asked in this order: smg is recognised only by its worker list, which the others serve too.
ROUTERS: dict[str, str] = {
    "dynamo": "kvpreflight._internal.routers.dynamo:DynamoFrontend",
    "builtin": "kvpreflight._internal.routers.builtin:BuiltinRouter",
    "vllm-router": "kvpreflight._internal.routers.vllm_router:VllmRouter",
    "smg": "kvpreflight._internal.routers.smg:SmgRouter",
}


def router_class(kind: str) -> type[RouterAdapter]:
    module_name, _, cls = ROUTERS[kind].partition(":")
    return getattr(importlib.import_module(module_name), cls)


def open_router(url: str, client: HttpClient) -> RouterAdapter | None:
    """The adapter for the router at url, or None when it is none of the known kinds."""
    for kind in ROUTERS:
        cls = router_class(kind)
        if cls.detect(url, client):
            return cls(url, client)
    return None


__all__ = ["ROUTERS", "RouterAdapter", "RouterListing", "RouterWorker", "open_router", "router_class"]
