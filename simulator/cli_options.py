"""The flags several ``leadscale`` simulator commands share, declared once, typed by ``scaler.cli_types``.

``add_run_arguments``/``build_run_inputs``: workload, scaling, window, profile, SLO and seed (simulate,
compare, tune); the smaller groups (trace, SLO, seed, fleet bounds, jobs, cold start) are what replay,
capacity and advise take of them. A value a flag refuses names the flag, the value and what is allowed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

from scaler.cli_types import integer, positive, seconds
from simulator.coldstart import DEFAULT_SPEC as DEFAULT_COLD_START

DEFAULT_PROFILE = "h100-llama3-8b"
ArgumentGroup = argparse.ArgumentParser | argparse._ArgumentGroup
"""Where a flag is added: a parser or one of its groups."""


@dataclass(frozen=True)
class RunInputs:
    """What the shared flags resolve to."""

    workload: Any
    profile: Any
    slo_ttft_s: float
    slo_tpot_s: float
    seed: int


def _window(text: str) -> tuple[float, float | None]:
    start, sep, end = text.partition(":")
    try:
        a = float(start) if start else 0.0
        b = float(end) if end else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"--window {text!r}: expected START:END in seconds, e.g. 0:600") from None
    if not sep or not math.isfinite(a) or a < 0 or (b is not None and not (math.isfinite(b) and b > a)):
        raise argparse.ArgumentTypeError(f"--window {text!r}: expected START:END seconds with 0 <= START < END")
    return a, b


def add_bad_rows_argument(parser: ArgumentGroup) -> None:
    """``--bad-rows``: what a malformed trace row does (every command that reads ``--trace``)."""
    parser.add_argument("--bad-rows", choices=("fail", "skip"), default="fail",
                        help="a malformed trace row stops the command naming file, line and column (fail, the "
                             "default), or is left out and counted on stderr (skip)")


def load_trace_flags(args: argparse.Namespace, fmt: str | None, prog: str) -> Any:
    """The workload ``--trace``/``--bad-rows`` name; reports skipped malformed rows on stderr."""
    from simulator.readers import malformed_note
    from simulator.synthetic import load_workload

    w = load_workload(args.trace, fmt, seed=args.seed, bad_rows=args.bad_rows)
    note = malformed_note(w)
    if note:
        print(f"{prog}: {note}", file=sys.stderr)
    return w


def add_trace_arguments(g: ArgumentGroup) -> None:
    """``--trace``, ``--format``, ``--bad-rows``: which requests, read how."""
    g.add_argument("--trace", default=None, metavar="PATH|builtin:NAME",
                   help="trace file or builtin:NAME[?k=v&...] (default builtin:default)")
    g.add_argument("--format", default=None, help="trace format (default: detected): azure, mooncake, burstgpt, "
                   "generic, lengths")
    add_bad_rows_argument(g)


def add_slo_arguments(g: ArgumentGroup, tpot_default: float | None = 0.1, ttft_required: bool = False) -> None:
    """``--slo-ttft``/``--slo-tpot`` in seconds (TTFT default 2 unless required)."""
    if ttft_required:
        g.add_argument("--slo-ttft", type=seconds, required=True, metavar="S", help="TTFT SLO, seconds")
    else:
        g.add_argument("--slo-ttft", type=seconds, default=2.0, metavar="S", help="TTFT SLO, seconds (default 2)")
    shown = "optional" if tpot_default is None else f"default {tpot_default:g}"
    g.add_argument("--slo-tpot", type=seconds, default=tpot_default, metavar="S", help=f"TPOT SLO, seconds ({shown})")


def add_seed_argument(g: ArgumentGroup, what: str = "every random draw") -> None:
    g.add_argument("--seed", type=integer(0), default=0, help=f"seed of {what} (default 0)")


def add_profile_argument(g: ArgumentGroup) -> None:
    g.add_argument("--profile", default=DEFAULT_PROFILE, metavar="NAME|PATH",
                   help=f"performance profile name (leadscale profiles) or YAML file (default {DEFAULT_PROFILE})")


def add_cold_start_argument(g: ArgumentGroup) -> None:
    g.add_argument("--cold-start", default=DEFAULT_COLD_START,
                   help="cold-start spec: fixed:S, uniform:A,B, lognormal:p50=A,p90=B, empirical:[...]|FILE "
                        f"(default {DEFAULT_COLD_START})")


def add_fleet_bounds(g: ArgumentGroup) -> None:
    """``--min-replicas``/``--max-replicas``: the ScaledObject's bounds (``check_fleet_bounds`` relates them)."""
    g.add_argument("--min-replicas", type=integer(0), default=1, help="minReplicaCount (default 1)")
    g.add_argument("--max-replicas", type=integer(1), default=100, help="maxReplicaCount (default 100)")


def check_fleet_bounds(args: argparse.Namespace) -> None:
    if args.max_replicas < args.min_replicas:
        raise ValueError(f"--max-replicas {args.max_replicas}: must be >= --min-replicas ({args.min_replicas})")


def add_jobs_argument(g: ArgumentGroup) -> None:
    g.add_argument("--jobs", type=integer(0), default=0, help="parallel processes (default 0: one per core)")


def jobs_or_cores(jobs: int) -> int:
    """``--jobs``: as given, or 0 for one process per core this process may run on (a container's share)."""
    if jobs > 0:
        return jobs
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload, profile, SLO and seed flags shared by simulate, compare and tune."""
    g = parser.add_argument_group("workload, model and SLO")
    add_trace_arguments(g)
    g.add_argument("--window", type=_window, default=None, metavar="START:END",
                   help="keep arrivals in [START, END) seconds from the first one")
    g.add_argument("--duration", type=seconds, default=None, metavar="S", help="keep the first S seconds")
    g.add_argument("--rate-scale", type=positive, default=1.0, metavar="K",
                   help="compress time by K (same requests, K times faster, duration / K)")
    g.add_argument("--load-scale", type=positive, default=1.0, metavar="K",
                   help="K times the requests over the same duration and shape")
    add_profile_argument(g)
    add_slo_arguments(g)
    add_seed_argument(g)


def build_run_inputs(args: argparse.Namespace) -> RunInputs:
    """Resolve the shared flags; bad values raise ValueError/KeyError naming the flag and value."""
    import numpy as np

    from scaler.profiles import get_profile
    from simulator import workload as wl

    profile = get_profile(args.profile)
    w = load_trace_flags(args, args.format, "leadscale")
    if args.window is not None:
        w = wl.select_window(w, args.window[0], args.window[1])
    if args.duration is not None:
        w = wl.select_window(w, 0.0, args.duration)
    if args.rate_scale != 1.0:
        w = wl.rate_scale(w, args.rate_scale)
    if args.load_scale != 1.0:
        w = wl.load_scale(w, args.load_scale, np.random.default_rng([args.seed, 2]))
    if len(w) == 0:
        raise ValueError(f"workload {w.name!r}: no requests left after --window/--duration/--load-scale")
    return RunInputs(workload=w, profile=profile, slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot, seed=args.seed)


