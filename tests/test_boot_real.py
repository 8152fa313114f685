"""Boot mode against real engines, from the shipped example specs, unchanged: the builtin PD trio
(runs anywhere) and llama.cpp (llama-server answers /health 503 while loading, 200 when ready;
needs scripts/setup_engines.sh; conftest adds the real_engine marker for its fixtures)."""

from __future__ import annotations

import io
import json
import os
import urllib.request
from pathlib import Path

import pytest
from boot_support.procs import group_members, live_pids

from kvpreflight.boot import boot_deployment, load_spec

SPECS = Path(__file__).parent.parent / "examples" / "specs"
EXAMPLE = SPECS / "llamacpp.yaml"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))

pytestmark = pytest.mark.slow


def test_builtin_pd_example_boots_and_serves_through_the_router(tmp_path):
    stderr = io.StringIO()
    with boot_deployment(load_spec(SPECS / "builtin-pd.yaml"), tmp_path, stderr=stderr) as deployment:
        pids = set().union(*(e.process_ids() for e in deployment.engines))
        assert [(e.name, e.role, e.engine) for e in deployment.engines] == [
            ("prefill", "prefill", "builtin"), ("decode", "decode", "builtin"), ("router", "router", "builtin")]
        assert deployment.entry_url == deployment.engine("router").url
        request = urllib.request.Request(
            deployment.entry_url + "/generate", headers={"Content-Type": "application/json"},
            data=json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 3}}).encode())
        with NO_PROXY.open(request, timeout=30) as response:
            body = json.loads(response.read())
        assert body["meta_info"]["completion_tokens"] == 3
        for name in ("prefill", "decode"):
            log = Path(deployment.log_files[deployment.engine(name).url]).read_text()
            assert "KV Cache is allocated. dtype: torch.float32, #tokens: 8192" in log
    assert "all engines stopped" in stderr.getvalue()
    assert pids and not pids & live_pids()
    assert not any(group_members(e.pid) for e in deployment.engines)


def test_llamacpp_example_spec_boots_a_real_llama_server(tmp_path, monkeypatch, llama_server_binary, echo_gguf):
    # The example runs `llama-server -m ./models/echo/echo.gguf` from the current folder.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").symlink_to(llama_server_binary)
    (tmp_path / "models" / "echo").mkdir(parents=True)
    (tmp_path / "models" / "echo" / "echo.gguf").symlink_to(echo_gguf)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    # the pip-built binary finds its shared libraries beside it only through LD_LIBRARY_PATH
    libs = [str(Path(llama_server_binary).resolve().parent), os.environ.get("LD_LIBRARY_PATH", "")]
    monkeypatch.setenv("LD_LIBRARY_PATH", os.pathsep.join(p for p in libs if p))
    monkeypatch.chdir(tmp_path)
    stderr = io.StringIO()
    with boot_deployment(load_spec(EXAMPLE), tmp_path / "logs", stderr=stderr) as deployment:
        (engine,) = deployment.engines
        pids = set(engine.process_ids())
        assert engine.engine == "llamacpp" and deployment.entry_url == engine.url
        with NO_PROXY.open(engine.url + "/props", timeout=10) as response:
            assert b'"n_ctx":1024' in response.read().replace(b" ", b"")
        assert "n_ctx_slot = 1024" in Path(deployment.log_files[engine.url]).read_text()
    assert "llama ready after" in stderr.getvalue()
    assert not pids & live_pids() and not group_members(engine.pid)
