"""What a simulation produced: per-request records, the token-gap histogram, and the summary.

``RequestLog`` holds one numpy column per field (arrival, first token, finish, lengths, preemptions,
replica, status): replicas write into it, the summary reads it. Times are simulated seconds from the
workload's first arrival; NaN in a column means "did not happen". The summary is JSON-safe: an
undefined statistic (no completed request) is ``None``, never NaN.

Definitions: TTFT = first token - arrival (gateway and queue wait included); TPOT = (finish - first
token) / (output - 1) for requests with >= 2 output tokens; ITL = duration of each decode step,
weighted by the tokens it produced (kept in a log-binned histogram, 1 % resolution, so percentiles
cost no per-token memory; gaps from preemption show in TPOT, not ITL); E2E = finish - arrival;
queue = first scheduled - arrival. SLO attainment = share of *all* requests (rejected and aborted ones
count as misses) with TTFT <= slo_ttft and TPOT <= slo_tpot; goodput = such requests per second.
Rejections are also counted apart from misses: ``rejected_share`` (of all requests),
``slo_attainment_accepted`` (the same attainment among requests not rejected) and ``slo_missed``
(accepted requests that missed the SLO, aborted ones included); ``overload_rejected`` (the gateway's
429s at its waiting-token limit) comes from the engine.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, cast

import numpy as np

PENDING, FINISHED, REJECTED, ABORTED = 0, 1, 2, 3
STATUS_NAMES = ("pending", "finished", "rejected", "aborted")
PERCENTILES = (50, 90, 95, 99)


class LatencyHistogram:
    """Weighted histogram on log-spaced bins from 10 us to 1000 s (about 1 % wide).

    Values arrive as arithmetic runs (``first + step * i`` for i < k, each with a weight): appending is
    O(1) in the simulation's hot loop, and the runs are binned in bulk, exactly, when a statistic is read.
    """

    LO, HI, BINS = 1e-5, 1e3, 1600

    def __init__(self) -> None:
        self.edges = np.geomspace(self.LO, self.HI, self.BINS + 1)
        self.counts = np.zeros(self.BINS + 2, dtype=np.float64)  # [underflow, bins..., overflow]
        self._runs: list[tuple[float, float, int, float]] = []

    def add(self, value: float, weight: float = 1.0) -> None:
        self._runs.append((value, 0.0, 1, weight))

    def add_arithmetic(self, first: float, step: float, k: int, weight: float) -> None:
        """Add ``first + step * i`` for i in [0, k), each with ``weight``."""
        if k > 0:
            self._runs.append((first, step, k, weight))

    def add_values(self, values: np.ndarray, weight: float = 1.0) -> None:
        idx = np.searchsorted(self.edges, np.atleast_1d(values), side="right")
        np.add.at(self.counts, idx, weight)

    def _flush(self) -> None:
        if not self._runs:
            return
        r = np.array(self._runs, dtype=np.float64)
        self._runs = []
        first, step, k, w = r[:, 0], r[:, 1], r[:, 2], r[:, 3]
        lo = np.searchsorted(self.edges, first, side="right")
        hi = np.searchsorted(self.edges, first + step * (k - 1), side="right")
        one = lo == hi  # the common case: a whole run inside one bin
        np.add.at(self.counts, lo[one], (k * w)[one])
        many = ~one  # a run across a few neighbouring bins: count the values in each, bin by bin
        f, st, kk, ww, b0, b1 = first[many], step[many], k[many], w[many], lo[many], hi[many]
        bounds = np.concatenate(([-np.inf], self.edges, [np.inf]))  # bin b holds [bounds[b], bounds[b + 1])
        with np.errstate(invalid="ignore", over="ignore"):
            for d in range(int((b1 - b0).max()) + 1 if f.size else 0):
                b = np.minimum(b0 + d, b1)
                below_hi = np.clip(np.ceil((bounds[b + 1] - f) / st), 0, kk)
                below_lo = np.clip(np.ceil((bounds[b] - f) / st), 0, kk)
                np.add.at(self.counts, b, np.where(b0 + d <= b1, (below_hi - below_lo) * ww, 0.0))

    def merge(self, other: LatencyHistogram) -> None:
        self._flush()
        other._flush()
        self.counts += other.counts

    @property
    def total(self) -> float:
        self._flush()
        return float(self.counts.sum())

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (geometric bin centre); None when empty."""
        self._flush()
        total = self.counts.sum()
        if total <= 0:
            return None
        i = int(np.searchsorted(np.cumsum(self.counts), total * q / 100.0, side="left"))
        if i == 0:
            return self.LO
        if i > self.BINS:
            return self.HI
        return float(math.sqrt(self.edges[i - 1] * self.edges[i]))


@dataclass
class RequestLog:
    """Per-request columns, filled in by replicas and the gateway during a run."""

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    first_scheduled_s: np.ndarray = field(init=False)
    first_token_s: np.ndarray = field(init=False)
    finish_s: np.ndarray = field(init=False)
    generated: np.ndarray = field(init=False)
    preemptions: np.ndarray = field(init=False)
    replica: np.ndarray = field(init=False)
    status: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        n = self.arrival_s.size
        self.first_scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.generated = np.zeros(n, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int32)
        self.replica = np.full(n, -1, dtype=np.int32)
        self.status = np.zeros(n, dtype=np.int8)

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    # Python-list mirrors for the Python engine's scalar reads (numpy scalar access is slower); built on
    # first use, so the compiled engine (which never reads them) spends no memory on them
    @cached_property
    def arrival_l(self) -> list[float]:
        return cast("list[float]", self.arrival_s.tolist())

    @cached_property
    def input_l(self) -> list[int]:
        return cast("list[int]", self.input_tokens.tolist())

    @cached_property
    def tokens_l(self) -> list[int]:
        return cast("list[int]", (self.input_tokens + self.output_tokens).tolist())

    def write_csv(self, path: Path) -> None:
        """One row per request; empty cells where an event did not happen."""
        cols = {"arrival_s": self.arrival_s, "first_scheduled_s": self.first_scheduled_s,
                "first_token_s": self.first_token_s, "finish_s": self.finish_s}
        with open(path, "w") as fh:
            fh.write("request,arrival_s,first_scheduled_s,first_token_s,finish_s,input_tokens,output_tokens,"
                     "generated_tokens,preemptions,replica,status\n")
            text = {k: np.char.mod("%.6f", v) for k, v in cols.items()}
            for k, v in cols.items():
                text[k][np.isnan(v)] = ""
            status = np.asarray(STATUS_NAMES)[self.status]
            for i in range(len(self)):
                fh.write(f"{i},{text['arrival_s'][i]},{text['first_scheduled_s'][i]},{text['first_token_s'][i]},"
                         f"{text['finish_s'][i]},{self.input_tokens[i]},{self.output_tokens[i]},{self.generated[i]},"
                         f"{self.preemptions[i]},{self.replica[i]},{status[i]}\n")


def _pct(values: np.ndarray) -> dict[int, float | None]:
    if values.size == 0:
        return dict.fromkeys(PERCENTILES)
    got = np.percentile(values, PERCENTILES)
    return {q: float(v) for q, v in zip(PERCENTILES, got, strict=True)}


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


LATENCIES = ("ttft", "tpot", "e2e", "queue")


class Tally:
    """What a summary counts, fed by slices of requests: once with the whole log (``summarize``: exact
    percentiles), or slice by slice as a streamed run retires its requests (``streamed=True``: the
    percentiles come from ``LatencyHistogram`` bins, about 1 % wide, and memory stays bounded)."""

    def __init__(self, slo_ttft_s: float, slo_tpot_s: float, streamed: bool = False) -> None:
        self.slo_ttft_s, self.slo_tpot_s, self.streamed = float(slo_ttft_s), float(slo_tpot_s), streamed
        self.requests = self.completed = self.rejected = self.aborted = self.unfinished = self.good = 0
        self.good_tokens = self.done_tokens = self.done_output = 0
        self._values: dict[str, list[np.ndarray]] = {name: [] for name in LATENCIES}
        self._hists = {name: LatencyHistogram() for name in LATENCIES}
        self._sums = dict.fromkeys(LATENCIES, 0.0)
        self._counts = dict.fromkeys(LATENCIES, 0)

    def add(self, arrival_s: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray,
            first_scheduled_s: np.ndarray, first_token_s: np.ndarray, finish_s: np.ndarray,
            status: np.ndarray) -> None:
        """Count these requests (columns of ``RequestLog``, all the same length)."""
        done = status == FINISHED
        multi = done & (output_tokens > 1)
        tpot_all = np.zeros(status.size)
        tpot_all[multi] = (finish_s[multi] - first_token_s[multi]) / (output_tokens[multi] - 1)
        good = done & (first_token_s - arrival_s <= self.slo_ttft_s) & (tpot_all <= self.slo_tpot_s)
        values = {"ttft": (first_token_s - arrival_s)[done], "tpot": tpot_all[multi],
                  "e2e": (finish_s - arrival_s)[done], "queue": (first_scheduled_s - arrival_s)[done]}
        for name, v in values.items():
            if self.streamed:
                self._hists[name].add_values(v)
                self._sums[name] += float(v.sum())
                self._counts[name] += int(v.size)
            else:
                self._values[name].append(v)
        self.requests += int(status.size)
        self.completed += int(done.sum())
        self.rejected += int((status == REJECTED).sum())
        self.aborted += int((status == ABORTED).sum())
        self.unfinished += int((status == PENDING).sum())
        self.good += int(good.sum())
        self.good_tokens += int((input_tokens[good] + output_tokens[good]).sum())
        self.done_tokens += int((input_tokens[done] + output_tokens[done]).sum())
        self.done_output += int(output_tokens[done].sum())

    def latency(self, name: str) -> tuple[dict[int, float | None], float | None]:
        """Percentiles and mean of one latency (None where no request has it)."""
        if self.streamed:
            h, n = self._hists[name], self._counts[name]
            return {q: h.percentile(q) for q in PERCENTILES}, (self._sums[name] / n if n else None)
        parts = self._values[name]
        values = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0)
        return _pct(values), (float(values.mean()) if values.size else None)


def summarize(log: RequestLog, itl: LatencyHistogram, *, slo_ttft_s: float, slo_tpot_s: float,
              duration_s: float, gpu_seconds: float, wall_seconds: float, preemptions: int,
              kv_usage: np.ndarray | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary dict (keys of issues 3 and 4); every float finite or None."""
    tally = Tally(slo_ttft_s, slo_tpot_s)
    tally.add(log.arrival_s, log.input_tokens, log.output_tokens, log.first_scheduled_s, log.first_token_s,
              log.finish_s, log.status)
    return summary_of(tally, itl, duration_s=duration_s, gpu_seconds=gpu_seconds, wall_seconds=wall_seconds,
                      preemptions=preemptions, kv_usage=kv_usage, extra=extra)


def summary_of(tally: Tally, itl: LatencyHistogram, *, duration_s: float, gpu_seconds: float,
               wall_seconds: float, preemptions: int, kv_usage: np.ndarray | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary dict of what ``tally`` counted; every float finite or None."""
    n = tally.requests
    out: dict[str, Any] = {
        "requests": n, "completed": tally.completed, "rejected": tally.rejected, "aborted": tally.aborted,
        "unfinished": tally.unfinished, "preemptions": int(preemptions),
    }
    for name in LATENCIES:
        pcts, mean = tally.latency(name)
        for q, v in pcts.items():
            out[f"{name}_p{q}"] = _finite(v)
        out[f"{name}_mean"] = _finite(mean)
    for q in PERCENTILES:
        out[f"itl_p{q}"] = itl.percentile(q)
    dur = max(duration_s, 1e-9)
    out["slo_ttft_s"], out["slo_tpot_s"] = tally.slo_ttft_s, tally.slo_tpot_s
    out["slo_attainment"] = float(tally.good / n) if n else None
    accepted = int(n - tally.rejected)
    out["rejected_share"] = float(tally.rejected / n) if n else None
    out["slo_attainment_accepted"] = float(tally.good / accepted) if accepted else None
    out["slo_missed"] = int(accepted - tally.good)
    out["goodput"] = float(tally.good / dur)
    out["goodput_tokens_per_s"] = float(tally.good_tokens / dur)
    out["throughput_tokens_per_s"] = float(tally.done_tokens / dur)
    out["output_tokens_per_s"] = float(tally.done_output / dur)
    out["throughput_requests_per_s"] = float(tally.completed / dur)
    out["duration_s"] = float(duration_s)
    out["gpu_hours"] = float(gpu_seconds / 3600.0)
    if kv_usage is not None and kv_usage.size:
        out["kv_usage_mean"], out["kv_usage_max"] = float(kv_usage[:, 1].mean()), float(kv_usage[:, 2].max())
    else:
        out["kv_usage_mean"] = out["kv_usage_max"] = None
    out["wall_seconds"] = float(wall_seconds)
    if extra:
        out.update(extra)
    return out


@dataclass
class SimulationResult:
    """A finished run: per-request log, ITL histogram, KV usage samples (t, mean, max, replicas)."""

    log: RequestLog
    itl: LatencyHistogram
    end_s: float
    gpu_seconds: float
    wall_seconds: float
    kv_usage: np.ndarray
    preemptions: int
    profile: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self, slo_ttft_s: float = 2.0, slo_tpot_s: float = 0.1, **extra: Any) -> dict[str, Any]:
        return summarize(self.log, self.itl, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, duration_s=self.end_s,
                         gpu_seconds=self.gpu_seconds, wall_seconds=self.wall_seconds, preemptions=self.preemptions,
                         kv_usage=self.kv_usage, extra={"profile": self.profile, **self.extra, **extra})

    def write(self, out_dir: Path, summary: dict[str, Any]) -> None:
        """``summary.json``, ``requests.csv`` and ``kv_usage.csv`` under ``out_dir`` (created)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "summary.json").write_text(dumps(summary) + "\n")
        self.log.write_csv(out_dir / "requests.csv")
        np.savetxt(out_dir / "kv_usage.csv", self.kv_usage, delimiter=",", fmt=["%.3f", "%.6f", "%.6f", "%d"],
                   header="t_s,kv_usage_mean,kv_usage_max,replicas", comments="")


def json_safe(value: Any) -> Any:
    """JSON-ready: numpy scalars and arrays to Python, NaN and infinities to null (a figure that does not
    exist, e.g. a percentile of no requests), tuples to lists, keys to strings."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(summary: dict[str, Any]) -> str:
    """JSON text of a summary; refuses NaN/inf (a bug upstream), never writes them."""
    return json.dumps(summary, allow_nan=False, indent=2, sort_keys=False)


@dataclass
class Outcome:
    """What the engine reports after a run: per-request arrays and its own summary."""

    arrival_s: np.ndarray
    ttft_s: np.ndarray
    """NaN for requests that never got a first token (rejected or aborted)."""
    rejected: int
    end_s: float
    summary: dict[str, Any] = field(default_factory=dict)
    status: np.ndarray | None = None
    """Per-request status (``simulator.results``: finished, rejected, aborted, pending), when known."""
