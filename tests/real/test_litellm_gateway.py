"""The LiteLLM proxy (1.110.2, a real gateway) in front of one builtin unified engine, checked
through it (`--entry-api openai`): without a fallback its ContextWindowExceededError is the
engine's length refusal relayed, and overcapacity-rejected passes; with a context-window fallback
to a second deployment (a builtin engine serving a larger context under another model name), the
over-context request is answered HTTP 200 by that deployment, and overcapacity-rejected fails,
naming it. One proxy serves both cases (its start-up, 15-40 s of imports on 2 cores, is most of
the module's time): one model group without a fallback, one with, each the model name of its own
checked engine. Real processes on 127.0.0.1, stopped by PID (process group).

Needs the proxy (scripts/setup_engines.sh --only litellm, `KVPREFLIGHT_LITELLM`): fails, never
skips, without it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator

import pytest
import realengines
from realengines import EngineProcess
from support.builtin_testbed import RunningEngine, free_port, start_engine, stop_engine

# One worker runs the module (scripts/test.sh runs this tier three at a time, `--dist loadgroup`): the
# proxy and its engines boot once.
pytestmark = pytest.mark.xdist_group("litellm-gateway")

CONTEXT = 2048  # the checked engine's; small, so the probes are quick
LARGE_CONTEXT = 8192  # the fallback deployment's
# The model groups: each checked engine serves its group's name (what kvpreflight asks the proxy for).
PLAIN_MODEL, GUARDED_MODEL, FALLBACK_MODEL = "kvp-small", "kvp-small-with-fallback", "kvp-large"
ALIAS = "chat-prod"  # a model group whose name is not the engine's: clients ask for it (--entry-model)
PROXY_READY_S = float(os.environ.get("KVPREFLIGHT_LITELLM_READY_TIMEOUT", "180"))  # imports, on a loaded machine


def proxy_config(engines: dict[str, RunningEngine]) -> str:
    """LiteLLM's config.yaml (docs.litellm.ai/docs/proxy/configs, .../routing#fallbacks): the openai/
    provider per model group; a context-window fallback for the guarded group only; ALIAS, a second
    group on the plain engine under a name it does not serve."""
    groups = [*((name, name, e) for name, e in engines.items()), (ALIAS, PLAIN_MODEL, engines[PLAIN_MODEL])]
    config = {
        "model_list": [{"model_name": group, "litellm_params": {"model": f"openai/{served}", "api_base": f"{e.url}/v1",
                                                                "api_key": "none", "max_retries": 0}}
                       for group, served, e in groups],
        "litellm_settings": {"context_window_fallbacks": [{GUARDED_MODEL: [FALLBACK_MODEL]}]},
    }
    return json.dumps(config)  # YAML reads JSON


@pytest.fixture(scope="module")
def gateway(litellm_binary, tmp_path_factory) -> Iterator[tuple[EngineProcess, dict[str, RunningEngine], str]]:
    workdir = tmp_path_factory.mktemp("litellm")
    key = f"sk-{secrets.token_hex(16)}"
    engines: dict[str, RunningEngine] = {}
    proxy = None
    try:
        for name, context in ((PLAIN_MODEL, CONTEXT), (GUARDED_MODEL, CONTEXT), (FALLBACK_MODEL, LARGE_CONTEXT)):
            engines[name] = start_engine("unified", workdir, name=name, context_length=context, pool_tokens=4 * context,
                                         extra_args=["--model-name", name])
        config = workdir / "litellm.yaml"
        config.write_text(proxy_config(engines))
        port = free_port()
        proxy = realengines.start_engine(
            "litellm", [litellm_binary, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)], port=port,
            log_path=workdir / "litellm.log", ready_path="/health/liveliness", ready_timeout_s=PROXY_READY_S,
            # The bundled cost map, not a download at start-up; the key the proxy insists on.
            env_overrides={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": key, "LITELLM_TELEMETRY": "False"},
            cwd=workdir)
        yield proxy, engines, key
    finally:
        if proxy is not None:
            proxy.stop()
        for engine in engines.values():
            stop_engine(engine)


def check_through(proxy: EngineProcess, engine: RunningEngine, key: str, *extra: str) -> tuple[int, dict, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "kvpreflight", "check", "--endpoint", engine.url, "--entry", proxy.url, "--entry-api", "openai",
         "--api-key-env", "GATEWAY_KEY", "--format", "json", "--timeout", "20", "--deadline", "120", *extra],
        capture_output=True, text=True, timeout=180, env={**os.environ, "GATEWAY_KEY": key})
    assert proc.stdout.strip(), f"no report (exit {proc.returncode}): {proc.stderr[-2000:]}\nproxy log:\n{proxy.log_tail()}"
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def result(report: dict, check_id: str) -> dict:
    (r,) = [c for c in report["checks"] if c["id"] == check_id]  # one engine: one result per check
    return r


def test_litellm_without_a_fallback_relays_the_length_refusal_and_passes(gateway):
    proxy, engines, key = gateway
    code, report, err = check_through(proxy, engines[PLAIN_MODEL], key)
    r = result(report, "overcapacity-rejected")
    assert r["status"] == "pass", (r["message"], err[-1500:])
    assert "refused for length (HTTP 400)" in r["message"]
    assert key not in json.dumps(report) and key not in err  # the gateway's key never reaches the report


def test_litellm_context_window_fallback_fails_overcapacity_rejected(gateway):
    proxy, engines, key = gateway
    code, report, err = check_through(proxy, engines[GUARDED_MODEL], key)
    r = result(report, "overcapacity-rejected")
    assert r["status"] == "fail" and code == 1, (r["message"], err[-1500:])
    assert "answered by another model or deployment" in r["message"]
    assert f"names model '{FALLBACK_MODEL}', which the checked engine(s) do not serve ({GUARDED_MODEL})" in r["message"]
    assert "no checked engine's prompt-token counter moved" in r["message"]
    # The clamp probe (prompt + max_tokens over the checked context) was served by the other
    # deployment too: a fail for what the client got, saying who answered.
    clamp = result(report, "max-tokens-clamp")
    assert clamp["status"] == "fail" and "answered by another model or deployment" in clamp["message"], clamp["message"]


def test_litellm_model_alias_is_checked_with_entry_model(gateway):
    """The engine serves kvp-small; clients know it as chat-prod. Without --entry-model the probes
    would name kvp-small to the proxy; with it they name the group, every probe check judges the
    engine's own answers, and none is taken for another deployment's."""
    proxy, engines, key = gateway
    code, report, err = check_through(proxy, engines[PLAIN_MODEL], key, "--entry-model", ALIAS)
    for check_id in ("overcapacity-rejected", "prompt-integrity", "concurrent-capacity", "max-tokens-clamp"):
        r = result(report, check_id)
        assert r["status"] == "pass", (check_id, r["message"], err[-1500:])
        assert "answered by another model or deployment" not in r["message"]
    # The name reaches the proxy: a group it does not have is refused, and nothing passes on that.
    code, report, err = check_through(proxy, engines[PLAIN_MODEL], key, "--entry-model", "no-such-group")
    probe_checks = [c for c in report["checks"] if c["id"] in
                    ("overcapacity-rejected", "prompt-integrity", "concurrent-capacity", "max-tokens-clamp")]
    assert code == 3 and probe_checks and {c["status"] for c in probe_checks} == {"inconclusive"}, (code, probe_checks)
    assert "Invalid model name passed in model=no-such-group" in result(report, "prompt-integrity")["message"]
