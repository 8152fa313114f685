"""`kvpreflight check --boot SPEC`: boot, check, stop — with real processes, and nothing left behind."""

from __future__ import annotations

import sys
from pathlib import Path

from support.boot_check import boot_check, spec_file

ROOT = Path(__file__).resolve().parents[2]


def test_builtin_pd_example_spec_boots_checks_and_stops(tmp_path):
    proc, report = boot_check(ROOT / "examples" / "specs" / "builtin-pd.yaml", tmp_path)
    assert report is not None, proc.stderr[-2000:]
    roles = [e["role"] for e in report["engines"]]
    assert roles == ["prefill", "decode"]
    for engine in report["engines"]:
        assert "allocator" in engine["kv_pool_origins"]  # read from the log boot mode captured
    capacity = [c for c in report["checks"] if c["id"] == "kv-capacity"]
    assert {c["status"] for c in capacity} == {"pass"}
    # every booted process's sockets read from /proc, each engine's API and the bootstrap on loopback
    (exposure,) = [c for c in report["checks"] if c["id"] == "network-exposure"]
    assert exposure["status"] == "pass" and exposure["evidence"]["read_from"] == ["/proc"], exposure["message"]
    assert {e["process"] for e in exposure["evidence"]["listeners"]} == {"prefill", "decode", "router"}
    assert all(e["address"] == "127.0.0.1" for e in exposure["evidence"]["listeners"])
    assert "stopping 3 engine(s)" in proc.stderr


def test_engine_that_crashes_on_start_is_inconclusive_with_its_last_words(tmp_path):
    crash = [sys.executable, "-c", "import sys; print('loading weights'); print('RuntimeError: CUDA out of memory'); sys.exit(7)"]
    spec = spec_file(tmp_path, [{"name": "prefill", "role": "unified", "port": "auto", "command": crash, "ready_timeout_s": 30}])
    proc, report = boot_check(spec, tmp_path)
    assert proc.returncode == 3 and report is None
    assert "Traceback" not in proc.stderr
    error = [l for l in proc.stderr.splitlines() if l.startswith("kvpreflight: error:")]
    assert len(error) == 1 and "status 7" in error[0] and "CUDA out of memory" in error[0]


def test_engine_that_never_becomes_ready_is_stopped_at_its_deadline(tmp_path):
    # Listens, but /health is 404 forever.
    server = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "{port}"]
    spec = spec_file(tmp_path, [{"name": "decode", "role": "unified", "port": "auto", "command": server, "ready_timeout_s": 3}])
    proc, report = boot_check(spec, tmp_path)
    assert proc.returncode == 3 and report is None
    error = [l for l in proc.stderr.splitlines() if l.startswith("kvpreflight: error:")]
    assert len(error) == 1 and "not ready within" in error[0]


def test_without_log_dir_the_temporary_log_folder_is_removed_unless_keep(tmp_path):
    import os
    import subprocess

    crash = [sys.executable, "-c", "import sys; print('RuntimeError: CUDA out of memory'); sys.exit(7)"]
    spec = spec_file(tmp_path, [{"name": "prefill", "role": "unified", "port": "auto", "command": crash, "ready_timeout_s": 30}])
    for keep in ((), ("--keep",)):
        temp = tmp_path / f"tmp{len(keep)}"
        temp.mkdir()
        proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--boot", str(spec), *keep],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(temp)})
        assert proc.returncode == 3, proc.stderr
        left = [p.name for p in temp.iterdir() if p.name.startswith("kvpreflight-")]
        if keep:
            assert len(left) == 1 and f"engine logs kept in {temp / left[0]}" in proc.stderr, proc.stderr
            assert (temp / left[0] / "prefill.log").is_file()
        else:
            assert left == [], left


def test_without_log_dir_the_record_names_logs_that_keep_keeps_and_otherwise_are_removed(tmp_path):
    """The builtin PD spec with no --log-dir: the record names each engine's log by digest; without
    --keep the folder is gone afterwards, with --keep it is printed and holds exactly those files."""
    import base64
    import hashlib
    import json
    import os
    import subprocess

    for keep in ((), ("--keep",)):
        temp, record = tmp_path / f"tmp{len(keep)}", tmp_path / f"record{len(keep)}.json"
        temp.mkdir()
        proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--boot", str(ROOT / "examples" / "specs" / "builtin-pd.yaml"),
                               "--capacity-only", "--record", str(record), "--unsigned", "--format", "json", "--output",
                               str(tmp_path / "report.json"), *keep],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(temp)})
        assert proc.returncode == 0, proc.stderr[-2000:]
        subjects = json.loads(base64.b64decode(json.loads(record.read_text())["payload"]))["subject"]
        logs = {Path(s["name"].removeprefix("file:")): s["digest"]["sha256"] for s in subjects if s["name"].endswith(".log")}
        assert sorted(p.name for p in logs) == ["decode.log", "prefill.log", "router.log"], subjects
        left = [p for p in temp.iterdir() if p.name.startswith("kvpreflight-")]
        if keep:
            assert left == [next(iter(logs)).parent] and f"engine logs kept in {left[0]}" in proc.stderr, proc.stderr
            assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in logs} == logs
        else:
            assert left == [] and "engine logs kept" not in proc.stderr
