"""The two predicates a kvpreflight record carries, typed: a release (one deployment's check) and
a fleet (every deployment's verdict, naming their records). `to_dict` is the signed JSON;
`from_dict` reads it back (a damaged or foreign one raises RecordError).
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from kvpreflight import schema
from kvpreflight.clock import utc_now
from kvpreflight.model import Report, Status, exit_code_of
from kvpreflight.record.errors import RecordError
from kvpreflight.schema import SchemaError, report_from_dict, tool

PREDICATE_TYPE = "https://kvpreflight.dev/release-record/v1"
# A fleet record (`kvpreflight fleet --record`): its subjects name each deployment's record file.
FLEET_PREDICATE_TYPE = "https://kvpreflight.dev/fleet-record/v1"
# 2: the engines carry the report's own keys (`context_length`, `kv_pool_readings`); 1 said
# `context_served` and repeated the promised context as `context_checked`. Both read.
RELEASE_SCHEMA_VERSION = 2
FLEET_SCHEMA_VERSION = 1
NO_GPU_NOTE = "no NVIDIA GPU/driver visible"
# Evidence keys that would carry what an engine generated or was sent. Replaced by size + digest.
RESPONSE_KEYS = frozenset(
    {"text", "response_text", "response", "body", "content", "completion", "generated_text",
     "output", "prompt", "choices", "messages", "raw", "response_body"}
)


def omit_response_text(value: Any) -> Any:
    """`value` with every response-text field replaced by its size and SHA-256."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if str(k).lower() in RESPONSE_KEYS and v is not None:
                if isinstance(v, (str, bytes)):
                    data = v.encode("utf-8") if isinstance(v, str) else v
                    out[k] = {"omitted": "response text is never recorded", "bytes": len(data),
                              "sha256": hashlib.sha256(data).hexdigest()}
                else:
                    out[k] = {"omitted": "response text is never recorded"}
            else:
                out[k] = omit_response_text(v)
        return out
    if isinstance(value, (list, tuple)):
        return [omit_response_text(v) for v in value]
    return value


def _field(data: Mapping[str, Any], key: str, kind: type, what: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise RecordError(f"malformed {what}: {key} is {value!r}; the record is damaged or not a kvpreflight record")
    return value


def _optional(data: Mapping[str, Any], key: str, kind: type, what: str) -> Any:
    return None if data.get(key) is None else _field(data, key, kind, what)


def listed(data: Mapping[str, Any], key: str) -> list[Any]:
    """A list a record holds for information (engines, checks, deployments), or [] when it holds
    none or something else: a record file is untrusted input, and these lists only describe."""
    value = data.get(key)
    return value if isinstance(value, list) else []



def _version(data: Mapping[str, Any], newest: int, what: str) -> None:
    version = _field(data, "schema_version", int, what)
    if version > newest:
        raise RecordError(f"{what} schema_version {version} is newer than this kvpreflight reads ({newest}); upgrade kvpreflight")


def _command_line(data: Mapping[str, Any], what: str) -> tuple[str, ...]:
    argv = _field(data, "command_line", list, what)
    return tuple(str(a) for a in argv)


@dataclass(frozen=True, kw_only=True)
class ReleasePredicate:
    """What one check found, where and when: the report (response text omitted) and the run."""

    predicate_type: ClassVar[str] = PREDICATE_TYPE

    report: Report
    time: str  # RFC 3339 UTC, when the record was made
    host: str
    command_line: tuple[str, ...] = ()  # set, redacted, by the statement builder

    @classmethod
    def of(cls, report: Report, *, time: str | None = None, host: str | None = None) -> ReleasePredicate:
        """The predicate about `report`, made now on this host; response text is never kept."""
        checks = tuple(replace(c, evidence=omit_response_text(c.evidence)) for c in report.checks)
        return cls(report=replace(report, checks=checks), time=time or utc_now(),
                   host=socket.gethostname() if host is None else host)

    @property
    def verdict(self) -> Status:
        return self.report.verdict

    def to_dict(self) -> dict[str, Any]:
        report = schema.report_to_dict(self.report)
        return {
            **report,
            "schema_version": RELEASE_SCHEMA_VERSION,
            "report_schema_version": report["schema_version"],
            "time": self.time,
            "host": self.host,
            "command_line": list(self.command_line),
            "gpu_summary": f"{len(self.report.gpus)} GPU(s)" if self.report.gpus else NO_GPU_NOTE,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReleasePredicate:
        what = "release record predicate"
        _version(data, RELEASE_SCHEMA_VERSION, what)
        try:
            report = report_from_dict({**data, "schema_version": data.get("report_schema_version")})
        except SchemaError as exc:
            raise RecordError(f"malformed {what}: {exc}") from None
        return cls(report=report, time=_field(data, "time", str, what), host=_field(data, "host", str, what),
                   command_line=_command_line(data, what))


@dataclass(frozen=True, kw_only=True)
class FleetDeployment:
    """One deployment's line in a fleet record (and in the fleet's JSON report)."""

    name: str
    verdict: Status
    exit_code: int
    host: str | None = None
    node: str | None = None  # the Ray node id, when Ray ran it
    elapsed_s: float = 0.0
    reason: str | None = None  # why nothing was measured
    engines: tuple[Mapping[str, Any], ...] = ()  # role, url, kv_pool_tokens, context
    not_passed: tuple[Mapping[str, str], ...] = ()  # {"id", "status"} of each failed/inconclusive check
    record: str | None = None  # the deployment's record file name, beside the fleet record

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "verdict": self.verdict.value, "exit_code": self.exit_code, "host": self.host,
            "node": self.node, "elapsed_s": self.elapsed_s, "reason": self.reason,
            "engines": [dict(e) for e in self.engines], "not_passed": [dict(n) for n in self.not_passed],
            "record": self.record,
        }

    @classmethod
    def from_dict(cls, data: Any) -> FleetDeployment:
        what = "fleet record deployment"
        if not isinstance(data, Mapping):
            raise RecordError(f"malformed {what}: not an object; the record is damaged or not a kvpreflight record")
        try:
            verdict = Status(data.get("verdict"))
        except ValueError:
            raise RecordError(f"malformed {what}: verdict {data.get('verdict')!r} is not a kvpreflight verdict") from None
        elapsed = data.get("elapsed_s") or 0.0
        return cls(name=_field(data, "name", str, what), verdict=verdict, exit_code=_field(data, "exit_code", int, what),
                   host=_optional(data, "host", str, what), node=_optional(data, "node", str, what),
                   elapsed_s=float(elapsed) if isinstance(elapsed, (int, float)) else 0.0,
                   reason=_optional(data, "reason", str, what),
                   engines=tuple(dict(e) for e in listed(data, "engines") if isinstance(e, Mapping)),
                   not_passed=tuple(dict(n) for n in listed(data, "not_passed") if isinstance(n, Mapping)),
                   record=_optional(data, "record", str, what))


@dataclass(frozen=True, kw_only=True)
class FleetPredicate:
    """A fleet's verdict and every deployment's line; their records are the statement's subjects."""

    predicate_type: ClassVar[str] = FLEET_PREDICATE_TYPE

    fleet: str
    runner: str
    tool_version: str
    started_at: str
    finished_at: str
    verdict: Status
    counts: Mapping[str, int]
    deployments: tuple[FleetDeployment, ...]
    time: str
    host: str
    command_line: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return exit_code_of(self.verdict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": FLEET_SCHEMA_VERSION,
            "tool": tool(self.tool_version),
            "time": self.time,
            "host": self.host,
            "command_line": list(self.command_line),
            "fleet": self.fleet,
            "runner": self.runner,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "counts": dict(self.counts),
            "deployments": [d.to_dict() for d in self.deployments],
            "verdict": self.verdict.value,
            "exit_code": self.exit_code,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FleetPredicate:
        what = "fleet record predicate"
        _version(data, FLEET_SCHEMA_VERSION, what)
        try:
            verdict = Status(data.get("verdict"))
        except ValueError:
            raise RecordError(f"malformed {what}: verdict {data.get('verdict')!r} is not a kvpreflight verdict") from None
        tool_info = data.get("tool")
        tool_info = tool_info if isinstance(tool_info, Mapping) else {}
        counts = _field(data, "counts", dict, what)
        return cls(fleet=_field(data, "fleet", str, what), runner=_field(data, "runner", str, what),
                   tool_version=str(tool_info.get("version") or ""),
                   started_at=_field(data, "started_at", str, what), finished_at=_field(data, "finished_at", str, what),
                   verdict=verdict, counts={str(k): int(v) for k, v in counts.items() if isinstance(v, int)},
                   deployments=tuple(FleetDeployment.from_dict(d) for d in _field(data, "deployments", list, what)),
                   time=_field(data, "time", str, what), host=_field(data, "host", str, what),
                   command_line=_command_line(data, what))


Predicate = ReleasePredicate | FleetPredicate
