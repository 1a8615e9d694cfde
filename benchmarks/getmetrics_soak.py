"""``bench_getmetrics.py --soak``: the scaler under KEDA's shape of load, side by side with a peer server.

Two ``leadscale serve`` processes (the real ``serve_forever`` path, fake signal source) start alike. The
scaler gets ``--objects`` scaled objects polled on the HPA cadence, bursts and renames (``keda_load``);
the peer gets the same schedule of gRPC health Checks, so its figures are what serving that many calls
costs from Python gRPC on this machine at the same moment. Each load runs in its own process (its own
GIL), both on one shared clock; this process samples both servers' CPU and RSS. The table gives both and
the ratios; ``--json`` writes them for docs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from keda_load import Recorder, Sampler, Steady, burst

META = {"prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000", "maxNumSeqs": "256",
        "kvCacheTokens": "200000"}
KINDS = ("GetMetricSpec", "GetMetrics", "IsActive")
TARGET_P99_MS, TARGET_CPU_CORES = 5.0, 0.2


def _start(script: Path, serve_args: list[str]) -> tuple[subprocess.Popen[str], int, int]:
    # as the chart runs the scaler (deployment.yaml: two malloc arenas), unless the caller says otherwise
    env = {"MALLOC_ARENA_MAX": "2", **os.environ, "PYTHONPATH": str(script.resolve().parent.parent)}
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


def drive(port: int, peer: bool, settings: dict[str, Any], start_at: float, out: Any) -> None:
    """One load process: KEDA's schedule against ``port`` (health Checks instead when ``peer``); sends its
    figures (after the warm-up) through ``out``. ``start_at`` is a ``time.time()`` both loads share."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from scaler._proto import externalscaler_pb2 as pb
    from scaler._proto import externalscaler_pb2_grpc as pb_grpc

    s = argparse.Namespace(**settings)
    options = [("grpc.use_local_subchannel_pool", 1)]
    steady_channels = [grpc.insecure_channel(f"127.0.0.1:{port}", options=options) for _ in range(s.steady_clients)]
    burst_channels = [grpc.insecure_channel(f"127.0.0.1:{port}", options=options) for _ in range(s.burst_clients)]
    stubs = [pb_grpc.ExternalScalerStub(c) for c in steady_channels]
    health = [health_pb2_grpc.HealthStub(c) for c in steady_channels]
    burst_stubs = [pb_grpc.ExternalScalerStub(c) for c in burst_channels]
    burst_health = [health_pb2_grpc.HealthStub(c) for c in burst_channels]
    check = health_pb2.HealthCheckRequest(service="")
    refs: dict[tuple[int, int], Any] = {}

    def ref(i: int, gen: int) -> Any:
        if (i, gen) not in refs:
            refs.pop((i, gen - 1), None)
            refs[(i, gen)] = pb.ScaledObjectRef(name=f"chat-{i:04d}-g{gen}", namespace="llm",
                                                scalerMetadata={**META, "model": f"model-{i:04d}"})
        return refs[(i, gen)]

    def calls(i: int, gen: int) -> list[tuple[str, Any]]:
        if peer:
            stub = health[i % len(health)]
            return [(kind, lambda: stub.Check.future(check, timeout=3)) for kind in KINDS]
        scaler, r = stubs[i % len(stubs)], ref(i, gen)
        request = pb.GetMetricsRequest(scaledObjectRef=r, metricName=f"s0-leadscale-model-{i:04d}")
        return [("GetMetricSpec", lambda: scaler.GetMetricSpec.future(r, timeout=3)),
                ("GetMetrics", lambda: scaler.GetMetrics.future(request, timeout=3)),
                ("IsActive", lambda: scaler.IsActive.future(r, timeout=3))]

    if not peer:  # first calls evaluate synchronously (2 s bound, arrivals share one fetch): not measured
        for future in [stubs[i % len(stubs)].GetMetrics.future(pb.GetMetricsRequest(scaledObjectRef=ref(i, 0)),
                                                               timeout=30) for i in range(s.objects)]:
            future.result()
    time.sleep(max(0.0, start_at - time.time()))
    recorder = Recorder()
    steady = Steady(calls, s.objects, s.period, recorder).start()
    started = time.monotonic()
    end, warming = started + s.warmup + s.soak, s.warmup > 0
    # the peer's bursts fall between the scaler's: each burst competes with steady load only
    next_burst = started + s.burst_every * (1.5 if peer else 1.0)
    next_churn, churned = started + s.churn_every, 0
    bursts: list[float] = []

    def burst_call(k: int) -> Any:
        if peer:
            return burst_health[k % len(burst_health)].Check.future(check, timeout=3)
        i = k * 7 % s.objects
        request = pb.GetMetricsRequest(scaledObjectRef=ref(i, steady.generation[i]))
        return burst_stubs[k % len(burst_stubs)].GetMetrics.future(request, timeout=3)

    while (now := time.monotonic()) < end:
        if warming and now >= started + s.warmup:
            recorder.clear()
            steady.lag_ms.clear()
            bursts, warming = [], False
        if now >= next_burst:
            steady.bursting.set()
            bursts.append(burst([lambda k=k: burst_call(k) for k in range(s.burst_clients)], s.burst_clients,
                                s.burst_calls, recorder))
            steady.bursting.clear()
            next_burst += s.burst_every
        if now >= next_churn:
            size = max(1, round(s.churn * s.objects))
            steady.rename(range(churned, churned + size))
            churned += size
            next_churn += s.churn_every
        time.sleep(0.1)
    steady.stop()
    time.sleep(3.5)  # the last calls' deadlines
    kinds = [*KINDS, *[f"{k} in burst" for k in KINDS], "burst", *[f"first {k}" for k in KINDS]]
    out.send({"latency": {k: recorder.summary(k) for k in kinds}, "errors": sum(recorder.errors.values()),
              "error_samples": recorder.error_samples, "bursts_s": bursts, "churned": churned,
              "lag_p99_ms": float(np.percentile(steady.lag_ms, 99)) if steady.lag_ms else float("nan")})
    for channel in steady_channels + burst_channels:
        channel.close()


def soak(args: argparse.Namespace) -> int:
    script = Path(__file__).resolve().parent / "bench_getmetrics.py"
    serve_args = ["--idle-timeout", f"{args.idle_timeout:g}", "--max-objects", str(args.objects * 3)]
    # the scaler as the chart runs it; the peer unpinned, as in every earlier soak, so that its column stays the
    # floor of Python gRPC on this machine (two servers pinned to one CPU would share it)
    servers = [_start(script, [*serve_args, "--pin-serving-cpu", str(args.pin_serving_cpu).lower()]),
               _start(script, [*serve_args, "--pin-serving-cpu", "false"])]
    settings = {k: getattr(args, k) for k in ("warmup", "soak", "objects", "period", "steady_clients", "burst_every",
                                              "burst_clients", "burst_calls", "churn_every", "churn", "idle_timeout")}
    context = multiprocessing.get_context("spawn")
    start_at = time.time() + 15 + args.objects / 200  # both loads ready (the scaler's first calls done)
    pipes, loads = [], []
    try:
        for (_, port, _), peer in zip(servers, (False, True), strict=True):
            receive, send = context.Pipe(duplex=False)
            load = context.Process(target=drive, args=(port, peer, settings, start_at, send), daemon=True)
            load.start()
            pipes.append(receive)
            loads.append(load)
        time.sleep(max(0.0, start_at - time.time()))
        samplers = [Sampler(proc.pid).start() for proc, _, _ in servers]
        metrics_port = servers[0][2]
        objects_seen, next_look = [], time.monotonic() + args.warmup
        if args.warmup:
            time.sleep(args.warmup)
            for sampler in samplers:
                sampler.restart()
        finish = time.monotonic() + args.soak
        while time.monotonic() < finish:
            if time.monotonic() >= next_look:
                objects_seen.append(_scaled_objects(metrics_port))
                next_look += args.churn_every
            time.sleep(0.5)
        results = [pipe.recv() for pipe in pipes]  # each load ends 3.5 s after the soak
        for sampler in samplers:
            sampler.stop()
        objects_seen.append(_scaled_objects(metrics_port))
    finally:
        for load in loads:
            load.join(timeout=30)
        for proc, _, _ in servers:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return report(args, results, samplers, objects_seen)


def report(args: argparse.Namespace, results: list[dict[str, Any]], samplers: list[Sampler],
           objects_seen: list[float]) -> int:
    mine, peer = results
    warm = 0.0 if args.warmup else min(60.0, args.soak / 3)  # without a warm-up, skip the first minute
    cost_a, cost_b = samplers[0].summary(warm), samplers[1].summary(warm)
    rows = {k: (a, peer["latency"][k]) for k, a in mine["latency"].items() if a["calls"]}
    print(f"\nsoak {args.soak:g} s after {args.warmup:g} s of warm-up under the same load: {args.objects} scaled "
          f"objects, each GetMetricSpec + GetMetrics + IsActive every {args.period:g} s from {args.steady_clients} "
          f"channels; every {args.burst_every:g} s a burst of {args.burst_clients} channels x {args.burst_calls} "
          f"GetMetrics; every {args.churn_every:g} s {args.churn:.0%} of the objects renamed (idle timeout "
          f"{args.idle_timeout:g} s). Peer: the same schedule of health Checks on an identical server. Each load in "
          f"its own process; latency ms from each call's send (the loads sent p99 {mine['lag_p99_ms']:.1f} / "
          f"{peer['lag_p99_ms']:.1f} ms behind schedule).")
    print(f"{'calls':<20}{'n':>8}{'errors':>8}{'p50':>8}{'p99':>9}{'max':>9}  |{'peer p50':>9}{'peer p99':>9}"
          f"{'p99 ratio':>10}")
    for kind, (a, b) in rows.items():
        ratio = a["p99_ms"] / b["p99_ms"] if b["calls"] and b["p99_ms"] > 0 else float("nan")
        other = f"{b['p50_ms']:>9.2f}{b['p99_ms']:>9.2f}{ratio:>9.2f}x" if b["calls"] else f"{'-':>9}{'-':>9}{'-':>10}"
        print(f"{kind:<20}{a['calls']:>8}{a['errors']:>8}{a['p50_ms']:>8.2f}{a['p99_ms']:>9.2f}{a['max_ms']:>9.1f}  |"
              f"{other}")
    def steady_p99(kinds: list[str]) -> float:
        values = np.concatenate([np.full(1, np.nan)] + [[rows[k][0]["p99_ms"]] for k in kinds if k in rows])
        return float(np.nanmax(values)) if np.isfinite(values).any() else float("nan")

    p99_outside = steady_p99(list(KINDS))
    p99 = max(p99_outside, steady_p99([f"{k} in burst" for k in KINDS]))
    errors, peer_errors = mine["errors"], peer["errors"]
    print(f"server CPU: scaler {cost_a['cpu_cores']:.3f} cores, peer {cost_b['cpu_cores']:.3f} "
          f"(ratio {cost_a['cpu_cores'] / cost_b['cpu_cores']:.2f}x) over {cost_a['seconds']:.0f} s"
          + (f" after the first {warm:.0f} s" if warm else ""))
    print(f"  of which the serving process {cost_a['cpu_cores'] - cost_a['children_cpu_cores']:.3f}, the decision "
          f"process {cost_a['children_cpu_cores']:.3f} (peer {cost_b['cpu_cores'] - cost_b['children_cpu_cores']:.3f} "
          f"and {cost_b['children_cpu_cores']:.3f})")
    print(f"server RSS MiB (first third / last third / max, slope per minute): scaler {cost_a['rss_first_mib']:.1f} / "
          f"{cost_a['rss_last_mib']:.1f} / {cost_a['rss_max_mib']:.1f}, {cost_a['rss_slope_mib_per_min']:+.2f}; peer "
          f"{cost_b['rss_first_mib']:.1f} / {cost_b['rss_last_mib']:.1f} / {cost_b['rss_max_mib']:.1f}, "
          f"{cost_b['rss_slope_mib_per_min']:+.2f}")
    print(f"scaled objects held by the scaler, every {args.churn_every:g} s and at the end: "
          f"{[int(x) for x in objects_seen]} ({mine['churned']} renamed in all, warm-up included)")
    if mine["bursts_s"]:
        print(f"bursts: {len(mine['bursts_s'])}, all calls done in {max(mine['bursts_s']):.2f} s at most (peer "
              f"{max(peer['bursts_s'] or [float('nan')]):.2f} s)")
    growth = cost_a["rss_last_mib"] - cost_a["rss_first_mib"]
    verdicts = {"steady p99 < 5 ms": p99 < TARGET_P99_MS,
                "steady p99 < 5 ms outside bursts": p99_outside < TARGET_P99_MS, "zero errors": errors == 0,
                "CPU <= 0.2 core": cost_a["cpu_cores"] <= TARGET_CPU_CORES,
                "RSS flat (last third within 5 MiB of the first)": abs(growth) <= 5.0}
    print("targets: " + "; ".join(f"{name}: {'MET' if ok else 'MISSED'}" for name, ok in verdicts.items())
          + f" ({os.cpu_count()} cores shared by both servers, both loads and anything else; load average "
            f"{os.getloadavg()[0]:.1f} at the end)")
    if mine["error_samples"] or peer_errors:
        print(f"first errors: {'; '.join(mine['error_samples'])} (peer: {peer_errors} errors)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "settings": {k: getattr(args, k) for k in ("warmup", "soak", "objects", "period", "steady_clients",
                                                       "burst_every", "burst_clients", "burst_calls", "churn_every",
                                                       "churn", "idle_timeout", "pin_serving_cpu")},
            "latency": {k: {"scaler": a, "peer": b} for k, (a, b) in rows.items()},
            "cost": {"scaler": cost_a, "peer": cost_b}, "objects_seen": objects_seen,
            "bursts_s": [mine["bursts_s"], peer["bursts_s"]], "errors": errors, "peer_errors": peer_errors,
            "send_lag_p99_ms": [mine["lag_p99_ms"], peer["lag_p99_ms"]], "verdicts": verdicts,
            "load_average": os.getloadavg()[0]}, indent=1))
    return 0


def fast_forward(args: argparse.Namespace) -> int:
    """Memory over ``--fast-forward`` simulated minutes: the evaluator in this process on a hand-moved clock,
    ``--objects`` objects asked about every ``--period`` s, ``--churn`` of them renamed every ``--churn-every``
    s, one evaluation round per 5 s. Minutes of scaled-object life pass in seconds, so the state's whole
    life cycle (histories filling to the policy's windows, renamed objects idling out) fits one run."""
    import gc

    import psutil
    from bench_getmetrics import FakeSource

    from scaler.evaluator import Evaluator
    from scaler.telemetry import Telemetry

    class Clock:
        t = 1_000_000.0

        def __call__(self) -> float:
            return self.t

    clock, interval = Clock(), 5.0
    evaluator = Evaluator(prometheus_url="http://127.0.0.1:9", source_factory=lambda key: FakeSource(),
                          telemetry=Telemetry(), clock=clock, idle_timeout_s=args.idle_timeout,
                          max_objects=args.objects * 3, serves_rpcs=False)  # as in the decision process
    generation, churned = [0] * args.objects, 0
    meta = [{**META, "model": f"model-{i:04d}"} for i in range(args.objects)]

    def ask(indices: range) -> None:
        for i in indices:
            evaluator.lookup("llm", f"chat-{i:04d}-g{generation[i]}", meta[i])

    ask(range(args.objects))
    process, rows = psutil.Process(), []

    def cpu_s() -> float:
        return float(sum(process.cpu_times()[:2]))  # user + system

    cpu_mark = cpu_s()  # what the rounds since the last row cost
    per_round = max(1, round(args.objects * interval / args.period))
    rounds, next_churn = round(args.fast_forward * 60 / interval), args.churn_every
    for r in range(1, rounds + 1):
        clock.t += interval
        if r * interval >= next_churn:
            size = max(1, round(args.churn * args.objects))
            for i in range(churned, churned + size):
                generation[i % args.objects] += 1
            churned, next_churn = churned + size, next_churn + args.churn_every
        start = (r * per_round) % args.objects
        ask(range(start, min(start + per_round, args.objects)))
        ask(range(0, max(0, start + per_round - args.objects)))
        evaluator.run_once()
        if r % round(300 / interval) == 0:
            # the rounds' CPU against the simulated time they stand for: the cores the evaluator would take live
            cores = (cpu_s() - cpu_mark) / 300.0
            gc.collect()  # (a measurement's own cost: not counted)
            cpu_mark = cpu_s()
            rows.append((r * interval / 60, process.memory_info().rss / 2**20, len(evaluator._entries), cores))
    evaluator.stop()
    print(f"\nfast-forward {args.fast_forward:g} simulated minutes: {args.objects} objects asked about every "
          f"{args.period:g} s, {args.churn:.0%} renamed every {args.churn_every:g} s, idle timeout "
          f"{args.idle_timeout:g} s, a round per {interval:g} s")
    print(f"{'minute':>8}{'RSS MiB':>10}{'objects':>9}{'cores (live)':>14}")
    for minute, rss, objects, cores in rows:
        print(f"{minute:>8.0f}{rss:>10.1f}{objects:>9}{cores:>14.4f}")
    half = [rss for minute, rss, _, _ in rows if minute > args.fast_forward / 2]
    print(f"RSS over the second half: {min(half):.1f}-{max(half):.1f} MiB (spread {max(half) - min(half):.1f} MiB); "
          f"{churned} objects renamed in all")
    if args.json:
        Path(args.json).write_text(json.dumps({"fast_forward_min": args.fast_forward, "rows": rows}, indent=1))
    return 0


def burst_probe(args: argparse.Namespace) -> int:
    """One server alone, ``--objects`` objects under KEDA's steady polling for ``--burst-probe`` seconds, then
    bursts of ``--burst-clients`` x ``--burst-calls`` GetMetrics and of health Checks, alternating, on that
    same server: what a burst costs the scaler itself, with no second server and load on the two cores
    (the soak runs four processes side by side)."""
    import grpc
    from bench_getmetrics import META
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from scaler._proto import externalscaler_pb2 as pb
    from scaler._proto import externalscaler_pb2_grpc as pb_grpc

    script = Path(__file__).resolve().parent / "bench_getmetrics.py"
    proc, port, _ = _start(script, ["--idle-timeout", f"{args.idle_timeout:g}", "--max-objects", str(args.objects * 3)])
    try:
        options = [("grpc.use_local_subchannel_pool", 1)]
        channels = [grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
                    for _ in range(args.burst_clients + args.steady_clients)]
        stubs = [pb_grpc.ExternalScalerStub(c) for c in channels]
        health = [health_pb2_grpc.HealthStub(c) for c in channels[: args.burst_clients]]
        refs = [pb.ScaledObjectRef(name=f"chat-{i:04d}-g0", namespace="llm",
                                   scalerMetadata={**META, "model": f"model-{i:04d}"}) for i in range(args.objects)]
        requests = [pb.GetMetricsRequest(scaledObjectRef=r) for r in refs]
        for future in [stubs[i % args.burst_clients].GetMetrics.future(requests[i], timeout=30)
                       for i in range(args.objects)]:
            future.result()
        steady_stubs = stubs[args.burst_clients:]

        def calls(i: int, gen: int) -> list[tuple[str, Any]]:
            s = steady_stubs[i % len(steady_stubs)]
            return [("GetMetricSpec", lambda: s.GetMetricSpec.future(refs[i], timeout=3)),
                    ("GetMetrics", lambda: s.GetMetrics.future(requests[i], timeout=3)),
                    ("IsActive", lambda: s.IsActive.future(refs[i], timeout=3))]

        steady = Steady(calls, args.objects, args.period, Recorder()).start()
        time.sleep(args.burst_probe)
        check = health_pb2.HealthCheckRequest(service="")
        kinds = {"GetMetrics": lambda k: stubs[k % args.burst_clients].GetMetrics.future(
                     requests[k * 7 % args.objects], timeout=10),
                 "health Check": lambda k: health[k % args.burst_clients].Check.future(check, timeout=10)}
        took: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(args.probe_bursts):
            for kind, call in kinds.items():
                took[kind].append(burst([lambda k=k, call=call: call(k) for k in range(args.burst_clients)],
                                        args.burst_clients, args.burst_calls, Recorder()))
                time.sleep(args.period / 5)
        steady.stop()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"\nburst probe: {args.objects} objects polled every {args.period:g} s for {args.burst_probe:g} s, then "
          f"bursts of {args.burst_clients} x {args.burst_calls} calls on the same server, alternating")
    for kind, seconds in took.items():
        print(f"{kind:>14}: median {np.median(seconds):.2f} s, max {max(seconds):.2f} s  "
              f"({', '.join(f'{s:.2f}' for s in seconds)})")
    print(f"ratio of medians GetMetrics / health Check: "
          f"{np.median(took['GetMetrics']) / np.median(took['health Check']):.2f}x")
    return 0
