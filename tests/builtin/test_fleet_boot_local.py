"""`kvpreflight fleet` booting builtin deployments on this machine (no Ray): the example inventory
gives each deployment its own verdict and records, and leaves no temporary folder; a fleet stopped with SIGTERM mid-boot leaves no
engine behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from proctags import processes_tagged
from record_support import KVPREFLIGHT, make_keys, run_console_script

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet" / "inventory.yaml"


def statuses(row_engines_checks: dict, check_id: str) -> set[str]:
    return {c["status"] for c in row_engines_checks["checks"] if c["id"] == check_id}


def test_example_inventory_gives_each_deployment_its_verdict_and_a_record(tmp_path):
    _, private, public = make_keys(tmp_path / "keys")
    tag = uuid.uuid4().hex
    records = tmp_path / "records"
    temp = tmp_path / "tmp"  # no --work-dir: the boot logs' temporary folder lands here, and must be gone after
    temp.mkdir()
    result = subprocess.run(
        [str(KVPREFLIGHT), "fleet", str(EXAMPLE), "--parallel", "2", "--format", "json",
         "--record", str(records / "fleet.dsse.json"), "--sign-key", str(private)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "KVPREFLIGHT_TEST_TAG": tag, "TMPDIR": str(temp)})
    assert processes_tagged(tag) == set(), "engine processes left behind"
    assert [p.name for p in temp.iterdir() if p.name.startswith("kvpreflight-")] == [], "temporary folders left behind"
    assert result.returncode == 1, result.stderr[-3000:]
    rows = {d["name"]: d for d in json.loads(result.stdout)["deployments"]}
    assert list(rows) == ["chat-fixed", "chat-incident-ratio"]
    assert rows["chat-incident-ratio"]["verdict"] == "fail"
    assert {"id": "kv-capacity", "status": "fail"} in rows["chat-incident-ratio"]["not_passed"]
    assert "kv-capacity" not in {c["id"] for c in rows["chat-fixed"]["not_passed"]}
    pools = {e["role"]: e["kv_pool_tokens"] for e in rows["chat-incident-ratio"]["engines"]}
    assert pools == {"prefill": 5312, "decode": 16384}  # 0.65 x 8192 in 16-token pages; decode 2x
    # each deployment's record is the full check's record, with its engine logs as subjects
    one = json.loads(__import__("base64").b64decode(json.loads((records / "chat-fixed.dsse.json").read_text())["payload"]))
    assert {s["name"].rsplit("/", 1)[-1] for s in one["subject"]} >= {"prefill.log", "decode.log"}  # the logs read as capacity sources
    assert [e["role"] for e in one["predicate"]["engines"]] == ["prefill", "decode"]
    deep = run_console_script("verify", records / "fleet.dsse.json", "--key", public, "--any-subject", "--allow-fail", "--deep", records)
    assert deep.returncode == 0, deep.stderr
    assert "chat-incident-ratio.dsse.json: verified, verdict fail" in deep.stdout
    assert "[2/2 done, 0 running, 0 left]" in result.stderr and "[2/2 done" not in result.stdout


def test_a_fleet_stopped_with_sigterm_while_booting_leaves_no_engine(tmp_path):
    tag = uuid.uuid4().hex
    work = tmp_path / "work"
    inv = tmp_path / "fleet.yaml"
    inv.write_text(json.dumps({"deployments": [{"name": f"d{i}", "builtin": {"context_length": 1024}} for i in range(2)]}))
    proc = subprocess.Popen([str(KVPREFLIGHT), "fleet", str(inv), "--work-dir", str(work)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "KVPREFLIGHT_TEST_TAG": tag})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (work / "d0" / "logs" / "prefill.log").exists():
            time.sleep(0.2)
        assert (work / "d0" / "logs" / "prefill.log").exists(), "the deployment never started booting"
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and processes_tagged(tag):
        time.sleep(0.5)
    assert processes_tagged(tag) == set(), "engines outlived a fleet stopped with SIGTERM"
