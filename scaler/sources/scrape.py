"""Signals straight from pods: GET each vLLM pod's ``/metrics`` and compute rates between scrapes.

For clusters without Prometheus, or to read fresher numbers than a 15-30 s scrape interval gives.
The URL list is static here (discovery arrives with the Kubernetes source). Each ``fetch`` scrapes
every URL once (concurrently), parses the text with prometheus_client's parser, and keeps a short
per-URL history from which it computes rates over each target's window, like Prometheus' ``rate()``:
a counter that drops (or whose ``_created`` time moves) restarted, and counts from zero again.

Rules that keep the numbers honest:
- A pod whose scrape fails (refused, timeout, non-200, unparsable) is *starting*, never zero load; it
  counts as a starting replica of the models it served before (or of every target, if never seen).
- No pod of a model answering is ``SourceError`` ("no data"), even if some are starting.
- The first scrape of a pod gives gauges but no rate. So that the very first evaluation can answer,
  a fetch that finds answering pods with a single scrape scrapes once more after ``warmup_s`` (0.5 s;
  a short, noisy first rate that later windows replace). With ``warmup_s=0``, a model is
  ``SourceError`` ("warming up") until one of its pods has two scrapes.
- Label matchers are not applied: a pod's own ``/metrics`` carries no namespace label, and the URL
  list already says which pods belong to the scaled object.

``on_scrape(url, at)`` (optional) hears each URL that answers for the first time, or again after
failing, with ``at`` on the fetch's clock: the Kubernetes observer's ``note_scrape`` ends a pod's
cold start there. ``set_urls`` follows a changing pod set, keeping the history of pods that stay.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from scaler import histograms
from scaler.assemble import FleetTotals, assemble_signals
from scaler.signals import Signals
from scaler.sources.base import SourceError, Target

COUNTERS = {
    "vllm:prompt_tokens_total": "prompt",
    "vllm:generation_tokens_total": "generation",
    "vllm:request_prompt_tokens_sum": "prompt_sum",
    "vllm:request_prompt_tokens_count": "prompt_count",
    "vllm:request_generation_tokens_sum": "output_sum",
    "vllm:request_generation_tokens_count": "output_count",
    "vllm:prefix_cache_queries_total": "cache_queries",
    "vllm:prefix_cache_hits_total": "cache_hits",
}
CREATED = {"vllm:prompt_tokens_created", "vllm:generation_tokens_created"}
GAUGES = {"vllm:num_requests_waiting": "waiting", "vllm:num_requests_running": "running",
          "vllm:kv_cache_usage_perc": "kv"}
CACHE_CONFIG = "vllm:cache_config_info"
BUCKETS = {histograms.PROMPT_HISTOGRAM + "_bucket": "prompt_le=", histograms.TTFT_HISTOGRAM + "_bucket": "ttft_le="}
"""Histograms whose cumulative buckets are kept as counters, keyed ``<prefix><le>`` (e.g. ``ttft_le=2.5``)."""
LOG = logging.getLogger("leadscale.sources.scrape")
HISTORY = 256  # scrapes kept per URL; enough for a 60 s window at one fetch per 0.25 s


@dataclass
class ModelSample:
    """One model's numbers in one scrape of one pod, summed over its engines."""

    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS.values(), 0.0))
    gauges: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GAUGES.values(), 0.0))
    kv_series: int = 0
    created: float = 0.0  # newest counter creation time: moves when the process restarts
    kv_cache_tokens: float | None = None
    """The pod's KV cache from ``vllm:cache_config_info`` (num_gpu_blocks × block_size over its engines)."""


def parse_metrics(text: str) -> dict[str, ModelSample]:
    """Parse a vLLM ``/metrics`` text into per-model samples; anything malformed is a SourceError."""
    from prometheus_client.parser import text_string_to_metric_families

    models: dict[str, ModelSample] = defaultdict(ModelSample)
    cache_engines: dict[str, float] = {}  # vllm:cache_config_info has no model_name: it is the pod's
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name, model = sample.name, sample.labels.get("model_name")
                if name == CACHE_CONFIG:
                    tokens = _cache_tokens(sample.labels)
                    if tokens is not None:
                        cache_engines[sample.labels.get("engine", "")] = tokens
                    continue
                bucket = name in BUCKETS and "le" in sample.labels
                if model is None or not (name in COUNTERS or name in GAUGES or name in CREATED or bucket):
                    continue
                value = float(sample.value)
                if not math.isfinite(value) or value < 0:
                    raise SourceError(f"{name}{{model_name={model!r}}}={value!r}: want a finite number >= 0")
                entry = models[model]
                if bucket:
                    key = BUCKETS[name] + repr(float(sample.labels["le"]))  # "+Inf" -> inf
                    entry.counters[key] = entry.counters.get(key, 0.0) + value
                elif name in COUNTERS:
                    entry.counters[COUNTERS[name]] += value
                elif name in GAUGES:
                    entry.gauges[GAUGES[name]] += value
                    entry.kv_series += name == "vllm:kv_cache_usage_perc"
                else:
                    entry.created = max(entry.created, value)
    except SourceError:
        raise
    except Exception as exc:  # the parser raises ValueError, IndexError, TypeError... on garbage
        raise SourceError(f"unparsable /metrics text: {type(exc).__name__}: {exc}") from exc
    if cache_engines:
        for entry in models.values():
            entry.kv_cache_tokens = math.fsum(cache_engines.values())
    return dict(models)


def _cache_tokens(labels: dict[str, str]) -> float | None:
    """``num_gpu_blocks`` × ``block_size`` of one engine's cache_config_info series (None if malformed)."""
    try:
        tokens = float(labels["num_gpu_blocks"]) * float(labels["block_size"])
    except (KeyError, ValueError):
        return None
    return tokens if math.isfinite(tokens) and tokens > 0 else None


def increase(history: Sequence[tuple[float, ModelSample]], key: str) -> float:
    """Counter growth across consecutive scrapes; a drop or a new ``_created`` time is a restart."""
    total = 0.0
    for (_, before), (_, after) in itertools.pairwise(history):
        now_value = after.counters.get(key, 0.0)
        delta = now_value - before.counters.get(key, 0.0)
        restarted = delta < 0 or after.created > before.created > 0
        total += now_value if restarted else delta
    return total


def _buckets(rates: dict[str, float], prefix: str) -> dict[float, float]:
    """One histogram's cumulative bucket rates, {le: per second}, from the ``<prefix><le>`` counters."""
    return {float(k[len(prefix):]): v for k, v in rates.items() if k.startswith(prefix)}


@dataclass
class _Pod:
    history: deque[tuple[float, dict[str, ModelSample]]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    last_error: str | None = None
    models: set[str] = field(default_factory=set)


class ScrapeSource:
    """Scrapes a static list of vLLM ``/metrics`` URLs: ``ScrapeSource(urls).fetch(targets, now)``.

    ``now`` must grow between calls (any clock in seconds); rates are measured on it.
    """

    def __init__(self, urls: Sequence[str], timeout_s: float = 2.0, warmup_s: float = 0.5,
                 on_scrape: Callable[[str, float], None] | None = None) -> None:
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"ScrapeSource timeout_s={timeout_s!r}: must be a finite number > 0")
        if not (isinstance(warmup_s, (int, float)) and 0 <= warmup_s <= 5):
            raise ValueError(f"ScrapeSource warmup_s={warmup_s!r}: must be a number of seconds in [0, 5]")
        self.timeout_s, self.warmup_s, self.on_scrape = float(timeout_s), float(warmup_s), on_scrape
        self.urls: list[str] = []
        self._pods: dict[str, _Pod] = {}
        self._lock = threading.Lock()  # the evaluator may fetch from two threads (first call + its loop)
        self.set_urls(urls)

    def set_urls(self, urls: Sequence[str]) -> None:
        """Scrape these URLs from now on; pods that stay keep their history, new ones start fresh."""
        if isinstance(urls, str) or not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://"))
                                                        for u in urls):
            raise ValueError(f"ScrapeSource urls={urls!r}: want a non-empty list of http(s):// /metrics URLs")
        with self._lock:
            self.urls = list(dict.fromkeys(urls))
            self._pods = {url: self._pods.get(url) or _Pod() for url in self.urls}

    def _scrape(self, url: str) -> dict[str, ModelSample] | str:
        import httpx

        try:
            response = httpx.get(url, timeout=self.timeout_s)
            if response.status_code != 200:
                return f"HTTP {response.status_code}"
            return parse_metrics(response.text)
        except (httpx.HTTPError, SourceError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def scrape_all(self, now: float) -> None:
        """Scrape every URL once and append to its history (a failure leaves the pod 'starting')."""
        with ThreadPoolExecutor(max_workers=min(16, len(self.urls))) as pool:
            results = dict(zip(self.urls, pool.map(self._scrape, self.urls), strict=True))
        for url, result in results.items():
            pod = self._pods[url]
            if isinstance(result, str):
                pod.last_error = result  # history stays: a restart shows up as a counter reset
                continue
            answered_again = pod.last_error is not None or not pod.history
            pod.last_error = None
            pod.history.append((now, result))
            pod.models = set(result)
            if answered_again and self.on_scrape is not None:
                try:
                    self.on_scrape(url, now)
                except Exception:  # a listener's failure must not cost the decision
                    LOG.exception("on_scrape(%s) failed", url)

    def fetch(self, targets: Sequence[Target], now: float) -> dict[Target, Signals | SourceError]:
        """Scrape once, then build each target's snapshot from the pods serving its model."""
        with self._lock:
            started = time.monotonic()
            self.scrape_all(now)
            if self.warmup_s > 0 and any(p.last_error is None and len(p.history) == 1 for p in self._pods.values()):
                time.sleep(self.warmup_s)  # a first rate now beats UNAVAILABLE until the next round
                self.scrape_all(now + time.monotonic() - started)
            out: dict[Target, Signals | SourceError] = {}
            for target in dict.fromkeys(targets):
                try:
                    out[target] = self._signals(target, now)
                except SourceError as exc:
                    out[target] = exc
            return out

    def _signals(self, target: Target, now: float) -> Signals:
        ready = [p for p in self._pods.values() if p.last_error is None and target.model in p.models]
        starting = [url for url, p in self._pods.items()
                    if p.last_error is not None and (target.model in p.models or not p.models)]
        if not ready:
            reasons = "; ".join(f"{url}: {self._pods[url].last_error}" for url in starting) or "none serves it"
            raise SourceError(f"no data: no pod answers for model_name={target.model!r} ({reasons})")
        rates: dict[str, float] = defaultdict(float)
        measured = 0
        for pod in ready:
            window = self._window(pod, target.model, now - target.rate_window_s)
            if len(window) < 2 or window[-1][0] <= window[0][0]:
                continue
            measured += 1
            buckets = [k for k in window[-1][1].counters if k.startswith(tuple(BUCKETS.values()))]
            for key in (*COUNTERS.values(), *buckets):
                rates[key] += increase(window, key) / (window[-1][0] - window[0][0])
        if not measured:
            raise SourceError(f"warming up: model_name={target.model!r} needs two scrapes of one pod")
        latest = [pod.history[-1][1][target.model] for pod in ready]
        kv = [s.gauges["kv"] / s.kv_series for s in latest if s.kv_series]
        kv_tokens = [s.kv_cache_tokens for s in latest if s.kv_cache_tokens is not None]

        def ratio(top: str, bottom: str) -> float | None:
            return rates[top] / rates[bottom] if rates[bottom] > 0 else None

        return assemble_signals(FleetTotals(
            at=now, where=f"model_name={target.model!r} on the pods' /metrics", rate_window_s=target.rate_window_s,
            has_series=True, ready_replicas=len(ready), starting_replicas=len(starting),
            prompt_tokens_per_s=rates["prompt"], generation_tokens_per_s=rates["generation"],
            requests_waiting=math.fsum(s.gauges["waiting"] for s in latest),
            requests_running=math.fsum(s.gauges["running"] for s in latest),
            mean_prompt_tokens=ratio("prompt_sum", "prompt_count"),
            mean_output_tokens=ratio("output_sum", "output_count"),
            prompt_length_buckets=_buckets(rates, "prompt_le="), ttft_buckets=_buckets(rates, "ttft_le="),
            kv_cache_usage=math.fsum(kv) / len(kv) if kv else None,
            kv_cache_tokens=min(kv_tokens) if kv_tokens else None,
            prefix_cache_hit_share=ratio("cache_hits", "cache_queries"),
            data_age_s=now - min(pod.history[-1][0] for pod in ready)))

    @staticmethod
    def _window(pod: _Pod, model: str, since: float) -> list[tuple[float, ModelSample]]:
        """The model's scrapes from the newest one at or before ``since`` (or the oldest kept) to now."""
        points = [(at, models[model]) for at, models in pod.history if model in models]
        start = 0
        for i, (at, _) in enumerate(points[:-1]):
            if at <= since:
                start = i
        return points[start:]
