"""``leadscale simulate`` and ``leadscale profiles``: run a workload through simulated vLLM replicas.

The flags it shares with ``compare``, ``tune`` and ``replay`` are declared in ``simulator.cli_options``.

Examples::

    leadscale simulate --replicas 4 --json                         # builtin:default workload
    leadscale simulate --trace ../shared/traces/azure_conv_2023.csv --window 0:600 --rate-scale 2 \\
        --profile a100-llama3-8b --replicas 3 --out runs/azure
    leadscale simulate --policy leadscale --cold-start lognormal:p50=120,p90=240
    leadscale profiles --json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from scaler.cli_types import integer, seconds
from simulator.cli_options import RunInputs, add_cold_start_argument, add_run_arguments, build_run_inputs


def register(subparsers: Any) -> None:
    sim = subparsers.add_parser("simulate", help="replay a workload on simulated vLLM replicas",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(sim)
    sim.add_argument("--replicas", type=integer(1), default=1, help="fixed fleet size (default 1)")
    sim.add_argument("--router", default="auto", help="auto (default: prefix when the trace names prefix blocks, "
                     "else least-tokens), least-tokens, prefix, round-robin or random")
    sim.add_argument("--policy", default=None, help="autoscale with this policy (e.g. leadscale) instead of "
                     "a fixed fleet")
    add_cold_start_argument(sim)
    sim.add_argument("--stream", action="store_true",
                     help="read the workload chunk by chunk (a time-ordered trace file, or a builtin hour by hour) "
                     "and simulate it with memory bounded by the requests in flight: for week-long traces; a "
                     "fixed fleet only, percentiles from 1%%-wide bins, --out writes summary.json only")
    sim.add_argument("--out", default=None, metavar="DIR", help="write summary.json, requests.csv, kv_usage.csv")
    sim.add_argument("--json", action="store_true", help="print the summary as one JSON object (no progress bar)")
    sim.set_defaults(func=run_simulate)
    prof = subparsers.add_parser("profiles", help="list the built-in performance profiles")
    prof.add_argument("--json", action="store_true", help="print every profile as JSON")
    prof.add_argument("--slo-ttft", type=seconds, default=2.0, help="TTFT SLO for the capacity column (s)")
    prof.set_defaults(func=run_profiles)


def run_simulate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from simulator.results import dumps

    try:
        if args.replicas < 1:
            raise ValueError(f"--replicas {args.replicas}: must be >= 1")
        result = None
        if args.stream:
            summary = _streamed(args)
        elif args.policy:
            summary = _autoscaled(args, inputs := build_run_inputs(args))
        else:
            result = _fixed(args, inputs := build_run_inputs(args))
            summary = result.summary(inputs.slo_ttft_s, inputs.slo_tpot_s, workload=inputs.workload.name,
                                     replicas=args.replicas, router=_router_name(args.router, inputs),
                                     seed=inputs.seed)
    except (ValueError, KeyError, OSError) as exc:
        print(f"leadscale simulate: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2
    if args.out:
        out = Path(args.out)
        if result is not None:
            result.write(out, summary)
        else:
            out.mkdir(parents=True, exist_ok=True)
            (out / "summary.json").write_text(dumps(summary) + "\n")
    if args.json:
        print(json.dumps(summary, allow_nan=False))
    else:
        for key, value in summary.items():
            print(f"{key:28s} {value:.4g}" if isinstance(value, float) else f"{key:28s} {value}")
    return 0


def _router_name(name: str, inputs: RunInputs) -> str:
    """The router ``auto`` resolves to (what the summary reports)."""
    if name != "auto":
        return name
    return "prefix" if inputs.workload.block_ids is not None else "least-tokens"


def _fixed(args: argparse.Namespace, inputs: RunInputs) -> Any:
    from simulator.engine import simulate

    bar = None
    if not args.json:
        from tqdm import tqdm

        bar = tqdm(total=len(inputs.workload), unit="req", file=sys.stderr, leave=False, mininterval=0.5)

    def progress(done: int) -> None:
        if bar is not None:
            bar.update(done - bar.n)

    try:
        return simulate(inputs.workload, inputs.profile, replicas=args.replicas, router=args.router,
                        seed=inputs.seed, progress=progress)
    finally:
        if bar is not None:
            bar.close()


def _streamed(args: argparse.Namespace) -> dict[str, Any]:
    """``--stream``: the workload's chunks through ``fast_stream.simulate_stream``, never held whole."""
    from scaler.profiles import get_profile
    from simulator import synthetic, trace_stream
    from simulator.fast_engine import FAST_ROUTERS
    from simulator.fast_stream import simulate_stream

    if args.policy:
        raise ValueError(f"--stream with --policy {args.policy!r}: the autoscaled loop is not streamed; "
                         "drop one of them")
    if args.load_scale != 1.0:
        raise ValueError(f"--stream with --load-scale {args.load_scale:g}: its copies are drawn over the whole "
                         "trace; use --rate-scale, or drop --stream")
    router = "least-tokens" if args.router == "auto" else args.router
    if router not in FAST_ROUTERS:
        raise ValueError(f"--stream with --router {args.router!r}: allowed {', '.join(FAST_ROUTERS)} or auto")
    profile = get_profile(args.profile)
    counts = trace_stream.StreamCounts()
    if args.trace is None or args.trace.startswith(synthetic.PREFIX):
        name, params = synthetic.parse_spec(args.trace or "builtin:default")
        if args.format not in (None, "builtin"):
            raise ValueError(f"--format {args.format!r} does not apply to a builtin workload")
        chunks = synthetic.builtin_chunks(name, args.seed, span_s=3600.0, **params)
        label = synthetic.PREFIX + name
    else:
        chunks = trace_stream.iter_trace(args.trace, args.format, bad_rows=args.bad_rows, counts=counts)
        label = args.trace
    start, end = args.window if args.window is not None else (0.0, None)
    if args.duration is not None:
        end = start + args.duration if end is None else min(end, start + args.duration)
    selected = trace_stream.select_stream(chunks, start, end, args.rate_scale, counts)
    bar = None
    if not args.json:
        from tqdm import tqdm

        bar = tqdm(unit="req", file=sys.stderr, leave=False, mininterval=0.5)

    def progress(done: int) -> None:
        if bar is not None:
            bar.update(done - bar.n)

    try:
        run = simulate_stream(selected, profile, args.replicas, slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot,
                              router=router, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    if counts.malformed.count:
        print(f"leadscale: {label}: skipped {counts.malformed.count} malformed row(s) (--bad-rows skip); the "
              f"first: {counts.malformed.first}", file=sys.stderr)
    return run.summary(args.slo_ttft, args.slo_tpot, workload=label, replicas=args.replicas, router=router,
                       seed=args.seed, streamed=True, skipped_rows=counts.skipped_rows,
                       malformed_rows=counts.malformed.count)


def _autoscaled(args: argparse.Namespace, inputs: RunInputs) -> dict[str, Any]:
    try:
        from simulator.autoscale import run_autoscaled
    except ImportError as exc:
        raise ValueError(f"--policy {args.policy!r}: autoscaling is not available in this build ({exc})") from None
    result = run_autoscaled(inputs.workload, inputs.profile, args.policy, args.cold_start, inputs.slo_ttft_s,
                            inputs.seed)
    summary = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in result.summary.items()}
    return {**summary, "policy": args.policy, "workload": inputs.workload.name, "seed": inputs.seed}


def run_profiles(args: argparse.Namespace) -> int:
    from scaler.profiles import get_profile, list_profiles

    rows = []
    for name in list_profiles():
        p = get_profile(name)
        cap = p.capacity(args.slo_ttft)
        rows.append({**p.to_dict(), "kv_cache_tokens": p.memory.kv_cache_tokens,
                     "capacity": {"ttft_slo_s": args.slo_ttft, "prefill_tokens_per_s": round(cap.prefill_tokens_per_s),
                                  "decode_tokens_per_s": round(cap.decode_tokens_per_s)}})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'name':22s} {'gpu':5s} {'tp':>2s} {'seqs':>5s} {'budget':>6s} {'kv blocks':>9s} {'decode 1 (ms)':>13s} "
          f"{'prefill tok/s':>13s} {'decode tok/s':>12s}")
    for row, name in zip(rows, list_profiles(), strict=True):
        p = get_profile(name)
        print(f"{name:22s} {p.gpu:5s} {p.tensor_parallel:2d} {p.max_num_seqs:5d} {p.max_num_batched_tokens:6d} "
              f"{p.num_gpu_blocks:9d} {p.step_time.step_time(1, 1, 1024, 0) * 1e3:13.2f} "
              f"{row['capacity']['prefill_tokens_per_s']:13d} {row['capacity']['decode_tokens_per_s']:12d}")
    print(f"(capacity at TTFT SLO {args.slo_ttft:g} s; --json for every parameter and its source)")
    return 0
