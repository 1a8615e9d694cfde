"""The lead time ``leadTime: auto`` uses, from measured cold starts: one rule for the scaler and the simulator.

The rolling nearest-rank p90 of the newest ``window`` cold starts: always an observed value, never below
most of them; ``None`` until ``min_samples`` pods have started (the policy then uses the configured
``leadTime``). ``scaler.kube.leadtime`` measures the starts on a cluster, ``simulator.observe`` in a run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
