"""`demo`'s rules and defaults are the library's (`kvpreflight._internal.demo.demo_deployment`, `demo_output`):
each holds when called directly, the CLI says the same one line with exit 2 before anything boots,
and the defaults --help shows are the ones the library applies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from support.cli import invoke

from kvpreflight._internal.builtin_engine.deployment import BuiltinDeployment
from kvpreflight._internal.cli import app
from kvpreflight._internal.demo import DEFAULT_OUT, demo_deployment, demo_output
from kvpreflight.errors import ConfigError
from kvpreflight.model import RouterKind

RULES = [
    (dict(router="nginx"), "--router: must be one of builtin, smg, sglang-router (got 'nginx')"),
    (dict(pool_ratio=0.0), "--pool-ratio: must be a ratio between 0 and 64 (got 0.0)"),
    (dict(decode_pool_ratio=65.0), "--decode-pool-ratio: must be a ratio between 0 and 64 (got 65.0)"),
    (dict(context_length=100), "--context-length: must be an integer between 256 and 262144"),
    (dict(faults=("ok", "nope")), "--fault: unknown fault 'ok'"),
]


@pytest.mark.parametrize(("given", "message"), RULES)
def test_each_demo_rule_holds_in_the_library(given, message):
    with pytest.raises(ConfigError) as info:
        demo_deployment(**given)
    assert str(info.value).startswith(message) and info.value.exit_code == 2


@pytest.mark.parametrize(("given", "message"), RULES)
def test_the_demo_cli_says_each_rule_in_one_line_before_anything_boots(tmp_path, given, message):
    flags = {"router": "--router", "pool_ratio": "--pool-ratio", "decode_pool_ratio": "--decode-pool-ratio",
             "context_length": "--context-length"}
    args: list[str] = []
    for name, value in given.items():
        args += [a for fault in value for a in ("--fault", fault)] if name == "faults" else [flags[name], str(value)]
    result = invoke("demo", "--out", tmp_path / "out", *args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [result.stderr.strip()] and message in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_a_library_user_names_the_fields_as_an_inventory_does():
    with pytest.raises(ConfigError, match=r"^fleet.yaml: builtin.pool_ratio: must be a ratio"):
        demo_deployment(pool_ratio=-1.0, name_of=lambda field: f"fleet.yaml: builtin.{field}")


def test_the_demo_output_refuses_an_unwritable_record_before_anything_boots(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="--record"):
        demo_output(fmt=None, output=None, quiet=False, record=tmp_path / "a-file" / "record.json", command_line=())
    with pytest.raises(ConfigError, match="--quiet"):
        demo_output(fmt="json", output=None, quiet=True, record=None, command_line=())


def test_unset_options_take_the_librarys_defaults_and_help_shows_them():
    assert demo_deployment(pool_ratio=None, decode_pool_ratio=None, context_length=None, faults=(), incident=False,
                           router=None) == BuiltinDeployment(router=RouterKind.BUILTIN)
    command = typer.main.get_command(app).commands["demo"]  # type: ignore[attr-defined]
    shown = {p.name: re.search(r"\[default: ([^]]+)]", p.help or "") for p in command.params}
    library = {"pool_ratio": BuiltinDeployment.pool_ratio, "decode_pool_ratio": BuiltinDeployment.decode_pool_ratio,
               "context_length": BuiltinDeployment.context_length, "router": BuiltinDeployment.router.value, "out_dir": DEFAULT_OUT}
    for name, value in library.items():
        param = next(p for p in command.params if p.name == name)
        found = shown[name]
        assert param.default is None and found is not None and found.group(1) == str(value), name
    assert isinstance(DEFAULT_OUT, Path)
