"""The engines' state around the probes, shared by the capacity and isolation probes: counters
read before and after requests, how far they moved, and the bounded wait until the pools are idle."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.interface import Counters, EngineAdapter
from kvpreflight.model import CounterDelta

IDLE_POLL_S = 0.1


def counter_deltas(before: Mapping[str, Counters | None], after: Mapping[str, Counters | None]) -> dict[str, CounterDelta]:
    """Per engine URL, how far each counter known at both moments moved. An engine left out was
    not read at both moments (or has no counter): nothing is known of it, not that it was idle."""
    out: dict[str, CounterDelta] = {}
    for url, a in after.items():
        b = before.get(url)
        if a is not None and b is not None and (moved := a.deltas_since(b)).known():
            out[url] = moved
    return out


class EngineState:
    """Reads every engine's counters; an engine that cannot be read counts as unknown, never idle."""

    def __init__(self, engines: Mapping[str, EngineAdapter]) -> None:
        self.engines = engines
        self._stuck: dict[str, float] = {}  # url -> tokens an engine still held after a bounded wait

    def counters(self) -> dict[str, Counters | None]:
        out: dict[str, Counters | None] = {}
        for url, adapter in self.engines.items():
            try:
                out[url] = adapter.counters()
            except EngineError:
                out[url] = None
        return out

    def used(self, url: str) -> float | None:
        """Tokens the engine's pool holds right now (None: no gauge, or unreadable)."""
        try:
            return self.engines[url].counters().used_tokens
        except EngineError:
            return None

    def total(self, read: Callable[[Counters], float | None]) -> float | None:
        """One counter summed over every engine that reports it; None when none does."""
        values = [v for c in self.counters().values() if c is not None and (v := read(c)) is not None]
        return sum(values) if values else None

    def wait_idle(self, max_wait_s: float) -> dict[str, bool | None]:
        """Wait (bounded) until every engine's used-token gauge is back to 0. An engine already
        found stuck is not waited for again while it holds no more than it did then."""
        idle: dict[str, bool | None] = {}
        pending = set(self.engines)
        deadline = time.monotonic() + max_wait_s
        while True:
            for url in list(pending):
                used = self.used(url)
                idle[url] = None if used is None else used == 0
                if idle[url] is not False or (used is not None and used <= self._stuck.get(url, -1)):
                    pending.discard(url)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(IDLE_POLL_S)
        for url in pending:
            if used := self.used(url):
                self._stuck[url] = used
        return idle
