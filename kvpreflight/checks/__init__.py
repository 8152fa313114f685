"""Checks: pure functions from what the engines said (snapshots) and what the probes got back
to results with evidence. The only place verdicts are made. One module per check id."""

from __future__ import annotations

import importlib
from types import ModuleType

from kvpreflight.checks.interface import CheckContext, run_checks

# Stable ids (the JSON report and waivers use them), in report order.
CHECK_IDS = (
    "kv-capacity",
    "kv-sources-agree",
    "overcapacity-rejected",
    "prompt-integrity",
    "max-tokens-clamp",
    "concurrent-capacity",
    "engine-healthy-after",
    "tenant-isolation",
    "prefix-cache-isolation",
    "pd-transfer",
    "pd-consistency",
    "engine-advisories",
)


def check_module(check_id: str) -> ModuleType:
    return importlib.import_module(f"kvpreflight.checks.{check_id.replace('-', '_')}")


__all__ = ["CHECK_IDS", "CheckContext", "check_module", "run_checks"]
