"""Measured cold starts of a Deployment's pods, and the lead time ``leadTime: auto`` uses.

A cold start runs from the pod's creation through scheduling, container start and readiness to
the first successful ``/metrics`` scrape when one is known (``max(Ready, first scrape)``: a pod
without a readiness probe turns Ready before its engine answers). The lead time is the rolling
nearest-rank p90 of the newest ``window`` cold starts of one Deployment: always an observed value,
never below most of them. Until ``min_samples`` pods have started it is ``None`` and the policy falls
back to the configured ``leadTime`` (default 180 s): that fallback is stated in ``LeadTimeEstimate``.

Only clean starts count: a pod seen Ready with no container restarts. A restarted pod's timeline
mixes two starts, and a pod that never became ready has no end (it is counted as stuck instead).
NOTE: the time from KEDA's poll to the ReplicaSet creating the pod (HPA sync, ≤ ~15 s) is not in
the measurement; the configured fallback should include it.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

from scaler import lead_time
from scaler.kube.pods import PodState

MAX_PLAUSIBLE_S = 6 * 3600.0  # a "cold start" longer than this is a stuck pod someone fixed, not a sample
MAX_PENDING = 4096  # scrapes of pods not yet seen Ready, kept to bound memory


@dataclass(frozen=True)
class ColdStart:
    """One pod's start, phase by phase (epoch seconds, API server clock)."""

    pod: str
    created: float
    scheduled: float | None
    containers_ready: float | None
    ready: float
    first_scrape: float | None = None

    @property
    def total_s(self) -> float:
        """Creation until useful: Ready, or the first successful scrape when that came later."""
        end = max(self.ready, self.first_scrape) if self.first_scrape is not None else self.ready
        return end - self.created

    def phases(self) -> dict[str, float]:
        """Seconds spent in each phase that the pod's conditions let us see."""
        out: dict[str, float] = {}
        if self.scheduled is not None:
            out["scheduling_s"] = self.scheduled - self.created
            if self.containers_ready is not None:
                out["container_start_s"] = self.containers_ready - self.scheduled
        if self.containers_ready is not None:
            out["readiness_s"] = self.ready - self.containers_ready
        if self.first_scrape is not None:
            out["first_scrape_s"] = max(0.0, self.first_scrape - self.ready)
        out["total_s"] = self.total_s
        return out


@dataclass(frozen=True)
class LeadTimeEstimate:
    """The lead time to use and where it came from (``measured`` p90, or the stated ``fallback``)."""

    lead_time_s: float
    source: str
    samples: int
    measured_s: float | None


class LeadTimeTracker:
    """Rolling cold-start samples of one Deployment; thread-safe (the watcher writes, RPCs read)."""

    def __init__(self, window: int = lead_time.WINDOW, min_samples: int = lead_time.MIN_SAMPLES,
                 quantile: float = lead_time.QUANTILE) -> None:
        if not (isinstance(window, int) and window >= 1):
            raise ValueError(f"LeadTimeTracker.window={window!r}: must be an integer >= 1")
        if not (isinstance(min_samples, int) and 1 <= min_samples <= window):
            raise ValueError(f"LeadTimeTracker.min_samples={min_samples!r}: must be an integer in 1..window")
        if not (isinstance(quantile, float) and 0.0 < quantile <= 1.0):
            raise ValueError(f"LeadTimeTracker.quantile={quantile!r}: must be a float in (0, 1]")
        self.window, self.min_samples, self.quantile = window, min_samples, quantile
        self._starts: OrderedDict[str, ColdStart] = OrderedDict()  # uid -> start, oldest Ready first
        self._pending_scrape: dict[str, float] = {}
        self._lock = threading.Lock()

    def observe(self, pod: PodState) -> ColdStart | None:
        """Record the pod's cold start if it is Ready after a clean start; once per pod uid."""
        if not pod.ready or pod.ready_at is None or pod.restarts > 0:
            return None
        total = pod.ready_at - pod.created
        if not (math.isfinite(total) and 0.0 <= total <= MAX_PLAUSIBLE_S):
            return None
        with self._lock:
            if pod.uid in self._starts:
                return None
            start = ColdStart(pod=pod.name, created=pod.created, scheduled=pod.scheduled_at,
                              containers_ready=pod.containers_ready_at, ready=pod.ready_at,
                              first_scrape=self._pending_scrape.pop(pod.uid, None))
            self._starts[pod.uid] = start
            ordered = sorted(self._starts.items(), key=lambda kv: kv[1].ready)[-self.window:]
            self._starts = OrderedDict(ordered)
        return start

    def note_first_scrape(self, uid: str, at: float) -> None:
        """The first successful ``/metrics`` scrape of pod ``uid``; later calls for it are ignored."""
        with self._lock:
            start = self._starts.get(uid)
            if start is None:
                if len(self._pending_scrape) < MAX_PENDING:
                    self._pending_scrape.setdefault(uid, at)
            elif start.first_scrape is None:
                self._starts[uid] = ColdStart(start.pod, start.created, start.scheduled,
                                              start.containers_ready, start.ready, at)

    def samples(self) -> list[ColdStart]:
        """The cold starts in the window, oldest first."""
        with self._lock:
            return list(self._starts.values())

    def lead_time_s(self) -> float | None:
        """Nearest-rank p90 of the window, or None before ``min_samples`` starts."""
        return lead_time.rolling_lead_time([s.total_s for s in self.samples()], self.window, self.min_samples,
                                           self.quantile)

    def estimate(self, fallback_s: float) -> LeadTimeEstimate:
        """The lead time to use: measured when there are enough samples, else ``fallback_s``."""
        measured = self.lead_time_s()
        count = len(self.samples())
        if measured is None:
            return LeadTimeEstimate(lead_time_s=fallback_s, source="fallback", samples=count, measured_s=None)
        return LeadTimeEstimate(lead_time_s=measured, source="measured", samples=count, measured_s=measured)
