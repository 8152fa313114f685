"""The LiteLLM proxy (1.110.2, a real gateway) in front of one builtin unified engine, checked
through it (`--entry-api openai`): without a fallback its ContextWindowExceededError is the
engine's length refusal relayed, and overcapacity-rejected passes; with a context-window fallback
to a second deployment (a builtin engine serving a larger context under another model name), the
over-context request is answered HTTP 200 by that deployment, and overcapacity-rejected fails,
naming it. Real processes on 127.0.0.1, stopped by PID (process group).

Needs the proxy (scripts/setup_engines.sh --only litellm, `KVPREFLIGHT_LITELLM`): fails, never
skips, without it. Both proxies start in parallel (each takes 15-40 s to import on 2 cores).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import realengines
from realengines import EngineProcess

from kvpreflight.builtin_engine.testbed import RunningEngine, free_port, start_engine, stop_engine

CONTEXT = 2048  # the checked engine's; small, so the probes are quick
LARGE_CONTEXT = 8192  # the fallback deployment's
CHECKED_MODEL, FALLBACK_MODEL = "kvp-small", "kvp-large"
PROXY_READY_S = 90.0


def proxy_config(checked: RunningEngine, fallback: RunningEngine | None) -> str:
    """LiteLLM's config.yaml (docs.litellm.ai/docs/proxy/configs, .../routing#fallbacks): the
    openai/ provider, the model group named as the engine names its model (what kvpreflight asks for)."""
    def entry(name: str, engine: RunningEngine) -> dict:
        return {"model_name": name, "litellm_params": {"model": f"openai/{name}", "api_base": f"{engine.url}/v1",
                                                        "api_key": "none", "max_retries": 0}}
    config: dict = {"model_list": [entry(CHECKED_MODEL, checked)]}
    if fallback is not None:
        config["model_list"].append(entry(FALLBACK_MODEL, fallback))
        config["litellm_settings"] = {"context_window_fallbacks": [{CHECKED_MODEL: [FALLBACK_MODEL]}]}
    return json.dumps(config)  # YAML reads JSON


def start_proxy(binary: str, config: str, workdir: Path, name: str, master_key: str) -> EngineProcess:
    path = workdir / f"{name}.yaml"
    path.write_text(config)
    port = free_port()
    return realengines.start_engine(
        name, [binary, "--config", str(path), "--host", "127.0.0.1", "--port", str(port)], port=port,
        log_path=workdir / f"{name}.log", ready_path="/health/liveliness", ready_timeout_s=PROXY_READY_S,
        # The bundled cost map, not a download at start-up; the key the proxy insists on.
        env_overrides={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": master_key,
                       "LITELLM_TELEMETRY": "False"},
        wait_ready=False, cwd=workdir)


@pytest.fixture(scope="module")
def gateways(litellm_binary, tmp_path_factory) -> Iterator[tuple[RunningEngine, dict[str, EngineProcess], str]]:
    workdir = tmp_path_factory.mktemp("litellm")
    key = f"sk-{secrets.token_hex(16)}"
    started: list[RunningEngine] = []
    proxies: dict[str, EngineProcess] = {}
    try:
        checked = start_engine("unified", workdir, name="checked", context_length=CONTEXT, pool_tokens=4 * CONTEXT,
                               extra_args=["--model-name", CHECKED_MODEL])
        started.append(checked)
        fallback = start_engine("unified", workdir, name="fallback", context_length=LARGE_CONTEXT,
                                pool_tokens=2 * LARGE_CONTEXT, extra_args=["--model-name", FALLBACK_MODEL])
        started.append(fallback)
        for name, fb in (("no-fallback", None), ("fallback", fallback)):
            proxies[name] = start_proxy(litellm_binary, proxy_config(checked, fb), workdir, name, key)
        for proxy in proxies.values():
            realengines.wait_until_ready(proxy)
        yield checked, proxies, key
    finally:
        for proxy in proxies.values():
            proxy.stop()
        for engine in started:
            stop_engine(engine)


def check_through(proxy: EngineProcess, engine: RunningEngine, key: str) -> tuple[int, dict, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "kvpreflight", "check", "--endpoint", engine.url, "--entry", proxy.url, "--entry-api", "openai",
         "--api-key-env", "GATEWAY_KEY", "--format", "json", "--timeout", "20", "--deadline", "120"],
        capture_output=True, text=True, timeout=180, env={**realengines.os.environ, "GATEWAY_KEY": key})
    assert proc.stdout.strip(), f"no report (exit {proc.returncode}): {proc.stderr[-2000:]}\nproxy log:\n{proxy.log_tail()}"
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def result(report: dict, check_id: str) -> dict:
    (r,) = [c for c in report["checks"] if c["id"] == check_id]  # one engine: one result per check
    return r


def test_litellm_without_a_fallback_relays_the_length_refusal_and_passes(gateways):
    checked, proxies, key = gateways
    code, report, err = check_through(proxies["no-fallback"], checked, key)
    r = result(report, "overcapacity-rejected")
    assert r["status"] == "pass", (r["message"], err[-1500:])
    assert "refused for length (HTTP 400)" in r["message"]
    assert key not in json.dumps(report) and key not in err  # the gateway's key never reaches the report


def test_litellm_context_window_fallback_fails_overcapacity_rejected(gateways):
    checked, proxies, key = gateways
    code, report, err = check_through(proxies["fallback"], checked, key)
    r = result(report, "overcapacity-rejected")
    assert r["status"] == "fail" and code == 1, (r["message"], err[-1500:])
    assert "answered by another model or deployment" in r["message"]
    assert f"names model '{FALLBACK_MODEL}'" in r["message"]
    assert "no checked engine's prompt-token counter moved" in r["message"]
    # The clamp probe (prompt + max_tokens over the checked context) was served by the other
    # deployment too: a fail for what the client got, saying who answered.
    clamp = result(report, "max-tokens-clamp")
    assert clamp["status"] == "fail" and "answered by another model or deployment" in clamp["message"], clamp["message"]
