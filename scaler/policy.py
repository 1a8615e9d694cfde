"""The one scaling decision, run live by the scaler and inside the simulator.

``decide(signals, state, config, now)`` is pure: no clock, no I/O, no randomness; its memory is the
immutable ``PolicyState`` it returns. It sizes a vLLM fleet in *replica units* (1.0 = the token work
one replica sustains within the SLO, ``ReplicaCapacity``):

1. demand = prompt tokens/s × their length-dependent cost ÷ prefill capacity (long prompts cost
   more per token: ``ReplicaCapacity.prefill_cost_factor``) + generated tokens/s ÷ decode capacity, plus the
   growth of the waiting backlog over the rate window (a saturated fleet's throughput understates
   what arrives: arrivals = served + backlog growth), scaled by what a replica really delivers on
   this workload (``scaler.efficiency``, learned from the fleet's measured TTFT tail, queue and KV cache);
2. forecast = demand + the confident part of its robust trend × lead time (peak, and sustained);
3. projected backlog = what is still queued when replicas ordered now could be ready, with the
   replicas already starting counted as they come (no 2→4→8 runaway);
4. needed = max(max(sustained forecast, current demand) ÷ target utilization, peak forecast,
   peak forecast + projected backlog ÷ drain time);
5. desired = the largest recommendation of the last ``scale_down_delay_s`` (scale-up is immediate,
   scale-down waits), bounded by min/max and at least 1 while active; never below the current fleet
   while the measured TTFT tail misses the SLO (``tail_hold``).

The maths and every term are explained in docs/policy.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from scaler import efficiency, forecast, histograms, window
from scaler.capacity import ReplicaCapacity
from scaler.signals import Signals

BIG = 1e12
"""Ceiling for every derived quantity: absurd but finite inputs give absurd but finite terms."""

MIN_WAIT_SHARE = 0.1
"""Share of the TTFT SLO always left for queueing, however long the prompts' own prefill."""

MAX_LEAD_TIME_S = 86_400.0
"""A measured lead time above a day is a broken measurement; it is clipped, not trusted."""


@dataclass(frozen=True)
class PolicyConfig:
    """The policy's settings; validated on construction (``ValueError`` naming field, value, range).

    Defaults and why: ``target_utilization`` 0.8 leaves room for arrival variance within the SLO;
    ``backlog_drain_s`` 60 equals the usual rate window (a faster drain cannot be observed in 60 s
    rates, so it would only overshoot); ``trend_window_s`` 600 is over twice the lead time (the
    forecast never reaches further ahead than the evidence behind it) and holds 10 independent
    points at one per 60 s rate window, enough for Theil–Sen to shrug off outliers and bursts;
    ``trend_confidence`` 0.8 extrapolates only a slope that is positive with 90 % one-sided confidence.
    """

    capacity: ReplicaCapacity
    ttft_slo_s: float = 2.0
    target_utilization: float = 0.8
    lead_time_s: float = 180.0
    scale_down_delay_s: float = 300.0
    min_replicas: int = 0
    max_replicas: int = 1000
    activation_threshold: float = 0.0
    backlog_drain_s: float = 60.0
    """Seconds in which a backlog left when new replicas arrive should be cleared."""
    trend_window_s: float = 600.0
    """Seconds of demand history behind the trend."""
    trend_confidence: float = 0.8
    """Two-sided confidence of the Theil–Sen interval whose lower bound is extrapolated."""
    rate_window_s: float = 60.0
    """Window of the token-rate signals; backlog growth is measured over the same window."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not isinstance(self.capacity, ReplicaCapacity):
            problems.append(f"capacity={self.capacity!r}: must be a ReplicaCapacity")

        def number(name: str, low: float, high: float, low_open: bool, allowed: str) -> None:
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            ok = ok and (value > low if low_open else value >= low) and value <= high
            if not ok:
                problems.append(f"{name}={value!r}: must be {allowed}")

        number("ttft_slo_s", 0.0, math.inf, True, "a finite number > 0")
        number("target_utilization", 0.0, 1.0, True, "a number with 0 < u <= 1")
        number("lead_time_s", 0.0, MAX_LEAD_TIME_S, False, f"a number in [0, {MAX_LEAD_TIME_S:g}]")
        number("scale_down_delay_s", 0.0, math.inf, False, "a finite number >= 0")
        number("activation_threshold", -math.inf, math.inf, False, "a finite number")
        number("backlog_drain_s", 0.0, math.inf, True, "a finite number > 0")
        number("trend_window_s", 0.0, math.inf, True, "a finite number > 0")
        number("trend_confidence", 0.0, 1.0, True, "a number with 0 < c < 1")
        number("rate_window_s", 0.0, math.inf, True, "a finite number > 0")
        if self.trend_confidence == 1.0:
            problems.append("trend_confidence=1.0: must be a number with 0 < c < 1")
        for name in ("min_replicas", "max_replicas"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                problems.append(f"{name}={value!r}: must be an integer >= 0")
        if isinstance(self.max_replicas, int) and isinstance(self.min_replicas, int):
            if self.max_replicas < 1:
                problems.append(f"max_replicas={self.max_replicas!r}: must be >= 1")
            elif self.max_replicas < self.min_replicas:
                problems.append(f"max_replicas={self.max_replicas!r}: must be >= min_replicas={self.min_replicas!r}")
        if problems:
            raise ValueError("invalid PolicyConfig: " + "; ".join(problems))


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between decisions; ``PolicyState()`` is the initial state."""

    demand: window.Samples = ()
    """(t, demand in replica units) over ``trend_window_s``: the trend's input."""
    waiting: window.Samples = ()
    """(t, waiting tokens) over the rate window: backlog growth."""
    capacity: efficiency.CapacityMemory = field(default_factory=efficiency.CapacityMemory)
    """What one replica really delivers on this workload (``scaler.efficiency``)."""
    recommendations: window.Samples = ()
    """(t, recommended replicas) over ``scale_down_delay_s``: the scale-down stabilization window."""
    starting_since: tuple[float, ...] = ()
    """When each replica now starting was first seen (oldest first): its expected arrival."""
    first_seen: float | None = None
    """Time of the first decision: before ``scale_down_delay_s`` of history, never go below the fleet."""


@dataclass(frozen=True)
class Decision:
    """The desired replica count, whether the model is active, and everything behind the number."""

    desired_replicas: int
    active: bool
    terms: Mapping[str, float]
    reason: str
    state: PolicyState = field(repr=False)


def _clip(x: float) -> float:
    """Keep a derived value finite and non-negative (NaN becomes 0)."""
    return min(max(x, 0.0), BIG) if x == x else 0.0


def _waiting_tokens(signals: Signals, config: PolicyConfig) -> tuple[float, float]:
    """Waiting prompt tokens and 1.0 when estimated.

    vLLM exports no waiting-token count: estimate it as waiting requests × mean prompt length. With
    no mean known, assume each waiting request fills its share of the KV cache
    (``kv_cache_tokens / max_num_seqs``): a deliberately generous size, so a queue is never mistaken
    for a light one.
    """
    if signals.waiting_tokens is not None:
        return _clip(signals.waiting_tokens), 0.0
    mean = signals.mean_prompt_tokens
    if mean is None or mean <= 0:
        mean = config.capacity.kv_cache_tokens / config.capacity.max_num_seqs
    return _clip(signals.requests_waiting * mean), 1.0


def _prompt_length(signals: Signals) -> tuple[float | None, float]:
    """The token-weighted mean prompt length behind the prefill cost, and 1.0 when estimated.

    Without vLLM's prompt-length histogram buckets, the request mean stands in: it is a lower bound
    (``Σn²/Σn >= Σn/N``), so long-prompt work is then under- never over-counted, and the term says so.
    """
    if signals.prompt_tokens_weighted_mean is not None:
        return signals.prompt_tokens_weighted_mean, 0.0
    return signals.mean_prompt_tokens, 1.0 if signals.mean_prompt_tokens is not None else 0.0


def _work_per_waiting_token(signals: Signals, cap: ReplicaCapacity, prefill_factor: float) -> float:
    """Replica-seconds of work one waiting prompt token brings: its prefill (at the recent prompts'
    length-dependent cost) plus, when mean lengths are known, its share of decode (mean output / mean
    prompt tokens of generation). Without the means only prefill is counted: the queue drains, and
    TTFT is met, when prompts are admitted; their decode shows up in the generation rate once they
    run. Independent of the current rates, so more load never lowers it.
    """
    work = prefill_factor / cap.prefill_tokens_per_s
    mean_prompt, mean_output = signals.mean_prompt_tokens, signals.mean_output_tokens
    if mean_prompt is not None and mean_output is not None and mean_prompt > 0 and mean_output > 0:
        work += _clip(mean_output / mean_prompt) / cap.decode_tokens_per_s
    return _clip(work)


def _track_starting(previous: tuple[float, ...], starting: int, now: float) -> tuple[float, ...]:
    """FIFO of first-seen times: replicas that became ready are assumed to be the oldest ones."""
    kept = previous[len(previous) - starting:] if len(previous) > starting else previous
    return tuple(kept) + (now,) * (starting - len(kept))


def decide(signals: Signals, state: PolicyState, config: PolicyConfig, now: float) -> Decision:
    """Desired replicas for one model at time ``now`` (seconds, the caller's clock)."""
    if not (isinstance(now, (int, float)) and math.isfinite(now)):
        raise ValueError(f"now={now!r}: must be a finite number of seconds")
    cap = config.capacity
    lead = signals.lead_time_s if signals.lead_time_s is not None and signals.lead_time_s >= 0 else None
    lead_s = min(lead if lead is not None else config.lead_time_s, MAX_LEAD_TIME_S)

    # 1. demand: served work plus backlog growth over the rate window (conservation of work)
    waiting_tokens, estimated = _waiting_tokens(signals, config)
    prompt_tps = _clip(signals.prompt_tokens_per_s)
    generation_tps = _clip(signals.generation_tokens_per_s)
    prompt_length, prompt_length_estimated = _prompt_length(signals)
    prefill_factor = _clip(cap.prefill_cost_factor(prompt_length))
    served = _clip(prompt_tps * prefill_factor / cap.prefill_tokens_per_s + generation_tps / cap.decode_tokens_per_s)
    work_per_token = _work_per_waiting_token(signals, cap, prefill_factor)
    growth_tps = 0.0
    past_t = now - config.rate_window_s
    past = window.value_at(state.waiting, past_t)
    if past is None and state.waiting and now - state.waiting[0][0] >= config.rate_window_s / 2:
        past_t, past = state.waiting[0]  # young history: the oldest sample if it spans half the window
    if past is not None:
        growth_tps = (waiting_tokens - past) / (now - past_t)
    nominal = _clip(served + max(-BIG, min(growth_tps, BIG)) * work_per_token)
    nominal_backlog = _clip(waiting_tokens * work_per_token)
    waiting_samples = window.push(state.waiting, now, waiting_tokens, config.rate_window_s * 1.5)
    recent_waiting = window.since(waiting_samples, now - config.rate_window_s)
    mean_queue = _clip(sum(v for _, v in recent_waiting) / len(recent_waiting) * work_per_token)
    # a queue all window long: the rates of that window are what the fleet can do, not what it was asked
    queued_throughout = (waiting_samples[0][0] <= now - config.rate_window_s
                         and all(v > 0 for _, v in recent_waiting))

    # 2. what a replica really delivers on this workload (learned from past snapshots only)
    # a request's TTFT is its wait plus its own prefill: only what the prefill leaves of the SLO may be spent
    # waiting (a long-prompt workload runs at its edge with a shorter queue than a chat one)
    own_prefill_s = _clip((prompt_length or 0.0) * prefill_factor / cap.prefill_tokens_per_s)
    wait_budget_s = max(config.ttft_slo_s - own_prefill_s, config.ttft_slo_s * MIN_WAIT_SHARE)
    late_share = (histograms.share_above(dict(signals.ttft_buckets), config.ttft_slo_s)
                  if signals.ttft_buckets else None)
    seen, capacity_memory = efficiency.assess(state.capacity, signals, served, mean_queue, queued_throughout, now,
                                              config.rate_window_s, config.target_utilization, wait_budget_s,
                                              lead_s, late_share)
    level = _clip(seen.factor * nominal)

    # 3. forecast over the lead time from the confident part of the trend (of nominal demand)
    demand_samples = window.push(state.demand, now, nominal, config.trend_window_s)
    trend = forecast.robust_trend(demand_samples, config.trend_confidence, config.trend_window_s / 2,
                                  spacing_s=config.rate_window_s)
    slope = _clip(seen.factor * trend.used)
    predicted = _clip(level + slope * lead_s)
    recent = window.since(demand_samples, now - lead_s)
    sustained = _clip(seen.factor * sum(v for _, v in recent) / len(recent))
    predicted_sustained = _clip(sustained + slope * (lead_s + (now - recent[0][0]) / 2))

    # 4. backlog when new replicas could arrive, counting those already starting as they come
    starting_since = _track_starting(state.starting_since, signals.starting_replicas, now)
    arrivals = tuple(max(0.0, lead_s - (now - t)) for t in starting_since)
    backlog = _clip(seen.factor * nominal_backlog)
    projected = _clip(forecast.project_backlog(backlog, level, slope, signals.ready_replicas, arrivals, lead_s))

    # 5. replicas needed at the horizon
    for_utilization = max(predicted_sustained, level, seen.kv_replicas) / config.target_utilization
    for_peak = predicted
    for_backlog = predicted + projected / config.backlog_drain_s
    needed = min(max(for_utilization, for_peak, for_backlog), float(config.max_replicas))

    # 6. activity, bounds and the scale-down stabilization window
    active = (signals.requests_waiting > 0 or signals.requests_running > 0
              or (signals.activation_value is not None and signals.activation_value > config.activation_threshold))
    recommended = min(max(math.ceil(needed - 1e-9), config.min_replicas), config.max_replicas)
    if active:
        recommended = max(recommended, 1)
    current = signals.ready_replicas + signals.starting_replicas
    # a fleet whose measured tail misses the SLO is never made smaller, whatever the estimate says
    tail_hold = late_share is not None and late_share > efficiency.TAIL_SHARE and recommended < current
    if tail_hold:
        recommended = min(current, config.max_replicas)
    recommendations = window.push_max(state.recommendations, now, float(recommended), config.scale_down_delay_s)
    stabilized = window.maximum(recommendations, now - config.scale_down_delay_s) or 0.0
    first_seen = now if state.first_seen is None else state.first_seen
    if now - first_seen < config.scale_down_delay_s:
        stabilized = max(stabilized, float(current))  # a fresh scaler has no window yet: hold the fleet
    desired = min(max(int(stabilized), recommended, config.min_replicas), config.max_replicas)

    terms = {
        "lead_time_s": lead_s,
        "waiting_tokens": waiting_tokens,
        "waiting_tokens_estimated": estimated,
        "prompt_tokens_weighted_mean": _clip(prompt_length) if prompt_length is not None else 0.0,
        "prompt_length_estimated": prompt_length_estimated,
        "prefill_cost_factor": prefill_factor,
        "served_replicas": served,
        "backlog_growth_tokens_per_s": max(-BIG, min(growth_tps, BIG)),
        "nominal_demand_replicas": nominal,
        "kv_replicas": seen.kv_replicas,
        "kv_factor": seen.kv_factor,
        "efficiency": seen.efficiency,
        "capacity_factor": seen.factor,
        "saturated": 1.0 if seen.saturated else 0.0,
        "demand_replicas": level,
        "trend_replicas_per_s": max(-BIG, min(trend.slope, BIG)),
        "trend_used_replicas_per_s": slope,
        "forecast_replicas": predicted,
        "sustained_demand_replicas": sustained,
        "sustained_forecast_replicas": predicted_sustained,
        "backlog_replica_s": backlog,
        "queue_wait_s": seen.queue_wait_s,
        "wait_budget_s": wait_budget_s,
        "ttft_late_share": late_share if late_share is not None else 0.0,
        "ttft_measured": 1.0 if late_share is not None else 0.0,
        "projected_backlog_replica_s": projected,
        "tail_hold": 1.0 if tail_hold else 0.0,
        "ready_replicas": float(signals.ready_replicas),
        "starting_replicas": float(signals.starting_replicas),
        "needed_for_utilization": for_utilization,
        "needed_for_peak": for_peak,
        "needed_for_backlog": for_backlog,
        "recommended_replicas": float(recommended),
        "stabilized_replicas": stabilized,
        "desired_replicas": float(desired),
        "active": 1.0 if active else 0.0,
    }
    new_state = PolicyState(
        demand=demand_samples,
        waiting=waiting_samples,
        capacity=capacity_memory,
        recommendations=recommendations,
        starting_since=starting_since,
        first_seen=first_seen,
    )
    reason = _reason(desired, recommended, current, predicted, lead_s, config)
    if tail_hold and desired == current:
        reason = (f"hold {desired}: {late_share:.0%} of first tokens came after the {config.ttft_slo_s:g} s SLO, "
                  f"and a fleet missing its SLO is not made smaller")
    return Decision(desired, active, MappingProxyType(terms), reason, new_state)


def _reason(desired: int, recommended: int, current: int, predicted: float, lead_s: float,
            config: PolicyConfig) -> str:
    """One sentence a person can check against the terms."""
    outlook = f"forecast demand {predicted:.2f} replicas in {lead_s:g} s at {config.target_utilization:g} target"
    if recommended < desired:
        return (f"keep {desired} (now {current}): {outlook} needs {recommended}, but scale-down waits out the "
                f"{config.scale_down_delay_s:g} s stabilization window")
    if desired > current:
        return f"scale up from {current} to {desired}: {outlook}"
    if desired < current:
        return f"scale down from {current} to {desired}: {outlook}, stable for {config.scale_down_delay_s:g} s"
    return f"hold {desired}: {outlook}"
