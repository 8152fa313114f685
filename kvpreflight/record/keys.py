"""Signing and verification keys: generate, write, load, sign, verify. Nothing else.

Keys are PEM files: the private key PKCS#8 (optionally encrypted), the public key
SubjectPublicKeyInfo. ECDSA P-256 with SHA-256 is the default (what cosign handles best with a
plain key); Ed25519 is the alternative. A key's id is the one securesystemslib computes for the
same public key (`SSlibKey.from_pem` / `from_crypto`: SHA-256 of the canonical JSON of keytype,
scheme and public value), so a DSSE verifier that loads the key the standard way finds the
signature. Records from earlier builds named the key by the SHA-256 of its DER; verify still
accepts that id.

A signing key is named by a path: ``--sign-key PATH``, or the environment variable
``KVPREFLIGHT_SIGN_KEY`` holding a PATH (never the key itself). An encrypted key's password comes
only from ``KVPREFLIGHT_SIGN_KEY_PASSWORD``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from kvpreflight._internal.files import FileKind, check_private, write_new
from kvpreflight.record._io import read_input
from kvpreflight.record.errors import RecordError

SIGN_KEY_ENV = "KVPREFLIGHT_SIGN_KEY"
PASSWORD_ENV = "KVPREFLIGHT_SIGN_KEY_PASSWORD"
ALGORITHMS = ("ecdsa-p256", "ed25519")
PRIVATE_NAME = "kvpreflight.key"
PUBLIC_NAME = "kvpreflight.pub"

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
PublicKeyType = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


def _spki_der(public: PublicKeyType) -> bytes:
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _sslib_keyid(public: PublicKeyType) -> str:
    """securesystemslib's default keyid: sha256 of the OLPC canonical JSON of
    {keytype, keyval: {public}, scheme}; that canonical form escapes only backslash and quote."""
    if isinstance(public, ec.EllipticCurvePublicKey):
        keytype, scheme = "ecdsa", "ecdsa-sha2-nistp256"
        value = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    else:
        keytype, scheme = "ed25519", "ed25519"
        value = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
    value = value.replace("\\", "\\\\").replace('"', '\\"')
    canonical = f'{{"keytype":"{keytype}","keyval":{{"public":"{value}"}},"scheme":"{scheme}"}}'
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _check_supported(key: object, source: str) -> str:
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        if not isinstance(key.curve, ec.SECP256R1):
            raise RecordError(f"{source}: ECDSA curve {key.curve.name} is not supported; use P-256 (`kvpreflight keygen`)")
        return "ecdsa-p256"
    if isinstance(key, (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)):
        return "ed25519"
    raise RecordError(f"{source}: {type(key).__name__} keys are not supported; use ECDSA P-256 or Ed25519 (`kvpreflight keygen`)")


@dataclass(frozen=True)
class PublicKey:
    """A verification key."""

    key: PublicKeyType
    algorithm: str
    keyid: str
    source: str

    @classmethod
    def from_crypto(cls, key: PublicKeyType, source: str = "<memory>") -> PublicKey:
        algorithm = _check_supported(key, source)
        return cls(key=key, algorithm=algorithm, keyid=_sslib_keyid(key), source=source)

    @property
    def keyids(self) -> tuple[str, str]:
        """The ids a signature by this key may carry: securesystemslib's, then the SHA-256 of the
        DER that records written before that change carry."""
        return self.keyid, hashlib.sha256(_spki_der(self.key)).hexdigest()

    def pem(self) -> bytes:
        return self.key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def verify(self, signature: bytes, data: bytes) -> bool:
        try:
            if isinstance(self.key, ec.EllipticCurvePublicKey):
                self.key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
            else:
                self.key.verify(signature, data)
        except (InvalidSignature, ValueError):
            return False
        return True


@dataclass(frozen=True)
class SigningKey:
    """A private key and its public half. Never printed, never serialised into a record."""

    key: PrivateKey
    public: PublicKey

    @classmethod
    def from_crypto(cls, key: PrivateKey, source: str = "<memory>") -> SigningKey:
        _check_supported(key, source)
        return cls(key=key, public=PublicKey.from_crypto(key.public_key(), source))

    @property
    def keyid(self) -> str:
        return self.public.keyid

    def sign(self, data: bytes) -> bytes:
        if isinstance(self.key, ec.EllipticCurvePrivateKey):
            return self.key.sign(data, ec.ECDSA(hashes.SHA256()))  # DER, as cosign and DSSE tools expect
        return self.key.sign(data)

    def __repr__(self) -> str:  # keep the private key out of any log or traceback
        return f"SigningKey(algorithm={self.public.algorithm!r}, keyid={self.keyid!r})"


def generate(algorithm: str = "ecdsa-p256") -> SigningKey:
    """A new signing key: ecdsa-p256 (the default, what sigstore and in-toto tools read) or ed25519."""
    if algorithm == "ecdsa-p256":
        return SigningKey.from_crypto(ec.generate_private_key(ec.SECP256R1()))
    if algorithm == "ed25519":
        return SigningKey.from_crypto(ed25519.Ed25519PrivateKey.generate())
    raise RecordError(f"unknown key algorithm {algorithm!r}; use one of: {', '.join(ALGORITHMS)}")


def write_keypair(directory: Path, key: SigningKey, password: bytes | None = None) -> tuple[Path, Path]:
    """Write DIR/kvpreflight.key (PKCS#8 PEM, mode 0600) and DIR/kvpreflight.pub. Never overwrites."""
    directory = Path(directory)
    private_path, public_path = directory / PRIVATE_NAME, directory / PUBLIC_NAME
    for path in (private_path, public_path):
        if path.exists() or path.is_symlink():
            raise RecordError(f"{path} already exists; refusing to overwrite a key. "
                              "Choose another --out directory or move the old key away")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RecordError(f"cannot create key directory {directory}: {exc.strerror}; choose a writable --out directory") from None
    encryption = (
        serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    )
    private_pem = key.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    _write_new(private_path, private_pem, 0o600)
    try:
        _write_new(public_path, key.public.pem(), 0o644)
    except RecordError:
        private_path.unlink()
        raise
    return private_path, public_path


def keygen(directory: Path, *, algorithm: str = "ecdsa-p256", encrypt: bool = False,
           environ: Mapping[str, str] = os.environ) -> tuple[SigningKey, Path, Path]:
    """`kvpreflight keygen`: a new key pair written to `directory` (never over an existing one). With
    `encrypt` the private key is encrypted with the password in $KVPREFLIGHT_SIGN_KEY_PASSWORD, never
    one from argv. RecordError (exit 2) naming the option for an unknown algorithm or a missing password."""
    if algorithm not in ALGORITHMS:
        raise RecordError(f"--algorithm {algorithm!r} is not supported; use one of: {', '.join(ALGORITHMS)}")
    password = None
    if encrypt:
        password = environ.get(PASSWORD_ENV, "").encode() or None
        if password is None:
            raise RecordError(f"--encrypt needs the password in ${PASSWORD_ENV} (never on the command line)")
    key = generate(algorithm)
    private_path, public_path = write_keypair(directory, key, password=password)
    return key, private_path, public_path


def _write_new(path: Path, data: bytes, mode: int) -> None:
    try:
        write_new(path, data, mode)
    except FileExistsError:
        raise RecordError(f"{path} already exists; refusing to overwrite a key. Choose another --out directory") from None
    except OSError as exc:
        raise RecordError(f"cannot write {path}: {exc.strerror}; choose a writable --out directory") from None


def resolve_sign_key_path(option: str | os.PathLike[str] | None) -> Path | None:
    """The signing key path: ``--sign-key PATH`` if given, else ``$KVPREFLIGHT_SIGN_KEY`` (a path)."""
    if option:
        return Path(option)
    value = os.environ.get(SIGN_KEY_ENV, "").strip()
    if not value:
        return None
    if value.startswith("-----BEGIN"):
        raise RecordError(f"{SIGN_KEY_ENV} holds a key, not a path; put the key in a file (mode 0600) and set {SIGN_KEY_ENV} to its path")
    return Path(value)


def load_signing_key(path: str | os.PathLike[str], *, allow_insecure: bool = False) -> SigningKey:
    """Load a PEM private key (PKCS#8 or traditional). Password only from KVPREFLIGHT_SIGN_KEY_PASSWORD.
    A key its group or others may read is refused, as ssh refuses one, unless `allow_insecure`."""
    path = Path(path)
    data = read_input(path, FileKind.PRIVATE_KEY, "create one with `kvpreflight keygen --out DIR`")
    if b"PRIVATE KEY" not in data:
        raise RecordError(f"signing key {path} is not a PEM private key; "
                          "pass the kvpreflight.key file from `kvpreflight keygen`, not the .pub")
    check_private(path, "signing key", allow_insecure=allow_insecure, error=RecordError)
    password = os.environ.get(PASSWORD_ENV)
    try:
        key = serialization.load_pem_private_key(data, password=password.encode() if password else None)
    except TypeError:
        if password:
            raise RecordError(f"signing key {path} is not encrypted but {PASSWORD_ENV} is set; unset it") from None
        raise RecordError(f"signing key {path} is encrypted; set {PASSWORD_ENV} to its password") from None
    except (ValueError, UnsupportedAlgorithm):
        if password and b"ENCRYPTED" in data:
            raise RecordError(f"signing key {path}: wrong password in {PASSWORD_ENV}") from None
        raise RecordError(f"signing key {path} is not a readable PEM private key; create one with `kvpreflight keygen --out DIR`") from None
    # load_pem_private_key is typed to return any key type; from_crypto refuses all but P-256 and
    # Ed25519 with a one-line RecordError.
    return SigningKey.from_crypto(key, str(path))  # type: ignore[arg-type]


def load_public_key(path: str | os.PathLike[str]) -> PublicKey:
    """The verification key `kvpreflight keygen` wrote (RecordError, exit 2, for a private key or a bad file)."""
    path = Path(path)
    data = read_input(path, FileKind.PUBLIC_KEY, "pass the kvpreflight.pub written by `kvpreflight keygen`")
    if b"PRIVATE KEY" in data:
        raise RecordError(f"{path} is a private key; verify with the public key (kvpreflight.pub) and keep the private key on the signer")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise RecordError(f"public key {path} is not a PEM public key; pass the kvpreflight.pub written by `kvpreflight keygen`") from None
    # As above: from_crypto refuses every key type but P-256 and Ed25519.
    return PublicKey.from_crypto(key, str(path))  # type: ignore[arg-type]
