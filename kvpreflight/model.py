"""Result types shared by every stage. All frozen: stages hand data on, they never mutate it.

Flow: targets -> engine adapter -> EngineSnapshot -> probes -> ProbeResult -> checks ->
CheckResult -> Report -> formats / record.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping


class Status(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"
    INCONCLUSIVE = "inconclusive"


class Role(str, enum.Enum):
    """The role of an engine that holds a KV pool."""

    UNIFIED = "unified"
    PREFILL = "prefill"
    DECODE = "decode"


class ProcessRole(enum.StrEnum):
    """The role of any process of a deployment: an engine's role, or the router in front of them."""

    UNIFIED = "unified"
    PREFILL = "prefill"
    DECODE = "decode"
    ROUTER = "router"

    @property
    def engine_role(self) -> Role | None:
        """The KV-holding role, or None for the router."""
        return None if self is ProcessRole.ROUTER else Role(self.value)


class EngineKind(enum.StrEnum):
    """The engines kvpreflight has an adapter for (kvpreflight.engines.ENGINES, one module each)."""

    BUILTIN = "builtin"
    SGLANG = "sglang"
    VLLM = "vllm"
    LLAMACPP = "llamacpp"
    TGI = "tgi"


AUTO_ENGINE = "auto"  # "find out by asking the server", where an engine kind is expected


class Origin(str, enum.Enum):
    """Where a capacity number comes from. Two numbers of one origin are not independent."""

    ALLOCATOR = "allocator"  # the allocator's start-up log line (what was really allocated)
    SCHEDULER = "scheduler"  # the scheduler's HTTP API, metrics and its own log line
    BEHAVIOUR = "behaviour"  # the observed accept/reject boundary


EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3

REPORT_SCHEMA_VERSION = 1  # of the JSON report (kvpreflight.schema writes and reads it)


@dataclass(frozen=True)
class PoolReading:
    """One KV pool size, in tokens, with the exact source it came from."""

    source: str  # e.g. "log:KV Cache is allocated", "/server_info max_total_num_tokens"
    origin: Origin
    tokens: int
    rank: str | None = None  # "dp0", "tp1"... when the source is per rank

    @property
    def label(self) -> str:
        """The source and, where it is per rank, the rank: 'metrics sglang:max_total_num_tokens [tp1]'."""
        return f"{self.source} [{self.rank}]" if self.rank else self.source


@dataclass(frozen=True)
class EngineSnapshot:
    """What one engine says about itself. Read-only facts; no verdicts."""

    url: str
    engine: str  # sglang | vllm | llamacpp | tgi | builtin
    version: str | None
    role: Role
    model: str | None
    served_context: int | None  # what the engine serves (/v1/models max_model_len ...)
    pool_readings: tuple[PoolReading, ...] = ()
    page_size: int | None = None
    max_request_tokens: int | None = None  # the engine's own per-request input limit, if stated
    settings: Mapping[str, Any] = field(default_factory=dict)  # allow_auto_truncate, transfer backend, ...
    notes: tuple[str, ...] = ()  # what could not be read, and why

    def pool_tokens(self) -> int | None:
        """The pool that counts: the smallest non-behavioural reading (smallest rank counts)."""
        values = [r.tokens for r in self.pool_readings if r.origin is not Origin.BEHAVIOUR]
        return min(values) if values else None


@dataclass(frozen=True)
class Waiver:
    check_id: str
    reason: str


@dataclass(frozen=True)
class CheckResult:
    id: str
    status: Status
    message: str
    endpoint: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    tool_version: str
    engines: tuple[EngineSnapshot, ...]
    checks: tuple[CheckResult, ...]
    waivers: tuple[Waiver, ...] = ()
    context_length_promised: int | None = None
    entry: str | None = None
    started_at: str | None = None  # RFC 3339 UTC
    finished_at: str | None = None
    gpus: tuple[Mapping[str, Any], ...] = ()
    schema_version: int = REPORT_SCHEMA_VERSION

    @property
    def verdict(self) -> Status:
        return verdict_of(self.checks)

    @property
    def exit_code(self) -> int:
        return exit_code_of(self.verdict)

    # The schema lives in kvpreflight.schema, which imports this module: imported when called.
    def to_dict(self) -> dict[str, Any]:
        """The JSON report's dict (what `--format json` writes and a record embeds)."""
        from kvpreflight.schema import report_to_dict

        return report_to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """The Report a `to_dict` dict describes; a malformed one raises SchemaError (exit 2)."""
        from kvpreflight.schema import report_from_dict

        return report_from_dict(data)


def verdict_of(checks: tuple[CheckResult, ...] | list[CheckResult]) -> Status:
    """fail beats inconclusive beats pass. warn and skip (always with a reason) still pass."""
    statuses = {c.status for c in checks}
    if Status.FAIL in statuses:
        return Status.FAIL
    if Status.INCONCLUSIVE in statuses or not checks:
        return Status.INCONCLUSIVE
    return Status.PASS


def exit_code_of(verdict: Status) -> int:
    return {Status.PASS: EXIT_OK, Status.FAIL: EXIT_FAIL}.get(verdict, EXIT_INCONCLUSIVE)
