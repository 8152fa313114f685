"""The engines' monotonic counters as kvpreflight reads them: one field per counter
(`CounterField`), the values an engine's counters read, and how far they moved over one window
(`CounterDelta`). Ground floor: imports nothing of kvpreflight; kvpreflight.model re-exports it,
so the checks read counters where they read every other result type."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

# Counters.extra keys every adapter uses for KV-transfer time (a histogram's sum in seconds, its
# count), so no check names an engine's metric.
TRANSFER_SECONDS, TRANSFERS_TIMED = "kv_transfer_seconds_sum", "kv_transfer_seconds_count"


class CounterField(enum.StrEnum):
    """The engines' monotonic counters, by the name every adapter maps its metrics onto (the
    `CounterValues` field, and the key in a report's `counter_deltas`)."""

    REQUESTS = "requests"
    PROMPT_TOKENS = "prompt_tokens"
    GENERATION_TOKENS = "generation_tokens"
    TRANSFER_FAILURES = "transfer_failures"
    BOOTSTRAP_FAILURES = "bootstrap_failures"
    DEFERRED_RELEASES = "deferred_releases"
    STALE_KV_READS = "stale_kv_reads"
    EXPIRED_KV = "expired_kv"
    ABORTED_REQUESTS = "aborted_requests"
    SCHEDULED_PROMPT_TOKENS = "scheduled_prompt_tokens"
    KV_TRANSFERS = "kv_transfers"
    KV_TRANSFER_TOKENS = "kv_transfer_tokens"
    PREFIX_CACHE_HITS = "prefix_cache_hits"
    PREFILLED_TOKENS = "prefilled_tokens"
    CACHED_PROMPT_TOKENS = "cached_prompt_tokens"


@dataclass(frozen=True, kw_only=True)
class CounterValues:
    """One value per monotonic counter (a `CounterField` each, in its order): what an engine's
    counters read (engines.interface.Counters), or how far they moved (CounterDelta). None where
    the engine has no such counter or it could not be read: unknown, never 0."""

    requests: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    transfer_failures: float | None = None  # KV transfers that failed
    bootstrap_failures: float | None = None  # prefill/decode handshakes that failed
    deferred_releases: float | None = None  # decode KV releases held back until a transfer drained
    # A decode finished reading KV its prefill no longer held (the lease expired or the request
    # was gone): those pages may have been reused before the read, another request's KV in them.
    stale_kv_reads: float | None = None
    # The prefill released a request's KV no decode had read within its lease (the decode, if it
    # still wants it, recomputes the prompt: a prefill's work lost, and its pages pinned until then).
    expired_kv: float | None = None
    aborted_requests: float | None = None  # requests the engine ended as aborted (a client left)
    # Prompt tokens of the requests the engine's scheduler took up (began to prefill), whether or
    # not a token followed: with prompt and generated tokens, it shows a request cut off mid-prefill.
    scheduled_prompt_tokens: float | None = None
    kv_transfers: float | None = None  # KV transfers completed
    kv_transfer_tokens: float | None = None  # tokens moved by KV transfers
    prefix_cache_hits: float | None = None  # prefix-cache hits (lookups or tokens, as the engine counts)
    prefilled_tokens: float | None = None  # prompt tokens really computed (cache hits excluded); None: cannot tell
    cached_prompt_tokens: float | None = None  # prompt tokens served from this engine's own prefix cache

    def get(self, name: CounterField) -> float | None:
        """One counter by its field, for code that picks counters by name (None: unknown). A
        name that is no counter raises ValueError rather than reading as unknown."""
        value: float | None = getattr(self, CounterField(name).value)
        return value


@dataclass(frozen=True, kw_only=True)
class CounterDelta(CounterValues):
    """How far one engine's counters moved over one window. A field is None where the counter
    was not known at both ends (the engine has none, or it could not be read): unknown, never
    idle; 0.0 where it was read at both ends and did not move."""

    extra: Mapping[str, float] = field(default_factory=dict)  # other engine counters, for evidence only

    @classmethod
    def of(cls, moved: Mapping[CounterField, float], extra: Mapping[str, float] | None = None) -> CounterDelta:
        """The delta whose known counters are `moved` (every other one unknown)."""
        return cls(**{f.value: v for f, v in moved.items()}, extra=dict(extra or {}))

    @property
    def transfer_seconds(self) -> float | None:
        """Seconds the engine's KV transfers took, summed (its transfer-time histogram's sum)."""
        return self.extra.get(TRANSFER_SECONDS)

    @property
    def transfers_timed(self) -> float | None:
        """How many KV transfers that time covers (the histogram's count)."""
        return self.extra.get(TRANSFERS_TIMED)

    def known(self) -> dict[str, float]:
        """Every counter known at both ends, by name (CounterField order, then `extra`): the
        shape a report's `counter_deltas` quotes."""
        out = {f.value: v for f in CounterField if (v := self.get(f)) is not None}
        return {**out, **self.extra}

    @property
    def fell(self) -> bool:
        """A counter went down: the engine restarted (its counters began again) in the window."""
        return any(v < 0 for v in self.known().values())


CounterDeltas = Mapping[str, CounterDelta]  # engine URL -> its counters' deltas over one window
