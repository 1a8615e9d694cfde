"""``leadscale serve`` runs gRPC's socket I/O on the polling thread (scaler.grpc_io): fewer hand-offs a call."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scaler import grpc_io

ROOT = Path(__file__).resolve().parent.parent
CALLS = 300


def _without_experiments() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}


def test_the_experiments_are_set_before_grpc_loads_on_a_measured_release() -> None:
    code = ("import os, sys; from scaler import grpc_io; note = grpc_io.prefer_polling_io(); "
            "assert 'grpc' not in sys.modules; print(note); print(os.environ.get('GRPC_EXPERIMENTS'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_without_experiments(), capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    from importlib import metadata

    if metadata.version("grpcio").startswith(grpc_io.MEASURED_ON):
        assert out == [out[0], grpc_io.EXPERIMENTS] and "socket I/O on the polling thread" in out[0]
    else:  # a release the saving was not measured on keeps gRPC's own threads
        assert out[1] == "None" and "default I/O threads" in out[0]


def test_a_users_own_grpc_experiments_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPC_EXPERIMENTS", "event_engine_client")
    assert grpc_io.prefer_polling_io() == "GRPC_EXPERIMENTS='event_engine_client' as given"
    assert os.environ["GRPC_EXPERIMENTS"] == "event_engine_client"


def test_nothing_is_set_once_grpc_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRPC_EXPERIMENTS", raising=False)
    assert "grpc" in sys.modules  # this module imported it: gRPC core has read its settings already
    assert grpc_io.prefer_polling_io() == "gRPC was loaded already: its default I/O threads"
    assert "GRPC_EXPERIMENTS" not in os.environ


def test_an_unmeasured_grpcio_keeps_its_default_io(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRPC_EXPERIMENTS", raising=False)
    monkeypatch.delitem(sys.modules, "grpc")
    monkeypatch.setattr(grpc_io.metadata, "version", lambda name: "1.99.0")
    assert grpc_io.prefer_polling_io() == ("grpcio 1.99.0: its default I/O threads (the polling thread's I/O was "
                                           "measured on 1.85)")
    assert "GRPC_EXPERIMENTS" not in os.environ


def _switches(pid: int) -> dict[str, int]:
    """Context switches so far, voluntary and not, of the threads of ``pid`` by thread name."""
    total: dict[str, int] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as comm, open(f"/proc/{pid}/task/{task}/status") as status:
                name = comm.read().strip()
                total[name] = total.get(name, 0) + sum(int(line.split()[1]) for line in status
                                                       if "ctxt_switches" in line)
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return total


def _switches_per_call(env: dict[str, str]) -> tuple[str, dict[str, float]]:
    """``leadscale serve`` under ``env``: its gRPC I/O log line, and context switches per health Check."""
    env = {**env, "LEADSCALE_PORT": "0", "LEADSCALE_METRICS_PORT": "0", "LEADSCALE_HOST": "127.0.0.1",
           "LEADSCALE_PROMETHEUS_URL": "http://127.0.0.1:9"}
    proc = subprocess.Popen([sys.executable, "-m", "leadscale", "serve"], cwd=ROOT, env=env, stderr=subprocess.PIPE,
                            text=True)
    try:
        port, note, deadline = None, None, time.monotonic() + 30
        while (port is None or note is None) and time.monotonic() < deadline:
            line = proc.stderr.readline() if proc.stderr else ""
            assert line or proc.poll() is None, "serve exited early"
            if match := re.search(r"serving ExternalScaler on 127\.0\.0\.1:(\d+)", line):
                port = int(match.group(1))
            if match := re.search(r"gRPC I/O: (.*)$", line):
                note = match.group(1)
        assert port and note
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub, request = health_pb2_grpc.HealthStub(channel), health_pb2.HealthCheckRequest()
            for _ in range(20):  # the connection and the first worker threads
                stub.Check(request, timeout=5)
            before = _switches(proc.pid)
            for _ in range(CALLS):
                assert stub.Check(request, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
            after = _switches(proc.pid)
            return note, {name: (n - before.get(name, 0)) / CALLS for name, n in after.items()}
    finally:
        proc.kill()
        proc.wait()


def test_serve_hands_a_call_between_fewer_threads() -> None:
    """The same calls, one at a time: by default gRPC's EventEngine threads switch about 4 times a call (they do
    the socket I/O and hand each event on); with the I/O on the polling thread they stay asleep, and the
    process as a whole switches about 6 times a call instead of 10."""
    from importlib import metadata

    polling_note, polling = _switches_per_call(_without_experiments())
    default_note, default = _switches_per_call({**_without_experiments(), "GRPC_EXPERIMENTS": ""})
    assert default_note == "GRPC_EXPERIMENTS='' as given"
    assert default.get("event_engine", 0.0) > 2.0, f"gRPC's own I/O threads by default: {default}"
    if not metadata.version("grpcio").startswith(grpc_io.MEASURED_ON):
        assert "default I/O threads" in polling_note
        return
    assert "socket I/O on the polling thread" in polling_note
    assert polling.get("event_engine", 0.0) < 0.5, f"EventEngine threads still woken: {polling}"
    assert sum(polling.values()) < sum(default.values()), f"{polling} against {default}"
