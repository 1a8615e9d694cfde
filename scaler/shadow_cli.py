"""``leadscale shadow``: what the scaler would have answered over a model's Prometheus history.

Before a team hands a GPU fleet to a scaler it wants to see it decide on its own traffic. This reads the
same signals ``leadscale serve`` reads, over a past window (``PrometheusSource.history``), replays the live
decision over them (``scaler.warmup.decisions``: the very step the scaler takes, not a model of it), and
writes every decision with all its terms beside the replicas that actually served. The fleet in the history
is the one your current autoscaler chose, so this shows what leadscale would have *asked for* at each
moment, not what would have followed from it (``leadscale advise`` simulates that).

    leadscale shadow --prometheus-url http://prometheus:9090 --metadata model=llama3-8b \\
        --metadata prefillTokensPerSecond=9000 --since 21600 --out shadow.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from scaler import evaluation, warmup
from scaler.cli_types import number
from scaler.limits import Limit
from scaler.metadata import MetadataError, parse_metadata
from scaler.sources.base import SourceError
from scaler.sources.prometheus import MAX_HISTORY_POINTS


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: must be KEY=VALUE, a trigger metadata entry")
    return key, value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``shadow`` subcommand."""
    parser = subparsers.add_parser(
        "shadow", help="replay the scaler's decisions over a model's Prometheus history (what it would have asked)",
        description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus-url", required=True, help="the Prometheus the scaler would read")
    parser.add_argument("--metadata", type=_pair, action="append", default=[], metavar="KEY=VALUE",
                        help="the ScaledObject trigger's metadata, as KEDA sends it (repeat; model= is required)")
    parser.add_argument("--namespace", default="default", help="the ScaledObject's namespace")
    parser.add_argument("--since", type=number(Limit(0.0, 7 * 86_400.0, low_open=True), "seconds"),
                        default=3600.0, help="how far back the window starts, seconds (default 3600)")
    parser.add_argument("--until", type=number(Limit(0.0, low_open=True), "Unix seconds"), default=None,
                        help="the window's end, Unix seconds (default now)")
    parser.add_argument("--step", type=number(Limit(1.0, 3600.0), "seconds"), default=warmup.SPACING_S,
                        help=f"seconds between decisions (default {warmup.SPACING_S:g}, the policy's history spacing)")
    parser.add_argument("--out", type=Path, default=Path("shadow.csv"), help="CSV of every decision and its terms")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scaler.sources.prometheus import PrometheusSource

    try:
        config = parse_metadata(dict(args.metadata))
    except MetadataError as exc:
        print(f"leadscale shadow: --metadata: {exc}", file=sys.stderr)
        return 2
    end = float(args.until) if args.until is not None else time.time()
    points = int(args.since // args.step) + 1
    if points > MAX_HISTORY_POINTS:
        print(f"leadscale shadow: --since {args.since:g} / --step {args.step:g} is {points} decisions; at most "
              f"{MAX_HISTORY_POINTS} (Prometheus's limit on a range query): raise --step", file=sys.stderr)
        return 2
    target = config.target(args.namespace)
    source = PrometheusSource(args.prometheus_url, timeout_s=10.0)
    history = source.history([target], end - (points - 1) * args.step, end, args.step)
    how = warmup.Replay(config, f"Prometheus {args.prometheus_url}", evaluation.DEFAULT_STALENESS_LIMIT_S)
    made = list(warmup.decisions(how, warmup.snapshots_of(history, target, None)))
    if not made:
        reasons = {str(answers[target]) for _, answers in history if isinstance(answers[target], SourceError)}
        print(f"leadscale shadow: no decision in {len(history)} instants; the source said: "
              + "; ".join(sorted(reasons)[:3]), file=sys.stderr)
        return 1
    write_csv(args.out, made)
    print(summary(made, len(history), args.step))
    print(f"every decision and its terms: {args.out}")
    return 0


def write_csv(path: Path, made: list[tuple[float, evaluation.Held]]) -> None:
    """One row per decision: time, desired replicas, the reason, then every term."""
    first = made[0][1].decision
    assert first is not None
    terms = [k for k in first.terms if k != "desired_replicas"]  # written first, as a whole number
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["t", "desired_replicas", "reason", *terms])
        for at, held in made:
            d = held.decision
            assert d is not None
            writer.writerow([f"{at:.3f}", int(d.desired_replicas), d.reason, *(d.terms.get(k) for k in terms)])


def summary(made: list[tuple[float, evaluation.Held]], instants: int, step_s: float) -> str:
    """The fleet that ran against the one leadscale would have asked for, over the decisions made."""
    ran = [float(h.decision.terms["ready_replicas"]) for _, h in made if h.decision is not None]
    asked = [float(h.decision.desired_replicas) for _, h in made if h.decision is not None]
    hours = len(made) * step_s / 3600.0
    above = sum(a > r for a, r in zip(asked, ran, strict=True)) / len(made)
    below = sum(a < r for a, r in zip(asked, ran, strict=True)) / len(made)
    last = made[-1][1].decision
    return "\n".join([
        f"decisions: {len(made)} of {instants} instants, every {step_s:g} s ({hours:.2f} h)",
        f"replicas that served: mean {sum(ran) / len(ran):.2f}, {sum(ran) * step_s / 3600:.2f} replica-hours",
        f"leadscale would have asked: mean {sum(asked) / len(asked):.2f}, {sum(asked) * step_s / 3600:.2f} "
        f"replica-hours; more than served {above:.0%} of the time, fewer {below:.0%}",
        f"last decision: {last.desired_replicas if last else '-'} ({last.reason if last else '-'})",
    ])

