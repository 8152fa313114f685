"""Secrets never reach an output, whatever an engine echoes (issue 12, defect 2): an engine that
repeats the request's credentials (the API key and both tenant keys, each raw, JSON-escaped,
URL-encoded and base64) in its model name, error bodies, event-stream frames, a response header
and its log is checked with `kvpreflight check` as a user runs it, the key in a variable whose NAME
does not look secret. None of the forms appears on stdout or stderr, in the report in any format, in
the GitHub step summary, or in the record (its decoded payload included)."""

from __future__ import annotations

import base64
import html
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from proctags import processes_tagged
from record_support import record_text
from support.echo_engine import echo_engine, secret_forms

from kvpreflight.formats import FORMATS

# '"' and '\' change under JSON escaping, '/', '+' and '=' under URL encoding; base64 changes all.
SERVING = 'sk-live"7f/3e+91\\Zq==Aa'
TENANT_A = 'ta-0123"4567/89+ab\\cd=='
TENANT_B = 'tb-9876"5432/10+ef\\gh=='
SECRETS = (SERVING, TENANT_A, TENANT_B)
# Names that do not look secret: the keys are removed by value, not because of their variable's name.
ENV = {"KVPF_SERVING": SERVING, "KVPF_TENANT_ONE": TENANT_A, "KVPF_TENANT_TWO": TENANT_B}
SUPPORT = Path(__file__).parents[1] / "support"


def views(text: str) -> dict[str, str]:
    """`text` as written and as a reader decodes it: HTML/XML entities resolved, and every string
    of a JSON document (keys included) unescaped, so a form escaped twice is found too."""
    out = {"as written": text, "entities resolved": html.unescape(text)}
    strings: list[str] = []
    for line in [text, *text.splitlines()]:  # a JSON document, or JSON lines (a record and its payload)
        try:
            _strings(json.loads(line), strings)
        except ValueError:
            continue
    out["json strings"] = "\n".join(strings)
    out["json strings, entities resolved"] = html.unescape(out["json strings"])
    return out


def _strings(value: Any, into: list[str]) -> None:
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            into.append(str(key))
            _strings(item, into)
    elif isinstance(value, list):
        for item in value:
            _strings(item, into)


def leaks(outputs: dict[str, str]) -> list[str]:
    """Where any form of any secret (or of its Authorization header) appears."""
    found = []
    for secret in SECRETS:
        forms = {**secret_forms(secret), **{f"header {k}": v for k, v in secret_forms(f"Bearer {secret}").items()},
                 "basic": base64.b64encode(f"tenant:{secret}".encode()).decode(),
                 # a part of one: 12 characters in a row (a line cut through a key leaves one)
                 **{f"part {i}": secret[i:i + 12] for i in range(len(secret) - 11)}}
        for where, text in outputs.items():
            for view, seen in views(text).items():
                found += [f"{name} form of {secret[:2]}... in {where} ({view})" for name, form in forms.items() if form in seen]
    return found


def run_check(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """`kvpreflight check ...` with the keys in the environment, as GitHub Actions runs it; every
    output it wrote, by name."""
    summary = tmp_path / "step-summary.md"
    tag = uuid.uuid4().hex
    env = {**os.environ, **ENV, "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary), "KVPREFLIGHT_TEST_TAG": tag}
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--api-key-env", "KVPF_SERVING", *args],
                          capture_output=True, text=True, timeout=180, env=env)
    assert processes_tagged(tag) == set(), "processes left behind"
    outputs = {"stdout": proc.stdout, "stderr": proc.stderr}
    for path in tmp_path.iterdir():
        if path.is_file() and path.suffix != ".log":
            outputs[path.name] = record_text(path) if path.name.startswith("record") else path.read_text()
    return proc, outputs


@pytest.mark.parametrize("fmt", FORMATS)
def test_credentials_an_engine_echoes_reach_no_output(tmp_path: Path, fmt: str) -> None:
    log = tmp_path / "engine.log"
    with echo_engine(log) as (url, seen):
        proc, outputs = run_check(["--endpoint", url, "--log", f"{url}={log}", "--tenant-a-key-env", "KVPF_TENANT_ONE",
                                   "--tenant-b-key-env", "KVPF_TENANT_TWO", "--timeout", "5", "--format", fmt,
                                   "--record", str(tmp_path / "record.dsse.json"), "--unsigned",
                                   "--subject", "image=sha256:" + "a" * 64], tmp_path)
    assert proc.returncode in (0, 1, 3) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    # The test can fail: every key was sent, echoed, and the echo reached what kvpreflight wrote.
    assert {f"Bearer {s}" for s in SECRETS} <= seen, seen
    assert SERVING in log.read_text()
    assert "record.dsse.json" in outputs and "step-summary.md" in outputs
    assert "redacted" in outputs["record.dsse.json"]
    assert any("redacted" in text for where, text in outputs.items() if where != "record.dsse.json")
    assert leaks(outputs) == []


def check_booted(tmp_path: Path, name: str, script: str, *,
                 ready_timeout_s: int) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """`check --boot` a one-engine spec whose engine is `script` (it reads the key from KVPF_SERVING)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"deployment": "echo", "engines": [
        {"name": name, "role": "unified", "port": "auto", "ready_timeout_s": ready_timeout_s,
         "command": [sys.executable, "-c", script]}]}))
    return run_check(["--boot", str(spec), "--log-dir", str(tmp_path / "logs"), "--format", "json"], tmp_path)


def test_a_booted_engine_that_prints_the_key_and_dies_leaks_it_nowhere(tmp_path: Path) -> None:
    """`check --boot`: kvpreflight quotes a dead engine's last log lines; the key is in them, in
    every form, including where a line is long enough to be cut."""
    script = ("import os, sys\n"
              f"sys.path.insert(0, {str(SUPPORT)!r})\n"
              "from echo_engine import secret_forms\n"
              "key = os.environ['KVPF_SERVING']\n"
              "print('x' * 180 + key, flush=True)\n"  # cut at 200 characters: the cut falls inside the key
              "print(' '.join(secret_forms(key).values()), flush=True)\n"
              "print(' '.join(secret_forms('Bearer ' + key).values()), flush=True)\n"
              "sys.exit(7)\n")
    proc, outputs = check_booted(tmp_path, "leaky", script, ready_timeout_s=30)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "status 7" in proc.stderr and "redacted" in proc.stderr, proc.stderr  # the lines were quoted
    assert leaks(outputs) == [], proc.stderr


def test_a_booted_engine_slow_to_start_leaks_the_key_in_no_progress_line(tmp_path: Path) -> None:
    """While kvpreflight waits for an engine it shows the engine's latest log line every few seconds."""
    script = ("import os, sys, time\n"
              "key = os.environ['KVPF_SERVING']\n"
              "print('loading weights for ' + key, flush=True)\n"
              "time.sleep(20)\n")
    proc, outputs = check_booted(tmp_path, "slow", script, ready_timeout_s=7)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "waiting for slow" in proc.stderr, proc.stderr  # a progress line quoted the log
    assert leaks(outputs) == [], proc.stderr
