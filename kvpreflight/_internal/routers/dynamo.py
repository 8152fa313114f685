"""NVIDIA Dynamo's frontend (`python -m dynamo.frontend`, 1.6.1 seen live) as the router in front of
its workers. Its `/health` lists every worker instance it routes to by namespace, component and
instance id, never by a URL kvpreflight can read (the workers serve no HTTP API; each one's system
port, DYN_SYSTEM_PORT, is known only to whoever started it), so the workers are given with
`--endpoint ROLE=URL` (a boot spec gives them itself). What the frontend adds is the context it
serves: `/v1/models` states it as `context_window`, which the workers' own endpoints do not."""

from __future__ import annotations

from typing import Any

from kvpreflight._internal.engines.dynamo import WORKER_ID_SETTING, is_frontend_health
from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import BodyLimit, HttpClient
from kvpreflight._internal.engines.untrusted import json_list, json_object, positive_int
from kvpreflight._internal.routers.interface import RouterAdapter, RouterListing

UNLISTED = ("Dynamo's frontend names its workers by instance id, not URL: add --endpoint ROLE=URL for each worker's "
            "system port (its DYN_SYSTEM_PORT), e.g. --endpoint prefill=http://host:8081 --endpoint decode=http://host:8082")


class DynamoFrontend(RouterAdapter):
    kind = "dynamo"

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        try:
            reply = client.get(f"{url.rstrip('/')}/health", max_bytes=BodyLimit.JSON_INFO)
            return reply.status == 200 and is_frontend_health(reply.json())
        except EngineError:
            return False

    def listing(self) -> RouterListing:
        """No worker URLs (UNLISTED says what to give instead); the context of the first model it serves."""
        models = self.client.get_json(f"{self.url}/v1/models", max_bytes=BodyLimit.JSON_INFO)
        listed = json_list(json_object(models, "/v1/models answer", self.url).get("data"), "/v1/models data", self.url)
        if not listed:
            raise EngineError(f"{self.url}/v1/models: no model listed (a Dynamo frontend lists a model only while "
                              "a worker serving it is registered)")
        first = json_object(listed[0], "/v1/models data[0]", self.url)
        context = positive_int(first.get("context_window"), "/v1/models data[0].context_window", self.url)
        health = json_object(self.client.get_json(f"{self.url}/health", max_bytes=BodyLimit.JSON_INFO), "/health answer", self.url)
        return RouterListing(self.kind, self.url, "GET /v1/models context_window", (), served_context=context,
                             unlisted=UNLISTED, instances=routed_instances(health, self.url), instance_setting=WORKER_ID_SETTING)


def routed_instances(health: dict[str, Any], url: str) -> dict[str, str]:
    """"component instance-id" -> the id as its worker's metrics label it (16 hex digits) for each
    instance the frontend's /health lists serving `generate`."""
    out: dict[str, str] = {}
    for i, item in enumerate(json_list(health.get("instances") or [], "/health instances", url)):
        entry = json_object(item, f"/health instances[{i}]", url)
        instance = entry.get("instance_id")
        if entry.get("endpoint") != "generate" or not isinstance(instance, int) or isinstance(instance, bool) \
                or not 0 <= instance < 2**64:
            continue
        out[f"{str(entry.get('component'))[:40]} {instance}"] = f"{instance:016x}"
    return out
