"""The lead time ``leadTime: auto`` uses, from measured cold starts: one rule for the scaler and the simulator.

The rolling nearest-rank p90 of the newest ``window`` cold starts: always an observed value, never below
most of them; ``None`` until ``min_samples`` pods have started (the policy then uses the configured
``leadTime``). ``scaler.kube.leadtime`` measures the starts on a cluster, ``simulator.observe`` in a run.

The same starts say how long a pod *still* starting will take (``remaining_s``): the p90 of what the
starts that lasted longer than it has so far took beyond that. At 0 s that is the lead time itself; a
pod past the lead time is a tail draw, and counts as still on its way, not as arriving now.

And how often a pod ordered now is still starting a given time later (``survival``): the share of time
within the next lead time during which the fleet decided now is the whole fleet, which weights the
policy's headroom.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

WINDOW = 20
MIN_SAMPLES = 3
QUANTILE = 0.9


def rolling_lead_time(cold_starts_s: Sequence[float], window: int = WINDOW, min_samples: int = MIN_SAMPLES,
                      quantile: float = QUANTILE) -> float | None:
    """Nearest-rank ``quantile`` of the newest ``window`` of ``cold_starts_s`` (oldest first); None with fewer
    than ``min_samples``."""
    recent = sorted(float(s) for s in cold_starts_s[-window:])
    if len(recent) < min_samples:
        return None
    return recent[max(0, math.ceil(quantile * len(recent)) - 1)]


def remaining_s(cold_starts_s: Sequence[float], elapsed_s: float, window: int = WINDOW,
                min_samples: int = MIN_SAMPLES, quantile: float = QUANTILE) -> float:
    """Seconds a pod that has been starting for ``elapsed_s`` still needs, at ``quantile``: the nearest-rank
    quantile of ``s - elapsed_s`` over the newest ``window`` starts ``s`` longer than ``elapsed_s``.

    Past the data (fewer than ``min_samples`` starts that long) the residual at the ``min_samples``-th
    longest start holds: beyond what was seen the tail is taken as memoryless, the assumption that
    neither promises the pod now nor gives it up. 0.0 with fewer than ``min_samples`` starts measured.
    """
    recent = sorted(float(s) for s in cold_starts_s[-window:])
    if len(recent) < min_samples:
        return 0.0
    longer = [s for s in recent if s > elapsed_s]
    since = elapsed_s
    if len(longer) < min_samples:
        longer, since = recent[-min_samples:], recent[-min_samples]
    return longer[max(0, math.ceil(quantile * len(longer)) - 1)] - since


@dataclass(frozen=True)
class Survival:
    """The empirical survival function of the cold start: lag seconds -> share of ``starts_s`` longer than
    the lag. A value (compared and hashed by its starts), so a decision can tell it met the same one."""

    starts_s: tuple[float, ...]
    """Measured starts, sorted, each already times ``leadTimeScale``."""

    def __call__(self, lags_s: np.ndarray) -> np.ndarray:
        recent = np.asarray(self.starts_s)
        return 1.0 - np.searchsorted(recent, lags_s, side="right") / recent.size


def survival(cold_starts_s: Sequence[float], scale: float = 1.0, window: int = WINDOW,
             min_samples: int = MIN_SAMPLES) -> Survival | None:
    """Lag seconds -> share of the newest ``window`` starts (each times ``scale``, ``leadTimeScale``) longer
    than the lag: the empirical survival function of the cold start. None with fewer than ``min_samples``."""
    recent = sorted(float(s) * scale for s in cold_starts_s[-window:])
    if len(recent) < min_samples:
        return None
    return Survival(tuple(recent))
