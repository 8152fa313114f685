"""Count cross-checks, shared by prompt-integrity and pd-transfer: a prompt as kvpreflight sent it
against what the engines' own counters say happened to it over the probe's window.

Each engine in a tier (the engines that compute prompts, or the decodes that take their KV)
accounts for a prompt token by computing it, finding it in its prefix cache, or receiving its KV.
A counter is only ever inflated by other traffic in the window, never deflated, so a tier whose
counters add up to less than what was sent (by more than a page a request) is evidence that part
of the prompt was dropped, whatever the answer's usage says. A counter that moved more than the
probe explains is other traffic, said and never failed on; a counter an engine does not have is
said, never assumed to be zero."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpreflight.model import CounterDelta, CounterDeltas, CounterField, EngineSnapshot, Role

DEFAULT_PAGE = 16  # tokens per page where an engine does not say


class Tally(enum.StrEnum):
    """What one tier's counters say about one window's prompt tokens."""

    WHOLE = "whole"  # computed + cached + received covers what was sent
    SHORT = "short"  # every counter read, and together they fall short: part of the prompt was dropped
    UNMEASURED = "unmeasured"  # short on what is counted, but a counter that could make up the rest is missing


# The counters by what they say about a prompt token (the keys of a count's sums and gaps).
COMPUTED, CACHED, RECEIVED = CounterField.PREFILLED_TOKENS, CounterField.CACHED_PROMPT_TOKENS, CounterField.KV_TRANSFER_TOKENS


@dataclass(frozen=True, kw_only=True)
class PromptCount:
    """One tier's account of one window's prompt tokens."""

    tally: Tally
    sent: int  # prompt tokens kvpreflight sent in the window
    requests: int
    computed: float | None  # summed over the tier's engines; None: no engine of the tier counts it
    cached: float | None
    received: float | None
    allowance: int  # tokens a tier may fall short by (a page a request: page-granular counting)
    missing: tuple[str, ...] = ()  # "url: what it does not count"
    other_traffic: tuple[str, ...] = ()  # "url: what moved more than the probe explains"

    @property
    def accounted(self) -> float:
        return sum(v for v in (self.computed, self.cached, self.received) if v is not None)

    def describe(self) -> str:
        parts = [f"computed {_n(self.computed)}", f"found {_n(self.cached)} in the prefix cache"]
        if self.received is not None:
            parts.append(f"received KV for {_n(self.received)}")
        said = f"{self.sent:,} prompt tokens sent; the engines' counters: " + ", ".join(parts)
        if self.tally is Tally.SHORT:
            said += f": {self.sent - self.accounted:,.0f} prompt tokens never computed, cached or received"
        if self.missing:
            said += "; not counted: " + "; ".join(self.missing)
        if self.other_traffic:
            said += "; other traffic in the window (" + "; ".join(self.other_traffic) + "), so these counts bound it from above only"
        return said

    def evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tally": self.tally.value, "prompt_tokens_sent": self.sent, "requests": self.requests,
                               "computed_tokens": self.computed, "cached_tokens": self.cached,
                               "kv_received_tokens": self.received, "allowed_shortfall_tokens": self.allowance}
        if self.missing:
            out["not_counted"] = list(self.missing)
        if self.other_traffic:
            out["other_traffic"] = list(self.other_traffic)
        return out


def computing_tier(snapshots: Sequence[EngineSnapshot]) -> tuple[EngineSnapshot, ...]:
    """The engines that compute prompts (unified or prefill): each prompt token is computed or cached there."""
    return tuple(s for s in snapshots if s.role is not Role.DECODE)


def prompt_count(sent: int, requests: int, deltas: CounterDeltas, tier: Sequence[EngineSnapshot],
                 *, allowance: int | None = None) -> PromptCount:
    """How the `tier`'s counters over one window account for `sent` prompt tokens in `requests`
    requests. `allowance` overrides the page a request a tier may fall short by."""
    page = max((s.page_size or DEFAULT_PAGE for s in tier), default=DEFAULT_PAGE)
    allowed = page * max(1, requests) if allowance is None else allowance
    sums: dict[CounterField, float | None] = {COMPUTED: None, CACHED: None, RECEIVED: None}
    missing: list[str] = []
    other: list[str] = []
    for snap in tier:
        d = deltas.get(snap.url)
        if d is None:
            missing.append(f"{snap.url}: no counters")
            continue
        values = {COMPUTED: d.prefilled_tokens, CACHED: d.cached_prompt_tokens, RECEIVED: d.kv_transfer_tokens}
        if values[CACHED] is None and snap.prefix_caching is False:
            values[CACHED] = 0.0  # it states its prefix cache is off: nothing can be found there
        if snap.role is Role.PREFILL:
            # A prefill takes no KV from another engine: a transfer counter it has counts the KV
            # it SENT, tokens it had to compute or find first. Added here it counted every sent
            # token twice, and a prefill that computed half a prompt and sent "all" of it was whole.
            values[RECEIVED] = 0.0
        elif values[RECEIVED] is None and snap.role is not Role.DECODE:
            values[RECEIVED] = 0.0  # a unified engine without a KV connector takes no KV from another
        for key, value in values.items():
            if value is None:
                missing.append(f"{snap.url}: {_WHAT[key]}")
            else:
                sums[key] = (sums[key] or 0.0) + value
        other += other_traffic(snap.url, d, sent + allowed, requests)
    known = sum(v for v in sums.values() if v is not None)
    if known > sent + allowed and not other:
        other.append(f"{known:,.0f} prompt tokens accounted for")
    if known + allowed >= sent:
        tally = Tally.WHOLE
    else:
        tally = Tally.UNMEASURED if missing else Tally.SHORT
    return PromptCount(tally=tally, sent=sent, requests=requests, computed=sums[COMPUTED], cached=sums[CACHED],
                       received=sums[RECEIVED], allowance=allowed, missing=tuple(missing), other_traffic=tuple(other))


def other_traffic(url: str, delta: CounterDelta, most_tokens: float, requests: int) -> list[str]:
    """What one engine's counters over a window moved beyond what kvpreflight's own `requests`
    requests (at most `most_tokens` prompt tokens) explain: other traffic was in the window."""
    out = []
    if (asked := delta.prompt_tokens) is not None and asked > most_tokens:
        out.append(f"{url} counted {asked:,.0f} prompt tokens")
    if (served := delta.requests) is not None and served > requests:
        out.append(f"{url} finished {served:,.0f} requests")
    return out


_WHAT = {COMPUTED: "prompt tokens it computed", CACHED: "prefix-cache hits", RECEIVED: "KV it received"}


def _n(value: float | None) -> str:
    return "an uncounted number of tokens" if value is None else f"{value:,.0f} tokens"
