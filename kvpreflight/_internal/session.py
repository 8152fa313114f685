"""One deployment, opened once: the HTTP client configured from the plan's auth and TLS options,
the router at the entry asked for its workers, every engine read through its adapter, and the
probe groups (which engines one probe run covers, through which entry adapter), URLs normalised
here and nowhere else. `check`, `check --plan`, every `watch` round and each fleet deployment
(through `kvpreflight.preflight`) open one and judge what they send with `judge`, so a check and a
watch round cannot drift apart.

    with open_session(plan, progress) as session:
        for group in session.groups:
            results = session.judge(group, run, ids)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvpreflight._internal.checkdata import Thresholds, load_thresholds
from kvpreflight._internal.checks import CheckContext, CheckId, run_checks
from kvpreflight._internal.checks.advisory_data import Advisory
from kvpreflight._internal.engines import EngineConfigError, EngineError, HttpClient, adapter_class, open_adapter
from kvpreflight._internal.engines.interface import EngineAdapter
from kvpreflight._internal.engines.listeners import from_log
from kvpreflight._internal.engines.log_patterns import LogSignal
from kvpreflight._internal.engines.openai_completions import openai_entry
from kvpreflight._internal.files import FileKind, read_tail
from kvpreflight._internal.probes.budget import Budget
from kvpreflight._internal.probes.capacity import deployment_limits
from kvpreflight._internal.probes.logs import LogWatch
from kvpreflight._internal.probes.results import IsolationRun, Limits, ProbeRun
from kvpreflight._internal.probes.session import Connection, ProbeSession
from kvpreflight._internal.routers import ROUTERS, RouterListing, open_router, router_class
from kvpreflight.check_plan import CheckPlan
from kvpreflight.errors import ConfigError
from kvpreflight.model import CheckResult, EngineSnapshot, EntryApi, ProcessListeners, Role, Status, Waiver
from kvpreflight.targets import Target

__all__ = ["Connection", "DeploymentSession", "ProbeGroup", "connection_of", "one_kind", "open_session"]

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class ProbeGroup:
    """One probe run: the entry every request goes through (None: nothing to probe through) and
    the engines behind it."""

    entry_url: str | None
    snapshots: tuple[EngineSnapshot, ...]
    entry: EngineAdapter | None


@dataclass(kw_only=True)
class DeploymentSession:
    """What one opening of a deployment read. Made by `open_session`, which closes its clients."""

    plan: CheckPlan
    connection: Connection
    client: HttpClient
    thresholds: Thresholds
    adapters: dict[str, EngineAdapter]
    snapshots: tuple[EngineSnapshot, ...]
    unreadable: tuple[CheckResult, ...]  # kv-capacity inconclusive, one per engine that could not be read
    listing: RouterListing | None
    groups: tuple[ProbeGroup, ...]
    _clients: list[HttpClient] = field(default_factory=list)

    def engines_of(self, group: ProbeGroup) -> dict[str, EngineAdapter]:
        """The read adapters of the group's engines (for counters and tokenizing)."""
        return {s.url: self.adapters[s.url] for s in group.snapshots if s.url in self.adapters}

    def limits(self, group: ProbeGroup) -> Limits | None:
        """The limits a probe through the group's entry is sized from (None: none stated). EngineError
        when the entry cannot be asked."""
        if group.entry is None:
            return None
        return deployment_limits(group.entry, list(group.snapshots))

    def budget(self, *, deadline_s: float | None = None) -> Budget:
        """A request budget with the plan's timeout and its accepted speed (else the thresholds')."""
        return Budget(timeout_s=self.plan.timeout_s, deadline_s=deadline_s,
                      fallback_tokens_per_second=self.plan.accepted_tokens_per_second
                      or self.thresholds.accepted_tokens_per_second)

    def log_watch(self, group: ProbeGroup) -> LogWatch:
        """The logs of the group's engines and of the router at the entry, followed while probing."""
        logs = self.plan.logs
        sources = {s.url: (logs[s.url], self.adapters[s.url].log_signals)
                   for s in group.snapshots if s.url in logs and s.url in self.adapters}
        if self.listing is not None and self.listing.url in logs:
            sources[self.listing.url] = (logs[self.listing.url], router_class(self.listing.router).log_signals)
        return LogWatch(sources)

    def log_signals(self) -> dict[str, Sequence[LogSignal]]:
        """Every read engine's danger lines, and the router's at the entry."""
        signals: dict[str, Sequence[LogSignal]] = {url: a.log_signals for url, a in self.adapters.items()}
        if self.listing is not None:
            signals[self.listing.url] = router_class(self.listing.router).log_signals
        return signals

    def client_with(self, headers: Mapping[str, str]) -> HttpClient:
        """One more client configured as the session's, with `headers` added; closed with the session."""
        client = self.connection.client(headers)
        self._clients.append(client)
        return client

    def probe_session(self, group: ProbeGroup, *, entry: EngineAdapter, limits: Limits, budget: Budget,
                      logs: LogWatch | None = None, progress: Progress = _quiet,
                      headers: Mapping[str, str] | None = None) -> ProbeSession:
        """What every prober of one probe run through `entry` shares; with `headers`, each request
        (and each tenant's own connection) carries them too."""
        connection = self.connection
        if headers:
            connection = replace(connection, headers={**connection.headers, **headers})
            entry = entry.with_client(self.client_with(headers))
        return ProbeSession(entry=entry, engines=self.engines_of(group), snapshots=group.snapshots, limits=limits,
                            budget=budget, logs=logs or LogWatch({}), progress=progress, connection=connection)

    def judge(self, group: ProbeGroup, run: ProbeRun | None, ids: Sequence[str], *, isolation: IsolationRun | None = None,
              advisories: tuple[Advisory, ...] = (), waivers: Sequence[Waiver] = ()) -> tuple[CheckResult, ...]:
        """`check`'s checks `ids` over one probe run: the one place a check and a watch round judge."""
        ctx = CheckContext(group.snapshots, self.thresholds, self.plan.context_length, run, group.entry_url, advisories,
                           isolation=isolation, entry_model=self.plan.entry_model)
        return run_checks(ctx, ids, waivers)

    def judge_deployment(self, ids: Sequence[str], *, advisories: tuple[Advisory, ...] = (),
                         waivers: Sequence[Waiver] = ()) -> tuple[CheckResult, ...]:
        """The checks over every engine read (those of the whole deployment)."""
        ctx = CheckContext(self.snapshots, self.thresholds, self.plan.context_length, None, self.plan.entry, advisories,
                           expected_model=self.plan.model, listeners=listeners_of(self.plan, self.snapshots))
        return run_checks(ctx, ids, waivers)

    def close(self) -> None:
        for client in (*self._clients, self.client):
            client.close()


@contextmanager
def open_session(plan: CheckPlan, progress: Progress = _quiet) -> Iterator[DeploymentSession]:
    """Open the deployment `plan` names: every engine read, every probe group formed. ConfigError
    when the entry's router must list the engines and cannot; an unreadable engine is a
    kv-capacity inconclusive result in `unreadable`."""
    connection = connection_of(plan)
    client = connection.client()
    try:
        thresholds = load_thresholds()
        entry = plan.entry.rstrip("/") if plan.entry else None  # every URL normalised here, once
        adapters, snapshots, unreadable, listing = _read_engines(plan, entry, client, progress)
        groups = tuple(ProbeGroup(entry_url, tuple(group), entry_adapter(plan, entry_url, group, client))
                       for entry_url, group in _probe_groups(entry, snapshots))
    except BaseException:
        client.close()
        raise
    session = DeploymentSession(plan=plan, connection=connection, client=client, thresholds=thresholds, adapters=adapters,
                                snapshots=tuple(snapshots), unreadable=tuple(unreadable), listing=listing, groups=groups)
    try:
        yield session
    finally:
        session.close()


def connection_of(plan: CheckPlan) -> Connection:
    """The one place an HTTP connection is configured from the plan's headers, TLS and timeout."""
    return Connection(headers=plan.auth.headers, timeout_s=plan.timeout_s, ca_bundle=plan.auth.ca_bundle,
                      client_cert=plan.auth.client_cert, client_key=plan.auth.client_key)


def one_kind(named: str, kinds: Sequence[str]) -> str:
    """The engine kind to read with: the one named, else the engines' one kind where all say the
    same and it is known, else auto (each engine detected)."""
    found = set(kinds)
    if named == "auto" and len(found) == 1 and "auto" not in found:
        return next(iter(found))
    return named


def _read_engines(plan: CheckPlan, entry: str | None, client: HttpClient, progress: Progress,
                  ) -> tuple[dict[str, EngineAdapter], list[EngineSnapshot], list[CheckResult], RouterListing | None]:
    adapters: dict[str, EngineAdapter] = {}
    snapshots: list[EngineSnapshot] = []
    unreadable: list[CheckResult] = []
    targets, listing = _targets(plan, entry, client, progress)
    for target in targets:
        url = target.url
        progress(f"reading {url}")
        try:
            adapter = open_adapter(url, client, plan.engine)
            log_text = read_log(plan.logs.get(url))
            snapshot = adapter.read(role=target.role, log_text=log_text)
            snapshots.append(listing.applied_to(snapshot) if listing is not None else snapshot)
            adapters[url] = adapter
        except EngineError as exc:
            unreadable.append(CheckResult(id=CheckId.KV_CAPACITY, status=Status.INCONCLUSIVE,
                                          message=f"could not read the engine: {exc}{_wrong_kind_hint(url, client, plan.engine)}",
                                          endpoint=url))
    if listing is not None:  # a worker the router routes to and nobody named is a pool not read: never a pass
        unreadable.extend(CheckResult(
            id=CheckId.KV_CAPACITY, status=Status.INCONCLUSIVE, endpoint=listing.url,
            message=f"the {listing.router} router routes to the worker {instance}, which no --endpoint names: "
                    f"its pool was not read; {listing.unlisted or 'add --endpoint ROLE=URL for it'}")
            for instance in listing.unread_instances(snapshots))
    return adapters, snapshots, unreadable, listing


def _wrong_kind_hint(url: str, client: HttpClient, named: str) -> str:
    """'; it answers as builtin, not vllm: ...' when --engine named a kind that is not what is there."""
    if named == "auto":
        return ""
    from kvpreflight._internal.engines import answering_kind

    found = answering_kind(url, client, named)
    return f"; it answers as {found}, not {named}: pass --engine {found} or drop --engine" if found else ""


def _targets(plan: CheckPlan, entry: str | None, client: HttpClient, progress: Progress
             ) -> tuple[tuple[Target, ...], RouterListing | None]:
    """The engines to read (URLs without a trailing slash), and what the router at the entry lists
    (None: no entry, or not a router kvpreflight knows). Without --endpoint the router's workers are
    the engines."""
    given = tuple(Target(t.url.rstrip("/"), t.role) for t in plan.targets)
    if entry is None:
        return given, None
    router = open_router(entry, client)
    listing = None
    if router is not None:
        progress(f"asking the {router.kind} router at {entry} for its workers")
        try:
            listing = router.listing()
        except EngineError as exc:
            if not given:
                raise ConfigError(f"--entry {entry}: the {router.kind} router's worker list is unreadable ({exc}); "
                                  "add --endpoint ROLE=URL for every engine behind it") from None
            progress(f"the {router.kind} router's worker list is unreadable ({exc}); using the --endpoint roles")
    if given:
        return given, listing
    if listing is None:
        raise ConfigError(f"--entry {entry} is not a router kvpreflight can ask for its workers ({', '.join(ROUTERS)}); "
                          "add --endpoint URL (or ROLE=URL) for every engine behind it")
    if not listing.workers:
        raise ConfigError(f"--entry {entry}: the {listing.router} router lists no workers ({listing.source}); "
                          + (listing.unlisted or "add --endpoint prefill=URL and --endpoint decode=URL for the engines behind it"))
    return tuple(Target(w.url.rstrip("/")) for w in listing.workers), listing


def _probe_groups(entry: str | None, snapshots: Sequence[EngineSnapshot]) -> list[tuple[str | None, list[EngineSnapshot]]]:
    """Which engines each probe run covers: all of them behind --entry, else each unified engine."""
    if entry or any(s.role is not Role.UNIFIED for s in snapshots):
        return [(entry, list(snapshots))] if snapshots else []
    return [(s.url, [s]) for s in snapshots]


def entry_adapter(plan: CheckPlan, entry_url: str | None, group: Sequence[EngineSnapshot], client: HttpClient
                   ) -> EngineAdapter | None:
    """The adapter every probe request goes through: the engines' kind at the entry's URL (on the
    OpenAI routes for a gateway that serves only those), naming the model they serve, or the
    --entry-model a gateway knows them by (OpenAI-style routes need it). None when there is no entry to probe."""
    if entry_url is None or not group:
        return None
    cls = adapter_class(group[0].engine)
    if plan.entry_api is EntryApi.OPENAI:
        cls = openai_entry(cls)
    return cls(entry_url, client, model=plan.entry_model or group[0].model)


def listeners_of(plan: CheckPlan, snapshots: Sequence[EngineSnapshot]) -> tuple[ProcessListeners, ...]:
    """Every read engine's listening sockets: as /proc showed them to boot mode, else as its
    start-up log (--log) names them."""
    booted = {p.url for p in plan.listeners}
    out = list(plan.listeners)
    for snapshot in snapshots:
        if snapshot.url in booted:
            continue
        try:
            log_text = read_log(plan.logs.get(snapshot.url))
        except EngineError as exc:
            out.append(ProcessListeners(snapshot.url, snapshot.url, None, unread=f"its start-up log cannot be read: {exc}"))
            continue
        out.append(from_log(snapshot.url, snapshot.url, log_text))
    return tuple(out)


def read_log(path: Path | None) -> str | None:
    """The tail of an engine's log file (None: no log given)."""
    if path is None:
        return None
    return read_tail(path, FileKind.LOG, EngineConfigError)
