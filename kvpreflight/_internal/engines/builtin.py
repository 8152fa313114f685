"""kvpreflight's own builtin engine. It speaks SGLang 0.5.23's wire format but is its own kind,
with its own version (`kvpreflight-builtin <version>`) and its own advisories."""

from __future__ import annotations

from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.engines.sglang import SglangAdapter, _is_builtin, _server_info


class BuiltinAdapter(SglangAdapter):
    kind = "builtin"

    @classmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        info = _server_info(url, client, required=False)
        return info is not None and _is_builtin(info)
