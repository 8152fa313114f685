"""Token ids from an engine's own `/tokenize` (SGLang's, vLLM's and llama.cpp's answer alike)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.engines.interface import cycle_to
from kvpreflight._internal.engines.untrusted import json_object


def tokenized(client: HttpClient, url: str, body: Mapping[str, Any], count: int) -> list[int]:
    """`count` token ids from the engine's own `/tokenize` (SGLang's, vLLM's and llama.cpp's answer
    `{"tokens": [ids]}`), its tokens of the seed text in `body` repeated to the length."""
    reply = client.post(f"{url}/tokenize", dict(body))
    if reply.status != 200:
        raise EngineError(f"{url}/tokenize: HTTP {reply.status}; kvpreflight needs the engine's tokenizer to build valid token ids")
    tokens = json_object(reply.json(), "/tokenize answer", url).get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise EngineError(f"{url}/tokenize: no token list in the answer")
    return cycle_to(tokens, count)
