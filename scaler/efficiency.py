"""How much of its modelled capacity a replica really delivers within the SLO, corrected online.

``ReplicaCapacity`` is a model's estimate on a reference mix; a profile measured on another GPU,
prefix-cache hits, preemptions or long contexts make a real replica deliver more or less. The one
correction, ``efficiency`` ``e`` (1.0 = the model is right), follows **one rule**, applied once per
rate window while the fleet is steady (the same Ready replicas for 1.5 rate windows, so the rates
describe this fleet) and serving at least ``MIN_SERVED`` replica units:

    the tail says whether the load a replica carried was within its capacity.

With ``rho`` the load one Ready replica served in that window (modelled replica units) and ``late``
the share of first tokens after the SLO (vLLM's TTFT histogram; without it, the share an
exponential queue wait with the measured mean would put past the waiting budget):

- **late** (``late > LATE_SHARE``, 4 %) while a replica carried at least ``LOADED`` of its modelled
  capacity: ``e`` drops by ``STEP`` (multiplicative decrease). Lateness at a lighter load (prompts
  whose own prefill nearly fills the SLO, sub-second bursts) is not what capacity fixes, so it
  teaches nothing: it can grow the fleet by at most ``1 / LOADED``, never without bound.
- **calm** (``late <= TAIL_SHARE / 2``): a replica just carried ``rho`` within the SLO, so ``e`` may
  rise to one step past that load, ``min((1 + STEP) e, (1 + STEP) rho)``, and never lower it: the
  estimate probes one step beyond the evidence, never loads nobody has come near (an unbounded
  probe overshoots the real edge and leaves the fleet short for a whole lead time). A bursty
  workload's calm peaks are that evidence.
- otherwise ``e`` stays.

The policy divides modelled demand by ``e`` and adds the KV ledger (``kv_replicas``: the fleet's KV
cache in use, in replicas). Both come from *past* snapshots only, so more load in the current
snapshot can never lower the answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaler import window
from scaler.signals import Signals

MIN_SERVED = 0.25
"""Replica units of served work below which nothing is observed (ratios of tiny rates are noise)."""

MIN_EFFICIENCY, MAX_EFFICIENCY = 0.05, 2.0
"""Bounds of the efficiency: outside them it is a broken measurement, not a workload."""

TAIL_SHARE = 0.05
"""Share of first tokens allowed after the TTFT SLO: the SLO is a p95."""

LATE_SHARE = 0.8 * TAIL_SHARE
"""A window this late or more teaches that the load was past capacity: a point below the budget, because the
SLO is judged over the whole run and one window's reading of its buckets errs by about that much (mean
absolute error 0.4–0.7 points on Mooncake's windows, ``benchmarks/bench_late_share.py``), so a rule aiming
at the budget itself sits at the edge and the run's p95 lands on either side of it."""

STEP = 0.1
"""Largest relative change of the efficiency per rate window (10 %): a wrong estimate is halved in
about seven minutes, and one noisy window moves it little."""

LOADED = 0.6
"""Share of its modelled capacity a replica must carry for a late tail to be blamed on capacity."""


@dataclass(frozen=True)
class CapacityMemory:
    """What the correction remembers; ``CapacityMemory()`` knows nothing (efficiency 1)."""

    ready: window.Samples = ()
    """(t, ready replicas) over 1.5 rate windows: is the fleet steady?"""
    efficiency: float = 1.0
    updated_at: float | None = None
    """When the last rate window was judged."""
    slack_seen: bool = False
    """A judged window has shown the fleet with slack (calm or idle). Before one, the capacity model is
    unverified: the policy does not let it shrink, for up to one lead time, a fleet that may be busy."""


@dataclass(frozen=True)
class Assessment:
    """The efficiency the policy applies now, and what this snapshot showed."""

    efficiency: float
    kv_replicas: float
    late_share: float | None
    """Measured (or, without the histogram, estimated) share of late first tokens; None: unknown."""
    load_per_replica: float
    verdict: str
    """What the last judged window concluded: late, calm, saturated, idle, unsteady or none."""


def estimated_late_share(mean_wait_s: float, wait_budget_s: float) -> float:
    """Share of requests an exponential wait with this mean puts past the budget (no histogram)."""
    if mean_wait_s <= 0:
        return 0.0
    return math.exp(-wait_budget_s / mean_wait_s) if wait_budget_s > 0 else 1.0


def assess(memory: CapacityMemory, signals: Signals, served: float, late_share: float | None,
           now: float, rate_window_s: float) -> tuple[Assessment, CapacityMemory]:
    """The efficiency from past windows, and the memory updated with this snapshot's evidence.

    ``served`` is the work the fleet did over the rate window (modelled replica units), ``late_share``
    the share of first tokens after the SLO over the same window (None: not measured).
    """
    usage = signals.kv_cache_usage
    ready = float(signals.ready_replicas)
    kv_replicas = min(max(usage, 0.0), 1.0) * ready if usage is not None else 0.0
    efficiency = memory.efficiency
    ready_samples = window.push(memory.ready, now, ready, rate_window_s * 1.5)
    rho = served / ready if ready > 0 else 0.0
    seen = Assessment(efficiency, kv_replicas, late_share, rho, "none")
    due = memory.updated_at is None or now - memory.updated_at >= rate_window_s
    if not due:
        return seen, CapacityMemory(ready_samples, efficiency, memory.updated_at, memory.slack_seen)
    steady = now - ready_samples[0][0] >= rate_window_s and all(v == ready for _, v in ready_samples)
    learned, verdict = efficiency, "unsteady"
    if steady and (served < MIN_SERVED or ready <= 0):
        verdict = "idle"
    elif steady and late_share is not None and late_share > LATE_SHARE:
        verdict = "late"
        if rho >= LOADED:
            learned = efficiency * (1.0 - STEP)
    elif steady and late_share is not None and late_share <= TAIL_SHARE / 2:
        verdict = "calm"
        # a replica just carried rho calmly: the estimate may reach one step past that, and no further
        learned = max(efficiency, min(efficiency * (1.0 + STEP), rho * (1.0 + STEP)))
    elif steady:
        verdict = "edge"
    learned = min(max(learned, MIN_EFFICIENCY), MAX_EFFICIENCY)
    updated_at = now if steady or memory.updated_at is None else memory.updated_at
    seen = Assessment(efficiency, kv_replicas, late_share, rho, verdict)
    return seen, CapacityMemory(ready_samples, learned, updated_at, memory.slack_seen or verdict in ("calm", "idle"))
