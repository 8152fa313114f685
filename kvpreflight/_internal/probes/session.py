"""What every prober of one probe run shares: the entry and the engines behind it, their
snapshots, the limits the probes are sized from, the budget, the logs followed, where progress
goes, and how a connection to the entry is made. One frozen object, passed as one argument."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.engines.interface import EngineAdapter
from kvpreflight._internal.probes.budget import Budget
from kvpreflight._internal.probes.logs import LogWatch
from kvpreflight._internal.probes.results import Limits
from kvpreflight.model import EngineSnapshot
from kvpreflight.targets import REQUEST_TIMEOUT_S


def _silent(_: str) -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class Connection:
    """How a connection to the entry is made: the deployment's headers, TLS and socket timeout.
    Each synthetic tenant opens its own with its credentials added; a raw disconnect repeats it."""

    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = REQUEST_TIMEOUT_S  # also the socket timeout of the disconnect probes (budgets: probes/budget.py)
    ca_bundle: str | None = None
    client_cert: str | None = None  # mutual TLS (see HttpClient)
    client_key: str | None = None

    def client(self, extra_headers: Mapping[str, str] | None = None) -> HttpClient:
        return HttpClient(headers={**self.headers, **(extra_headers or {})}, ca_bundle=self.ca_bundle,
                          timeout_s=self.timeout_s, client_cert=self.client_cert, client_key=self.client_key)


@dataclass(frozen=True, kw_only=True)
class ProbeSession:
    entry: EngineAdapter  # every probe request goes through it
    engines: Mapping[str, EngineAdapter]  # url -> adapter, for counters
    snapshots: tuple[EngineSnapshot, ...]
    limits: Limits
    budget: Budget
    logs: LogWatch = field(default_factory=lambda: LogWatch({}))
    progress: Callable[[str], None] = _silent
    connection: Connection = field(default_factory=Connection)
