"""TLS and mTLS with certificates generated here: KEDA can check our CA and present its own cert."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from test_evaluator import META, FakeSource

from scaler._proto import externalscaler_pb2 as pb
from scaler._proto import externalscaler_pb2_grpc as pb_grpc
from scaler.evaluator import Evaluator
from scaler.service import RunningScaler, TlsFiles, start_server
from scaler.telemetry import Telemetry

REF = pb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata=META)


@dataclass
class Pki:
    ca: bytes
    server_cert: Path
    server_key: Path
    ca_path: Path
    client_cert: bytes
    client_key: bytes


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
    paths = {n: tmp / f"{name}-{n}.pem" for n in ("ca", "server", "server-key")}
    paths["ca"].write_bytes(_pem(ca))
    paths["server"].write_bytes(_pem(server))
    paths["server-key"].write_bytes(_pem_key(server_key))
    return Pki(_pem(ca), paths["server"], paths["server-key"], paths["ca"], _pem(client), _pem_key(client_key))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def serve(tls: TlsFiles) -> tuple[RunningScaler, Evaluator]:
    source = FakeSource(load={"llama": 8000.0})
    evaluator = Evaluator(prometheus_url="http://prom:9090", source_factory=lambda key: source, telemetry=Telemetry())
    return start_server(evaluator, evaluator.telemetry, tls=tls), evaluator


@pytest.fixture
def tls_server(pki: Pki) -> Iterator[RunningScaler]:
    running, evaluator = serve(TlsFiles(str(pki.server_cert), str(pki.server_key)))
    yield running
    running.stop(0.2)
    evaluator.stop()


@pytest.fixture
def mtls_server(pki: Pki) -> Iterator[RunningScaler]:
    running, evaluator = serve(TlsFiles(str(pki.server_cert), str(pki.server_key), str(pki.ca_path)))
    yield running
    running.stop(0.2)
    evaluator.stop()


def call(port: int, credentials: grpc.ChannelCredentials | None) -> pb.IsActiveResponse:
    target = f"localhost:{port}"
    with (grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)) as channel:
        return pb_grpc.ExternalScalerStub(channel).IsActive(REF, timeout=5)


def test_tls_client_that_trusts_our_ca_is_served(tls_server: RunningScaler, pki: Pki) -> None:
    assert call(tls_server.port, grpc.ssl_channel_credentials(root_certificates=pki.ca)).result is True


def test_tls_refuses_plaintext_and_untrusting_clients(tls_server: RunningScaler, tmp_path: Path) -> None:
    other = make_pki(tmp_path, "other-ca")
    for credentials in (None, grpc.ssl_channel_credentials(root_certificates=other.ca)):
        with pytest.raises(grpc.RpcError) as info:
            call(tls_server.port, credentials)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mtls_serves_a_client_with_a_certificate_from_the_ca(mtls_server: RunningScaler, pki: Pki) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca, private_key=pki.client_key,
                                               certificate_chain=pki.client_cert)
    assert call(mtls_server.port, credentials).result is True


def test_mtls_refuses_a_client_without_a_certificate(mtls_server: RunningScaler, pki: Pki) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call(mtls_server.port, grpc.ssl_channel_credentials(root_certificates=pki.ca))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mtls_refuses_a_certificate_from_another_ca(mtls_server: RunningScaler, pki: Pki, tmp_path: Path) -> None:
    other = make_pki(tmp_path, "other-ca")
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca, private_key=other.client_key,
                                               certificate_chain=other.client_cert)
    with pytest.raises(grpc.RpcError) as info:
        call(mtls_server.port, credentials)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_unreadable_pem_names_the_flag(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(ValueError, match=r"--tls-key='.*missing\.pem': cannot read"):
        TlsFiles(str(pki.server_cert), str(tmp_path / "missing.pem")).credentials()
