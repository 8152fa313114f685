"""Fast checks of the builtin engine's torch-free layer: its HTTP and handoff modules load without
torch, and faults and roles are closed sets with one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvpreflight._internal.builtin_engine.config import (
    ATTENTION_WINDOW_ENV,
    FAULTS,
    FAULTS_ENV,
    POSITIONS_ENV,
    Fault,
    ServeConfigError,
    faults_from_env,
    parse_faults,
    parse_role,
    pd_wait_from_env,
    tokens_from_env,
)
from kvpreflight._internal.builtin_engine.protocol import RequestError, params_from_generate
from kvpreflight.model import ProcessRole

TORCH_FREE = ("protocol", "api_sglang", "api_openai", "pd", "server", "startup", "config", "metrics", "prefix_cache")


def test_http_and_handoff_modules_do_not_import_torch():
    code = (
        "import sys\n"
        + "".join(f"import kvpreflight._internal.builtin_engine.{name}\n" for name in TORCH_FREE)
        + "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.endswith('builtin_engine.core')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_fault_names_are_the_cli_and_environment_spellings():
    assert sorted(FAULTS) == sorted([
        "reject-continues", "no-transfer-check", "early-free-on-cancel", "transfer-fail-as-drained",
        "prefix-cache-no-salt", "auto-truncate", "misreport-pool", "decode-recompute",
        "leak-streamed", "leak-not-streamed", "shortened-prompt", "tokens-then-garbage", "text-with-bad-count",
        "decode-cache-no-salt", "decode-cache-no-salt-partial", "positions-overridden", "positions-overridden-silent",
        "attention-window", "attention-window-silent", "pool-in-another-unit", "wedge-after-disconnect",
    ])
    assert faults_from_env({FAULTS_ENV: " auto-truncate , misreport-pool,"}) == {Fault.AUTO_TRUNCATE, Fault.MISREPORT_POOL}
    assert faults_from_env({}) == frozenset()
    assert all(FAULTS[f.value] == f.description for f in Fault)


@pytest.mark.parametrize("raw, expected", [("", None), ("  ", None), ("1024", 1024)])
def test_the_faults_token_parameters_come_from_the_environment(raw, expected):
    assert tokens_from_env(POSITIONS_ENV, {POSITIONS_ENV: raw}) == expected
    assert tokens_from_env(ATTENTION_WINDOW_ENV, {}) is None


@pytest.mark.parametrize("raw", ["0", "-3", "half", "1.5"])
def test_a_bad_token_parameter_is_one_line_naming_the_variable(raw):
    with pytest.raises(ServeConfigError) as caught:
        tokens_from_env(ATTENTION_WINDOW_ENV, {ATTENTION_WINDOW_ENV: raw})
    assert str(caught.value).startswith(f"{ATTENTION_WINDOW_ENV}={raw!r} must be a whole number of tokens")


@pytest.mark.parametrize("names,source,message", [
    (["bogus"], "--fault", "--fault names unknown fault bogus; known: attention-window, attention-window-silent, auto-truncate, "),
    (["auto-truncate", "typo-fault"], FAULTS_ENV, f"{FAULTS_ENV} names unknown fault typo-fault; known: "),
])
def test_unknown_fault_is_one_line_naming_where_it_came_from(names, source, message):
    with pytest.raises(ServeConfigError) as caught:
        parse_faults(names, source)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_pd_waits_read_sglangs_variables_per_role():
    env = {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "5", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "7.5"}
    assert pd_wait_from_env(ProcessRole.PREFILL, env) == 5.0
    assert pd_wait_from_env(ProcessRole.DECODE, env) == 7.5
    assert pd_wait_from_env(ProcessRole.DECODE, {}) == 60.0
    for bad in ("0", "-3", "soon", "nan", "1e9"):
        with pytest.raises(ServeConfigError) as caught:
            pd_wait_from_env(ProcessRole.DECODE, {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": bad})
        assert str(caught.value).startswith(f"SGLANG_DISAGGREGATION_WAITING_TIMEOUT={bad!r} is not a number of seconds")


def test_roles_are_process_roles():
    assert [parse_role(r.value) for r in ProcessRole] == list(ProcessRole)
    with pytest.raises(ServeConfigError, match=r"^--role 'leader' is not one of unified, prefill, decode, router$"):
        parse_role("leader")


def test_generate_body_parsing():
    params = params_from_generate({"sampling_params": {"max_new_tokens": 3, "stop": "x"}, "cache_salt": "a", "rid": "r1"})
    assert (params.max_new_tokens, params.stop, params.cache_salt, params.rid) == (3, ("x",), "a", "r1")
    with pytest.raises(RequestError, match="cache_salt must be a string."):
        params_from_generate({"cache_salt": 5})
