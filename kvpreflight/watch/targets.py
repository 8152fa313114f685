"""What `watch` looks at besides `--endpoint`/`--entry`: the running engines a boot spec describes
(at the URLs its fixed ports give; nothing is booted), and every `attach` deployment of a fleet
inventory (each its own plan, watched under its own name). Problems are one-line ConfigErrors."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from kvpreflight.boot.spec import PLACEHOLDER, DeploymentSpec
from kvpreflight.check_options import CheckOptions
from kvpreflight.check_plan import CheckPlan
from kvpreflight.errors import ConfigError, KvpreflightError
from kvpreflight.fleet.inventory import AttachTarget, Inventory
from kvpreflight.model import EntryApi, ProcessRole

DEFAULT_URL = "http://127.0.0.1:{port}"  # a spec engine's URL when it gives only a port (as boot mode)


@dataclass(frozen=True, kw_only=True)
class SpecTargets:
    """A boot spec's engines as `check --endpoint ROLE=URL --entry URL` would name them."""

    deployment: str
    endpoints: tuple[str, ...]  # ROLE=URL of every engine but the router
    entry: str
    engine: str  # the engines' one kind where the spec says it, else auto
    context_length: int | None
    client_cert: str | None
    client_key: str | None


def spec_targets(spec: DeploymentSpec) -> SpecTargets:
    """The URLs a spec fixes for its engines. A port the spec leaves to boot time (`auto`) fixes no
    URL, so watch cannot know where that engine runs: a ConfigError naming the engine."""
    urls: dict[str, str] = {}
    for i, engine in enumerate(spec.engines):
        template = engine.url or DEFAULT_URL
        if "{port}" in template and not isinstance(engine.port, int):
            raise ConfigError(f"--spec {spec.source}: engines[{i}] ({engine.name}) has port: {engine.port or 'none'}, so the "
                              "spec does not fix where it runs; give it a port number (or a url) to watch it")
        urls[engine.name] = template.replace("{port}", str(engine.port)).rstrip("/")

    def fill(match: re.Match[str]) -> str:
        target, _, attr = match.group(1).rpartition(".")
        if target not in urls or attr not in ("url", "host", "port"):
            raise ConfigError(f"--spec {spec.source}: entry: {{{match.group(1)}}} names no engine's url, host or "
                              "port; set entry to an engine name or a URL")
        url = urls[target]
        return {"url": url, "host": urlsplit(url).hostname or "", "port": str(urlsplit(url).port or "")}[attr]

    entry = urls[spec.entry] if spec.entry in urls else PLACEHOLDER.sub(fill, spec.entry).rstrip("/")
    workers = [e for e in spec.engines if e.role is not ProcessRole.ROUTER]
    kinds = {e.kind for e in workers}
    return SpecTargets(
        deployment=spec.deployment,
        endpoints=tuple(f"{e.role.value}={urls[e.name]}" for e in workers),
        entry=entry,
        engine=next(iter(kinds)) if len(kinds) == 1 and "auto" not in kinds else "auto",
        context_length=spec.context_length, client_cert=spec.client_cert, client_key=spec.client_key,
    )


@dataclass(frozen=True, kw_only=True)
class Watched:
    """One deployment to watch: its name (the `deployment` label), its plan, and whether it is
    read only (an inventory's `capacity_only: true`: a change freeze, so no request is sent)."""

    name: str
    plan: CheckPlan
    read_only: bool = False


def inventory_plans(inventory: Inventory, shared: CheckPlan) -> list[Watched]:
    """(name, plan) for each deployment of the inventory, in its order: the deployment's own
    engines, entry, logs, key, certificate and tenants as its attach entry gives them, and what
    `shared` (the flags) holds where the entry is silent (--header, --ca-bundle, the tenants' keys,
    --entry-api), with the flags' --timeout; read as --capacity-only reads. Boot and builtin
    deployments start engines, which watch never does: refused, naming the deployment."""
    out: list[Watched] = []
    for i, deployment in enumerate(inventory.deployments):
        where = f"--inventory {inventory.source}: deployments[{i}] ({deployment.name})"
        target = deployment.target
        if not isinstance(target, AttachTarget):
            raise ConfigError(f"{where} is a {deployment.kind} deployment; watch looks at running engines only: "
                              "give it as attach (its endpoints and entry), or watch it with --spec")
        try:
            own = target.plan(deployment.waivers)
        except KvpreflightError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        # What the deployment's entry says wins; the flags fill in what it leaves unsaid.
        entry_api = own.entry_api if own.entry_api is EntryApi.OPENAI else shared.entry_api
        if (entry_api is EntryApi.OPENAI or shared.entry_model) and own.entry is None:
            raise ConfigError(f"{where}: --entry-api openai and --entry-model name each deployment's entry, and it has none; "
                              "add attach.entry")
        tenants = own.auth if own.auth.tenant_binding else shared.auth
        auth = replace(shared.auth, headers={**shared.auth.headers, **own.auth.headers},
                       ca_bundle=own.auth.ca_bundle or shared.auth.ca_bundle,
                       client_cert=own.auth.client_cert or shared.auth.client_cert,
                       client_key=own.auth.client_key if own.auth.client_cert else shared.auth.client_key,
                       tenant_headers=tenants.tenant_headers, tenant_binding=tenants.tenant_binding,
                       secrets=shared.auth.secrets | own.auth.secrets)
        plan = replace(shared, targets=own.targets, entry=own.entry, entry_api=entry_api, entry_model=own.entry_model or shared.entry_model,
                       engine=own.engine, model=own.model,
                       context_length=own.context_length, logs=own.logs, auth=auth, waivers=own.waivers)
        out.append(Watched(name=deployment.name, plan=plan, read_only=own.capacity_only))
    return out


def watched_deployments(options: CheckOptions, *, spec: Path | None = None, inventory: Path | None = None,
                        name: str | None = None, with_record: bool = False) -> tuple[list[Watched], str | None]:
    """What `watch` watches, from its options and at most one of a boot spec and a fleet
    inventory: each deployment's name and plan, and the fleet's name (an inventory's metrics file
    is named after it). Every problem is a ConfigError naming the flag or the file and field."""
    from kvpreflight.check_options import build_plan, parse_entry_api
    from kvpreflight.formats._common import label_url

    default_name = None
    if spec is not None:
        from kvpreflight.boot import load_spec

        described = load_spec(spec)
        described.check_client_certificate()
        described.check_client_key_private(allow_insecure=options.allow_insecure_key)
        found = spec_targets(described)
        if found.client_cert is not None and options.client_cert is not None:
            raise ConfigError(f"--spec {spec} sets client_cert, and --client-cert is given too; keep one")
        options = replace(options, endpoints=found.endpoints, entry=found.entry,
                          engine=options.engine if options.engine != "auto" else found.engine,
                          context_length=found.context_length,
                          client_cert=Path(found.client_cert) if found.client_cert else options.client_cert,
                          client_key=Path(found.client_key) if found.client_key else options.client_key)
        default_name = found.deployment
    if inventory is None:
        plan = build_plan(options)
        deployment = name or default_name or label_url(plan.entry) or label_url(plan.targets[0].url) or "kvpreflight"
        return [Watched(name=deployment, plan=plan)], None
    from kvpreflight.fleet.inventory import load_inventory

    unwanted = [flag for flag, on in (("--log", bool(options.logs)), ("--engine", options.engine != "auto"),
                                      ("--model", options.model is not None), ("--api-key-env", options.api_key_env is not None),
                                      ("--api-key-file", options.api_key_file is not None),
                                      ("--client-cert", options.client_cert is not None),
                                      ("--client-key", options.client_key is not None), ("--name", name is not None)) if on]
    if unwanted:
        raise ConfigError(f"--inventory names each deployment's engines, logs, key, certificate and name; drop {', '.join(unwanted)}")
    if with_record:
        raise ConfigError("--record is one deployment's release record; with --inventory drop --record and --key "
                          "(or watch that deployment alone with --endpoint/--entry and its --record)")
    fleet = load_inventory(inventory)
    # The flags' plan holds what every deployment shares; it has no entry of its own, so an
    # openai entry API is checked per deployment (inventory_plans).
    api = parse_entry_api(options.entry_api)
    shared = replace(build_plan(replace(options, entry_api="native", entry_model=None)), entry_api=api,
                     entry_model=options.entry_model)
    return inventory_plans(fleet, shared), fleet.name
