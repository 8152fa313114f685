"""Boot mode against real engines, from the shipped example specs, unchanged: the builtin PD trio
(runs anywhere) and llama.cpp (llama-server answers /health 503 while loading, 200 when ready;
needs scripts/setup_engines.sh)."""

from __future__ import annotations

import io
import os
import urllib.request
from pathlib import Path

from boot_support.procs import group_members, live_pids

from kvpreflight.boot import boot_deployment, load_spec

SPECS = Path(__file__).parents[2] / "examples" / "specs"
EXAMPLE = SPECS / "llamacpp.yaml"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))



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
