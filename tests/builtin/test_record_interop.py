"""Our records checked by verifiers we did not write: securesystemslib (Python) and sigstore-js (Node).

sigstore-js (@sigstore/verify) verifies a Sigstore bundle v0.3 that wraps our DSSE envelope with a
public-key hint, offline: the key comes from a keySelector and the tlog/ctlog/timestamp thresholds
are 0. The npm packages are installed on first use into $KVPREFLIGHT_SIGSTORE_JS_DIR (default
.cache/sigstore-js in the repo). With node on PATH a failed install or a failed check FAILS the test.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from record_support import APP, APP_DIGEST, load, make_keys, run_console_script, sample_report, write_signed
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey

from kvpreflight.record import Policy, build_statement, emit_record, load_public_key, verify_envelope
from kvpreflight.record.attest import TEST_RESULT_PREDICATE_TYPE, configuration_files
from kvpreflight.record.dsse import envelope_from_dict
from kvpreflight.record.sign import statement_bytes

REPO = Path(__file__).resolve().parents[2]
SIGSTORE_JS_PACKAGES = ("@sigstore/verify@3.1.1", "@sigstore/bundle@4.0.0")

VERIFY_JS = r"""
// node verify.js ENVELOPE.json PUBKEY.pem : exit 0 and "sigstore-js: verified", or exit 1 and why
const fs = require('fs');
const crypto = require('crypto');
const { bundleFromJSON } = require('@sigstore/bundle');
const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');
const [envPath, keyPath] = process.argv.slice(2);
const env = JSON.parse(fs.readFileSync(envPath, 'utf8'));
const pem = fs.readFileSync(keyPath, 'utf8');
const hint = env.signatures[0].keyid;
const bundle = bundleFromJSON({
  mediaType: 'application/vnd.dev.sigstore.bundle.v0.3+json',
  verificationMaterial: { publicKey: { hint }, tlogEntries: [], timestampVerificationData: { rfc3161Timestamps: [] } },
  dsseEnvelope: { payload: env.payload, payloadType: env.payloadType,
                  signatures: env.signatures.map((s) => ({ sig: s.sig, keyid: s.keyid })) },
});
const root = { certificateAuthorities: [], timestampAuthorities: [], tlogs: [], ctlogs: [] };
const trust = toTrustMaterial(root, (h) => {
  if (h !== hint) throw new Error(`unknown key hint ${h}`);
  return { publicKey: crypto.createPublicKey(pem), validFor: () => true };
});
const verifier = new Verifier(trust, { tlogThreshold: 0, ctlogThreshold: 0, timestampThreshold: 0 });
try {
  verifier.verify(toSignedEntity(bundle));
} catch (e) {
  console.log(`sigstore-js: FAILED ${e.code || ''} ${e.message}`);
  process.exit(1);
}
console.log('sigstore-js: verified');
"""


def sslib_key(public_path: Path) -> SSlibKey:
    """The public key loaded the way securesystemslib's users load one: its own default keyid, not ours."""
    return SSlibKey.from_crypto(load_pem_public_key(public_path.read_bytes()))


@pytest.mark.parametrize("algorithm", ["ecdsa-p256", "ed25519"])
def test_securesystemslib_verifies_our_envelope(tmp_path, algorithm):
    key, _, public = make_keys(tmp_path / "k", algorithm)
    envelope = write_signed(tmp_path / "r.json", key)
    # from_dict rewrites the dict it is given: hand it copies
    accepted = SslibEnvelope.from_dict(copy.deepcopy(envelope)).verify([sslib_key(public)], 1)
    assert list(accepted) == [key.keyid]
    tampered = SslibEnvelope.from_dict({**copy.deepcopy(envelope), "payloadType": "application/json"})
    with pytest.raises(VerificationError):
        tampered.verify([sslib_key(public)], 1)


def test_we_verify_an_envelope_that_securesystemslib_signed(tmp_path):
    key, _, public = make_keys(tmp_path / "k")
    ours = load_public_key(public)
    signer = CryptoSigner(key.key, sslib_key(public))
    statement = build_statement(sample_report(), command_line=[], subjects=[APP])
    env = SslibEnvelope(payload=statement_bytes(statement), payload_type="application/vnd.in-toto+json", signatures={})
    env.sign(signer)
    verified = verify_envelope(envelope_from_dict(env.to_dict()), ours, Policy(subjects=(APP,)))
    assert verified.verdict == "pass" and verified.keyid == ours.keyid


def write_pair(directory: Path, key) -> tuple[Path, Path]:
    """Our record and its in-toto Test Result, as `check --record --test-result` writes them."""
    record, tested = directory / "record.dsse.json", directory / "record.test-result.dsse.json"
    emit_record(sample_report(), path=record, signer=key, command_line=["kvpreflight", "check"], subjects=[APP],
                test_result=tested, configuration=configuration_files())
    return record, tested


@pytest.mark.parametrize("algorithm", ["ecdsa-p256", "ed25519"])
def test_securesystemslib_verifies_the_record_and_test_result_pair(tmp_path, algorithm):
    key, _, public = make_keys(tmp_path / "k", algorithm)
    record, tested = write_pair(tmp_path, key)
    for path in (record, tested):
        accepted = SslibEnvelope.from_dict(load(path)).verify([sslib_key(public)], 1)
        assert list(accepted) == [key.keyid], path
    statement = json.loads(SslibEnvelope.from_dict(load(tested)).payload)
    assert statement["predicateType"] == TEST_RESULT_PREDICATE_TYPE and statement["predicate"]["result"] == "WARNED"


@pytest.fixture(scope="session")
def sigstore_js(tmp_path_factory) -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        pytest.skip("node is not on PATH: the sigstore-js interop check needs Node 18+")
    root = Path(os.environ.get("KVPREFLIGHT_SIGSTORE_JS_DIR", REPO / ".cache" / "sigstore-js"))
    if not all((root / "node_modules" / p.rsplit("@", 1)[0] / "package.json").exists() for p in SIGSTORE_JS_PACKAGES):
        assert npm is not None, "node is present but npm is not: cannot install @sigstore/verify for the interop check"
        root.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([npm, "install", "--prefix", str(root), "--no-audit", "--no-fund", *SIGSTORE_JS_PACKAGES],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"npm install of sigstore-js failed:\n{done.stderr[-2000:]}"
    script = root / "verify.js"
    script.write_text(VERIFY_JS)
    return script


def run_sigstore_js(script: Path, record: Path, public: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["node", str(script), str(record), str(public)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NODE_PATH": str(script.parent / "node_modules")})


@pytest.mark.parametrize("algorithm", ["ecdsa-p256", "ed25519"])
def test_sigstore_js_verifies_our_record_offline(tmp_path, sigstore_js, algorithm):
    key, _, public = make_keys(tmp_path / "k", algorithm)
    record = tmp_path / "r.json"
    write_signed(record, key)
    ok = run_sigstore_js(sigstore_js, record, public)
    assert ok.returncode == 0 and "sigstore-js: verified" in ok.stdout, ok.stdout + ok.stderr

    env = load(record)
    env["payloadType"] = "application/json"  # sigstore-js must see the PAE change too
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(env))
    refused = run_sigstore_js(sigstore_js, bad, public)
    assert refused.returncode == 1 and "SIGNATURE_ERROR" in refused.stdout, refused.stdout + refused.stderr


def test_sigstore_js_and_kvpreflight_verify_the_record_and_test_result_pair(tmp_path, sigstore_js):
    key, _, public = make_keys(tmp_path / "k")
    record, tested = write_pair(tmp_path, key)
    for path in (record, tested):
        ok = run_sigstore_js(sigstore_js, path, public)
        assert ok.returncode == 0 and "sigstore-js: verified" in ok.stdout, ok.stdout + ok.stderr
    ours = run_console_script("verify", record, tested, "--key", public, "--subject", f"app=sha256:{APP_DIGEST}", "--allow-warned")
    assert ours.returncode == 0 and ours.stderr == f"OK: {record}\nOK: {tested}\n", ours.stderr
