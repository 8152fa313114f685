"""What one watch round found: frozen results, no I/O. A finding names what changed or went
wrong with both values where there are two (what the signed record verified, what is there now)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from kvpreflight.model import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_OK


class FindingKind(enum.StrEnum):
    """The closed set of things a round can find; each is one Prometheus series label."""

    DRIFT = "drift"  # an engine differs from what the signed record verified
    HAZARD = "hazard"  # an engine's own danger counter moved, or its log gained a danger line
    CANARY = "canary"  # a tenant's answer held the other tenant's canary, or a canary request failed
    UNREACHABLE = "unreachable"  # an engine or the entry could not be read this round
    CAPACITY = "capacity"  # a full round's near-context or over-capacity request failed `check`'s verdict


class RoundOutcome(enum.StrEnum):
    """How a round ended. Only CLEAN and FINDINGS measured everything they meant to."""

    CLEAN = "clean"
    FINDINGS = "findings"
    NOT_MEASURED = "not-measured"  # something it meant to measure could not be (said in `not_measured`)
    SKIPPED = "skipped"  # the budget would be exceeded: nothing was sent or read
    THROTTLED = "throttled"  # the entry answered HTTP 429: the round backs off, it did not fail
    CUT_SHORT = "cut-short"  # SIGTERM/SIGINT arrived while it ran


@dataclass(frozen=True, kw_only=True)
class Finding:
    kind: FindingKind
    what: str  # a short stable name: smaller-pool, larger-context, version, settings, unrecorded-engine, ...
    endpoint: str  # the engine (or entry) it is about
    message: str  # one line a user reads
    recorded: Any = None  # what the signed record verified (drift)
    found: Any = None  # what is there now

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind.value, "what": self.what, "endpoint": self.endpoint, "message": self.message}
        if self.recorded is not None or self.found is not None:
            out["recorded"], out["found"] = self.recorded, self.found
        return out


@dataclass(frozen=True, kw_only=True)
class Round:
    number: int
    started_at: str
    finished_at: str
    outcome: RoundOutcome
    findings: tuple[Finding, ...] = ()
    not_measured: tuple[str, ...] = ()  # what this round could not measure, and why
    notes: tuple[str, ...] = ()  # said, not judged (a throttled canary, a skipped round's reason)
    requests: int = 0  # synthetic requests this round sent
    prompt_tokens: int = 0  # prompt tokens they submitted
    retry_after_s: float | None = None  # the entry asked to wait this long (HTTP 429 Retry-After)
    engines: tuple[str, ...] = ()  # the engines read this round
    deployment: str | None = None  # the deployment watched (--name, the spec's, the inventory's)
    full: bool = False  # a full round: it also sent the near-context and the over-capacity request
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """`check`'s exit codes for `watch --once`: 1 a finding, 3 nothing or not all measured, 0 clean.
        An engine that could not be read is not measured (3), as `check` says of it; it stays a
        finding in the round's line and its metrics (an alert for a running watch)."""
        if any(f.kind is not FindingKind.UNREACHABLE for f in self.findings):
            return EXIT_FAIL
        if self.findings:
            return EXIT_INCONCLUSIVE
        if self.outcome is RoundOutcome.CLEAN:
            return EXIT_OK
        return EXIT_INCONCLUSIVE

    def to_dict(self) -> dict[str, Any]:
        return {
            **({"deployment": self.deployment} if self.deployment is not None else {}),
            "round": self.number, "started_at": self.started_at, "finished_at": self.finished_at,
            "outcome": self.outcome.value, "exit_code": self.exit_code,
            "findings": [f.to_dict() for f in self.findings], "not_measured": list(self.not_measured),
            "notes": list(self.notes), "requests": self.requests, "prompt_tokens": self.prompt_tokens,
            "retry_after_s": self.retry_after_s, "engines": list(self.engines), "full": self.full,
            **self.extra,
        }
