"""network-exposure on real vLLM (issue 46): `kvpreflight check --boot` of the shipped
examples/specs/vllm-kv-events-cpu.yaml, KV cache events on with vLLM's default publisher endpoint
(`tcp://*:5557`), fails, naming the publisher, its process, its port and `--kv-events-config`, read
from /proc while the server runs; and the session's shared vLLM server (examples/specs/vllm-single.yaml,
bound to 127.0.0.1) is clean, its sockets read from /proc the same way. The Mooncake stacks'
listeners are asserted where those pairs are booted (test_vllm_pd_mooncake_real.py,
test_sglang_live.py). One vLLM boot, `--capacity-only` (no request is sent: the sockets are open
once the server is ready). Needs scripts/setup_engines.sh; a vLLM that cannot start fails here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from realengines import EngineProcess, vllm_env, vllm_python

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks.interface import CheckContext
from kvpreflight._internal.checks.network_exposure import evaluate
from kvpreflight._internal.engines.listeners import identify
from kvpreflight.boot.sockets import listening
from kvpreflight.model import ListenerKind, Status

pytestmark = pytest.mark.alone  # boots vLLM

SPEC = Path(__file__).parents[2] / "examples" / "specs" / "vllm-kv-events-cpu.yaml"


def test_check_boot_of_vllm_with_kv_events_on_fails_naming_the_publisher(tmp_path: Path, echo_hf_model: Path) -> None:
    (tmp_path / "models" / "echo").mkdir(parents=True)
    (tmp_path / "models" / "echo" / "hf").symlink_to(echo_hf_model)
    env = {**os.environ, **vllm_env(tmp_path, None),
           "PATH": os.pathsep.join([str(Path(vllm_python()).parent), os.environ.get("PATH", "")])}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--boot", str(SPEC), "--capacity-only",
                           "--format", "json", "--log-dir", str(tmp_path / "logs")],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    print(f"vllm-kv-events check --boot: exit {proc.returncode} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"no JSON report (exit {proc.returncode}): {proc.stderr[-3000:]}")
    (exposure,) = [c for c in report["checks"] if c["id"] == "network-exposure"]
    assert proc.returncode == 1, (proc.returncode, exposure, proc.stderr[-2000:])
    assert exposure["status"] == "fail", exposure["message"]
    message = exposure["message"]
    assert "0.0.0.0:5557: vLLM's KV-events publisher (the token ids of every cached block)" in message
    assert "--kv-events-config endpoint (tcp://*:5557, the default)" in message
    assert "VLLM::EngineCor" in message  # the process that holds it, by pid and name
    assert exposure["evidence"]["read_from"] == ["/proc"]
    api = [e for e in exposure["evidence"]["listeners"] if e["carries"] == ListenerKind.API.value]
    assert api and all(e["address"] == "127.0.0.1" and e["verdict"] == "pass" for e in api), api
    # nothing else of the server listens beyond loopback: the publisher is the one finding
    beyond = [e for e in exposure["evidence"]["listeners"] if e["verdict"] != "pass"]
    assert [(e["address"], e["port"]) for e in beyond] == [("0.0.0.0", 5557)], beyond
    failed = {c["id"] for c in report["checks"] if c["status"] == "fail"}
    assert failed == {"network-exposure"}, report["checks"]


def test_the_shared_vllm_server_bound_to_loopback_is_clean(vllm_server: EngineProcess) -> None:
    """The shipped vllm-single.yaml (--host 127.0.0.1, no KV events): every socket of its processes,
    as boot mode reads them, is on loopback, and the check passes on them."""
    sockets = listening(vllm_server.group_pids())
    found = identify("vllm", vllm_server.url, [(s.pid, s.program, s.address, s.port) for s in sockets], vllm_server.log_text())
    (result,) = evaluate(CheckContext((), load_thresholds(), listeners=(found,)))
    print(f"vllm-single sockets: {[(s.program, s.address, s.port) for s in sockets]}", file=sys.stderr)
    assert result.status is Status.PASS, result.message
    assert any(li.kind is ListenerKind.API and li.port == int(vllm_server.url.rsplit(":", 1)[1]) for li in found.listeners)
    assert len(sockets) >= 2 and "listening sockets read from /proc" in result.message
