"""Could the engine have computed what it says it computed, in the time it took? An answer to a
long prompt nobody had sent before, whose first token came an order of magnitude sooner than the
engine's fastest prefill in this run allows for the tokens it did not report cached, was not
computed from that prompt (a placeholder prefilled in its place: the incident). Works for any
model, echoing or not, through any gateway. Never fails an honest engine: the speed is the
fastest the run showed (the calibration's, or any shorter request's: a stalled calibration cannot
make an honest answer look impossible), the margin is wide, an answer is judged only where some
request's prefill stood clear of the run's fixed-cost spread, and a prefill predicted shorter than
MIN_JUDGED_S (or than 20 requests' fixed cost) is within noise and not judged."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvpreflight._internal.probes.results import IsolationRun, ProbeName, ProbeResult, ProbeRun
from kvpreflight.model import Completion, CounterDeltas

MARGIN = 10.0  # an answer this many times faster than the fastest prefill allows is impossible
# A prefill predicted shorter than this, or than OVERHEAD_MULTIPLE x a request's fixed cost, is not
# judged: on an engine whose requests cost mostly a fixed time (the builtin engine on a CPU: the
# calibration measured 7-12k tokens/s from 8- and 127-token requests, while it computed 2,041
# tokens in a few ms), every speed measured from a short request understates the real one.
MIN_JUDGED_S = 0.5
OVERHEAD_MULTIPLE = 20.0
MIN_MEASURABLE_S = 0.001  # a request's time to first token past its fixed cost, at least this
REFERENCE_FRACTION = 0.5  # a reference request computed at most this share of the judged prompt
SMALL_FRACTION = 1 / 16  # a request this small (as the calibration's short one) shows the fixed cost


@dataclass(frozen=True)
class Judged:
    """One answer to a prompt first sent in this run, against the fastest prefill speed seen."""

    probe: str
    computed_tokens: int  # sent, less the cached tokens it reports or its engines' counters show
    first_token_s: float
    fastest_rate: float | None  # prompt tokens per second
    fastest_from: str
    overhead_s: float = 0.0  # the fixed cost of a request, as the calibration measured it

    @property
    def needs_s(self) -> float | None:
        return None if not self.fastest_rate else self.computed_tokens / self.fastest_rate

    @property
    def impossible(self) -> bool:
        needs = self.needs_s
        return (needs is not None and needs >= max(MIN_JUDGED_S, OVERHEAD_MULTIPLE * self.overhead_s)
                and self.first_token_s * MARGIN < needs)

    def describe(self) -> str:
        return (f"{self.probe} answered a {self.computed_tokens:,}-token uncached prompt in {self.first_token_s:.3f} s; at the "
                f"fastest prefill this engine showed in the run ({self.fastest_rate or 0:,.0f} tokens/s, {self.fastest_from}) "
                f"computing it takes at least {self.needs_s or 0:.3f} s ({MARGIN:g}x margin allowed)")

    def evidence(self) -> dict[str, Any]:
        return {"probe": self.probe, "computed_tokens": self.computed_tokens, "first_token_s": round(self.first_token_s, 4),
                "fastest_prefill_tokens_per_second": None if self.fastest_rate is None else round(self.fastest_rate, 1),
                "fastest_from": self.fastest_from, "needs_at_least_s": None if self.needs_s is None else round(self.needs_s, 4),
                "margin": MARGIN, "impossible": self.impossible}


def computed_tokens(c: Completion, deltas: CounterDeltas | None = None) -> int:
    """The prompt tokens the engine must have computed: sent, less the larger of the cached tokens
    the answer reports and those its engines' counters show over its window (the benign reading:
    this rule must never fail a cache hit)."""
    cached = max([c.cached_tokens or 0, *(d.cached_prompt_tokens or 0 for d in (deltas or {}).values())])
    return max(0, c.sent_tokens - int(cached))


def _rate(c: Completion, computed: int, overhead_s: float) -> float:
    return computed / max(c.first_token_s - overhead_s, MIN_MEASURABLE_S)


def first_sent(run: ProbeRun) -> list[ProbeResult]:
    """The served near-limit probes whose prompt no earlier request of the run began with: the
    limit prompt, and the first concurrent request of a tenant it did not carry (the others repeat
    a prompt already sent, which an engine may rightly have cached without saying so)."""
    out, seen = [], set()
    for p in run.of(ProbeName.BOUNDARY_ACCEPT, ProbeName.CONCURRENT):
        key = p.tenant if p.tenant is not None else "untenanted"
        if key in seen:
            continue
        seen.add(key)
        if p.completion.served:
            out.append(p)
    return out


def judge(run: ProbeRun, isolation: IsolationRun | None) -> list[Judged]:
    """Every first-sent near-limit answer against the fastest speed the rest of the run showed."""
    others: list[tuple[str, Completion, int]] = [
        (p.name, p.completion, computed_tokens(p.completion, p.counter_deltas)) for p in run.probes if p.completion.served]
    if isolation is not None:
        others += [(r.name, r.completion, computed_tokens(r.completion)) for r in isolation.requests()
                   if r.completion is not None and r.served]
    out = []
    for p in first_sent(run):
        computed = computed_tokens(p.completion, p.counter_deltas)
        # The fixed cost of a request as the run showed it: the tiny calibration request's time, or
        # the slowest first token of any small request (a P/D pair's per-request cost varies by tens
        # of ms). A speed is trusted only from a request whose prefill took at least that long past
        # its fixed cost: else its time is mostly that cost's spread and the speed it gives may
        # understate the engine's (live SGLang P/D at a 1,024 context: 8- and 63-token calibration
        # requests, a 15x understated speed, an honest answer failed). Judged only where some speed
        # is trusted, and then against the fastest of all (a stalled request must not slow it).
        band = max([run.overhead_s, *(c.first_token_s for _, c, k in others if 0 < k <= computed * SMALL_FRACTION)])
        rate, source, trusted = None, "no speed measured", False
        if run.prefill_rate:  # without it the fixed cost of a request is unknown: nothing is judged
            rate, source = run.prefill_rate, "the calibration"
            trusted = run.calibration_prefill_s is not None and run.calibration_prefill_s >= band
            for name, c, n in _references(others, p.name, computed):
                trusted = trusted or c.first_token_s - run.overhead_s >= band
                if (r := _rate(c, n, run.overhead_s)) > rate:
                    rate, source = r, f"{name}, {n:,} tokens"
            if not trusted:
                rate, source = None, "no speed measured past the fixed cost"
        out.append(Judged(p.name, computed, p.completion.first_token_s, rate, source, run.overhead_s))
    return out


def _references(others: Iterable[tuple[str, Completion, int]], judged: str, computed: int) -> list[tuple[str, Completion, int]]:
    return [(n, c, k) for n, c, k in others if n != judged and 0 < k <= computed * REFERENCE_FRACTION]
