"""How much of its nominal capacity a replica really delivers on the current workload, learned online.

``ReplicaCapacity`` is measured on a reference mix. Long prompts, long contexts that fill the KV
cache, preemptions and recomputation make a replica deliver less token work than that, and only
the running fleet can tell by how much. Two observations, both in replica units of token work:

- **KV binding** (any load): the fleet's KV share (``kv_cache_usage × ready``) over its token share
  (``served``). Above 1 the KV cache fills before the token capacity does. Median of the previous
  rate window's observations.
- **Throughput at the SLO's edge**: when the mean queue wait over the rate window (Little's law:
  mean queued work / throughput) exceeds a third of the TTFT budget (the p95 of an exponential wait
  is ln 20 ≈ 3 × its mean), or the KV cache is full with requests waiting, the fleet is at the most
  it can serve within the SLO, and ``served / ready replicas`` *is* what one replica delivers: its
  efficiency. Observed only when the fleet has had the same ready replicas for a rate window and a
  half (rates lag readiness; a just-started fleet reads low). The median of such
  observations is remembered for ``memory_s`` (the workload mix changes over tens of minutes, and
  forgetting it as soon as the queue clears is what makes a fleet oscillate between too small and
  too large). An unsaturated fleet that serves more per replica than that proves it too low, and
  raises it.

The policy multiplies its demand by ``factor = max(kv factor, 1 / efficiency)``. Both come from
*past* observations only, so more load in the current snapshot can never lower the answer.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from scaler import window
from scaler.signals import Signals

MIN_SERVED = 0.25
"""Replica units of served work below which no ratio is observed (too noisy)."""

MIN_EFFICIENCY = 0.05
"""Floor on the learned efficiency (a 20x factor): lower is a broken measurement, not a workload."""

TAIL_FACTOR = 3.0
"""p95 / mean of an exponential waiting time (ln 20): a mean wait above budget / 3 breaks a p95 SLO."""

KV_FULL = 0.95
"""KV usage at which vLLM starts to preempt: with requests waiting, the fleet is saturated."""


@dataclass(frozen=True)
class CapacityMemory:
    """What the efficiency estimate remembers; ``CapacityMemory()`` knows nothing (factor 1)."""

    kv_ratios: window.Samples = ()
    """(t, KV share / token share) over the rate window."""
    ready: window.Samples = ()
    """(t, ready replicas) over the rate window: rates lag readiness, so compare like with like."""
    saturated: window.Samples = ()
    """(t, served per ready replica) while saturated, over ``memory_s``."""
    proven: float = 0.0
    """Most served per ready replica without saturation since the last saturated observation."""


@dataclass(frozen=True)
class Assessment:
    """The factors the policy applies now, and what was observed."""

    kv_replicas: float
    kv_factor: float
    efficiency: float
    factor: float
    saturated: bool
    queue_wait_s: float


def _median(samples: window.Samples) -> float | None:
    return float(statistics.median(v for _, v in samples)) if samples else None


def assess(memory: CapacityMemory, signals: Signals, served: float, mean_queue_replica_s: float, now: float,
           rate_window_s: float, memory_s: float, ttft_s: float) -> tuple[Assessment, CapacityMemory]:
    """Factors from past observations, and the memory updated with this snapshot's.

    ``mean_queue_replica_s`` is the mean waiting work over the rate window, in replica-seconds.
    """
    usage = signals.kv_cache_usage
    ready = float(signals.ready_replicas)
    kv_replicas = min(max(usage, 0.0), 1.0) * ready if usage is not None else 0.0

    past_kv = tuple(s for s in window.since(memory.kv_ratios, now - rate_window_s) if s[0] < now)
    kv_factor = min(max(_median(past_kv) or 1.0, 1.0), 1.0 / MIN_EFFICIENCY)
    past_saturated = tuple(s for s in window.since(memory.saturated, now - memory_s) if s[0] < now)
    learned = _median(past_saturated)
    efficiency = 1.0 if learned is None else min(max(learned, memory.proven, MIN_EFFICIENCY), 1.0)
    factor = max(kv_factor, 1.0 / efficiency)

    ready_samples = window.push(memory.ready, now, ready, rate_window_s * 1.5)
    in_window = window.since(ready_samples, now - rate_window_s)
    mean_ready = sum(v for _, v in in_window) / len(in_window)
    queue_wait_s = min(mean_queue_replica_s / served, 1e12) if served > 0 else 0.0
    kv_full = usage is not None and usage >= KV_FULL and signals.requests_waiting > 0
    observable = served >= MIN_SERVED and mean_ready > 0
    # rates over a window are comparable with the fleet only if the fleet was the same all window long
    steady = (now - ready_samples[0][0] >= rate_window_s
              and all(v == ready for _, v in window.since(ready_samples, now - rate_window_s * 1.5)))
    saturated = observable and steady and (queue_wait_s > ttft_s / TAIL_FACTOR or kv_full)

    kv_ratios = window.since(memory.kv_ratios, now - rate_window_s)
    if usage is not None and observable:
        kv_ratios = window.push(kv_ratios, now, min(kv_replicas / served, 1.0 / MIN_EFFICIENCY), rate_window_s)
    saturated_samples = window.since(memory.saturated, now - memory_s)
    proven = memory.proven
    if saturated:
        saturated_samples = window.push(saturated_samples, now, served / mean_ready, memory_s)
        proven = 0.0
    elif observable and steady:
        proven = max(proven, min(served / mean_ready, 1.0))
    updated = CapacityMemory(kv_ratios=kv_ratios, ready=ready_samples, saturated=saturated_samples, proven=proven)
    return Assessment(kv_replicas, kv_factor, efficiency, factor, saturated, queue_wait_s), updated


def tail_utilization(mean_prompt_tokens: float | None, prefill_tokens_per_s: float, ttft_s: float) -> float:
    """Highest utilization at which the TTFT tail still fits the budget, from the prompt lengths.

    A replica shares its steps among the prompts it prefills (chunked prefill is processor sharing),
    so a prompt of P tokens on a replica busy ``rho`` of the time takes about P / (C (1 − rho)) (the
    M/G/1-PS response time). Prompt lengths have roughly exponential tails, so the p95 prompt is
    about ``TAIL_FACTOR`` × the mean; it meets the budget while rho ≤ 1 − 3 · mean / (C · TTFT).
    Short prompts give ~1 (the configured target rules); 15k-token prompts against a 2 s budget give
    ~0.4. Unknown mean: 1 (no cap).
    """
    if mean_prompt_tokens is None or mean_prompt_tokens <= 0:
        return 1.0
    rho = 1.0 - TAIL_FACTOR * mean_prompt_tokens / (prefill_tokens_per_s * ttft_s)
    return min(max(rho, MIN_EFFICIENCY), 1.0)
