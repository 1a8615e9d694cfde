"""One rule for turning fleet-wide sums into ``Signals``, shared by every source and the simulator.

A source's job ends at *measuring*: the Prometheus source runs PromQL, the scrape source sums pods'
``/metrics``, the simulator's Prometheus sums its own scraped series. Each hands the same
``FleetTotals`` (what ``sum()``/``rate()`` gave, ``None`` or NaN where nothing came back) to
``assemble_signals``, which alone decides:

- no data: no replica reports the running gauge, and no activation query answered, is
  ``SourceError("no data ...")``; with an activation answer the model has no ready replica and the
  snapshot says so (zero load, ``ready_replicas=0`` unless the source counted pods, the activation value);
- the four load figures (token rates, waiting and running requests) must be finite and >= 0, or the
  answer is "no data" naming the signal: never a made-up 0;
- the optional ones (means, KV usage, prefix-cache share, KV size) are ``None`` unless finite and
  >= 0; shares are clamped to 1;
- histogram buckets keep only finite rates; the token-weighted prompt length comes from them
  (``scaler.histograms``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeGuard

from scaler import histograms
from scaler.signals import Signals
from scaler.sources.base import SourceError


@dataclass(frozen=True)
class FleetTotals:
    """One model's fleet-wide measurements at one instant, before any rule (``None``/NaN: nothing came back)."""

    at: float
    where: str
    """Which series, on which source (``model_name='chat' on Prometheus http://...``): for messages."""
    rate_window_s: float
    has_series: bool
    """Some replica reports ``vllm:num_requests_running``."""
    ready_replicas: float
    """Replicas reporting (a series count, or the pods a source saw); must be finite and >= 0 with series."""
    starting_replicas: int = 0
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    requests_waiting: float | None = None
    requests_running: float | None = None
    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None
    prompt_length_buckets: Mapping[float, float] = field(default_factory=dict)
    """Cumulative rates of ``vllm:request_prompt_tokens`` buckets, {le: per second}."""
    ttft_buckets: Mapping[float, float] = field(default_factory=dict)
    """Cumulative rates of ``vllm:time_to_first_token_seconds`` buckets, {le: per second}."""
    kv_cache_usage: float | None = None
    """Mean ``vllm:kv_cache_usage_perc`` over the ready replicas."""
    kv_cache_tokens: float | None = None
    prefix_cache_hit_share: float | None = None
    lead_time_s: float | None = None
    cold_starts_s: tuple[float, ...] = ()
    activation_value: float | None = None
    data_age_s: float = 0.0


def _usable(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value) and value >= 0


def _optional(value: float | None, cap: float = math.inf) -> float | None:
    return min(float(value), cap) if _usable(value) else None


def _finite_buckets(buckets: Mapping[float, float]) -> dict[float, float]:
    return {le: rate for le, rate in buckets.items() if math.isfinite(rate)}


def assemble_signals(totals: FleetTotals) -> Signals:
    """The snapshot the policy reads, or ``SourceError`` where the totals cannot support one (see module)."""
    if not totals.has_series:
        if totals.activation_value is not None:
            return Signals(at=totals.at, prompt_tokens_per_s=0.0, generation_tokens_per_s=0.0, requests_waiting=0.0,
                           requests_running=0.0, ready_replicas=int(totals.ready_replicas),
                           starting_replicas=totals.starting_replicas, activation_value=totals.activation_value,
                           lead_time_s=totals.lead_time_s, cold_starts_s=totals.cold_starts_s)
        raise SourceError(f"no data: no vllm:num_requests_running series for {totals.where} (no ready replica, a "
                          "wrong model name or label, or scraping is broken)")
    window = f"{totals.rate_window_s:g}s"
    required = {"prompt_tokens_per_s": f"rate() needs two samples within {window}",
                "generation_tokens_per_s": f"rate() needs two samples within {window}",
                "requests_waiting": "gauge missing", "requests_running": "gauge missing"}
    values: dict[str, float] = {}
    for name, hint in required.items():
        value = getattr(totals, name)
        if not _usable(value):
            raise SourceError(f"no data: {name} for {totals.where} is {value!r} ({hint})")
        values[name] = float(value)
    if not _usable(totals.ready_replicas):
        raise SourceError(f"no data: ready_replicas for {totals.where} is {totals.ready_replicas!r} (no series)")
    mean_prompt = _optional(totals.mean_prompt_tokens)
    return Signals(
        at=totals.at,
        **values,
        ready_replicas=int(totals.ready_replicas),
        starting_replicas=totals.starting_replicas,
        mean_prompt_tokens=mean_prompt,
        mean_output_tokens=_optional(totals.mean_output_tokens),
        prompt_tokens_weighted_mean=histograms.token_weighted_mean(_finite_buckets(totals.prompt_length_buckets),
                                                                   mean_prompt),
        ttft_buckets=tuple(sorted(_finite_buckets(totals.ttft_buckets).items())) or None,
        kv_cache_usage=_optional(totals.kv_cache_usage, 1.0),
        kv_cache_tokens=_optional(totals.kv_cache_tokens),
        prefix_cache_hit_share=_optional(totals.prefix_cache_hit_share, 1.0),
        lead_time_s=totals.lead_time_s,
        cold_starts_s=totals.cold_starts_s,
        activation_value=totals.activation_value,
        data_age_s=max(0.0, totals.data_age_s),
    )
