"""What `watch` looks at besides `--endpoint`/`--entry`: the running engines a boot spec describes
(at the URLs its fixed ports give; nothing is booted), and every `attach` deployment of a fleet
inventory (each its own plan, watched under its own name). Problems are one-line ConfigErrors."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from kvpreflight.check_options import CheckOptions
from kvpreflight.check_plan import CheckPlan
from kvpreflight.errors import ConfigError, KvpreflightError
from kvpreflight.fleet.inventory import AttachTarget, Inventory
from kvpreflight.model import EntryApi


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

    if spec is not None:
        from kvpreflight.boot import load_spec
        from kvpreflight.preflight import running_plan

        described = load_spec(spec)
        described.check_client_certificate()
        described.check_client_key_private(allow_insecure=options.allow_insecure_key)
        # The spec's engines as boot mode would launch them, at the URLs its port numbers fix.
        plan = running_plan(build_plan(options), described)
        return [Watched(name=name or described.deployment, plan=plan)], None
    if inventory is None:
        plan = build_plan(options)
        deployment = name or label_url(plan.entry) or label_url(plan.targets[0].url) or "kvpreflight"
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
