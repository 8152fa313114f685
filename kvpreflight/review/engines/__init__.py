"""One module per engine: reads its launch flags the way the engine does and estimates the KV
pool it will allocate. Each has `estimate(launch, inputs, models) -> Estimate`."""

from __future__ import annotations

import importlib
from types import ModuleType

ENGINES = {
    "sglang": "kvpreflight.review.engines.sglang",
    "vllm": "kvpreflight.review.engines.vllm",
    "llamacpp": "kvpreflight.review.engines.llamacpp",
    "builtin": "kvpreflight.review.engines.builtin",
}


def estimator(engine: str) -> ModuleType:
    return importlib.import_module(ENGINES[engine])
