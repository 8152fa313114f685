"""Shared pytest setup: the three tiers, and the real-engine fixtures (vLLM on CPU, llama.cpp).

The suite is three tiers, one folder and one marker each (``scripts/test.sh unit|builtin|real``):

- ``tests/unit/`` (``unit``): in-process, no child process (tests/unit/conftest.py enforces it);
- ``tests/builtin/`` (``builtin``): the builtin engine, the demo and the CLI as real processes;
- ``tests/real/`` (``real``): real vLLM, the vLLM P/D pair, llama.cpp, smg and sglang-router, live SGLang, NVIDIA Dynamo.

A test that uses a real-engine fixture is a ``real`` test wherever it is collected; one under
unit/ or builtin/ is a collection error (it would hide minutes of engine time in a fast tier).
Real-engine tests FAIL, never skip, when the engines are not set up.
``$KVPREFLIGHT_CACHE/engines.env`` (written by ``scripts/setup_engines.sh``) is loaded here, so
``pytest`` works right after the setup script.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import realengines
from hypothesis import HealthCheck, settings
from realengines import EngineNotSetUp, EngineProcess

realengines.load_engines_env()


@pytest.fixture(autouse=True, scope="session")
def _json_reports_follow_the_published_schema() -> Iterator[None]:
    """Every JSON report and fleet report made in-process is validated against kvpreflight/schemas/."""
    from support.schemas import validating

    with validating():
        yield
# The table format wraps to COLUMNS when it is set (a user's shell, pytest-xdist's workers): the
# suite's expectations are for output to a pipe, which is never wrapped. Unset in the process's own
# environment too, which the child processes inherit: GNU readline (imported by pytest's debugger
# support) exports COLUMNS=80 and LINES there when TERM names a terminal, past os.environ, so with
# TERM=xterm every `kvpreflight` a test started wrapped its output at 80 columns.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
    os.unsetenv(_name)

# Property-based tests (tests/unit/test_properties_*.py): `ci`, the default, is derandomized with a fixed
# number of examples, so CI is repeatable and fast; HYPOTHESIS_PROFILE=long (benchmarks/) explores more.
settings.register_profile("ci", derandomize=True, max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Fixtures that boot or need a real engine; a test using one is a `real` test.
ENGINE_FIXTURES = {
    "litellm_binary",
    "vllm_python",
    "llama_server_binary",
    "echo_hf_model",
    "echo_gguf",
    "vllm_server",
    "llama_server",
    "start_llama_server",
    "shared_llama_server",
    "vllm_router_binary",
    "mooncake_python",
    "sglang_python",
    "dynamo_python",
}

# The real engines that fill both cores: every test using one runs alone.
VLLM_FIXTURES = {"vllm_python", "vllm_server", "echo_hf_model", "vllm_router_binary", "mooncake_python", "sglang_python",
                 "dynamo_python"}

TIERS = ("unit", "builtin", "real")
TESTS = Path(__file__).resolve().parent
VLLM_SINGLE_SPEC = TESTS.parent / "examples" / "specs" / "vllm-single.yaml"


def tier_of(path: Path) -> str | None:
    """The tier a test file belongs to: the folder under tests/ it lives in (None outside them)."""
    try:
        folder = Path(path).resolve().relative_to(TESTS).parts[0]
    except ValueError:
        return None
    return folder if folder in TIERS else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    misplaced = []
    for item in items:
        tier = tier_of(item.path)
        uses_engine = bool(ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())))
        if uses_engine and tier not in (None, "real"):
            misplaced.append(item.nodeid)
        if tier or uses_engine:
            item.add_marker(getattr(pytest.mark, tier or "real"))
    if misplaced:
        raise pytest.UsageError(f"real-engine tests outside tests/real/ (move them there): {', '.join(misplaced)}")
    # vLLM fills both cores (a pair binds one engine to each): a test with a vLLM engine beside
    # another test would skew both (scripts/test.sh runs the unmarked ones three at a time).
    unmarked = [item.nodeid for item in items if VLLM_FIXTURES.intersection(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("alone") is None]
    if unmarked:
        raise pytest.UsageError(f"tests with a vLLM engine not marked alone (add pytestmark = pytest.mark.alone): {', '.join(unmarked)}")
    # unit, then builtin, then real: the fast tiers fail first (a stable sort keeps each module's order)
    order = {name: i for i, name in enumerate(TIERS)}
    items.sort(key=lambda item: order.get(tier_of(item.path) or "real", len(TIERS)))


def _require(getter: Callable[[], str]) -> str:
    try:
        return getter()
    except EngineNotSetUp as e:
        message = str(e)
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """Path of the vLLM venv's python (``$KVPREFLIGHT_VLLM_PYTHON``); fails if not set up."""
    return _require(realengines.vllm_python)


@pytest.fixture(scope="session")
def llama_server_binary() -> str:
    """Path of ``llama-server`` (``$KVPREFLIGHT_LLAMA_SERVER``); fails if not set up."""
    return _require(realengines.llama_server_binary)


@pytest.fixture(scope="session")
def vllm_router_binary() -> str:
    """Path of ``vllm-router`` (``$KVPREFLIGHT_VLLM_ROUTER``); fails if not set up."""
    return _require(realengines.vllm_router_binary)


@pytest.fixture(scope="session")
def mooncake_python() -> str:
    """Path of the Mooncake venv's python (``$KVPREFLIGHT_MOONCAKE_PYTHON``); fails if not set up."""
    return _require(realengines.mooncake_python)


@pytest.fixture(scope="session")
def sglang_python() -> str:
    """Path of the SGLang venv's python (``$KVPREFLIGHT_SGLANG_PYTHON``); fails if not set up."""
    return _require(realengines.sglang_python)


@pytest.fixture(scope="session")
def dynamo_python() -> str:
    """Path of the Dynamo venv's python (``$KVPREFLIGHT_DYNAMO_PYTHON``); fails if not set up."""
    return _require(realengines.dynamo_python)


@pytest.fixture(scope="session")
def litellm_binary() -> str:
    """Path of the LiteLLM proxy's ``litellm`` (``$KVPREFLIGHT_LITELLM``); fails if not set up."""
    return _require(realengines.litellm_binary)


@pytest.fixture(scope="session")
def echo_hf_model(vllm_python) -> Path:
    """The echo model's HF Llama folder (scripts/make_echo_model.py), cached with the engines."""
    return realengines.echo_model("hf", vllm_python)


@pytest.fixture(scope="session")
def echo_gguf(llama_server_binary) -> Path:
    """The echo model's llama GGUF file (scripts/make_echo_model.py), cached with the engines."""
    return realengines.echo_model("gguf", _require(realengines.llama_python))


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory, echo_hf_model) -> Iterator[EngineProcess]:
    """One shared vLLM server for the session: the shipped examples/specs/vllm-single.yaml (context
    4096, a 9,216-token KV pool, prefix caching on with cached-token counts in `usage`) as the boot library plans
    it, with -O0 --enforce-eager added (they only shorten start-up on this CPU). Every test that can
    share it does: each vLLM start costs 1.5-2 minutes of the suite on 2 cores."""
    engine = realengines.start_vllm_spec(VLLM_SINGLE_SPEC, echo_hf_model, tmp_path_factory.mktemp("vllm-shared"),
                                         "-O0", "--enforce-eager")
    pids = engine.group_pids()
    try:
        yield engine
    finally:
        engine.stop()
    # vLLM runs its engine core in a child process: stop() must take the whole group (an error
    # here fails the session's last vLLM test)
    survivors = [pid for pid in pids if realengines.pid_alive(pid)] + realengines.process_group_members(engine.pgid)
    assert not survivors, f"vLLM processes {survivors} survived stop()"


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory, echo_gguf) -> Iterator[EngineProcess]:
    """One shared llama-server for the session: -c 2048 -np 2 --metrics -t 2 -lv 4."""
    engine = realengines.start_llama(echo_gguf, tmp_path_factory.mktemp("llama-shared"))
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture
def start_llama_server(tmp_path, echo_gguf) -> Iterator[Callable[..., EngineProcess]]:
    """Factory: ``start_llama_server(*extra_args, kv_unified=False, ctx=2048, parallel=2, ...)``.

    Keyword arguments are those of ``realengines.start_llama``. Every server it starts is
    stopped after the test, pass or fail.
    """
    yield from _engine_factory(realengines.start_llama, echo_gguf, tmp_path, "llama-server")


@pytest.fixture(scope="module")
def shared_llama_server(tmp_path_factory, echo_gguf) -> Iterator[Callable[..., EngineProcess]]:
    """Module-scoped, memoised factory for llama-server (e.g. ``shared_llama_server(kv_unified=True)``)."""
    workdir = tmp_path_factory.mktemp("llama-module")
    yield from _engine_factory(realengines.start_llama, echo_gguf, workdir, "llama-server", memo=True)


def _engine_factory(start_fn, model: Path, workdir: Path, name: str, memo: bool = False):
    started: list[EngineProcess] = []
    by_args: dict[str, EngineProcess] = {}

    def start(*extra_args: str, **kwargs) -> EngineProcess:
        key = repr((extra_args, sorted(kwargs.items())))
        if memo and key in by_args and by_args[key].alive():
            return by_args[key]
        kwargs.setdefault("log_name", f"{name}-{len(started)}.log")
        wait_ready = kwargs.pop("wait_ready", True)
        engine = start_fn(model, workdir, *extra_args, wait_ready=False, **kwargs)
        started.append(engine)  # registered before waiting: a failed start is stopped too
        if wait_ready:
            realengines.wait_until_ready(engine, kwargs.get("ready_timeout_s"))
        by_args[key] = engine
        return engine

    try:
        yield start
    finally:
        for engine in started:
            engine.stop()


# -- mutual TLS: a private CA, a server and client certificates, and a gateway that requires one --
@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from support.mtls import write_pki

    return write_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def mtls_url(pki: dict[str, Path]) -> Iterator[str]:
    from support.mtls import mtls_server

    with mtls_server(pki) as url:
        yield url
