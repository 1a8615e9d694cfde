"""The one scaling decision, run live by the scaler and inside the simulator.

``decide(signals, state, config, now)`` is pure: no clock, no I/O, no randomness; its memory is the
immutable ``PolicyState`` it returns. It sizes a vLLM fleet in *replica units* (1.0 = the token work
one replica sustains within the SLO, ``ReplicaCapacity``) with one small model:

1. **capacity** of a replica at the SLO: prefill (with the n² attention term of long prompts,
   ``ReplicaCapacity.prefill_cost_factor``), decode within the TPOT SLO, the KV ledger; times the
   efficiency learned from the measured TTFT tail (``scaler.efficiency``, one rule);
2. **demand** as token work: what the fleet served plus the growth of the waiting backlog over the
   rate window (arrivals = served + backlog growth: a saturated fleet's throughput hides the rest),
   and the backlog itself;
3. **headroom** over the measured lead time, sized from the demand's own variability: the ``q``
   quantile of how far demand rose within past lead times (``scaler.forecast.level_headroom``: from the
   raw demand or its 5-minute average, whichever band is narrower),
   each lag weighed by how often a pod ordered now is still starting then (the measured cold starts).
   The fleet now must carry the peak of the next lead time, because nothing ordered now serves
   sooner, and nothing removed now comes back sooner: so scale-down happens only when the fleet
   that remains could carry that peak until it could scale back up. The KV cache in use gets the
   same band (it fills far faster than token work grows near its edge, where a fleet collapses);
4. **backlog**: the queue projected to when replicas ordered now could be ready, the replicas already
   starting counted as they come (no 2→4→8 runaway; one past its expected start as the measured
   starts say it still needs, ``scaler.lead_time.remaining_s``), cleared within ``backlog_drain_s``;
5. desired = ceil(max(peak, demand + projected backlog / drain time, KV peak / 0.9) / target utilization), the
   largest of the last ``scale_down_delay_s`` (KEDA's scale-down delay), within min/max and at
   least 1 while active.

The maths and every term are explained in docs/policy.md.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import cast

from scaler import efficiency, forecast, histograms, lead_time, window
from scaler.capacity import ReplicaCapacity
from scaler.limits import Limit
from scaler.signals import Signals

BIG = 1e12
"""Ceiling for every derived quantity: absurd but finite inputs give absurd but finite terms."""

MIN_WAIT_SHARE = 0.1
"""Share of the TTFT SLO always left for queueing, however long the prompts' own prefill."""

MAX_LEAD_TIME_S = 86_400.0
MAX_LEAD_TIME_SCALE = 10.0
"""A measured lead time above a day is a broken measurement; it is clipped, not trusted."""

HISTORY_SPACING_S = 15.0
"""One demand sample per Prometheus scrape interval in the headroom's history (240 = one hour)."""

LEVEL_TIME_CONSTANTS_S = (0.0, 300.0)
"""The demand levels the band is measured from, the narrowest band's level sizing the fleet: the raw demand
(0), and exponential averages over 2.5 and 10 minutes, for load whose minute-to-minute noise does not persist."""

KV_SAFE_USAGE = 0.9
"""Share of a replica's KV cache the fleet may plan to fill (vLLM preempts when it is full)."""


BandMemo = tuple[forecast.BandInputs, forecast.Headroom, forecast.LevelIndex]
"""A band's (inputs, headroom) and the index its inputs were read through (``_band``)."""
TrendMemo = tuple[tuple[object, ...], forecast.Trend]
"""A trend and what it was fitted on (``_trend``)."""


@dataclass(frozen=True)
class PolicyConfig:
    """The policy's settings; validated on construction (``ValueError`` naming field, value, range).

    Defaults and why: ``headroom_quantile`` 0.8: at a moment within the next lead time demand (and
    the KV cache in use) is within its band 80 % of the time (the lowest level at which every causally
    feasible row of the policy suite but mooncake x 2 met the SLO at every seed, docs/autoscaling.md;
    mooncake x 2 meets it too since a fresh state holds its fleet until a window shows slack;
    the late moments are what the queue and the 5 % TTFT budget absorb); ``headroom_history_s`` one
    hour: long enough for a hundred lead-time horizons, short enough to follow the hour's traffic;
    ``prior_rise`` 0.25 (the 0.8 target utilization it replaces) until ``prior_horizons`` horizons of evidence exist;
    ``backlog_drain_s`` 60 equals the usual rate window (a faster drain cannot be observed in 60 s
    rates, so it would only overshoot); ``target_utilization`` 1: the capacity is already the one
    within the SLO, and the headroom is measured, so no blind margin is added unless asked for.
    """

    capacity: ReplicaCapacity
    ttft_slo_s: float = 2.0
    target_utilization: float = 1.0
    """Share of the capacity at the SLO the fleet may plan to use, on top of the measured headroom."""
    lead_time_s: float = 180.0
    """The lead time when none is measured (``leadTime``); a measured one (``leadTime: auto``) wins."""
    lead_time_scale: float = 1.0
    """Look-ahead horizon as a multiple of the lead time (``leadTimeScale``): what ``tune`` searches, so a
    tuned ScaledObject keeps ``leadTime: auto`` and follows the measured cold start."""
    scale_down_delay_s: float = 300.0
    min_replicas: int = 0
    max_replicas: int = 1000
    activation_threshold: float = 0.0
    backlog_drain_s: float = 60.0
    """Seconds in which a backlog left when new replicas arrive should be cleared."""
    headroom_quantile: float = 0.8
    """Quantile of past lead-time rises of demand the fleet carries (the conformal level)."""
    headroom_history_s: float = 3600.0
    """Seconds of demand history whose lead-time rises size the headroom."""
    prior_rise: float = 0.25
    """Relative rise assumed before the history holds ``prior_horizons`` horizons."""
    prior_horizons: int = 5
    """Pseudo-observations of ``prior_rise`` (five minutes of 15 s samples), fading with evidence."""
    trend_window_s: float = 600.0
    """Seconds of demand history behind the trend of the forecast."""
    trend_confidence: float = 0.8
    """Two-sided confidence of the Theil–Sen interval whose lower bound is extrapolated."""
    rate_window_s: float = 60.0
    """Window of the token-rate signals; backlog growth is measured over the same window."""
    level_time_constants_s: tuple[float, ...] = LEVEL_TIME_CONSTANTS_S
    """Smoothings of the demand level the band may be measured from (``forecast.level_headroom``)."""

    def __post_init__(self) -> None:
        problems: list[tuple[str, object, str]] = []
        if not isinstance(self.capacity, ReplicaCapacity):
            problems.append(("capacity", self.capacity, "a ReplicaCapacity"))
        taus = self.level_time_constants_s
        if not (isinstance(taus, tuple) and taus and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < math.inf for x in taus)):
            problems.append(("level_time_constants_s", taus, "a non-empty tuple of finite seconds >= 0"))
        for name, limit in FIELD_LIMITS.items():
            value = getattr(self, name)
            if not limit.admits(value):
                problems.append((name, value, limit.text()))
        both = isinstance(self.max_replicas, int) and isinstance(self.min_replicas, int)
        if both and 1 <= self.max_replicas < self.min_replicas:
            problems.append(("max_replicas", self.max_replicas, f">= min_replicas={self.min_replicas!r}"))
        if problems:
            raise PolicyConfigError(problems)


FIELD_LIMITS: Mapping[str, Limit] = MappingProxyType({
    "ttft_slo_s": Limit(0.0, low_open=True),
    "target_utilization": Limit(0.0, 1.0, low_open=True),
    "lead_time_s": Limit(0.0, MAX_LEAD_TIME_S),
    "lead_time_scale": Limit(0.0, MAX_LEAD_TIME_SCALE),
    "scale_down_delay_s": Limit(0.0),
    "min_replicas": Limit(0, integer=True),
    "max_replicas": Limit(1, integer=True),
    "activation_threshold": Limit(),
    "backlog_drain_s": Limit(0.0, low_open=True),
    "headroom_quantile": Limit(0.0, 1.0, low_open=True, high_open=True),
    "headroom_history_s": Limit(0.0, low_open=True),
    "prior_rise": Limit(0.0, 100.0),
    "prior_horizons": Limit(0, integer=True),
    "trend_window_s": Limit(0.0, low_open=True),
    "trend_confidence": Limit(0.0, 1.0, low_open=True, high_open=True),
    "rate_window_s": Limit(0.0, low_open=True),
})
"""Every numeric ``PolicyConfig`` field's allowed values: the validation above, and the range of the
metadata key that sets it (``scaler.keys``), come from here."""


class PolicyConfigError(ValueError):
    """A ``PolicyConfig`` refused: ``problems`` lists (field, value given, what is allowed)."""

    def __init__(self, problems: list[tuple[str, object, str]]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid PolicyConfig: " + "; ".join(
            f"{name}={value!r}: must be {allowed}" for name, value, allowed in self.problems))


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between decisions; ``PolicyState()`` is the initial state."""

    demand: window.Samples = ()
    """(t, modelled demand in replica units), one per ``HISTORY_SPACING_S`` over the headroom history."""
    slopes: window.Samples = ()
    """(t, confident demand trend in replica units per second) at the times of ``demand``."""
    kv: window.Samples = ()
    """(t, KV cache in use, in replicas), one per ``HISTORY_SPACING_S`` over the headroom history."""
    bands: tuple[BandMemo, ...] = ()
    """The last decision's (inputs, headroom, index) of the demand band and the KV band: reused while they hold
    (``_band_holds``: the same selection and settings, measured on this history or, once it is full, less than
    a rate window ago)."""
    trend: TrendMemo | None = None
    """The last decision's trend and the samples it was fitted on: reused while those are the same."""
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


def _decode_context(signals: Signals) -> float | None:
    """Mean context a generated token attends to: its prompt plus half its output (None: unknown)."""
    prompt, output = signals.mean_prompt_tokens, signals.mean_output_tokens
    if prompt is None or output is None or prompt < 0 or output < 0:
        return None
    return _clip(prompt + output / 2.0)


def _work_per_waiting_token(signals: Signals, cap: ReplicaCapacity, prefill_factor: float,
                            decode_factor: float = 1.0) -> float:
    """Replica-seconds of work one waiting prompt token brings: its prefill (at the recent prompts'
    length-dependent cost) plus, when mean lengths are known, its share of decode (mean output / mean
    prompt tokens of generation). Without the means only prefill is counted: the queue drains, and
    TTFT is met, when prompts are admitted; their decode shows up in the generation rate once they
    run. Independent of the current rates, so more load never lowers it.
    """
    work = prefill_factor / cap.prefill_tokens_per_s
    mean_prompt, mean_output = signals.mean_prompt_tokens, signals.mean_output_tokens
    if mean_prompt is not None and mean_output is not None and mean_prompt > 0 and mean_output > 0:
        work += _clip(mean_output / mean_prompt) * decode_factor / cap.decode_tokens_per_s
    return _clip(work)


def _growth(waiting: window.Samples, now_tokens: float, now: float, over_s: float) -> float:
    """Growth of the waiting tokens over the last ``over_s`` (tokens/s, signed); 0 without that much
    history, except that a young history spanning half of it is used from its oldest sample."""
    past_t = now - over_s
    past = window.value_at(waiting, past_t)
    if past is None and waiting and now - waiting[0][0] >= over_s / 2:
        past_t, past = waiting[0]
    if past is None or now <= past_t:
        return 0.0
    return (now_tokens - past) / (now - past_t)


def _track_starting(previous: tuple[float, ...], starting: int, now: float) -> tuple[float, ...]:
    """FIFO of first-seen times: replicas that became ready are assumed to be the oldest ones."""
    kept = previous[len(previous) - starting:] if len(previous) > starting else previous
    return tuple(kept) + (now,) * (starting - len(kept))


def _band(last: BandMemo | None, history: window.Samples, slopes: window.Samples, lead_s: float, level: float,
          config: PolicyConfig, survival: lead_time.Survival | None,
          time_constants: tuple[float, ...] = (0.0,)) -> BandMemo:
    """(inputs, headroom, index) of one lead-time band: the last decision's while it still holds
    (``_band_holds``), else measured again on ``history``, with the index of that history (rebuilt only when
    the history or the lead time moved)."""
    settings = (config.headroom_quantile, config.prior_rise, config.prior_horizons, HISTORY_SPACING_S)
    if last is not None and _band_holds(last, history, lead_s, level, (*settings, survival, time_constants),
                                        config.rate_window_s, config.headroom_history_s - HISTORY_SPACING_S):
        carried = forecast.advance_level(last[1], history)
        return last if carried is last[1] else (last[0], carried, last[2])
    index = forecast.level_index(history, lead_s, last[2] if last is not None else None)
    inputs = (*forecast.headroom_inputs(history, slopes, lead_s, level, *settings, survival, index=index),
              time_constants)
    return inputs, forecast.level_headroom(history, slopes, lead_s, level, *settings, survival=survival,
                                           time_constants=time_constants), index


def _band_holds(last: BandMemo, history: window.Samples, lead_s: float, level: float, settings: tuple[object, ...],
                refresh_s: float, full_s: float) -> bool:
    """Whether the last band answers for this decision: same lead time and settings, ``level`` selects the
    horizons it was measured on (in the history it was measured on), and that history is this one, or, once it
    spans ``full_s`` (the headroom history, full), less than ``refresh_s`` (the rate window) older than this one.

    Why a full history may wait a rate window: its band pools about 225 horizons, so the three samples it skips
    are about 1 % of its evidence, and samples within one rate window are not independent observations (each is
    a rate over that window; the trend thins them the same way). Measuring it at each sample was three quarters
    of a decision's cost at an hour of history (docs/scaler.md). A young history's newest horizons are a large
    share of its evidence, and holding them back cost GPU-hours on the suite (docs/autoscaling.md). What never
    waits: a level that selects other horizons (a step to a load never seen gets the prior's band at once), a
    new lead time or new measured starts."""
    inputs, _, index = last
    history_span, run, same = inputs[0], inputs[2], inputs[3:]
    if same != (lead_s, *settings) or index.run(level) != run:
        return False
    if not history or not history_span:
        return not history and not history_span
    first, newest, _ = cast(tuple[float, float, int], history_span)  # window.span of the band's history
    age = history[-1][0] - newest
    return age == 0.0 or (newest - first >= full_s and 0.0 <= age < refresh_s)


def _trend(last: TrendMemo | None, samples: window.Samples, config: PolicyConfig) -> TrendMemo:
    """The demand trend over ``samples`` (the trend window of the history), the last decision's where it was
    fitted on the same samples: the history gains one only every ``HISTORY_SPACING_S``, so two rounds in three
    would refit the same points."""
    settings = (config.trend_confidence, config.trend_window_s, config.rate_window_s)
    key = (window.span(samples), *settings)
    if last is not None and last[0] == key:
        return last
    return key, forecast.robust_trend(samples, config.trend_confidence, config.trend_window_s / 2,
                                      spacing_s=config.rate_window_s)


def _fresh_hold_s(memory: efficiency.CapacityMemory, lead_s: float, config: PolicyConfig, active: bool) -> float:
    """How long a fresh state never goes below the fleet it finds: its first scale-down delay (it has no
    window yet), and while it serves and no judged window has shown slack, one lead time. Why: before such
    a window the capacity model is unverified (``efficiency`` starts at 1), and a fleet the model calls too
    big may be the one that is just coping; holding it steady is also what lets the efficiency judge its
    first windows, which a fleet that changes does not allow. One lead time bounds the cost: pods ordered
    at the start have landed by then, and a fleet that is never calm is not held for ever. An idle model
    has nothing to cope with: it may scale down (to zero) after the delay alone."""
    if memory.slack_seen or not active:
        return config.scale_down_delay_s
    return max(config.scale_down_delay_s, lead_s)


def decide(signals: Signals, state: PolicyState, config: PolicyConfig, now: float) -> Decision:
    """Desired replicas for one model at time ``now`` (seconds, the caller's clock)."""
    if not (isinstance(now, (int, float)) and math.isfinite(now)):
        raise ValueError(f"now={now!r}: must be a finite number of seconds")
    cap = config.capacity
    lead = signals.lead_time_s if signals.lead_time_s is not None and signals.lead_time_s >= 0 else None
    lead_s = min((lead if lead is not None else config.lead_time_s) * config.lead_time_scale, MAX_LEAD_TIME_S)

    # 1. demand as token work: served work plus backlog growth over the rate window (conservation of work)
    waiting_tokens, estimated = _waiting_tokens(signals, config)
    prompt_tps = _clip(signals.prompt_tokens_per_s)
    generation_tps = _clip(signals.generation_tokens_per_s)
    prompt_length, prompt_length_estimated = _prompt_length(signals)
    prefill_factor = _clip(cap.prefill_cost_factor(prompt_length))
    context = _decode_context(signals)
    decode_factor = _clip(cap.decode_cost_factor(context))
    # prompt tokens the prefix cache serves are not prefilled again (vLLM counts them as prompt tokens)
    cached = min(max(signals.prefix_cache_hit_share or 0.0, 0.0), 1.0)
    prefill_factor_uncached = prefill_factor * (1.0 - cached)
    served = _clip(prompt_tps * prefill_factor_uncached / cap.prefill_tokens_per_s
                   + generation_tps * decode_factor / cap.decode_tokens_per_s)
    work_per_token = _work_per_waiting_token(signals, cap, prefill_factor_uncached, decode_factor)
    # a request's TTFT is its wait plus its own prefill: only what the prefill leaves of the SLO may be spent waiting
    own_prefill_s = _clip((prompt_length or 0.0) * prefill_factor_uncached / cap.prefill_tokens_per_s)
    wait_budget_s = max(config.ttft_slo_s - own_prefill_s, config.ttft_slo_s * MIN_WAIT_SHARE)
    nominal_backlog = _clip(waiting_tokens * work_per_token)
    growth_tps = _growth(state.waiting, waiting_tokens, now, config.rate_window_s)
    # a backlog that alone makes first tokens late is a surge, and a rate window lags it by half its length:
    # read its growth over the last quarter window too (Knative's panic window), the larger wins
    surging = nominal_backlog > wait_budget_s * max(signals.ready_replicas, 1)
    if surging:
        growth_tps = max(growth_tps, _growth(state.waiting, waiting_tokens, now, config.rate_window_s / 4))
    nominal = _clip(served + max(-BIG, min(growth_tps, BIG)) * work_per_token)
    waiting_samples = window.push(state.waiting, now, waiting_tokens, config.rate_window_s * 1.5)
    recent_waiting = window.since(waiting_samples, now - config.rate_window_s)
    mean_queue = _clip(sum(v for _, v in recent_waiting) / len(recent_waiting) * work_per_token)

    # 2. what a replica really delivers (one rule, from past windows only: scaler.efficiency)
    measured_late = (histograms.share_above(dict(signals.ttft_buckets), config.ttft_slo_s)
                     if signals.ttft_buckets else None)
    queue_wait_s = min(mean_queue / served, BIG) if served > 0 else 0.0
    late_share = (measured_late if measured_late is not None
                  else efficiency.estimated_late_share(queue_wait_s, wait_budget_s) if served > 0 else None)
    seen, capacity_memory = efficiency.assess(state.capacity, signals, served, late_share, now, config.rate_window_s)
    backlog = _clip(nominal_backlog / seen.efficiency)

    # an idle model gets no headroom: scale-to-zero stays possible, activation wakes it
    active = (signals.requests_waiting > 0 or signals.requests_running > 0
              or (signals.activation_value is not None and signals.activation_value > config.activation_threshold))
    # 3. headroom: the quantile of how far demand rose within past lead times (modelled units, so the
    # efficiency learned later applies to the whole history)
    first_seen = now if state.first_seen is None else state.first_seen
    # a rate window that began before the scaler's first look may hold a ramp from nothing: not evidence
    recording = now - first_seen >= config.rate_window_s
    history = (forecast.push_spaced(state.demand, now, nominal, config.headroom_history_s, HISTORY_SPACING_S)
               if recording else state.demand)
    trend_memo = _trend(state.trend, window.since(history, now - config.trend_window_s), config)
    trend = trend_memo[1]
    slopes = (forecast.push_spaced(state.slopes, now, trend.used, config.headroom_history_s, HISTORY_SPACING_S)
              if recording and history and history[-1][0] == now else state.slopes)
    slopes = slopes[bisect.bisect_left(slopes, (history[0][0] if history else now,)):]  # in time order
    # a measured lead time comes with the starts behind it: weight each lag by how often a pod is still starting then
    still_starting = lead_time.survival(signals.cold_starts_s, config.lead_time_scale) if lead is not None else None
    demand_band = _band(state.bands[0] if state.bands else None, history, slopes, lead_s, nominal, config,
                        still_starting, config.level_time_constants_s)
    headroom = demand_band[1]
    # the level the band was measured from (the raw demand unless a smoothed one gave a narrower band); a surge
    # is read raw: it is the one change the queue already proves; so is an idle model (nothing to average, and
    # an average of the past would hold replicas that scale-to-zero should release)
    level = nominal if surging or not active else _clip(forecast.level_now(headroom, now, nominal))
    demand = _clip(level / seen.efficiency)
    slope = _clip(trend.used / seen.efficiency)
    forecast_demand = _clip(demand + slope * lead_s)
    peak = _clip(forecast_demand + headroom.rise * (max(demand, forecast.RISE_FLOOR) if active else demand))
    # the KV cache is the other resource a replica runs out of, and near its edge it fills faster than token
    # work grows: the same band, measured on the KV in use, so its rises are the ones the memory shows
    kv_history = (forecast.push_spaced(state.kv, now, seen.kv_replicas, config.headroom_history_s, HISTORY_SPACING_S)
                  if recording and signals.kv_cache_usage is not None
                  else state.kv[bisect.bisect_left(state.kv, (now - config.headroom_history_s,)):])
    kv_band = _band(state.bands[1] if state.bands else None, kv_history, (), lead_s, seen.kv_replicas, config,
                    still_starting)
    kv_headroom = kv_band[1]
    kv_peak = _clip(seen.kv_replicas + kv_headroom.rise * max(seen.kv_replicas, forecast.RISE_FLOOR)
                    if active else seen.kv_replicas)
    kv_demand = _clip(kv_peak / KV_SAFE_USAGE)

    # 4. backlog when new replicas could arrive, counting those already starting as they come
    starting_since = _track_starting(state.starting_since, signals.starting_replicas, now)
    # a pod past its expected start is a tail draw, still on its way (scaler.lead_time.remaining_s), read
    # from every start the source measured: the source owns the window, as it does for lead_time_s
    starts, window_n = signals.cold_starts_s, max(len(signals.cold_starts_s), 1)
    arrivals = tuple(max(lead_s - (now - t), lead_time.remaining_s(starts, now - t, window_n), 0.0)
                     for t in starting_since)
    projected = _clip(forecast.project_backlog(backlog, demand, slope, signals.ready_replicas, arrivals, lead_s))
    for_backlog = _clip(demand + projected / config.backlog_drain_s)

    # 5. replicas needed now: the lead time's peak, the backlog's drain, the KV ledger
    needed = min(max(peak, for_backlog, kv_demand) / config.target_utilization, float(config.max_replicas))

    # 6. bounds and the scale-down stabilization window
    recommended = min(max(math.ceil(needed - 1e-9), config.min_replicas), config.max_replicas)
    if active:
        recommended = max(recommended, 1)
    current = signals.ready_replicas + signals.starting_replicas
    recommendations = window.push_max(state.recommendations, now, float(recommended), config.scale_down_delay_s)
    stabilized = window.maximum(recommendations, now - config.scale_down_delay_s) or 0.0
    fresh_hold_s = _fresh_hold_s(capacity_memory, lead_s, config, active)
    if now - first_seen >= fresh_hold_s:
        fresh_hold_s = 0.0  # past it: the term and the reason say no hold
    else:
        stabilized = max(stabilized, float(current))  # a fresh state holds the fleet it finds
    desired = min(max(int(stabilized), recommended, config.min_replicas), config.max_replicas)

    terms = {
        "lead_time_s": lead_s,
        "waiting_tokens": waiting_tokens,
        "waiting_tokens_estimated": estimated,
        "prompt_tokens_weighted_mean": _clip(prompt_length) if prompt_length is not None else 0.0,
        "prompt_length_estimated": prompt_length_estimated,
        "prefill_cost_factor": prefill_factor,
        "prefix_cache_hit_share": cached,
        "decode_context_tokens": context if context is not None else 0.0,
        "decode_cost_factor": decode_factor,
        "served_replicas": served,
        "backlog_growth_tokens_per_s": max(-BIG, min(growth_tps, BIG)),
        "surging": 1.0 if surging else 0.0,
        "nominal_demand_replicas": nominal,
        "level_replicas": level,
        "level_time_constant_s": headroom.tau_s,
        "efficiency": seen.efficiency,
        "load_per_replica": _clip(seen.load_per_replica),
        "ttft_late_share": late_share if late_share is not None else 0.0,
        "ttft_measured": 1.0 if measured_late is not None else 0.0,
        "queue_wait_s": queue_wait_s,
        "wait_budget_s": wait_budget_s,
        "demand_replicas": demand,
        "kv_replicas": seen.kv_replicas,
        "headroom_rise": headroom.rise,
        "headroom_horizons": float(headroom.horizons),
        "trend_replicas_per_s": max(-BIG, min(trend.slope, BIG)),
        "trend_used_replicas_per_s": slope,
        "forecast_replicas": forecast_demand,
        "peak_replicas": peak,
        "backlog_replica_s": backlog,
        "projected_backlog_replica_s": projected,
        "ready_replicas": float(signals.ready_replicas),
        "starting_replicas": float(signals.starting_replicas),
        "needed_for_peak": peak,
        "needed_for_backlog": for_backlog,
        "kv_headroom_rise": kv_headroom.rise,
        "kv_peak_replicas": kv_peak,
        "needed_for_kv": kv_demand,
        "recommended_replicas": float(recommended),
        "stabilized_replicas": stabilized,
        "fresh_hold_s": fresh_hold_s,
        "desired_replicas": float(desired),
        "active": 1.0 if active else 0.0,
    }
    new_state = PolicyState(
        demand=history,
        kv=kv_history,
        bands=(demand_band, kv_band),
        trend=trend_memo,
        slopes=slopes,
        waiting=waiting_samples,
        capacity=capacity_memory,
        recommendations=recommendations,
        starting_since=starting_since,
        first_seen=first_seen,
    )
    outlook = _outlook(peak, for_backlog, projected, kv_demand, kv_peak, seen.kv_replicas, lead_s, headroom,
                       kv_headroom, config)
    reason = _reason(desired, recommended, current, outlook, config, fresh_hold_s)
    return Decision(desired, active, MappingProxyType(terms), reason, new_state)


def _outlook(peak: float, for_backlog: float, projected: float, kv_demand: float, kv_peak: float, kv_now: float,
             lead_s: float, headroom: forecast.Headroom, kv_headroom: forecast.Headroom, config: PolicyConfig) -> str:
    """What the largest of the three needs (the lead time's peak, the backlog's drain, the KV cache) says."""
    if kv_demand > max(peak, for_backlog):
        return (f"the KV cache in use ({kv_now:.2f} replicas' worth, up to {kv_peak:.2f} within the next "
                f"{lead_s:g} s: +{kv_headroom.rise:.0%}, the q{config.headroom_quantile:g} rise of "
                f"{kv_headroom.horizons} past lead times) needs {kv_demand:.2f} replicas at "
                f"{KV_SAFE_USAGE:.0%} each")
    if for_backlog > peak:
        return (f"a backlog of {projected:.1f} replica-seconds left when new replicas could arrive, cleared "
                f"within {config.backlog_drain_s:g} s, needs {for_backlog:.2f} replicas")
    return (f"peak demand {peak:.2f} replicas over the next {lead_s:g} s (+{headroom.rise:.0%}, the "
            f"q{config.headroom_quantile:g} rise of {headroom.horizons} past lead times)")


def _reason(desired: int, recommended: int, current: int, outlook: str, config: PolicyConfig,
            fresh_hold_s: float = 0.0) -> str:
    """One sentence a person can check against the terms."""
    if recommended < desired and fresh_hold_s > 0 and desired <= current:
        why = (f"its first {fresh_hold_s:g} s" if fresh_hold_s <= config.scale_down_delay_s
               else f"up to {fresh_hold_s:g} s (one lead time), until a judged window shows it has slack")
        return (f"keep {desired} (now {current}): {outlook}; that needs {recommended}, but a fresh scaler keeps the "
                f"fleet it found for {why}")
    if recommended < desired:
        return (f"keep {desired} (now {current}): {outlook}; that needs {recommended}, but scale-down waits out "
                f"the {config.scale_down_delay_s:g} s stabilization window")
    if desired > current:
        return f"scale up from {current} to {desired}: {outlook}"
    if desired < current:
        return f"scale down from {current} to {desired}: {outlook}, stable for {config.scale_down_delay_s:g} s"
    return f"hold {desired}: {outlook}"
