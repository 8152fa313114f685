"""A throwaway engine kind, `toy`: a vLLM fork that names itself in /v1/models' `owned_by`. The one
adapter file a new engine needs (tests/unit/test_engine_registry.py adds its registration line)."""

from __future__ import annotations

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import BodyLimit, EngineTimeout, HttpClient
from kvpreflight._internal.engines.vllm import VllmAdapter


class ToyAdapter(VllmAdapter):
    kind = "toy"

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        try:
            models = client.get(f"{url.rstrip('/')}/v1/models", max_bytes=BodyLimit.JSON_INFO)
            return models.status == 200 and models.json()["data"][0].get("owned_by") == "toy"
        except EngineTimeout:
            raise
        except (EngineError, KeyError, IndexError, TypeError, AttributeError):
            return False
