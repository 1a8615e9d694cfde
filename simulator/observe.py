"""What Prometheus would show of the simulated fleet, and the ``Signals`` the live scaler would build.

Policies in the simulator see only what they would see live. So replicas are *scraped* (every
``scrape_interval_s``, 15 s, each replica at its own phase), only while Ready (a starting pod's
``/metrics`` does not answer yet; a draining pod has left the Service's endpoints), and every query
is answered from those samples:

- gauges are the newest sample of each series not marked stale (a target that disappears gets
  Prometheus' staleness marker at its next scrape, so its gauges vanish from instant queries);
- ``rate(x[w])`` follows Prometheus' ``extrapolatedRate``: the increase between the first and last
  samples inside the window, extrapolated towards the window's edges by at most half a scrape
  interval (and never below zero for counters); a series needs two samples in the window.

``Observer.signals`` assembles the snapshot exactly like ``scaler.sources.prometheus`` (same
queries, same "no data" rules) merged with what ``scaler.kube`` adds (ready and starting pods, the
measured p90 lead time), so the policy meets the same lag, the same rate windows and the same gaps.
Baselines read the raw per-replica gauges through ``gauge``/``gauges_sum``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scaler import histograms, lead_time
from scaler.assemble import FleetTotals, assemble_signals
from scaler.lead_time import rolling_lead_time
from scaler.signals import Signals
from scaler.sources.base import SourceError

# vLLM metric name -> ReplicaMetrics attribute(s) (first one present wins)
METRICS: dict[str, tuple[str, ...]] = {
    "vllm:prompt_tokens_total": ("prompt_tokens_total",),
    "vllm:generation_tokens_total": ("generation_tokens_total",),
    "vllm:num_requests_running": ("num_requests_running",),
    "vllm:num_requests_waiting": ("num_requests_waiting",),
    "vllm:kv_cache_usage_perc": ("kv_cache_usage_perc",),
    "vllm:num_preemptions_total": ("num_preemptions_total",),
    "vllm:prefix_cache_queries_total": ("prefix_cache_queries",),
    "vllm:prefix_cache_hits_total": ("prefix_cache_hits",),
    "vllm:request_prompt_tokens_sum": ("request_prompt_tokens_sum", "prompt_tokens_sum"),
    "vllm:request_prompt_tokens_count": ("request_prompt_tokens_count", "prompt_tokens_count",
                                         "request_success_total"),
    "vllm:request_generation_tokens_sum": ("request_generation_tokens_sum", "generation_tokens_sum"),
    "vllm:request_generation_tokens_count": ("request_generation_tokens_count", "generation_tokens_count",
                                             "request_success_total"),
}


# ReplicaMetrics attribute -> the vLLM histogram whose cumulative buckets it holds
BUCKETED = {"request_prompt_tokens_bucket": histograms.PROMPT_HISTOGRAM,
            "time_to_first_token_seconds_bucket": histograms.TTFT_HISTOGRAM}


CACHE_CONFIG = "vllm:cache_config_info"
"""Stored as its ``num_gpu_blocks`` × ``block_size`` labels' product (the live series is 1 with those labels)."""


def bucket_series(histogram: str, le: float) -> str:
    """The series name of one histogram bucket, as Prometheus would key it."""
    return f'{histogram}_bucket{{le="{"+Inf" if math.isinf(le) else repr(float(le))}"}}'


def metrics_of(snapshot: Any) -> dict[str, float]:
    """A replica's ``ReplicaMetrics`` (object or mapping) as vLLM metric name -> value."""
    get = snapshot.get if isinstance(snapshot, Mapping) else (lambda a, d=None: getattr(snapshot, a, d))
    out: dict[str, float] = {}
    for name, attrs in METRICS.items():
        for attr in attrs:
            value = get(attr, None)
            if value is not None:
                out[name] = float(value)
                break
    for attr, histogram in BUCKETED.items():
        for le, count in get(attr, None) or ():
            out[bucket_series(histogram, float(le))] = float(count)
    blocks, size = get("num_gpu_blocks", None), get("block_size", None)
    if blocks is not None and size is not None:
        out[CACHE_CONFIG] = float(blocks) * float(size)
    return out


@dataclass(frozen=True)
class ObserveConfig:
    """How the metric pipeline lags: Prometheus' scrape interval and lookback, the rate window."""

    scrape_interval_s: float = 15.0
    rate_window_s: float = 60.0
    lookback_s: float = 300.0
    lead_time_window: int = lead_time.WINDOW
    lead_time_min_samples: int = lead_time.MIN_SAMPLES

    def __post_init__(self) -> None:
        for name in ("scrape_interval_s", "rate_window_s", "lookback_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"ObserveConfig.{name}={value!r}: must be a finite number > 0")
        if self.rate_window_s < 2 * self.scrape_interval_s:
            raise ValueError(f"ObserveConfig.rate_window_s={self.rate_window_s!r}: must be >= 2 x scrape_interval_s "
                             f"({2 * self.scrape_interval_s:g}) or rate() has too few samples")


@dataclass
class _Series:
    times: list[float] = field(default_factory=list)
    values: list[dict[str, float]] = field(default_factory=list)
    stale_at: float = math.inf
    next_scrape: float = 0.0


def extrapolated_rate(times: list[float], values: list[float], start: float, end: float) -> float | None:
    """Prometheus' ``rate()`` of one counter series over (start, end]; None with fewer than two samples."""
    if len(times) < 2:
        return None
    increase = 0.0
    for previous, current in itertools.pairwise(values):
        increase += current - previous if current >= previous else current  # a reset restarts from 0
    sampled = times[-1] - times[0]
    if sampled <= 0:
        return None
    average_step = sampled / (len(times) - 1)
    to_start, to_end = times[0] - start, end - times[-1]
    threshold = average_step * 1.1
    if to_start >= threshold:
        to_start = average_step / 2
    if increase > 0 and values[0] >= 0:
        to_zero = sampled * (values[0] / increase)
        to_start = min(to_start, to_zero)
    if to_end >= threshold:
        to_end = average_step / 2
    return increase * (sampled + to_start + to_end) / sampled / (end - start)


class Prometheus:
    """Samples of each replica's metrics, scraped on a schedule; instant and range queries over them."""

    def __init__(self, config: ObserveConfig) -> None:
        self.config = config
        self.series: dict[int, _Series] = {}

    def scrape(self, now: float, targets: Mapping[int, Any]) -> None:
        """Scrape the targets whose turn has come; mark vanished ones stale.

        ``targets`` maps replica id -> ReplicaMetrics, or a callable returning it (read only when due).
        """
        series: _Series | None
        for rid, series in self.series.items():
            if rid not in targets and series.stale_at == math.inf and now >= series.next_scrape:
                series.stale_at = now
        for rid, snapshot in targets.items():
            series = self.series.get(rid)
            if series is None or series.stale_at != math.inf:
                # a new target: first scrape at a fixed per-target phase, like Prometheus' offsets
                phase = (rid * 0.6180339887) % 1.0 * self.config.scrape_interval_s
                series = self.series[rid] = _Series(next_scrape=now + phase)
            if now + 1e-9 >= series.next_scrape:
                series.times.append(now)
                series.values.append(metrics_of(snapshot() if callable(snapshot) else snapshot))
                series.next_scrape = now + self.config.scrape_interval_s
                self._trim(series, now)

    def _trim(self, series: _Series, now: float) -> None:
        keep_after = now - max(self.config.lookback_s, 2 * self.config.rate_window_s)
        cut = 0
        while cut < len(series.times) and series.times[cut] < keep_after:
            cut += 1
        if cut:
            del series.times[:cut], series.values[:cut]

    def instant(self, name: str, now: float) -> dict[int, float]:
        """Each live series' newest sample of ``name`` within the lookback (as ``name`` in PromQL)."""
        out = {}
        for rid, s in self.series.items():
            if s.stale_at <= now or not s.times or now - s.times[-1] > self.config.lookback_s:
                continue
            i = len(s.times) - 1
            while i >= 0 and s.times[i] > now:
                i -= 1
            if i >= 0 and name in s.values[i]:
                out[rid] = s.values[i][name]
        return out

    def rate(self, name: str, now: float, window_s: float | None = None) -> dict[int, float]:
        """``rate(name[window])`` per series (only series with two samples in the window)."""
        window = window_s or self.config.rate_window_s
        start = now - window
        out = {}
        for rid, s in self.series.items():
            picked = [(t, v[name]) for t, v in zip(s.times, s.values, strict=True) if start < t <= now and name in v]
            value = extrapolated_rate([t for t, _ in picked], [v for _, v in picked], start, now)
            if value is not None:
                out[rid] = value
        return out

    def newest_sample(self, now: float) -> float | None:
        """Time of the newest sample of any live series."""
        times = [s.times[-1] for s in self.series.values() if s.times and s.stale_at > now]
        return max(times) if times else None


class Observer:
    """Builds the live scaler's ``Signals`` and the baselines' raw metrics from scraped samples."""

    def __init__(self, config: ObserveConfig | None = None) -> None:
        self.config = config or ObserveConfig()
        self.prometheus = Prometheus(self.config)
        self.cold_starts: list[float] = []
        self.gateway_samples: list[tuple[float, float]] = []

    def scrape(self, now: float, ready: Mapping[int, Any], gateway_waiting: float = 0.0) -> None:
        """One scrape round at ``now``: Ready replicas' metrics and the gateway's queue (activation)."""
        self.prometheus.scrape(now, ready)
        if not self.gateway_samples or now - self.gateway_samples[-1][0] >= self.config.scrape_interval_s - 1e-9:
            self.gateway_samples.append((now, float(gateway_waiting)))
            del self.gateway_samples[:-4]

    def record_cold_start(self, seconds: float) -> None:
        """A pod became Ready after ``seconds``: what ``scaler.kube.leadtime`` would measure."""
        self.cold_starts.append(float(seconds))

    def lead_time_s(self) -> float | None:
        """Nearest-rank p90 of the newest cold starts (None before enough have been seen)."""
        return rolling_lead_time(self.cold_starts, self.config.lead_time_window, self.config.lead_time_min_samples)

    def gauge(self, name: str, now: float) -> dict[int, float]:
        """Per-replica values of a gauge as an instant query would return them."""
        return self.prometheus.instant(name, now)

    def gauges_sum(self, name: str, now: float) -> float | None:
        """``sum(name)``; None when the query returns nothing (no series)."""
        values = self.gauge(name, now)
        return math.fsum(values.values()) if values else None

    def activation_value(self, now: float) -> float | None:
        """The gateway's scraped queue length (the activation query's answer)."""
        past = [v for t, v in self.gateway_samples if t <= now]
        return past[-1] if past else None

    def signals(self, now: float, ready_replicas: int, starting_replicas: int,
                lead_time_auto: bool = True) -> Signals | None:
        """The Signals the live scaler would build at ``now`` (``scaler.assemble``, the live sources' rule);
        None where it would answer "no data"."""
        prom, window = self.prometheus, self.config.rate_window_s
        running = prom.instant("vllm:num_requests_running", now)
        kv = prom.instant("vllm:kv_cache_usage_perc", now)
        kv_tokens = prom.instant(CACHE_CONFIG, now)
        newest = prom.newest_sample(now)

        def total(rates: dict[int, float]) -> float | None:
            return math.fsum(rates.values()) if rates else None

        totals = FleetTotals(
            at=now, where="the simulated Prometheus", rate_window_s=window, has_series=bool(running),
            ready_replicas=ready_replicas, starting_replicas=starting_replicas,
            prompt_tokens_per_s=total(prom.rate("vllm:prompt_tokens_total", now, window)),
            generation_tokens_per_s=total(prom.rate("vllm:generation_tokens_total", now, window)),
            requests_waiting=total(prom.instant("vllm:num_requests_waiting", now)), requests_running=total(running),
            mean_prompt_tokens=self._mean("vllm:request_prompt_tokens", now),
            mean_output_tokens=self._mean("vllm:request_generation_tokens", now),
            prompt_length_buckets=self._bucket_rates(histograms.PROMPT_HISTOGRAM, now),
            ttft_buckets=self._bucket_rates(histograms.TTFT_HISTOGRAM, now),
            kv_cache_usage=float(np.mean(list(kv.values()))) if kv else None,
            kv_cache_tokens=min(kv_tokens.values()) if kv_tokens else None,
            prefix_cache_hit_share=self._ratio("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", now),
            lead_time_s=self.lead_time_s() if lead_time_auto else None,
            cold_starts_s=tuple(self.cold_starts[-self.config.lead_time_window:]) if lead_time_auto else (),
            activation_value=self.activation_value(now),
            data_age_s=now - newest if newest is not None else 0.0)
        try:
            return assemble_signals(totals)
        except SourceError:
            return None  # live: UNAVAILABLE ("no data ...")

    def _bucket_rates(self, histogram: str, now: float) -> dict[float, float]:
        """``sum by (le) (rate(<histogram>_bucket[w]))``: {le: rate} (``inf`` for +Inf)."""
        prefix = histogram + "_bucket{"
        names = {name for s in self.prometheus.series.values() if s.values for name in s.values[-1]
                 if name.startswith(prefix)}
        out = {}
        for name in names:
            rates = self.prometheus.rate(name, now)
            if rates:
                le = name[name.index('"') + 1: name.rindex('"')]
                out[math.inf if le == "+Inf" else float(le)] = math.fsum(rates.values())
        return out

    def _ratio(self, numerator: str, denominator: str, now: float) -> float | None:
        """``sum(rate(numerator)) / sum(rate(denominator))``, clamped to 0..1; None without a denominator."""
        top = self.prometheus.rate(numerator, now)
        bottom = math.fsum(self.prometheus.rate(denominator, now).values())
        if not top or bottom <= 0:
            return None
        return min(max(math.fsum(top.values()) / bottom, 0.0), 1.0)

    def _mean(self, histogram: str, now: float) -> float | None:
        sums = self.prometheus.rate(histogram + "_sum", now)
        counts = self.prometheus.rate(histogram + "_count", now)
        total_count = math.fsum(counts.values())
        if not sums or total_count <= 0:
            return None
        value = math.fsum(sums.values()) / total_count
        return value if math.isfinite(value) and value >= 0 else None
