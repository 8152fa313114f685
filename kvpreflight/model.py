"""Result types shared by every stage. All frozen: stages hand data on, they never mutate it.

Flow: targets -> engine adapter -> EngineSnapshot -> probes -> ProbeResult -> checks ->
CheckResult -> Report -> formats / record.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The counters live in their own module; re-exported here, where the checks read every result type.
from kvpreflight._internal.counters import TRANSFER_SECONDS as TRANSFER_SECONDS
from kvpreflight._internal.counters import TRANSFERS_TIMED as TRANSFERS_TIMED
from kvpreflight._internal.counters import CounterDelta as CounterDelta
from kvpreflight._internal.counters import CounterDeltas as CounterDeltas
from kvpreflight._internal.counters import CounterField as CounterField
from kvpreflight._internal.counters import CounterValues as CounterValues

__all__ = [
    "CheckResult", "Completion", "Cost", "EngineSnapshot", "EntryApi", "PoolReading", "ProcessRole", "Report", "Role", "Status", "Waiver",
    "combined_verdict",
]


class Status(str, enum.Enum):
    """A check's outcome, and the report's verdict: the worst one (`combined_verdict`). Inconclusive is never a pass."""
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


class RoleSource(enum.StrEnum):
    """Where an engine's role came from."""

    ENGINE = "engine"  # the engine said so (SGLang's disaggregation_mode, vLLM's kv_role)
    ROUTER = "router"  # the router in front of it lists it as a prefill or decode worker
    OVERRIDE = "override"  # stated by the user (ROLE=URL) or the boot spec
    ASSUMED = "assumed"  # nothing said: a plain (unified) engine is assumed


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


class RouterKind(enum.StrEnum):
    """The PD routers kvpreflight knows how to run in front of prefill/decode engines."""

    BUILTIN = "builtin"  # the builtin engine's own router (kvpreflight engine serve --role router)
    SMG = "smg"  # Shepherd Model Gateway (SGLang's PD router; pip install smg)
    SGLANG_ROUTER = "sglang-router"  # SGLang's older router (pip install sglang-router)


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


class Hazard(enum.StrEnum):
    """What an engine's own signal (a log line, a counter) says happened to a request's KV."""

    TRANSFER = "transfer"  # a transfer or handshake failed, or was skipped
    LATE_READ = "late-read"  # a decode read KV its prefill had already released (vLLM's lease ran out)
    KV_EXPIRED = "kv-expired"  # the prefill released KV no decode had read within its lease
    KV_CANARY = "kv-canary"  # the engine's own KV canary found a slot not holding what it should
    # a side of a P/D pair gave up waiting for the other at its handoff timeout: the request failed,
    # and KV that lands after it may be written into pages since given to another request
    HANDOFF_TIMEOUT = "handoff-timeout"
    KV_CORRUPT = "kv-corrupt"  # the KV a decode received is not what its prefill sent (the engine's own checksum)


class ContextHazard(enum.StrEnum):
    """What an engine's own start-up warning says about the context it serves."""

    POSITIONS = "positions"  # it serves prompts past the model's positions (an override let it)
    WINDOW = "window"  # its attention window was cut: an answer sees only the last window of a prompt
    SEQUENCE = "sequence"  # its longest sequence or input was cut below what it was configured to serve


@dataclass(frozen=True, kw_only=True)
class ContextWarning:
    """One start-up warning of an engine about its context: the warning's fixed wording and its
    numbers, never the rest of the line."""

    what: str  # the warning's fixed wording, quoted instead of the line
    hazard: ContextHazard
    tokens: int | None  # the limit that really holds: the model's positions, the window or length it was cut to
    stated: int | None = None  # the context it was told to serve, where the line says it
    fix: str  # what to change, in the engine's own settings

    def evidence(self) -> dict[str, Any]:
        return {"warning": self.what, "hazard": self.hazard.value,
                **({"tokens": self.tokens} if self.tokens is not None else {}),
                **({"stated": self.stated} if self.stated is not None else {}), "fix": self.fix}


@dataclass(frozen=True, kw_only=True)
class KvDeadline:
    """How long an engine keeps a request's KV handoff open: vLLM NIXL's lease (the prefill keeps
    the KV for the decode to read), SGLang's PD timeouts (each side waits for the other)."""

    seconds: float
    setting: str  # what to change: kv_connector_extra_config.kv_lease_duration, ...
    stated: bool  # False: the engine's default, the setting was not seen
    stated_in: str = "its start-up log"  # where a stated value was read (a report quotes it)


@dataclass(frozen=True)
class PoolReading:
    """One KV pool size, in tokens, with the exact source it came from."""

    source: str  # e.g. "log:KV Cache is allocated", "/server_info max_total_num_tokens"
    origin: Origin
    tokens: int
    rank: str | None = None  # "dp0", "tp1"... when the source is per rank

    @property
    def label(self) -> str:
        """The source and, where it is per rank, the rank: '/server_info internal_states.memory_usage.token_capacity [dp1]'."""
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
    role_source: RoleSource = RoleSource.ASSUMED
    pool_readings: tuple[PoolReading, ...] = ()
    page_size: int | None = None
    max_request_tokens: int | None = None  # the engine's own per-request input limit, if stated
    settings: Mapping[str, Any] = field(default_factory=dict)  # for display only; checks read the typed fields
    notes: tuple[str, ...] = ()  # what could not be read, and why
    prefix_caching: bool | None = None  # the engine says its prefix cache is on/off; None: not stated
    kv_per_slot: bool | None = None  # each request slot owns its KV cells (llama.cpp without --kv-unified)
    kv_lease: KvDeadline | None = None  # None: not read (no log given, or not a lease-keeping connector)
    pd_timeouts: tuple[KvDeadline, ...] = ()  # SGLang's PD waits, where a PD role states or implies them
    kv_canary: str | None = None  # the engine's in-engine KV canary mode as it states it (SGLang: none|log|raise)
    # What its start-up log warns about the context it serves (engines/context_warnings.py).
    context_warnings: tuple[ContextWarning, ...] = ()

    def kv_deadlines(self) -> tuple[KvDeadline, ...]:
        return ((self.kv_lease,) if self.kv_lease is not None else ()) + self.pd_timeouts

    def pool_tokens(self) -> int | None:
        """The pool that counts: the smallest non-behavioural reading (smallest rank counts)."""
        values = [r.tokens for r in self.pool_readings if r.origin is not Origin.BEHAVIOUR]
        return min(values) if values else None


class EntryApi(str, enum.Enum):
    """The routes probes use at the entry: the engines' own (SGLang's /generate, ...), or only the
    OpenAI API (a gateway such as the LiteLLM proxy: /v1/completions with token-id prompts)."""

    NATIVE = "native"
    OPENAI = "openai"


class ErrorKind(str, enum.Enum):
    """Why an engine refused a prompt. Only LENGTH is a capacity verdict."""

    LENGTH = "length"
    VOCAB = "vocab"
    OTHER = "other"


@dataclass(frozen=True, kw_only=True)
class Completion:
    """What one probe request got back, as a client saw it. `text` is never serialized."""

    sent_tokens: int
    max_tokens: int
    streamed: bool
    status: int | None  # HTTP status; None when nothing came back
    elapsed_s: float
    timed_out: bool = False
    transport_error: str | None = None
    error_message: str | None = None  # the engine's own error message
    error_kind: ErrorKind | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None  # what the engine says it processed
    cached_tokens: int | None = None
    finish_reason: str | None = None
    truncated: bool | None = None  # the engine said it truncated the prompt
    body_bytes: int = 0
    body_sha256: str = ""
    ttft_s: float | None = None
    empty_body: bool = False  # an HTTP 200 with nothing in its body: neither an answer nor a refusal
    text: str = field(default="", repr=False)
    request_id: str | None = None  # the id kvpreflight gave it, where the engine takes one
    # A reply kvpreflight could not read whole (a frame that is not JSON, a count that is not a
    # count): what it says. What came before it (text, tokens) is kept; nothing else of it is believed.
    malformed: str | None = None
    retry_after_s: float | None = None  # an HTTP 429's Retry-After, in seconds (kvpreflight watch backs off)
    # The model an OpenAI-style answer names; behind a gateway, another deployment's name says it
    # answered instead of the checked engines (a fallback).
    answer_model: str | None = None
    reconnected: str | None = None  # the first connection failed before anything was sent: sent again once

    @property
    def rejected(self) -> bool:
        return self.error_message is not None and not self.timed_out

    @property
    def first_token_s(self) -> float:
        """Time to the first token: streamed, when it came; else the whole answer's time."""
        return self.ttft_s if self.ttft_s is not None else self.elapsed_s

    @property
    def served(self) -> bool:
        """Answered with HTTP 200, no error, in time: the one meaning of "served cleanly"."""
        return (self.status == 200 and self.error_message is None and not self.timed_out and not self.transport_error
                and not self.empty_body and self.malformed is None)

    def evidence(self) -> dict[str, Any]:
        """Numbers only, plus the engine's error message; never the generated text."""
        out: dict[str, Any] = {
            "sent_tokens": self.sent_tokens,
            "max_tokens": self.max_tokens,
            "stream": self.streamed,
            "http_status": self.status,
            "elapsed_s": round(self.elapsed_s, 3),
        }
        for key in ("timed_out", "transport_error", "error_message", "error_kind", "completion_tokens",
                    "prompt_tokens", "cached_tokens", "finish_reason", "truncated", "empty_body", "request_id", "malformed",
                    "reconnected"):
            value = getattr(self, key)
            if value not in (None, False):
                out[key] = value.value if isinstance(value, enum.Enum) else value
        if self.body_bytes:
            out["response_bytes"] = self.body_bytes
            out["response_sha256"] = self.body_sha256
        return out


class ListenerKind(enum.StrEnum):
    """What a listening socket of the deployment carries, as far as kvpreflight can tell."""

    TOKEN_IDS = "token ids"  # KV-cache events: the token ids of every cached block
    KV_DATA = "KV data"  # a transfer engine's data path
    TRANSFER_CONTROL = "KV transfer control"  # bootstrap, handshake, side channel
    API = "the engine's API"  # the port its URL names: not a finding
    UNIDENTIFIED = "not identified"


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket of an engine or router (engines/listeners.py identifies it)."""

    port: int  # 0: the log names the listener but no port (NIXL's UCX transport)
    address: str | None  # as bound (/proc) or as logged; None: its log line names no address
    kind: ListenerKind
    what: str  # "vLLM's KV-events publisher", ... ("" when not identified)
    setting: str  # what binds it: the setting to change ("" when not identified)
    pid: int | None = None  # /proc only
    program: str | None = None  # the process's name (/proc/PID/comm)


@dataclass(frozen=True)
class ProcessListeners:
    """The listening sockets of one engine or router, or why they could not be read."""

    process: str  # the engine's name in the boot spec, or its URL
    url: str
    source: str | None  # "/proc" or "start-up log"; None: not read (`unread` says why)
    listeners: tuple[Listener, ...] = ()
    unread: str = ""


@dataclass(frozen=True)
class Waiver:
    check_id: str
    reason: str
    until: str | None = None  # YYYY-MM-DD: after this day `verify` refuses a record that carries it


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """One check's verdict on one endpoint (or the deployment). Built by keyword: five fields, two
    of them strings, read the same in every check."""

    id: str  # a CheckId's value
    status: Status
    message: str
    endpoint: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @property
    def waiver(self) -> str | None:
        """The reason of the waiver that turned this result into a skip (None: not waived); the
        finding it waived stays in the evidence beside it."""
        reason = self.evidence.get("waiver")
        return None if reason is None else str(reason)


@dataclass(frozen=True, kw_only=True)
class EngineCost:
    """One engine's work during the check, from its own counters (None: it has no such counter)."""

    url: str
    role: Role
    context_length: int | None
    prompt_tokens: int | None  # prompt tokens it was asked to process
    prefilled_tokens: int | None  # of those, really computed (prefix-cache hits excluded)
    generated_tokens: int | None

    @property
    def context_equivalents(self) -> float | None:
        if self.prefilled_tokens is None or not self.context_length:
            return None
        return self.prefilled_tokens / self.context_length


@dataclass(frozen=True, kw_only=True)
class Cost:
    """What the check cost the engines. The requests and prompt tokens are counted by kvpreflight;
    "prefilled" comes from the engines' counters where every engine has one (`measured`), else it
    is estimated as submitted minus the cached tokens the answers reported."""

    requests: int
    prompt_tokens_submitted: int
    generated_tokens: int  # as the answers reported
    wall_s: float  # from the first probe request to the last
    checked_context: int | None  # the context the equivalents are counted in (the smallest served)
    prefilled_tokens: int
    measured: bool
    basis: str  # how prefilled_tokens was found
    engines: tuple[EngineCost, ...] = ()

    def equivalents(self, tokens: int) -> float | None:
        return tokens / self.checked_context if self.checked_context else None


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
    cost: Cost | None = None  # None: no request was sent (--capacity-only) or an old report
    name: str | None = None  # the deployment's name (--name); None: its entry URL names it
    spec: str | None = None  # the --boot spec file checked, as given (SARIF's physical location)

    @property
    def verdict(self) -> Status:
        return verdict_of(self.checks)

    @property
    def exit_code(self) -> int:
        return exit_code_of(self.verdict)

    @property
    def waived_count(self) -> int:
        """Results a waiver turned into `skip` (the check ran; its finding stays in the evidence)."""
        return sum(1 for c in self.checks if c.waiver is not None)

    def status_count(self, status: Status) -> int:
        return sum(1 for c in self.checks if c.status is status)

    def checked_context(self, engine: EngineSnapshot) -> int | None:
        """The context this run held `engine` to (kv-capacity's): see `checked_context`."""
        return checked_context(engine.served_context, self.context_length_promised)


def checked_context(served: int | None, promised: int | None) -> int | None:
    """The context an engine is checked against: the larger of what it serves and what the
    operator promises (--context-length), either alone where the other is unknown. A client can
    send what the engine serves whatever was promised, and the promise is owed even above it.
    The one rule: kv-capacity judges by it and every format shows it."""
    values = [v for v in (served, promised) if v]
    return max(values) if values else None


def combined_verdict(statuses: Iterable[Status]) -> Status:
    """The one verdict rule, for checks and for fleets of deployments alike: fail beats
    inconclusive beats pass; warn and skip (always with a reason) still pass; nothing at all
    measured is inconclusive, never a pass."""
    seen = set(statuses)
    if Status.FAIL in seen:
        return Status.FAIL
    if Status.INCONCLUSIVE in seen or not seen:
        return Status.INCONCLUSIVE
    return Status.PASS


def verdict_of(checks: tuple[CheckResult, ...] | list[CheckResult]) -> Status:
    return combined_verdict(c.status for c in checks)


def exit_code_of(verdict: Status) -> int:
    return {Status.PASS: EXIT_OK, Status.FAIL: EXIT_FAIL}.get(verdict, EXIT_INCONCLUSIVE)
