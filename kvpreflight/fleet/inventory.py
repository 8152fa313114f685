"""Fleet inventories: which deployments one release checks, parsed from YAML into frozen dataclasses.

Every problem is one line naming the file and the field, e.g.
``fleet.yaml: deployments[2].attach.endpoints[0]: unknown role 'prefil'``. Unknown keys are errors.

    fleet: release-42                 # optional name
    defaults: {timeout_s: 900, subjects: [image=sha256:...]}
    deployments:
      - name: chat-8b                 # names the per-deployment record file
        node: gpu-node-1              # with --ray: a custom resource the Ray node was started with
        # node_ip: 10.0.0.3           #   or the node's IP (Ray's built-in node:IP resource)
        attach: {endpoints: [prefill=http://..., decode=http://...], entry: http://router:8000,
                 context_length: 131072, engine: auto, model: ..., logs: [URL=PATH],
                 api_key_env: SERVING_KEY, capacity_only: false, timeout: 30,
                 client_cert: certs/client.pem, client_key: certs/client.key,
                 tenant_a_key_env: TENANT_A_KEY, tenant_b_key_env: TENANT_B_KEY, ...}
        #   every option `check` takes, named as its CheckOptions field (--accepted-tokens-per-second:
        #   accepted_tokens_per_second); paths relative to the inventory; the waivers are `skip:`
        # or boot: specs/chat-8b.yaml   (a boot spec, relative to the inventory)
        # or builtin: {pool_ratio: 2.0, decode_pool_ratio: 2.0, context_length: 8192, faults: []}
        skip: [{id: engine-advisories, reason: ...}]
        subjects: [model=sha256:...]
        timeout_s: 600                # deadline: past it the deployment is inconclusive
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvpreflight._internal.builtin_engine.deployment import BuiltinDeployment
from kvpreflight._internal.fields import FieldParser, describe, load_yaml
from kvpreflight._internal.files import FileKind, read_bytes
from kvpreflight.check_options import WAIVER_FIELDS, CheckOptions, build_plan, check_fields, under
from kvpreflight.check_plan import CheckPlan
from kvpreflight.errors import ConfigError, KvpreflightError
from kvpreflight.fleet.errors import FleetError
from kvpreflight.model import Waiver
from kvpreflight.targets import parse_endpoint

DEFAULT_TIMEOUT_S = 900.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_TOP_KEYS = ("fleet", "defaults", "deployments")
_DEFAULT_KEYS = ("timeout_s", "subjects")
_DEPLOYMENT_KEYS = ("name", "node", "node_ip", "attach", "boot", "builtin", "skip", "subjects", "timeout_s")
# An attach entry takes every check option but the waivers (the deployment's `skip:`), by field name.
_ATTACH_FIELDS = {f.name: f for f in dataclasses.fields(CheckOptions) if f.name not in WAIVER_FIELDS}
_BUILTIN_KEYS = ("pool_ratio", "decode_pool_ratio", "context_length", "faults")


def _subject(text: str) -> object:
    """A `NAME=sha256:HEX` subject, checked (the record package is loaded only when one is given)."""
    from kvpreflight.record import parse_subject

    return parse_subject(text)


@dataclass(frozen=True)
class AttachTarget:
    """Engines that already run: what `kvpreflight check --endpoint ...` is given, as its options
    (files and environment variables are named, and read where the check runs)."""

    options: CheckOptions
    source: str = "<inventory>"  # errors name the file and the field: "fleet.yaml: deployments[0].attach.entry: ..."
    where: str = "attach"

    def engine_urls(self) -> frozenset[str]:
        urls = {parse_endpoint(e).url for e in self.options.endpoints}
        return frozenset(urls | ({self.options.entry} if self.options.entry else set()))

    def plan(self, waivers: tuple[Waiver, ...]) -> CheckPlan:
        """The check plan, built where the check runs: log files, keys and certificates are read there."""
        try:
            return replace(build_plan(self.options, label=under(self.where)), waivers=waivers)
        except KvpreflightError as exc:
            raise exc.under(self.source) from None

    def secrets_here(self) -> frozenset[str]:
        """The secrets this machine holds for the target (kept out of the fleet's own outputs)."""
        try:
            return self.plan(()).auth.secrets
        except KvpreflightError:  # a file or variable only the checking node has
            names = (self.options.api_key_env, self.options.tenant_a_key_env, self.options.tenant_b_key_env)
            return frozenset(v for v in (os.environ.get(n) for n in names if n) if v)


@dataclass(frozen=True)
class BootTarget:
    """A boot spec, carried as its text so that the node that boots it needs no copy of the file."""

    spec_path: str
    spec_text: str
    fixed_ports: tuple[int, ...] = ()


# A builtin prefill/decode/router trio, as `kvpreflight demo` boots it (faults included).
BuiltinTarget = BuiltinDeployment


Target = AttachTarget | BootTarget | BuiltinTarget


@dataclass(frozen=True)
class Placement:
    node: str | None = None  # a Ray custom resource name
    node_ip: str | None = None  # Ray's built-in node:IP resource

    @property
    def pinned(self) -> bool:
        return bool(self.node or self.node_ip)

    def describe(self) -> str:
        return self.node or self.node_ip or "any node"


@dataclass(frozen=True)
class Deployment:
    name: str
    target: Target
    placement: Placement = Placement()
    waivers: tuple[Waiver, ...] = ()
    subjects: tuple[str, ...] = ()  # NAME=sha256:HEX, validated
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def kind(self) -> str:
        return {AttachTarget: "attach", BootTarget: "boot", BuiltinTarget: "builtin"}[type(self.target)]

    def exclusive_keys(self) -> frozenset[str]:
        """What no other kvpreflight run may touch at the same time: engine URLs, fixed ports."""
        if isinstance(self.target, AttachTarget):
            return self.target.engine_urls()
        if isinstance(self.target, BootTarget):
            where = self.placement.describe()
            return frozenset(f"port {p} on {where}" for p in self.target.fixed_ports)
        return frozenset()


@dataclass(frozen=True)
class Inventory:
    name: str
    deployments: tuple[Deployment, ...]
    source: str
    sha256: str  # of the inventory file: a subject of every record the fleet writes
    subjects: tuple[str, ...] = ()


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read and parse an inventory. Raises FleetError (exit 2) with one line on any problem."""
    label = os.fspath(path)
    raw = read_bytes(path, FileKind.INVENTORY, FleetError,
                     missing=f"{label}: no such file; give the path of a fleet inventory (see examples/fleet/inventory.yaml)")
    data = load_yaml(raw, label, FleetError)
    return parse_inventory(data, source=label, base_dir=os.path.dirname(os.path.abspath(label)),
                           sha256=hashlib.sha256(raw).hexdigest())


def parse_inventory(data: Any, *, source: str = "<inventory>", base_dir: str | None = None, sha256: str = "") -> Inventory:
    """An inventory from its parsed YAML; FleetError (exit 2) naming `source` and the field on any problem."""
    p = _Parser(source, base_dir or os.getcwd())
    if not isinstance(data, dict):
        raise p.error(None, f"expected a mapping with {', '.join(_TOP_KEYS)}, got {describe(data)}")
    p.unknown_keys(data, _TOP_KEYS, None)
    name = data.get("fleet", os.path.splitext(os.path.basename(source))[0] if _NAME.match(os.path.basename(source)) else "fleet")
    if not isinstance(name, str) or not _NAME.match(name):
        raise p.error("fleet", f"expected a name (letters, digits, '.', '-', '_'), got {describe(name)}")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise p.error("defaults", f"expected a mapping, got {describe(defaults)}")
    p.unknown_keys(defaults, _DEFAULT_KEYS, "defaults")
    default_timeout = p.positive_number(defaults.get("timeout_s", DEFAULT_TIMEOUT_S), "defaults.timeout_s")
    subjects = p.subjects(defaults.get("subjects"), "defaults.subjects", _subject)
    raw = data.get("deployments")
    if not isinstance(raw, list) or not raw:
        raise p.error("deployments", f"expected a non-empty list of deployments, got {describe(raw)}")
    deployments = tuple(p.deployment(item, f"deployments[{i}]", default_timeout) for i, item in enumerate(raw))
    seen: dict[str, int] = {}
    for i, d in enumerate(deployments):
        if d.name in seen:
            raise p.error(f"deployments[{i}].name", f"duplicate name {d.name!r} (also deployments[{seen[d.name]}]); names must be unique")
        seen[d.name] = i
    return Inventory(name=name, deployments=deployments, source=source, sha256=sha256, subjects=subjects)


class _Parser(FieldParser):
    """The inventory's fields; errors are FleetError (exit 2)."""

    def __init__(self, source: str, base_dir: str) -> None:
        super().__init__(source, base_dir, FleetError)

    def deployment(self, raw: Any, where: str, default_timeout: float) -> Deployment:
        if not isinstance(raw, dict):
            raise self.error(where, f"expected a mapping with name and one of attach, boot, builtin, got {describe(raw)}")
        self.unknown_keys(raw, _DEPLOYMENT_KEYS, where)
        name = raw.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise self.error(f"{where}.name",
                             f"expected a name (letters, digits, '.', '-', '_'; it names the record file), got {describe(name)}")
        kinds = [k for k in ("attach", "boot", "builtin") if raw.get(k) is not None]
        if len(kinds) != 1:
            raise self.error(where, f"give exactly one of attach, boot, builtin (got {', '.join(kinds) or 'none'})")
        placement = Placement(self.optional_str(raw.get("node"), f"{where}.node"),
                              self.optional_str(raw.get("node_ip"), f"{where}.node_ip"))
        if placement.node and placement.node_ip:
            raise self.error(where, "give node or node_ip, not both")
        target = getattr(self, kinds[0])(raw[kinds[0]], f"{where}.{kinds[0]}")
        return Deployment(
            name=name, target=target, placement=placement,
            waivers=self.waivers(raw.get("skip"), f"{where}.skip"),
            subjects=self.subjects(raw.get("subjects"), f"{where}.subjects", _subject),
            timeout_s=self.positive_number(raw.get("timeout_s", default_timeout), f"{where}.timeout_s"),
        )

    def attach(self, raw: Any, where: str) -> AttachTarget:
        self.mapping(raw, tuple(_ATTACH_FIELDS), where, "a mapping with endpoints and entry")
        values = {name: self.option(raw[name], f"{where}.{name}", field) for name, field in _ATTACH_FIELDS.items()
                  if raw.get(name) is not None}
        options = CheckOptions(**values)
        if not options.endpoints and not options.entry:
            raise self.error(f"{where}.endpoints", "missing; list every prefill, decode or unified engine URL (ROLE=URL to set "
                                                   "the role), or give entry: a router that lists its workers")
        urls: list[str] = []
        for i, text in enumerate(options.endpoints):
            try:
                url = parse_endpoint(text).url
            except KvpreflightError as exc:
                raise self.adopt(f"{where}.endpoints[{i}]", exc) from None
            if url in urls:
                raise self.error(f"{where}.endpoints[{i}]", f"{url} listed twice")
            urls.append(url)
        try:
            check_fields(options, under(where))
        except ConfigError as exc:
            raise self.error(None, str(exc)) from None
        return AttachTarget(options=options, source=self.source, where=where)

    def option(self, value: Any, where: str, field: dataclasses.Field[Any]) -> Any:
        """One check option from YAML, typed as its CheckOptions field."""
        kind = str(field.type)
        if kind == "tuple[str, ...]":
            return self.strings(value, where)
        if kind == "tuple[Path, ...]":
            return tuple(Path(self.path(v, f"{where}[{i}]") or "") for i, v in enumerate(self.strings(value, where)))
        if kind == "Path | None":
            return Path(self.path(value, where) or "")
        if kind == "bool":
            return self.boolean(value, where)
        if kind in ("float", "float | None"):
            return self.positive_number(value, where)
        if kind == "int | None":
            return self.positive_int(value, where)
        if field.name.endswith("_env"):
            return self.env_name(value, where)
        if kind in ("str", "str | None"):
            return self.optional_str(value, where)
        raise TypeError(f"CheckOptions.{field.name}: no YAML reading for {kind}")  # a new kind of option: teach it here

    def boot(self, raw: Any, where: str) -> BootTarget:
        from kvpreflight.boot import parse_spec

        if not isinstance(raw, str) or not raw.strip():
            raise self.error(where, f"expected the path of a boot spec, got {describe(raw)}")
        path = os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(raw)))
        try:
            data = read_bytes(path, FileKind.BOOT_SPEC, FleetError)
        except FleetError as exc:
            raise self.error(where, str(exc)) from None
        try:
            # The spec's own messages name its file and field, never its content in bulk.
            spec = parse_spec(load_yaml(data, path, FleetError), source=path, base_dir=os.path.dirname(path))
            text = data.decode("utf-8")
        except KvpreflightError as exc:
            raise self.adopt(where, exc) from None
        ports = tuple(e.port for e in spec.engines if isinstance(e.port, int))
        return BootTarget(spec_path=path, spec_text=text, fixed_ports=ports)

    def builtin(self, raw: Any, where: str) -> BuiltinDeployment:
        if raw is True:
            raw = {}
        self.mapping(raw, _BUILTIN_KEYS, where, f"a mapping ({', '.join(_BUILTIN_KEYS)})")
        faults = self.strings(raw.get("faults"), f"{where}.faults")
        deployment = BuiltinDeployment(pool_ratio=raw.get("pool_ratio", 2.0), decode_pool_ratio=raw.get("decode_pool_ratio", 2.0),
                                       context_length=raw.get("context_length", 8192), faults=faults)
        try:
            deployment.validate(name_of=lambda field: f"{self.source}: {where}.{field}")
        except KvpreflightError as exc:
            raise self.error_type(str(exc)) from None
        return deployment
