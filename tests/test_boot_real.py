"""Boot mode against a real engine: the shipped llama.cpp example spec, unchanged, started by the
launcher (llama-server answers /health 503 while loading, 200 when ready). Needs
scripts/setup_engines.sh (the real_engine marker is added by conftest for these fixtures)."""

from __future__ import annotations

import io
import os
import urllib.request
from pathlib import Path

import pytest

from boot_support.procs import group_members, live_pids
from kvpreflight.boot import boot_deployment, load_spec

EXAMPLE = Path(__file__).parent.parent / "examples" / "specs" / "llamacpp.yaml"

pytestmark = pytest.mark.slow


def test_llamacpp_example_spec_boots_a_real_llama_server(tmp_path, monkeypatch, llama_server_binary, tiny_gguf):
    # The example runs `llama-server -m ./models/tiny.gguf` from the current folder.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").symlink_to(llama_server_binary)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny.gguf").symlink_to(tiny_gguf)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    stderr = io.StringIO()
    with boot_deployment(load_spec(EXAMPLE), tmp_path / "logs", stderr=stderr) as deployment:
        (engine,) = deployment.engines
        pids = set(engine.process_ids())
        assert engine.engine == "llamacpp" and deployment.entry_url == engine.url
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(engine.url + "/props", timeout=10) as response:
            assert b'"n_ctx":1024' in response.read().replace(b" ", b"")
        assert "n_ctx_slot = 1024" in Path(deployment.log_files[engine.url]).read_text()
    assert "llama ready after" in stderr.getvalue()
    assert not pids & live_pids() and not group_members(engine.pid)
