"""How much of its nominal capacity a replica really delivers within the SLO, learned online.

``ReplicaCapacity`` is a model's estimate on a reference mix. Long prompts, long contexts that fill
the KV cache and preemptions make a replica deliver less than that; short chats and a lenient p95
let it deliver more. Only the running fleet can tell, so the estimate is learned from it, in replica
units of token work:

- **KV binding** (any load): the fleet's KV share (``kv_cache_usage × ready``) over its token share
  (``served``), the median of the previous rate window's observations. Above the token factor, the
  KV cache fills before the token capacity does.
- **Efficiency** ``e`` (1.0 at first), additive-increase / multiplicative-decrease like TCP's
  congestion window, but never far past the evidence: with cold starts of minutes, an estimate that
  overshoots the real edge leaves the fleet short for a whole lead time, which alone can spend a p95
  SLO's budget. Where vLLM's TTFT histogram is scraped, the fleet is *at the SLO's edge* when more
  than 5 % of first tokens over the rate window came after the SLO (``late_share``), calm at half
  that; a late tail costs ``e`` 10 % per rate window (``TAIL_DECREASE``), except while replicas are
  starting (those ordered for it have not arrived, so their effect cannot be judged yet), down to
  ``TAIL_FLOOR`` (lateness at any fleet size, e.g. prompts whose own prefill outlasts the SLO, must
  not grow the fleet without bound).
  Without the histogram, the fleet is at the edge when the mean queue
  wait over the rate window (Little's law: mean queued work / throughput) exceeds a third of the
  waiting budget (the SLO less a token-weighted prompt's own prefill; the p95 of an
  exponential wait is ln 20 ≈ 3 × its mean) or the KV cache is full with requests waiting; once
  requests have waited a whole rate window (so the rates measure capacity, not a demand that just
  rose), ``e`` drops to what one replica is serving there (``served / ready``). While the fleet runs
  near its target utilization and calm, ``e`` grows by half the utilization headroom per lead time
  (``PROBE_SHARE``), but only up to that same step past the highest per-replica load seen calm in
  the last ``EVIDENCE_WINDOWS`` rate windows: a load never tried is not assumed to be safe. An idle
  or lightly loaded fleet teaches nothing and ``e`` stays put.
  Observations count only when the fleet had the same ready replicas for 1.5 rate windows (rates
  lag readiness; a fleet that just changed reads wrong).

The policy multiplies nominal demand by ``factor = max(kv factor, 1 / e)``. Both come from *past*
observations only, so more load in the current snapshot can never lower the answer.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from scaler import window
from scaler.signals import Signals

MIN_SERVED = 0.25
"""Replica units of served work below which nothing is observed (ratios of tiny rates are noise)."""

MIN_EFFICIENCY, MAX_EFFICIENCY = 0.05, 2.0
"""Bounds of the learned efficiency: outside them it is a broken measurement, not a workload."""

TAIL_FACTOR = 3.0
"""p95 / mean of an exponential waiting time (ln 20): a mean wait above budget / 3 breaks a p95 SLO."""

TAIL_DECREASE = 0.1
"""Share of the efficiency given up per rate window while the measured TTFT tail breaks the SLO at a
load the estimate already allows (the multiplicative decrease)."""

TAIL_SHARE = 0.05
"""Share of first tokens allowed after the TTFT SLO: the SLO is a p95."""

KV_FULL = 0.95
"""KV usage at which vLLM starts to preempt: with requests waiting, the fleet is at its edge."""

PROBE_SHARE = 0.5
"""Share of the utilization headroom (1/u − 1) the efficiency may grow by per lead time: a probe
that overshoots the real edge is then still inside the headroom when the replicas it calls for
arrive (u = 0.8 and a 240 s lead time: +12 % per lead time, 0.05 % a second)."""

LOADED = 0.85
"""A fleet serving at least this share of its target is loaded enough for its calm to mean slack."""

TAIL_FLOOR = 0.5
"""Lowest efficiency the measured tail alone can teach: first tokens late at any fleet size (prompts
whose own prefill outlasts the SLO) must not grow the fleet without bound; only a queue that lasts a
whole rate window (a measured throughput) can take the estimate lower."""

EVIDENCE_WINDOWS = 10
"""Rate windows over which calm observations bound the probe."""


@dataclass(frozen=True)
class CapacityMemory:
    """What the estimate remembers; ``CapacityMemory()`` knows nothing (efficiency 1)."""

    kv_ratios: window.Samples = ()
    """(t, KV share / token share) over the rate window."""
    ready: window.Samples = ()
    """(t, ready replicas) over 1.5 rate windows."""
    efficiency: float = 1.0
    updated_at: float | None = None
    calm_loads: window.Samples = ()
    """(t, served per ready replica) of calm observations over ``EVIDENCE_WINDOWS`` rate windows."""


@dataclass(frozen=True)
class Assessment:
    """The factors the policy applies now, and what was observed."""

    kv_replicas: float
    kv_factor: float
    efficiency: float
    factor: float
    saturated: bool
    queue_wait_s: float


def assess(memory: CapacityMemory, signals: Signals, served: float, mean_queue_replica_s: float,
           queued_throughout: bool, now: float, rate_window_s: float, target_utilization: float,
           ttft_s: float, lead_s: float, late_share: float | None = None) -> tuple[Assessment, CapacityMemory]:
    """Factors from past observations, and the memory updated with this snapshot's.

    ``late_share`` is the measured share of first tokens later than the SLO over the rate window (vLLM's
    TTFT histogram); when known it decides the edge (above ``TAIL_SHARE``) and the calm (at most half
    of it), instead of the queue-wait estimate (``ttft_s`` is then unused).

    ``mean_queue_replica_s`` is the mean waiting work over the rate window, in replica-seconds;
    ``queued_throughout`` says requests waited all window long, so its rates measure capacity.
    """
    usage = signals.kv_cache_usage
    ready = float(signals.ready_replicas)
    kv_replicas = min(max(usage, 0.0), 1.0) * ready if usage is not None else 0.0

    past_kv = tuple(s for s in window.since(memory.kv_ratios, now - rate_window_s) if s[0] < now)
    kv_factor = min(float(statistics.median(v for _, v in past_kv)), 1.0 / MIN_EFFICIENCY) if past_kv else 0.0
    efficiency = memory.efficiency
    factor = max(kv_factor, 1.0 / efficiency)

    ready_samples = window.push(memory.ready, now, ready, rate_window_s * 1.5)
    queue_wait_s = min(mean_queue_replica_s / served, 1e12) if served > 0 else 0.0
    kv_full = usage is not None and usage >= KV_FULL and signals.requests_waiting > 0
    steady = (now - ready_samples[0][0] >= rate_window_s and all(v == ready for _, v in ready_samples))
    observable = served >= MIN_SERVED and ready > 0 and steady
    per_replica = served / ready if ready > 0 else 0.0
    if late_share is not None:
        saturated = observable and late_share > TAIL_SHARE
        calm = observable and not saturated and late_share <= TAIL_SHARE / 2
    else:
        saturated = observable and (queue_wait_s > ttft_s / TAIL_FACTOR or kv_full)
        calm = observable and not saturated and queue_wait_s <= ttft_s / TAIL_FACTOR / 2
    dt = max(0.0, now - memory.updated_at) if memory.updated_at is not None else 0.0
    learned = efficiency
    if saturated and queued_throughout:
        learned = min(efficiency, per_replica)
    elif saturated and late_share is not None and signals.starting_replicas == 0:
        # the measured tail is late and no replica ordered for it is still on its way, without a queue
        # all window long to measure capacity by: decrease multiplicatively until the tail holds
        learned = min(efficiency, max(efficiency * (1.0 - TAIL_DECREASE * min(dt, rate_window_s) / rate_window_s),
                                      TAIL_FLOOR))
    calm_loads = window.since(memory.calm_loads, now - EVIDENCE_WINDOWS * rate_window_s)
    if calm:
        calm_loads = window.push_max(calm_loads, now, per_replica, EVIDENCE_WINDOWS * rate_window_s)
    if calm and per_replica >= LOADED * target_utilization * efficiency:
        # grow toward the loads seen calm, at most a probe step beyond them: never far past the evidence
        probe = PROBE_SHARE * (1.0 / target_utilization - 1.0)
        bound = (1.0 + probe) * max((v for _, v in calm_loads), default=0.0)  # already trimmed to the window
        grown = efficiency + probe / max(lead_s, rate_window_s) * min(dt, rate_window_s)
        learned = max(efficiency, min(grown, bound))
    learned = min(max(learned, MIN_EFFICIENCY), MAX_EFFICIENCY)

    kv_ratios = window.since(memory.kv_ratios, now - rate_window_s)
    if usage is not None and served >= MIN_SERVED:
        kv_ratios = window.push(kv_ratios, now, min(kv_replicas / served, 1.0 / MIN_EFFICIENCY), rate_window_s)
    updated = CapacityMemory(kv_ratios=kv_ratios, ready=ready_samples, efficiency=learned, updated_at=now,
                             calm_loads=calm_loads)
    return Assessment(kv_replicas, kv_factor, efficiency, factor, saturated, queue_wait_s), updated
