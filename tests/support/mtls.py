"""A private CA, server and client certificates, and an HTTPS server on 127.0.0.1 that requires a
client certificate from that CA: a gateway that requires mutual TLS, for the tests of
`--client-cert/--client-key` and a boot spec's `client_cert/client_key`."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import ssl
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from support.threaded_server import serving


def _key_pem(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None,
                 issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool = False, server: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer.subject if issuer else x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                      content_commitment=False, key_encipherment=False,
                                                      data_encipherment=False, key_agreement=False,
                                                      encipher_only=False, decipher_only=False), critical=True)
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        assert issuer is not None
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.public_key()), critical=False)  # type: ignore[arg-type]
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                        critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write_pki(out: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files in `out`:
    ca, server_cert, server_key, client_cert, client_key, client_both (certificate and key in one
    file), stranger_key (belongs to no certificate), encrypted_key (the client key, encrypted)."""
    ca_key, server_key, client_key, stranger_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(4))
    ca = _certificate("kvpreflight test CA", ca_key, None, ca_key, ca=True)
    server = _certificate("127.0.0.1", server_key, ca, ca_key, server=True)
    client = _certificate("kvpreflight client", client_key, ca, ca_key)
    files = {
        "ca": ca.public_bytes(serialization.Encoding.PEM),
        "server_cert": server.public_bytes(serialization.Encoding.PEM),
        "server_key": _key_pem(server_key),
        "client_cert": client.public_bytes(serialization.Encoding.PEM),
        "client_key": _key_pem(client_key),
        "client_both": client.public_bytes(serialization.Encoding.PEM) + _key_pem(client_key),
        "stranger_key": _key_pem(stranger_key),
        "encrypted_key": _key_pem(client_key, b"a passphrase"),
    }
    paths = {}
    for name, data in files.items():
        paths[name] = out / f"{name}.pem"
        paths[name].write_bytes(data)
        if b"PRIVATE KEY" in data:
            paths[name].chmod(0o600)  # as a private key is kept (a key others can read is refused)
    return paths


@contextlib.contextmanager
def mtls_server(pki: dict[str, Path]) -> Iterator[str]:
    """The https:// URL of a server on 127.0.0.1 that requires a client certificate issued by the
    test CA, and answers every GET with the JSON {"client": <the certificate's common name>}."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"client": self.connection.getpeercert()["subject"][0][0][1]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a client refused for want of a certificate is the point, not noise

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki["server_cert"], pki["server_key"])
    context.load_verify_locations(pki["ca"])
    context.verify_mode = ssl.CERT_REQUIRED
    server = Server(("127.0.0.1", 0), Handler)
    # The handshake runs in the handler's thread (on its first read), not in the accept loop.
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    with serving(server, scheme="https") as url:
        yield url
