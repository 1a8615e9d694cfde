"""Test certificates made here with ``cryptography``: a CA, a server certificate for 127.0.0.1/localhost, a client one.

    pki = make_pki(tmp_path)           # PEM files under tmp_path, the client's key pair in memory
    pki.ca_path, pki.server_cert, pki.server_key, pki.client_cert, pki.client_key

Used by the gRPC TLS tests (KEDA's side of mTLS) and by the Prometheus-over-TLS tests (our side).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Pki:
    ca: bytes
    server_cert: Path
    server_key: Path
    ca_path: Path
    client_cert: bytes
    client_key: bytes
    client_cert_path: Path
    client_key_path: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None,
          issuer_key: ec.EllipticCurvePrivateKey, ca: bool = False, server: bool = False) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer.subject if issuer else name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_pki(tmp: Path, name: str = "test-ca") -> Pki:
    ca_key = _key()
    ca = _cert(name, ca_key, None, ca_key, ca=True)
    server_key, client_key = _key(), _key()
    server = _cert("leadscale", server_key, ca, ca_key, server=True)
    client = _cert("keda-operator", client_key, ca, ca_key)
    paths = {n: tmp / f"{name}-{n}.pem" for n in ("ca", "server", "server-key", "client", "client-key")}
    for path, data in ((paths["ca"], _pem(ca)), (paths["server"], _pem(server)),
                       (paths["server-key"], _pem_key(server_key)), (paths["client"], _pem(client)),
                       (paths["client-key"], _pem_key(client_key))):
        path.write_bytes(data)
    return Pki(_pem(ca), paths["server"], paths["server-key"], paths["ca"], _pem(client), _pem_key(client_key),
               paths["client"], paths["client-key"])
