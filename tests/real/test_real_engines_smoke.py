"""The real-engine fixtures start real servers, answer over HTTP, and leave nothing behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import realengines

pytestmark = pytest.mark.alone  # real vLLM and llama.cpp


def _models(engine) -> dict:
    status, body = realengines.http_get(engine.url + "/v1/models")
    assert status == 200, body[:500]
    return json.loads(body)


def _inner_pytest(test_file: Path, *args: str) -> list[str]:
    """A pytest run in a scratch dir that loads this suite's conftest (and its fixtures) as a plugin."""
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
            "-o", "markers=real", str(test_file), *args]


def test_vllm_fixture_serves_models_and_logs_capacity(vllm_server):
    """The session's shared server, the shipped examples/specs/vllm-single.yaml (its teardown asserts
    that stop() leaves no vLLM process)."""
    engine = vllm_server
    assert engine.url.startswith("http://127.0.0.1:")
    assert engine.alive() and engine.pid > 0
    models = _models(engine)
    assert models["data"][0]["id"] == "./models/echo/hf"  # the spec's --model, from its folder
    assert models["data"][0]["max_model_len"] == 4096
    # The capacity line kvpreflight parses is in the exposed log file.
    assert re.search(r"CPU KV cache size: [\d,]+ tokens", engine.log_text())
    pids = engine.group_pids()
    assert engine.pid in pids and len(pids) >= 2  # API server + engine core
    assert engine.rss_bytes() > 100 * 2**20


def test_llama_fixture_serves_models_and_logs_capacity(start_llama_server):
    engine = start_llama_server()
    assert engine.url.startswith("http://127.0.0.1:")
    meta = _models(engine)["data"][0]["meta"]
    assert meta["n_ctx"] == 1024 and meta["n_vocab"] == 259  # -c 2048 split over -np 2 slots
    assert "n_ctx_slot = 1024" in engine.log_text()
    status, body = realengines.http_get(engine.url + "/props")
    assert status == 200 and json.loads(body)["total_slots"] == 2

    unified = start_llama_server(kv_unified=True)
    assert unified.port != engine.port
    assert "kv_unified = 'true'" in unified.log_text()

    pids = [engine.pid, unified.pid]
    engine.stop()
    unified.stop()
    for pid in pids:
        assert not realengines.pid_alive(pid), f"llama-server {pid} survived stop()"


def test_start_failure_reports_log_tail_and_cleans_up(tmp_path, echo_gguf):
    missing = tmp_path / "missing.gguf"
    with pytest.raises(realengines.EngineStartError) as err:
        realengines.start_llama(missing, tmp_path)
    assert "exited with status" in str(err.value)
    assert str(missing) in Path(err.value.log_path).read_text()


def test_failing_test_still_stops_its_servers(tmp_path, echo_gguf, llama_server_binary):
    """Run a test that fails after starting llama-server; its server must be gone afterwards."""
    pid_file = tmp_path / "pid"
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(textwrap.dedent(f"""
        from pathlib import Path
        def test_fails(start_llama_server):
            engine = start_llama_server()
            Path({str(pid_file)!r}).write_text(str(engine.pid))
            assert False, "deliberate failure"
    """))
    tests_dir = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        _inner_pytest(test_file),
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tests_dir)},
        capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "deliberate failure" in result.stdout
    pid = int(pid_file.read_text())
    assert not realengines.pid_alive(pid), f"llama-server {pid} outlived the failing test"


def test_missing_engine_fails_with_instruction_not_skip(tmp_path):
    test_file = tmp_path / "test_inner.py"
    # marked alone, as tests/conftest.py requires of every test with a vLLM engine
    test_file.write_text("import pytest\n\npytestmark = pytest.mark.alone\n\n\ndef test_needs_vllm(vllm_server):\n    pass\n")
    tests_dir = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPREFLIGHT_")}
    env["KVPREFLIGHT_CACHE"] = str(tmp_path / "empty-cache")
    env["PYTHONPATH"] = str(tests_dir)
    result = subprocess.run(
        _inner_pytest(test_file, "-rA"),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "skipped" not in out.lower()
    assert "run scripts/setup_engines.sh and source" in out

    deselected = subprocess.run(
        _inner_pytest(test_file, "-m", "not real"),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert deselected.returncode == 5, deselected.stdout  # 5: nothing collected/selected
    assert "1 deselected" in deselected.stdout


def test_shared_llama_server_exposes_url_log_and_pid(llama_server):
    assert llama_server.alive()
    assert realengines.pid_alive(llama_server.pid)
    assert _models(llama_server)["data"][0]["id"] == "tiny-llama"
    # -lv 4 puts the KV cache geometry in the log kvpreflight reads.
    assert re.search(r"llama_kv_cache: size = .*\(\s*1024 cells", llama_server.log_text())
    assert llama_server.log_path.is_file()


def test_echo_gguf_is_deterministic(tmp_path, echo_gguf):
    import hashlib

    again = realengines.build_echo_part("gguf", tmp_path, realengines.llama_python())
    digest = lambda p: hashlib.sha256(Path(p).read_bytes()).hexdigest()  # noqa: E731
    assert digest(again) == digest(echo_gguf)


def test_shared_llama_factory_reuses_a_server_per_argument_set(shared_llama_server):
    first = shared_llama_server(kv_unified=True)
    assert shared_llama_server(kv_unified=True) is first
    other = shared_llama_server()
    assert other.pid != first.pid and other.alive() and first.alive()
    assert "kv_unified = 'true'" in first.log_text() and "kv_unified = 'false'" in other.log_text()
