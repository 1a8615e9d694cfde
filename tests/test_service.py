"""The gRPC service over loopback: every KEDA RPC, health, reflection, errors, metrics, ``serve``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from support.metadata import with_changes as changed
from test_evaluator import META, FakeSource
from test_metadata import BAD_CASES, with_changes

from scaler._proto import externalscaler_pb2 as pb
from scaler._proto import externalscaler_pb2_grpc as pb_grpc
from scaler.evaluator import Evaluator
from scaler.service import SERVICE_NAME, RunningScaler, start_server
from scaler.telemetry import Telemetry, serve_http

ROOT = Path(__file__).resolve().parent.parent


class Harness:
    """An in-process scaler on 127.0.0.1:0 over a fake source, with a client stub."""

    def __init__(self, source: FakeSource, **kwargs: object) -> None:
        self.source, self.telemetry = source, Telemetry()
        self.evaluator = Evaluator(prometheus_url="http://prom:9090", source_factory=lambda key: source,
                                   telemetry=self.telemetry, **kwargs)  # type: ignore[arg-type]
        self.running: RunningScaler = start_server(self.evaluator, self.telemetry)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.running.port}")
        self.stub = pb_grpc.ExternalScalerStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.running.stop(0.5)
        self.evaluator.stop()


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness(FakeSource(load={"llama": 16000.0, "idle": 0.0}), interval_s=0.05)
    yield h
    h.close()


def ref(name: str = "chat", **changes: str | None) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=name, namespace="llm", scalerMetadata=with_changes_meta(changes))


def with_changes_meta(changes: dict[str, str | None]) -> dict[str, str]:
    return changed(META, changes)


def test_get_metric_spec_is_constant_target_one(harness: Harness) -> None:
    spec = harness.stub.GetMetricSpec(ref(), timeout=3).metricSpecs
    assert len(spec) == 1
    assert (spec[0].metricName, spec[0].targetSize, spec[0].targetSizeFloat) == ("leadscale-llama", 1, 1.0)
    assert harness.source.calls == [], "the spec needs no signal"


def test_get_metrics_sends_desired_replicas_in_both_fields(harness: Harness) -> None:
    request = pb.GetMetricsRequest(scaledObjectRef=ref(), metricName="s0-leadscale-llama")
    value = harness.stub.GetMetrics(request, timeout=3).metricValues[0]
    expected = harness.evaluator.lookup("llm", "chat", META).desired_replicas
    assert expected >= 3
    assert (value.metricName, value.metricValue, value.metricValueFloat) == ("s0-leadscale-llama", expected,
                                                                             float(expected))


def test_an_idle_model_measured_as_idle_gets_zero_in_both_fields(harness: Harness) -> None:
    value = harness.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref("quiet", model="idle")),
                                    timeout=3).metricValues[0]
    assert (value.metricName, value.metricValue, value.metricValueFloat) == ("leadscale-idle", 0, 0.0)


def test_is_active_follows_demand(harness: Harness) -> None:
    assert harness.stub.IsActive(ref(), timeout=3).result is True
    assert harness.stub.IsActive(ref("quiet", model="idle"), timeout=3).result is False


def test_stream_is_active_pushes_true_when_demand_appears(harness: Harness) -> None:
    harness.evaluator.start()
    stream = harness.stub.StreamIsActive(ref("push", model="idle"), timeout=60)  # a loaded box is slow
    assert next(stream).result is False
    started = time.monotonic()
    harness.source.load["idle"] = 4000.0
    assert next(stream).result is True
    assert time.monotonic() - started < 5.0, "the push must follow the next evaluation, not a poll period"
    harness.source.load["idle"] = 0.0  # scaleDownDelay 0: inactive again at once
    assert next(stream).result is False
    stream.cancel()


def test_rpcs_answer_from_the_cache_while_the_source_hangs(harness: Harness) -> None:
    request = pb.GetMetricsRequest(scaledObjectRef=ref())
    expected = harness.stub.GetMetrics(request, timeout=3).metricValues[0].metricValue
    gate = threading.Event()
    harness.source.block = gate  # every later fetch hangs until released
    harness.evaluator.start()
    try:
        time.sleep(0.2)  # the loop is now stuck inside a fetch
        for _ in range(20):
            started = time.monotonic()
            assert harness.stub.GetMetrics(request, timeout=3).metricValues[0].metricValue == expected
            assert time.monotonic() - started < 5.0, "the RPC waited for the hanging fetch (10 s)"
    finally:
        gate.set()


def test_stream_sends_nothing_while_there_is_no_data() -> None:
    h = Harness(FakeSource(error="Prometheus down"), interval_s=0.05)
    try:
        h.evaluator.start()
        stream = h.stub.StreamIsActive(ref(), timeout=1.0)
        with pytest.raises(grpc.RpcError) as info:
            next(stream)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # silent, not a guessed false
    finally:
        h.close()


@pytest.mark.parametrize("rpc", ["GetMetrics", "IsActive", "GetMetricSpec", "StreamIsActive"])
@pytest.mark.parametrize(("changes", "key", "value"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_metadata_is_invalid_argument(harness: Harness, rpc: str, changes: dict[str, str | None], key: str,
                                          value: str | None) -> None:
    bad = pb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata=with_changes(changes))
    with pytest.raises(grpc.RpcError) as info:
        if rpc == "GetMetrics":
            harness.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=bad), timeout=3)
        elif rpc == "StreamIsActive":
            next(harness.stub.StreamIsActive(bad, timeout=3))
        else:
            getattr(harness.stub, rpc)(bad, timeout=3)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{key}:" in info.value.details() and (value is None or repr(value) in info.value.details())


def test_missing_object_name_is_invalid_argument(harness: Harness) -> None:
    with pytest.raises(grpc.RpcError) as info:
        harness.stub.IsActive(pb.ScaledObjectRef(namespace="llm", scalerMetadata=META), timeout=3)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "scaledObjectRef.name" in info.value.details()


@pytest.mark.parametrize(("source", "kwargs", "match"), [
    (FakeSource(error="Prometheus http://prom:9090 unreachable"), {}, "unreachable"),
    (FakeSource(load={"llama": 8000.0}, age_s=120.0), {"staleness_limit_s": 60.0}, "120 s old"),
], ids=["source-failure", "stale-data"])
def test_no_fresh_data_is_unavailable(source: FakeSource, kwargs: dict[str, float], match: str) -> None:
    h = Harness(source, **kwargs)
    try:
        for call in (lambda: h.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref()), timeout=3),
                     lambda: h.stub.IsActive(ref(), timeout=3)):
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE and match in info.value.details()
        assert h.telemetry.registry.get_sample_value(
            "leadscale_rpc_errors_total", {"method": "GetMetrics", "code": "UNAVAILABLE"}) == 1.0
    finally:
        h.close()


def test_health_and_reflection(harness: Harness) -> None:
    health = health_pb2_grpc.HealthStub(harness.channel)
    for service in ("", SERVICE_NAME):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    services = ProtoReflectionDescriptorDatabase(harness.channel).get_services()
    assert {"externalscaler.ExternalScaler", "grpc.health.v1.Health"} <= set(services)
    harness.running.stop(0.1)
    with pytest.raises(grpc.RpcError):
        health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)


def test_metrics_and_decisions_endpoints(harness: Harness) -> None:
    harness.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref()), timeout=3)
    http = serve_http(harness.telemetry, harness.evaluator.snapshot, "127.0.0.1", 0)
    try:
        base = f"http://127.0.0.1:{http.server_address[1]}"
        metrics = urllib.request.urlopen(base + "/metrics", timeout=3).read().decode()
        decisions = json.loads(urllib.request.urlopen(base + "/decisions", timeout=3).read())
    finally:
        http.shutdown()
    assert 'leadscale_rpc_duration_seconds_count{method="GetMetrics"} 1.0' in metrics
    assert re.search(r'leadscale_desired_replicas\{metric="leadscale-llama",name="chat",namespace="llm"\} [1-9]',
                     metrics)
    term = 'leadscale_decision_term{metric="leadscale-llama",name="chat",namespace="llm",term="demand_replicas"}'
    assert term in metrics
    assert decisions[0]["name"] == "chat" and decisions[0]["terms"]["desired_replicas"] >= 3


def test_serve_command_starts_answers_health_and_stops_on_sigterm() -> None:
    env = {**os.environ, "LEADSCALE_PORT": "0", "LEADSCALE_METRICS_PORT": "0", "LEADSCALE_HOST": "127.0.0.1",
           "LEADSCALE_PROMETHEUS_URL": "http://127.0.0.1:9", "LEADSCALE_LOG_FORMAT": "json"}
    proc = subprocess.Popen([sys.executable, "-m", "leadscale", "serve", "--interval", "1"], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        port = None
        deadline = time.monotonic() + 20
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline() if proc.stderr else ""
            match = re.search(r"serving ExternalScaler on 127\.0\.0\.1:(\d+) \(plaintext\)", line)
            port = int(match.group(1)) if match else None
            if match:
                assert json.loads(line)["logger"] == "leadscale.service", "serve logs one JSON object per line"
            assert line or proc.poll() is None, "serve exited early"
        assert port
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3).status
            assert status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as info:  # nothing listens on port 9: UNAVAILABLE, not 0
                pb_grpc.ExternalScalerStub(channel).GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref()), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_rejects_half_tls_configuration() -> None:
    result = subprocess.run([sys.executable, "-m", "leadscale", "serve", "--tls-cert", "a.pem"], cwd=ROOT,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "--tls-key" in result.stderr


def test_serve_kubernetes_without_a_cluster_fails_with_a_message(tmp_path: Path) -> None:
    env = {**os.environ, "LEADSCALE_KUBERNETES": "true", "KUBECONFIG": str(tmp_path / "none"),
           "KUBERNETES_SERVICE_HOST": "", "LEADSCALE_PORT": "0", "LEADSCALE_METRICS_PORT": "0",
           "LEADSCALE_HOST": "127.0.0.1"}
    result = subprocess.run([sys.executable, "-m", "leadscale", "serve"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and "--kubernetes: cannot reach the Kubernetes API" in result.stderr


def test_serve_rejects_a_bad_environment_value() -> None:
    env = {**os.environ, "LEADSCALE_INTERVAL": "soon"}
    result = subprocess.run([sys.executable, "-m", "leadscale", "serve"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode != 0 and "LEADSCALE_INTERVAL='soon'" in result.stderr


def test_every_serve_flag_and_its_environment_twin_is_documented() -> None:
    from scaler.serve_cli import FLAGS, _env_name

    docs = (ROOT / "docs" / "scaler.md").read_text()
    missing = [name for flag, *_ in FLAGS for name in (flag, _env_name(flag)) if f"`{name}`" not in docs]
    assert not missing, f"docs/scaler.md does not document {missing}"


@pytest.mark.slow
def test_benchmark_script_runs_and_reports() -> None:
    result = subprocess.run([sys.executable, "benchmarks/bench_getmetrics.py", "--duration", "1", "--block", "0.5",
                             "--step", "0.5", "--max-rate", "500"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r"GetMetrics\s+500\s+\d+\s", result.stdout), result.stdout  # 2 blocks × 0.5 s × 500/s
    assert "highest sustained: GetMetrics" in result.stdout and "handler CPU per call" in result.stdout


@pytest.mark.slow
def test_soak_benchmark_short_run_has_no_errors_and_drops_idle_objects(tmp_path: Path) -> None:
    """The 10-minute soak's short version: KEDA's three calls per object, bursts and renames, side by side."""
    out = tmp_path / "soak.json"
    result = subprocess.run([sys.executable, "benchmarks/bench_getmetrics.py", "--soak", "12", "--objects", "100",
                             "--period", "2", "--burst-every", "4", "--burst-clients", "20", "--churn-every", "3",
                             "--churn", "0.2", "--idle-timeout", "2", "--json", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["errors"] == 0 and figures["peer_errors"] == 0, result.stdout
    assert {"GetMetricSpec", "GetMetrics", "IsActive", "burst", "first GetMetrics"} <= set(figures["latency"])
    assert figures["latency"]["GetMetrics"]["scaler"]["calls"] >= 100 * 12 / 2 * 0.8
    # 20 of 100 renamed every 3 s and dropped 2 s after their last poll: never all the generations at once
    assert max(figures["objects_seen"]) <= 100 + 2 * 20, figures["objects_seen"]
    assert figures["objects_seen"][-1] <= 100 + 20
    assert "server CPU: scaler" in result.stdout and "targets:" in result.stdout


def test_serve_rejects_deletion_cost_without_kubernetes() -> None:
    result = subprocess.run([sys.executable, "-m", "leadscale", "serve", "--deletion-cost", "true"], cwd=ROOT,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "--deletion-cost needs --kubernetes" in result.stderr


def test_json_log_lines_carry_the_decision_fields(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from scaler.telemetry import JsonLines

    with caplog.at_level(logging.INFO, logger="leadscale.decisions"):
        Telemetry.log_decision("llm", "chat", 3, True, {"demand_replicas": 2.2, "bad": float("nan")}, 1.5, "up")
    line = json.loads(JsonLines().format(caplog.records[-1]))
    assert (line["logger"], line["desired_replicas"], line["terms"]) == ("leadscale.decisions", 3,
                                                                         {"demand_replicas": 2.2})
    assert set(line) >= {"time", "level", "event", "namespace", "name", "active", "reason", "data_age_s"}


def test_serve_shortens_the_interpreter_s_switch_interval_as_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """An RPC thread waiting for the interpreter while the evaluator computes waits at most the switch interval."""
    import argparse
    import socket

    from scaler import serve_cli, service

    applied: list[float] = []
    monkeypatch.setattr(service.sys, "setswitchinterval", applied.append)
    monkeypatch.setattr(service.logging, "basicConfig", lambda **_: None)  # leave pytest's log capture alone
    with socket.socket() as taken:  # the gRPC port is taken: serve stops right after applying it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for given, want in ((None, 0.0005), ("2", 0.002)):
            argv = ["--host", "127.0.0.1", "--port", str(port), "--prometheus-url", "http://127.0.0.1:9"]
            parser = argparse.ArgumentParser()
            serve_cli.register(parser.add_subparsers())
            args = parser.parse_args(["serve", *argv, *(["--gil-switch-ms", given] if given else [])])
            assert service.serve_forever(serve_cli.resolve(args)) == 1
            assert applied[-1] == pytest.approx(want)
    assert "'0'" in subprocess.run([sys.executable, "-m", "leadscale", "serve", "--gil-switch-ms", "0"], cwd=ROOT,
                                   capture_output=True, text=True, timeout=30).stderr
