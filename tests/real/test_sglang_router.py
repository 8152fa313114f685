"""sglang-router 0.3.2 (SGLang's older PD router) in front of a builtin prefill/decode pair, which
speaks SGLang's PD protocol. Real processes on 127.0.0.1, stopped by PID.

Finding (docs/FINDINGS.md): sglang-router 0.3.2 re-serialises /generate through a typed request
that has SGLang's `extra_key` but no `cache_salt`, so a per-tenant `cache_salt` never reaches the
engine and tenants share cached prefixes; kvpreflight's prefix-cache-isolation check fails on it.

These tests need sglang-router (scripts/setup_engines.sh --only smg) and fail, never skip,
when it is not installed (the suite's setup installs it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from support.builtin_testbed import HOST, free_port, start_engine, stop_engine
from support.demo_runs import run_demo, statuses

from kvpreflight._internal.demo import find_sglang_router_python
from kvpreflight.errors import ConfigError

PROMPT = "tenant a's private notes, page after page " * 60


@pytest.fixture(scope="module")
def router_python() -> str:
    try:
        return find_sglang_router_python()
    except ConfigError as exc:
        pytest.fail(f"sglang-router is not installed (scripts/setup_engines.sh installs it): {exc}", pytrace=False)


@contextlib.contextmanager
def sglang_router_pair(python: str, workdir: Path) -> Iterator[str]:
    """The URL of sglang-router in front of a builtin prefill/decode pair."""
    bootstrap_port = free_port()
    started = []
    router = None
    try:
        prefill = start_engine("prefill", workdir, context_length=8192, pool_tokens=16384,
                               extra_args=["--disaggregation-bootstrap-port", str(bootstrap_port)])
        started.append(prefill)
        decode = start_engine("decode", workdir, context_length=8192, pool_tokens=16384)
        started.append(decode)
        port = free_port()
        with open(workdir / "sglang-router.log", "wb") as log:
            router = subprocess.Popen(
                [python, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--prefill", prefill.url,
                 str(bootstrap_port), "--decode", decode.url, "--host", HOST, "--port", str(port),
                 "--prometheus-host", HOST, "--prometheus-port", str(free_port())],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        url = f"http://{HOST}:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert router.poll() is None, (workdir / "sglang-router.log").read_text()[-2000:]
            with contextlib.suppress(requests.RequestException):
                if requests.get(url + "/readiness", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "sglang-router not ready after 60 s"
            time.sleep(0.2)
        yield url
    finally:
        if router is not None and router.poll() is None:
            os.kill(router.pid, signal.SIGTERM)
            try:
                router.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(router.pid, signal.SIGKILL)
                router.wait(timeout=5)
        for engine in reversed(started):
            stop_engine(engine)


def cached_tokens(url: str, text: str, **tenant: str) -> int:
    body = {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}, **tenant}
    reply = requests.post(url + "/generate", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return int(reply.json()["meta_info"]["cached_tokens"])


def test_sglang_router_drops_cache_salt_but_passes_extra_key(router_python: str, tmp_path: Path):
    with sglang_router_pair(router_python, tmp_path) as router:
        # Tenant b is served from tenant a's cached prefix: the salt never reached the engine ...
        assert cached_tokens(router, PROMPT + "1", cache_salt="tenant-a") == 0
        assert cached_tokens(router, PROMPT + "1", cache_salt="tenant-b") > 1000
        # ... while SGLang's other cache key, extra_key, gets through: the same key hits (the
        # control: caching works through the router), another key does not.
        assert cached_tokens(router, PROMPT + "2", extra_key="tenant-a") == 0
        assert cached_tokens(router, PROMPT + "2", extra_key="tenant-a") > 1000
        assert cached_tokens(router, PROMPT + "2", extra_key="tenant-b") == 0


def test_demo_behind_sglang_router_fails_only_prefix_cache_isolation(router_python: str, tmp_path: Path):
    code, report, err = run_demo(tmp_path, "sglang-router")
    found = statuses(report)
    assert code == 1, (found, err[-2000:])
    assert [e["role"] for e in report["engines"]] == ["prefill", "decode"]
    assert found.pop("prefix-cache-isolation") == {"fail"}
    assert all(s <= {"pass", "warn"} for s in found.values()), found
    cache = next(c for c in report["checks"] if c["id"] == "prefix-cache-isolation")
    assert "reused tenant A's cached prefix" in cache["message"] and "cache_salt" in cache["message"]


def test_demo_incident_behind_sglang_router_fails_rejection_and_isolation(router_python: str, tmp_path: Path):
    code, report, err = run_demo(tmp_path, "sglang-router", "--incident")
    found = statuses(report)
    assert code == 1, err[-2000:]
    assert found["overcapacity-rejected"] == {"fail"}
    assert found["tenant-isolation"] == {"fail"}
