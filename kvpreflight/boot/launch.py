"""From a spec to concrete launch plans: ports chosen, placeholders filled in, URLs fixed.

Nothing is started here. Problems found now (a port already taken, a placeholder that points at
an engine without a port) are configuration errors: BootConfigError (exit 2).
"""

from __future__ import annotations

import errno
import random
import re
import socket
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from kvpreflight._internal.files import read_system
from kvpreflight.boot.errors import BootConfigError, BootError
from kvpreflight.boot.spec import DEFAULT_HEALTH_PATH, PLACEHOLDER, SMG_READY_PATH, DeploymentSpec, EngineSpec
from kvpreflight.model import ProcessRole, RouterKind

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
PRIVATE_PORTS_FROM = 20000  # chosen ports lie in [this, the ephemeral range's start)

LOOPBACK = "127.0.0.1"
DEFAULT_URL = "http://127.0.0.1:{port}"  # an engine's URL when its spec gives only a port
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1", "::"}


@dataclass(frozen=True)
class LaunchPlan:
    """One engine, ready to start."""

    spec: EngineSpec
    argv: tuple[str, ...]
    env: Mapping[str, str]  # added to the parent's environment
    port: int | None
    url: str
    ready_url: str

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def role(self) -> ProcessRole:
        return self.spec.role

    @property
    def engine(self) -> str:
        """The engine's kind as its spec says it (auto: not known from the command)."""
        return self.spec.kind


@dataclass(frozen=True)
class DeploymentPlan:
    spec: DeploymentSpec
    engines: tuple[LaunchPlan, ...]
    entry_url: str


def free_port(host: str = LOOPBACK, avoid: frozenset[int] | set[int] = frozenset()) -> int:
    """A port nothing listens on right now, not one of `avoid`. Picked below the kernel's ephemeral
    range: a port is chosen well before the engine binds it (a router starts after its workers are
    ready), and a port from that range can meanwhile become the local end of any outgoing
    connection (readiness probes, prefill-to-decode transfers), so the engine's bind would fail."""
    low = _ephemeral_low()
    if low > PRIVATE_PORTS_FROM:
        rng = random.SystemRandom()
        for _ in range(50):
            port = rng.randrange(PRIVATE_PORTS_FROM, low)
            if port not in avoid and not port_in_use(port, host):
                return port
    for _ in range(50):  # no room below the ephemeral range: the kernel's pick
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in avoid:
            return port
    raise BootError(f"could not find a free port on {host}")


def _ephemeral_low() -> int:
    try:
        return int((read_system(EPHEMERAL_RANGE_FILE) or "").split()[0])
    except (ValueError, IndexError):
        return 32768  # Linux's default


def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def plan_deployment(spec: DeploymentSpec, *, python: str | None = None) -> DeploymentPlan:
    return _plan(spec, _choose_ports(spec), python or sys.executable)


def running_plan(spec: DeploymentSpec) -> DeploymentPlan:
    """The plans of a spec's engines started from it elsewhere, at the URLs its port numbers and
    urls fix: no port is chosen or checked, nothing is started. An engine whose port is left to
    boot time has no fixed URL: BootConfigError naming it."""
    ports: dict[str, int | None] = {}
    for i, engine in enumerate(spec.engines):
        template = engine.url or DEFAULT_URL
        if "{port}" in template and not isinstance(engine.port, int):
            raise BootConfigError(f"{spec.source}: engines[{i}] ({engine.name}) has port: {engine.port or 'none'}, so the "
                                  "spec does not fix where it runs; give it a port number (or a url)")
        ports[engine.name] = engine.port if isinstance(engine.port, int) else urlsplit(template).port
    return _plan(spec, ports, sys.executable)


def _plan(spec: DeploymentSpec, ports: Mapping[str, int | None], python: str) -> DeploymentPlan:
    urls: dict[str, str] = {}
    for engine in spec.engines:
        port = ports[engine.name]
        template = engine.url or DEFAULT_URL
        urls[engine.name] = template.replace("{port}", str(port)).rstrip("/")
    hosts = {name: urlsplit(url).hostname or LOOPBACK for name, url in urls.items()}

    def fill(text: str, engine: EngineSpec | None, where: str) -> str:
        def one(match: re.Match[str]) -> str:
            target, _, attr = match.group(1).rpartition(".")
            if not target and attr == "python":
                return python
            name = target or (engine.name if engine is not None else "")
            value = {"port": ports.get(name), "url": urls.get(name), "host": hosts.get(name)}[attr]
            if value is None:
                raise BootConfigError(f"{spec.source}: {where}: {{{match.group(1)}}} refers to engine {name!r}, "
                                "which has no port; give it port: auto or a number")
            return str(value)

        return PLACEHOLDER.sub(one, text)

    plans = []
    for i, engine in enumerate(spec.engines):
        where = f"engines[{i}]"
        argv = tuple(fill(arg, engine, f"{where}.command") for arg in engine.command)
        env = {key: fill(value, engine, f"{where}.env.{key}") for key, value in engine.env.items()}
        if engine.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(engine.gpus)
        env.setdefault("PYTHONUNBUFFERED", "1")  # log lines reach the log file as they happen
        ready = engine.ready_url or (SMG_READY_PATH if engine.kind in (RouterKind.SMG, RouterKind.SGLANG_ROUTER) else DEFAULT_HEALTH_PATH)
        ready = urls[engine.name] + ready if ready.startswith("/") else fill(ready, engine, f"{where}.ready_url")
        plans.append(LaunchPlan(
            spec=engine, argv=argv, env=types.MappingProxyType(env), port=ports[engine.name],
            url=urls[engine.name], ready_url=ready,
        ))
    return DeploymentPlan(spec=spec, engines=tuple(plans), entry_url=_entry_url(spec, urls, fill))


def _choose_ports(spec: DeploymentSpec) -> dict[str, int | None]:
    fixed: dict[int, str] = {}
    for i, engine in enumerate(spec.engines):
        if isinstance(engine.port, int):
            if engine.port in fixed:
                raise BootConfigError(f"{spec.source}: engines[{i}].port: {engine.port} is also the port of "
                                f"{fixed[engine.port]!r}; give each engine its own port or use auto")
            fixed[engine.port] = engine.name
            host = urlsplit((engine.url or "http://127.0.0.1").replace("{port}", "1")).hostname or LOOPBACK
            if host in _LOCAL_HOSTS and port_in_use(engine.port):
                raise BootConfigError(f"{spec.source}: engines[{i}].port: {engine.port} is already in use on this "
                                "machine (is an old server still running?); stop it or use port: auto")
    ports: dict[str, int | None] = {}
    taken = set(fixed)
    for engine in spec.engines:
        if engine.port == "auto":
            port = free_port(avoid=taken)
            taken.add(port)
            ports[engine.name] = port
        else:
            ports[engine.name] = engine.port if isinstance(engine.port, int) else None
    return ports


def _entry_url(spec: DeploymentSpec, urls: dict[str, str], fill: Callable[[str, EngineSpec | None, str], str]) -> str:
    if spec.entry in urls:
        return urls[spec.entry]
    return fill(spec.entry, None, "entry").rstrip("/")
