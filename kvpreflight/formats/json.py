"""JSON report (schema_version 1). Also the canonical dict that the signed record embeds."""

from __future__ import annotations

import json
from typing import Any

from kvpreflight.formats.interface import ReportFormat
from kvpreflight.model import CheckResult, EngineSnapshot, Report


def engine_to_dict(e: EngineSnapshot) -> dict[str, Any]:
    sources: dict[str, int] = {}
    for r in e.pool_readings:
        key = r.source if r.rank is None else f"{r.source}[{r.rank}]"
        sources[key] = r.tokens
    return {
        "url": e.url,
        "engine": e.engine,
        "version": e.version,
        "role": e.role.value,
        "model": e.model,
        "kv_pool_tokens": e.pool_tokens(),
        "kv_pool_sources": sources,
        "kv_pool_origins": sorted({r.origin.value for r in e.pool_readings}),
        "context_length": e.served_context,
        "page_size": e.page_size,
        "settings": dict(e.settings),
        "notes": list(e.notes),
    }


def check_to_dict(c: CheckResult) -> dict[str, Any]:
    return {
        "id": c.id,
        "status": c.status.value,
        "endpoint": c.endpoint,
        "message": c.message,
        "evidence": dict(c.evidence),
    }


def report_to_dict(report: Report) -> dict[str, Any]:
    return {
        "schema_version": report.schema_version,
        "tool": {"name": "kvpreflight", "version": report.tool_version},
        "verdict": report.verdict.value,
        "exit_code": report.exit_code,
        "started_at": report.started_at,
        "finished_at": report.finished_at,
        "entry": report.entry,
        "context_length_promised": report.context_length_promised,
        "engines": [engine_to_dict(e) for e in report.engines],
        "checks": [check_to_dict(c) for c in report.checks],
        "waivers": [{"check_id": w.check_id, "reason": w.reason} for w in report.waivers],
        "gpus": [dict(g) for g in report.gpus],
    }


class JsonFormat(ReportFormat):
    name = "json"

    def render(self, report: Report) -> str:
        return json.dumps(report_to_dict(report), indent=2, sort_keys=False, default=str) + "\n"
