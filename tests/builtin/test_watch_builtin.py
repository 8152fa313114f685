"""`kvpreflight watch` against one running builtin prefill/decode deployment (shared by the
module, 127.0.0.1 only, stopped by PID): a fault switched on at run time is reported within one
interval and the round after it is switched off is clean; SIGTERM stops the watcher within 10 s;
the decode restarted with a smaller pool, and a prefill added behind the router with a smaller pool
(the router's loopback-only test hook), are drift against the signed record; a full round
(--full-every) is judged as check judges it."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.builtin_testbed import PDTrio, pd_trio, start_engine, stop_engine
from support.cli import invoke
from support.consumers import run_consumer

from kvpreflight.boot.launch import free_port

pytestmark = pytest.mark.alone  # reported within one interval, stopped within seconds

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "examples" / "prometheus" / "kvpreflight.rules.yml"
CONTEXT, POOL, SMALLER_POOL = 4096, 8192, 4096
INTERVAL_S = 1.0
ROUND_WAIT_S = 20.0  # one round on 2 shared cores: a read of three processes and four short requests
SUBJECT = "image=sha256:" + "cd" * 32


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PDTrio]:
    with pd_trio(tmp_path_factory.mktemp("watch"), context_length=CONTEXT, prefill_pool=POOL, decode_pool=POOL,
                 page_log=False) as running:
        yield running


def switch(url: str, **body: object) -> None:
    request = urllib.request.Request(url + "/_kvpreflight/faults", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert reply.status == 200


class Lines:
    """The watcher's stdout, one parsed round per line, read by a thread (every wait bounded)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self._queue: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if line.startswith("{"):
                self._queue.put(json.loads(line))

    def next(self) -> dict:
        return self._queue.get(timeout=ROUND_WAIT_S)


def metric(port: int, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def test_a_fault_switched_on_is_reported_within_one_interval_and_off_the_next_round_is_clean(trio, tmp_path):
    port = free_port()
    argv = [sys.executable, "-m", "kvpreflight", "watch", "--entry", trio.router.url, "--interval", str(INTERVAL_S),
            "--listen", f"127.0.0.1:{port}", "--name", "builtin-pd"]
    with (tmp_path / "watch.err").open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, stdin=subprocess.DEVNULL)
    try:
        lines = Lines(proc)
        first = lines.next()
        assert first["outcome"] == "clean", first
        assert set(first["engines"]) == {trio.prefill.url, trio.decode.url}
        switch(trio.prefill.url, transfer_fail_every=1)  # every KV transfer now loses its second batch
        switched = time.monotonic()
        seen = [lines.next(), lines.next()]  # the round in flight at the switch may still be clean
        faulty = next((r for r in seen if r["findings"]), None)
        assert faulty is not None, seen
        assert time.monotonic() - switched < INTERVAL_S + 2 * ROUND_WAIT_S
        found = {(f["kind"], f["what"], f["endpoint"]) for f in faulty["findings"]}
        assert ("hazard", "transfer-failures", trio.prefill.url) in found, faulty
        assert ("canary", "request-failed", trio.router.url) in found, faulty
        assert faulty["exit_code"] == 1
        assert (metric(port, "kvpreflight_watch_findings_total", deployment="builtin-pd", kind="hazard") or 0) >= 1
        switch(trio.prefill.url)  # off
        after = [lines.next(), lines.next()]
        clean = after[1] if after[0]["findings"] else after[0]
        assert clean["outcome"] == "clean" and clean["findings"] == [], after
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - stopped < 10
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        switch(trio.prefill.url)
    assert "Traceback" not in (tmp_path / "watch.err").read_text()


def test_the_decode_restarted_with_a_smaller_pool_is_drift_against_the_signed_record(trio, tmp_path):
    invoke("keygen", "--out", tmp_path / "keys", check_ok=True)
    record, public = tmp_path / "release.dsse.json", tmp_path / "keys" / "kvpreflight.pub"
    invoke("check", "--entry", trio.router.url, "--capacity-only", "--record", record, "--sign-key",
           tmp_path / "keys" / "kvpreflight.key", "--subject", SUBJECT, "--format", "json", check_ok=True)
    clean = invoke("watch", "--entry", trio.router.url, "--once", "--record", record, "--key", public)
    assert clean.returncode == 0, (clean.stdout, clean.stderr)
    old = trio.decode
    port = int(old.url.rsplit(":", 1)[1])
    stop_engine(old)
    trio.decode = start_engine("decode", Path(old.log_path).parent, name="decode-restarted", context_length=CONTEXT,
                               pool_tokens=SMALLER_POOL, port=port)  # the module's teardown stops it by PID
    proc = invoke("watch", "--entry", trio.router.url, "--once", "--record", record, "--key", public)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    (line,) = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    drift = {(f["what"], f["endpoint"]): f for f in line["findings"] if f["kind"] == "drift"}
    smaller = drift["smaller-pool", trio.decode.url]
    assert (smaller["recorded"], smaller["found"]) == (POOL, SMALLER_POOL)
    assert ("smaller-pool", trio.prefill.url) not in drift


def set_prefills(router_url: str, urls: list[str]) -> None:
    """The builtin router's test hook: its prefill workers from now on (loopback only)."""
    request = urllib.request.Request(router_url + "/_kvpreflight/workers", data=json.dumps({"prefill_urls": urls}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert reply.status == 200


def test_a_worker_added_behind_the_router_with_a_smaller_pool_is_drift_against_the_signed_record(trio, tmp_path):
    invoke("keygen", "--out", tmp_path / "keys", check_ok=True)
    record, public = tmp_path / "release.dsse.json", tmp_path / "keys" / "kvpreflight.pub"
    invoke("check", "--entry", trio.router.url, "--capacity-only", "--record", record, "--sign-key",
           tmp_path / "keys" / "kvpreflight.key", "--subject", SUBJECT, "--format", "json", check_ok=True)
    added = start_engine("prefill", tmp_path, name="prefill-added", context_length=CONTEXT, pool_tokens=SMALLER_POOL)
    try:
        set_prefills(trio.router.url, [trio.prefill.url, added.url])  # an autoscaler added a smaller worker
        proc = invoke("watch", "--entry", trio.router.url, "--once", "--no-canaries", "--record", record, "--key", public)
    finally:
        set_prefills(trio.router.url, [trio.prefill.url])
        stop_engine(added)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    (line,) = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert added.url in line["engines"]
    drift = {(f["what"], f["endpoint"]): f for f in line["findings"] if f["kind"] == "drift"}
    assert set(drift) == {("unrecorded-engine", added.url), ("smaller-pool", added.url)}, line["findings"]
    assert drift["unrecorded-engine", added.url]["found"] == "prefill"
    smaller = drift["smaller-pool", added.url]
    assert (smaller["recorded"], smaller["found"]) == (POOL, SMALLER_POOL) and "smaller than" in smaller["message"]


def test_a_full_round_sends_a_near_context_and_a_refused_request_through_the_router(trio):
    """--full-every: the first round also sends the longest accepted prompt and one over capacity,
    judged by check's overcapacity-rejected and prompt-integrity; the builtin pair passes both."""
    proc = invoke("watch", "--entry", trio.router.url, "--rounds", "2", "--interval", "0.1", "--listen", "off",
                  "--full-every", "1h")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    first, second = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert first["full"] is True and first["outcome"] == "clean", first
    assert first["requests"] == 6 and first["prompt_tokens"] > CONTEXT  # 4 canaries + near-context + over-capacity
    assert second["full"] is False and second["requests"] == 4 and second["prompt_tokens"] <= 4 * 160
    assert "a full round every 3600 s" in proc.stderr and "prompt tokens per hour" in proc.stderr


def test_promtool_reads_the_metrics_and_the_shipped_rules_fire_on_drift_and_a_fault(tmp_path):
    """No engine: the series of two rounds as watch renders them, one deployment drifted, one with
    a hazard; promtool checks the text and fires exactly the alerts each deserves."""
    from prometheus_client.parser import text_string_to_metric_families

    from kvpreflight._internal.watch.findings import Finding, FindingKind, Round, RoundOutcome
    from kvpreflight._internal.watch.metrics import WatchMetrics

    def rendered(name: str, finding: Finding) -> str:
        metrics = WatchMetrics(name)
        metrics.record(Round(number=1, started_at="2026-12-02T00:00:00Z", finished_at="2026-12-02T00:00:01Z",
                             outcome=RoundOutcome.FINDINGS, findings=(finding,), requests=4, prompt_tokens=640))
        return metrics.text()

    texts = {
        "drifted": rendered("drifted", Finding(kind=FindingKind.DRIFT, what="smaller-pool", endpoint="http://d:1",
                                               message="pool", recorded=8192, found=4096)),
        "faulty": rendered("faulty", Finding(kind=FindingKind.HAZARD, what="transfer-failures", endpoint="http://p:1",
                                             message="failed", found=4)),
    }
    series = []
    for name, text in texts.items():
        (tmp_path / f"{name}.prom").write_text(text)
        checked = run_consumer("promtool", "check", "metrics", stdin=open(tmp_path / f"{name}.prom"))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.endswith("_timestamp_seconds"):
                    continue  # 2026 is in promtool's future: staleness is not what this test is about
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                series.append({"series": f"{s.name}{{{labels}}}", "values": f"{s.value:.17g}+0x30"})
    tests = [{"interval": "1m", "input_series": series, "alert_rule_test": [
        {"eval_time": "10m", "alertname": "KvpreflightWatchDrift", "exp_alerts": [{
            "exp_labels": {"deployment": "drifted", "kind": "drift", "severity": "critical"},
            "exp_annotations": {"summary": "drifted: 1 engine setting(s) differ from what the signed release record verified"}}]},
        {"eval_time": "10m", "alertname": "KvpreflightWatchHazard", "exp_alerts": [{
            "exp_labels": {"deployment": "faulty", "kind": "hazard", "severity": "critical"},
            "exp_annotations": {"summary": "faulty: the last watch round found 1 hazard finding(s)"}}]},
        {"eval_time": "10m", "alertname": "KvpreflightWatchUnreachable", "exp_alerts": []},
    ]}]
    test_file = tmp_path / "watch.rules.test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}))
    result = run_consumer("promtool", "test", "rules", test_file)
    assert result.returncode == 0 and "SUCCESS" in result.stdout + result.stderr, result.stdout + result.stderr


def test_the_kubernetes_example_passes_kubernetes_validate_strict():
    manifest = REPO / "examples" / "k8s" / "watch.yaml"
    result = run_consumer("kubernetes-validate", "--strict", manifest)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    for resource in ("deployment/kvpreflight-watch", "service/kvpreflight-watch", "cronjob/kvpreflight-watch-once"):
        assert f"passed for resource {resource}" in out, out
    # the Prometheus Operator's CRD has no schema there: said, not validated
    assert "kind ServiceMonitor" in out
