"""``leadscale replay``, ``calibrate`` and ``capacity``: the simulator meets real vLLM endpoints.

Heavy imports (httpx, the simulator) stay inside the run functions so ``leadscale --help`` is fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any


def _add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", default=None,
                        help="trace file or builtin:NAME[?k=v&...] (default: builtin:default)")
    parser.add_argument("--format", dest="fmt", default=None, help="trace format (default: detected)")
    parser.add_argument("--seed", type=int, default=0, help="seed for synthetic workloads and prompt words")


def _add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", action="append", required=True, metavar="URL",
                        help="base URL of an OpenAI-compatible server (repeat for several replicas)")
    parser.add_argument("--model", default=None, help="served model name (default: the first of /v1/models)")
    parser.add_argument("--api", choices=("completions", "chat"), default="completions")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiply trace times by this (0.5 replays twice as fast)")
    parser.add_argument("--start", type=float, default=0.0, help="skip trace requests before this second")
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--max-concurrency", type=int, default=256, help="requests in flight at most")
    parser.add_argument("--routing", choices=("round-robin", "least-outstanding"), default="round-robin")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--metrics-interval", type=float, default=1.0, help="seconds between /metrics scrapes")
    parser.add_argument("--slo-ttft", type=float, default=2.0)
    parser.add_argument("--slo-tpot", type=float, default=0.2)


def replay_config(args: argparse.Namespace) -> Any:
    """A ``ReplayConfig`` from parsed flags (ValueError naming the field on bad values)."""
    from simulator.replay import ReplayConfig

    return ReplayConfig(
        endpoints=tuple(e.rstrip("/") for e in args.endpoint), model=args.model, api=args.api,
        time_scale=args.time_scale, start_s=args.start, max_requests=args.max_requests,
        max_concurrency=args.max_concurrency, routing=args.routing, timeout_s=args.timeout,
        metrics_interval_s=args.metrics_interval, slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot,
        seed=args.seed)


def load_trace_arg(args: argparse.Namespace) -> Any:
    from simulator.synthetic import load_workload

    return load_workload(args.trace, args.fmt, args.seed)


def run_replay(args: argparse.Namespace) -> int:
    from simulator.replay import Replayer

    try:
        config = replay_config(args)
        workload = load_trace_arg(args)
    except (ValueError, OSError) as exc:
        print(f"leadscale replay: {exc}", file=sys.stderr)
        return 2
    replayer = Replayer(config, Path(args.out))
    try:
        summary = asyncio.run(replayer.run(workload.arrival_s, workload.input_tokens, workload.output_tokens))
    except KeyboardInterrupt:
        print(f"interrupted: partial results in {args.out}", file=sys.stderr)
        return 130
    except Exception as exc:  # a setup failure (no server, bad tokenizer) ends with its reason
        print(f"leadscale replay: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    replay = subparsers.add_parser("replay", help="replay a trace against real OpenAI-compatible endpoints",
                                   description="Send a trace's requests at their times to vLLM endpoints and "
                                               "measure TTFT, ITL, E2E and throughput; writes DIR/summary.json.")
    _add_trace_arguments(replay)
    _add_replay_arguments(replay)
    replay.add_argument("--out", required=True, metavar="DIR", help="output folder")
    replay.set_defaults(func=run_replay)
