"""The watcher's Prometheus series, rendered by prometheus_client: the last round's findings as
gauges, their counts since start as counters, served on `--listen` and/or written atomically to
`--textfile DIR` for node_exporter. Every series carries `deployment` (as `check --format
prometheus` does: --name, else the entry URL); URLs in labels keep scheme, host, port and path."""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvpreflight._internal.watch.findings import FindingKind, Round, RoundOutcome
from kvpreflight.formats._common import label_url

OUTCOMES = tuple(RoundOutcome)


@dataclass
class _Deployment:
    """What the series say about one deployment."""

    last: Round | None = None
    found: Counter[FindingKind] = field(default_factory=Counter)
    rounds: Counter[RoundOutcome] = field(default_factory=Counter)
    requests: int = 0
    tokens: int = 0


class WatchMetrics:
    """What the last round found and how often each kind was found since start, per deployment
    (one, or every deployment of an inventory, each its own `deployment` label). Thread-safe:
    the HTTP endpoint reads while the loop writes. Its size is bounded by the deployments and
    their last rounds' findings (the counters are per kind and outcome, closed sets)."""

    def __init__(self, deployment: str, *, deployments: Sequence[str] = (), name: str | None = None) -> None:
        from prometheus_client import CollectorRegistry

        self.deployment = deployment  # the label of a round that names none
        self.name = name or deployment  # names the textfile
        self._lock = threading.Lock()
        self._state: dict[str, _Deployment] = {d: _Deployment() for d in (*deployments, deployment) if d}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)  # a Collector is anything with collect()

    def record(self, round_: Round) -> None:
        with self._lock:
            state = self._state.setdefault(round_.deployment or self.deployment, _Deployment())
            state.last = round_
            state.found.update(f.kind for f in round_.findings)
            state.rounds[round_.outcome] += 1
            state.requests += round_.requests
            state.tokens += round_.prompt_tokens

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            states = {d: replace(st, found=Counter(st.found), rounds=Counter(st.rounds)) for d, st in self._state.items()}
        per_kind = GaugeMetricFamily("kvpreflight_watch_last_round_findings", "Findings of the last round, by kind.",
                                     labels=["deployment", "kind"])
        each = GaugeMetricFamily("kvpreflight_watch_finding", "One finding of the last round (1 while it holds).",
                                 labels=["deployment", "kind", "what", "endpoint"])
        total = CounterMetricFamily("kvpreflight_watch_findings", "Findings since the watcher started, by kind.",
                                    labels=["deployment", "kind"])
        outcome_total = CounterMetricFamily("kvpreflight_watch_rounds", "Rounds since start, by outcome.",
                                            labels=["deployment", "outcome"])
        sent = {name: CounterMetricFamily(f"kvpreflight_watch_{name}", doc, labels=["deployment"])
                for name, doc in (("requests", "Synthetic requests sent since start."),
                                  ("prompt_tokens", "Prompt tokens the synthetic requests submitted since start."))}
        state = GaugeMetricFamily("kvpreflight_watch_last_round_outcome", "1 for the last round's outcome, 0 for the others.",
                                  labels=["deployment", "outcome"])
        stamp = GaugeMetricFamily("kvpreflight_watch_last_round_timestamp_seconds", "When the last round finished (Unix time).",
                                  labels=["deployment"])
        for d, st in states.items():
            last = st.last
            last_kinds = Counter(f.kind for f in last.findings) if last is not None else Counter()
            for kind in FindingKind:
                per_kind.add_metric([d, kind.value], last_kinds[kind])
                total.add_metric([d, kind.value], st.found[kind])
            seen: set[tuple[str, str, str]] = set()
            for f in last.findings if last is not None else ():
                key = (f.kind.value, f.what, label_url(f.endpoint) or f.endpoint or "all")
                if key not in seen:  # one series per (kind, what, endpoint), however many lines said it
                    seen.add(key)
                    each.add_metric([d, *key], 1)
            for outcome in OUTCOMES:
                outcome_total.add_metric([d, outcome.value], st.rounds[outcome])
            sent["requests"].add_metric([d], st.requests)
            sent["prompt_tokens"].add_metric([d], st.tokens)
            if last is not None:
                for outcome in OUTCOMES:
                    state.add_metric([d, outcome.value], 1 if last.outcome is outcome else 0)
                stamp.add_metric([d], _unix(last.finished_at))
        yield from (per_kind, each, total, outcome_total, *sent.values())
        if any(st.last is not None for st in states.values()):
            yield state
            yield stamp

    def text(self) -> str:
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode("utf-8")

    def write_textfile(self, folder: Path) -> Path:
        """DIR/kvpreflight-watch-NAME.prom, written atomically (node_exporter never reads half a file)."""
        from prometheus_client import write_to_textfile

        path = Path(folder) / f"kvpreflight-watch-{safe_name(self.name)}.prom"
        write_to_textfile(str(path), self.registry)
        return path

    def serve(self, host: str, port: int) -> Any:
        """Serve /metrics on host:port in a daemon thread; returns the server (its `shutdown()` stops it)."""
        from prometheus_client import start_http_server

        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server


def safe_name(text: str) -> str:
    """A deployment name fit for a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "kvpreflight"


def _unix(text: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
