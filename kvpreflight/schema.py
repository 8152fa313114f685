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

__all__ = ["SCHEMA_VERSION", "Reader", "SchemaError", "read_report", "report_from_dict", "report_to_dict"]

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


def _cost(data: Any, where: str, r: Reader) -> Cost | None:
    d = r.mapping(data, where)
    if d is None:
        return None
    mark = r.mark()
    at = f"{where}."
    engines = []
    for i, e in enumerate(r.items(d, "engines", at)):
        eat = f"{at}engines[{i}]."
        if (e := r.mapping(e, f"{at}engines[{i}]")) is not None:
            engines.append(EngineCost(url=r.get(e, "url", str, eat, required=True), role=r.enum(Role, e.get("role"), f"{eat}role"),
                                      context_length=r.get(e, "context_length", int, eat),
                                      prompt_tokens=r.get(e, "prompt_tokens", int, eat),
                                      prefilled_tokens=r.get(e, "prefilled_tokens", int, eat),
                                      generated_tokens=r.get(e, "generated_tokens", int, eat)))
    cost = Cost(requests=r.get(d, "requests", int, at, required=True),
                prompt_tokens_submitted=r.get(d, "prompt_tokens_submitted", int, at, required=True),
                generated_tokens=r.get(d, "generated_tokens", int, at) or 0,
                wall_s=float(r.get(d, "wall_s", (int, float), at) or 0.0),
                checked_context=r.get(d, "checked_context", int, at),
                prefilled_tokens=r.get(d, "prefilled_tokens", int, at, required=True),
                measured=bool(r.get(d, "prefilled_measured", bool, at)),
                basis=r.get(d, "prefilled_basis", str, at) or "",
                engines=tuple(engines))
    return None if r.failed_since(mark) else cost


class Reader:
    """Reads dicts the schema describes, noting every value that does not follow it rather than
    stopping at the first, so that a damaged file or record is named whole in one message. A value
    that does not read comes back as None (a list as []); a reader returns what it built only when
    nothing failed since its `mark`, so no typed object it returns holds such a stand-in."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def note(self, problem: str) -> None:
        self.problems.append(problem)

    def mark(self) -> int:
        return len(self.problems)

    def failed_since(self, mark: int) -> bool:
        return len(self.problems) > mark

    def get(self, data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, *, required: bool = False) -> Any:
        value = data.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
            self.note(f"{where}{key} is {value!r}")
            return None
        return value

    def items(self, data: Mapping[str, Any], key: str, where: str) -> list[Any]:
        return list(self.get(data, key, list, where) or [])

    def mapping(self, value: Any, where: str) -> Mapping[str, Any] | None:
        if not isinstance(value, Mapping):
            self.note(f"{where} is not an object")
            return None
        return value

    def enum(self, kind: type[Any], value: Any, where: str) -> Any:
        try:
            return kind(value)
        except ValueError:
            self.note(f"{where} is {value!r}, not one of {', '.join(m.value for m in kind)}")
            return None


def _reading(data: Any, where: str, r: Reader) -> PoolReading | None:
    if (d := r.mapping(data, where)) is None:
        return None
    mark = r.mark()
    reading = PoolReading(source=r.get(d, "source", str, f"{where}.", required=True),
                          origin=r.enum(Origin, d.get("origin"), f"{where}.origin"),
                          tokens=r.get(d, "tokens", int, f"{where}.", required=True),
                          rank=r.get(d, "rank", str, f"{where}."))
    return None if r.failed_since(mark) else reading


def _engine(data: Any, where: str, r: Reader) -> EngineSnapshot | None:
    if (d := r.mapping(data, where)) is None:
        return None
    mark = r.mark()
    at = f"{where}."
    # `context_served` is what release records before predicate schema 2 called `context_length`
    context = d.get("context_length", d.get("context_served"))
    readings = [_reading(x, f"{at}kv_pool_readings[{i}]", r) for i, x in enumerate(r.items(d, "kv_pool_readings", at))]
    if "kv_pool_readings" not in d and (pool := r.get(d, "kv_pool_tokens", int, at)) is not None:
        # Release records before predicate schema 2 kept the pool that counted, not its readings:
        # that size reads back as one reading, so the pool shown and compared is the one judged.
        # Its origin was not kept; nothing judges a read-back reading's origin again.
        readings = [PoolReading(source="kv_pool_tokens", origin=Origin.SCHEDULER, tokens=pool)]
    engine = EngineSnapshot(
        url=r.get(d, "url", str, at, required=True),
        engine=r.get(d, "engine", str, at, required=True),
        version=r.get(d, "version", str, at),
        role=r.enum(Role, d.get("role"), f"{at}role"),
        # Reports written before roles were inferred carry no role_source.
        role_source=r.enum(RoleSource, d.get("role_source") or RoleSource.ASSUMED.value, f"{at}role_source"),
        model=r.get(d, "model", str, at),
        served_context=r.get({"context_length": context}, "context_length", int, at),
        pool_readings=tuple(x for x in readings if x is not None),
        page_size=r.get(d, "page_size", int, at),
        max_request_tokens=r.get(d, "max_request_tokens", int, at),
        settings=dict(r.get(d, "settings", dict, at) or {}),
        notes=tuple(str(n) for n in r.items(d, "notes", at)),
    )
    return None if r.failed_since(mark) else engine


def _check(data: Any, where: str, r: Reader) -> CheckResult | None:
    """One check's result. Its id stays the string recorded: a report from another kvpreflight
    version may name a check this one does not know, and still reads."""
    if (d := r.mapping(data, where)) is None:
        return None
    mark = r.mark()
    at = f"{where}."
    check = CheckResult(id=r.get(d, "id", str, at, required=True), status=r.enum(Status, d.get("status"), f"{at}status"),
                        message=r.get(d, "message", str, at) or "", endpoint=r.get(d, "endpoint", str, at),
                        evidence=dict(r.get(d, "evidence", dict, at) or {}))
    return None if r.failed_since(mark) else check


def _waiver(data: Any, where: str, r: Reader) -> Waiver | None:
    if (w := r.mapping(data, where)) is None:
        return None
    mark = r.mark()
    at = f"{where}."
    waiver = Waiver(r.get(w, "check_id", str, at, required=True), r.get(w, "reason", str, at) or "", r.get(w, "until", str, at))
    return None if r.failed_since(mark) else waiver


def read_report(data: Any, r: Reader) -> Report | None:
    """The Report `data` describes, every value that does not read noted in `r` (None when any
    did). A newer schema than this kvpreflight reads raises SchemaError at once: its fields may
    mean what this version cannot know."""
    mark = r.mark()
    if (d := r.mapping(data, "the report")) is None:
        return None
    version = r.get(d, "schema_version", int, "")
    if version is not None and version > SCHEMA_VERSION:
        raise SchemaError(f"report schema_version {version} is newer than this kvpreflight reads ({SCHEMA_VERSION}); upgrade kvpreflight")
    tool_info = r.mapping(d.get("tool") or {}, "tool") or {}
    engines = [_engine(e, f"engines[{i}]", r) for i, e in enumerate(r.items(d, "engines", ""))]
    checks = [_check(c, f"checks[{i}]", r) for i, c in enumerate(r.items(d, "checks", ""))]
    waivers = [_waiver(w, f"waivers[{i}]", r) for i, w in enumerate(r.items(d, "waivers", ""))]
    gpus = [r.mapping(g, f"gpus[{i}]") for i, g in enumerate(r.items(d, "gpus", ""))]
    report = Report(
        tool_version=str(tool_info.get("version") or ""),
        engines=tuple(e for e in engines if e is not None),
        checks=tuple(c for c in checks if c is not None),
        waivers=tuple(w for w in waivers if w is not None),
        context_length_promised=r.get(d, "context_length_promised", int, ""),
        entry=r.get(d, "entry", str, ""),
        started_at=r.get(d, "started_at", str, ""),
        finished_at=r.get(d, "finished_at", str, ""),
        gpus=tuple(dict(g) for g in gpus if g is not None),
        schema_version=version or SCHEMA_VERSION,
        cost=_cost(d["cost"], "cost", r) if d.get("cost") is not None else None,
        name=r.get(d, "name", str, ""),
        spec=r.get(d, "spec", str, ""),
    )
    return None if r.failed_since(mark) else report


def report_from_dict(data: Any) -> Report:
    """The Report a `report_to_dict` dict (or a release record's predicate) describes.

    A status, role or origin outside its closed set is an error, never read as something else;
    the error names every value that does not read, not only the first."""
    r = Reader()
    report = read_report(data, r)
    if report is None:
        raise SchemaError(f"malformed report: {'; '.join(r.problems)}; the file is damaged or not a kvpreflight report")
    return report
