"""Rebuild a model's workload from the Prometheus history of its vLLM metrics (``leadscale advise``).

What is read (range queries of the raw counters, one series per pod and label set, so resets and
gaps are seen per series rather than blurred by a ``sum``):

- ``vllm:request_success_total``: requests finished per step: the arrival rate over time (a request
  finishes seconds after it arrives; at steps of a minute the shift does not matter);
- ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``: token totals, a check on the lengths;
- ``vllm:request_prompt_tokens`` / ``vllm:request_generation_tokens`` histograms (``_bucket``,
  ``_sum``, ``_count``): the length distributions, sampled from the buckets (uniform within a bucket;
  the ``+Inf`` bucket is given the mean that ``_sum`` implies).

Counters are turned into per-step increases the way PromQL's ``increase`` treats them: a drop is a
reset (the pod restarted; the new value is the increase), a series' first sample is its baseline,
and an increase across missing steps (a gap: scrape failures, a stale pod) is spread evenly over
them. Every reset and gap is reported. Long ranges are queried in chunks of at most ``max_points``
steps (Prometheus refuses more than 11,000 points per series). Histograms need totals only: one
``sum by (le) (increase(...[chunk]))`` instant query per chunk, so a week of buckets of many pods is
never held per step.

Left out: the correlation between a request's prompt and output lengths (sampled independently),
prefix sharing, and arrivals finer than the step (uniform within each step).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

SUCCESS = "vllm:request_success_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_HISTOGRAM = "vllm:request_prompt_tokens"
OUTPUT_HISTOGRAM = "vllm:request_generation_tokens"
MAX_POINTS = 10_000
_SINCE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|d|w)?")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class HistoryError(RuntimeError):
    """Prometheus could not be read, or holds no history for the model; the message says which."""


def parse_duration(text: str, flag: str = "--since") -> float:
    """``7d``, ``12h``, ``90m``, ``30s`` or plain seconds -> seconds > 0; ValueError naming the flag otherwise."""
    match = _SINCE.fullmatch(str(text).strip())
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"] if match else math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{flag} {text!r}: expected a duration > 0 such as 7d, 12h, 90m, 30s or seconds")
    return value


@dataclass(frozen=True)
class HistoryRequest:
    """What to read: one model on one Prometheus, over ``[start_s, end_s]`` (Unix seconds) at ``step_s``."""

    prometheus: str
    model: str
    start_s: float
    end_s: float
    step_s: float = 60.0
    label_matchers: tuple[tuple[str, str], ...] = ()
    max_points: int = MAX_POINTS
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        problems = []
        if not re.match(r"https?://[^/?#]+", self.prometheus or ""):
            problems.append(f"prometheus={self.prometheus!r}: must be an http(s):// URL")
        if not self.model:
            problems.append("model='': must name the served model (vLLM's model_name label)")
        if not (math.isfinite(self.step_s) and self.step_s >= 1):
            problems.append(f"step_s={self.step_s!r}: must be >= 1 second")
        span = self.end_s - self.start_s
        if not (math.isfinite(self.start_s) and math.isfinite(span) and span >= 2 * self.step_s):
            problems.append(f"start_s={self.start_s!r}, end_s={self.end_s!r}: the range must span at least two steps")
        if not (isinstance(self.max_points, int) and 2 <= self.max_points <= 11_000):
            problems.append(f"max_points={self.max_points!r}: must be an integer in [2, 11000]")
        if problems:
            raise ValueError("invalid HistoryRequest: " + "; ".join(problems))

    @property
    def grid(self) -> np.ndarray:
        """The step-aligned instants every query is evaluated at."""
        n = int((self.end_s - self.start_s) // self.step_s) + 1
        return self.start_s + self.step_s * np.arange(n)

    def selector(self, metric: str) -> str:
        matchers = [("model_name", self.model), *self.label_matchers]
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in matchers)
        return f"{metric}{{{body}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Reader:
    """Chunked range queries against one Prometheus (``httpx``); counts the queries it made."""

    def __init__(self, request: HistoryRequest, client: Any = None) -> None:
        import httpx

        self.request = request
        self.client = client or httpx.Client(timeout=request.timeout_s)
        self.queries = 0

    def series(self, promql: str) -> dict[tuple[tuple[str, str], ...], np.ndarray]:
        """Each series' values on the request's grid (NaN where Prometheus has no sample)."""
        req, grid = self.request, self.request.grid
        out: dict[tuple[tuple[str, str], ...], np.ndarray] = {}
        for first in range(0, grid.size, req.max_points):
            chunk = grid[first:first + req.max_points]
            for labels, points in self._query(promql, float(chunk[0]), float(chunk[-1])):
                values = out.setdefault(labels, np.full(grid.size, np.nan))
                if not points:
                    continue
                tv = np.asarray(points, dtype=float).reshape(-1, 2)
                k = np.rint((tv[:, 0] - req.start_s) / req.step_s).astype(np.int64)
                keep = (k >= 0) & (k < grid.size)
                values[k[keep]] = tv[keep, 1]
        return out

    def _query(self, promql: str, start: float, end: float) -> list[tuple[tuple[tuple[str, str], ...], list[Any]]]:
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{self.request.step_s:g}"}
        result = self._get("query_range", params)
        return [(tuple(sorted(s["metric"].items())), s["values"]) for s in result]

    def increase_by(self, promql_selector: str, by: str) -> dict[str, float]:
        """``sum by (<by>) (increase(selector[chunk]))`` over the whole range, one instant query per chunk:
        totals only (histograms), so Prometheus handles resets and nothing per step is kept."""
        req = self.request
        chunk = req.step_s * req.max_points
        totals: dict[str, float] = {}
        t = req.start_s
        while t < req.end_s - 1e-9:
            end = min(t + chunk, req.end_s)
            query = f"sum by ({by}) (increase({promql_selector}[{end - t:.0f}s]))"
            for series in self._get("query", {"query": query, "time": f"{end:.3f}"}):
                key = series["metric"].get(by, "")
                value = float(series["value"][1])
                if math.isfinite(value):
                    totals[key] = totals.get(key, 0.0) + value
            t = end
        return totals

    def _get(self, api: str, params: dict[str, str]) -> list[dict[str, Any]]:
        import httpx

        where = f"Prometheus at {self.request.prometheus}"
        what = {"query_range": "range query", "query": "instant query"}.get(api, api)
        self.queries += 1
        try:
            response = self.client.get(f"{self.request.prometheus.rstrip('/')}/api/v1/{api}", params=params)
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise HistoryError(f"{where}: {what} {params['query']!r} failed: {exc}") from exc
        if response.status_code != 200 or body.get("status") != "success":
            raise HistoryError(f"{where}: {what} {params['query']!r} answered {response.status_code}: "
                               f"{body.get('error', body)}")
        return list(body["data"]["result"])


@dataclass
class Increases:
    """Per-step increases of a set of counter series, summed, and what was repaired on the way."""

    per_step: np.ndarray
    series: int = 0
    resets: list[tuple[float, str]] = field(default_factory=list)
    gaps: list[tuple[float, float, str]] = field(default_factory=list)
    late_series: int = 0
    """Series that began after the range start (their first value is a baseline, as in PromQL)."""

    @property
    def total(self) -> float:
        return float(self.per_step.sum())


def counter_increases(series: Mapping[tuple[tuple[str, str], ...], np.ndarray], grid: np.ndarray) -> Increases:
    """Sum of per-step increases over series (step k covers ``(grid[k-1], grid[k]]``; step 0 is empty)."""
    total = np.zeros(grid.size)
    out = Increases(total, series=len(series))
    for labels, values in series.items():
        name = ",".join(f"{k}={v}" for k, v in labels if k != "__name__")
        present = np.flatnonzero(np.isfinite(values))
        if present.size == 0:
            continue
        if present[0] > 0:
            out.late_series += 1
        v = values[present]
        delta = np.diff(v)
        dropped = np.flatnonzero(delta < 0)
        delta[dropped] = v[1:][dropped]  # a reset: the counter restarted from 0
        out.resets += [(float(grid[present[i + 1]]), name) for i in dropped]
        span = np.diff(present)
        ends = present[1:]
        np.add.at(total, ends[span == 1], delta[span == 1])
        for i in np.flatnonzero(span > 1):  # a gap: spread the increase over the missing steps
            j, k = int(present[i]), int(present[i + 1])
            out.gaps.append((float(grid[j]), float(grid[k]), name))
            total[j + 1:k + 1] += delta[i] / (k - j)
    return out


@dataclass(frozen=True)
class Lengths:
    """A length histogram: upper bounds (last one +inf), counts per bucket, and the sum of all lengths."""

    bounds: np.ndarray
    counts: np.ndarray
    total: float

    @property
    def count(self) -> float:
        return float(self.counts.sum())

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` integer lengths >= 1: a bucket by its share, then uniform inside it."""
        if self.count <= 0:
            raise ValueError("empty length histogram")
        lows = np.concatenate([[0.0], self.bounds[:-1]])
        highs = self.bounds.copy()
        finite = np.isfinite(highs)
        if not finite.all():  # +Inf bucket: centred on the mean that _sum implies for it
            inside = float((self.counts[finite] * (lows[finite] + highs[finite]) / 2).sum())
            left = self.counts[~finite][0]
            mean_inf = (self.total - inside) / left if left > 0 else lows[-1] * 2
            highs[-1] = max(lows[-1] + 2.0, 2 * max(mean_inf, lows[-1] + 1.0) - lows[-1])
        bucket = rng.choice(self.counts.size, size=n, p=self.counts / self.counts.sum())
        lo = np.floor(lows[bucket]) + 1.0
        hi = np.maximum(np.floor(highs[bucket]), lo)
        return cast(np.ndarray, np.maximum(1, np.floor(lo + rng.random(n) * (hi - lo + 1.0))).astype(np.int64))


def histogram_lengths(by_le: Mapping[str, float], total: float) -> Lengths | None:
    """A ``Lengths`` from cumulative bucket totals keyed by ``le`` (None when no bucket moved)."""
    bounds, cumulative = [], []
    for le, value in by_le.items():
        try:
            bounds.append(float(le))
        except ValueError:
            continue
        cumulative.append(value)
    if not bounds:
        return None
    order = np.argsort(bounds)
    edges = np.asarray(bounds)[order]
    cum = np.maximum.accumulate(np.maximum(np.asarray(cumulative)[order], 0.0))
    counts = np.diff(np.concatenate([[0.0], cum]))
    if counts.sum() <= 0:
        return None
    if np.isfinite(edges[-1]):
        edges, counts = np.append(edges, np.inf), np.append(counts, 0.0)
    return Lengths(edges, counts, max(float(total), 0.0))


@dataclass
class History:
    """One model's traffic over the range: requests per step, token totals, length distributions."""

    request: HistoryRequest
    grid: np.ndarray
    requests: Increases
    prompt_tokens: Increases
    generation_tokens: Increases
    prompt_lengths: Lengths | None
    output_lengths: Lengths | None
    queries: int = 0

    def arrival_rate(self) -> np.ndarray:
        """Requests per second in each step (step 0 has none by construction)."""
        return self.requests.per_step / self.request.step_s

    def synthesize(self, seed: int = 0, name: str | None = None) -> Any:
        """A ``Workload`` with the measured count per step (arrivals uniform inside a step) and lengths
        drawn from the histograms (the token counters' means when a histogram is empty)."""
        from simulator.workload import from_unsorted

        rng = np.random.default_rng([seed, 6])
        cumulative = np.round(np.cumsum(self.requests.per_step)).astype(np.int64)
        counts = np.diff(np.concatenate([[0], cumulative]))
        counts = np.maximum(counts, 0)
        n = int(counts.sum())
        if n < 2:
            raise HistoryError(f"model {self.request.model!r}: {n} finished requests in the range; nothing to tune on")
        ends = np.repeat(self.grid, counts)
        arrival = ends - self.request.step_s * rng.random(n)
        prompt = self._lengths(self.prompt_lengths, self.prompt_tokens, n, rng)
        output = self._lengths(self.output_lengths, self.generation_tokens, n, rng)
        return from_unsorted(arrival - self.grid[0], prompt, output, origin_s=float(self.grid[0]),
                             name=name or f"prometheus:{self.request.model}")

    def _lengths(self, hist: Lengths | None, tokens: Increases, n: int, rng: np.random.Generator) -> np.ndarray:
        if hist is not None and hist.count > 0:
            return hist.sample(n, rng)
        mean = tokens.total / max(self.requests.total, 1.0)
        return np.full(n, max(1, round(mean)), dtype=np.int64)

    def report(self) -> dict[str, Any]:
        """What was read and repaired: totals, resets, gaps (JSON-safe)."""
        def counter(inc: Increases) -> dict[str, Any]:
            return {"series": inc.series, "total": inc.total, "resets": len(inc.resets), "gaps": len(inc.gaps),
                    "late_series": inc.late_series,
                    "reset_examples": [f"{t:.0f} {s}" for t, s in inc.resets[:5]],
                    "gap_examples": [f"{a:.0f}..{b:.0f} {s}" for a, b, s in inc.gaps[:5]]}

        rate = self.arrival_rate()[1:]
        out: dict[str, Any] = {
            "prometheus": self.request.prometheus, "model": self.request.model, "start_s": self.request.start_s,
            "end_s": self.request.end_s, "step_s": self.request.step_s, "queries": self.queries,
            "requests": counter(self.requests), "prompt_tokens": counter(self.prompt_tokens),
            "generation_tokens": counter(self.generation_tokens),
            "arrival_rate_per_s": {"mean": float(rate.mean()), "max": float(rate.max())} if rate.size else {},
            "empty_steps": int((self.requests.per_step[1:] <= 0).sum()),
        }
        for key, hist, tokens in (("prompt_lengths", self.prompt_lengths, self.prompt_tokens),
                                  ("output_lengths", self.output_lengths, self.generation_tokens)):
            out[key] = None if hist is None else {
                "requests": hist.count, "mean": hist.total / hist.count if hist.count else None,
                "mean_from_counters": tokens.total / self.requests.total if self.requests.total else None}
        return out


def fetch_history(request: HistoryRequest, client: Any = None) -> History:
    """Read every metric above; ``HistoryError`` when Prometheus fails or has no request counter."""
    reader = Reader(request, client)
    grid = request.grid
    success = reader.series(request.selector(SUCCESS))
    if not success:
        raise HistoryError(f"Prometheus at {request.prometheus} has no {SUCCESS} for model_name={request.model!r} "
                           f"between {request.start_s:.0f} and {request.end_s:.0f}")
    increases = {m: counter_increases(reader.series(request.selector(m)), grid)
                 for m in (PROMPT_TOKENS, GENERATION_TOKENS)}
    lengths: list[Lengths | None] = []
    for hist in (PROMPT_HISTOGRAM, OUTPUT_HISTOGRAM):
        total = sum(reader.increase_by(request.selector(hist + "_sum"), "model_name").values())
        lengths.append(histogram_lengths(reader.increase_by(request.selector(hist + "_bucket"), "le"), total))
    return History(request, grid, counter_increases(success, grid), increases[PROMPT_TOKENS],
                   increases[GENERATION_TOKENS], lengths[0], lengths[1], reader.queries)

