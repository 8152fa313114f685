"""Shared pieces for the record tests: a hand-built Report, keys on disk, the real CLI."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from support.cli import invoke

from kvpreflight.model import CheckResult, EngineSnapshot, Origin, PoolReading, Report, Role, Status, Waiver
from kvpreflight.record import build_statement, generate, parse_subject, sign_statement, write_keypair, write_record


def _console_script() -> Path:
    beside = Path(sys.executable).with_name("kvpreflight")  # the venv the tests run in
    found = beside if beside.exists() else shutil.which("kvpreflight")
    assert found, "the kvpreflight console script is not installed; run `pip install -e .[test]` in this venv"
    return Path(found)


KVPREFLIGHT = _console_script()
APP_DIGEST = "3f" * 32
APP = parse_subject(f"app=sha256:{APP_DIGEST}")


def sample_report(*, failing: bool = False) -> Report:
    prefill = EngineSnapshot(
        url="http://prefill-0:30000", engine="sglang", version="0.4.9", role=Role.PREFILL, model="tiny-llama",
        served_context=131072,
        pool_readings=(
            PoolReading("log:KV Cache is allocated", Origin.ALLOCATOR, 140000),
            PoolReading("/server_info max_total_num_tokens", Origin.SCHEDULER, 139264),
        ),
    )
    decode = EngineSnapshot(
        url="http://decode-0:30001", engine="sglang", version="0.4.9", role=Role.DECODE, model="tiny-llama",
        served_context=131072,
        pool_readings=(PoolReading("log:KV Cache is allocated", Origin.ALLOCATOR, 150000, rank="dp0"),),
    )
    checks = (
        CheckResult(id="kv-capacity", status=Status.PASS, message="pool 139264 tokens >= context 131072",
                    endpoint=prefill.url, evidence={"pool_tokens": 139264, "context": 131072}),
        CheckResult(id="overcapacity-rejected", status=Status.FAIL if failing else Status.PASS,
                    message="over-capacity request got HTTP 200" if failing else "over-capacity request got HTTP 400",
                    endpoint=decode.url, evidence={"http_status": 200 if failing else 400,
                                                   "response_text": "fluent text from another tenant"}),
        CheckResult(id="tenant-isolation", status=Status.PASS, message="no canary crossed"),
        CheckResult(id="engine-advisories", status=Status.WARN, message="no throughput baseline"),
    )
    return Report(
        tool_version="0.1.0", engines=(prefill, decode), checks=checks,
        waivers=(Waiver("engine-advisories", "baseline lands next sprint"),),
        context_length_promised=131072, entry="http://router:8000",
        started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:01:00Z",
    )


def make_keys(directory: Path, algorithm: str = "ecdsa-p256"):
    key = generate(algorithm)
    private_path, public_path = write_keypair(directory, key)
    return key, private_path, public_path


def write_signed(path: Path, key, *, failing: bool = False, now: datetime | None = None,
                 subjects=(APP,), command_line=("kvpreflight", "check"), report: Report | None = None) -> dict:
    statement = build_statement(report or sample_report(failing=failing), command_line=list(command_line),
                                subjects=list(subjects), now=now)
    envelope = sign_statement(statement, key)
    write_record(path, envelope)
    return envelope


def hours_ago(hours: float) -> datetime:
    return datetime.now(UTC) - timedelta(hours=hours)


def run_console_script(*args: object, env: dict | None = None) -> subprocess.CompletedProcess:
    """The installed console script, as a user or a pipeline runs it (the process tiers)."""
    return subprocess.run([str(KVPREFLIGHT), *map(str, args)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def run_cli(*args: object, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process (tests/support/cli.py): the same app and exit codes as the console
    script, which tests/builtin/test_console_script.py runs as a process."""
    return invoke(*args, env=env)


def verify(record: Path, public: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_cli("verify", record, "--key", public, *extra)


def assert_refused(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """`verify` refused (exit 1) in one line, as sigstore's CLI writes it: FAIL: <file>: <reason>."""
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("FAIL: ") and ": refused: " in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def record_text(path: Path) -> str:
    """A record file as a reader of its content sees it: the envelope with its base64 payload
    decoded. A plaintext secret is never visible in the raw file (the payload is base64), so a
    test that looks for one must look here."""
    envelope = json.loads(path.read_text())
    return json.dumps(envelope) + base64.b64decode(envelope["payload"]).decode("utf-8")
