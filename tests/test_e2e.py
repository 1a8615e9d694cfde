"""End to end: real vLLM (CPU) → real Prometheus → ``leadscale serve`` → a gRPC client standing in for KEDA.

A bursty shared trace (all six pulses of 50 ShareGPT requests, at four times their speed: about a
minute of backlog, so that the 20 s stalls we saw on a saturated machine cannot hide it) is replayed
by ``leadscale replay`` (its own process, as a user would run it) against one vLLM whose scheduler
admits 2 sequences at a time, so most of the burst waits inside vLLM. Prometheus scrapes
every 3 s (timeout 3 s): under a burst, the CPU build's API server answers ``/metrics`` late (we
measured 2-7 s on a busy 2-core machine), and a short scrape timeout loses exactly the samples that
matter. The assertions read the scaler's own decision log (every change, with its terms), so they do
not depend on how often this test's polling thread got the CPU. Requests ask vLLM to stream a chunk
per 16 tokens (``stream_interval``; the first token still comes at once): on a starved CPU the API
server's per-token streaming otherwise becomes the bottleneck, requests queue in front of the
engine, and vLLM's gauges (sampled only when that server gets to answer) read zero. The
capacity in the trigger metadata is set high for throughput (the replica's token rates alone never
ask for a second replica) so that only the waiting backlog can push desired replicas above 1: the
test checks that it does, that the decision's terms say so, that desired replicas come back after
the scale-down delay, and that ``IsActive`` and ``StreamIsActive`` follow.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import grpc
import httpx
import pytest
from conftest import ROOT, TRACES, require
from support.prometheus import PrometheusServer
from support.vllm_server import VllmServer, free_port, vllm_server  # noqa: F401 (fixture)

from scaler._proto import externalscaler_pb2 as pb
from scaler._proto import externalscaler_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus, pytest.mark.slow]

SCALE_DOWN_DELAY_S = 25.0
REPLAY_TIMEOUT_S = 900
"""The test's call took ~95 s on one CI machine and 340-410 s on an AVX2-only one (vLLM's CPU kernels are
several times slower there): the backlog only takes longer to drain, the test still holds."""
EVALUATION_LAG_S = 10.0
"""The scaler stamps a recommendation with the time its fetch began; under load we saw Prometheus
queries take ~10 s, so a decision can be published that much after its stamp, and its stabilization
window (measured from the stamp) ends that much earlier than the log's publication times suggest."""
METADATA = {
    "model": "tiny-llama",
    # the CPU replica generates ~1.1k tokens/s and prefills up to ~1.5k prompt tokens/s of this trace:
    # throughput alone stays near half a replica, while a backlog of ~30k waiting prompt tokens asks for several
    "prefillTokensPerSecond": "4000", "decodeTokensPerSecond": "10000",
    "maxNumSeqs": "8", "kvCacheTokens": "1048576",
    "ttftSeconds": "2", "backlogDrainSeconds": "2", "rateWindow": "15", "leadTime": "5",
    "scaleDownDelay": f"{SCALE_DOWN_DELAY_S:g}", "minReplicas": "0", "maxReplicas": "20",
}


class Keda:
    """Polls GetMetrics, IsActive and /decisions like KEDA's loop, and listens on StreamIsActive."""

    def __init__(self, channel: grpc.Channel, metrics_url: str, prom: PrometheusServer) -> None:
        self.prom = prom
        self.stub = pb_grpc.ExternalScalerStub(channel)
        self.ref = pb.ScaledObjectRef(name="tiny", namespace="e2e", scalerMetadata=METADATA)
        self.metrics_url = metrics_url
        self.samples: list[dict[str, Any]] = []
        self.pushes: list[tuple[float, bool]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def poll_forever(self) -> None:
        while not self.stop.is_set():
            sample: dict[str, Any] = {"t": time.monotonic() - self.t0, "wall": time.time()}
            try:
                reply = self.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=self.ref, metricName="x"), timeout=3)
                sample["desired"] = reply.metricValues[0].metricValueFloat
                sample["wall"] = time.time()  # when IsActive was asked
                sample["active"] = self.stub.IsActive(self.ref, timeout=3).result
                decisions = httpx.get(self.metrics_url + "/decisions", timeout=3).json()
                sample["terms"] = next((d["terms"] for d in decisions if d["name"] == "tiny"), {})
                waiting = self.prom.query("sum(vllm:num_requests_waiting)")
                sample["prom_waiting"] = float(waiting[0]["value"][1]) if waiting else None
                self.samples.append(sample)
            except (grpc.RpcError, httpx.HTTPError, ValueError) as exc:
                self.errors.append(f"{sample['t']:.1f}s {exc}")
            self.stop.wait(0.5)

    def listen(self) -> None:
        try:
            for reply in self.stub.StreamIsActive(self.ref, timeout=REPLAY_TIMEOUT_S + 600):
                self.pushes.append((time.monotonic() - self.t0, reply.result))
        except grpc.RpcError:
            pass


def _replay_command(url: str, out: Path) -> list[str]:
    path = TRACES / "sharegpt_pulses_6x50.csv"
    require(path.exists(), f"the shared trace {path}")
    return [sys.executable, "-m", "leadscale", "replay", "--endpoint", url, "--trace", str(path),
            "--max-requests", "300", "--time-scale", "0.25", "--out", str(out),  # six pulses of 50
            "--extra-body", '{"stream_interval": 16}']


def _wait_grpc(channel: grpc.Channel, serve: subprocess.Popen[bytes], log_path: Path) -> None:
    try:
        grpc.channel_ready_future(channel).result(timeout=30)
    except grpc.FutureTimeoutError:
        serve.kill()
        raise AssertionError("leadscale serve did not open its port:\n" + log_path.read_text()[-3000:]) from None


def _scrape_history(prom_url: str, start: float, end: float) -> dict[str, list[float]]:
    """What Prometheus recorded of vLLM during the test (for failure messages)."""
    out = {}
    for query in ("up", "scrape_duration_seconds", "sum(vllm:num_requests_waiting)"):
        try:
            reply = httpx.get(prom_url + "/api/v1/query_range", timeout=5,
                              params={"query": query, "start": start, "end": end, "step": 2}).json()
            series = reply["data"]["result"]
            out[query] = [round(float(v), 2) for _, v in series[0]["values"]] if series else []
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            out[query] = [f"{exc}"]  # type: ignore[list-item]
    return out


def decision_log(log_path: Path) -> list[dict[str, Any]]:
    """The scaler's own record of every decision change (one JSON log line each), with wall times.

    Reads both log shapes: a JSON object per line with ``time`` (ISO), or ``asctime LEVEL logger {json}``.
    """
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        if '"decision"' not in line or "{" not in line:
            continue
        entry = json.loads(line[line.index("{"):])
        if entry.get("event") != "decision":
            continue
        stamp = entry.get("time")
        entry["wall"] = (datetime.fromisoformat(stamp) if stamp else
                         datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")).timestamp()
        out.append(entry)
    return out


def test_burst_scales_on_waiting_tokens_and_back(vllm_server: VllmServer, tmp_path: Path) -> None:  # noqa: F811
    vllm_port = urlparse(vllm_server.url).port
    with PrometheusServer(scrape_targets=[f"127.0.0.1:{vllm_port}"], scrape_interval_s=3.0) as prom:
        prom.wait_until_up(1)
        prom.wait_until_observed(float(METADATA["rateWindow"]))  # else the scaler's first answers say "warming up"
        grpc_port, metrics_port = free_port(), free_port()
        log_path = tmp_path / "serve.log"
        serve = subprocess.Popen(
            [sys.executable, "-m", "leadscale", "serve", "--host", "127.0.0.1", "--port", str(grpc_port),
             "--metrics-port", str(metrics_port), "--prometheus-url", prom.url, "--interval", "1"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log_path.open("wb"))
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        keda = Keda(channel, f"http://127.0.0.1:{metrics_port}", prom)
        threads = [threading.Thread(target=keda.poll_forever, daemon=True),
                   threading.Thread(target=keda.listen, daemon=True)]
        try:
            _wait_grpc(channel, serve, log_path)
            for thread in threads:
                thread.start()
            time.sleep(3.0)  # idle baseline
            burst_start_wall = time.time()
            replay = subprocess.run(_replay_command(vllm_server.url, tmp_path / "replay"), cwd=ROOT,
                                    capture_output=True, timeout=REPLAY_TIMEOUT_S)
            assert replay.returncode == 0, replay.stderr.decode()[-2000:]
            summary = json.loads((tmp_path / "replay" / "summary.json").read_text())
            burst_end = time.monotonic() - keda.t0
            deadline = time.monotonic() + SCALE_DOWN_DELAY_S + 40
            while time.monotonic() < deadline:
                last = keda.samples[-1] if keda.samples else {}
                if last.get("t", 0) > burst_end + SCALE_DOWN_DELAY_S and last.get("desired", 9) <= 1 \
                        and not last.get("active", True) and keda.pushes and not keda.pushes[-1][1]:
                    break
                time.sleep(0.5)
        finally:
            keda.stop.set()
            channel.close()
            serve.terminate()
            serve.wait(timeout=20)
        (tmp_path / "samples.json").write_text(json.dumps(keda.samples))
        (tmp_path / "errors.json").write_text(json.dumps(keda.errors))
        scrapes = _scrape_history(prom.url, burst_start_wall - 5, time.time())

    assert summary["completed"] == 300, summary
    samples, decisions = keda.samples, decision_log(log_path)
    context = f"decisions: {[(round(d['wall'] - burst_start_wall, 1), d['desired_replicas']) for d in decisions]}"
    # the scaler's own log has every change, whatever the load on this machine did to our polling
    rise = next((d for d in decisions if d["desired_replicas"] > 1 and d["wall"] >= burst_start_wall), None)
    waiting_seen = [v for v in scrapes.get("sum(vllm:num_requests_waiting)", []) if isinstance(v, float)]
    assert max(waiting_seen, default=0) > 0, (
        f"precondition: vLLM never reported waiting requests to Prometheus (the burst queued in its HTTP "
        f"frontend instead: the machine starved it); Prometheus saw {scrapes}; replay: {summary}")
    assert rise is not None, f"desired never rose above 1; {context}; Prometheus saw {scrapes}; replay: {summary}"
    terms = rise["terms"]
    # the queue asked for it: the backlog itself, its growth counted as demand (arrivals = served + growth),
    # or (when the scaler's evaluations happened to fall between the pulses' queues, as on a starved CI
    # machine) the efficiency the late first tokens taught (scaler.efficiency)
    backlog_asked = terms["waiting_tokens"] > 0 and terms["needed_for_backlog"] > 1
    growth_counted = terms["demand_replicas"] > terms["served_replicas"]
    learned_from_queue = terms["efficiency"] < 1
    assert backlog_asked or growth_counted or learned_from_queue, rise
    # throughput alone (what the replica served) never asked for a second replica
    served = [d["terms"].get("served_replicas", 0.0) for d in decisions] + [
        x["terms"].get("served_replicas", 0.0) for x in samples]
    assert max(served) < 0.8, served  # the burst is sized so one replica's throughput stays under 0.8
    # what KEDA reads followed: GetMetrics above 1 at some poll (it stays up for the scale-down delay), and
    # IsActive true at every poll made well inside a period the scaler's log marks active
    assert any(x["desired"] > 1 for x in samples), f"GetMetrics never above 1: {samples}"
    assert any(d["active"] for d in decisions), context
    changes = [(d["wall"], d["active"]) for d in decisions] + [(math.inf, False)]
    for (start, active), (end, _) in itertools.pairwise(changes):
        inside = [x for x in samples if start + 1.5 < x["wall"] < end - 1.5]
        assert all(x["active"] == active for x in inside), (start, end, active, inside)
    final = samples[-1]
    assert final["desired"] <= 1 and not final["active"], final
    # back down, and not before the scale-down delay has passed since it went up
    down = min(d["wall"] for d in decisions if d["wall"] > rise["wall"] and d["desired_replicas"] <= 1)
    assert down - rise["wall"] >= SCALE_DOWN_DELAY_S - EVALUATION_LAG_S, context
    assert any(active for _, active in keda.pushes), "StreamIsActive never pushed true"
    assert keda.pushes[-1][1] is False, keda.pushes
    # the scaler answered: a few UNAVAILABLE before Prometheus has two samples, deadlines when this machine
    # starves every process for seconds; nothing else
    others = [e for e in keda.errors if "DEADLINE_EXCEEDED" not in e]
    assert len(others) <= 5 and len(keda.errors) <= max(5, len(samples) // 4), keda.errors
