"""The clairvoyant reference: fewest replica-seconds that still meet the SLO, knowing the future.

The oracle sees every future arrival and the exact cold start of every pod it will start. Method:

1. **Need per bucket** (30 s): the replica-seconds of work arriving in the bucket / 30 s. A request's
   work is its prefill compute from the profile's step-time model (linear plus quadratic attention,
   so long prompts weigh what they cost) plus its output tokens at the decode rate within the TPOT
   SLO (``ReplicaCapacity``); a request keeps running after its bucket, so each bucket's need is the
   max over itself and the previous bucket.
2. **Headroom** ``alpha``: replicas(bucket) = ceil(alpha x need). ``alpha`` is the one free knob; the
   smallest one whose *simulated* run meets the SLO is found by bisection (``search_alpha``), so the
   bound is verified by the same simulator that judges every policy, not trusted from the model.
3. **Levels**: replica j is wanted while replicas(bucket) >= j. A gap in level j shorter than the
   cold start is bridged (stopping and restarting would cost the GPU the same cold start again), so
   each level becomes a few intervals, each served by one pod.
4. **Provisioning one cold start early**: the pod of an interval starting at ``s`` is created at
   ``s - cold_start`` with that pod's exact cold start (drawn in order from the run's generator), so
   it turns Ready exactly at ``s``; it is deleted at the interval's end (and drains like any pod).
   Pods needed before their cold start could elapse start warm at t = 0, up to the warm fleet every
   policy starts with; beyond it they are created at t = 0 like any policy's.

What this is and is not: the optimum *within this family of schedules* (per-bucket need x one
headroom factor), verified by simulation. It is not a proof that no schedule could use fewer
replica-seconds (a schedule that misses the SLO only in chosen buckets might); it is a clairvoyant
reference a causal autoscaler cannot beat by much, and the policy is judged against it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from scaler.capacity import ReplicaCapacity

BUCKET_S = 30.0


@dataclass(frozen=True)
class PodPlan:
    """One oracle pod: created at ``create_at``, Ready at ``ready_at``, deleted at ``delete_at``."""

    create_at: float
    ready_at: float
    delete_at: float
    cold_start_s: float
    warm: bool = False


def request_work(input_tokens: np.ndarray, output_tokens: np.ndarray, capacity: ReplicaCapacity,
                 profile: Any = None) -> np.ndarray:
    """Replica-seconds each request costs: its prefill plus its share of decode.

    With the profile's step-time model, prefill costs its marginal compute, ``per_token_s x n`` plus
    causal attention ``prefill_attention_s x n^2 / 2`` (the same for any chunking) plus
    ``per_prefill_seq_s`` per chunk of ``max_num_batched_tokens``: long prompts cost more than their token
    count says. Without one, ``n / prefill capacity``. Decode: output tokens /
    decode capacity (the batched rate within the TPOT SLO).
    """
    n = np.asarray(input_tokens, dtype=float)
    st = getattr(profile, "step_time", None)
    per_token, attention = getattr(st, "per_token_s", None), getattr(st, "prefill_attention_s", None)
    if isinstance(per_token, float) and isinstance(attention, float):
        prefill = per_token * n + attention * n * n / 2.0
        budget = getattr(profile, "max_num_batched_tokens", None)
        per_chunk = float(getattr(st, "per_prefill_seq_s", 0.0) or 0.0)
        if per_chunk > 0 and isinstance(budget, int) and budget > 0:  # each chunk of a prompt runs one prefill
            prefill = prefill + per_chunk * np.ceil(np.maximum(n, 1.0) / budget)
    else:
        prefill = n / capacity.prefill_tokens_per_s
    return cast(np.ndarray, prefill + np.asarray(output_tokens, dtype=float) / capacity.decode_tokens_per_s)


def bucket_need(arrival_s: np.ndarray, work_s: np.ndarray, duration_s: float, bucket_s: float = BUCKET_S,
                ) -> np.ndarray:
    """Replica units of work arriving in each bucket (max of the bucket and the one before: a request
    keeps running after the bucket it arrived in)."""
    n = max(1, math.ceil(duration_s / bucket_s))
    index = np.minimum((np.asarray(arrival_s) // bucket_s).astype(np.int64), n - 1)
    work = np.bincount(index, weights=np.asarray(work_s, dtype=float), minlength=n) / bucket_s
    return np.maximum(work, np.r_[0.0, work[:-1]])


def replicas_per_bucket(need: np.ndarray, alpha: float, min_replicas: int = 1) -> np.ndarray:
    """ceil(alpha x need) per bucket, at least ``min_replicas``."""
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"oracle alpha={alpha!r}: must be a finite number > 0")
    return np.maximum(np.ceil(alpha * need - 1e-9).astype(np.int64), min_replicas)


def level_intervals(replicas: np.ndarray, bucket_s: float, bridge_s: float) -> list[tuple[float, float]]:
    """(start, end) intervals, one per pod: each level's runs with gaps under ``bridge_s`` bridged."""
    out: list[tuple[float, float]] = []
    top = int(replicas.max()) if replicas.size else 0
    for level in range(1, top + 1):
        on = replicas >= level
        runs: list[list[float]] = []
        k = 0
        while k < on.size:
            if not on[k]:
                k += 1
                continue
            start = k
            while k < on.size and on[k]:
                k += 1
            s, e = start * bucket_s, k * bucket_s
            if runs and s - runs[-1][1] < bridge_s:
                runs[-1][1] = e
            else:
                runs.append([s, e])
        out.extend((s, e) for s, e in runs)
    return out


def plan_pods(replicas: np.ndarray, bucket_s: float, draw_cold_start: Callable[[], float],
              bridge_s: float, warm_limit: int | None = None) -> list[PodPlan]:
    """Pods for the schedule, each created one (exact) cold start before it is wanted. A pod wanted
    sooner than its cold start allows is one of the warm fleet at t = 0, up to ``warm_limit`` pods (the
    fleet every policy starts with); any more are created at t = 0 and are ready one cold start later,
    as a causal policy's would be."""
    plans = []
    warm = 0
    # of the pods wanted from t = 0, the longest-lived are the warm ones
    for start, end in sorted(level_intervals(replicas, bucket_s, bridge_s), key=lambda se: (se[0], -se[1])):
        cold = draw_cold_start() if start > 0.0 else 0.0
        if start - cold < 0.0 or start <= 0.0:
            if warm_limit is None or warm < warm_limit:
                warm += 1
                plans.append(PodPlan(0.0, 0.0, end, 0.0, warm=True))
            else:
                cold = cold or draw_cold_start()
                if cold < end:
                    plans.append(PodPlan(0.0, cold, end, cold))
        else:
            plans.append(PodPlan(start - cold, start, end, cold))
    return plans


def replica_seconds(plans: list[PodPlan], end_s: float) -> float:
    """GPU-seconds the plan holds (creation to deletion, clipped to the run), drains excluded."""
    return sum(max(0.0, min(p.delete_at, end_s) - p.create_at) for p in plans)


def search_alpha(meets: Callable[[float], bool], start: float = 1.25, low: float = 0.6, high: float = 2.5,
                 steps: int = 4) -> float:
    """Smallest alpha in [low, high] with ``meets(alpha)`` (a simulation each), by bisection from ``start``.

    One run at ``start`` picks the half to search, then ``steps`` halvings: ``1 + steps`` runs, plus
    one at ``high`` only if nothing below it met the SLO. TTFT falls off a cliff when a bucket is
    short of replicas, so the answer is a threshold and bisection finds it.
    """
    if not (0 < low <= start <= high):
        raise ValueError(f"oracle search: need 0 < low={low!r} <= start={start!r} <= high={high!r}")
    if meets(start):
        lo, hi, verified = low, start, True
    else:
        lo, hi, verified = start, high, False
    for _ in range(steps):
        mid = (lo + hi) / 2
        if meets(mid):
            hi, verified = mid, True
        else:
            lo = mid
    if not verified:
        meets(hi)
    return hi


def alpha_plans(need: np.ndarray, alpha: float, cold: Any, seed: int, initial: int,
                min_replicas: int) -> list[PodPlan]:
    """The headroom-alpha schedule's pods, its cold starts (a ``ColdStart``) drawn in order from the
    run's stream, gaps bridged by the mean cold start: the oracle before issue #11, kept as a candidate."""
    rng = np.random.default_rng([seed, 4])
    replicas = replicas_per_bucket(need, alpha, min_replicas)
    return plan_pods(replicas, BUCKET_S, lambda: cold.sample(rng), bridge_s=cold.mean(), warm_limit=initial)
