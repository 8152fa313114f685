"""Engine adapters: one module per engine kind, one registration each (kvpreflight/_internal/engine_kinds.py).

Auto-detection asks each adapter, in the registry's order, whether the server is its kind (by
what the server answers). The builtin engine comes before SGLang because it speaks SGLang's wire
format.
"""

from __future__ import annotations

import importlib

from kvpreflight._internal.engine_kinds import ENGINES
from kvpreflight._internal.engines.errors import EngineConfigError, EngineError
from kvpreflight._internal.engines.http import BodyLimit, EngineTimeout, HttpClient
from kvpreflight._internal.engines.interface import EngineAdapter


def adapter_class(kind: str) -> type[EngineAdapter]:
    """The adapter class registered for engine kind `kind` (imported only now)."""
    try:
        module_name, _, name = ENGINES[kind].adapter.partition(":")
    except KeyError:
        raise EngineConfigError(f"unknown --engine {kind!r}; choose auto or one of: {', '.join(ENGINES)}") from None
    cls: type[EngineAdapter] = getattr(importlib.import_module(module_name), name)
    if cls.kind != kind:  # what reports and records name the engine: the registration's kind
        raise EngineConfigError(f"the engine registration {kind!r} names {ENGINES[kind].adapter}, whose kind is {cls.kind!r}")
    return cls


def open_adapter(url: str, client: HttpClient, kind: str = "auto") -> EngineAdapter:
    """The adapter for the engine at url; `auto` asks each kind in turn."""
    if kind != "auto":
        return adapter_class(kind)(url, client)
    # Reachability first, so an unreachable URL says so instead of "unknown engine".
    client.get(url.rstrip("/") + "/health", max_bytes=BodyLimit.JSON_INFO)
    for name in ENGINES:
        cls = adapter_class(name)
        try:
            detected = cls.detect(url, client)
        except EngineTimeout as exc:  # a server that hangs is asked no more: each kind would wait as long
            raise EngineTimeout(f"{exc}; asked while detecting the engine kind (--engine KIND skips that)") from None
        if detected:
            return cls(url, client)
    asked = ", ".join(r.detected_by for r in ENGINES.values() if r.detected_by)
    raise EngineError(
        f"{url}: not recognised as any of {', '.join(ENGINES)} (no {asked}); pass --engine KIND if it is one of them"
    )


def answering_kind(url: str, client: HttpClient, named: str) -> str | None:
    """Which other kind of engine answers at url (None: none recognised), asked when the --engine
    kind that was named could not read it, so the error can say which engine is there."""
    for name in ENGINES:
        if name == named:
            continue
        try:
            if adapter_class(name).detect(url, client):
                return name
        except EngineError:
            return None  # a server that fails detection too says nothing more
    return None


__all__ = ["ENGINES", "EngineAdapter", "EngineConfigError", "EngineError", "HttpClient", "adapter_class", "answering_kind", "open_adapter"]
