"""TLS and mTLS with certificates generated here: KEDA can check our CA and present its own cert."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.pki import Pki, make_pki
from test_evaluator import META, FakeSource

from scaler._proto import externalscaler_pb2 as pb
from scaler._proto import externalscaler_pb2_grpc as pb_grpc
from scaler.evaluator import Evaluator
from scaler.service import RunningScaler, TlsFiles, start_server
from scaler.telemetry import Telemetry

REF = pb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata=META)


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


def test_the_serve_process_requires_keda_client_certificate(pki: Pki, tmp_path: Path) -> None:
    """``leadscale serve --tls-cert --tls-key --tls-client-ca``, as the chart runs it with ``tls.mtls.enabled``."""
    from support.scaler_process import ScalerProcess

    args = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-client-ca", str(pki.ca_path),
            "--prometheus-url", "http://127.0.0.1:9"]
    with ScalerProcess(args, tmp_path) as scaler:
        assert "(mTLS)" in scaler.log()
        keda = grpc.ssl_channel_credentials(root_certificates=pki.ca, private_key=pki.client_key,
                                            certificate_chain=pki.client_cert)
        with grpc.secure_channel(f"localhost:{scaler.port}", keda) as channel:
            spec = pb_grpc.ExternalScalerStub(channel).GetMetricSpec(REF, timeout=5)  # needs no Prometheus
        assert spec.metricSpecs[0].metricName == "leadscale-llama"
        for credentials in (grpc.ssl_channel_credentials(root_certificates=pki.ca), None):
            with pytest.raises(grpc.RpcError) as info:
                call(scaler.port, credentials)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
