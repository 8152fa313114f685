"""`kvpreflight fleet --ray` on a real multi-node Ray cluster on this machine
(`ray.cluster_utils.Cluster`: a head without CPUs and three nodes, each with its own custom
resource). Builtin-engine deployments are booted on named nodes; one is faulty; one node is killed
while its deployment runs; one deployment names a node that does not exist. Every deployment gets
its verdict (the killed one and the missing one `inconclusive` with the reason, within a deadline),
the records verify, and no process is left behind."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import uuid

import pytest
from proctags import processes_tagged
from record_support import KVPREFLIGHT, make_keys, run_console_script
from static_server import silent_server

pytestmark = pytest.mark.alone  # a Ray cluster on both cores; a dead node reported within a deadline

MB = 1024 * 1024
ROLE_FILES = ("prefill.log", "decode.log", "router.log")


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ours(tag: str) -> set[str]:
    """kvpreflight processes (engines, fleet workers) that carry this test's tag."""
    return {cmdline(p) for p in processes_tagged(tag) if "kvpreflight" in cmdline(p)}


def wait_until(predicate, timeout_s: float, step: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def test_fleet_on_ray_places_deployments_reports_a_dead_node_and_leaves_nothing(tmp_path, monkeypatch):
    with contextlib.ExitStack() as stack:
        run_fleet_on_ray(tmp_path, monkeypatch, stack)


def run_fleet_on_ray(tmp_path, monkeypatch, stack):
    try:
        from ray.cluster_utils import Cluster
    except ImportError:
        pytest.fail("ray is not installed; `pip install -e .[test]` installs it (scripts/test.sh does)", pytrace=False)

    tag = uuid.uuid4().hex
    monkeypatch.setenv("KVPREFLIGHT_TEST_TAG", tag)  # Ray's processes and every engine inherit it
    monkeypatch.setenv("RAY_DISABLE_USAGE_STATS", "1")
    _, private, public = make_keys(tmp_path / "keys")
    work = tmp_path / "work"
    builtin = {"context_length": 1024}
    # The two-tenant probes are test_demo's subject; here placement, verdicts and node loss are.
    waive = [{"id": c, "reason": "isolation is covered by test_demo"} for c in ("tenant-isolation", "prefix-cache-isolation")]
    inventory = tmp_path / "fleet.yaml"
    hanging = stack.enter_context(silent_server())  # accepts, never answers
    inventory.write_text(json.dumps({"fleet": "ray-test", "defaults": {"timeout_s": 420}, "deployments": [
        {"name": "good", "node": "node-a", "builtin": builtin, "skip": waive},
        {"name": "faulty", "node": "node-b", "builtin": {**builtin, "pool_ratio": 0.65}},
        {"name": "doomed", "node": "node-c", "builtin": builtin},
        {"name": "nowhere", "node": "node-z", "builtin": builtin},
        {"name": "stuck", "timeout_s": 2, "attach": {"endpoints": [hanging], "timeout": 120}},  # any node
    ]}))

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 80 * MB, "include_dashboard": False})
    try:
        nodes = {name: cluster.add_node(num_cpus=2, resources={name: 1}, object_store_memory=80 * MB)
                 for name in ("node-a", "node-b", "node-c")}
        cluster.wait_for_nodes()
        proc = subprocess.Popen(
            [str(KVPREFLIGHT), "fleet", str(inventory), "--ray", cluster.address, "--format", "json",
             "--output", str(tmp_path / "fleet.json"), "--record", str(tmp_path / "records" / "fleet.dsse.json"),
             "--sign-key", str(private), "--work-dir", str(work)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        lines: list[tuple[float, str]] = []
        reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in proc.stderr), daemon=True)
        reader.start()
        try:
            # kill node-c once its deployment's engines are all up and the check is running
            up = wait_until(lambda: all((work / "doomed" / "logs" / f).exists() for f in ROLE_FILES), 300)
            assert up, f"doomed never booted: {[line for _, line in lines][-10:]}"
            time.sleep(3)
            killed_at = time.monotonic()
            cluster.remove_node(nodes["node-c"])
            proc.wait(timeout=480)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join(timeout=10)
        err = "".join(line for _, line in lines)
        assert proc.returncode == 1, err[-3000:]  # one deployment failed: the fleet fails
        report = json.loads((tmp_path / "fleet.json").read_text())
        rows = {d["name"]: d for d in report["deployments"]}
        assert list(rows) == ["good", "faulty", "doomed", "nowhere", "stuck"]

        assert rows["good"]["verdict"] == "pass", rows["good"]
        assert rows["good"]["node"] == nodes["node-a"].node_id  # placed where the inventory said
        assert rows["faulty"]["verdict"] == "fail" and rows["faulty"]["node"] == nodes["node-b"].node_id
        assert {"id": "kv-capacity", "status": "fail"} in rows["faulty"]["not_passed"]
        prefill = next(e for e in rows["faulty"]["engines"] if e["role"] == "prefill")
        assert prefill["kv_pool_tokens"] < prefill["context"]

        assert rows["doomed"]["verdict"] == "inconclusive"
        assert "the Ray task failed" in rows["doomed"]["reason"], rows["doomed"]
        reported = next(t for t, line in lines if "doomed INCONCLUSIVE" in line)
        assert reported - killed_at < 90, "a dead node must be reported within a deadline, not retried"
        assert rows["nowhere"]["verdict"] == "inconclusive"
        assert "no Ray node offers resource 'node-z'" in rows["nowhere"]["reason"]
        assert rows["stuck"]["verdict"] == "inconclusive"
        assert "did not finish within its deadline of 7s (timeout_s); the Ray task was cancelled" in rows["stuck"]["reason"]

        # records: one per deployment and the fleet record naming them; deep verification passes
        names = sorted(p.name for p in (tmp_path / "records").iterdir())
        assert names == ["doomed.dsse.json", "faulty.dsse.json", "fleet.dsse.json", "good.dsse.json", "nowhere.dsse.json",
                         "stuck.dsse.json"]
        deep = run_console_script("verify", tmp_path / "records" / "fleet.dsse.json", "--key", public, "--any-subject",
                       "--allow-fail", "--deep", tmp_path / "records")
        assert deep.returncode == 0, deep.stderr
        assert "good.dsse.json: verified, verdict pass" in deep.stdout
        assert "doomed.dsse.json: verified, verdict inconclusive" in deep.stdout

        # the killed node's engines died with their worker: nothing of ours is left
        leftover = wait_until(lambda: not ours(tag), 60)
        assert leftover, f"processes left behind: {ours(tag)}"
    finally:
        cluster.shutdown()
    assert wait_until(lambda: not processes_tagged(tag), 60), \
        f"processes left behind after the cluster stopped: {[cmdline(p)[:120] for p in processes_tagged(tag)]}"
