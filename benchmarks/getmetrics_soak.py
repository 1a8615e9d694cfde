"""``bench_getmetrics.py --soak``: the scaler under KEDA's shape of load, side by side with a peer server.

Two ``leadscale serve`` processes (the real ``serve_forever`` path, fake signal source) start alike. The
scaler gets ``--objects`` scaled objects polled on the HPA cadence, bursts and churn (``keda_load``); the
peer gets the same schedule of gRPC health Checks, so its figures are what serving that many calls costs
from Python gRPC on this machine at the same moment. The table gives both and the ratios; ``--json``
writes them for docs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from keda_load import Recorder, Sampler, Steady, burst

META = {"prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000", "maxNumSeqs": "256",
        "kvCacheTokens": "200000"}
KINDS = ("GetMetricSpec", "GetMetrics", "IsActive")
TARGET_P99_MS, TARGET_CPU_CORES = 5.0, 0.2


def _start(script: Path, serve_args: list[str]) -> tuple[subprocess.Popen[str], int, int]:
    env = {**os.environ, "PYTHONPATH": str(script.resolve().parent.parent)}
    proc = subprocess.Popen([sys.executable, str(script), "--serve", "--serve-args", " ".join(serve_args)],
                            stdout=subprocess.PIPE, text=True, env=env)
    ports: dict[str, int] = {}
    while len(ports) < 2:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            raise SystemExit("a server did not start")
        key, _, value = line.partition(" ")
        ports[key] = int(value)
    return proc, ports["PORT"], ports["METRICS"]


def _scaled_objects(metrics_port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    match = re.search(r"^leadscale_scaled_objects (\S+)$", text, flags=re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


def soak(args: argparse.Namespace) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from scaler._proto import externalscaler_pb2 as pb
    from scaler._proto import externalscaler_pb2_grpc as pb_grpc

    script = Path(__file__).resolve().parent / "bench_getmetrics.py"
    serve_args = ["--idle-timeout", f"{args.idle_timeout:g}", "--max-objects", str(args.objects * 3)]
    scaler, scaler_port, metrics_port = _start(script, serve_args)
    peer, peer_port, _ = _start(script, serve_args)
    options = [("grpc.use_local_subchannel_pool", 1)]
    try:
        def channels(port: int, n: int) -> list[grpc.Channel]:
            return [grpc.insecure_channel(f"127.0.0.1:{port}", options=options) for _ in range(n)]

        steady_a, steady_b = channels(scaler_port, args.steady_clients), channels(peer_port, args.steady_clients)
        burst_a, burst_b = channels(scaler_port, args.burst_clients), channels(peer_port, args.burst_clients)
        stubs = [pb_grpc.ExternalScalerStub(c) for c in steady_a]
        health = [health_pb2_grpc.HealthStub(c) for c in steady_b]
        check = health_pb2.HealthCheckRequest(service="")
        refs: dict[tuple[int, int], pb.ScaledObjectRef] = {}

        def ref(i: int, gen: int) -> pb.ScaledObjectRef:
            if (i, gen) not in refs:
                refs.pop((i, gen - 1), None)
                refs[(i, gen)] = pb.ScaledObjectRef(name=f"chat-{i:04d}-g{gen}", namespace="llm",
                                                    scalerMetadata={**META, "model": f"model-{i:04d}"})
            return refs[(i, gen)]

        def scaler_calls(i: int, gen: int) -> list[tuple[str, Any]]:
            stub, r = stubs[i % len(stubs)], ref(i, gen)
            request = pb.GetMetricsRequest(scaledObjectRef=r, metricName=f"s0-leadscale-model-{i:04d}")
            return [("GetMetricSpec", lambda: stub.GetMetricSpec.future(r, timeout=3)),
                    ("GetMetrics", lambda: stub.GetMetrics.future(request, timeout=3)),
                    ("IsActive", lambda: stub.IsActive.future(r, timeout=3))]

        def peer_calls(i: int, gen: int) -> list[tuple[str, Any]]:
            stub = health[i % len(health)]
            return [(kind, lambda: stub.Check.future(check, timeout=3)) for kind in KINDS]

        # first calls evaluate synchronously (2 s bound, new objects share one fetch): not what we measure
        warm = [stubs[i % len(stubs)].GetMetrics.future(pb.GetMetricsRequest(scaledObjectRef=ref(i, 0)), timeout=30)
                for i in range(args.objects)]
        for future in warm:
            future.result()
        burst_stubs = [pb_grpc.ExternalScalerStub(c) for c in burst_a]
        burst_health = [health_pb2_grpc.HealthStub(c) for c in burst_b]
        rec_a, rec_b = Recorder(), Recorder()
        samplers = [Sampler(scaler.pid).start(), Sampler(peer.pid).start()]
        runs = [Steady(scaler_calls, args.objects, args.period, rec_a).start(),
                Steady(peer_calls, args.objects, args.period, rec_b).start()]
        started = time.monotonic()
        next_burst, next_churn, churned, objects_seen = started + args.burst_every, started + args.churn_every, 0, []
        bursts: list[tuple[float, float]] = []
        while (now := time.monotonic()) < started + args.soak:
            if now >= next_burst:
                def a_call(k: int) -> Any:
                    i = k * 7 % args.objects
                    request = pb.GetMetricsRequest(scaledObjectRef=ref(i, runs[0].generation[i]))
                    return burst_stubs[k % len(burst_stubs)].GetMetrics.future(request, timeout=3)

                took_a = burst([lambda k=k: a_call(k) for k in range(args.burst_clients)], args.burst_clients,
                               args.burst_calls, rec_a)
                took_b = burst([lambda s=s: s.Check.future(check, timeout=3) for s in burst_health],
                               args.burst_clients, args.burst_calls, rec_b)
                bursts.append((took_a, took_b))
                next_burst += args.burst_every
            if now >= next_churn:
                size = max(1, round(args.churn * args.objects))
                for run in runs:
                    run.rename(range(churned, churned + size))
                churned += size
                objects_seen.append(_scaled_objects(metrics_port))
                next_churn += args.churn_every
            time.sleep(0.2)
        for run in runs:
            run.stop()
        time.sleep(3.5)  # the last calls' deadlines
        for sampler in samplers:
            sampler.stop()
        objects_seen.append(_scaled_objects(metrics_port))
    finally:
        for proc in (scaler, peer):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return report(args, rec_a, rec_b, samplers, bursts, objects_seen, churned)


def report(args: argparse.Namespace, rec_a: Recorder, rec_b: Recorder, samplers: list[Sampler],
           bursts: list[tuple[float, float]], objects_seen: list[float], churned: int) -> int:
    warm = min(60.0, args.soak / 3)  # CPU and RSS after the first minute (imports, caches filling)
    cost_a, cost_b = samplers[0].summary(warm), samplers[1].summary(warm)
    kinds = [*KINDS, "burst", *[f"first {k}" for k in KINDS]]
    rows = {k: (rec_a.summary(k), rec_b.summary(k)) for k in kinds if rec_a.summary(k)["calls"]}
    print(f"\nsoak {args.soak:g} s: {args.objects} scaled objects, each GetMetricSpec + GetMetrics + IsActive every "
          f"{args.period:g} s from {args.steady_clients} channels; every {args.burst_every:g} s a burst of "
          f"{args.burst_clients} channels x {args.burst_calls} GetMetrics; every {args.churn_every:g} s "
          f"{args.churn:.0%} of the objects renamed (idle timeout {args.idle_timeout:g} s). Peer: the same "
          "schedule of health Checks on an identical server. Latency ms from the scheduled send.")
    print(f"{'calls':<20}{'n':>8}{'errors':>8}{'p50':>8}{'p99':>9}{'max':>9}  |{'peer p50':>9}{'peer p99':>9}"
          f"{'p99 ratio':>10}")
    for kind, (a, b) in rows.items():
        ratio = a["p99_ms"] / b["p99_ms"] if b["calls"] and b["p99_ms"] > 0 else float("nan")
        peer = f"{b['p50_ms']:>9.2f}{b['p99_ms']:>9.2f}{ratio:>9.2f}x" if b["calls"] else f"{'-':>9}{'-':>9}{'-':>10}"
        print(f"{kind:<20}{a['calls']:>8}{a['errors']:>8}{a['p50_ms']:>8.2f}{a['p99_ms']:>9.2f}{a['max_ms']:>9.1f}  |"
              f"{peer}")
    steady = [rows[k][0] for k in KINDS if k in rows]
    p99 = max((r["p99_ms"] for r in steady), default=float("nan"))
    errors, peer_errors = sum(rec_a.errors.values()), sum(rec_b.errors.values())
    print(f"server CPU: scaler {cost_a['cpu_cores']:.3f} cores, peer {cost_b['cpu_cores']:.3f} "
          f"(ratio {cost_a['cpu_cores'] / cost_b['cpu_cores']:.2f}x) over {cost_a['seconds']:.0f} s after the first "
          f"{warm:.0f} s")
    print(f"server RSS MiB (first third / last third / max, slope per minute): scaler {cost_a['rss_first_mib']:.1f} / "
          f"{cost_a['rss_last_mib']:.1f} / {cost_a['rss_max_mib']:.1f}, {cost_a['rss_slope_mib_per_min']:+.2f}; peer "
          f"{cost_b['rss_first_mib']:.1f} / {cost_b['rss_last_mib']:.1f} / {cost_b['rss_max_mib']:.1f}, "
          f"{cost_b['rss_slope_mib_per_min']:+.2f}")
    print(f"scaled objects held by the scaler at each rename and at the end: {[int(x) for x in objects_seen]} "
          f"({churned} renamed in all)")
    if bursts:
        print(f"bursts: {len(bursts)}, all calls done in {max(a for a, _ in bursts):.2f} s at most (peer "
              f"{max(b for _, b in bursts):.2f} s)")
    growth = cost_a["rss_last_mib"] - cost_a["rss_first_mib"]
    verdicts = {"steady p99 < 5 ms": p99 < TARGET_P99_MS, "zero errors": errors == 0,
                "CPU <= 0.2 core": cost_a["cpu_cores"] <= TARGET_CPU_CORES,
                "RSS flat (last third within 5 MiB of the first)": abs(growth) <= 5.0}
    print("targets: " + "; ".join(f"{name}: {'MET' if ok else 'MISSED'}" for name, ok in verdicts.items())
          + f" ({os.cpu_count()} cores shared by both servers, the load and anything else; load average "
            f"{os.getloadavg()[0]:.1f} at the end)")
    if rec_a.error_samples or peer_errors:
        print(f"first errors: {'; '.join(rec_a.error_samples)} (peer: {peer_errors} errors)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "settings": {k: getattr(args, k) for k in ("soak", "objects", "period", "steady_clients", "burst_every",
                                                       "burst_clients", "burst_calls", "churn_every", "churn",
                                                       "idle_timeout")},
            "latency": {k: {"scaler": a, "peer": b} for k, (a, b) in rows.items()},
            "cost": {"scaler": cost_a, "peer": cost_b}, "objects_seen": objects_seen, "bursts_s": bursts,
            "errors": errors, "peer_errors": peer_errors, "verdicts": verdicts,
            "load_average": os.getloadavg()[0]}, indent=1))
    return 0
