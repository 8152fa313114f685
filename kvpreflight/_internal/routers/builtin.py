"""kvpreflight's builtin router (`kvpreflight engine serve --role router`): GET /workers, told
apart by its Server header."""

from __future__ import annotations

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import BodyLimit, HttpClient
from kvpreflight._internal.routers.interface import RouterAdapter

SERVER_HEADER = "kvpreflight-builtin-router"  # builtin_engine/router.py RouterHandler.server_version


class BuiltinRouter(RouterAdapter):
    kind = "builtin"

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        try:
            reply = client.get(f"{url.rstrip('/')}/workers", max_bytes=BodyLimit.JSON_INFO)
        except EngineError:
            return False
        return reply.status == 200 and reply.headers.get("server", "").startswith(SERVER_HEADER)
