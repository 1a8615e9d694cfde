"""Simulator speed: simulated requests per CPU second, side by side with ``vllm-sr-sim``.

Both simulate ``--requests`` Poisson arrivals at ``--rate`` req/s on a fixed fleet of ``--replicas``
GPUs with chat-like lengths:

- ``leadscale``: ``simulator.engine.simulate`` (the compiled engine; ``engine='python'``, the reference,
  also measured) on ``builtin:poisson`` (lognormal lengths: prompt mean
  1155 / median 512, output mean 211 / median 128), profile ``--profile``: vLLM v1 step rules per
  replica (chunked prefill, paged KV, preemption, least-outstanding-tokens routing);
- ``vllm-sr-sim``: ``vllm-sr-sim simulate --cdf azure_cdf.json --lam RATE --n-s REPLICAS --n-l 0
  --n-req REQUESTS`` (its bundled Azure length CDF), run as a subprocess; its CPU time is the child's
  user + system time minus a bare ``import`` of its package (start-up), reported separately.

Requests per CPU second for each (best of ``--repeat``) and the ratio leadscale / vllm-sr-sim. CPU
time, not wall time: the machine is shared. ``pip install vllm-sr-sim`` (the ``bench`` extra) for the
peer; without it only leadscale's number is printed.

    python benchmarks/bench_simulator.py                       # 100k requests, 10 replicas
    python benchmarks/bench_simulator.py --rate 300 --json     # a busier fleet
    python benchmarks/bench_simulator.py --growth              # CPU per request as requests and replicas grow
    python benchmarks/bench_simulator.py --jitter --requests 20000    # step jitter's cost, each engine
    python benchmarks/bench_simulator.py --week --requests 20000000 --rate 33   # a week, 20 M requests
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


JITTER_SIGMA = 0.25
"""``--jitter``: step-jitter tables from lognormal ratios of this sigma (decode steps' p90 about 1.3 of the
median, as vLLM's CPU build measured them; docs/real-vllm.md)."""


def bench_leadscale(requests: int, rate: float, replicas: int, profile: str, repeat: int,
                    engine: str = "compiled", jitter: bool = False) -> dict[str, float]:
    from dataclasses import replace

    from scaler.profiles import get_profile
    from simulator.engine import simulate
    from simulator.step_jitter import jitter_table
    from simulator.synthetic import builtin

    w = builtin("poisson", seed=0, rate=rate, duration=requests / rate)
    prof = get_profile(profile)
    if jitter:  # every step drawn from a table: decode runs summed step by step instead of in closed form
        table = jitter_table(np.exp(np.random.default_rng(0).normal(0.0, JITTER_SIGMA, 10_000)))
        prof = replace(prof, step_jitter=table, prefill_step_jitter=table)
    cpu = time.process_time()  # start-up: numba loads its cached machine code (or compiles, once per install)
    simulate(builtin("poisson", seed=0, rate=1.0, duration=5.0), prof, replicas=replicas, engine=engine)
    startup = time.process_time() - cpu
    best, summary = float("inf"), {}
    for _ in range(repeat):
        cpu = time.process_time()
        res = simulate(w, prof, replicas=replicas, engine=engine)
        best = min(best, time.process_time() - cpu)
        summary = res.summary()
    return {"requests": len(w), "cpu_s": best, "startup_cpu_s": startup, "requests_per_cpu_s": len(w) / best,
            "completed": summary["completed"], "ttft_p99": summary["ttft_p99"], "kv_usage_max": summary["kv_usage_max"],
            "simulated_s": summary["duration_s"]}


def _child_cpu(cmd: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench_vllm_sr_sim(requests: int, rate: float, replicas: int, repeat: int) -> dict[str, float] | None:
    # on PATH, or beside this interpreter (a venv's bin/ that is not activated)
    exe = shutil.which("vllm-sr-sim") or shutil.which("vllm-sr-sim", path=str(Path(sys.executable).parent))
    if exe is None:
        return None
    import fleet_sim  # the package vllm-sr-sim installs

    cdf = Path(fleet_sim.__file__).parent / "data" / "azure_cdf.json"
    cmd = [exe, "simulate", "--cdf", str(cdf), "--lam", str(rate), "--n-s", str(replicas), "--n-l", "0",
           "--n-req", str(requests), "--seed", "0"]
    startup = min(_child_cpu([sys.executable, "-c", "import fleet_sim.core, fleet_sim.optimizer"])
                  for _ in range(repeat))
    best = min(_child_cpu(cmd) for _ in range(repeat))
    cpu = max(best - startup, 1e-9)
    return {"requests": requests, "cpu_s": cpu, "startup_cpu_s": startup, "requests_per_cpu_s": requests / cpu}


def growth(args: argparse.Namespace) -> int:
    """CPU seconds per 100k requests as requests and replicas grow (flat = linear in requests)."""
    per = args.rate / args.replicas
    print(f"CPU s per 100k requests ({args.profile}; compiled / python engine)")
    for n in (args.requests // 4, args.requests, args.requests * 4):
        row = [bench_leadscale(n, args.rate, args.replicas, args.profile, 1, engine=e) for e in ("compiled", "python")]
        print(f"  {n:>8d} requests at {args.rate:g}/s on {args.replicas:>2d} replicas: "
              + " / ".join(f"{r['cpu_s'] / r['requests'] * 1e5:6.2f}" for r in row))
    for reps in (args.replicas // 2, args.replicas, args.replicas * 2, args.replicas * 4):
        row = [bench_leadscale(args.requests, per * reps, reps, args.profile, 1, engine=e)
               for e in ("compiled", "python")]
        print(f"  {args.requests:>8d} requests at {per * reps:g}/s on {reps:>2d} replicas: "
              + " / ".join(f"{r['cpu_s'] / r['requests'] * 1e5:6.2f}" for r in row))
    return 0


def week_one(args: argparse.Namespace) -> dict[str, Any]:
    """One long run in this process: ``--requests`` Poisson arrivals at ``--rate`` on ``--replicas``, the
    compiled engine, held in memory (``memory``: ``engine.simulate``) or streamed in one-hour chunks
    (``stream``: ``fast_stream.simulate_stream`` over ``builtin_chunks``); CPU seconds and peak RSS."""
    from scaler.profiles import get_profile
    from simulator.engine import simulate
    from simulator.fast_stream import simulate_stream
    from simulator.synthetic import builtin, builtin_chunks

    def rss_mib() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    prof = get_profile(args.profile)
    warm = builtin("poisson", seed=0, rate=1.0, duration=5.0)
    simulate(warm, prof, replicas=args.replicas, engine="compiled")
    simulate_stream([warm], prof, args.replicas)
    base = rss_mib()
    duration = args.requests / args.rate
    cpu = time.process_time()
    if args.week_one == "memory":
        w = builtin("poisson", seed=0, rate=args.rate, duration=duration)
        res = simulate(w, prof, replicas=args.replicas, engine="compiled")
        summary = res.summary()
    elif args.week_one == "file":
        from simulator.trace_stream import iter_trace

        summary = simulate_stream(iter_trace(args.week_file), prof, args.replicas).summary()
    else:
        run = simulate_stream(builtin_chunks("poisson", seed=0, span_s=3600.0, rate=args.rate, duration=duration),
                              prof, args.replicas)
        summary = run.summary()
    total_cpu = time.process_time() - cpu
    peak = rss_mib()
    return {"mode": args.week_one, "requests": summary["requests"], "simulated_days": summary["duration_s"] / 86400,
            "cpu_s": total_cpu, "requests_per_cpu_s": summary["requests"] / total_cpu, "rss_before_mib": base,
            "rss_peak_mib": peak, "bytes_per_request": (peak - base) * 2**20 / summary["requests"],
            "completed": summary["completed"], "ttft_p99": summary["ttft_p99"], "ttft_mean": summary["ttft_mean"]}


def week(args: argparse.Namespace) -> int:
    """The long run held in memory, streamed from the generator, and streamed from a trace file of the same
    requests (``simulate --stream``'s path), each in its own process (peak RSS is per process), side by
    side: CPU seconds (workload generation or file parsing included), peak RSS and their ratios."""
    import tempfile

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "week.csv"
        written_s = write_week(trace, args.requests, args.rate)
        for mode in ("memory", "stream", "file"):
            cmd = [sys.executable, __file__, "--week-one", mode, "--requests", str(args.requests), "--rate",
                   str(args.rate), "--replicas", str(args.replicas), "--profile", args.profile,
                   "--week-file", str(trace)]
            rows[mode] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        rows["file"]["trace_mib"], rows["file"]["trace_written_s"] = trace.stat().st_size / 2**20, written_s

    def added(row: dict[str, Any]) -> float:
        return max(row["rss_peak_mib"] - row["rss_before_mib"], 1e-9)

    m, st, f = rows["memory"], rows["stream"], rows["file"]
    out = {**rows, "stream_over_memory": {"cpu": st["cpu_s"] / m["cpu_s"], "rss_added": added(st) / added(m)},
           "file_over_memory": {"cpu": f["cpu_s"] / m["cpu_s"], "rss_added": added(f) / added(m)}}
    print(json.dumps(out, indent=1))
    return 0


def write_week(path: Path, requests: int, rate: float) -> float:
    """The streamed run's requests (``builtin_chunks``, the same draw) as a generic CSV trace, hour by hour;
    seconds spent writing (not part of any measured run)."""
    from simulator.synthetic import builtin_chunks

    started = time.perf_counter()
    with path.open("w") as out:
        out.write("arrival_s,input_tokens,output_tokens\n")
        for chunk in builtin_chunks("poisson", seed=0, span_s=3600.0, rate=rate, duration=requests / rate):
            np.savetxt(out, np.column_stack((chunk.arrival_s, chunk.input_tokens, chunk.output_tokens)),
                       fmt=("%.6f", "%d", "%d"), delimiter=",")
    return time.perf_counter() - started


def jitter_cost(args: argparse.Namespace) -> int:
    """Step jitter's cost: the same workload and profile with and without jitter tables, each engine, alternating
    (best of ``--repeat`` each), so both columns meet the same machine."""
    print(f"{args.requests} requests at {args.rate:g}/s on {args.replicas} replicas ({args.profile}), "
          f"step jitter sigma {JITTER_SIGMA}")
    for engine in ("compiled", "python"):
        plain = bench_leadscale(args.requests, args.rate, args.replicas, args.profile, args.repeat, engine)
        jittered = bench_leadscale(args.requests, args.rate, args.replicas, args.profile, args.repeat, engine, True)
        print(f"  {engine:9s} deterministic {plain['requests_per_cpu_s']:9.0f} req/CPU-s, jittered "
              f"{jittered['requests_per_cpu_s']:9.0f} req/CPU-s: {plain['cpu_s'] / jittered['cpu_s']:.2f}x "
              f"the speed (ttft p99 {plain['ttft_p99']:.3f} -> {jittered['ttft_p99']:.3f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=100.0, help="arrivals per second (default 100)")
    parser.add_argument("--replicas", type=int, default=10)
    parser.add_argument("--profile", default="h100-llama3-8b")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--growth", action="store_true",
                        help="how CPU time grows: x4 requests at a fixed load, then x2 replicas at a fixed load per "
                             "replica (both engines; no peer)")
    parser.add_argument("--week", action="store_true",
                        help="one long run (give --requests 20000000 --rate 33 for a week), held in memory, "
                             "streamed, and streamed from a CSV file of it (written to a temporary directory): CPU s "
                             "and peak RSS of each")
    parser.add_argument("--week-one", choices=("memory", "stream", "file"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--week-file", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--jitter", action="store_true",
                        help="what step jitter (a calibrated profile's step_jitter tables) costs, each engine")
    args = parser.parse_args(argv)
    if args.week_one:
        print(json.dumps(week_one(args)))
        return 0
    if args.week:
        return week(args)
    if args.growth:
        return growth(args)
    if args.jitter:
        return jitter_cost(args)
    ours = bench_leadscale(args.requests, args.rate, args.replicas, args.profile, args.repeat)
    ref = bench_leadscale(args.requests, args.rate, args.replicas, args.profile, args.repeat, engine="python")
    if (ours["completed"], ours["ttft_p99"]) != (ref["completed"], ref["ttft_p99"]):
        raise SystemExit(f"compiled and Python engines disagree: {ours} vs {ref}")
    peer = bench_vllm_sr_sim(args.requests, args.rate, args.replicas, args.repeat)
    out = {"leadscale": ours, "leadscale-python": ref, "vllm-sr-sim": peer,
           "ratio": ours["requests_per_cpu_s"] / peer["requests_per_cpu_s"] if peer else None,
           "ratio_python": ref["requests_per_cpu_s"] / peer["requests_per_cpu_s"] if peer else None,
           "setup": {"requests": args.requests, "rate": args.rate, "replicas": args.replicas, "profile": args.profile}}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{args.requests} requests at {args.rate:g}/s on {args.replicas} replicas ({args.profile})")
    print(f"  leadscale   {ours['requests_per_cpu_s']:10.0f} req/CPU-s  ({ours['cpu_s']:.2f} s after "
          f"{ours['startup_cpu_s']:.2f} s start-up; ttft p99 {ours['ttft_p99']:.3f} s, "
          f"kv max {ours['kv_usage_max']:.2f})")
    print(f"  (python)    {ref['requests_per_cpu_s']:10.0f} req/CPU-s  ({ref['cpu_s']:.2f} s: engine='python', "
          "the reference, same results)")
    if peer:
        print(f"  vllm-sr-sim {peer['requests_per_cpu_s']:10.0f} req/CPU-s  ({peer['cpu_s']:.2f} s after "
              f"{peer['startup_cpu_s']:.2f} s start-up)")
        print(f"  ratio       {out['ratio']:.2f}x  (python engine: {out['ratio_python']:.2f}x)")
    else:
        print("  vllm-sr-sim not installed (pip install vllm-sr-sim): no ratio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
