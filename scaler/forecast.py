"""Look-ahead maths for the policy: the demand forecast, how far demand can rise above it within one
lead time, and the backlog. All in *replica units* (1.0 = the work one replica sustains within the SLO).

**Forecast.** Demand now plus the part of its trend we are confident in, times the lead time ``L``:
the Theil–Sen slope (median of pairwise slopes, which ignores up to ~29 % outliers; ``theil_sen``, equal
to scipy's ``theilslopes``) over the last ten minutes, thinned to one point per rate window
(independent observations), of which only the lower bound of its confidence interval is
extrapolated, so noise around a flat load never becomes an overshoot.

**Headroom over the lead time** (``lead_time_headroom``). A replica ordered now serves only after
``L``, so the fleet of *now* must carry whatever demand arrives before then, and a replica removed
now cannot be back in under ``L``: what the fleet must cover is the *peak* of the next ``L``
seconds. Nobody knows it, but we know how far demand rose above the forecast made at the start of
every past ``L``-second horizon, at every moment of it. Those realised rises, relative to the demand
they started from (``rise = (demand later - forecast) / max(demand then, 1)``), are the forecast's own
errors, and their ``q`` quantile is a calibrated margin (split conformal prediction): on a workload
like the recent past, demand at a moment within the next lead time exceeds ``forecast + rise_q x
max(demand, 1)`` with probability ``1 - q``. (The quantile of each horizon's *peak* instead asks the
fleet to cover the worst minute of every lead time; measured on the suite it cost 3 % more GPU-hours
for no SLO that needed it, because a minute above capacity is mostly absorbed by the queue.)
Bursts show up as their size, a ramp the trend misses as its miss, Poisson noise shrinks
as the fleet grows; no fixed utilization target. Below one replica of demand rises count in absolute
replica units (a burst from 0.2 to 1.5 replicas needs a second replica, however small 0.2 is).
Only horizons that started from a demand within a factor two of today's count (a jump from 1 to 8
replicas says little about the noise at 8), and a fixed number of pseudo-observations of a prior rise
join them, so one event in a short history cannot set the margin alone. With measured cold starts a
rise at lag ``s`` weighs the share of starts longer than ``s``: the fleet decided now is the whole
fleet at that moment only while a pod ordered now would still be starting.

**Backlog** (``project_backlog``): a fluid queue. Work arrives at the forecast demand and is served
by the ready replicas plus the starting ones as each is expected to become ready.
"""

from __future__ import annotations

import array
import bisect
import collections
import functools
import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from scaler.window import Samples, span

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


@functools.lru_cache(maxsize=16)
def _normal_quantile(p: float) -> float:
    """The standard normal quantile (one confidence level per config: computed once, not per decision)."""
    return statistics.NormalDist().inv_cdf(p)


def _tie_term(values: np.ndarray) -> float:
    """Sen's (1968) variance correction for tied values: sum of k (k - 1) (2k + 5) over tie groups."""
    return float(sum(k * (k - 1) * (2 * k + 5) for k in collections.Counter(values.tolist()).values()))


def theil_sen(t: np.ndarray, y: np.ndarray, confidence: float) -> tuple[float, float]:
    """Theil–Sen slope and the lower end of its two-sided ``confidence`` interval (Sen 1968, eq. 2.6):
    what ``scipy.stats.theilslopes(y, t, alpha=confidence)`` returns as ``slope``/``low_slope``, without
    its per-call overhead (~0.5 ms, most of a decision, for ten points); a test holds the two equal."""
    dt = t[:, np.newaxis] - t
    pairs = dt > 0
    if not pairs.any():
        return math.nan, math.nan
    slopes = np.sort((y[:, np.newaxis] - y)[pairs] / dt[pairs])
    n, pairs_n = y.size, slopes.size
    z = _normal_quantile(min(confidence, 1.0 - confidence) / 2.0)
    variance = (n * (n - 1) * (2 * n + 5) - _tie_term(t) - _tie_term(y)) / 18.0
    # the slopes are sorted: their median is the middle one (or the mean of the two), as np.median gives
    middle = pairs_n // 2
    median = float(slopes[middle]) if pairs_n % 2 else float((slopes[middle - 1] + slopes[middle]) / 2.0)
    if not variance >= 0:
        return median, math.nan
    low_rank = max(round((pairs_n + z * math.sqrt(variance)) / 2.0) - 1, 0)
    return median, float(slopes[min(low_rank, pairs_n - 1)])


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
    t = np.fromiter((s[0] for s in samples), dtype=float, count=len(samples))
    y = np.fromiter((s[1] for s in samples), dtype=float, count=len(samples))
    if np.ptp(y) == 0.0:
        return Trend(0.0, 0.0)
    slope, low = theil_sen(t, y, confidence)
    if not (math.isfinite(slope) and math.isfinite(low)):
        return Trend(0.0, 0.0)
    return Trend(slope, max(0.0, min(low, slope)))


RISE_FLOOR = 1.0
"""Demand (replica units) below which rises are counted in absolute replica units, not relative."""

LEVEL_BAND = 2.0
"""Horizons count toward the headroom when they started within this factor of the current demand."""


BandInputs = tuple[object, ...]
"""What a lead-time band's answer depends on (``headroom_inputs``): equal inputs, equal headroom."""


@dataclass(frozen=True)
class Headroom:
    """The margin the fleet keeps over current demand, and the evidence behind it."""

    rise: float
    """Relative rise of demand within one lead time at the chosen quantile (0.25 = 25 %)."""
    horizons: int
    """Past lead-time horizons observed (each sample whose next ``L`` seconds are complete)."""
    tau_s: float = 0.0
    """Time constant of the demand level the band is measured from (``LEVEL_TIME_CONSTANTS_S``; 0: raw)."""
    level: float | None = None
    """That level at the history's last sample (``None``: no history), which ``level_now`` carries forward."""
    level_at: float = 0.0
    """The last sample's time."""


def push_spaced(samples: Samples, t: float, value: float, keep_s: float, spacing_s: float) -> Samples:
    """Append ``(t, value)`` unless the newest sample is younger than ``spacing_s``, and then drop those older
    than ``t - keep_s``. Keeps a long history short (one sample per ``spacing_s``).

    The front moves only when a sample is added, so a full history changes once per ``spacing_s`` and not
    also at the round between, when its oldest sample would age out: a band computed on it is reused until
    the next sample (``headroom_inputs``). It may hold one sample up to ``spacing_s`` older than
    ``keep_s`` meanwhile."""
    if samples and t - samples[-1][0] < spacing_s:
        return samples
    kept = samples[bisect.bisect_left(samples, (t - keep_s,)):]  # samples are in time order
    return (*kept, (t, value))


def _columns(samples: Samples) -> tuple[np.ndarray, np.ndarray]:
    """Times and values of ``(t, v)`` samples as two arrays (flattened first: twice as fast as np.array)."""
    flat = np.fromiter(itertools.chain.from_iterable(samples), dtype=float, count=2 * len(samples))
    return flat[0::2], flat[1::2]


def horizon_rises(history: Samples, lead_s: float, slopes: Samples = (), level: float | None = None,
                  floor: float = RISE_FLOOR) -> np.ndarray:
    """How far demand rose above the forecast within past lead times, at every lag: for every sample
    ``i`` whose next ``lead_s`` seconds lie inside the history and every later sample ``j`` in them,
    ``(v_j - v_i - s_i (t_j - t_i)) / max(v_i, floor)`` (``s_i`` the confident trend then, from
    ``slopes`` at the same times). Pooled over lags, their quantile is a share of *time*: at a moment
    within the next lead time demand is above the band with probability ``1 - q``. With ``level``,
    only horizons that started within a factor ``LEVEL_BAND`` of it count: how far 1 replica of demand
    jumped says little about 8."""
    table = _rise_table(*_columns(history), lead_s, slopes, level, floor)
    return table.rises(None, floor) if table is not None else np.empty(0)


@dataclass(frozen=True)
class _RiseTable:
    """The past horizons a band pools, flattened once (``_rise_table``): every (start, later sample) pair of
    ``horizon_rises`` with the start's raw demand and trend, so rises from any level cost a few array ops."""

    starts: np.ndarray
    """History indices of the horizons' starts."""
    start_values: np.ndarray
    """Raw demand at each start."""
    later: np.ndarray
    """Raw demand minus the trend's extrapolation, at every later sample inside each horizon (flattened)."""
    owner: np.ndarray
    """Which horizon (row of ``starts``) each entry of ``later`` belongs to."""
    lags: np.ndarray
    """Lag in seconds of each entry: zeros for the lag-0 entries, then ``later``'s."""

    def rises(self, levels: np.ndarray | None, floor: float) -> np.ndarray:
        """Rises above the forecast from ``levels`` (the raw demand when ``None``), lag-0 entries first."""
        base = self.start_values if levels is None else levels[self.starts]
        scale = np.maximum(base, floor)
        # lag 0 first: demand now is covered by any fleet sized for it, and by one sized on a level as far as
        # the level reaches it
        now = np.zeros(self.starts.size) if levels is None else (self.start_values - base) / scale
        return np.concatenate([now, (self.later - base[self.owner]) / scale[self.owner]])


def _rise_table(t: np.ndarray, v: np.ndarray, lead_s: float, slopes: Samples, level: float | None,
                floor: float) -> _RiseTable | None:
    """The horizons of ``horizon_rises`` in a history of times ``t`` and demands ``v`` (``_columns``) as a
    ``_RiseTable``; ``None`` when there is none."""
    if t.size < 2:
        return None
    starts = _selected_starts(t, v, lead_s, level, floor)
    if starts.size == 0:
        return None
    ends = np.searchsorted(t, t[starts] + lead_s, side="right")  # samples in (t_i, t_i + L]
    slope = _aligned(slopes, t[starts])
    lags = np.arange(1, int((ends - starts).max(initial=1)))
    later = starts[:, np.newaxis] + lags  # every sample offset within each horizon, one 2-D op
    inside = later < ends[:, np.newaxis]
    later = np.minimum(later, t.size - 1)
    elapsed = t[later] - t[starts][:, np.newaxis]
    ahead = v[later] - slope[:, np.newaxis] * elapsed
    owner = np.broadcast_to(np.arange(starts.size)[:, np.newaxis], later.shape)
    return _RiseTable(starts, v[starts], ahead[inside], owner[inside],
                      np.concatenate([np.zeros(starts.size), elapsed[inside]]))


def _selected_starts(t: np.ndarray, v: np.ndarray, lead_s: float, level: float | None, floor: float) -> np.ndarray:
    """Indices of the samples whose next ``lead_s`` seconds lie inside the history and, with ``level``,
    whose demand was within a factor ``LEVEL_BAND`` of it: the horizons a band pools."""
    starts = np.flatnonzero(t + lead_s <= t[-1])
    if level is not None and starts.size:
        scale, here = np.maximum(v[starts], floor), max(level, floor)
        starts = starts[(scale >= here / LEVEL_BAND) & (scale <= here * LEVEL_BAND)]
    return starts


def _aligned(slopes: Samples, times: np.ndarray) -> np.ndarray:
    """The non-negative slope recorded at each of ``times`` (0 where none was)."""
    if not slopes:
        return np.zeros(times.size)
    at, value = _columns(slopes)
    index = np.minimum(np.searchsorted(at, times), at.size - 1)
    return np.where(at[index] == times, np.maximum(value[index], 0.0), 0.0)


def smoothed_levels(t: np.ndarray, v: np.ndarray, tau_s: float) -> np.ndarray:
    """The exponentially weighted level of ``v`` at each time ``t`` (time constant ``tau_s``, any spacing):
    ``l_0 = v_0``, ``l_i = l_(i-1) + (1 - exp(-(t_i - t_(i-1)) / tau)) (v_i - l_(i-1))``; ``tau_s`` 0 is ``v``.

    The gains telescope (their complements multiply to ``exp(-(t_i - t_0) / tau)``), so the recursion is one
    cumulative sum, ``l_i = exp(-T_i / tau) (v_0 + sum_k g_k v_k exp(T_k / tau))``, evaluated in blocks short
    enough that ``exp(T / tau)`` stays far from overflow."""
    if tau_s <= 0 or v.size == 0:
        return v.copy()
    out = np.empty(v.size)
    out[0] = level = float(v[0])
    first = 1
    while first < v.size:
        # a block spans at most BLOCK_TAUS time constants past its anchor (the level just before it)
        anchor = t[first - 1]
        if t[first] - anchor > _BLOCK_TAUS * tau_s:  # a gap that long leaves nothing of the old level
            out[first] = level = float(v[first])
            first += 1
            continue
        stop = int(np.searchsorted(t, anchor + _BLOCK_TAUS * tau_s, side="right"))
        stop = min(max(stop, first + 1), v.size)
        since = (t[first:stop] - anchor) / tau_s
        gains = -np.expm1(-np.diff(t[first - 1:stop]) / tau_s)
        grown = np.exp(since)
        out[first:stop] = (level + np.cumsum(gains * v[first:stop] * grown)) / grown
        level = float(out[stop - 1])
        first = stop
    return out


_BLOCK_TAUS = 200.0
"""Time constants per block of ``smoothed_levels``: exp(200) is 7e86, far from float overflow (1.8e308)."""


def level_now(headroom: Headroom, t: float, value: float) -> float:
    """The band's level carried from the history's last sample to ``(t, value)``: one more step of its
    exponential smoothing (the raw ``value`` for the raw level, and wherever no level is known)."""
    if headroom.tau_s <= 0 or headroom.level is None or t < headroom.level_at:
        return value
    return headroom.level - math.expm1(-(t - headroom.level_at) / headroom.tau_s) * (value - headroom.level)


def advance_level(headroom: Headroom, history: Samples) -> Headroom:
    """``headroom`` with its level carried through the samples of ``history`` newer than its last one, by the
    recursion of ``smoothed_levels``: a band reused for a few samples (``policy._band_holds``) keeps the
    level a band measured on this history would have, not one step over the whole gap at the newest value."""
    if headroom.tau_s <= 0 or headroom.level is None or not history or history[-1][0] <= headroom.level_at:
        return headroom
    carried = headroom
    for t, value in history[bisect.bisect_right(history, (headroom.level_at, math.inf)):]:
        carried = Headroom(headroom.rise, headroom.horizons, headroom.tau_s, level_now(carried, t, value), t)
    return carried


def level_headroom(history: Samples, slopes: Samples, lead_s: float, level: float, quantile: float,
                   prior_rise: float, prior_horizons: int, spacing_s: float = 15.0,
                   survival: Callable[[np.ndarray], np.ndarray] | None = None,
                   time_constants: tuple[float, ...] = (0.0,)) -> Headroom:
    """``lead_time_headroom`` measured from each smoothed level of ``time_constants`` (``smoothed_levels``),
    keeping the narrowest band (the first on a tie: 0, the raw demand, leads the candidates).

    Why: a band is the forecast's calibrated error, so any forecast whose band covers the same share of
    time is as safe as another, and the one with the narrowest band carries the least idle capacity. On
    noise that does not persist (minute-to-minute bursts of a steady load, whose 60 s rates are
    uncorrelated a minute apart) a level averaged over minutes is nearer every future minute than the
    last noisy minute is; on a load that moves (a ramp, steps, a day) the raw demand is, because a
    smoothed level lags, and its band, which measures that lag, comes out wider."""
    lead = max(lead_s, 0.0)
    t, v = _columns(history)
    table = _rise_table(t, v, lead, slopes, level, RISE_FLOOR)
    pool = _Pool.of(table, lead, prior_rise, prior_horizons, spacing_s, survival)
    last_at = float(t[-1]) if t.size else 0.0
    best: Headroom | None = None
    for tau in time_constants:
        levels = smoothed_levels(t, v, tau) if tau > 0 else None
        rise = pool.quantile(table.rises(levels, RISE_FLOOR) if table is not None else np.empty(0), quantile)
        if best is None or rise < best.rise:
            last = float(levels[-1]) if levels is not None and levels.size else (float(v[-1]) if v.size else None)
            best = Headroom(rise, pool.horizons, tau, last, last_at)
    if best is None:
        raise ValueError("time_constants=(): must name at least one level (0 is the raw demand)")
    return best


@dataclass(frozen=True)
class _Pool:
    """What a band's quantile pools besides the rises themselves: their weights by lag and the prior."""

    weights: np.ndarray | None
    """Each rise's weight (``None``: all equal, the lead time taken as certain)."""
    prior_rise: float
    prior_weight: float
    """The prior's weight: what ``prior_horizons`` whole horizons of rises would weigh."""
    prior_count: int
    """Without weights, how many copies of the prior join the rises."""
    horizons: int

    @staticmethod
    def of(table: _RiseTable | None, lead_s: float, prior_rise: float, prior_horizons: int, spacing_s: float,
           survival: Callable[[np.ndarray], np.ndarray] | None) -> _Pool:
        lags = table.lags if table is not None else np.empty(0)
        per_horizon = max(1, int(lead_s // spacing_s))
        horizons = int(lags.size // per_horizon) if lags.size else 0
        if survival is None:
            return _Pool(None, prior_rise, 0.0, prior_horizons * per_horizon, horizons)
        weights = np.clip(np.where(lags > 0, survival(lags), 1.0), 0.0, 1.0)
        one_horizon = float(np.clip(survival(np.arange(1, per_horizon + 1) * spacing_s), 0.0, 1.0).sum())
        return _Pool(weights, prior_rise, prior_horizons * one_horizon, 0, horizons)

    def quantile(self, rises: np.ndarray, quantile: float) -> float:
        """The ``quantile`` of ``rises`` pooled with the prior (clipped at 0; the prior if not finite)."""
        if self.weights is None:
            pooled = np.concatenate([rises, np.full(self.prior_count, self.prior_rise)])
            if pooled.size == 0:
                return max(self.prior_rise, 0.0)
            # numpy's "higher" quantile (the order statistic at ceil(q (n - 1))), without np.quantile's overhead
            rank = min(max(math.ceil(quantile * (pooled.size - 1)), 0), pooled.size - 1)
            rise = float(np.partition(pooled, rank)[rank])
        else:
            if self.weights.sum() + self.prior_weight <= 0:
                return max(self.prior_rise, 0.0)
            values = np.concatenate([rises, [self.prior_rise]])
            mass = np.concatenate([self.weights, [self.prior_weight]])
            rise = weighted_quantile(values, mass, quantile)
        return max(rise, 0.0) if math.isfinite(rise) else self.prior_rise


def weighted_quantile(values: np.ndarray, mass: np.ndarray, quantile: float) -> float:
    """The smallest of ``values`` whose share of ``mass`` at or below it reaches ``quantile`` (non-negative
    masses with a positive sum).

    Sorting all of them was most of a band's cost; the answer lies among the largest values whenever those
    carry more than ``1 - quantile`` of the mass, so only they are sorted (``np.argpartition`` finds them in
    linear time) and the rest enter as one sum; where they do not carry that much, all are sorted. The same
    value either way (the answer depends on the values' masses, not their order; a test holds the two equal)."""
    n = values.size
    top_n = math.ceil(2.0 * (1.0 - quantile) * n)
    if n >= _PARTITION_FROM and top_n < n:
        total = float(mass.sum())
        target = quantile * total
        top = np.argpartition(values, n - top_n)[n - top_n:]
        top_mass = mass[top]
        below = total - float(top_mass.sum())
        if below < target:
            order = np.argsort(values[top], kind="stable")
            cumulative = below + np.cumsum(top_mass[order])
            index = min(int(np.searchsorted(cumulative, target, side="left")), top_n - 1)
            return float(values[top[order[index]]])
    order = np.argsort(values, kind="stable")  # timsort: about twice as fast here, and the same value
    cumulative = np.cumsum(mass[order])
    index = min(int(np.searchsorted(cumulative, quantile * cumulative[-1], side="left")), n - 1)
    return float(values[order[index]])


_PARTITION_FROM = 1024
"""Values from which ``weighted_quantile`` partitions first: below about a thousand the extra array operations
cost more than the shorter sort saves (at 309 values 41 µs against 24; at 3,109, 57 against 90)."""


def lead_time_headroom(history: Samples, slopes: Samples, lead_s: float, level: float, quantile: float,
                       prior_rise: float, prior_horizons: int, spacing_s: float = 15.0,
                       survival: Callable[[np.ndarray], np.ndarray] | None = None,
                       levels: np.ndarray | None = None) -> Headroom:
    """The ``quantile`` of past rises (``horizon_rises``) from levels like ``level``, pooled with
    ``prior_horizons`` lead times' worth of pseudo-observations of ``prior_rise``: one event in a short
    history (a step shows in every horizon that contains it) cannot set the margin alone, and a long
    history outweighs the prior.

    ``survival`` (lag seconds -> share of pods still starting that long after being ordered,
    ``scaler.lead_time.survival``) weights each rise by how often the fleet decided now is still the
    whole fleet at its lag: a pod ordered now lands after its own cold start, so a later moment is
    covered by a later decision as often as the start is shorter. Without it every lag up to
    ``lead_s`` weighs the same (the lead time taken as certain). ``levels``: rises from a smoothed level
    (``level_headroom``)."""
    lead = max(lead_s, 0.0)
    table = _rise_table(*_columns(history), lead, slopes, level, RISE_FLOOR)
    pool = _Pool.of(table, lead, prior_rise, prior_horizons, spacing_s, survival)
    rises = table.rises(levels, RISE_FLOOR) if table is not None else np.empty(0)
    return Headroom(pool.quantile(rises, quantile), pool.horizons)


@dataclass(frozen=True)
class LevelIndex:
    """Which past horizons a level selects (``_selected_starts``), answered without reading the history
    again: the demand (floored at ``RISE_FLOOR``) at every sample whose next ``lead_s`` seconds lie inside
    the history, sorted. A level selects those within a factor ``LEVEL_BAND`` of it, a contiguous run of
    this order, so two levels select the same horizons exactly when two bisections give the same run."""

    history_span: tuple[object, ...]
    """``window.span`` of the history it indexes."""
    lead_s: float
    scales: array.array[float]
    """Packed doubles: a decision state holds two of these per object, and a tuple of floats would be four
    times the memory (about 7 KB against 2 KB an hour)."""

    def reads(self, history: Samples, lead_s: float) -> bool:
        """Whether this indexes ``history`` at ``lead_s``."""
        return self.lead_s == lead_s and self.history_span == span(history)

    def run(self, level: float) -> tuple[int, int]:
        """The run of ``scales`` that ``level`` selects; (0, 0) when it selects none."""
        here = max(level, RISE_FLOOR)
        if here != here:  # NaN: no comparison holds, so no horizon is selected
            return (0, 0)
        first = bisect.bisect_left(self.scales, here / LEVEL_BAND)
        stop = bisect.bisect_right(self.scales, here * LEVEL_BAND)
        return (first, stop) if first < stop else (0, 0)


def level_index(history: Samples, lead_s: float, last: LevelIndex | None = None) -> LevelIndex:
    """The ``LevelIndex`` of ``history`` at ``lead_s``: ``last`` where it already indexes them (a history moves
    once per sample, so two rounds in three reuse the last decision's)."""
    if last is not None and last.reads(history, lead_s):
        return last
    scales = array.array("d")
    if len(history) >= 2:
        t, v = _columns(history)
        starts = np.flatnonzero(t + max(lead_s, 0.0) <= t[-1])
        scales.frombytes(np.sort(np.maximum(v[starts], RISE_FLOOR)).tobytes())
    return LevelIndex(span(history), lead_s, scales)


def headroom_inputs(history: Samples, slopes: Samples, lead_s: float, level: float, quantile: float,
                    prior_rise: float, prior_horizons: int, spacing_s: float = 15.0,
                    survival: Callable[[np.ndarray], np.ndarray] | None = None,
                    index: LevelIndex | None = None) -> BandInputs:
    """Everything ``lead_time_headroom``'s answer depends on, cheap to build and compare: the history's
    ``window.span``, the same of the slopes, which past horizons ``level`` selects (read through ``index``,
    this history's ``level_index`` at ``lead_s``, built here when not given), and the settings. Equal inputs,
    equal answer; when a decision may reuse a band measured on other inputs is ``policy._band_holds``'s rule."""
    if index is None:
        index = level_index(history, lead_s)
    return (span(history), span(slopes), index.run(level), lead_s, quantile, prior_rise, prior_horizons,
            spacing_s, survival)


def project_backlog(
    backlog: float,
    level: float,
    slope: float,
    ready: float,
    arrivals: tuple[float, ...],
    horizon_s: float,
) -> float:
    """Backlog (replica-seconds of work) left at ``horizon_s`` if nothing more is ordered.

    ``level`` is the demand; ``ready`` replicas serve from now and one more joins at each time in
    ``arrivals`` (seconds from now). The queue never goes negative (fluid queue). Counting the
    starting replicas at their expected arrival is what stops a 2→4→8 runaway: the backlog that
    piles up while they load is projected once, not re-counted on every decision.
    """
    if horizon_s <= 0:
        return max(0.0, backlog)
    dt = horizon_s / PROJECTION_STEPS
    # no queue now and demand (linear, so largest at one end) never above the ready replicas: the
    # queue below stays exactly 0 at every step, so skip the steps (the usual steady state)
    if backlog <= 0 and max(level + slope * dt / 2, level + slope * (horizon_s - dt / 2)) <= ready:
        return 0.0
    # the fluid queue's recursion q <- max(0, q + net work) in closed form (Lindley): the queue at the end is the
    # work added since the last moment it was empty, i.e. S_n - min(-q0, S_1..S_n) over the running sums S_j of
    # net work; one running sum and one running minimum, no clip per step. Plain floats, not numpy: these 64
    # scalar steps run once per object per round, where numpy's per-call overhead cost more than the steps
    joined = sorted(arrivals)
    arrived, total = 0, 0.0
    lowest = -max(0.0, backlog)
    for step in range(PROJECTION_STEPS):
        mid = (step + 0.5) * dt
        while arrived < len(joined) and joined[arrived] <= mid:
            arrived += 1
        demand = level + slope * mid
        total += ((demand if demand > 0.0 else 0.0) - (ready + arrived)) * dt
        if total < lowest:
            lowest = total
    return total - lowest
