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


def boot_check(spec: Path, tmp_path: Path, *args: str, timeout: int = 600, cwd: Path | None = None,
               extra_env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict | None]:
    tag = uuid.uuid4().hex
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--boot", str(spec), "--log-dir", str(tmp_path / "logs"),
                           "--format", "json", "--output", str(out), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(extra_env or {}), "KVPREFLIGHT_TEST_TAG": tag})
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
def test_vllm_example_spec_is_booted_checked_and_stopped(tmp_path, echo_hf_model):
    """examples/specs/vllm-single.yaml as a user runs it (from a folder holding ./models/echo/hf,
    vLLM's python3 first on PATH), with -O0 --enforce-eager added: they only shorten start-up on
    this CPU (35 s instead of 70 s). One vLLM start for both the boot and the check assertions."""
    (tmp_path / "models" / "echo").mkdir(parents=True)
    (tmp_path / "models" / "echo" / "hf").symlink_to(echo_hf_model)
    raw = yaml.safe_load((ROOT / "examples" / "specs" / "vllm-single.yaml").read_text())
    raw["engines"][0]["command"] += " -O0 --enforce-eager"
    raw["engines"][0]["env"] |= realengines.vllm_env(tmp_path / "vllm")  # short ZMQ socket folder, caches under tmp
    spec = spec_file(tmp_path, raw["engines"], context_length=raw["context_length"])
    path = os.pathsep.join([str(Path(realengines.vllm_python()).parent), os.environ["PATH"]])
    proc, report = boot_check(spec, tmp_path, "--skip", "max-tokens-clamp", "--reason", "vLLM clamps max_tokens by design",
                              cwd=tmp_path, extra_env={"PATH": path})
    assert report is not None, proc.stderr[-2000:]
    checks = {c["id"]: c for c in report["checks"]}
    (engine,) = report["engines"]
    assert engine["engine"] == "vllm" and engine["context_length"] == 4096
    assert "vllm ready after" in proc.stderr and "all engines stopped" in proc.stderr
    assert checks["kv-capacity"]["status"] == "pass"
    assert checks["kv-sources-agree"]["status"] == "pass"  # the captured log is the second origin
    assert checks["overcapacity-rejected"]["status"] == "pass"
    assert checks["max-tokens-clamp"]["status"] == "skip" and "by design" in checks["max-tokens-clamp"]["message"]
    # boot_check asserted that no process of the run (vLLM's engine core included) is left
