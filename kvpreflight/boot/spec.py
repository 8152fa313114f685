"""Boot specs: what a deployment runs, parsed from YAML into frozen dataclasses.

Every problem is one line that names the file and the field, e.g.
``spec.yaml: engines[1].port: expected an integer or "auto", got 'x'``. Unknown keys are errors
(a typo must not silently drop a setting). Placeholders are checked here and filled in at boot
(see ``kvpreflight.boot.launch``):

- ``{port}``, ``{url}``, ``{host}``: this engine's port, URL and host;
- ``{NAME.port}``, ``{NAME.url}``, ``{NAME.host}``: another engine's (a router needs its workers');
- ``{python}``: the Python running kvpreflight (so a spec can start ``{python} -m ...`` in the
  same environment).

Top-level keys: ``deployment``, ``context_length``, ``entry``, ``engines``, ``checks`` and, for an
entry behind a gateway that requires mutual TLS, ``client_cert`` (a PEM certificate; the key may be
in the same file) and ``client_key`` (its unencrypted PEM private key). Both are file paths,
relative to the spec's folder, used like ``check --client-cert/--client-key`` for every request
kvpreflight sends; they are checked before anything boots, and no output shows their paths or
contents::

    entry: https://gateway.internal:8443
    client_cert: certs/kvpreflight-client.pem
    client_key: certs/kvpreflight-client.key
"""

from __future__ import annotations

import os
import re
import shlex
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpreflight._internal.engine_kinds import ENGINES, engine_kinds, launched_kind
from kvpreflight._internal.fields import FieldParser, describe, load_yaml
from kvpreflight._internal.files import FileKind, read_bytes
from kvpreflight.boot.errors import BootConfigError
from kvpreflight.model import AUTO_ENGINE, ProcessRole, RouterKind, Waiver

ROLES = tuple(r.value for r in ProcessRole)
DEFAULT_READY_TIMEOUT_S = 600.0
DEFAULT_HEALTH_PATH = "/health"
# smg and sglang-router answer /health before their workers are registered; /readiness only once
# they are.
SMG_READY_PATH = "/readiness"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
# Only brace groups shaped like a placeholder count; JSON such as '{"a": 1}' is left alone.
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)?)\}")
_SELF_KEYS = ("port", "url", "host")
_GLOBAL_KEYS = ("python",)

_TOP_KEYS = ("deployment", "context_length", "entry", "engines", "checks", "client_cert", "client_key")
_ENGINE_KEYS = (
    "name", "role", "command", "env", "gpus", "port", "url", "ready_url", "ready_timeout_s",
    "engine", "cwd",
)


@dataclass(frozen=True)
class EngineSpec:
    """One engine process as the spec describes it (placeholders not yet filled in)."""

    name: str
    role: ProcessRole
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=lambda: types.MappingProxyType({}))
    gpus: tuple[str, ...] = ()  # becomes CUDA_VISIBLE_DEVICES
    port: int | str | None = None  # an integer, "auto", or None when only url is given
    url: str | None = None  # template; default http://127.0.0.1:{port}
    ready_url: str | None = None  # URL, /path on url, or template; default url + /health
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    engine: str = "auto"  # sglang | vllm | llamacpp | tgi | builtin | auto; a router also smg, sglang-router
    cwd: str | None = None  # absolute (relative paths are taken from the spec's folder)

    @property
    def kind(self) -> str:
        """The engine kind: as given, or guessed from the command; "auto" when unknown."""
        return self.engine if self.engine != "auto" else guess_engine(self.command)


@dataclass(frozen=True)
class ChecksSpec:
    skip: tuple[Waiver, ...] = ()  # waivers, each a known check id with a reason


@dataclass(frozen=True)
class DeploymentSpec:
    deployment: str
    engines: tuple[EngineSpec, ...]
    entry: str  # an engine name or a URL (template); defaults to the router, else the only engine
    context_length: int | None = None  # the context length promised to users
    checks: ChecksSpec = field(default_factory=ChecksSpec)
    source: str = "<spec>"  # the file it came from, for messages
    # Mutual TLS: absolute PEM paths (the key may be inside client_cert), checked by
    # check_client_certificate before anything boots
    client_cert: str | None = None
    client_key: str | None = None

    def check_client_certificate(self) -> None:
        """Load and match client_cert and client_key (BootConfigError naming the key, never the path)."""
        from kvpreflight._internal.engines.errors import EngineConfigError
        from kvpreflight._internal.engines.http import client_certificate

        try:
            client_certificate(self.client_cert, self.client_key, names=("client_cert", "client_key"))
        except EngineConfigError as exc:
            raise _error(self.source, None, str(exc)) from None

    def check_client_key_private(self, *, allow_insecure: bool) -> None:
        """The spec's private key (client_key, or client_cert when the key is inside it) is refused
        when its group or others can read it, as --client-key's is (--allow-insecure-key). After
        check_client_certificate: a file that holds no key has been refused by then."""
        from kvpreflight._internal.files import check_private

        name, key = ("client_key", self.client_key) if self.client_key else ("client_cert", self.client_cert)
        if key is None:
            return
        try:
            check_private(key, "the private key", allow_insecure=allow_insecure, error=BootConfigError, name_path=False)
        except BootConfigError as exc:
            raise _error(self.source, name, str(exc)) from None

    def engine(self, name: str) -> EngineSpec:
        for engine in self.engines:
            if engine.name == name:
                return engine
        raise KeyError(name)


def router_only_kinds() -> tuple[str, ...]:
    """Routers that are no engine's own: only a role: router process may be one."""
    return tuple(k.value for k in RouterKind if k.value not in ENGINES)


def spec_engine_kinds() -> tuple[str, ...]:
    """What a boot spec's `engine:` may say: a registered engine, auto, or a router of its own."""
    return (*engine_kinds(), AUTO_ENGINE, *router_only_kinds())


def guess_engine(command: tuple[str, ...]) -> str:
    """A cheap guess from the command line (routers first, then each registered engine's launch
    words, kvpreflight._internal.engine_kinds); adapters confirm over HTTP."""
    text = " ".join(command).lower()
    if any(os.path.basename(arg).lower() in ("smg", "smg.launch_router") for arg in command):
        return RouterKind.SMG.value  # before "sglang": smg's command says --backend sglang
    if "sglang_router" in text:
        return RouterKind.SGLANG_ROUTER.value
    return launched_kind(text) or AUTO_ENGINE


def load_spec(path: str | os.PathLike[str]) -> DeploymentSpec:
    """Read and parse a spec file. Raises BootConfigError (exit 2) with one line on any problem."""
    label = os.fspath(path)
    raw = read_bytes(path, FileKind.BOOT_SPEC, BootConfigError,
                     missing=str(_error(label, None, "no such file; give the path of a boot spec (see examples/specs/)")))
    data = load_yaml(raw, label, BootConfigError)
    base_dir = os.path.dirname(os.path.abspath(label))
    return parse_spec(data, source=label, base_dir=base_dir)


def parse_spec(data: Any, *, source: str = "<spec>", base_dir: str | None = None) -> DeploymentSpec:
    """Turn already-loaded YAML data into a DeploymentSpec, or raise BootConfigError (exit 2)."""
    p = _Parser(source, base_dir or os.getcwd())
    if not isinstance(data, dict):
        raise p.error(None, f"expected a mapping with {', '.join(_TOP_KEYS)}, got {describe(data)}")
    p.unknown_keys(data, _TOP_KEYS, None)
    deployment = p.name(data.get("deployment"), "deployment", required=True, pattern=False)
    context_length = p.positive_int(data.get("context_length"), "context_length")
    raw_engines = data.get("engines")
    if not isinstance(raw_engines, list) or not raw_engines:
        raise p.error("engines", f"expected a non-empty list of engines, got {describe(raw_engines)}")
    engines = tuple(p.engine(raw, f"engines[{i}]") for i, raw in enumerate(raw_engines))
    names = [e.name for e in engines]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise p.error(f"engines[{i}].name", f"duplicate engine name {name!r}; names must be unique")
    entry = p.entry(data.get("entry"), engines)
    checks = p.checks(data.get("checks"))
    client_cert = p.path(data.get("client_cert"), "client_cert")
    client_key = p.path(data.get("client_key"), "client_key")
    if client_key is not None and client_cert is None:
        raise p.error("client_key", "needs client_cert (the certificate the key belongs to)")
    for i, engine in enumerate(engines):
        p.check_placeholders(engine, f"engines[{i}]", names)
    if entry not in names:
        p.check_template(entry, "entry", names, self_allowed=False)
    return DeploymentSpec(
        deployment=deployment,
        engines=engines,
        entry=entry,
        context_length=context_length,
        checks=checks,
        source=source,
        client_cert=client_cert,
        client_key=client_key,
    )


def _error(source: str, where: str | None, problem: str) -> BootConfigError:
    prefix = f"{source}: {where}: " if where else f"{source}: "
    return BootConfigError(prefix + problem)


class _Parser(FieldParser):
    """The spec's fields; errors are BootConfigError (exit 2)."""

    def __init__(self, source: str, base_dir: str) -> None:
        super().__init__(source, base_dir, BootConfigError)

    def name(self, value: Any, where: str, *, required: bool, pattern: bool = True) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.error(where, f"expected a non-empty string, got {describe(value)}")
        if pattern and not _NAME.match(value):
            raise self.error(where, f"{value!r} is not a valid name (letters, digits, '-' and '_'; "
                             "it names the log file and {NAME.port} placeholders)")
        return value

    def engine(self, raw: Any, where: str) -> EngineSpec:
        if not isinstance(raw, dict):
            raise self.error(where, f"expected a mapping with name, role, command, port, got {describe(raw)}")
        self.unknown_keys(raw, _ENGINE_KEYS, where)
        name = self.name(raw.get("name"), f"{where}.name", required=True)
        role = raw.get("role")
        if role not in ROLES:
            raise self.error(f"{where}.role", f"expected one of {', '.join(ROLES)}, got {describe(role)}")
        role = ProcessRole(role)
        command = self.command(raw.get("command"), f"{where}.command")
        env = self.env(raw.get("env"), f"{where}.env")
        gpus = self.gpus(raw.get("gpus"), f"{where}.gpus")
        if gpus and "CUDA_VISIBLE_DEVICES" in env:
            raise self.error(f"{where}.gpus", "set either gpus or env.CUDA_VISIBLE_DEVICES, not both")
        port = self.port(raw.get("port"), f"{where}.port")
        url = self.optional_url(raw.get("url"), f"{where}.url")
        ready_url = self.optional_url(raw.get("ready_url"), f"{where}.ready_url")
        if port is None and url is None:
            raise self.error(where, "needs a port (a number or auto) or a url to reach the engine at")
        timeout = raw.get("ready_timeout_s", DEFAULT_READY_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise self.error(f"{where}.ready_timeout_s", f"expected a positive number of seconds, got {describe(timeout)}")
        kind = raw.get("engine", "auto")
        if kind in router_only_kinds() and role is not ProcessRole.ROUTER:
            raise self.error(f"{where}.engine", f"{kind} is a router, not an engine: give it role: router")
        if kind not in spec_engine_kinds():
            raise self.error(f"{where}.engine", f"expected one of {', '.join(spec_engine_kinds())}, "
                             f"got {describe(kind)}")
        cwd = raw.get("cwd")
        if cwd is not None:
            if not isinstance(cwd, str) or not cwd:
                raise self.error(f"{where}.cwd", f"expected a folder path, got {describe(cwd)}")
            cwd = os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(cwd)))
        return EngineSpec(
            name=name, role=role, command=command, env=env, gpus=gpus, port=port, url=url,
            ready_url=ready_url, ready_timeout_s=float(timeout), engine=kind, cwd=cwd,
        )

    def command(self, value: Any, where: str) -> tuple[str, ...]:
        if isinstance(value, str):
            try:
                argv = shlex.split(value)
            except ValueError as exc:
                raise self.error(where, f"cannot split into arguments: {exc}") from None
        elif isinstance(value, list):
            argv = []
            for i, item in enumerate(value):
                if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                    raise self.error(f"{where}[{i}]", f"expected a string, got {describe(item)}")
                argv.append(str(item))
        else:
            raise self.error(where, f"expected a list of arguments or a command string, got {describe(value)}")
        if not argv or not argv[0]:
            raise self.error(where, "is empty; give the program to start and its arguments")
        return tuple(argv)

    def env(self, value: Any, where: str) -> Mapping[str, str]:
        if value is None:
            return types.MappingProxyType({})
        if not isinstance(value, dict):
            raise self.error(where, f"expected a mapping of variable names to values, got {describe(value)}")
        env: dict[str, str] = {}
        for key, item in value.items():
            if not isinstance(key, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise self.error(where, f"{key!r} is not a valid environment variable name")
            if isinstance(item, bool):
                item = "1" if item else "0"
            if not isinstance(item, (str, int, float)):
                raise self.error(f"{where}.{key}", f"expected a string or number, got {describe(item)}")
            env[key] = str(item)
        return types.MappingProxyType(env)

    def gpus(self, value: Any, where: str) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, bool):
            raise self.error(where, f"expected GPU indices like [0, 1] or \"0,1\", got {describe(value)}")
        if isinstance(value, int):
            items: list[Any] = [value]
        elif isinstance(value, str):
            items = [part.strip() for part in value.split(",")]
        elif isinstance(value, list):
            items = value
        else:
            raise self.error(where, f"expected GPU indices like [0, 1] or \"0,1\", got {describe(value)}")
        out: list[str] = []
        for item in items:
            if isinstance(item, bool) or isinstance(item, int) and item < 0:
                raise self.error(where, f"expected GPU indices (0, 1, ...) or UUIDs, got {describe(item)}")
            text = str(item).strip()
            if not text or not re.match(r"^(\d+|(GPU|MIG)-[0-9A-Za-z-]+)$", text):
                raise self.error(where, f"expected GPU indices (0, 1, ...) or UUIDs, got {describe(item)}")
            if text in out:
                raise self.error(where, f"GPU {text} is listed twice")
            out.append(text)
        if not out:
            raise self.error(where, "is empty; list the GPU indices this engine uses or leave it out")
        return tuple(out)

    def port(self, value: Any, where: str) -> int | str | None:
        if value is None or value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(where, f"expected an integer or \"auto\", got {describe(value)}")
        if not 1 <= value <= 65535:
            raise self.error(where, f"expected a port between 1 and 65535, got {value}")
        return value

    def optional_url(self, value: Any, where: str) -> str | None:
        if value is None:
            return None
        if where.endswith(".ready_url"):
            # also a path on the engine's own URL ("/v1/models") or a template ("{url}/ready")
            if isinstance(value, str) and (value.startswith("/") or re.match(r"^\{[A-Za-z0-9_.-]*url\}", value)):
                return value
            if not isinstance(value, str) or not re.match(r"^https?://[^/\s]+", value):
                raise self.error(where, "expected an http(s):// URL, a path such as /health, or {url}/PATH, "
                                 f"got {describe(value)}")
            return value
        if not isinstance(value, str) or not re.match(r"^https?://[^/\s]+", value):
            raise self.error(where, f"expected an http:// or https:// URL, got {describe(value)}")
        return value.rstrip("/")

    def entry(self, value: Any, engines: tuple[EngineSpec, ...]) -> str:
        names = [e.name for e in engines]
        if value is None:
            routers = [e.name for e in engines if e.role == "router"]
            if len(routers) == 1:
                return routers[0]
            if len(engines) == 1:
                return engines[0].name
            raise self.error("entry", "missing, and there is no single router to default to; set it to "
                             "the engine name (or URL) that clients send requests to")
        if not isinstance(value, str) or not (value in names or re.match(r"^https?://[^/\s]+", value)):
            raise self.error("entry", f"expected an engine name ({', '.join(names)}) or an http(s):// URL, got {describe(value)}")
        return value.rstrip("/")

    def checks(self, value: Any) -> ChecksSpec:
        if value is None:
            return ChecksSpec()
        self.mapping(value, ("skip",), "checks", "a mapping with skip: [{id, reason}]")
        return ChecksSpec(skip=self.waivers(value.get("skip"), "checks.skip"))

    def check_placeholders(self, engine: EngineSpec, where: str, names: list[str]) -> None:
        for i, arg in enumerate(engine.command):
            self.check_template(arg, f"{where}.command[{i}]", names, self_allowed=True, engine=engine)
        for key, item in engine.env.items():
            self.check_template(item, f"{where}.env.{key}", names, self_allowed=True, engine=engine)
        if engine.url is not None:
            self.check_template(engine.url, f"{where}.url", [], self_allowed=True, engine=engine, url_ok=False)
        if engine.ready_url is not None:
            self.check_template(engine.ready_url, f"{where}.ready_url", names, self_allowed=True, engine=engine)

    def check_template(self, text: str, where: str, names: list[str], *, self_allowed: bool,
                       engine: EngineSpec | None = None, url_ok: bool = True) -> None:
        for match in PLACEHOLDER.finditer(text):
            key = match.group(1)
            target, _, attr = key.rpartition(".")
            if not target and key in _GLOBAL_KEYS:
                continue
            if not url_ok and key != "port":
                raise self.error(where, f"the url may use only {{port}}, not {{{key}}}")
            if not target and self_allowed and key in _SELF_KEYS:
                if key == "port" and engine is not None and engine.port is None:
                    raise self.error(where, "uses {port} but the engine has no port; add port: auto or a number")
                continue
            if target and attr in _SELF_KEYS and target in names:
                continue
            known = ", ".join(["{python}", "{port}", "{url}", "{host}", "{NAME.port}", "{NAME.url}", "{NAME.host}"])
            raise self.error(where, f"unknown placeholder {{{key}}} (known: {known}; NAME is an engine name)")
