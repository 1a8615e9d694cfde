"""The real ``leadscale serve`` in its own process, and KEDA's calls to it.

    with ScalerProcess(["--prometheus-url", prom.url, "--interval", "0.5"], tmp_path) as scaler:
        keda = scaler.keda(metadata)             # GetMetricSpec once, like KEDA on reconcile
        keda.get_metrics()                       # ("ok", 3.0) | ("UNAVAILABLE", "details")
        scaler.decisions(), scaler.metrics()     # /decisions (JSON) and /metrics (text)
        scaler.kill(); scaler.start()            # SIGKILL and a fresh process on the same ports

Ports are picked once and kept across restarts, so a client keeps dialling the same address, as
KEDA does; they are given after ``args`` (so they win), the loopback ``--host`` before (so ``args`` may
set another). The log (stderr) goes to ``<dir>/serve-<n>.log``; ``log()`` returns all of it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
from conftest import ROOT

from scaler._proto import externalscaler_pb2 as pb
from scaler._proto import externalscaler_pb2_grpc as pb_grpc
from support.prometheus import free_port


class ScalerProcess:
    """Start, call and stop one ``leadscale serve`` process on 127.0.0.1."""

    def __init__(self, args: Sequence[str], log_dir: Path, ready_timeout_s: float = 60.0) -> None:
        self.args, self.log_dir, self.ready_timeout_s = list(args), Path(log_dir), ready_timeout_s
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.port, self.metrics_port = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []
        self.channel: grpc.Channel | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def start(self) -> ScalerProcess:
        log = self.log_dir / f"serve-{len(self.logs)}.log"
        self.logs.append(log)
        # our ports last (they win over any in ``args``, e.g. a chart's), our host first (``args`` may move it)
        command = [sys.executable, "-m", "leadscale", "serve", "--host", "127.0.0.1", *self.args,
                   "--port", str(self.port), "--metrics-port", str(self.metrics_port)]
        with log.open("wb") as err:
            self.proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.ready_timeout_s
        while "serving ExternalScaler" not in log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                self.stop()
                raise AssertionError(f"leadscale serve did not start (exit {self.proc.returncode}):\n{tail}")
            time.sleep(0.05)
        if self.channel is None:
            self.channel = grpc.insecure_channel(self.address)
        return self

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, as when a node or the container dies."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def __enter__(self) -> ScalerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def decisions(self) -> list[dict[str, Any]]:
        return list(httpx.get(self.metrics_url + "/decisions", timeout=3).json())

    def metrics(self) -> str:
        return httpx.get(self.metrics_url + "/metrics", timeout=3).text

    def keda(self, metadata: dict[str, str], name: str = "chat", namespace: str = "llm") -> Keda:
        assert self.channel is not None, "start() the scaler first"
        return Keda(self.channel, pb.ScaledObjectRef(name=name, namespace=namespace, scalerMetadata=metadata))


class Keda:
    """KEDA's calls for one ScaledObject, each with KEDA's 3 s deadline; answers as (code, value or details)."""

    DEADLINE_S = 3.0

    def __init__(self, channel: grpc.Channel, ref: pb.ScaledObjectRef) -> None:
        self.stub, self.ref = pb_grpc.ExternalScalerStub(channel), ref
        self.metric_name = ""

    def _call(self, method: Any, request: Any) -> tuple[str, Any, float]:
        started = time.monotonic()
        try:
            reply = method(request, timeout=self.DEADLINE_S)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details() or "", time.monotonic() - started
        return "ok", reply, time.monotonic() - started

    def spec(self) -> tuple[str, Any]:
        code, reply, _ = self._call(self.stub.GetMetricSpec, self.ref)
        if code == "ok":
            self.metric_name = reply.metricSpecs[0].metricName
            return code, self.metric_name
        return code, reply

    def get_metrics(self) -> tuple[str, Any, float]:
        """("ok", desired replicas, seconds) or (status code name, details, seconds)."""
        request = pb.GetMetricsRequest(scaledObjectRef=self.ref, metricName=self.metric_name)
        code, reply, took = self._call(self.stub.GetMetrics, request)
        if code != "ok":
            return code, reply, took
        (value,) = reply.metricValues
        assert value.metricValue == int(value.metricValueFloat), value  # KEDA reads either field
        return code, value.metricValueFloat, took

    def is_active(self) -> tuple[str, Any, float]:
        code, reply, took = self._call(self.stub.IsActive, self.ref)
        return (code, reply.result, took) if code == "ok" else (code, reply, took)


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a log (decision lines are ``... {json}`` in the text format)."""
    out = []
    for line in text.splitlines():
        if "{" in line:
            try:
                out.append(json.loads(line[line.index("{"):]))
            except ValueError:
                continue
    return out
