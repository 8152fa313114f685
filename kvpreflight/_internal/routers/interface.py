"""The router-adapter interface: what the PD router in front of the engines says about them.

A router adapter knows one router kind's endpoints; it reads, never judges. Every router known so
far (kvpreflight's builtin router, smg, vllm-router: the sgl-router lineage) lists its workers at
GET /workers as {"workers": [{"url": ..., "worker_type": "prefill" | "decode" | "regular"}, ...]};
`workers_listed` reads that shape once for all of them.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import BodyLimit, HttpClient
from kvpreflight._internal.engines.log_patterns import LogSignal
from kvpreflight._internal.engines.untrusted import excerpt, json_list, json_object, optional_text
from kvpreflight.model import EngineSnapshot, Role, RoleSource

# worker_type as the sgl-router lineage names it; "regular" is a worker that does both.
WORKER_TYPES = {"prefill": Role.PREFILL, "decode": Role.DECODE, "regular": Role.UNIFIED}


@dataclass(frozen=True)
class RouterWorker:
    """One engine the router sends requests to, and the role it uses it in."""

    url: str
    role: Role


@dataclass(frozen=True)
class RouterListing:
    """The workers one router lists, and how kvpreflight found out."""

    router: str  # the router's kind (a kvpreflight._internal.routers.ROUTERS key)
    url: str
    source: str  # the endpoint read, e.g. "GET /workers"
    workers: tuple[RouterWorker, ...]
    # The context the router itself serves (Dynamo's frontend states it; its workers do not),
    # given to an engine that states none.
    served_context: int | None = None
    # Why a router lists no worker URLs, and what to give instead (a router that names its workers
    # otherwise, by instance id).
    unlisted: str | None = None
    # A router that names its workers by instance id: each one it routes to ("component instance-id"
    # -> the id as its engine's snapshot states it in the setting `instance_setting`).
    instances: Mapping[str, str] = field(default_factory=dict)
    instance_setting: str | None = None

    def unread_instances(self, snapshots: Sequence[EngineSnapshot]) -> tuple[str, ...]:
        """The workers the router routes to that no snapshot is of (their pools were not read)."""
        if self.instance_setting is None:
            return ()
        read = {str(s.settings.get(self.instance_setting)) for s in snapshots}
        return tuple(name for name, instance in self.instances.items() if instance not in read)

    def role_of(self, url: str) -> Role | None:
        return next((w.role for w in self.workers if w.url == url.rstrip("/")), None)

    def applied_to(self, snapshot: EngineSnapshot) -> EngineSnapshot:
        """The snapshot with the role the router uses it in, where neither the user nor the engine
        stated one (where they did and the router disagrees, a note says so), and the router's
        served context where the engine stated none."""
        where = f"the {self.router} router at {self.url} ({self.source})"
        if snapshot.served_context is None and self.served_context is not None:
            snapshot = replace(snapshot, served_context=self.served_context,
                               notes=(*snapshot.notes, f"served context {self.served_context:,} as stated by {where}"))
        routed = self.role_of(snapshot.url)
        if routed is None:
            return snapshot
        if snapshot.role_source is RoleSource.ASSUMED:
            return replace(snapshot, role=routed, role_source=RoleSource.ROUTER,
                           notes=(*snapshot.notes, f"role {routed.value} as listed by {where}"))
        if routed is not snapshot.role:
            return replace(snapshot, notes=(*snapshot.notes, f"{where} lists it as {routed.value}; "
                                            f"kept {snapshot.role.value} ({snapshot.role_source.value})"))
        return snapshot


class RouterAdapter(abc.ABC):
    kind: ClassVar[str] = ""
    log_signals: ClassVar[tuple[LogSignal, ...]] = ()  # danger lines in the router's log

    def __init__(self, url: str, client: HttpClient) -> None:
        self.url = url.rstrip("/")
        self.client = client

    @classmethod
    @abc.abstractmethod
    def detect(cls, url: str, client: HttpClient) -> bool:
        """Whether the server at url is this router kind (by what it answers, never by its URL)."""

    def listing(self) -> RouterListing:
        """The workers the router lists (GET /workers); an EngineError when it cannot be read."""
        data = self.client.get_json(f"{self.url}/workers", max_bytes=BodyLimit.JSON_INFO)
        return RouterListing(self.kind, self.url, "GET /workers", workers_listed(data, self.url))


def workers_listed(data: Any, url: str) -> tuple[RouterWorker, ...]:
    """The sgl-router lineage's /workers answer as typed workers; a worker type outside the known
    set is an error (a role kvpreflight cannot place is not guessed)."""
    listed = json_list(json_object(data, "/workers answer", url).get("workers"), "/workers workers", url)
    workers = []
    for i, item in enumerate(listed):
        entry = json_object(item, f"/workers workers[{i}]", url)
        worker_url = optional_text(entry.get("url"), f"/workers workers[{i}].url", url)
        kind = optional_text(entry.get("worker_type"), f"/workers workers[{i}].worker_type", url)
        if not worker_url or kind not in WORKER_TYPES:
            raise EngineError(f"{url}/workers: workers[{i}] has url {excerpt(worker_url)} and worker_type {excerpt(kind)}; "
                              f"expected a URL and one of {', '.join(WORKER_TYPES)}")
        workers.append(RouterWorker(worker_url.rstrip("/"), WORKER_TYPES[kind]))
    return tuple(workers)


def serves_list(client: HttpClient, url: str, key: str) -> bool:
    """Whether url answers a JSON object whose `key` is a list (detection asks, it does not insist)."""
    try:
        reply = client.get(url, max_bytes=BodyLimit.JSON_INFO)
        data = reply.json() if reply.status == 200 else None
    except EngineError:
        return False
    return isinstance(data, dict) and isinstance(data.get(key), list)
