"""`kvpreflight demo` as a subprocess behind a given PD router, for the router test modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from proctags import processes_tagged


def run_demo(tmp_path: Path, router: str, *args: str) -> tuple[int, dict, str]:
    """Exit code, JSON report ({} when none was written) and stderr; asserts nothing was left running."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "demo", "--router", router, "--format", "json",
                           "--output", str(out), "--record", str(tmp_path / "record.json"), "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "KVPREFLIGHT_TEST_TAG": tag})
    assert processes_tagged(tag) == set(), "processes left behind"
    return proc.returncode, json.loads(out.read_text()) if out.exists() else {}, proc.stderr


def statuses(report: dict) -> dict[str, set[str]]:
    """Each check id's statuses over its endpoints."""
    found: dict[str, set[str]] = {}
    for check in report.get("checks", []):
        found.setdefault(check["id"], set()).add(check["status"])
    return found


def unpassed(report: dict) -> list[tuple[str, str, str]]:
    """(check, status, message) of each check that neither passed nor warned nor skipped: what an
    assertion on the exit code should say when it fails (a set of statuses alone, as pytest shortens
    it, does not say which check failed or why)."""
    return [(c["id"], c["status"], c["message"]) for c in report.get("checks", [])
            if c["status"] not in ("pass", "warn", "skip")]

