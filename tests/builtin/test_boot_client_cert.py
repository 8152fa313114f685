"""A boot spec's `client_cert` / `client_key` (issue 12): files only, relative to the spec, checked
before anything boots like `--client-cert/--client-key`, used for every request of
`check --boot SPEC`, and their paths and contents in no output (report, record, messages)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from proctags import processes_tagged
from record_support import record_text
from static_server import static_server

from kvpreflight.boot import load_spec
from kvpreflight.boot.errors import BootConfigError


@pytest.fixture(scope="module")
def ready_url() -> Iterator[str]:
    """Boot's readiness GET is plain HTTP without certificates: it goes here, not to the gateway."""
    with static_server({"GET /health": (200, "application/json", b"{}")}) as url:
        yield f"{url}/health"


def write_spec(folder: Path, *, engine_url: str = "http://127.0.0.1:9", ready: str = "http://127.0.0.1:9/health",
               marker: Path | None = None, **top: Any) -> Path:
    """A spec whose one "engine" is a sleeping process (it writes `marker` if it ever starts),
    reached at `engine_url` (the mTLS gateway) and ready when `ready` answers."""
    start = f"open({str(marker)!r}, 'w').close(); " if marker else ""
    engine = {"name": "gw", "role": "unified", "engine": "vllm", "url": engine_url, "ready_url": ready, "ready_timeout_s": 30,
              "command": [sys.executable, "-c", f"{start}import time; time.sleep(300)"]}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump({"deployment": "mtls", "engines": [engine], **top}))
    return path


def boot_check(spec: Path, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    tag = uuid.uuid4().hex
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--boot", str(spec), "--log-dir", str(tmp_path / "logs"),
                           "--capacity-only", "--timeout", "5", "--format", "json", "--output", str(out), *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "KVPREFLIGHT_TEST_TAG": tag})
    assert processes_tagged(tag) == set(), "processes left behind"
    return proc, (json.loads(out.read_text()) if out.exists() else None)


# -- parsing ----------------------------------------------------------------------------------------

def test_paths_are_taken_relative_to_the_spec(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    spec = load_spec(write_spec(tmp_path, client_cert="certs/client.pem", client_key="certs/client.key"))
    assert spec.client_cert == str(tmp_path / "certs" / "client.pem")
    assert spec.client_key == str(tmp_path / "certs" / "client.key")
    assert load_spec(write_spec(tmp_path)).client_cert is None


@pytest.mark.parametrize("top,fragment", [
    ({"client_key": "client.key"}, "client_key: needs client_cert"),
    ({"client_cert": ["a.pem"]}, "client_cert: expected a non-empty string, got a list"),
    ({"client_cert": " "}, "client_cert: expected a non-empty string"),
])
def test_a_malformed_key_is_one_line_naming_it(tmp_path: Path, top: dict[str, Any], fragment: str) -> None:
    with pytest.raises(BootConfigError) as caught:
        load_spec(write_spec(tmp_path, **top))
    assert fragment in str(caught.value) and caught.value.exit_code == 2


# -- checked before anything boots ------------------------------------------------------------------

def test_certificate_problems_are_configuration_errors_before_anything_boots(tmp_path: Path, pki: dict[str, Path]) -> None:
    cases = [
        ({"client_cert": "no-such-cert.pem"}, "client_cert: cannot read the file (no such file or directory)"),
        ({"client_cert": str(pki["client_cert"]), "client_key": str(pki["stranger_key"])},
         "client_key: the private key does not belong to the client_cert certificate"),
        ({"client_cert": str(pki["client_cert"]), "client_key": str(pki["encrypted_key"])}, "client_key: the private key is encrypted"),
        ({"client_cert": str(pki["ca"])}, "client_cert: not a PEM certificate and its PEM private key"),
    ]
    for top, fragment in cases:
        marker = tmp_path / "engine-started"
        proc, report = boot_check(write_spec(tmp_path, marker=marker, **top), tmp_path)
        assert proc.returncode == 2 and report is None, proc.stderr[-1000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("kvpreflight: error:")]
        assert len(errors) == 1 and fragment in errors[0], proc.stderr
        assert "Traceback" not in proc.stderr
        assert not marker.exists(), "an engine was booted before the certificate was checked"
        for value in top.values():
            assert Path(value).name not in proc.stderr  # the file's name, let alone its path, is not shown


def test_a_certificate_in_the_spec_and_on_the_command_line_is_refused(tmp_path: Path, pki: dict[str, Path]) -> None:
    spec = write_spec(tmp_path, client_cert=str(pki["client_both"]))
    proc, _ = boot_check(spec, tmp_path, "--client-cert", str(pki["client_both"]))
    assert proc.returncode == 2 and "sets client_cert, and --client-cert is given too" in proc.stderr, proc.stderr[-800:]


# -- used for every request ------------------------------------------------------------------------

def test_check_boot_sends_the_spec_certificate_to_the_gateway(tmp_path: Path, pki: dict[str, Path], mtls_url: str,
                                                                  ready_url: str) -> None:
    """Without the keys the gateway ends the TLS handshake (inconclusive, saying a client
    certificate may be needed); with them the engine is reached (what it answers is not an engine,
    so still inconclusive, but no longer for TLS). No output names the files."""
    certs = tmp_path / "tls-material-do-not-print"
    certs.mkdir()
    for name in ("client_cert", "client_key"):
        (certs / f"{name}.pem").write_bytes(pki[name].read_bytes())
    (certs / "client_key.pem").chmod(0o600)  # a key others can read is refused

    without = tmp_path / "without"
    without.mkdir()
    proc, report = boot_check(write_spec(without, engine_url=mtls_url, ready=ready_url), without, "--ca-bundle", str(pki["ca"]))
    assert proc.returncode == 3 and report is not None, proc.stderr[-1000:]
    assert "--client-cert" in " ".join(c["message"] for c in report["checks"])

    spec = write_spec(tmp_path, engine_url=mtls_url, ready=ready_url,
                      client_cert="tls-material-do-not-print/client_cert.pem", client_key="tls-material-do-not-print/client_key.pem")
    record = tmp_path / "record.json"
    proc, report = boot_check(spec, tmp_path, "--ca-bundle", str(pki["ca"]), "--record", str(record), "--unsigned")
    assert proc.returncode == 3 and report is not None, proc.stderr[-1000:]
    messages = " ".join(c["message"] for c in report["checks"])
    assert "TLS" not in messages and "--client-cert" not in messages, messages
    assert "/v1/models" in messages  # the gateway answered: the engine was read through it
    outputs = {"stdout": proc.stdout, "stderr": proc.stderr, "report": json.dumps(report), "record": record_text(record)}
    pem = (certs / "client_key.pem").read_text().splitlines()[1]  # a line of the key itself
    for where, text in outputs.items():
        assert "tls-material-do-not-print" not in text, where
        assert pem not in text, where
