"""GetMetrics latency under open-loop load, side by side with the gRPC health Check on the same server.

The server is the real ``leadscale serve`` code path (``serve_forever``) in a child process, with a
fake in-process signal source for 100 scaled objects (its background loop keeps evaluating them
every ``--interval`` s, as in production). This process is the load: 50 client channels, each its
own TCP connection, fed by one open-loop dispatcher at a fixed rate, round-robin over the objects.
Latency runs from each call's *scheduled* send time to its completion, so a client or server that
falls behind shows up in the numbers (no coordinated omission).

Then a ramp (doubling the rate, ``--step`` s per rate) finds the highest sustained calls/s: every
call answered OK, completions keep up with the schedule (>= 97 %), p99 under 100 ms. Both machines
share the CPU here, so compare the *ratio* GetMetrics / health Check (same server, same client) more
than the absolute numbers.

``--soak S`` instead runs KEDA's shape for S seconds (``keda_load``): ``--objects`` (1000) scaled objects
each polled with GetMetricSpec, GetMetrics and IsActive every ``--period`` (15 s, the HPA sync), a burst
every ``--burst-every`` s from ``--burst-clients`` (100) channels, and every ``--churn-every`` s a
``--churn`` share of the objects renamed (the old names must idle out: ``--idle-timeout``). A peer
server, the same ``leadscale serve``, gets the same schedule of health Checks side by side. Printed: latency
per call kind, errors, each server's CPU (cores) and RSS (first and last third, slope), and the ratios.

    python benchmarks/bench_getmetrics.py                 # 500 calls/s for 20 s, then the ramp
    python benchmarks/bench_getmetrics.py --duration 5 --step 2 --max-rate 4000
    python benchmarks/bench_getmetrics.py --warmup 660 --soak 600 --json soak.json   # the 10-minute soak
    python benchmarks/bench_getmetrics.py --fast-forward 120     # memory over 2 simulated hours, in a minute
    python benchmarks/bench_getmetrics.py --burst-probe 600      # a burst's cost on one server, no peer beside it
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

OBJECTS = 100
META = {"prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000", "maxNumSeqs": "256",
        "kvCacheTokens": "200000"}


COLD_STARTS_S = tuple(float(120 + 7 * k) for k in range(20))
"""Measured cold starts as ``leadTime: auto`` hands them over (the lead-time bands weigh their lags by
them); the lead time the source measures from them is ``FakeSource.lead_time_s``."""


class FakeSource:
    """Every model gets a steady, model-dependent load; answers in microseconds."""

    def __init__(self) -> None:
        from scaler.lead_time import rolling_lead_time

        self.lead_time_s = rolling_lead_time(COLD_STARTS_S)  # once: the starts never change

    def fetch(self, targets: Sequence[Any], now: float) -> dict[Any, Any]:
        from scaler.signals import Signals

        out = {}
        for t in targets:
            index = int(t.model.rsplit("-", 1)[-1])
            out[t] = Signals(at=now, prompt_tokens_per_s=500.0 * index, generation_tokens_per_s=120.0 * index,
                             requests_waiting=float(index % 3), requests_running=float(index), ready_replicas=1,
                             data_age_s=2.0, kv_cache_usage=0.1 + 0.04 * (index % 20),
                             lead_time_s=self.lead_time_s, cold_starts_s=COLD_STARTS_S)
        return out


def fake_source(key: Any) -> FakeSource:
    """The server's source factory: a module-level function, so it reaches the decision process (pickled)."""
    return FakeSource()


def run_server(extra: Sequence[str] = ()) -> int:
    """Child process: ``leadscale serve`` with the fake source; prints the gRPC and metrics ports on stdout."""
    import logging

    from leadscale.cli import build_parser
    from scaler import serve_cli, service, telemetry

    args = serve_cli.resolve(build_parser().parse_args(["serve", "--host", "127.0.0.1", "--port", "0",
                                                        "--metrics-port", "0", "--log-level", "WARNING",
                                                        "--prometheus-url", "http://127.0.0.1:9", *extra]))
    args.source_factory = fake_source
    start, serve_http = service.start_server, telemetry.serve_http

    def announce(*a: Any, **k: Any) -> Any:
        running = start(*a, **k)
        print(f"PORT {running.port}", flush=True)
        return running

    def announce_metrics(*a: Any, **k: Any) -> Any:
        http = serve_http(*a, **k)
        print(f"METRICS {http.server_address[1]}", flush=True)
        return http

    service.start_server = announce  # type: ignore[assignment]
    telemetry.serve_http = announce_metrics  # type: ignore[assignment]
    logging.getLogger("leadscale").setLevel(logging.WARNING)
    return service.serve_forever(args)


@dataclass
class Result:
    offered: float
    sent: int
    ok: int
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    completed_per_s: float


@dataclass
class Run:
    """Raw outcome of one open-loop stretch."""

    offered: float
    latencies_ms: np.ndarray
    errors: int
    elapsed_s: float


def open_loop(calls: list[Callable[[], Any]], rate: float, seconds: float) -> Run:
    """Issue ``calls`` round-robin at ``rate``/s for ``seconds``; latency from the scheduled time."""
    n = max(1, int(rate * seconds))
    latencies = np.full(n, np.nan)
    errors = [0]
    lock = threading.Lock()
    done = threading.Semaphore(0)
    start = time.perf_counter() + 0.05

    def finished(i: int, scheduled: float, future: Any) -> None:
        latency = time.perf_counter() - scheduled
        if future.exception() is not None:
            with lock:
                errors[0] += 1
        else:
            latencies[i] = latency
        done.release()

    for i in range(n):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        future = calls[i % len(calls)]()
        future.add_done_callback(lambda f, i=i, s=scheduled: finished(i, s, f))
    for _ in range(n):
        done.acquire(timeout=10)
    return Run(rate, latencies[~np.isnan(latencies)] * 1000, errors[0], time.perf_counter() - start)


def summarize(runs: list[Run]) -> Result:
    ok = np.concatenate([r.latencies_ms for r in runs])
    errors = sum(r.errors for r in runs)
    pct = np.percentile(ok, [50, 99]) if ok.size else [np.nan, np.nan]
    return Result(runs[0].offered, int(ok.size) + errors, int(ok.size), errors, float(pct[0]), float(pct[1]),
                  float(ok.max()) if ok.size else np.nan, ok.size / sum(r.elapsed_s for r in runs))


def handler_cost_us(repeats: int = 5, number: int = 5000) -> tuple[float, float]:
    """CPU cost of one GetMetrics vs one health Check inside the servicers (no network): best of ``repeats``.

    Robust to neighbours on a shared machine, unlike wall-clock latency under load.
    """
    import timeit

    from grpc_health.v1 import health, health_pb2

    from scaler._proto import externalscaler_pb2 as pb
    from scaler.evaluator import Evaluator
    from scaler.service import ExternalScalerServicer
    from scaler.telemetry import Telemetry

    class Context:
        def abort(self, code: Any, details: str) -> None:
            raise RuntimeError(f"{code}: {details}")

    telemetry = Telemetry()
    evaluator = Evaluator(prometheus_url="http://127.0.0.1:9", source_factory=lambda key: FakeSource(),
                          telemetry=telemetry)
    servicer, checker, context = ExternalScalerServicer(evaluator, telemetry), health.HealthServicer(), Context()
    requests = [pb.GetMetricsRequest(scaledObjectRef=pb.ScaledObjectRef(
        name=f"chat-{i:03d}", namespace="llm", scalerMetadata={**META, "model": f"model-{i:03d}"}))
        for i in range(OBJECTS)]
    for request in requests:
        servicer.GetMetrics(request, context)
    check = health_pb2.HealthCheckRequest(service="")
    counter = iter(range(10**9))
    get = min(timeit.repeat(lambda: servicer.GetMetrics(requests[next(counter) % OBJECTS], context),
                            number=number, repeat=repeats)) / number
    chk = min(timeit.repeat(lambda: checker.Check(check, context), number=number, repeat=repeats)) / number
    evaluator.stop()
    return get * 1e6, chk * 1e6


def sustained(r: Result) -> bool:
    return r.errors == 0 and r.ok == r.sent and r.completed_per_s >= 0.97 * r.offered and r.p99_ms < 100


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=500.0, help="calls/s of the main run")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of the main run, per RPC")
    parser.add_argument("--block", type=float, default=2.0, help="seconds per alternating block of the main run")
    parser.add_argument("--clients", type=int, default=50, help="client channels (TCP connections)")
    parser.add_argument("--step", type=float, default=4.0, help="seconds per rate in the ramp")
    parser.add_argument("--max-rate", type=float, default=16000.0, help="stop the ramp here")
    soak_group = parser.add_argument_group("soak (--soak S): KEDA's shape, side by side with a peer")
    soak_group.add_argument("--soak", type=float, default=0.0, metavar="S", help="run the soak for S seconds")
    soak_group.add_argument("--warmup", type=float, default=0.0, metavar="S",
                            help="first run the same load S seconds unmeasured (the policy's history windows fill: "
                                 "trendWindowSeconds, 600 by default)")
    soak_group.add_argument("--objects", type=int, default=1000, help="scaled objects")
    soak_group.add_argument("--period", type=float, default=15.0, help="seconds between polls of one object")
    soak_group.add_argument("--steady-clients", type=int, default=4, help="channels of the steady polling")
    soak_group.add_argument("--burst-every", type=float, default=60.0, help="seconds between bursts")
    soak_group.add_argument("--burst-clients", type=int, default=100, help="channels in a burst")
    soak_group.add_argument("--burst-calls", type=int, default=10, help="GetMetrics per channel in a burst")
    soak_group.add_argument("--churn-every", type=float, default=60.0, help="seconds between renames")
    soak_group.add_argument("--churn", type=float, default=0.05, help="share of objects renamed each time")
    soak_group.add_argument("--idle-timeout", type=float, default=120.0, help="the server's --idle-timeout")
    soak_group.add_argument("--pin-serving-cpu", choices=("true", "false"), default="true",
                            help="the scaler's --pin-serving-cpu (the peer always runs with false)")
    soak_group.add_argument("--json", default=None, metavar="PATH", help="also write the soak's figures here")
    soak_group.add_argument("--fast-forward", type=float, default=0.0, metavar="MIN",
                            help="instead, MIN simulated minutes of the evaluator on a hand-moved clock: RSS as "
                                 "histories fill and renamed objects idle out")
    soak_group.add_argument("--burst-probe", type=float, default=0.0, metavar="S",
                            help="instead, one server under the steady polling for S seconds, then bursts of "
                                 "GetMetrics and of health Checks on it, alternating")
    soak_group.add_argument("--probe-bursts", type=int, default=8, help="bursts of each kind in --burst-probe")
    parser.add_argument("--serve-args", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return run_server(args.serve_args.split())
    if args.fast_forward > 0:
        from getmetrics_soak import fast_forward

        return fast_forward(args)
    if args.burst_probe > 0:
        from getmetrics_soak import burst_probe

        return burst_probe(args)
    if args.soak > 0:
        from getmetrics_soak import soak

        return soak(args)

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from scaler._proto import externalscaler_pb2 as pb
    from scaler._proto import externalscaler_pb2_grpc as pb_grpc

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = server.stdout.readline() if server.stdout else ""
        if not line.startswith("PORT "):
            print(f"server did not start: {line!r}", file=sys.stderr)
            return 1
        target = f"127.0.0.1:{int(line.split()[1])}"
        channels = [grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(args.clients)]
        requests = [pb.GetMetricsRequest(scaledObjectRef=pb.ScaledObjectRef(
            name=f"chat-{i:03d}", namespace="llm", scalerMetadata={**META, "model": f"model-{i:03d}"}),
            metricName=f"s0-leadscale-model-{i:03d}") for i in range(OBJECTS)]
        metrics = [pb_grpc.ExternalScalerStub(c) for c in channels]
        health = [health_pb2_grpc.HealthStub(c) for c in channels]
        check = health_pb2.HealthCheckRequest(service="")
        for i, request in enumerate(requests):  # first calls compute synchronously; not what we measure
            metrics[i % len(metrics)].GetMetrics(request, timeout=5)

        # call k goes to channel k % clients and object k % objects (coprime counts spread the pairs)
        count = args.clients * OBJECTS
        get_calls = [lambda k=k: metrics[k % args.clients].GetMetrics.future(requests[k % OBJECTS], timeout=3)
                     for k in range(count)]
        check_calls = [lambda k=k: health[k % args.clients].Check.future(check, timeout=3) for k in range(count)]
        # alternate short blocks of each RPC so that load from neighbours hits both alike
        runs: dict[str, list[Run]] = {"GetMetrics": [], "health Check": []}
        for calls in (get_calls, check_calls):
            open_loop(calls, args.rate, 1.0)  # warm up connections and code paths
        for _ in range(max(1, round(args.duration / args.block))):
            for name, calls in (("GetMetrics", get_calls), ("health Check", check_calls)):
                runs[name].append(open_loop(calls, args.rate, args.block))
        rows = [(name, summarize(r)) for name, r in runs.items()]
        print(f"\nopen loop {args.rate:g} calls/s for {args.duration:g} s per RPC (alternating "
              f"{args.block:g} s blocks) over {OBJECTS} scaled objects from {args.clients} clients "
              "(latency from scheduled send, ms)")
        print(f"{'RPC':<14}{'calls':>8}{'errors':>8}{'p50':>9}{'p99':>9}{'max':>9}{'done/s':>9}")
        for name, r in rows:
            print(f"{name:<14}{r.sent:>8}{r.errors:>8}{r.p50_ms:>9.2f}{r.p99_ms:>9.2f}{r.max_ms:>9.2f}"
                  f"{r.completed_per_s:>9.0f}")
        g, h = rows[0][1], rows[1][1]
        print(f"ratio GetMetrics/Check: p50 {g.p50_ms / h.p50_ms:.2f}x, p99 {g.p99_ms / h.p99_ms:.2f}x; "
              f"target p99 < 5 ms with zero errors: {'MET' if g.p99_ms < 5 and g.errors == 0 else 'MISSED'}")

        get_us, check_us = handler_cost_us()
        print(f"handler CPU per call (in process, best of 5): GetMetrics {get_us:.1f} us, health Check "
              f"{check_us:.1f} us (ratio {get_us / check_us:.1f}x)")

        print(f"\nramp ({args.step:g} s per rate, RPCs interleaved, best of 2 tries): highest sustained calls/s "
              "(all OK, >= 97 % on schedule, p99 < 100 ms)")
        best = {"GetMetrics": 0.0, "health Check": 0.0}
        rate = args.rate
        while rate <= args.max_rate:
            for name, calls in (("GetMetrics", get_calls), ("health Check", check_calls)):
                if rate > args.rate and best[name] < rate / 2:
                    continue  # this RPC already stopped keeping up
                for _ in range(2):
                    r = summarize([open_loop(calls, rate, args.step)])
                    if sustained(r):
                        best[name] = rate
                        break
                print(f"  {name:<13} offered {rate:>7.0f}/s  done {r.completed_per_s:>7.0f}/s  p99 "
                      f"{r.p99_ms:>8.2f} ms  errors {r.errors:>5}  {'ok' if best[name] == rate else 'NOT sustained'}")
            if max(best.values()) < rate:
                break
            rate *= 2
        ratio = best["GetMetrics"] / best["health Check"] if best["health Check"] else float("nan")
        print(f"highest sustained: GetMetrics {best['GetMetrics']:.0f}/s, health Check {best['health Check']:.0f}/s "
              f"(ratio {ratio:.2f}); {os.cpu_count()} cores shared by client, server and anything else running "
              f"(load average {os.getloadavg()[0]:.1f} at the end)")
        for c in channels:
            c.close()
        return 0
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            print("server did not stop within 30 s of SIGTERM; killed", file=sys.stderr)
            server.kill()
            server.wait()


if __name__ == "__main__":
    sys.exit(main())
