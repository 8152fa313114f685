"""Checks: pure functions from what the engines said (snapshots) and what the probes got back
to results with evidence. The only place verdicts are made. One module per check id."""

from __future__ import annotations

import importlib
from types import ModuleType

from kvpreflight._internal.check_ids import CHECK_IDS, CheckId, Scope
from kvpreflight._internal.checks.interface import CheckContext, run_checks


def check_module(check_id: str) -> ModuleType:
    return importlib.import_module(f"kvpreflight._internal.checks.{check_id.replace('-', '_')}")


def ids_of(scope: Scope) -> list[str]:
    """The check ids of one scope, in report order (each check module declares its SCOPE)."""
    return [c for c in CHECK_IDS if check_module(c).SCOPE is scope]


__all__ = ["CHECK_IDS", "CheckContext", "CheckId", "Scope", "check_module", "ids_of", "run_checks"]
