"""What the probes hand to the checks: plain frozen results, no I/O. Checks import this module
and kvpreflight.model, nothing else of the probe machinery."""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kvpreflight._internal.redact import cut
from kvpreflight.model import Completion, CounterDeltas, CounterField, ErrorKind, Hazard


class Expect(str, enum.Enum):
    """What a probe request must get: served, or refused."""

    ACCEPT = "accept"
    REJECT = "reject"


class Tenant(str, enum.Enum):
    """The two synthetic tenants of the isolation probes."""

    A = "a"
    B = "b"

    @property
    def other(self) -> Tenant:
        return Tenant.B if self is Tenant.A else Tenant.A

    @property
    def label(self) -> str:
        return self.value.upper()


class CacheProbeKind(str, enum.Enum):
    """The prefix-cache controls: first sight, the same tenant again, the other tenant; and, in the
    timing audit only, a fresh prompt sent in a repeat's place by each tenant (what that place and
    that tenant's path take with nothing cached: the references for warm and for cross-tenant)."""

    COLD = "cold"
    WARM = "warm"
    CROSS = "cross"
    FRESH = "fresh"  # tenant A's
    CROSS_FRESH = "cross-fresh"  # tenant B's


CONTROL_KINDS = (CacheProbeKind.COLD, CacheProbeKind.WARM, CacheProbeKind.CROSS)  # the controls (no fresh ones)


class ProbeName(enum.StrEnum):
    """The capacity probes, as the report names them. The concurrent requests are one probe sent
    k times at once: each result is named `concurrent-N`, and its `probe` is CONCURRENT."""

    OVER_POOL = "over-pool"
    OVER_POOL_STREAM = "over-pool-stream"
    OVER_CONTEXT = "over-context"
    OVER_CONTEXT_STREAM = "over-context-stream"
    BOUNDARY_ACCEPT = "boundary-accept"
    BOUNDARY_REJECT = "boundary-reject"
    CLAMP = "clamp"
    CONCURRENT = "concurrent"
    HEALTH = "health"

    @property
    def streamed(self) -> bool:
        return self.value.endswith("-stream")

    @property
    def unstreamed(self) -> ProbeName:
        """The probe this one repeats streamed (its purpose is that one's)."""
        return ProbeName(self.value.removesuffix("-stream"))

    @classmethod
    def of(cls, name: str) -> ProbeName | None:
        """The probe a result's name is (`concurrent-2`: CONCURRENT); None for none of them."""
        base, _, index = name.rpartition("-")
        if index.isdigit() and base == cls.CONCURRENT.value:
            return cls.CONCURRENT
        return next((p for p in cls if p.value == name), None)


UNANSWERED_QUOTE_CHARS = 120  # of what the deployment said, per distinct refusal in a verdict

OVER_CAPACITY_PROBES = (ProbeName.OVER_POOL, ProbeName.OVER_POOL_STREAM, ProbeName.OVER_CONTEXT,
                        ProbeName.OVER_CONTEXT_STREAM)
# The counters that move on a decode when KV reaches it: a refused prompt must move none.
TRANSFER_COUNTERS = (CounterField.REQUESTS, CounterField.PROMPT_TOKENS, CounterField.GENERATION_TOKENS,
                     CounterField.TRANSFER_FAILURES, CounterField.KV_TRANSFERS, CounterField.KV_TRANSFER_TOKENS)


def transfer_moved(deltas: CounterDeltas, decoders: Iterable[str]) -> dict[str, dict[str, float]]:
    """The decodes' transfer counters that moved over one window: url -> counter name -> delta."""
    wanted = set(decoders)
    moved = {url: {f.value: v for f in TRANSFER_COUNTERS if (v := d.get(f))} for url, d in deltas.items() if url in wanted}
    return {url: d for url, d in moved.items() if d}


class ScenarioName(enum.StrEnum):
    """The isolation scenarios, in the order they run (probes/scenarios.py declares each)."""

    NORMAL = "normal"
    BOUNDARY = "boundary"
    OVER_CAPACITY = "over-capacity"
    CANCEL_TRANSFER = "cancel-transfer"
    CANCEL_DECODE = "cancel-decode"
    LOAD = "load"
    LATE_DECODE = "late-decode"


# -- what an answer repeated of its own prompt ---------------------------------------------------

@dataclass(frozen=True)
class Echo:
    """What one answer repeated of the prompt it answers (found by the prober, judged by the
    checks): an echoing model's answer must come from its own prompt (checks/probe_common.py
    echo_findings). Hash and length only: the text may be another customer's data."""

    own: bool | None = None  # its own marker (canary or head) surfaced; None: too short to tell
    head: bool | None = None  # the prompt's unique head surfaced; None: the prompt carried none
    sent_tokens: int = 0
    chars: int = 0
    sha256: str = ""

    def evidence(self) -> dict[str, object]:
        return {"answer_chars": self.chars, "answer_sha256": self.sha256}


# -- capacity probes -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Limits:
    """What the engines' stated numbers predict, for the deployment as the entry serves it."""

    served_context: int
    pool_tokens: int | None
    max_accepted: int  # longest prompt the stated limits accept with max_tokens=1

    @property
    def pool_bound(self) -> bool:
        return self.pool_tokens is not None and self.pool_tokens < self.served_context


@dataclass(frozen=True, kw_only=True)
class DangerLine:
    """A log line saying a request's KV may not have moved as it should: the signal's own fixed
    wording and the request id the line names, never the rest of the line."""

    source: str  # URL of the engine or router whose log it is
    what: str
    request_id: str | None = None
    names: str | None = None  # which of kvpreflight's requests the id is, where it is one
    hazard: Hazard = Hazard.TRANSFER
    detail: str | None = None  # the signal's numbers and labels (slot_idx=3 position=17 ...), where it has them


def deltas_evidence(deltas: CounterDeltas) -> dict[str, dict[str, float]]:
    """A window's counter deltas as evidence quotes them: url -> counter name -> delta, only the
    counters known at both ends (an unknown one is absent, never 0)."""
    return {url: d.known() for url, d in deltas.items()}


def stale_reads(deltas: CounterDeltas) -> dict[str, int]:
    """Engines whose stale-KV-read counter moved over one window: url -> how many reads. The
    counter form of a danger line, so it is seen without access to the engine's log."""
    return counter_moved(deltas, CounterField.STALE_KV_READS)


def counter_moved(deltas: CounterDeltas, name: CounterField) -> dict[str, int]:
    """Engines whose counter `name` moved up over one window: url -> by how much (one that could
    not be read at both ends is unknown, and left out)."""
    return {url: int(v) for url, d in deltas.items() if (v := d.get(name)) is not None and v > 0}


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    name: str  # stable: boundary-accept, boundary-reject, over-pool, over-context, clamp, concurrent-N, ...
    expect: Expect
    completion: Completion
    purpose: str
    reached: tuple[str, ...] = ()  # URLs of engines whose request/token counters moved
    counter_deltas: CounterDeltas = field(default_factory=dict)  # url -> how far its counters moved
    foreign_markers: tuple[str, ...] = ()  # synthetic markers in the response that this request never sent
    danger_lines: tuple[DangerLine, ...] = ()  # logged while this probe was in flight
    tenant: Tenant | None = None  # sent as this synthetic tenant, its canary in the prompt (isolation reuses it)
    echo: Echo = field(default_factory=lambda: Echo())  # what its answer repeated of its own prompt
    # The counter deltas of the earlier tries this result replaces: a refused over-capacity probe
    # whose window saw a decode's KV move is sent again for a window no other client's transfer
    # lands in (CapacityProber); the check reads every window.
    earlier_windows: tuple[CounterDeltas, ...] = ()

    @property
    def probe(self) -> ProbeName | None:
        return ProbeName.of(self.name)


@dataclass(frozen=True, kw_only=True)
class ProbeRun:
    limits: Limits | None
    probes: tuple[ProbeResult, ...] = ()
    not_run: str | None = None  # why no probe was sent (then every probe check is inconclusive/skip)
    healthy_after: Mapping[str, bool] = field(default_factory=dict)
    idle_after: Mapping[str, bool | None] = field(default_factory=dict)
    small_request_after: Completion | None = None
    own_markers: frozenset[str] = frozenset()  # this run's probe marker: not foreign to the isolation probes
    stopped: str | None = None  # why later probes were not sent (an engine stopped answering, the deadline)
    not_answering: str | None = None  # the run stopped because the engine stopped answering (of `stopped`)
    speed_note: str = ""  # how the request budgets were set (the measured speed, or the assumed one)
    untied_danger_lines: tuple[DangerLine, ...] = ()  # logged between probes (calibration, waits)
    # What the measured speed predicts one prompt at the served context takes (None: no speed).
    near_context_s: float | None = None
    # The calibration's measured speed (None: not measured): prompt tokens per second over the
    # fixed cost of a request, what the plausibility of every answer's speed starts from.
    prefill_rate: float | None = None
    calibration_prefill_s: float | None = None  # the measured request's time past the fixed cost (None: unknown)
    overhead_s: float = 0.0

    def missing(self, what: str) -> str:
        """Why a probe a check needs is absent."""
        return f"{what} was not sent: {self.stopped}" if self.stopped else f"{what} was not sent"

    def get(self, probe: ProbeName) -> ProbeResult | None:
        """The first result of `probe` (the concurrent ones: `of`)."""
        return next((p for p in self.probes if p.probe is probe), None)

    def of(self, *probes: ProbeName) -> list[ProbeResult]:
        """Every result of these probes, in the order they were sent."""
        return [p for p in self.probes if p.probe in probes]

    @property
    def concurrent(self) -> list[ProbeResult]:
        return self.of(ProbeName.CONCURRENT)


# -- isolation probes ----------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class TenantRequest:
    """One request of one tenant and what its answer contained (markers only, never text)."""

    tenant: Tenant
    name: str  # e.g. normal-a1
    completion: Completion | None  # None: we disconnected on purpose (see `abandoned`)
    expect: Expect = Expect.ACCEPT
    abandoned: str | None = None  # how we disconnected ("after transfer start", "after first token", ...)
    crossings: tuple[str, ...] = ()  # the other tenant's canary, fragments, other synthetic markers
    # False: its answer had no room for a canary (prompt-integrity's probe at the limit, 1 token):
    # it only wrote the tenant's canary into the pool, for the other tenant's later answers to show.
    scanned: bool = True
    abandoned_id: str | None = None  # the id an abandoned request carried (a served one's is in its completion)
    abandoned_tokens: int = 0  # the prompt an abandoned request sent (a served one's is in its completion)
    # A capacity probe's request that carried the tenant's canary (the boundary scenario): its
    # refusal is the capacity checks' finding, and the scenario sends its own request in its place.
    carried: bool = False
    echo: Echo = field(default_factory=lambda: Echo())  # what its answer repeated of its own prompt

    @property
    def served(self) -> bool:
        return self.completion is not None and self.completion.served

    @property
    def own_seen(self) -> bool:
        """The tenant's own canary or head surfaced (the positive control)."""
        return bool(self.echo.own)

    @property
    def unanswered(self) -> str | None:
        """Why a request the scenario needed answered came back without an answer (HTTP 503, a
        timeout, a dropped connection): the scenario then ran only in part. None for an answered
        request, one whose client left on purpose, one refused for length (a capacity finding,
        judged by the capacity checks), one meant to be refused and a capacity probe's (`carried`)."""
        c = self.completion
        if self.expect is not Expect.ACCEPT or self.carried or c is None or c.served or c.error_kind is ErrorKind.LENGTH:
            return None
        if c.timed_out:
            return "timed out"
        if c.transport_error:
            return "connection failed"
        # The deployment's own words (a router's plain-text body, an engine's error message, an
        # error inside a 200 such as an SGLang abort), so the verdict says why the requests were
        # refused, grouped by what was said; error_reply_message already names the status.
        said = c.error_message or ""
        if said.startswith(f"HTTP {c.status}"):
            said = said.removeprefix(f"HTTP {c.status}").removeprefix(":").strip()
        if said in ("", "without an error message"):
            return "HTTP 200 without an answer" if c.status == 200 else f"HTTP {c.status} without an error message"
        return f"HTTP {c.status}{' with an error' if c.status == 200 else ''}: {cut(said, UNANSWERED_QUOTE_CHARS)}"

    @property
    def request_id(self) -> str | None:
        return self.completion.request_id if self.completion is not None else self.abandoned_id


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    purpose: str
    requests: tuple[TenantRequest, ...] = ()
    skipped: str | None = None  # why it did not run (by choice: churn not allowed)
    stopped: str | None = None  # why it ran only in part or not at all (an engine stopped answering, the deadline)
    occurred: bool | None = None  # True: shown to have happened; None: unconfirmed
    occurrence: str = ""  # how it was shown, or why it could not be
    idle_after: Mapping[str, bool | None] = field(default_factory=dict)
    counter_deltas: CounterDeltas = field(default_factory=dict)  # url -> how far its counters moved
    churn: bool = False
    danger_lines: tuple[DangerLine, ...] = ()  # logged while it ran, or naming one of its requests
    # What of the scenario cannot apply to this deployment (neither shown nor a warning), and why.
    not_applicable: str | None = None
    # Why it was not sent although it applies (late-decode: the lease outlasts its maximum wait):
    # neither a warning nor a failure, said in the evidence.
    not_probed: str | None = None


@dataclass(frozen=True, kw_only=True)
class CacheProbe:
    kind: CacheProbeKind
    tenant: Tenant
    prefix: int  # which fresh prefix
    completion: Completion
    hit_metric_delta: float | None = None  # the engines' prefix-cache hit counters over this request, summed
    # Each engine's counters over this request: which engine found the prompt in its cache, a
    # decode's own cache included, and whether other traffic was there too.
    counter_deltas: CounterDeltas = field(default_factory=dict)

    @property
    def ttft_s(self) -> float:
        return self.completion.first_token_s


@dataclass(frozen=True, kw_only=True)
class PrefixCacheRun:
    probes: tuple[CacheProbe, ...] = ()
    binding: str = ""
    caching_off: str | None = None  # which engines state prefix caching is off
    not_run: str | None = None
    prompt_tokens: int = 0
    timing: tuple[CacheProbe, ...] = ()  # the timing audit's samples (sent only where counters are silent)
    timing_prompt_tokens: int = 0

    def of(self, kind: CacheProbeKind) -> list[CacheProbe]:
        return [p for p in self.probes if p.kind is kind]

    def timing_of(self, kind: CacheProbeKind) -> list[float]:
        """The time to first token of the timing samples of one kind that were served."""
        return [p.ttft_s for p in self.timing if p.kind is kind and p.completion.served]


@dataclass(frozen=True, kw_only=True)
class IsolationRun:
    scenarios: tuple[Scenario, ...] = ()
    cache: PrefixCacheRun | None = None
    canaries: Mapping[Tenant, str] = field(default_factory=dict)  # our synthetic canary per tenant
    binding: str = ""  # how the tenants were told apart (cache_salt, header, API keys)
    not_run: str | None = None
    healthy_after: Mapping[str, bool] = field(default_factory=dict)
    idle_after: Mapping[str, bool | None] = field(default_factory=dict)
    untied_danger_lines: tuple[DangerLine, ...] = ()  # logged between scenarios or during the prefix-cache probes
    # The small request sent after the last isolation probe, the check's last request: the engine
    # is judged healthy after the probes that can wedge it, not before them.
    small_request_after: Completion | None = None
    stopped: str | None = None  # why the run stopped before its end (an engine stopped answering, the deadline)
    not_answering: str | None = None  # the run stopped because the engine stopped answering (of `stopped`)

    def requests(self) -> list[TenantRequest]:
        return [r for s in self.scenarios for r in s.requests]


def ttft_summary(cache: PrefixCacheRun) -> dict[CacheProbeKind, float] | None:
    """Median time-to-first-token of cold, same-tenant warm and cross-tenant requests."""
    out = {}
    for kind in CONTROL_KINDS:
        values = [p.ttft_s for p in cache.of(kind) if p.completion.error_message is None and p.completion.status == 200]
        if not values:
            return None
        out[kind] = statistics.median(values)
    return out
