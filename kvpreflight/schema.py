"""The report schema: a Report as a JSON-ready dict and back. One set of key names, used by the
JSON format, the release record and the fleet.

`report_to_dict` is what `--format json` writes (`schema_version` 1, keys documented in the
README); `report_from_dict` reads it back into the same typed Report (unknown keys are ignored, so
a record's predicate, which adds its own keys, reads too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpreflight.errors import ConfigError
from kvpreflight.model import (
    REPORT_SCHEMA_VERSION,
    CheckResult,
    Cost,
    EngineCost,
    EngineSnapshot,
    Origin,
    PoolReading,
    Report,
    Role,
    RoleSource,
    Status,
    Waiver,
)

__all__ = ["SCHEMA_VERSION", "SchemaError", "report_from_dict", "report_to_dict"]

SCHEMA_VERSION = REPORT_SCHEMA_VERSION  # the JSON report's schema (and the fleet JSON's, which follows it)
TOOL_NAME = "kvpreflight"


class SchemaError(ConfigError):
    """A report dict that does not follow the schema (a damaged or foreign file)."""


def tool(version: str) -> dict[str, str]:
    return {"name": TOOL_NAME, "version": version}


def reading_to_dict(r: PoolReading) -> dict[str, Any]:
    return {"source": r.source, "origin": r.origin.value, "tokens": r.tokens, "rank": r.rank}


def engine_to_dict(e: EngineSnapshot) -> dict[str, Any]:
    return {
        "url": e.url,
        "engine": e.engine,
        "version": e.version,
        "role": e.role.value,
        "role_source": e.role_source.value,
        "model": e.model,
        "kv_pool_tokens": e.pool_tokens(),
        "kv_pool_sources": {r.label: r.tokens for r in e.pool_readings},
        "kv_pool_origins": sorted({r.origin.value for r in e.pool_readings}),
        "kv_pool_readings": [reading_to_dict(r) for r in e.pool_readings],
        "context_length": e.served_context,
        "max_request_tokens": e.max_request_tokens,
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


def waiver_to_dict(w: Waiver) -> dict[str, str]:
    return {"check_id": w.check_id, "reason": w.reason, **({"until": w.until} if w.until else {})}


def report_to_dict(report: Report) -> dict[str, Any]:
    """The JSON report's dict: what `--format json` writes and a release record embeds."""
    return {
        "schema_version": report.schema_version,
        "tool": tool(report.tool_version),
        "verdict": report.verdict.value,
        "exit_code": report.exit_code,
        # Derived from `checks` (a reader's tally; never read back): every status, and the waivers.
        "summary": {"total": len(report.checks), **{s.value: report.status_count(s) for s in Status},
                    "waived": report.waived_count},
        "started_at": report.started_at,
        "finished_at": report.finished_at,
        "entry": report.entry,
        "name": report.name,
        "spec": report.spec,
        "context_length_promised": report.context_length_promised,
        "engines": [engine_to_dict(e) for e in report.engines],
        "checks": [check_to_dict(c) for c in report.checks],
        "waivers": [waiver_to_dict(w) for w in report.waivers],
        "gpus": [dict(g) for g in report.gpus],
        "cost": cost_to_dict(report.cost) if report.cost else None,
    }


def cost_to_dict(cost: Cost) -> dict[str, Any]:
    return {
        "requests": cost.requests,
        "prompt_tokens_submitted": cost.prompt_tokens_submitted,
        "prefilled_tokens": cost.prefilled_tokens,
        "prefilled_measured": cost.measured,
        "prefilled_basis": cost.basis,
        "generated_tokens": cost.generated_tokens,
        "wall_s": round(cost.wall_s, 3),
        "checked_context": cost.checked_context,
        "context_equivalents_submitted": _rounded(cost.equivalents(cost.prompt_tokens_submitted)),
        "context_equivalents_prefilled": _rounded(cost.equivalents(cost.prefilled_tokens)),
        "engines": [{"url": e.url, "role": e.role.value, "context_length": e.context_length, "prompt_tokens": e.prompt_tokens,
                     "prefilled_tokens": e.prefilled_tokens, "generated_tokens": e.generated_tokens,
                     "context_equivalents_prefilled": _rounded(e.context_equivalents)} for e in cost.engines],
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def cost_from_dict(data: Any, where: str = "cost") -> Cost:
    d = _mapping(data, where)
    at = f"{where}."
    engines = []
    for i, e in enumerate(_items(d, "engines", at)):
        e = _mapping(e, f"{at}engines[{i}]")
        eat = f"{at}engines[{i}]."
        engines.append(EngineCost(url=_get(e, "url", str, eat, required=True), role=_enum(Role, e.get("role"), f"{eat}role"),
                                  context_length=_get(e, "context_length", int, eat),
                                  prompt_tokens=_get(e, "prompt_tokens", int, eat),
                                  prefilled_tokens=_get(e, "prefilled_tokens", int, eat),
                                  generated_tokens=_get(e, "generated_tokens", int, eat)))
    return Cost(requests=_get(d, "requests", int, at, required=True),
                prompt_tokens_submitted=_get(d, "prompt_tokens_submitted", int, at, required=True),
                generated_tokens=_get(d, "generated_tokens", int, at) or 0,
                wall_s=float(_get(d, "wall_s", (int, float), at) or 0.0),
                checked_context=_get(d, "checked_context", int, at),
                prefilled_tokens=_get(d, "prefilled_tokens", int, at, required=True),
                measured=bool(_get(d, "prefilled_measured", bool, at)),
                basis=_get(d, "prefilled_basis", str, at) or "",
                engines=tuple(engines))


def _get(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, *, required: bool = False) -> Any:
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise SchemaError(f"malformed report: {where}{key} is {value!r}; the file is damaged or not a kvpreflight report")
    return value


def _items(data: Mapping[str, Any], key: str, where: str) -> list[Any]:
    return list(_get(data, key, list, where) or [])


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SchemaError(f"malformed report: {where} is not an object; the file is damaged or not a kvpreflight report")
    return value


def _enum(kind: type[Any], value: Any, where: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise SchemaError(f"malformed report: {where} is {value!r}, not one of {allowed}") from None


def reading_from_dict(data: Any, where: str) -> PoolReading:
    d = _mapping(data, where)
    return PoolReading(source=_get(d, "source", str, f"{where}.", required=True),
                       origin=_enum(Origin, d.get("origin"), f"{where}.origin"),
                       tokens=_get(d, "tokens", int, f"{where}.", required=True),
                       rank=_get(d, "rank", str, f"{where}."))


def engine_from_dict(data: Any, where: str) -> EngineSnapshot:
    d = _mapping(data, where)
    at = f"{where}."
    # `context_served` is what release records before predicate schema 2 called `context_length`
    context = d.get("context_length", d.get("context_served"))
    return EngineSnapshot(
        url=_get(d, "url", str, at, required=True),
        engine=_get(d, "engine", str, at, required=True),
        version=_get(d, "version", str, at),
        role=_enum(Role, d.get("role"), f"{at}role"),
        # Reports written before roles were inferred carry no role_source.
        role_source=_enum(RoleSource, d.get("role_source") or RoleSource.ASSUMED.value, f"{at}role_source"),
        model=_get(d, "model", str, at),
        served_context=_get({"context_length": context}, "context_length", int, at),
        pool_readings=tuple(reading_from_dict(r, f"{at}kv_pool_readings[{i}]")
                            for i, r in enumerate(_items(d, "kv_pool_readings", at))),
        page_size=_get(d, "page_size", int, at),
        max_request_tokens=_get(d, "max_request_tokens", int, at),
        settings=dict(_get(d, "settings", dict, at) or {}),
        notes=tuple(str(n) for n in _items(d, "notes", at)),
    )


def check_from_dict(data: Any, where: str) -> CheckResult:
    d = _mapping(data, where)
    at = f"{where}."
    return CheckResult(id=_get(d, "id", str, at, required=True), status=_enum(Status, d.get("status"), f"{at}status"),
                       message=_get(d, "message", str, at) or "", endpoint=_get(d, "endpoint", str, at),
                       evidence=dict(_get(d, "evidence", dict, at) or {}))


def report_from_dict(data: Any) -> Report:
    """The Report a `report_to_dict` dict (or a release record's predicate) describes.

    A status, role or origin outside its closed set is an error, never read as something else."""
    d = _mapping(data, "the report")
    version = _get(d, "schema_version", int, "")
    if version is not None and version > SCHEMA_VERSION:
        raise SchemaError(f"report schema_version {version} is newer than this kvpreflight reads ({SCHEMA_VERSION}); upgrade kvpreflight")
    tool_info = _mapping(d.get("tool") or {}, "tool")
    waivers = []
    for i, w in enumerate(_items(d, "waivers", "")):
        w = _mapping(w, f"waivers[{i}]")
        waivers.append(Waiver(_get(w, "check_id", str, f"waivers[{i}].", required=True),
                              _get(w, "reason", str, f"waivers[{i}].") or "", _get(w, "until", str, f"waivers[{i}].")))
    return Report(
        tool_version=str(tool_info.get("version") or ""),
        engines=tuple(engine_from_dict(e, f"engines[{i}]") for i, e in enumerate(_items(d, "engines", ""))),
        checks=tuple(check_from_dict(c, f"checks[{i}]") for i, c in enumerate(_items(d, "checks", ""))),
        waivers=tuple(waivers),
        context_length_promised=_get(d, "context_length_promised", int, ""),
        entry=_get(d, "entry", str, ""),
        started_at=_get(d, "started_at", str, ""),
        finished_at=_get(d, "finished_at", str, ""),
        gpus=tuple(dict(_mapping(g, f"gpus[{i}]")) for i, g in enumerate(_items(d, "gpus", ""))),
        schema_version=version or SCHEMA_VERSION,
        cost=cost_from_dict(d["cost"]) if d.get("cost") is not None else None,
        name=_get(d, "name", str, ""),
        spec=_get(d, "spec", str, ""),
    )
