"""Hazards: the engines' own danger counters' deltas since the last round, and the danger lines
their logs (and the router's) gained since the last round. The counters are the typed
`Counters` fields every adapter maps its engine's metric names onto (probes/results.py reads
the same deltas for the checks); the lines are `probes.logs.LogWatch`'s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from kvpreflight._internal.engines.interface import Counters
from kvpreflight._internal.engines.log_patterns import LogSignal
from kvpreflight._internal.probes.engine_state import counter_deltas
from kvpreflight._internal.probes.logs import LogWatch
from kvpreflight._internal.probes.results import counter_moved
from kvpreflight._internal.watch.findings import Finding, FindingKind
from kvpreflight.model import CounterDelta, CounterField

# Counter -> what its moving means. Each is a finding when it moves between two rounds.
DANGER_COUNTERS: Mapping[CounterField, str] = {
    CounterField.STALE_KV_READS: "late KV reads (a decode read KV its prefill had already released)",
    CounterField.EXPIRED_KV: "KV leases that expired before any decode read them",
    CounterField.TRANSFER_FAILURES: "failed KV transfers",
    CounterField.BOOTSTRAP_FAILURES: "failed prefill/decode handshakes",
}
# Counted and exported, not a finding: clients leave live deployments all the time.
NOTED_COUNTERS: Mapping[CounterField, str] = {CounterField.ABORTED_REQUESTS: "aborted requests (clients that left)"}


class HazardWatch:
    """Remembers each engine's counters and each log's offset between rounds."""

    def __init__(self, logs: Mapping[str, Path]) -> None:
        self._logs = dict(logs)
        self._watches: dict[str, LogWatch] = {}  # one per log, opened when its engine's kind is known
        self._last: dict[str, Counters] = {}

    def follow_logs(self, signals: Mapping[str, Sequence[LogSignal]]) -> None:
        """Start following each given log whose engine (or router) kind is now known: `signals`
        is url -> that kind's log signals. A log is read from where it stood then."""
        for url, path in self._logs.items():
            if url not in self._watches and url in signals:
                self._watches[url] = LogWatch({url: (path, signals[url])})

    def take(self, counters: Mapping[str, Counters | None]) -> tuple[list[Finding], list[str], dict[str, CounterDelta]]:
        """This round's hazard findings, notes, and each engine's counters' deltas (url -> delta).
        An engine's first round (or one after it could not be read, or was restarted: a counter
        went down) sets its baseline and finds nothing."""
        before = {url: self._last.get(url) for url in counters}
        deltas = {url: d for url, d in counter_deltas(before, counters).items() if not d.fell}
        # Kept: each engine read this round (one unreadable now keeps its last counters, so what
        # moved meanwhile is counted when it answers again); dropped: engines no longer listed.
        self._last = {url: now if now is not None else self._last[url]
                      for url, now in counters.items() if now is not None or url in self._last}
        findings: list[Finding] = []
        for name, meaning in DANGER_COUNTERS.items():
            for url, moved in counter_moved(deltas, name).items():
                findings.append(Finding(kind=FindingKind.HAZARD, what=name.value.replace("_", "-"), endpoint=url,
                                        message=f"{url}: {moved} {meaning} since the last round", found=moved))
        notes = [f"{url}: {moved} {meaning} since the last round"
                 for name, meaning in NOTED_COUNTERS.items() for url, moved in counter_moved(deltas, name).items()]
        for watch in self._watches.values():
            for line in watch.take():
                rid = f" (request {line.request_id})" if line.request_id else ""
                detail = f": {line.detail}" if line.detail else ""
                findings.append(Finding(kind=FindingKind.HAZARD, what=f"log-{line.hazard.value}", endpoint=line.source,
                                        message=f"{line.source} logged: {line.what}{rid}{detail}"))
        return findings, notes, deltas
