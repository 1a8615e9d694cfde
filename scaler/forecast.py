"""Look-ahead maths for the policy: a robust demand trend and a fluid projection of the backlog.

Both work in *replica units* (1.0 = the work one replica sustains within the SLO). The trend is the
Theil–Sen slope (median of pairwise slopes, via scipy), which ignores up to ~29 % outliers; only the
part of it that is statistically sure to be positive (the lower confidence bound) is extrapolated,
so noise around a flat load never turns into an overshoot. The backlog projection is a fluid queue:
work arrives at the forecast demand and is served by the ready replicas plus the starting ones as
each is expected to become ready. Left out: seasonality, queueing variance (the utilization target
covers it), and per-replica imbalance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from scaler.window import Samples

MIN_TREND_SAMPLES = 4
"""Fewer points than this give no trend (a slope from 2–3 points is mostly noise)."""

PROJECTION_STEPS = 64
"""Time steps of the fluid backlog projection over the horizon (exact enough; microseconds)."""


@dataclass(frozen=True)
class Trend:
    """A demand slope in replica units per second: the estimate and the one the policy extrapolates."""

    slope: float
    """Theil–Sen estimate (may be negative)."""
    used: float
    """max(0, lower confidence bound): growth we are confident in; 0 for flat, falling or noisy load."""


def thin(samples: Samples, spacing_s: float) -> Samples:
    """Keep samples at least ``spacing_s`` apart, counting back from the newest.

    Rates over a window ``w`` evaluated every few seconds are strongly autocorrelated: only samples
    ``w`` apart carry independent information. A confidence interval over all of them would be far
    too narrow and let noise pass for a trend.
    """
    kept: list[tuple[float, float]] = []
    for t, v in reversed(samples):
        if not kept or kept[-1][0] - t >= spacing_s:
            kept.append((t, v))
    return tuple(reversed(kept))


def robust_trend(samples: Samples, confidence: float, min_span_s: float, spacing_s: float = 0.0) -> Trend:
    """Theil–Sen slope of the samples with its lower bound at ``confidence`` (two-sided interval).

    Samples are first thinned to ``spacing_s`` apart (independent observations). Returns a zero trend
    when fewer than ``MIN_TREND_SAMPLES`` points remain or they span less than ``min_span_s``
    seconds, because a slope over a short span multiplied by a long lead time is exactly the noise
    amplification the policy must avoid.
    """
    samples = thin(samples, spacing_s) if spacing_s > 0 else samples
    if len(samples) < MIN_TREND_SAMPLES or samples[-1][0] - samples[0][0] < min_span_s:
        return Trend(0.0, 0.0)
    t = np.fromiter((s[0] for s in samples), dtype=float)
    y = np.fromiter((s[1] for s in samples), dtype=float)
    if np.ptp(y) == 0.0:
        return Trend(0.0, 0.0)
    result = stats.theilslopes(y, t, alpha=confidence)
    slope, low = float(result.slope), float(result.low_slope)
    if not (math.isfinite(slope) and math.isfinite(low)):
        return Trend(0.0, 0.0)
    return Trend(slope, max(0.0, min(low, slope)))


def project_backlog(
    backlog: float,
    level: float,
    slope: float,
    ready: float,
    arrivals: tuple[float, ...],
    horizon_s: float,
) -> float:
    """Backlog (replica-seconds of work) left at ``horizon_s`` if nothing more is ordered.

    ``level`` + ``slope``·t is the demand; ``ready`` replicas serve from now and one more joins at
    each time in ``arrivals`` (seconds from now). The queue never goes negative (fluid queue).
    Counting the starting replicas at their expected arrival is what stops a 2→4→8 runaway: the
    backlog that piles up while they load is projected once, not re-counted on every decision.
    """
    if horizon_s <= 0:
        return max(0.0, backlog)
    dt = horizon_s / PROJECTION_STEPS
    queue = max(0.0, backlog)
    for step in range(PROJECTION_STEPS):
        mid = (step + 0.5) * dt
        capacity = ready + sum(1 for a in arrivals if a <= mid)
        demand = max(0.0, level + slope * mid)
        queue = max(0.0, queue + (demand - capacity) * dt)
    return queue
