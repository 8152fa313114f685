"""Property-based: whatever text or YAML a user or a pull request hands the configuration parsers,
they answer with a value or a one-line ConfigError, never a traceback.

Profile `ci` (the default, tests/conftest.py): derandomized with a fixed number of examples, so CI
is repeatable and fast; `HYPOTHESIS_PROFILE=long` (benchmarks/) explores more.
"""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st
from support.properties import mutations, yaml_values

from kvpreflight.errors import ConfigError

KEYS = ["deployment", "context_length", "entry", "engines", "checks", "name", "role", "command", "port", "url",
        "env", "gpus", "engine", "skip", "id", "reason", "deployments", "attach", "boot", "builtin", "endpoints",
        "defaults", "timeout_s", "subjects", "logs", "api_key_env", "pool_ratio", "faults", "ready_url", "cwd"]
# Mappings whose keys are the real ones, so the parsers get past the first check and deeper.
keyed = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.floats(allow_nan=True) | st.sampled_from(
        ["auto", "router", "prefill", "decode", "unified", "http://127.0.0.1:1", "prefill=http://h:1", "{port}",
         "{x.url}", "kv-capacity", "because", "image=sha256:" + "a" * 64, "x"]) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(KEYS), children, max_size=6),
    max_leaves=40,
)


BASE_SPEC: dict[str, Any] = {
    "deployment": "pd", "context_length": 4096, "entry": "router",
    "engines": [
        {"name": "p", "role": "prefill", "port": "auto", "command": ["srv", "--port", "{port}"], "gpus": [0],
         "env": {"A": "1"}, "engine": "vllm", "ready_timeout_s": 5, "ready_url": "/health"},
        {"name": "router", "role": "router", "port": 30000, "command": "router --prefill {p.url}", "url": "http://127.0.0.1:{port}"},
    ],
    "checks": {"skip": [{"id": "kv-capacity", "reason": "because"}]},
}
BASE_INVENTORY: dict[str, Any] = {
    "fleet": "rel", "defaults": {"timeout_s": 60, "subjects": ["image=sha256:" + "a" * 64]},
    "deployments": [
        {"name": "a", "attach": {"endpoints": ["prefill=http://p:1", "decode=http://d:2"], "entry": "http://r:3",
                                 "context_length": 4096, "engine": "auto", "logs": ["http://p:1=/tmp/p.log"],
                                 "api_key_env": "KEY", "capacity_only": False, "timeout": 5},
         "skip": [{"id": "kv-capacity", "reason": "r"}], "subjects": ["m=sha256:" + "b" * 64], "timeout_s": 30},
        {"name": "b", "builtin": {"pool_ratio": 0.65, "decode_pool_ratio": 2, "context_length": 8192, "faults": ["auto-truncate"]},
         "node": "gpu-1"},
    ],
}


def one_line(exc: ConfigError) -> None:
    assert "\n" not in str(exc) and len(str(exc)) < 2000


@given(st.text(max_size=200))
def test_endpoint_log_and_header_text_never_raise_anything_but_config_errors(text: str) -> None:
    from kvpreflight.targets import parse_endpoint, parse_header, parse_log, parse_url

    for parse in (parse_endpoint, parse_url, parse_header, lambda t: parse_log(t, ["http://h:1"])):
        try:
            parse(text)
        except ConfigError as exc:
            one_line(exc)


@given(st.one_of(yaml_values, keyed, mutations(BASE_SPEC, keyed)))
def test_boot_specs_from_any_yaml_value(data: Any) -> None:
    from kvpreflight.boot import parse_spec

    try:
        parse_spec(data, source="s.yaml", base_dir="/tmp")
    except ConfigError as exc:
        one_line(exc)


@given(st.one_of(yaml_values, keyed, mutations(BASE_INVENTORY, keyed)))
def test_fleet_inventories_from_any_yaml_value(data: Any) -> None:
    from kvpreflight.fleet.inventory import parse_inventory

    try:
        parse_inventory(data, source="f.yaml", base_dir="/nonexistent")
    except ConfigError as exc:
        one_line(exc)


@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
@example(b"[" * 5000)  # PyYAML composes recursively: deep nesting was a RecursionError
@example(b"- " * 5000 + b"x")
def test_yaml_bytes_load_or_fail_in_one_line(raw: bytes) -> None:
    from kvpreflight._internal.fields import load_yaml

    try:
        load_yaml(raw, "x.yaml")
    except ConfigError as exc:
        one_line(exc)
