"""`kvpreflight check --boot SPEC` as a process, and the spec files the boot tests write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import yaml
from proctags import processes_tagged


def boot_check(spec: Path, tmp_path: Path, *args: str, timeout: int = 600, cwd: Path | None = None,
               extra_env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict | None]:
    tag = uuid.uuid4().hex
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--boot", str(spec), "--log-dir", str(tmp_path / "logs"),
                           "--format", "json", "--output", str(out), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(extra_env or {}), "KVPREFLIGHT_TEST_TAG": tag})
    assert processes_tagged(tag) == set(), "processes left behind"
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def spec_file(tmp_path: Path, engines: list[dict], **top) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"deployment": "t", "engines": engines, **top}))
    return path


