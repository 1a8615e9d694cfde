"""The ``/metrics`` timeline of a replay: each endpoint scraped at an interval into JSON lines.

Each line is ``{"t": seconds since the replay started, "endpoint": URL, "ok": bool, "latency_s": ...,
"samples": {"vllm:num_requests_waiting{...}": 3.0, ...}}``. Only ``vllm:`` samples are kept, without
``_created`` timestamps and without histogram buckets except those of ``KEEP_BUCKETS`` (latencies and
step sizes, for engine-side percentiles), so an hour of 1 s scrapes stays small.
``vllm:cache_config_info``'s labels (KV blocks, block size) are kept once per endpoint in
``cache_config``, because calibration reads the scheduler's KV limit from them.

A failed scrape is written with ``ok: false``: the endpoint was starting or overloaded, not idle.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

CACHE_CONFIG = "vllm:cache_config_info"
KEEP_BUCKETS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:iteration_tokens_total")


def _key(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k not in ("engine",))
    return f"{name}{{{inner}}}" if inner else name


def parse_vllm_metrics(text: str) -> tuple[dict[str, float], dict[str, str]]:
    """``vllm:`` samples by ``name{labels}`` (no buckets, no _created) and the cache-config labels."""
    samples: dict[str, float] = {}
    cache: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("vllm:"):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created") or (
                    sample.name.endswith("_bucket") and sample.name[: -len("_bucket")] not in KEEP_BUCKETS):
                continue
            if sample.name == CACHE_CONFIG:
                cache = dict(sample.labels)
                continue
            samples[_key(sample.name, dict(sample.labels))] = float(sample.value)
    return samples, cache


def metric_sum(samples: dict[str, float], name: str) -> float | None:
    """Sum of every labelled series of ``name`` (e.g. over models and engines); None if absent."""
    values = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
    return sum(values) if values else None


class MetricsRecorder:
    """Scrapes every endpoint each ``interval_s`` until ``stop`` is set; writes one line per scrape."""

    def __init__(self, client: httpx.AsyncClient, endpoints: Iterable[str], out: IO[str], t0: float,
                 interval_s: float = 1.0, timeout_s: float = 5.0) -> None:
        if not interval_s > 0:
            raise ValueError(f"metrics interval_s={interval_s!r}: must be > 0")
        self.client, self.endpoints, self.out = client, list(endpoints), out
        self.t0, self.interval_s, self.timeout_s = t0, interval_s, timeout_s
        self.cache_config: dict[str, dict[str, str]] = {}
        self.scrapes = 0
        self.failures = 0

    async def scrape_once(self) -> None:
        results = await asyncio.gather(*(self._scrape(url) for url in self.endpoints))
        for line in results:
            self.out.write(json.dumps(line) + "\n")
        self.out.flush()

    async def _scrape(self, url: str) -> dict[str, Any]:
        started = time.monotonic()
        line: dict[str, Any] = {"t": round(started - self.t0, 4), "endpoint": url, "ok": False}
        self.scrapes += 1
        try:
            resp = await self.client.get(url + "/metrics", timeout=self.timeout_s)
            resp.raise_for_status()
            samples, cache = parse_vllm_metrics(resp.text)
            if cache:
                self.cache_config[url] = cache
            line.update(ok=True, samples=samples)
        except (httpx.HTTPError, ValueError) as exc:
            self.failures += 1
            line["error"] = f"{type(exc).__name__}: {exc}"[:200]
        line["latency_s"] = round(time.monotonic() - started, 4)
        return line

    async def run(self, stop: asyncio.Event) -> None:
        """Scrape now, then every interval; a last scrape after ``stop`` captures the final counters."""
        while True:
            await self.scrape_once()
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
            except TimeoutError:
                continue
            await self.scrape_once()
            return


SERVER_HISTOGRAMS = {
    "server_ttft_mean": "vllm:time_to_first_token_seconds",
    "server_itl_mean": "vllm:inter_token_latency_seconds",
    "server_e2e_mean": "vllm:e2e_request_latency_seconds",
    "server_queue_mean": "vllm:request_queue_time_seconds",
    "server_prefill_mean": "vllm:request_prefill_time_seconds",
    "server_decode_mean": "vllm:request_decode_time_seconds",
}


def _first_and_last_scrapes(
    timeline: list[dict[str, Any]],
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Each endpoint's first and last good scrape: the bounds of what it did during the replay."""
    first: dict[str, dict[str, float]] = {}
    last: dict[str, dict[str, float]] = {}
    for line in timeline:
        if line.get("ok"):
            first.setdefault(line["endpoint"], line["samples"])
            last[line["endpoint"]] = line["samples"]
    return first, last


def server_means(timeline: list[dict[str, Any]]) -> dict[str, float | None]:
    """Engine-side means over the replay from each endpoint's first and last good scrape.

    These are vLLM's own timings (no HTTP, no client): the part of latency the simulator models. The
    gap between them and the client's numbers is the serving frontend (and the network).
    """
    first, last = _first_and_last_scrapes(timeline)
    out: dict[str, float | None] = {}
    for key, name in SERVER_HISTOGRAMS.items():
        total = count = 0.0
        for url, end in last.items():
            start = first[url]
            total += (metric_sum(end, name + "_sum") or 0.0) - (metric_sum(start, name + "_sum") or 0.0)
            count += (metric_sum(end, name + "_count") or 0.0) - (metric_sum(start, name + "_count") or 0.0)
        out[key] = total / count if count > 0 else None
    return out


def counter_delta(timeline: list[dict[str, Any]], name: str) -> float | None:
    """What a counter gained over the replay, summed over endpoints (None when never scraped)."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for line in timeline:
        value = metric_sum(line.get("samples") or {}, name) if line.get("ok") else None
        if value is not None:
            first.setdefault(line["endpoint"], value)
            last[line["endpoint"]] = value
    return sum(max(0.0, last[u] - first[u]) for u in last) if last else None


def gauge_stats(timeline: list[dict[str, Any]], name: str) -> tuple[float | None, float | None]:
    """Mean and max of a gauge over every good scrape (e.g. ``vllm:kv_cache_usage_perc``)."""
    sums = [metric_sum(x["samples"], name) for x in timeline if x.get("ok")]
    values = [v for v in sums if v is not None]
    return (float(np.mean(values)), float(np.max(values))) if values else (None, None)


def histogram_delta(timeline: list[dict[str, Any]], name: str) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative bucket counts of histogram ``name`` gained over the replay, summed over endpoints.

    Returns (upper bounds, cumulative counts), sorted, ``+Inf`` included; empty arrays when absent.
    """
    first, last = _first_and_last_scrapes(timeline)
    totals: dict[float, float] = {}
    prefix = name + "_bucket{"
    for url, end in last.items():
        for key, value in end.items():
            if not key.startswith(prefix) or 'le="' not in key:
                continue
            le = float(key.split('le="', 1)[1].split('"', 1)[0])
            totals[le] = totals.get(le, 0.0) + value - first[url].get(key, 0.0)
    bounds = np.array(sorted(totals), dtype=float)
    return bounds, np.array([totals[b] for b in bounds], dtype=float)


def histogram_quantile(q: float, bounds: np.ndarray, cumulative: np.ndarray) -> float | None:
    """Prometheus' ``histogram_quantile``: linear within the bucket; None without observations."""
    if bounds.size == 0 or cumulative[-1] <= 0:
        return None
    rank = q * cumulative[-1]
    i = int(np.searchsorted(cumulative, rank, side="left"))
    if i >= bounds.size - 1 and not np.isfinite(bounds[min(i, bounds.size - 1)]):
        return float(bounds[-2]) if bounds.size > 1 else None
    lower = 0.0 if i == 0 else float(bounds[i - 1])
    below = 0.0 if i == 0 else float(cumulative[i - 1])
    inside = float(cumulative[i]) - below
    return lower + (float(bounds[i]) - lower) * ((rank - below) / inside if inside > 0 else 1.0)


def load_timeline(path: Path) -> list[dict[str, Any]]:
    """The replay's timeline lines (a missing file is an empty timeline)."""
    path = Path(path)
    if not path.exists():
        return []
    lines = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not a JSON line ({exc.msg})") from exc
    return lines
