"""Step jitter: each simulated engine step takes the model's time times a factor drawn from the real steps' spread.

Why: a real engine's steps scatter around any step-time model (the host, the allocator, Python in the
scheduler), and the scatter is skewed: on vLLM 0.32's CPU build a decode step's real time over the fitted
model's has median 0.90-0.97 of its mean and p90 1.15-1.34 (docs/real-vllm.md). With deterministic steps
the simulated inter-token latency's median is the *mean* step, 6-13 % above the real median, and the
latency tails are optimistic. ``leadscale calibrate`` fitted on timed steps stores the measured ratios as
quantile tables in the profile, one for steps without a prefill chunk (``step_jitter``) and one for steps
with one (``prefill_step_jitter``: longer steps, relatively less scatter); the engines draw one factor per
step from the table of its kind.

A table: ``JITTER_POINTS`` quantiles of real / model step time at equally spaced probabilities 0, 1/(P-1),
..., 1 (the two ends half a segment in), rescaled so that the piecewise-linear inverse CDF it defines has
mean 1: the model keeps the mean step (throughput and capacity unchanged) and the jitter only shapes the
spread. Steps are drawn independently: the slower drift of a whole run (the host's speed moving 10-20 %
between runs of the same requests, docs/real-vllm.md) is not modelled.

The draw is counter-based, not a stateful generator: step ``s`` of replica ``r`` uses ``splitmix64(r * 2^32
+ s)``. Both engines (the Python reference and the compiled one, ``fast_replica.jitter_factor``) compute the
same integer and the same float operations, so their results stay bit-identical, and a run is a pure
function of its inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from scaler.step_time import table_mean

if TYPE_CHECKING:
    from scaler.profiles import PerformanceProfile
    from simulator.results import LatencyHistogram

GOLDEN, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
"""SplitMix64's constants (Steele, Lea, Flood 2014)."""
JITTERED_RUN_STEPS = 1024
"""A jittered decode run's longest stretch: its step times are summed, not closed-form, and the compiled engine
keeps them in a fixed buffer per replica. A longer run is planned as several (the same steps, replanned)."""
JITTER_POINTS = 101
"""Quantiles stored per profile: every 1 %, so the median, p90 and p99 of the ratio are kept. The two ends are the
quantiles half a segment in (0.5 % and 99.5 %), not the sample's extremes: one host stall in 10k steps, 10x the
model, would otherwise stretch the top segment to it and, through the mean of 1, shrink every other step."""
MASK64 = (1 << 64) - 1
STREAM_STRIDE = 1 << 32
"""Steps of one replica before its stream would run into the next replica's: 4e9 steps, decades of GPU time."""


def splitmix64(x: int) -> int:
    """One output of SplitMix64 (Steele, Lea, Flood 2014) for the state ``x``: a well-mixed 64-bit integer."""
    z = (x + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def uniform(stream: int, step: int) -> float:
    """A uniform draw in [0, 1) for ``step`` of ``stream`` (53 bits)."""
    return (splitmix64((stream * STREAM_STRIDE + step) & MASK64) >> 11) * (1.0 / 9007199254740992.0)


def factor(table: Sequence[float], u: float) -> float:
    """The inverse CDF of ``table`` at ``u``: linear between the two quantiles around it."""
    pos = u * (len(table) - 1)
    i = min(int(pos), len(table) - 2)
    frac = pos - i
    return table[i] + (table[i + 1] - table[i]) * frac


def jitter_factor(table: Sequence[float], stream: int, step: int) -> float:
    """The factor step ``step`` of replica ``stream`` takes its modelled time by."""
    return factor(table, uniform(stream, step))


def jitter_factors(table: Sequence[float] | np.ndarray, stream: int, step0: int, k: int) -> np.ndarray:
    """``jitter_factor`` of steps ``step0 .. step0 + k - 1`` at once, in the same operations (bit-identical).
    In place where it can: the Python engine calls it once per decode run, and numpy's per-call cost is most of
    it."""
    t = table if isinstance(table, np.ndarray) else np.asarray(table, dtype=np.float64)
    z = np.arange(k, dtype=np.uint64)
    z += np.uint64((stream * STREAM_STRIDE + step0 + GOLDEN) & MASK64)  # arrays wrap mod 2^64
    z ^= z >> np.uint64(30)
    z *= np.uint64(MIX1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(MIX2)
    z ^= z >> np.uint64(31)
    z >>= np.uint64(11)
    pos = z.astype(np.float64)
    pos *= 1.0 / 9007199254740992.0
    pos *= t.size - 1
    i = pos.astype(np.int64)
    np.minimum(i, t.size - 2, out=i)
    pos -= i  # the fraction
    low = t[i]
    out: np.ndarray = low + (t[i + 1] - low) * pos
    return out


class FactorBlock:
    """One replica's decode-step factors, drawn ``JITTERED_RUN_STEPS`` at a time: arrivals cut most runs after a
    few steps and the next run starts where the cut one stopped, so drawing per run would redraw the same steps
    (numpy's per-call cost made that 2/3 of a jittered Python simulation)."""

    __slots__ = ("factors", "start", "stream", "table")

    def __init__(self, table: Sequence[float], stream: int) -> None:
        self.table, self.stream = np.asarray(table, dtype=np.float64), stream
        self.start, self.factors = 0, np.empty(0)

    def take(self, step0: int, k: int) -> np.ndarray:
        """The factors of steps ``step0 .. step0 + k - 1``."""
        if not (self.start <= step0 and step0 + k <= self.start + self.factors.size):
            self.start, self.factors = step0, jitter_factors(self.table, self.stream, step0, max(k, JITTERED_RUN_STEPS))
        return self.factors[step0 - self.start: step0 - self.start + k]


class JitteredRun:
    """``scaler.step_time.DecodeRun`` with step jitter: step ``i`` takes ``(first_s + growth_s * i)`` times its
    factor, so the run's times are summed once at its start (``ends``) instead of in closed form."""

    __slots__ = ("durations", "ends", "first_s", "growth_s")

    def __init__(self, first_s: float, growth_s: float, factors: np.ndarray) -> None:
        self.first_s, self.growth_s = first_s, growth_s
        self.durations = (first_s + growth_s * np.arange(factors.size, dtype=np.float64)) * factors
        self.ends = np.cumsum(self.durations)  # sequential, as the compiled engine adds them

    def total(self, k: int) -> float:
        """Seconds taken by the first ``k`` steps."""
        return float(self.ends[k - 1]) if k > 0 else 0.0

    def steps_within(self, elapsed_s: float) -> int:
        """How many whole steps end at or before ``elapsed_s``."""
        return int(self.ends.searchsorted(elapsed_s, side="right"))

    def add_to(self, itl: LatencyHistogram, done: int, j: int, weight: float) -> None:
        """Steps ``done .. done + j - 1`` into the inter-token histogram, ``weight`` tokens each."""
        itl.add_values(self.durations[done:done + j], weight)


def jitter_table(ratios: np.ndarray, points: int = JITTER_POINTS) -> tuple[float, ...]:
    """The profile's table from measured real ÷ model step-time ratios: their quantiles, mean 1."""
    ratios = np.asarray(ratios, dtype=float)
    if ratios.size < 2 or not np.all(np.isfinite(ratios)) or not np.all(ratios > 0):
        raise ValueError(f"jitter_table: need at least 2 finite ratios > 0, got {ratios.size} "
                         f"({int(np.sum(~np.isfinite(ratios) | (ratios <= 0)))} not finite or <= 0)")
    half = 0.5 / (points - 1)
    quantiles = np.quantile(ratios, np.clip(np.linspace(0.0, 1.0, points), half, 1.0 - half))
    return tuple(float(x) for x in quantiles / table_mean(quantiles))


def without_jitter(profile: PerformanceProfile) -> PerformanceProfile:
    """``profile`` with deterministic steps: both tables gone (to see what the jitter changes)."""
    return replace(profile, step_jitter=(), prefill_step_jitter=())
