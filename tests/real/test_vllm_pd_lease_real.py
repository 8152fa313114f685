"""The vLLM NIXL pair of examples/specs/vllm-pd-nixl.yaml with a short KV lease: the shipped spec
with its prefill's `kv_connector_extra_config.kv_lease_duration` set to 3 s, booted once for the
module (after test_vllm_pd_real.py's pair is stopped: the NIXL side channels use fixed ports), for
what needs the lease to run out soon:

- `check --allow-disruptive --scenario late-decode`: the scenario sends tenant A's prefill leg
  itself, holds the decode leg past the 3 s lease while tenant B's requests take the freed pages,
  then sends it; the prefill counts and logs the late read, `pd-transfer` fails quoting it, the lease
  and the fix (exit 1), and a canary of B in A's answer fails `tenant-isolation` (issue 27, item 3);
- the watch test and the stripped-pair check (moved here from test_vllm_pd_real.py, whose shipped
  lease is 30 s: here the decode leg waits 3 + 5 s, not 35, and the stripped prefill's
  unclaimed KV is released after 3 s)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import realengines
import requests
from support.rewriting_proxy import Rewrites, rewriting_proxy
from support.vllm_pair import (
    LATE_READ,
    ROUTER_READY_TIMEOUT_S,
    SPEC,
    BootedPair,
    boot_pair,
    run_check,
    wait_until_idle,
)

pytestmark = pytest.mark.alone  # a real vLLM pair, one core each

SHORT_LEASE_S = 3
LEASE_JSON = re.compile(r'"kv_lease_duration":\d+')


@pytest.fixture(scope="module")
def short_lease_pair(tmp_path_factory: pytest.TempPathFactory, vllm_python: str, vllm_router_binary: str,
                     echo_hf_model: Path) -> Iterator[BootedPair]:
    """The shipped spec with the prefill's lease cut to SHORT_LEASE_S, booted as test_vllm_pd_real's pair is."""
    workdir = tmp_path_factory.mktemp("vllm-pd-short-lease")
    text, edits = LEASE_JSON.subn(f'"kv_lease_duration":{SHORT_LEASE_S}', SPEC.read_text())
    assert edits == 1, "the shipped spec's prefill states its lease once"
    spec = workdir / "vllm-pd-nixl-short-lease.yaml"
    spec.write_text(text)
    bins = sorted({str(Path(vllm_python).parent), str(Path(vllm_router_binary).parent)})
    with contextlib.ExitStack() as stack:
        yield boot_pair(stack, spec, workdir, echo_hf_model, bins)


def test_a_decode_leg_held_past_a_short_lease_fails_the_check(short_lease_pair: BootedPair) -> None:
    """Issue 27, item 3 on the real pair: late-decode alone (--scenario), through the router as a
    user would run it. The prefill counts the late read when tenant B's next request makes it step
    (vllm:nixl_num_notifications_after_expiry, its "Potentially invalid KV blocks ..." line):
    pd-transfer fails, quoting it with the 3 s lease and the fix; B's next prompt is written into
    A's freed page before the read, so B's canary reaches A's answer and tenant-isolation fails."""
    pair = short_lease_pair
    logs = [arg for e in pair.deployment.engines for arg in ("--log", f"{e.url}={e.log_path}")]
    run = run_check("--entry", pair.router.url, "--allow-disruptive", "--scenario", "late-decode", "--timeout", "60", *logs)
    report_dir = Path(pair.decode.log_path).parent
    (report_dir / "late-decode-report.json").write_text(json.dumps(run.report, indent=1))
    (report_dir / "late-decode-check.stderr").write_text(run.stderr)
    transfer, iso = run.check("pd-transfer"), run.check("tenant-isolation")
    (late,) = [s for s in iso["evidence"]["scenarios"] if s["scenario"] == "late-decode"]
    crossed = [c for c in iso["evidence"].get("crossings", []) if c["scenario"] == "late-decode"]
    print(f"vllm-pd-nixl short lease: late-decode check exit {run.exit_code} in {run.wall_s:.0f} s; "
          f"pd-transfer {transfer['status']}: {transfer['message']}; tenant-isolation {iso['status']}: {iso['message']}; "
          f"late-decode: {late.get('occurrence')}; crossings {[c['foreign_markers'] for c in crossed]}", file=sys.stderr)
    assert late["occurrence"].startswith("confirmed: the decode leg went"), late
    assert run.exit_code == 1, (run.summary(), run.stderr[-2000:])
    assert transfer["status"] == "fail" and LATE_READ in transfer["message"], transfer["message"]
    assert "during the late-decode scenario" in transfer["message"]
    assert (f"kv_transfer_config kv_connector_extra_config.kv_lease_duration {SHORT_LEASE_S} s at {pair.prefill.url} "
            "(stated in its start-up log)") in transfer["message"]
    assert "fix: " in transfer["message"]
    # B's prompt written into A's freed page: B's canary in A's answer (3 of 3 runs, docs/FINDINGS.md)
    assert crossed and iso["status"] == "fail" and "canary crossed tenants" in iso["message"], iso["message"]
    assert "A's answer did not repeat A's own canary" in late["occurrence"], late


# The stripped check: its prefill keeps every request's KV for the decode that never collects it,
# until the lease runs out; on the shipped spec's pair (then at vLLM's 30 s default lease and an
# 18-block prefill pool) the pool filled and a request waited a lease or two (boundary-accept took
# 30.5 s against a 1.7 s estimate; once past the default 30 s --timeout, leaving pd-transfer no
# served probe to judge). Here the lease is 3 s, so no request waits long: the capacity probes that
# pd-transfer judges ended 15 s into the check (on 2 shared cores). Nothing is asserted of
# the isolation probes here, so only the boundary scenario (which the capacity probes carry) and the
# smallest timing audit run (`--scenario boundary --timing-samples 8`; with every scenario and 30
# samples the check ran into its deadline, 63-69 s; so, 47-64 s); the 60 s deadline, four times the capacity
# probes' 15 s, bounds it; the 75 s --timeout stays the bound measured at the 30 s lease.
STRIPPED_TIMEOUT_S = 75
STRIPPED_DEADLINE_S = 60


def without_kv_transfer_params(_path: str, body: Any) -> Any:
    if isinstance(body, dict):
        body.pop("kv_transfer_params", None)
    return body


def test_pd_transfer_fails_when_the_decode_gets_no_transfer_params(
        short_lease_pair: BootedPair, vllm_router_binary: str, tmp_path: Path) -> None:
    """Issue 13's degradation on the real pair: a second vllm-router whose prefill is a proxy that
    strips `kv_transfer_params` from the prefill's answers. The router logs "No kv_transfer_params
    for prefill ..., decode will proceed without them" and vLLM's decode computes every prompt
    itself (PD degraded without an error); the decode's counters show it. (A proxy stripping them
    on the way to the decode instead left every request after the first unanswered.)"""
    prefill, decode = short_lease_pair.prefill, short_lease_pair.decode
    with rewriting_proxy(prefill.url, Rewrites(reply=without_kv_transfer_params)) as stripped_prefill:
        port, metrics_port = realengines.free_port(), realengines.free_port()
        router = realengines.start_engine(  # its own metrics port: the first router holds the default 29000
            "vllm-router-stripped",
            [vllm_router_binary, "--vllm-pd-disaggregation", "--kv-connector", "nixl", "--policy", "round_robin",
             "--prefill", stripped_prefill, "--decode", decode.url, "--host", "127.0.0.1", "--port", str(port),
             "--prometheus-port", str(metrics_port)],
            port=port, log_path=tmp_path / "router-stripped.log", ready_path="/health",
            ready_timeout_s=ROUTER_READY_TIMEOUT_S)
        with router:
            run = run_check("--entry", router.url, "--log", f"{stripped_prefill}={prefill.log_path}",
                            "--log", f"{decode.url}={decode.log_path}", "--deadline", str(STRIPPED_DEADLINE_S),
                            "--scenario", "boundary", "--timing-samples", "8",
                            "--timeout", str(STRIPPED_TIMEOUT_S))
    transfer = run.check("pd-transfer")
    print(f"vllm-pd-nixl stripped check: exit {run.exit_code} in {run.wall_s:.0f} s; pd-transfer {transfer['status']}: "
          f"{transfer['message']}", file=sys.stderr)
    (tmp_path / "stripped-check.stderr").write_text(run.stderr)
    (tmp_path / "stripped-check.json").write_text(json.dumps(run.report, indent=1))
    assert run.exit_code == 1 and transfer["status"] == "fail", (transfer["message"], run.summary(), run.stderr[-2000:])
    recomputed = [p for p in transfer["evidence"]["probes"] if p["verdict"] == "recomputed"]
    assert recomputed, transfer["evidence"]["probes"]
    for probe in recomputed:  # the decode computed the prompt and received no KV: quoted in the message
        assert probe["decode_kv_received_tokens"] == 0
        assert probe["decode_computed_tokens"] > probe["allowed_decode_compute_tokens"]
    assert "the decode recomputed the prompt" in transfer["message"]
    assert "no KV arrived (the transfer was skipped)" in transfer["message"]


def hold_a_decode_leg_past_the_lease(pair: BootedPair, prompt: str) -> requests.Response:
    """The router's two legs by hand, as vLLM's NIXL proxy sends them: the prefill computes the
    prompt and keeps its KV for a decode (do_remote_decode); the decode leg follows only after the
    lease has run out, so the decode reads blocks the prefill has already released. Deterministic:
    no stall is waited for."""
    legs = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 1, "stream": False}
    prefill = requests.post(f"{pair.prefill.url}/v1/completions", timeout=120, json={**legs, "kv_transfer_params": {
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
        "remote_host": None, "remote_port": None}})
    assert prefill.status_code == 200 and prefill.json().get("kv_transfer_params"), prefill.text[:300]
    time.sleep(SHORT_LEASE_S + 5)
    decode = requests.post(f"{pair.decode.url}/v1/completions", timeout=120,
                           json={**legs, "max_tokens": 8, "kv_transfer_params": prefill.json()["kv_transfer_params"]})
    # vLLM's prefill reads the decode's "done" notifications only while it steps: an idle prefill
    # counts the late read at its next request (in production, the next user's), so one follows.
    after = requests.post(f"{pair.prefill.url}/v1/completions", timeout=120,
                          json={"model": "tiny-llama", "prompt": "next request", "max_tokens": 2})
    assert after.status_code == 200, after.text[:300]
    return decode


def test_watch_reports_a_late_kv_read_in_the_round_it_happens(short_lease_pair: BootedPair) -> None:
    """Issue 31 on the real pair: `kvpreflight watch` (read-only: --no-canaries) follows the router,
    the engines' counters and the prefill's log; the test makes the late read happen between its
    rounds, and the round that sees it reports it as a hazard with the engine's own count; the
    rounds before it are clean."""
    pd_pair = short_lease_pair
    wait_until_idle(pd_pair.prefill.url, pd_pair.decode.url)
    prefill = pd_pair.prefill
    proc = subprocess.Popen([sys.executable, "-m", "kvpreflight", "watch", "--entry", pd_pair.router.url, "--no-canaries",
                             "--log", f"{prefill.url}={prefill.log_path}", "--interval", "2", "--listen", "off"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[dict[str, Any]] = []
    stream = proc.stdout
    assert stream is not None
    reader = threading.Thread(target=lambda: lines.extend(json.loads(line) for line in stream if line.startswith("{")),
                              daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not lines and time.monotonic() < deadline:
            time.sleep(0.5)
        assert lines, "no round in 60 s"
        triggered_after = len(lines)
        decode = hold_a_decode_leg_past_the_lease(pd_pair, "a late read " * 30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(f["what"] == "stale-kv-reads" for r in lines for f in r["findings"]):
            time.sleep(0.5)
    finally:
        proc.terminate()  # SIGTERM, as Kubernetes stops it
        try:
            proc.wait(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(timeout=10)
    before = lines[:triggered_after]
    assert all(r["outcome"] == "clean" for r in before), before
    late = [(r, f) for r in lines for f in r["findings"] if f["what"] == "stale-kv-reads"]
    print(f"vllm-pd-nixl watch: decode leg after the lease HTTP {decode.status_code}; {len(lines)} rounds; "
          f"late read in round {[r['round'] for r, _ in late]}", file=sys.stderr)
    assert late, [r["findings"] for r in lines]
    (round_, finding), *_ = late
    assert finding["endpoint"] == prefill.url and round_["outcome"] == "findings" and proc.returncode == 0
    logged = [f for f in round_["findings"] if f["what"] == "log-late-read"]
    assert logged or any(f["what"] == "log-late-read" for r in lines for f in r["findings"]), round_["findings"]
