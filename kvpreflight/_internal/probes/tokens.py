"""Valid token ids for probes: only the engine's own tokenizer makes them."""

from __future__ import annotations

from collections.abc import Iterable

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.interface import EngineAdapter


def valid_token_ids(entry: EngineAdapter, engines: Iterable[EngineAdapter], count: int, seed: str) -> list[int]:
    """`count` ids from the entry's tokenizer; a router without one (sglang_router) falls back to
    the engines behind it, which serve the same model (pd-consistency checks that)."""
    try:
        return entry.token_ids(count, seed)
    except EngineError as first:
        for engine in engines:
            try:
                return engine.token_ids(count, seed)
            except EngineError:
                continue
        raise first
