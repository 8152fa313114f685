"""`kvpreflight fleet` on this machine (no Ray): bounded threads, one run per engine at a time,
deadlines, merged report, per-deployment records and the fleet record, `verify --deep`.

Engines here are small HTTP servers on 127.0.0.1 that answer nothing useful (404) or never answer:
what a fleet must survive. Builtin-engine deployments are in test_fleet_ray.py (slow)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from record_support import make_keys, record_text, run_console_script
from static_server import silent_server
from support.schemas import parsed

from kvpreflight.model import Status

SECRET = "sk-fleet-test-0123456789abcdef"


@contextlib.contextmanager
def slow_server(delay_s: float):
    """404 to everything after `delay_s`; counts the most requests it ever had in flight."""
    state = {"now": 0, "most": 0, "seen": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self):
            with lock:
                state["now"] += 1
                state["seen"] += 1
                state["most"] = max(state["most"], state["now"])
            time.sleep(delay_s)
            with lock:
                state["now"] -= 1
            body = b'{"detail": "Not Found"}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def write_inventory(path: Path, deployments: list[dict], **top) -> Path:
    path.write_text(json.dumps({"fleet": "test-fleet", **top, "deployments": deployments}))  # JSON is YAML
    return path


def fleet(*args, env=None) -> subprocess.CompletedProcess:
    return run_console_script("fleet", *args, env=env)


def test_deployments_sharing_an_engine_never_run_at_once_while_others_run_in_parallel(tmp_path):
    with slow_server(0.3) as (shared, state), slow_server(0.3) as (other, other_state):
        inv = write_inventory(tmp_path / "fleet.yaml", [
            {"name": "blue", "attach": {"endpoints": [shared], "timeout": 5}},
            {"name": "green", "attach": {"endpoints": [shared], "timeout": 5}},
            {"name": "canary", "attach": {"endpoints": [other], "timeout": 5}},
        ])
        started = time.monotonic()
        result = fleet(inv, "--parallel", "3", "--format", "json")
        elapsed = time.monotonic() - started
    assert result.returncode == 3, result.stderr  # nothing could be read: inconclusive, never pass
    report = parsed(result.stdout, "fleet-report")
    assert [d["name"] for d in report["deployments"]] == ["blue", "green", "canary"]
    assert {d["verdict"] for d in report["deployments"]} == {"inconclusive"}
    assert state["seen"] >= 2 and state["most"] == 1, "two kvpreflight runs hit one engine at the same time"
    assert other_state["seen"] >= 1
    assert "blue, green share" not in result.stderr and "1 group(s) share an engine" in result.stderr
    assert elapsed < 50


def test_a_deployment_past_its_deadline_is_inconclusive_with_the_reason_and_the_rest_still_report(tmp_path):
    with silent_server() as hanging, slow_server(0.0) as (quick, _):
        inv = write_inventory(tmp_path / "fleet.yaml", [
            {"name": "stuck", "timeout_s": 1, "attach": {"endpoints": [hanging], "timeout": 60}},
            {"name": "quick", "attach": {"endpoints": [quick], "timeout": 5}},
        ])
        started = time.monotonic()
        result = fleet(inv, "--parallel", "2", "--format", "json")
        elapsed = time.monotonic() - started
    assert result.returncode == 3
    rows = {d["name"]: d for d in parsed(result.stdout, "fleet-report")["deployments"]}
    assert rows["stuck"]["verdict"] == "inconclusive"
    assert "did not finish within its deadline of 6s" in rows["stuck"]["reason"]
    assert rows["quick"]["verdict"] == "inconclusive" and rows["quick"]["reason"] is None  # measured: engine unreadable
    assert elapsed < 30
    assert "stuck INCONCLUSIVE: did not finish within its deadline" in result.stderr


@pytest.fixture()
def keys(tmp_path):
    _, private, public = make_keys(tmp_path / "keys")
    return private, public


def test_records_per_deployment_and_a_fleet_record_verify_deep_and_keep_no_secret(tmp_path, keys):
    private, public = keys
    with slow_server(0.0) as (a, _), slow_server(0.0) as (b, _):
        inv = write_inventory(tmp_path / "fleet.yaml", [
            {"name": "chat-a", "attach": {"endpoints": [a], "api_key_env": "KVPF_TEST_SERVING_KEY", "timeout": 5}},
            {"name": "chat-b", "attach": {"endpoints": [f"unified={b}"], "timeout": 5}},
        ])
        out = tmp_path / "records"
        result = fleet(inv, "--record", out / "fleet.dsse.json", "--sign-key", private, "--subject", "image=sha256:" + "cd" * 32,
                       env={"KVPF_TEST_SERVING_KEY": SECRET})
    assert result.returncode == 3, result.stderr
    assert "chat-a" in result.stdout and "fleet test-fleet: INCONCLUSIVE" in result.stdout
    assert "kv-capacity (inconclusive): could not read the engine" in result.stdout  # the table says why
    assert sorted(p.name for p in out.iterdir()) == ["chat-a.dsse.json", "chat-b.dsse.json", "fleet.dsse.json"]
    for path in out.iterdir():
        assert SECRET not in record_text(path)
    assert SECRET not in result.stderr and SECRET not in result.stdout

    # the fleet is inconclusive, so the release gate refuses it, naming the deployments
    refused = run_console_script("verify", out / "fleet.dsse.json", "--key", public, "--any-subject")
    assert refused.returncode == 1
    assert "verdict is 'inconclusive', not 'pass' (deployments: chat-a inconclusive, chat-b inconclusive)" in refused.stderr
    # authenticity only, deep: every deployment record is checked by digest and key
    deep = run_console_script("verify", out / "fleet.dsse.json", "--key", public, "--subject", "image=sha256:" + "cd" * 32,
                   "--allow-fail", "--deep", out)
    assert deep.returncode == 0, deep.stderr
    assert "chat-a.dsse.json: verified, verdict inconclusive" in deep.stdout
    assert "chat-b.dsse.json: verified, verdict inconclusive" in deep.stdout

    # a deployment record changed after the fleet record was signed is refused
    record = out / "chat-b.dsse.json"
    envelope = json.loads(record.read_text())
    record.write_text(json.dumps(envelope, indent=4))
    altered = run_console_script("verify", out / "fleet.dsse.json", "--key", public, "--any-subject", "--allow-fail", "--deep", out)
    assert altered.returncode == 1 and "chat-b.dsse.json: sha256" in altered.stderr and "changed after signing" in altered.stderr
    record.unlink()
    missing = run_console_script("verify", out / "fleet.dsse.json", "--key", public, "--any-subject", "--allow-fail", "--deep", out)
    assert missing.returncode == 1 and f"chat-b.dsse.json: not found in {out}" in missing.stderr
    # --deep on a single deployment's record is a usage error
    single = run_console_script("verify", out / "chat-a.dsse.json", "--key", public, "--any-subject", "--allow-fail", "--deep", out)
    assert single.returncode == 2 and "--deep needs a fleet record" in single.stderr


def test_a_passing_fleet_verifies_deep_and_a_subject_missing_from_a_deployment_record_is_refused(tmp_path, keys):
    from record_support import sample_report

    from kvpreflight.fleet.job import Outcome
    from kvpreflight.fleet.records import write_fleet_records
    from kvpreflight.fleet.report import FleetReport
    from kvpreflight.record import build_statement, load_signing_key, parse_subject

    private, public = keys
    image = parse_subject("image=sha256:" + "ef" * 32)
    statement = build_statement(sample_report(), command_line=["kvpreflight", "fleet"], subjects=[image])
    outcomes = tuple(Outcome(name, Status.PASS, 0, statement, host="node-1", report=sample_report()) for name in ("eu", "us"))
    report = FleetReport("rel", "local", outcomes, "fleet.yaml", "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "0.1.0")
    out = tmp_path / "rec"
    written = write_fleet_records(report, record=out / "fleet.dsse.json", signer=load_signing_key(private),
                                  subjects=[image], command_line=["kvpreflight", "fleet", "fleet.yaml"])
    assert sorted(Path(p).name for p in written.values()) == ["eu.dsse.json", "us.dsse.json"]
    ok = run_console_script("verify", out / "fleet.dsse.json", "--key", public, "--subject", str(image), "--deep", out)
    assert ok.returncode == 0, ok.stderr
    assert "verdict    pass" in ok.stdout and "  fleet      eu: pass (eu.dsse.json)" in ok.stdout
    other = run_console_script("verify", out / "fleet.dsse.json", "--key", public, "--subject", "model=sha256:" + "01" * 32, "--deep", out)
    assert other.returncode == 1 and "subject model is not in the record" in other.stderr


def test_formats_other_than_table_and_json_carry_every_deployments_checks(tmp_path):
    with slow_server(0.0) as (a, _):
        inv = write_inventory(tmp_path / "fleet.yaml", [{"name": "solo", "attach": {"endpoints": [a], "timeout": 5}}])
        result = fleet(inv, "--format", "junit")
    assert result.returncode == 3
    assert "<testsuite" in result.stdout and "[solo] could not read the engine" in result.stdout
    bad = fleet(inv, "--format", "yaml")
    assert bad.returncode == 2 and "--format 'yaml': choose one of table, json, junit" in bad.stderr


def test_without_ray_installed_fleet_ray_says_how_to_install_it(tmp_path):
    shim = tmp_path / "shim" / "ray"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    inv = write_inventory(tmp_path / "fleet.yaml", [{"name": "a", "attach": {"endpoints": ["http://127.0.0.1:9"]}}])
    result = fleet(inv, "--ray", "auto", env={"PYTHONPATH": str(shim.parent)})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "kvpreflight: error: --ray needs Ray, which is not installed; "
        "install it with: pip install 'kvpreflight[fleet]' (or pip install 'ray>=2.9')"]


def test_help_imports_neither_ray_nor_torch():
    code = ("import sys; sys.argv = ['kvpreflight', 'fleet', '--help']\n"
            "import kvpreflight._internal.cli as cli\n"
            "try:\n    cli.app()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert "--parallel" in result.stdout


def test_engines_of_a_worker_killed_with_sigkill_are_stopped_by_the_reaper(tmp_path):
    """What Ray does to a task's processes when their node goes away: SIGKILL, no clean-up."""
    import signal

    from proctags import processes_tagged

    tag = os.urandom(8).hex()
    env = {**os.environ, "KVPREFLIGHT_TEST_TAG": tag}
    worker = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "subprocess.Popen([sys.executable, '-m', 'kvpreflight.fleet.reaper', str(__import__('os').getpid())], start_new_session=True)\n"
         "engine = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
         "print(engine.pid, flush=True)\n"
         "time.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True, env=env)
    try:
        engine = int(worker.stdout.readline())
        time.sleep(1.0)  # the reaper has seen the engine
        assert os.path.exists(f"/proc/{engine}")
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and processes_tagged(tag):
            time.sleep(0.2)
        assert processes_tagged(tag) == set(), "the engine (or the reaper) outlived a SIGKILLed worker"
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        for pid in processes_tagged(tag):  # only if the test failed: leave nothing running
            os.kill(pid, signal.SIGKILL)


def test_fleet_ray_with_nothing_at_the_address_is_one_line_exit_2_at_once(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    inv = write_inventory(tmp_path / "fleet.yaml", [{"name": "a", "attach": {"endpoints": ["http://127.0.0.1:9"]}}])
    started = time.monotonic()
    result = fleet(inv, "--ray", f"127.0.0.1:{port}")
    assert result.returncode == 2 and time.monotonic() - started < 20
    assert f"kvpreflight: error: --ray 127.0.0.1:{port}: nothing answers there" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_attached_deployments_api_key_never_reaches_the_fleet_report_even_in_a_url(tmp_path):
    with slow_server(0.0) as (a, _):
        inv = write_inventory(tmp_path / "fleet.yaml", [
            {"name": "chat", "attach": {"endpoints": [f"{a}/?tenant={SECRET}"], "api_key_env": "KVPF_TEST_SERVING_KEY",
                                        "timeout": 5}}])
        result = fleet(inv, "--format", "markdown", env={"KVPF_TEST_SERVING_KEY": SECRET})
    assert result.returncode == 3, result.stderr
    # the report names the URL it could not read, without the key; so does the progress on stderr
    assert "could not read the engine" in result.stdout and "tenant=<redacted>" in result.stdout
    assert "chat INCONCLUSIVE" in result.stderr and "tenant=<redacted>" in result.stderr
    assert SECRET not in result.stdout and SECRET not in result.stderr
