"""`kvpreflight check --boot SPEC`: boot, check, stop — with real processes, and nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import realengines
import yaml
from proctags import processes_tagged

ROOT = Path(__file__).resolve().parent.parent


def boot_check(spec: Path, tmp_path: Path, *args: str, timeout: int = 600) -> tuple[subprocess.CompletedProcess, dict | None]:
    tag = uuid.uuid4().hex
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--boot", str(spec), "--log-dir", str(tmp_path / "logs"),
                           "--format", "json", "--output", str(out), *args],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "KVPREFLIGHT_TEST_TAG": tag})
    assert processes_tagged(tag) == set(), "processes left behind"
    return proc, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.slow
def test_builtin_pd_example_spec_boots_checks_and_stops(tmp_path):
    proc, report = boot_check(ROOT / "examples" / "specs" / "builtin-pd.yaml", tmp_path)
    assert report is not None, proc.stderr[-2000:]
    roles = [e["role"] for e in report["engines"]]
    assert roles == ["prefill", "decode"]
    for engine in report["engines"]:
        assert "allocator" in engine["kv_pool_origins"]  # read from the log boot mode captured
    capacity = [c for c in report["checks"] if c["id"] == "kv-capacity"]
    assert {c["status"] for c in capacity} == {"pass"}
    assert "stopping 3 engine(s)" in proc.stderr


def spec_file(tmp_path: Path, engines: list[dict], **top) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"deployment": "t", "engines": engines, **top}))
    return path


@pytest.mark.slow
def test_engine_that_crashes_on_start_is_inconclusive_with_its_last_words(tmp_path):
    crash = [sys.executable, "-c", "import sys; print('loading weights'); print('RuntimeError: CUDA out of memory'); sys.exit(7)"]
    spec = spec_file(tmp_path, [{"name": "prefill", "role": "unified", "port": "auto", "command": crash, "ready_timeout_s": 30}])
    proc, report = boot_check(spec, tmp_path)
    assert proc.returncode == 3 and report is None
    assert "Traceback" not in proc.stderr
    error = [l for l in proc.stderr.splitlines() if l.startswith("kvpreflight: error:")]
    assert len(error) == 1 and "status 7" in error[0] and "CUDA out of memory" in error[0]


@pytest.mark.slow
def test_engine_that_never_becomes_ready_is_stopped_at_its_deadline(tmp_path):
    # Listens, but /health is 404 forever.
    server = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "{port}"]
    spec = spec_file(tmp_path, [{"name": "decode", "role": "unified", "port": "auto", "command": server, "ready_timeout_s": 3}])
    proc, report = boot_check(spec, tmp_path)
    assert proc.returncode == 3 and report is None
    error = [l for l in proc.stderr.splitlines() if l.startswith("kvpreflight: error:")]
    assert len(error) == 1 and "not ready within" in error[0]


@pytest.mark.real_engine
def test_vllm_booted_from_a_spec_is_checked(tmp_path, echo_hf_model):
    python = realengines.vllm_python()
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(echo_hf_model), "--host", "127.0.0.1",
            "--port", "{port}", "--max-model-len", "4096", "--served-model-name", "tiny-llama", "-O0", "--enforce-eager"]
    env = realengines.vllm_env(tmp_path / "vllm")  # its ZMQ sockets get a short folder of their own
    spec = spec_file(tmp_path, [{"name": "vllm", "role": "unified", "engine": "vllm", "port": "auto", "command": argv,
                                 "env": env, "ready_url": "/v1/models", "ready_timeout_s": 300}], context_length=4096)
    proc, report = boot_check(spec, tmp_path, "--skip", "max-tokens-clamp", "--reason", "vLLM clamps max_tokens by design")
    assert report is not None, proc.stderr[-2000:]
    checks = {c["id"]: c for c in report["checks"]}
    assert report["engines"][0]["engine"] == "vllm"
    assert checks["kv-capacity"]["status"] == "pass"
    assert checks["kv-sources-agree"]["status"] == "pass"  # the captured log is the second origin
    assert checks["overcapacity-rejected"]["status"] == "pass"
    assert checks["max-tokens-clamp"]["status"] == "skip" and "by design" in checks["max-tokens-clamp"]["message"]
