"""The vLLM prefill/decode pair of examples/specs/ booted as a user runs it, and `kvpreflight check`
run against it with its stderr timed: shared by the real tier's vLLM P/D tests (NIXL, Mooncake, lease)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import requests

from kvpreflight.boot import BootedDeployment, BootedEngine, boot_deployment, load_spec

SPEC = Path(__file__).resolve().parents[2] / "examples" / "specs" / "vllm-pd-nixl.yaml"
# The probes alone; issue 13 sets 4 minutes for the whole check at context 1,024, this is the
# ceiling before the run is called hung.
CHECK_TIMEOUT_S = 900
ROUTER_READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class CheckRun:
    exit_code: int
    report: dict[str, Any]
    stderr: str
    wall_s: float
    started_at: float = 0.0  # time.time() when the check started: the window the engine's own log is read in

    def check(self, check_id: str) -> dict[str, Any]:
        return next(c for c in self.report["checks"] if c["id"] == check_id)

    def summary(self) -> dict[str, tuple[str, str]]:
        return {c["id"]: (c["status"], c["message"]) for c in self.report["checks"]}


@dataclass(frozen=True)
class BootedPair:
    deployment: BootedDeployment
    stop: Callable[[], None]  # stops every engine of the pair (idempotent)
    progress: io.StringIO  # what the boot library said while booting and stopping it (also on stderr)

    @property
    def prefill(self) -> BootedEngine:
        return self.deployment.engine("prefill")

    @property
    def decode(self) -> BootedEngine:
        return self.deployment.engine("decode")

    @property
    def router(self) -> BootedEngine:
        return self.deployment.engine("router")


def run_check(*args: str, on_line: Callable[[str], None] | None = None, timeout_s: float | None = None) -> CheckRun:
    """`kvpreflight check --format json ARGS`; its stderr lines carry the second they arrived at, so
    a slow run shows where its time went. `on_line` sees each stderr line as it arrives (a test that
    acts on the deployment at a given point of the check)."""
    started, started_at = time.monotonic(), time.time()
    timed: list[str] = []

    def follow(stream: Any) -> None:
        for line in stream:
            timed.append(f"{time.monotonic() - started:7.1f}s {line}")
            if on_line is not None:
                on_line(line)

    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kvpreflight", "check", "--format", "json", *args],
                                stdout=out, stderr=subprocess.PIPE, text=True)
        reader = threading.Thread(target=follow, args=(proc.stderr,), daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout_s or CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        out.seek(0)
        stdout = out.read()
    wall_s = time.monotonic() - started
    stderr = "".join(timed)
    try:
        report = json.loads(stdout)
    except ValueError:
        pytest.fail(f"no JSON report (exit {proc.returncode}, {wall_s:.0f} s): {stderr[-3000:]}")
    return CheckRun(proc.returncode, report, stderr, wall_s, started_at)


def boot_pair(stack: contextlib.ExitStack, spec_path: Path, workdir: Path, echo_hf_model: Path, bins: list[str],
              extra_env: dict[str, str] | None = None) -> BootedPair:
    """Boot a shipped P/D spec from `workdir` (holding ./models/echo/hf) with `bins` first on PATH,
    its caches and zmq paths under the test's folders, and warm each engine; `stack` stops it."""
    (workdir / "models" / "echo").mkdir(parents=True)
    (workdir / "models" / "echo" / "hf").symlink_to(echo_hf_model)
    cache = workdir / "cache"
    rpc = stack.enter_context(tempfile.TemporaryDirectory(prefix="kvpf-rpc-", dir="/tmp"))  # zmq paths < 107 bytes
    env = {
        "PATH": os.pathsep.join([*bins, os.environ["PATH"]]),
        "VLLM_RPC_BASE_PATH": rpc,
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "XDG_CACHE_HOME": str(cache / "xdg"),
        **(extra_env or {}),
    }
    spec = load_spec(spec_path)
    spec = replace(spec, engines=tuple(
        replace(e, cwd=str(workdir), env=types.MappingProxyType({**e.env, **env})) for e in spec.engines))
    started = time.monotonic()
    progress = TeeToStderr()
    deployment = stack.enter_context(boot_deployment(spec, workdir / "logs", stderr=progress))
    print(f"{spec.deployment} boot: {time.monotonic() - started:.0f} s", file=sys.stderr)
    pair = BootedPair(deployment, stop=stack.close, progress=progress)
    warm_each_engine(pair)
    return pair


class TeeToStderr(io.StringIO):
    def write(self, text: str) -> int:
        sys.stderr.write(text)
        return super().write(text)


def warm_each_engine(pair: BootedPair) -> None:
    """One plain completion straight to each engine before anything goes through the router: on
    this project's 2-core Xeon (AMX) the decode's worker died (SIGILL) whenever the first request
    it ever served arrived with KV from the prefill, and never after one local request (README
    Findings). The pair under test is the warmed one, as an operator would run it."""
    for engine in (pair.prefill, pair.decode):
        reply = requests.post(f"{engine.url}/v1/completions", json={"model": "tiny-llama", "prompt": "warm up", "max_tokens": 2},
                              timeout=120)
        assert reply.status_code == 200, (engine.name, reply.status_code, reply.text[:300])


LATE_READ = "a decode read KV its prefill had already released"


def late_read_fail(check: dict[str, Any]) -> bool:
    """A check failed on a vLLM NIXL decode's read of KV its prefill had released (the lease ran out
    first): the engine's own hazard, which a vLLM pair on 2 shared cores earns about one run in two
    (test_vllm_pd_real.py, docs/FINDINGS.md)."""
    return check["status"] == "fail" and LATE_READ in check["message"] and "kv_lease_duration" in check["message"]


def crossing_fail(check: dict[str, Any]) -> bool:
    """tenant-isolation failed on a canary that crossed tenants."""
    return check["id"] == "tenant-isolation" and check["status"] == "fail" and "canary crossed tenants" in check["message"]


def vllm_counter(url: str, name: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def finished_requests(url: str) -> float:
    return vllm_counter(url, "vllm:request_success_total")


def wait_until_idle(*urls: str, timeout_s: float = 120.0) -> None:
    """Until no engine runs or queues a request: the test before this one (the stripped check,
    stopped at its deadline) can leave a request finishing at the prefill, which a count of
    finished requests taken too early would put down to this test (2 counted for its 1)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(vllm_counter(u, "vllm:num_requests_running") + vllm_counter(u, "vllm:num_requests_waiting")
                   for u in urls):
            return
        time.sleep(0.5)
    pytest.fail(f"the pair was still busy after {timeout_s:.0f} s: {urls}")
