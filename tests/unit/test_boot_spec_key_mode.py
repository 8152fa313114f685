"""A boot spec's private key (client_key, or client_cert holding the key) that others can read is
refused before anything boots, as --client-key's is, unless --allow-insecure-key (issue 28)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from support.cli import invoke


def spec_with_key(folder: Path, pki: dict[str, Path], mode: int, *, key_in_cert: bool = False) -> Path:
    (folder / "certs").mkdir()
    cert, key = folder / "certs" / "client.pem", folder / "certs" / "client.key"
    pem = {name: path.read_bytes() for name, path in pki.items()}
    cert.write_bytes(pem["client_both"] if key_in_cert else pem["client_cert"])
    key.write_bytes(pem["client_key"])
    (cert if key_in_cert else key).chmod(mode)
    engine = {"name": "gw", "role": "unified", "engine": "vllm", "url": "http://127.0.0.1:9", "ready_timeout_s": 30,
              "command": [sys.executable, "-c", "import time; time.sleep(300)"]}
    top = {"client_cert": "certs/client.pem"} if key_in_cert else {"client_cert": "certs/client.pem", "client_key": "certs/client.key"}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump({"deployment": "mtls", "context_length": 4096, "engines": [engine], **top}))
    return path


@pytest.mark.parametrize("key_in_cert,field", [(False, "client_key"), (True, "client_cert")])
def test_a_spec_key_others_can_read_is_refused_naming_the_field_and_the_fix(tmp_path: Path, pki: dict[str, Path],
                                                                          key_in_cert: bool, field: str):
    spec = spec_with_key(tmp_path, pki, 0o644, key_in_cert=key_in_cert)
    result = invoke("check", "--boot", spec, "--plan", "--no-calibrate")
    assert result.returncode == 2, (result.stdout, result.stderr)
    (line,) = result.stderr.strip().splitlines()
    assert f"spec.yaml: {field}: the private key" in line and "can be read by others (mode 0644)" in line
    assert "run `chmod 600` on it" in line and "--allow-insecure-key" in line
    assert "client.key" not in line and "client.pem" not in line  # the spec's key is named by its field, never its path


def test_allow_insecure_key_lets_the_spec_key_through_to_the_next_check(tmp_path: Path, pki: dict[str, Path]):
    spec = spec_with_key(tmp_path, pki, 0o644)
    result = invoke("check", "--boot", spec, "--plan", "--no-calibrate", "--allow-insecure-key")
    # the key passes; the next rule speaks (--plan reads running engines, so it refuses --boot)
    assert result.returncode == 2 and "can be read by others" not in result.stderr, result.stderr
    assert "--plan reads running engines" in result.stderr
