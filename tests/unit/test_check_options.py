"""One option model: `check`'s flags and a fleet inventory's `attach:` entry are the same
`CheckOptions`, built into a plan by the same `build_plan`, so an inventory can say everything the
command line can (attach mode) and each mistake is named where the user wrote it."""

from __future__ import annotations

import dataclasses

import pytest
import typer
from support.mtls import write_pki

from kvpreflight._internal.cli import app
from kvpreflight.check_options import WAIVER_FIELDS, CheckOptions, build_plan, flag
from kvpreflight.errors import ConfigError
from kvpreflight.fleet import FleetError, parse_inventory


def check_parameters() -> dict[str, str]:
    """`check`'s parameters: name -> its flag."""
    command = typer.main.get_command(app).commands["check"]  # type: ignore[attr-defined]
    return {p.name: p.opts[0] for p in command.params}


def test_every_option_is_a_check_flag_and_an_inventory_key():
    """A field added to CheckOptions is a flag of `check` (named by `flag`) and, unless it is a
    waiver, a key of an inventory's attach entry: the lists cannot drift apart."""
    params = check_parameters()
    fields = [f.name for f in dataclasses.fields(CheckOptions)]
    assert not [f for f in fields if params.get(f) != flag(f)], params
    from kvpreflight.fleet.inventory import _ATTACH_FIELDS

    assert sorted(_ATTACH_FIELDS) == sorted(set(fields) - set(WAIVER_FIELDS))


@pytest.fixture
def every_option(tmp_path, monkeypatch):
    """A value for every attach option, as YAML and as CheckOptions (the paths as the CLI gets them)."""
    pki = write_pki(tmp_path)
    log = tmp_path / "p.log"
    log.write_text("")
    key_file = tmp_path / "api.key"
    key_file.write_text("sk-from-a-file-0123456789\n")
    key_file.chmod(0o600)
    (tmp_path / "advisories").mkdir()
    for name, value in (("TENANT_A", "tenant-a-key-0123456789"), ("TENANT_B", "tenant-b-key-0123456789")):
        monkeypatch.setenv(name, value)
    options = CheckOptions(
        endpoints=("prefill=http://p:1", "decode=http://d:2"), entry="http://r:3", entry_api="openai", entry_model="chat-prod",
        engine="sglang",
        model="m", context_length=4096, logs=(f"http://p:1={log}",), api_key_file=key_file,
        headers=("X-Team: serving-team-0123", "X-Trace-Token: trace-secret-0123"), secret_headers=("X-Team",),
        ca_bundle=pki["ca"], client_cert=pki["client_cert"], client_key=pki["client_key"], allow_insecure_key=True,
        capacity_only=True, timeout=12.5, deadline=600.0, max_context_equivalents=4.0, concurrency=3, timing_samples=9,
        accepted_tokens_per_second=800.0, advisories=(tmp_path / "advisories",), tenant_a_key_env="TENANT_A",
        tenant_b_key_env="TENANT_B", tenant_header="X-Tenant", allow_disruptive=True, scenarios=("normal", "late-decode"))
    relative = {"api_key_file": "api.key", "ca_bundle": "ca.pem", "client_cert": "client_cert.pem",
                "client_key": "client_key.pem", "advisories": ["advisories"]}
    yaml = {}
    for f in dataclasses.fields(CheckOptions):
        if f.name in WAIVER_FIELDS:
            continue
        value = getattr(options, f.name)
        yaml[f.name] = relative.get(f.name, list(value) if isinstance(value, tuple) else value)
    return options, yaml, tmp_path


def test_an_inventory_entry_builds_the_plan_check_builds_from_the_same_options(every_option):
    options, yaml, folder = every_option
    # api_key_env excludes api_key_file (the last test reads one); every other option is set
    assert [f.name for f in dataclasses.fields(CheckOptions)
            if f.name not in WAIVER_FIELDS and getattr(options, f.name) == f.default] == ["api_key_env"]
    inventory = parse_inventory({"deployments": [{"name": "a", "attach": yaml}]}, source="fleet.yaml", base_dir=str(folder))
    from_inventory = inventory.deployments[0].target.plan(())  # type: ignore[union-attr]
    from_flags = build_plan(options)
    assert from_inventory == from_flags
    # and what a user would notice: the keys and tenants are there, and every secret is known
    assert from_inventory.auth.headers["Authorization"] == "Bearer sk-from-a-file-0123456789"
    assert from_inventory.auth.tenant_headers[1] == {"Authorization": "Bearer tenant-b-key-0123456789", "X-Tenant": "b"}
    assert {"sk-from-a-file-0123456789", "serving-team-0123", "trace-secret-0123", "tenant-a-key-0123456789"} <= from_inventory.auth.secrets


@pytest.mark.parametrize(("change", "on_the_command_line", "in_the_inventory"), [
    ({"tenant_a_key_env": "SAME", "tenant_b_key_env": "SAME"},
     "--tenant-a-key-env and --tenant-b-key-env name the same variable",
     "fleet.yaml: deployments[0].attach.tenant_a_key_env and deployments[0].attach.tenant_b_key_env name the same variable"),
    ({"client_key": "k.pem"}, "--client-key needs --client-cert",
     "fleet.yaml: deployments[0].attach.client_key needs deployments[0].attach.client_cert"),
    ({"timing_samples": 3}, "--timing-samples 3: give 8 to 1000", "fleet.yaml: deployments[0].attach.timing_samples 3: give 8 to 1000"),
    ({"entry_api": "openai"}, "--entry-api openai names the API of the --entry URL",
     "deployments[0].attach.entry_api openai names the API of the deployments[0].attach.entry URL"),
    ({"engine": "sglangg"}, "--engine 'sglangg': choose auto or one of",
     "fleet.yaml: deployments[0].attach.engine 'sglangg': choose auto or one of"),
])
def test_a_rule_between_options_holds_in_both_and_names_what_the_user_wrote(change, on_the_command_line, in_the_inventory):
    """The rules are build_plan's, so the inventory cannot accept what check refuses; the error
    names the flags on the command line and the fields in a file."""
    base = {"endpoints": ["http://p:1"]}
    with pytest.raises(ConfigError) as flags:
        values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in {**base, **change}.items()}
        build_plan(CheckOptions(**values))
    assert on_the_command_line in str(flags.value)
    with pytest.raises(FleetError) as inventory:
        parse_inventory({"deployments": [{"name": "a", "attach": {**base, **change}}]}, source="fleet.yaml")
    assert in_the_inventory in str(inventory.value) and "\n" not in str(inventory.value)


def test_a_secret_read_where_the_check_runs_is_named_by_file_and_field(monkeypatch):
    """An inventory names a variable; the node that runs the check reads it. Missing there: one
    line naming the inventory, the field and the variable, never a traceback or another tenant's key."""
    monkeypatch.delenv("KVP_NOT_SET", raising=False)
    inventory = parse_inventory({"deployments": [{"name": "a", "attach": {"endpoints": ["http://p:1"], "api_key_env": "KVP_NOT_SET"}}]},
                                source="fleet.yaml")
    with pytest.raises(ConfigError) as caught:
        inventory.deployments[0].target.plan(())  # type: ignore[union-attr]
    assert str(caught.value) == ("fleet.yaml: deployments[0].attach.api_key_env KVP_NOT_SET: "
                                 "the environment variable KVP_NOT_SET is not set or empty")
