"""`kvpreflight keygen` and loading keys: files, modes, refusals, both algorithms."""

from __future__ import annotations

import json
import os
import stat
from datetime import timedelta
from pathlib import Path

import pytest
from record_support import APP_DIGEST, make_keys, run_cli, write_signed

from kvpreflight.record import Policy, RecordError, load_public_key, load_signing_key, resolve_sign_key_path, verify_envelope
from kvpreflight.record.dsse import envelope_from_dict


def test_keygen_writes_a_0600_private_key_and_a_public_key(tmp_path):
    result = run_cli("keygen", "--out", tmp_path / "k")
    assert result.returncode == 0, result.stderr
    private, public = tmp_path / "k" / "kvpreflight.key", tmp_path / "k" / "kvpreflight.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    key = load_signing_key(private)
    assert key.public.algorithm == "ecdsa-p256"
    assert load_public_key(public).keyid == key.keyid
    assert "BEGIN" not in result.stdout  # the key itself is never printed


def test_keygen_0600_holds_under_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        assert run_cli("keygen", "--out", tmp_path / "k").returncode == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k" / "kvpreflight.key").stat().st_mode) == 0o600


def test_keygen_refuses_to_overwrite_and_leaves_the_old_key(tmp_path):
    assert run_cli("keygen", "--out", tmp_path).returncode == 0
    before = (tmp_path / "kvpreflight.key").read_bytes()
    again = run_cli("keygen", "--out", tmp_path, "--algorithm", "ed25519")
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1 and "already exists; refusing to overwrite" in again.stderr
    assert (tmp_path / "kvpreflight.key").read_bytes() == before


def test_keygen_refuses_when_only_the_public_key_exists(tmp_path):
    (tmp_path / "kvpreflight.pub").write_text("old")
    result = run_cli("keygen", "--out", tmp_path)
    assert result.returncode == 2 and "kvpreflight.pub already exists" in result.stderr
    assert not (tmp_path / "kvpreflight.key").exists()


def test_keygen_rejects_an_unknown_algorithm(tmp_path):
    result = run_cli("keygen", "--out", tmp_path, "--algorithm", "rsa")
    assert result.returncode == 2 and "--algorithm 'rsa' is not supported" in result.stderr
    assert not any(tmp_path.iterdir())


def test_ed25519_round_trip_through_the_cli(tmp_path):
    assert run_cli("keygen", "--out", tmp_path / "k", "--algorithm", "ed25519").returncode == 0
    key = load_signing_key(tmp_path / "k" / "kvpreflight.key")
    assert key.public.algorithm == "ed25519"
    write_signed(tmp_path / "r.json", key)
    ok = run_cli("verify", tmp_path / "r.json", "--key", tmp_path / "k" / "kvpreflight.pub", "--subject", f"app=sha256:{APP_DIGEST}")
    assert ok.returncode == 0, ok.stderr


def test_encrypted_key_needs_the_password_from_env(tmp_path, monkeypatch):
    result = run_cli("keygen", "--out", tmp_path, "--encrypt", env={"KVPREFLIGHT_SIGN_KEY_PASSWORD": "correct horse"})
    assert result.returncode == 0, result.stderr
    assert "ENCRYPTED PRIVATE KEY" in (tmp_path / "kvpreflight.key").read_text()
    monkeypatch.delenv("KVPREFLIGHT_SIGN_KEY_PASSWORD", raising=False)
    with pytest.raises(RecordError, match="is encrypted; set KVPREFLIGHT_SIGN_KEY_PASSWORD"):
        load_signing_key(tmp_path / "kvpreflight.key")
    monkeypatch.setenv("KVPREFLIGHT_SIGN_KEY_PASSWORD", "wrong")
    with pytest.raises(RecordError, match="wrong password"):
        load_signing_key(tmp_path / "kvpreflight.key")
    monkeypatch.setenv("KVPREFLIGHT_SIGN_KEY_PASSWORD", "correct horse")
    assert load_signing_key(tmp_path / "kvpreflight.key").public.algorithm == "ecdsa-p256"


def test_encrypt_without_password_env_is_a_usage_error(tmp_path):
    result = run_cli("keygen", "--out", tmp_path, "--encrypt", env={"KVPREFLIGHT_SIGN_KEY_PASSWORD": ""})
    assert result.returncode == 2 and "KVPREFLIGHT_SIGN_KEY_PASSWORD" in result.stderr
    assert not (tmp_path / "kvpreflight.key").exists()


def test_keygen_rules_hold_in_the_library_without_the_cli(tmp_path):
    from kvpreflight.record.keys import keygen

    with pytest.raises(RecordError, match=r"^--algorithm 'rsa' is not supported; use one of: ecdsa-p256, ed25519$"):
        keygen(tmp_path, algorithm="rsa")
    with pytest.raises(RecordError, match=r"^--encrypt needs the password in \$KVPREFLIGHT_SIGN_KEY_PASSWORD"):
        keygen(tmp_path, encrypt=True, environ={})
    assert not any(tmp_path.iterdir())
    key, private, public = keygen(tmp_path, encrypt=True, environ={"KVPREFLIGHT_SIGN_KEY_PASSWORD": "pw"})
    assert "ENCRYPTED PRIVATE KEY" in private.read_text() and public.read_bytes() == key.public.pem()


def test_sign_key_path_comes_from_option_then_env_and_env_must_be_a_path(tmp_path, monkeypatch):
    monkeypatch.delenv("KVPREFLIGHT_SIGN_KEY", raising=False)
    assert resolve_sign_key_path(None) is None
    monkeypatch.setenv("KVPREFLIGHT_SIGN_KEY", "/keys/from-env.key")
    assert str(resolve_sign_key_path(None)) == "/keys/from-env.key"
    assert str(resolve_sign_key_path("/keys/opt.key")) == "/keys/opt.key"
    monkeypatch.setenv("KVPREFLIGHT_SIGN_KEY", "-----BEGIN PRIVATE KEY-----\nMIG...")
    with pytest.raises(RecordError, match="holds a key, not a path"):
        resolve_sign_key_path(None)


def test_loading_wrong_files_as_signing_key_says_what_is_wrong(tmp_path):
    _, private, public = make_keys(tmp_path)
    with pytest.raises(RecordError, match="not a PEM private key; pass the kvpreflight.key"):
        load_signing_key(public)
    with pytest.raises(RecordError, match="does not exist; create one with `kvpreflight keygen"):
        load_signing_key(tmp_path / "missing.key")
    assert "PRIVATE" not in repr(load_signing_key(private))


def test_a_record_signed_under_the_old_der_keyid_still_verifies():
    # examples/records was signed when the keyid was the SHA-256 of the key's DER
    examples = Path(__file__).resolve().parents[2] / "examples" / "records"
    record, public = examples / "demo-pass.dsse.json", examples / "kvpreflight.pub"
    assert json.loads(record.read_text())["signatures"][0]["keyid"] != load_public_key(public).keyid
    # the demo ran without tenant keys, so the default required checks are relaxed to what it ran
    policy = Policy(any_subject=True, max_age=timedelta(days=3650), required=())
    verified = verify_envelope(envelope_from_dict(json.loads(record.read_text())), load_public_key(public), policy)
    assert verified.verdict == "pass"


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o660])
def test_a_signing_key_its_group_or_others_can_read_is_refused_unless_allowed(tmp_path, mode):
    from kvpreflight.record import generate, load_signing_key, write_keypair

    private, _ = write_keypair(tmp_path / "keys", generate())
    assert private.stat().st_mode & 0o777 == 0o600  # keygen's key is accepted as written
    load_signing_key(private)
    private.chmod(mode)
    with pytest.raises(RecordError, match=rf"can be read by others \(mode 0{mode:o}\); run `chmod 600 .*--allow-insecure-key"):
        load_signing_key(private)
    assert load_signing_key(private, allow_insecure=True).keyid
