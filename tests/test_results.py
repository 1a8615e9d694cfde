"""Per-request records, the ITL histogram and the JSON-safe summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.results import FINISHED, REJECTED, LatencyHistogram, RequestLog, SimulationResult, dumps, summarize

KEYS = ["requests", "completed", "ttft_p50", "ttft_p95", "ttft_p99", "tpot_p50", "tpot_p95", "itl_p50", "e2e_p95",
        "queue_p95", "slo_attainment", "goodput", "throughput_tokens_per_s", "gpu_hours", "wall_seconds"]


def small_log() -> RequestLog:
    log = RequestLog(np.array([0.0, 1.0, 2.0, 3.0]), np.array([100, 200, 300, 400]), np.array([11, 1, 21, 5]))
    log.first_scheduled_s[:3] = [0.1, 1.0, 2.5]
    log.first_token_s[:3] = [0.5, 1.2, 5.0]
    log.finish_s[:3] = [1.5, 1.2, 7.0]
    log.status[:] = [FINISHED, FINISHED, FINISHED, REJECTED]
    return log


def test_summary_definitions() -> None:
    s = summarize(small_log(), LatencyHistogram(), slo_ttft_s=1.0, slo_tpot_s=0.15, duration_s=10.0,
                  gpu_seconds=3600.0, wall_seconds=0.5, preemptions=0)
    assert s["requests"] == 4 and s["completed"] == 3 and s["rejected"] == 1
    assert s["ttft_p50"] == pytest.approx(0.5)          # ttfts 0.5, 0.2, 3.0
    assert s["tpot_p50"] == pytest.approx(0.1)          # (1.5-0.5)/10, (7-5)/20: single-token excluded
    assert s["queue_p50"] == pytest.approx(0.1)
    # meets both SLOs: request 0 (ttft .5, tpot .1) and 1 (ttft .2, one token); 2 misses TTFT; 3 rejected
    assert s["slo_attainment"] == pytest.approx(0.5)
    assert s["goodput"] == pytest.approx(0.2)
    assert s["throughput_tokens_per_s"] == pytest.approx((111 + 201 + 321) / 10.0)
    assert s["gpu_hours"] == 1.0
    assert s["itl_p50"] is None
    for key in KEYS:
        assert key in s


def test_nothing_completed_gives_null_not_nan() -> None:
    log = RequestLog(np.array([0.0]), np.array([10]), np.array([10]))
    log.status[:] = REJECTED
    s = summarize(log, LatencyHistogram(), slo_ttft_s=1.0, slo_tpot_s=0.1, duration_s=0.0, gpu_seconds=0.0,
                  wall_seconds=0.0, preemptions=0)
    assert s["ttft_p99"] is None and s["slo_attainment"] == 0.0
    text = dumps(s)
    assert "NaN" not in text and json.loads(text)["ttft_p50"] is None
    with pytest.raises(ValueError):
        dumps({"x": float("nan")})


@settings(max_examples=50, deadline=None)
@given(first=st.floats(1e-4, 1.0), step=st.floats(0.0, 1e-3), k=st.integers(0, 3000))
def test_arithmetic_add_equals_explicit_values(first: float, step: float, k: int) -> None:
    a, b = LatencyHistogram(), LatencyHistogram()
    a.add_arithmetic(first, step, k, 3.0)
    if k:
        b.add_values(first + step * np.arange(k), 3.0)
    assert a.total == pytest.approx(3.0 * k)
    assert np.abs(a.counts - b.counts).sum() <= 6.0 + 1e-9  # a value exactly on an edge may land one bin over


def test_histogram_percentiles_within_bin_width() -> None:
    rng = np.random.default_rng(0)
    values = rng.lognormal(-3.0, 1.0, 20_000)
    h = LatencyHistogram()
    h.add_values(values[:10_000])
    for v in values[10_000:]:
        h.add(float(v))
    for q in (50, 90, 99):
        assert h.percentile(q) == pytest.approx(np.percentile(values, q), rel=0.02)


def test_write_files(tmp_path: Path) -> None:
    log = small_log()
    res = SimulationResult(log=log, itl=LatencyHistogram(), end_s=10.0, gpu_seconds=36.0, wall_seconds=0.1,
                           kv_usage=np.array([[0.0, 0.1, 0.2, 1.0]]), preemptions=0, profile="p")
    summary = res.summary(1.0, 0.1)
    res.write(tmp_path / "out", summary)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["requests"] == 4
    rows = (tmp_path / "out" / "requests.csv").read_text().splitlines()
    assert len(rows) == 5 and rows[4].endswith(",rejected") and ",," in rows[4]
    assert (tmp_path / "out" / "kv_usage.csv").read_text().startswith("t_s,kv_usage_mean")
