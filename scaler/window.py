"""Time windows over ``(time, value)`` samples, kept as immutable tuples inside ``PolicyState``.

The policy is pure, so its memory is data: each window is a tuple of ``(t, value)`` pairs in time
order, rebuilt (never mutated) on every decision. Windows are short (a few dozen samples at the
scaler's 5 s interval), so plain tuples are simpler than a ring buffer and cost microseconds.
"""

from __future__ import annotations

import bisect
import itertools

Sample = tuple[float, float]
Samples = tuple[Sample, ...]

MAX_SAMPLES = 240
"""Hard cap on a window's length, so a tiny evaluation interval cannot make the state grow unbounded."""


def push(samples: Samples, t: float, value: float, keep_s: float) -> Samples:
    """Append ``(t, value)`` and drop samples older than ``t - keep_s``.

    A sample whose time is not after the last one replaces it (a repeated ``now`` must not count
    twice, and a clock that went backwards must not corrupt the order).
    """
    kept = [s for s in samples if s[0] < t and s[0] >= t - keep_s]
    kept.append((t, value))
    if len(kept) > MAX_SAMPLES:
        kept = kept[-MAX_SAMPLES:]
    return tuple(kept)


def push_max(samples: Samples, t: float, value: float, keep_s: float) -> Samples:
    """Like ``push``, for a window only ever asked its maximum: samples a newer, larger-or-equal one
    dominates are dropped (the classic sliding-window maximum), so the window stays short however
    long ``keep_s`` is, and ``maximum`` stays exact.
    """
    kept = [s for s in samples if s[0] < t and s[0] >= t - keep_s and s[1] > value]
    kept.append((t, value))
    return tuple(kept)


def maximum(samples: Samples, since: float) -> float | None:
    """Largest value among samples at or after ``since``; ``None`` when there is none."""
    values = [v for t, v in samples if t >= since]
    return max(values) if values else None


def value_at(samples: Samples, t: float) -> float | None:
    """Value at time ``t``, linearly interpolated between neighbours; ``None`` when ``t`` is outside."""
    if not samples or t < samples[0][0] or t > samples[-1][0]:
        return None
    for (t0, v0), (t1, v1) in itertools.pairwise(samples):
        if t0 <= t <= t1:
            if t1 == t0:
                return v1
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return samples[-1][1]


def since(samples: Samples, t: float) -> Samples:
    """The samples at or after ``t`` (a bisection: windows are in time order, and an hour-long history is
    read this way every decision)."""
    return samples[bisect.bisect_left(samples, (t,)):]


def span(samples: Samples) -> tuple[object, ...]:
    """First and last time and length of time-ordered samples: what tells a policy's windows apart, since they
    only gain samples at the end and lose them at the front."""
    return (samples[0][0], samples[-1][0], len(samples)) if samples else ()
