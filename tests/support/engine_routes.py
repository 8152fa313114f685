"""What each engine kind answers on its info endpoints, from the bodies captured from (or copied
out of the source of) the real engines in tests/fixtures, as routes for tests/static_server.py.

`info_routes(kind)` is an engine that answers every read kvpreflight makes before it sends a
probe; tests override one route to make it misbehave."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent.parent / "fixtures"
JSON = "application/json"
METRICS = "text/plain; version=0.0.4"

# kind -> route -> fixture file (relative to tests/fixtures)
_INFO: dict[str, dict[str, str]] = {
    "sglang": {"GET /server_info": "sglang/server_info_prefill.json", "GET /v1/models": "sglang/v1_models.json",
               "GET /metrics": "sglang/metrics_prefill.txt"},
    "vllm": {"GET /version": "vllm/version.json", "GET /v1/models": "vllm/models.json", "GET /metrics": "vllm/metrics.txt"},
    "llamacpp": {"GET /props": "llamacpp/props.json", "GET /slots": "llamacpp/slots.json",
                 "GET /v1/models": "llamacpp/models.json", "GET /metrics": "llamacpp/metrics.txt"},
    "tgi": {"GET /info": "tgi/info.json", "GET /metrics": "tgi/metrics.txt"},
    # trtllm-serve's /metrics is the iteration stats' JSON (its Prometheus text is /prometheus/metrics)
    "trtllm": {"GET /v1/models": "trtllm/models.json", "GET /version": "trtllm/version.json",
               "GET /metrics": "trtllm/metrics.json"},
}
KINDS = tuple(_INFO)


def info_routes(kind: str, **overrides: Any) -> dict[str, Any]:
    """Routes of an honest `kind` engine's info endpoints (and /health); `overrides` replace
    routes by name ("GET /v1/models"), a None value removes one."""
    routes: dict[str, Any] = {"GET /health": (200, JSON, b"")}
    for route, name in _INFO[kind].items():
        routes[route] = (200, METRICS if route.endswith("/metrics") else JSON, (FIXTURES / name).read_bytes())
    for route, value in overrides.items():
        if value is None:
            routes.pop(route, None)
        else:
            routes[route] = value
    return routes


def info_paths(kind: str) -> tuple[str, ...]:
    """The JSON info endpoints (not /metrics) kvpreflight reads from a `kind` engine."""
    return tuple(route for route in _INFO[kind] if not route.endswith("/metrics"))
