"""What a restarted scaler knew, relearned from Prometheus's history before it decides alone.

The policy learns as it runs: an hour of demand and KV samples sets its headroom bands, rate windows
judged late or calm set the efficiency (how much of its modelled capacity a replica delivers), the
last minutes of recommendations hold a scale-down. A new process knows none of it. Without this, a
scaler restarted under a workload whose replicas deliver 60 % of the model would size the fleet for
100 % once its first minutes' floor (never below the fleet) lapses, and relearn the rest through
late first tokens: a restart would move a GPU fleet on a default.

Prometheus keeps what the policy read. So the first time the evaluator sees an object whose source
keeps history (``PrometheusSource.history``), it replays ``evaluation.step`` over the last ``span_s``
of it, one snapshot per ``policy.HISTORY_SPACING_S`` (every sample the bands read), and the state
that replay ends in takes the place of the one the object started from. The same step as every live
decision: a scaler that restarts decides as one that never stopped would have, to the resolution of
that spacing, on whatever history Prometheus still holds.

What Prometheus cannot say is left as a live scaler would have seen it *now*: the measured cold starts
and lead time, and the ScaledObject's bounds (``Replay.current``); pods that were starting then are not
known (Prometheus sees only serving ones), as for a scaler without ``--kubernetes``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from scaler import evaluation, policy
from scaler.metadata import ScalerConfig
from scaler.signals import Signals
from scaler.sources.base import SourceError, Target

DEFAULT_SPAN_S = 3600.0
"""How much history a new object replays (``leadscale serve --warm-up``): the headroom's history, an hour."""
SPACING_S = policy.HISTORY_SPACING_S
TARGETS_PER_READ = 32
"""Objects whose history one ``history`` call reads: an hour of a histogram's buckets for a thousand models
at once would be a response of a hundred megabytes."""

Snapshot = tuple[float, Signals | SourceError | None, Signals | SourceError | None]
"""(instant, the object's own answer, the route's answer or None when it is no route member)."""


@dataclass(frozen=True)
class Replay:
    """What one object's replay needs besides its snapshots."""

    config: ScalerConfig
    where: str
    staleness_limit_s: float
    bounds: tuple[int | None, int | None] = (None, None)
    """The ScaledObject's min/max replicas as the Kubernetes observer sees them now (None: not known)."""
    current: Signals | None = None
    """A snapshot merged with the Kubernetes observer's view now: its measured cold starts and lead time are
    used throughout (the observer keeps no history)."""
    route_label: str = ""


@dataclass(frozen=True)
class Replayed:
    """The state a replay ended in, and how much history stood behind it."""

    held: evaluation.Held
    used: int
    """Snapshots decided on (the others were errors, stale or before the data began)."""
    offered: int
    last_at: float
    """The last instant decided on (-inf when none was)."""


def window(now: float, span_s: float, spacing_s: float = SPACING_S) -> tuple[float, float]:
    """(start, end) of the instants to replay: ``span_s`` back from ``now``, on ``spacing_s`` steps ending at it."""
    if not (math.isfinite(now) and math.isfinite(span_s) and span_s > 0 and spacing_s > 0):
        raise ValueError(f"warm-up window now={now!r}, span_s={span_s!r}, spacing_s={spacing_s!r}: want finite "
                         "numbers, span_s and spacing_s > 0")
    steps = max(int(span_s // spacing_s), 1)
    return now - steps * spacing_s, now


def replay(how: Replay, snapshots: Sequence[Snapshot], held: evaluation.Held | None = None) -> Replayed:
    """Fold ``evaluation.step`` over ``snapshots`` (oldest first) from ``held`` (a new object's by default).

    A snapshot a live round would have skipped (an error, stale data, engine limits missing) is skipped
    here too, and the state carries on, as it would have."""
    final = held if held is not None else evaluation.Held()
    used, last_at = 0, -math.inf
    for at, after in decisions(how, snapshots, final):
        used, last_at, final = used + 1, at, after
    return Replayed(final, used, len(snapshots), last_at)


def decisions(how: Replay, snapshots: Sequence[Snapshot],
              held: evaluation.Held | None = None) -> Iterator[tuple[float, evaluation.Held]]:
    """Every decision the replay makes, as ``(instant, state after it)``: what a scaler would have answered at
    each instant it could decide (``leadscale shadow`` writes them out; ``replay`` keeps the last)."""
    state = held if held is not None else evaluation.Held()
    for at, own, route in snapshots:
        try:
            signals, whole = evaluation.inputs(own, route, how.staleness_limit_s, how.route_label)
            state = evaluation.step(how.config, state, _as_now(signals, how.current), at, how.bounds, how.where,
                                    whole)
        except evaluation.Skipped:
            continue
        yield at, state


def _as_now(signals: Signals, current: Signals | None) -> Signals:
    """``signals`` with the cold starts and lead time measured now (Prometheus keeps neither)."""
    if current is None:
        return signals
    return dataclasses.replace(signals, lead_time_s=current.lead_time_s, cold_starts_s=current.cold_starts_s)


def snapshots_of(history: list[tuple[float, dict[Target, Signals | SourceError]]], target: Target,
                 route_target: Target | None) -> list[Snapshot]:
    """One object's snapshots out of a ``history`` answer for many."""
    nothing = SourceError("the source returned nothing")
    return [(at, answers.get(target, nothing), answers.get(route_target, nothing) if route_target else None)
            for at, answers in history]
