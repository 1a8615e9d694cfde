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

from scaler.cli_types import count, number, positive, seconds
from scaler.limits import Limit
from simulator.cli_options import (
    add_seed_argument,
    add_slo_arguments,
    add_trace_arguments,
    load_trace_flags,
)
from simulator.step_log import MIN_STEPS, STEP_TIME_METHODS


def _add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    add_trace_arguments(parser)
    add_seed_argument(parser, "synthetic workloads and prompt words")


def _add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", action="append", required=True, metavar="URL",
                        help="base URL of an OpenAI-compatible server (repeat for several replicas)")
    parser.add_argument("--model", default=None, help="served model name (default: the first of /v1/models)")
    parser.add_argument("--api", choices=("completions", "chat"), default="completions")
    parser.add_argument("--time-scale", type=positive, default=1.0,
                        help="multiply trace times by this (0.5 replays twice as fast)")
    parser.add_argument("--start", type=number(Limit(0.0), "seconds"), default=0.0,
                        help="skip trace requests before this second")
    parser.add_argument("--max-requests", type=count, default=None, help="replay at most this many requests")
    _add_client_arguments(parser)
    add_slo_arguments(parser, tpot_default=0.2)
    parser.add_argument("--extra-body", default=None, metavar="JSON",
                        help='fields added to every request, e.g. \'{"stream_interval": 16}\' (vLLM: a chunk per 16 '
                             "tokens, less frontend work; ITL is then per chunk)")


def _add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """How the load generator talks to the endpoints (replay and capacity alike)."""
    parser.add_argument("--max-concurrency", type=count, default=256, help="requests in flight at most")
    parser.add_argument("--routing", choices=("round-robin", "least-outstanding"), default="round-robin")
    parser.add_argument("--timeout", type=seconds, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--metrics-interval", type=seconds, default=1.0, help="seconds between /metrics scrapes")


def _extra_body(text: str | None) -> tuple[tuple[str, Any], ...]:
    if not text:
        return ()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--extra-body={text!r}: not JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"--extra-body={text!r}: must be a JSON object")
    return tuple(sorted(value.items()))


def replay_config(args: argparse.Namespace) -> Any:
    """A ``ReplayConfig`` from parsed flags (ValueError naming the field on bad values)."""
    from simulator.replay import ReplayConfig

    return ReplayConfig(
        endpoints=tuple(e.rstrip("/") for e in args.endpoint), model=args.model, api=args.api,
        time_scale=args.time_scale, start_s=args.start, max_requests=args.max_requests,
        max_concurrency=args.max_concurrency, routing=args.routing, timeout_s=args.timeout,
        metrics_interval_s=args.metrics_interval, slo_ttft_s=args.slo_ttft,
        slo_tpot_s=args.slo_tpot if args.slo_tpot is not None else 0.2,
        seed=args.seed, extra_body=_extra_body(getattr(args, "extra_body", None)))


def load_trace_arg(args: argparse.Namespace) -> Any:
    return load_trace_flags(args, args.format, "leadscale")


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


def run_calibrate(args: argparse.Namespace) -> int:
    """Fit a profile to ``--replay`` (or take ``--check PROFILE``) and print the fidelity table."""
    from scaler.profiles import get_profile, save_profile
    from simulator import calibrate

    if args.check and args.steps:
        print("leadscale calibrate: --steps feeds the fit; --check compares an existing profile without one",
              file=sys.stderr)
        return 2
    try:
        measured = calibrate.with_steps(calibrate.load_replay(args.replay), args.steps)
        if args.check:
            profile = get_profile(args.check)
        else:
            profile = calibrate.fit(measured, args.max_num_seqs, args.max_num_batched_tokens, args.max_evals,
                                    step_time=args.step_time)
    except (ValueError, KeyError, OSError) as exc:
        print(f"leadscale calibrate: {exc}", file=sys.stderr)
        return 2
    if not args.check:
        out = Path(args.out)
        save_profile(profile, out)
        print(f"profile written to {out} (use it as --profile {out})")
    rows = calibrate.fidelity(measured, calibrate.simulate_replay(profile, measured))
    print(f"{'checked' if args.check else 'calibrated'} on {args.replay} ({len(measured.workload)} requests); "
          f"profile {profile.name}: {profile.step_time.to_dict()}")
    if not args.check:
        print(profile.source)
    print(calibrate.format_table(rows))
    if args.json:
        print(json.dumps([dict(zip(("metric", "measured", "simulated", "rel_error"), r, strict=True)) for r in rows]))
    return 0


def run_capacity(args: argparse.Namespace) -> int:
    """Sweep load on one replica (endpoint or profile) and report the knee within the SLO."""
    from simulator import capacity

    try:
        config = capacity.SweepConfig(slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot, percentile=args.percentile,
                                      start_rate=args.start_rate, factor=args.factor, max_steps=args.max_steps,
                                      requests=args.requests, seed=args.seed)
        workload = load_trace_arg(args)
        if args.profile:
            from scaler.profiles import get_profile

            runner = capacity.profile_runner(get_profile(args.profile), config)
        else:
            args.max_requests, args.time_scale, args.start = None, 1.0, 0.0
            runner = capacity.endpoint_runner(replay_config(args), Path(args.out) / "steps")
    except (ValueError, KeyError, OSError) as exc:
        print(f"leadscale capacity: {exc}", file=sys.stderr)
        return 2

    def log(step: Any) -> None:
        ttft = "-" if step.ttft is None else f"{step.ttft:.3f}"
        print(f"{step.rate:8.3g} req/s  prompt {step.prompt_tokens_per_s:9.1f} tok/s  generated "
              f"{step.generation_tokens_per_s:9.1f} tok/s  TTFT p{config.percentile} {ttft:>8} s  "
              f"{'meets' if step.meets_slo else 'MISSES'} the SLO", file=sys.stderr)

    try:
        steps = capacity.sweep(runner, workload.input_tokens, workload.output_tokens, config, log)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a dead endpoint or a bad tokenizer ends the sweep with its reason
        print(f"leadscale capacity: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = capacity.report(steps, config)
    (out / "capacity.json").write_text(json.dumps(result, indent=2) + "\n")
    capacity.plot(steps, config, str(out / "knee.png"))
    print(json.dumps({"knee": result["knee"], "scaler_metadata": result["scaler_metadata"]}, indent=2))
    return 0 if result["knee"] else 1


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    replay = subparsers.add_parser("replay", help="replay a trace against real OpenAI-compatible endpoints",
                                   description="Send a trace's requests at their times to vLLM endpoints and "
                                               "measure TTFT, ITL, E2E and throughput; writes DIR/summary.json.")
    _add_trace_arguments(replay)
    _add_replay_arguments(replay)
    replay.add_argument("--out", required=True, metavar="DIR", help="output folder")
    replay.set_defaults(func=run_replay)

    cal = subparsers.add_parser("calibrate", help="fit a performance profile to a replay; print the fidelity table",
                                description="Fit the simulator's step-time model and scheduler limits to a replay "
                                            "(leadscale replay --out DIR), write a profile YAML, simulate the same "
                                            "requests with it and compare. --check PROFILE compares an existing "
                                            "profile with a (different) replay instead of fitting.")
    cal.add_argument("--replay", required=True, metavar="DIR", help="a replay output folder")
    cal.add_argument("--out", default="profile.yaml", help="where to write the fitted profile (default profile.yaml)")
    cal.add_argument("--check", default=None, metavar="PROFILE", help="only compare this profile with the replay")
    cal.add_argument("--max-num-seqs", type=count, default=None, help="the server's --max-num-seqs (default: inferred)")
    cal.add_argument("--max-num-batched-tokens", type=count, default=None,
                     help="the server's --max-num-batched-tokens (default: inferred upper bound)")
    cal.add_argument("--max-evals", type=count, default=120, help="simulations the fit may run (default 120)")
    cal.add_argument("--step-time", choices=STEP_TIME_METHODS, default="auto",
                     help="fit the step time on the replay's timed engine steps (steps.csv, written by an "
                          f"in-process run) or on its simulated outcomes; auto: the steps when there are at least "
                          f"{MIN_STEPS} (default auto)")
    cal.add_argument("--steps", action="append", default=[], metavar="FILE",
                     help="more timed steps of the same replica and scheduler settings (a steps.csv, e.g. from a "
                          "capacity sweep of the replay's own requests), pooled with the replay's for the step-time "
                          "fit: batches the replay never ran are then measured, not extrapolated; repeatable. "
                          "Steps timed in another run come from an engine that may have run at another speed: "
                          "pooled, they were not better on the whole where that drifted (docs/real-vllm.md, "
                          "seventh run)")
    cal.add_argument("--json", action="store_true", help="also print the table as JSON")
    cal.set_defaults(func=run_calibrate)

    cap = subparsers.add_parser("capacity", help="a single replica's capacity within the SLO (load sweep, knee)",
                                description="Replay a trace's length mix at rising Poisson rates against one "
                                            "endpoint (--endpoint) or one simulated replica (--profile); report the "
                                            "highest prompt and generated tokens/s within the SLO and plot the knee.")
    _add_trace_arguments(cap)
    target = cap.add_mutually_exclusive_group(required=True)
    target.add_argument("--endpoint", action="append", metavar="URL", help="one vLLM replica's base URL")
    target.add_argument("--profile", metavar="NAME|PATH", help="a performance profile (simulated)")
    add_slo_arguments(cap, tpot_default=None, ttft_required=True)
    cap.add_argument("--percentile", type=int, choices=(50, 90, 95, 99), default=90,
                     help="SLO percentile (default 90)")
    cap.add_argument("--start-rate", type=positive, default=0.5, help="first offered load, requests/s")
    cap.add_argument("--factor", type=number(Limit(1.0, low_open=True)), default=1.5,
                     help="load multiplier between steps")
    cap.add_argument("--max-steps", type=count, default=10, help="load steps at most (default 10)")
    cap.add_argument("--requests", type=count, default=60, help="requests per step")
    cap.add_argument("--model", default=None)
    cap.add_argument("--api", choices=("completions", "chat"), default="completions")
    _add_client_arguments(cap)
    cap.add_argument("--out", default="capacity", metavar="DIR", help="capacity.json, knee.png (default ./capacity)")
    cap.set_defaults(func=run_capacity)
