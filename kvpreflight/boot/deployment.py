"""What a booted deployment looks like to the rest of kvpreflight: the same targets attach mode
has (URLs), plus the log file of each engine and the processes that belong to it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvpreflight.boot import proctree
from kvpreflight.boot.spec import DeploymentSpec
from kvpreflight.model import ProcessListeners, ProcessRole

if TYPE_CHECKING:
    from kvpreflight._internal.gpus import GpuInventory


@dataclass(frozen=True)
class BootedEngine:
    name: str
    role: ProcessRole
    url: str
    ready_url: str
    pid: int  # also the process group id
    log_path: str
    engine: str  # sglang | vllm | llamacpp | tgi | builtin | auto (not known from the command); a router also smg
    gpus: tuple[str, ...]  # what CUDA_VISIBLE_DEVICES was set to; () when not set
    port: int | None

    def running(self) -> bool:
        """Whether the engine's main process is still alive (an engine may die under a probe)."""
        return proctree.alive(self.pid)

    def process_ids(self) -> frozenset[int]:
        """The engine's live processes now (its group and any descendant that left the group).
        Match these with gpus.inventory() PIDs to see which engine holds which GPU."""
        return frozenset(proctree.family(self.pid, self.pid))


@dataclass(frozen=True)
class BootedDeployment:
    spec: DeploymentSpec
    engines: tuple[BootedEngine, ...]
    entry_url: str
    log_files: Mapping[str, str]  # engine URL -> its log file

    def engine(self, name: str) -> BootedEngine:
        for engine in self.engines:
            if engine.name == name:
                return engine
        raise KeyError(name)

    @property
    def workers(self) -> tuple[BootedEngine, ...]:
        """The engines that hold KV pools (everything but routers)."""
        return tuple(e for e in self.engines if e.role is not ProcessRole.ROUTER)

    def listeners(self) -> tuple[ProcessListeners, ...]:
        """Each engine's (and router's) listening TCP sockets now, from /proc, each named by its
        engine's URL and start-up log (kvpreflight._internal.engines.listeners), or why they were not read."""
        from kvpreflight._internal.engines.errors import EngineConfigError
        from kvpreflight._internal.engines.listeners import identify
        from kvpreflight._internal.files import FileKind, read_tail
        from kvpreflight.boot.sockets import SocketsUnreadable, listening

        out = []
        for engine in self.engines:
            url = engine.url.rstrip("/")
            try:
                sockets = listening(engine.process_ids())
            except SocketsUnreadable as exc:
                out.append(ProcessListeners(engine.name, url, None, unread=str(exc)))
                continue
            try:
                log_text: str | None = read_tail(engine.log_path, FileKind.LOG, EngineConfigError)
            except EngineConfigError:
                log_text = None  # the sockets stay, each unidentified beyond its URL's port
            found = [(s.pid, s.program, s.address, s.port) for s in sockets]
            out.append(identify(engine.name, url, found, log_text))
        return tuple(out)

    def gpu_records(self, found: GpuInventory | None = None) -> tuple[Mapping[str, Any], ...]:
        """The GPU inventory (kvpreflight._internal.gpus.inventory() unless `found` is given), one mapping
        per GPU, each with "engines": the names of the engines whose processes run on it."""
        if found is None:
            from kvpreflight._internal.gpus import inventory

            found = inventory()
        families = {e.name: e.process_ids() for e in self.engines}
        records = []
        for gpu, record in zip(found.gpus, found.records(), strict=True):
            on_it = {p.pid for p in gpu.processes}
            records.append({**record, "engines": [name for name, pids in families.items() if pids & on_it]})
        return tuple(records)
