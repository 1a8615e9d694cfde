"""``simulator.history``: counters to per-step increases (resets, gaps), length histograms, and ``advise``'s
reading of a REAL Prometheus holding history backfilled with ``promtool tsdb create-blocks-from openmetrics``.

Tolerance stated here and in docs/advisor.md: the rebuilt arrival rate matches the one written into
Prometheus within 3 % per 10-minute window, 10 % in windows holding a counter reset or a 12-minute
scrape gap, 1 % in total; the sampled mean prompt length within 10 % of the histogram's.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import require
from hypothesis import given, settings
from hypothesis import strategies as st
from support.prometheus import PrometheusServer, free_port

from simulator import history
from simulator.history import HistoryError, HistoryRequest, Lengths, counter_increases, parse_duration

MODEL = "llama3-8b"
STEP = 60.0
SCRAPE = 15
SPAN = 3 * 3600
BOUNDS = (64, 128, 256, 512, 1024, 2048, 4096)
SHARES = np.array([0.05, 0.10, 0.20, 0.25, 0.20, 0.12, 0.06, 0.02])  # last: +Inf


@pytest.mark.parametrize(("text", "seconds"), [("7d", 7 * 86400), ("12h", 43200), ("90m", 5400), ("30s", 30),
                                               ("3600", 3600), ("1.5h", 5400), ("2w", 1209600)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-1d", "7days", "d", "1e9999", "nan"])
def test_bad_durations_name_the_flag(text: str) -> None:
    with pytest.raises(ValueError, match="--since"):
        parse_duration(text)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 10**6), st.sampled_from(["", "s", "m", "h", "d", "w"]))
def test_any_positive_duration_parses_to_its_seconds(value: int, unit: str) -> None:
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[unit]
    assert parse_duration(f"{value}{unit}") == value * scale


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=8).filter(lambda c: sum(c) > 0),
       st.floats(0, 1e7), st.booleans())
def test_samples_always_fall_in_a_bucket_that_has_requests(counts: list[int], total: float, open_end: bool) -> None:
    edges = [2.0 ** (k + 4) for k in range(len(counts))]
    if open_end:
        edges[-1] = np.inf
    got = Lengths(np.array(edges), np.array(counts, dtype=float), total).sample(500, np.random.default_rng(0))
    assert got.min() >= 1
    index = np.searchsorted(np.array(edges), got, side="left")  # bucket k holds (edges[k-1], edges[k]]
    assert np.all(np.array(counts)[index] > 0)


def test_bad_requests_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"prometheus='ftp://x'.*step_s=0"):
        HistoryRequest("ftp://x", MODEL, 0.0, 600.0, step_s=0)
    with pytest.raises(ValueError, match="two steps"):
        HistoryRequest("http://127.0.0.1:9", MODEL, 0.0, 60.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=40), st.data())
def test_increases_survive_resets_and_gaps(increments: list[int], data: st.DataObject) -> None:
    """Whatever the reset and the inner gaps, the summed increase is exactly what was counted."""
    n = len(increments)
    resets = data.draw(st.sets(st.integers(1, n - 1), max_size=1))
    gaps = data.draw(st.sets(st.integers(1, n - 2), max_size=n // 3)) if n > 2 else set()
    values = [10_000.0]  # the baseline sample: counted before the range
    for k in range(1, n):
        values.append(float(increments[k]) if k in resets else values[-1] + increments[k])
    values_arr = np.array(values)
    values_arr[sorted(gaps)] = np.nan
    out = counter_increases({(("pod", "a"),): values_arr}, np.arange(n) * 60.0)
    lost = 0  # what a pod counted in a gap right before it restarted is gone with it (as in PromQL)
    for r in resets:
        j = r - 1
        while j in gaps:
            lost, j = lost + increments[j], j - 1
    assert out.total == pytest.approx(float(sum(increments[1:]) - lost))
    assert np.all(out.per_step >= 0)
    assert len(out.resets) == len(resets)


def test_a_reset_and_a_gap_are_reported_where_they_happen() -> None:
    values = np.array([10.0, 20.0, 5.0, np.nan, np.nan, 11.0, 12.0])
    out = counter_increases({(("pod", "b"),): values}, np.arange(7) * 60.0)
    assert out.per_step.tolist() == [0.0, 10.0, 5.0, 2.0, 2.0, 2.0, 1.0]
    assert out.resets == [(120.0, "pod=b")] and out.gaps == [(120.0, 300.0, "pod=b")]


def test_histogram_sampling_keeps_shares_and_the_mean_of_the_open_bucket() -> None:
    bounds = np.array([*BOUNDS, np.inf], dtype=float)
    counts = SHARES * 10_000
    mids = np.array([(lo + hi) / 2 for lo, hi in zip((0, *BOUNDS[:-1]), BOUNDS, strict=True)])
    total = float((counts[:-1] * mids).sum() + counts[-1] * 6000.0)
    lengths = Lengths(bounds, counts, total).sample(50_000, np.random.default_rng(1))
    assert lengths.min() >= 1
    shares = np.histogram(lengths, bins=[0, *BOUNDS, np.inf])[0] / lengths.size
    assert np.allclose(shares, SHARES, atol=0.01)
    assert lengths[lengths > 4096].mean() == pytest.approx(6000.0, rel=0.05)


# --- a real Prometheus with three hours of history --------------------------------------------------
def true_rate(t: np.ndarray) -> np.ndarray:
    """Fleet arrivals per second over the three hours: a slow swell with a surge."""
    return 3.0 + 2.0 * np.sin(2 * np.pi * t / SPAN) + 3.0 * np.exp(-(((t - 6000) / 600.0) ** 2))


def openmetrics(start: int) -> str:
    """Two pods' counters and histograms every 15 s; pod b restarts at 1 h and misses 12 min at 2 h."""
    t = np.arange(0, SPAN + SCRAPE, SCRAPE, dtype=float)
    per_scrape = true_rate(t) * SCRAPE / 2  # each pod serves half
    rng = np.random.default_rng(3)
    rows: dict[str, list[tuple[str, float, str]]] = {}  # family -> (series, time, value)
    lows, highs = (0, *BOUNDS), (*BOUNDS, 8000)
    for pod in ("a", "b"):
        done = np.floor(np.cumsum(per_scrape)).astype(np.int64)
        bucket = rng.choice(SHARES.size, size=int(done[-1]), p=SHARES)
        length = rng.integers(np.take(lows, bucket) + 1, np.take(highs, bucket) + 1)
        onehot = np.zeros((bucket.size + 1, SHARES.size), dtype=np.int64)
        onehot[np.arange(1, bucket.size + 1), bucket] = 1
        by_bucket, tokens = np.cumsum(onehot, axis=0), np.concatenate([[0], np.cumsum(length)])
        offset = 0
        labels = f'model_name="{MODEL}",pod="{pod}"'
        for k, ts in enumerate(t):
            if pod == "b" and 7200 <= ts < 7200 + 720:
                continue  # scrape gap
            if pod == "b" and ts >= 3600 and offset == 0:
                offset = int(done[k - 1])  # the pod restarted: its counters begin again at 0
            end = int(done[k])
            n, sum_tokens = end - offset, int(tokens[end] - tokens[offset])
            stamp = start + ts
            rows.setdefault("request_success counter", []).append(
                (f'vllm:request_success_total{{{labels},finished_reason="stop"}}', stamp, str(n)))
            rows.setdefault("prompt_tokens counter", []).append(
                (f"vllm:prompt_tokens_total{{{labels}}}", stamp, str(sum_tokens)))
            rows.setdefault("generation_tokens counter", []).append(
                (f"vllm:generation_tokens_total{{{labels}}}", stamp, str(sum_tokens)))
            cumulative = np.cumsum(by_bucket[end] - by_bucket[offset])
            for family in ("request_prompt_tokens", "request_generation_tokens"):
                out = rows.setdefault(f"{family} histogram", [])
                for le, c in zip([*map(str, BOUNDS), "+Inf"], cumulative, strict=True):
                    out.append((f'vllm:{family}_bucket{{{labels},le="{le}"}}', stamp, str(int(c))))
                out.append((f"vllm:{family}_count{{{labels}}}", stamp, str(n)))
                out.append((f"vllm:{family}_sum{{{labels}}}", stamp, str(sum_tokens)))
    text = []
    for family, samples in rows.items():
        name, kind = family.split(" ")
        text.append(f"# TYPE vllm:{name} {kind}")
        samples.sort(key=lambda r: (r[0], r[1]))  # each series' samples together, in time order
        text += [f"{series} {value} {stamp:.0f}" for series, stamp, value in samples]
    return "\n".join(text) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prometheus_with_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A Prometheus started on a TSDB backfilled with three hours of history ending 10 minutes ago."""
    require(shutil.which("promtool") is not None, "promtool (apt-get install prometheus)")
    root = tmp_path_factory.mktemp("history")
    start = (int(time.time()) // 3600 - 4) * 3600
    (root / "history.om").write_text(openmetrics(start))
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(root / "history.om"),
                    str(root / "data")], check=True, capture_output=True, timeout=300)
    with PrometheusServer(scrape_interval_s=15, data_dir=root / "data", ready_timeout_s=90) as prom:
        yield prom.url, start


def test_advise_reproduces_the_arrival_rate_from_real_prometheus(prometheus_with_history: tuple[str, int]) -> None:
    url, start = prometheus_with_history
    request = HistoryRequest(url, MODEL, float(start), float(start + SPAN), step_s=STEP, max_points=50)
    got = history.fetch_history(request)
    assert got.queries >= 3 * math.ceil(request.grid.size / 50)  # chunked: 181 steps in chunks of 50
    truth = true_rate(got.grid - start)
    rate = got.arrival_rate()
    windows = slice(1, None)
    # per 10 minutes (the gap's spreading and the scrape-vs-step phase even out), and in total
    ten = 10
    measured = np.add.reduceat(rate[windows], np.arange(0, rate.size - 1, ten))
    expected = np.add.reduceat(0.5 * (truth[:-1] + truth[1:]), np.arange(0, rate.size - 1, ten))
    # a reset loses what the pod counted between the last step and its restart; a gap is spread evenly
    near_gap = np.isin(np.arange(measured.size), (5, 11, 12, 13))  # reset at 3600 s, gap 7185..7920 s
    assert np.allclose(measured[~near_gap][:-1], expected[~near_gap][:-1], rtol=0.03), (measured, expected)
    assert np.allclose(measured[near_gap], expected[near_gap], rtol=0.10), (measured, expected)
    assert got.requests.total == pytest.approx(float(np.trapezoid(true_rate(np.arange(SPAN + 1.0)))), rel=0.01)
    assert len(got.requests.resets) == 1 and len(got.requests.gaps) == 1
    report = got.report()
    assert report["requests"]["resets"] == 1 and report["requests"]["gaps"] == 1
    # lengths: the histogram's shares, and the synthesized trace has the measured rate
    assert got.prompt_lengths is not None and got.prompt_lengths.bounds.size == len(BOUNDS) + 1
    assert np.allclose(got.prompt_lengths.counts / got.prompt_lengths.count, SHARES, atol=0.01)
    workload = got.synthesize(seed=0)
    assert len(workload) == pytest.approx(got.requests.total, abs=1)
    per_ten = np.histogram(workload.arrival_s, bins=np.arange(0, SPAN + 1, 600))[0] / 600
    assert np.allclose(per_ten, np.add.reduceat(rate[1:], np.arange(0, 180, 10)) / 10, rtol=0.03)
    prompt_mean = got.prompt_lengths.total / got.prompt_lengths.count
    assert workload.input_tokens.mean() == pytest.approx(prompt_mean, rel=0.10)


def test_no_history_for_the_model_is_a_clear_error(prometheus_with_history: tuple[str, int]) -> None:
    url, start = prometheus_with_history
    with pytest.raises(HistoryError, match="no vllm:request_success_total for model_name='other'"):
        history.fetch_history(HistoryRequest(url, "other", float(start), float(start + 3600)))


def test_unreachable_prometheus_is_a_clear_error() -> None:
    with pytest.raises(HistoryError, match="range query"):
        history.fetch_history(HistoryRequest(f"http://127.0.0.1:{free_port()}", MODEL, 0.0, 600.0, timeout_s=2))
