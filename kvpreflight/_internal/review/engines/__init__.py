"""One module per engine: reads its launch flags the way the engine does and estimates the KV
pool it will allocate. Each has `estimate(launch, inputs, models) -> Estimate`; which module is an
engine's is its registration's `review` (kvpreflight/_internal/engine_kinds.py)."""

from __future__ import annotations

import importlib
from types import ModuleType

from kvpreflight._internal.engine_kinds import ENGINES


def estimators() -> dict[str, str]:
    """Engine kind -> the module that estimates its pool, for every engine review estimates."""
    return {kind: r.review for kind, r in ENGINES.items() if r.review is not None}


def estimator(engine: str) -> ModuleType:
    return importlib.import_module(estimators()[engine])
