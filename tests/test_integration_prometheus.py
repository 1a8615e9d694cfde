"""The whole loop against a real Prometheus: exporter → Prometheus → PrometheusSource → policy → gRPC.

A vLLM-format exporter stands in for one pod; Prometheus scrapes it every second; the scaler runs
in-process on 127.0.0.1:0 pointed at that Prometheus. A burst must raise ``GetMetrics`` above one
replica and make ``IsActive`` true (``StreamIsActive`` pushes it); once the burst ends the value must
hold for ``scaleDownDelay`` and then come back down, and ``IsActive`` turn false. Killing Prometheus
must give ``UNAVAILABLE`` once the last good decision is older than the staleness limit (never a
made-up number).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from support.prometheus import PrometheusServer
from support.vllm_exporter import VllmExporter

from scaler._proto import externalscaler_pb2 as pb
from scaler._proto import externalscaler_pb2_grpc as pb_grpc
from scaler.evaluator import Evaluator
from scaler.service import start_server
from scaler.signals import Signals
from scaler.sources import Target
from scaler.sources.prometheus import PrometheusSource
from scaler.telemetry import Telemetry

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.timeout(300)]
# Waits are on conditions with deadlines generous enough for a loaded 2-core box (scrapes and evaluation
# rounds land late there, never wrong); a quiet box passes in seconds.
SLOW_BOX_S = 60.0

WINDOW_S, DELAY_S = 3.0, 6.0
META = {"model": "tiny", "prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000", "maxNumSeqs": "64",
        "kvCacheTokens": "100000", "rateWindow": f"{WINDOW_S:g}", "scaleDownDelay": f"{DELAY_S:g}", "leadTime": "5"}


def wait_for(what: str, probe: Callable[[], Any], ok: Callable[[Any], bool], timeout_s: float) -> Any:
    """Poll ``probe`` until ``ok``; fail naming ``what`` and the last value."""
    deadline, value = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        value = probe()
        if ok(value):
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what}: still {value!r} after {timeout_s} s")


@pytest.fixture
def stack() -> Iterator[dict[str, Any]]:
    """One idle pod scraped each second by a real Prometheus, a whole rate window of data in."""
    with VllmExporter(model="tiny") as pod, PrometheusServer([pod.address], scrape_interval_s=1.0) as prom:
        prom.wait_until_up(1)
        prom.wait_until('count(rate(vllm:prompt_tokens_total{model_name="tiny"}[3s]))', bool, timeout_s=SLOW_BOX_S)
        prom.wait_until_observed(WINDOW_S, timeout_s=SLOW_BOX_S)
        yield {"pod": pod, "prom": prom}


def test_signals_follow_the_exporter_through_prometheus(stack: dict[str, Any]) -> None:
    pod, source, target = stack["pod"], PrometheusSource(stack["prom"].url), Target("tiny", rate_window_s=WINDOW_S)
    idle = source.fetch([target], now=time.time())[target]
    assert isinstance(idle, Signals) and idle.prompt_tokens_per_s == 0 and idle.ready_replicas == 1
    pod.set_load(prompt_tokens_per_s=6000, generation_tokens_per_s=900, prompt_len=600, output_len=90)
    pod.set_queue(waiting=5, running=12, kv_usage=0.4)
    busy = wait_for("the prompt rate", lambda: source.fetch([target], now=time.time())[target],
                    lambda s: isinstance(s, Signals) and abs(s.prompt_tokens_per_s - 6000) < 1200
                    and abs(s.generation_tokens_per_s - 900) < 225, timeout_s=SLOW_BOX_S)
    assert (busy.requests_waiting, busy.requests_running, busy.kv_cache_usage) == (5, 12, 0.4)
    assert busy.mean_prompt_tokens == pytest.approx(600) and busy.mean_output_tokens == pytest.approx(90)


class Scaler:
    """The scaler in-process on 127.0.0.1:0, pointed at a real Prometheus, with KEDA's calls for one object."""

    def __init__(self, prometheus_url: str, metadata: dict[str, str]) -> None:
        self.telemetry = Telemetry()
        self.evaluator = Evaluator(prometheus_url=prometheus_url, interval_s=0.5, staleness_limit_s=4.0,
                                   telemetry=self.telemetry)
        self.evaluator.start()
        self.running = start_server(self.evaluator, self.telemetry)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.running.port}")
        self.stub = pb_grpc.ExternalScalerStub(self.channel)
        self.ref = pb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata=metadata)
        self.metric_name = self.stub.GetMetricSpec(self.ref, timeout=3).metricSpecs[0].metricName
        self.pushed: list[bool] = []
        self._stream = self.stub.StreamIsActive(self.ref)
        self._listener = threading.Thread(target=self._listen, daemon=True)
        self._listener.start()

    def _listen(self) -> None:
        with contextlib.suppress(grpc.RpcError):  # cancelled by close()
            for response in self._stream:
                self.pushed.append(response.result)

    def desired(self) -> int:
        request = pb.GetMetricsRequest(scaledObjectRef=self.ref, metricName=self.metric_name)
        value = self.stub.GetMetrics(request, timeout=3).metricValues[0]
        assert value.metricValue == int(value.metricValueFloat)
        return int(value.metricValue)

    def active(self) -> bool:
        return bool(self.stub.IsActive(self.ref, timeout=3).result)

    def close(self) -> None:
        self._stream.cancel()
        self._listener.join(timeout=5)
        self.channel.close()
        self.running.stop(0.5)
        self.evaluator.stop()


def test_get_metrics_follows_a_burst_up_and_after_the_delay_down(stack: dict[str, Any]) -> None:
    pod, prom = stack["pod"], stack["prom"]
    scaler = Scaler(prom.url, META)
    try:
        assert scaler.desired() <= 1 and not scaler.active()

        # burst: 5 replicas' worth of prefill with a queue
        pod.set_load(prompt_tokens_per_s=40_000, generation_tokens_per_s=4_000, prompt_len=1000, output_len=100)
        pod.set_queue(waiting=30, running=64, kv_usage=0.95)
        peak = wait_for("GetMetrics during the burst", scaler.desired, lambda v: v > 1, timeout_s=SLOW_BOX_S)
        assert scaler.active()
        peak = max(peak, wait_for("GetMetrics settling", scaler.desired, lambda v: v >= 5, timeout_s=SLOW_BOX_S))

        # the burst ends: the value holds for the scale-down delay, then falls
        pod.set_load(0, 0)
        pod.set_queue(waiting=0, running=0, kv_usage=0.0)
        ended = time.monotonic()
        inactive = wait_for("IsActive after the burst", scaler.active, lambda a: not a, timeout_s=SLOW_BOX_S)
        assert inactive is False
        low = wait_for("GetMetrics after the delay", scaler.desired, lambda v: v <= 1,
                       timeout_s=DELAY_S + SLOW_BOX_S)
        held = time.monotonic() - ended
        assert held >= DELAY_S - 0.5, f"came down after {held:.1f} s, before the {DELAY_S} s delay"
        assert low <= 1 < peak
        assert scaler.pushed == [False, True, False], "StreamIsActive pushes each change of activity, once"

        # Prometheus gone: the last decision serves until the staleness limit, then UNAVAILABLE
        prom.stop()
        with pytest.raises(grpc.RpcError) as failure:
            wait_for("GetMetrics without Prometheus", scaler.desired, lambda v: False, timeout_s=SLOW_BOX_S)
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "Prometheus" in (failure.value.details() or "")
    finally:
        scaler.close()


def test_activation_query_scales_from_zero() -> None:
    """No vLLM pod is serving yet (its /metrics answers 503); a gateway's queue is the only demand."""
    with VllmExporter(model="tiny") as pod, VllmExporter(vllm=False) as gateway:
        pod.set_serving(False)
        gateway.set_gauge("gateway_pending_requests", 0, model="tiny")
        with PrometheusServer([pod.address, gateway.address], scrape_interval_s=1.0) as prom:
            prom.wait_until_up(1)  # the gateway; the pod is down
            prom.wait_until_observed(WINDOW_S, timeout_s=SLOW_BOX_S)
            metadata = {**META, "activationQuery": 'sum(gateway_pending_requests{model="tiny"})',
                        "activationThreshold": "0", "minReplicas": "0"}
            scaler = Scaler(prom.url, metadata)
            try:
                assert (scaler.desired(), scaler.active()) == (0, False)
                gateway.set_gauge("gateway_pending_requests", 5, model="tiny")
                wait_for("StreamIsActive push", lambda: scaler.pushed, lambda p: p == [False, True],
                         timeout_s=SLOW_BOX_S)
                assert scaler.active() and scaler.desired() >= 1
            finally:
                scaler.close()
