"""The two predicates a kvpreflight record carries, typed: a release (one deployment's check) and
a fleet (every deployment's verdict, naming their records). `to_dict` is the signed JSON;
`from_dict` reads it back (a damaged or foreign one raises PredicateError naming every value that
does not read, a newer schema RecordError).
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypeVar

from kvpreflight import schema
from kvpreflight._internal.clock import utc_now
from kvpreflight.model import Report, Status, exit_code_of
from kvpreflight.record.errors import PredicateError, RecordError
from kvpreflight.schema import Reader, SchemaError, read_report, tool

PREDICATE_TYPE = "https://kvpreflight.dev/release-record/v1"
# A fleet record (`kvpreflight fleet --record`): its subjects name each deployment's record file.
FLEET_PREDICATE_TYPE = "https://kvpreflight.dev/fleet-record/v1"
# 2: the engines carry the report's own keys (`context_length`, `kv_pool_readings`); 1 said
# `context_served` and repeated the promised context as `context_checked`. Both read.
RELEASE_SCHEMA_VERSION = 2
FLEET_SCHEMA_VERSION = 1
T = TypeVar("T")
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


def listed(data: Mapping[str, Any], key: str) -> list[Any]:
    """A list a record holds for information (engines, checks, deployments), or [] when it holds
    none or something else: a record file is untrusted input, and these lists only describe."""
    value = data.get(key)
    return value if isinstance(value, list) else []


def _version(data: Mapping[str, Any], newest: int, what: str, r: Reader) -> None:
    """Notes a missing schema_version in `r`; a newer one raises at once (its fields may mean what
    this version cannot know, so nothing else in it is worth naming)."""
    version = r.get(data, "schema_version", int, "", required=True)
    if version is not None and version > newest:
        raise RecordError(f"{what} schema_version {version} is newer than this kvpreflight reads ({newest}); upgrade kvpreflight")


def _command_line(data: Mapping[str, Any], r: Reader) -> tuple[str, ...]:
    return tuple(str(a) for a in r.get(data, "command_line", list, "", required=True) or ())


def _verdict(data: Mapping[str, Any], r: Reader, where: str = "") -> Status | None:
    try:
        return Status(data.get("verdict"))
    except ValueError:  # not a verdict kvpreflight writes: never read as one
        r.note(f"{where}verdict {data.get('verdict')!r} is not a kvpreflight verdict")
        return None


def _read(what: str, data: Any, build: Callable[[Mapping[str, Any], Reader], T | None]) -> T:
    """`build(data)`, or PredicateError naming every value of `data` that does not read (`build`
    notes each in the Reader and goes on, returning None where it could build nothing)."""
    r = Reader()
    d = r.mapping(data, what)
    result = None if d is None else build(d, r)
    if result is None or r.problems:
        raise PredicateError.of(what, r.problems)
    return result


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
    def from_dict(cls, data: Any) -> ReleasePredicate:
        """The predicate a signed record holds. The one reader of it (`verify`, `watch`'s baseline):
        PredicateError names every value that does not read, and a recorded verdict that is not
        the one its checks decide; a check id this version does not know reads as its string."""
        return _read("release record predicate", data, cls._build)

    @classmethod
    def _build(cls, data: Mapping[str, Any], r: Reader) -> ReleasePredicate | None:
        _version(data, RELEASE_SCHEMA_VERSION, "release record predicate", r)
        try:
            report = read_report({**data, "schema_version": data.get("report_schema_version")}, r)
        except SchemaError as exc:  # a newer report schema
            raise RecordError(str(exc)) from None
        recorded = _verdict(data, r)
        if report is not None and recorded is not None and recorded is not report.verdict:
            r.note(f"verdict {recorded.value!r} is not the {report.verdict.value!r} its checks decide")
        time, host = r.get(data, "time", str, "", required=True), r.get(data, "host", str, "", required=True)
        command_line = _command_line(data, r)
        return None if report is None else cls(report=report, time=time, host=host, command_line=command_line)


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
        return _read("fleet record deployment", data, cls._build)

    @classmethod
    def _build(cls, data: Mapping[str, Any], r: Reader, where: str = "") -> FleetDeployment | None:
        elapsed = data.get("elapsed_s") or 0.0
        verdict = _verdict(data, r, where)
        read = dict(name=r.get(data, "name", str, where, required=True), exit_code=r.get(data, "exit_code", int, where, required=True),
                    host=r.get(data, "host", str, where), node=r.get(data, "node", str, where),
                    reason=r.get(data, "reason", str, where), record=r.get(data, "record", str, where))
        return None if verdict is None else cls(
            **read, verdict=verdict, elapsed_s=float(elapsed) if isinstance(elapsed, (int, float)) else 0.0,
            engines=tuple(dict(e) for e in listed(data, "engines") if isinstance(e, Mapping)),
            not_passed=tuple(dict(n) for n in listed(data, "not_passed") if isinstance(n, Mapping)))


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
    def from_dict(cls, data: Any) -> FleetPredicate:
        """The predicate a signed fleet record holds; PredicateError names every value that does not read."""
        return _read("fleet record predicate", data, cls._build)

    @classmethod
    def _build(cls, data: Mapping[str, Any], r: Reader) -> FleetPredicate | None:
        _version(data, FLEET_SCHEMA_VERSION, "fleet record predicate", r)
        verdict = _verdict(data, r)
        tool_info = data.get("tool")
        tool_info = tool_info if isinstance(tool_info, Mapping) else {}
        counts = r.get(data, "counts", dict, "", required=True) or {}
        deployments = [FleetDeployment._build(one, r, f"deployments[{i}].")
                       for i, d in enumerate(r.get(data, "deployments", list, "", required=True) or ())
                       if (one := r.mapping(d, f"deployments[{i}]")) is not None]
        read = dict(fleet=r.get(data, "fleet", str, "", required=True), runner=r.get(data, "runner", str, "", required=True),
                    started_at=r.get(data, "started_at", str, "", required=True),
                    finished_at=r.get(data, "finished_at", str, "", required=True),
                    time=r.get(data, "time", str, "", required=True), host=r.get(data, "host", str, "", required=True))
        command_line = _command_line(data, r)
        if verdict is None or None in deployments:
            return None
        return cls(**read, tool_version=str(tool_info.get("version") or ""), verdict=verdict,
                   counts={str(k): int(v) for k, v in counts.items() if isinstance(v, int)},
                   deployments=tuple(d for d in deployments if d is not None), command_line=command_line)

Predicate = ReleasePredicate | FleetPredicate


def predicate_from_dict(predicate_type: str, data: Any) -> Predicate:
    """The typed predicate of a kvpreflight statement of `predicate_type`: the one reader of a
    signed record's predicate (`verify`, and through it `watch`'s baseline). PredicateError names
    every value that does not read; RecordError says a newer schema needs a newer kvpreflight."""
    kinds: dict[str, type[ReleasePredicate] | type[FleetPredicate]] = {PREDICATE_TYPE: ReleasePredicate,
                                                                       FLEET_PREDICATE_TYPE: FleetPredicate}
    if predicate_type not in kinds:
        raise RecordError(f"predicateType {predicate_type!r} is not a kvpreflight record's")
    return kinds[predicate_type].from_dict(data)
