"""The simulator's Signals equal the live scaler's, sample for sample, against a REAL Prometheus.

A simulated fleet (three replicas; one restarts, so its counters reset) is scraped by the simulator's
Prometheus (``simulator.observe``). Every sample it took is written as OpenMetrics and backfilled into
a real Prometheus with ``promtool tsdb create-blocks-from openmetrics``; the live source
(``scaler.sources.prometheus.PrometheusSource``, its real PromQL) then reads that history at the same
instants. Both hand their sums to the one ``scaler.assemble.assemble_signals``, so any difference is
in the measuring: PromQL's ``rate()`` extrapolation, instant-vector lookback, the histogram joins,
``vllm:cache_config_info``, the activation query. Evaluation instants sit half a second off the
scrape grid: at an exact sample boundary Prometheus 2.x's range selector includes the window's first
instant and the simulator does not (a boundary the live loop, unsynchronised, never hits on purpose).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import require
from support.openmetrics import openmetrics
from support.prometheus import PrometheusServer

from scaler.signals import Signals
from scaler.sources.base import Target
from scaler.sources.prometheus import PrometheusSource
from simulator.observe import ObserveConfig, Observer, metrics_of

MODEL = "parity-model"
REPLICAS = 3
SPAN_S = 400
RESTART = (1, 170)  # replica 1 restarts at 170 s: its counters begin again at 0
PROMPT_LE = (128.0, 512.0, 2048.0, 8192.0, math.inf)
TTFT_LE = (0.1, 0.5, 1.0, 2.0, 5.0, math.inf)
EVAL_AT = (125.5, 181.5, 240.5, 333.5, 399.5)
ACTIVATION = "sum(gateway_queue_requests)"


def snapshot(rid: int, t: float) -> dict[str, Any]:
    """Replica ``rid``'s /metrics at ``t``: counters from piecewise rates, gauges that move."""
    since = t - RESTART[1] if rid == RESTART[0] and t >= RESTART[1] else t
    load = 1.0 + 0.5 * rid + (0.8 if t > 200 else 0.0)  # requests per second, a step at 200 s
    done = math.floor(load * since)
    share = (0.4, 0.3, 0.2, 0.08, 0.02)
    prompt_buckets = [(le, float(math.floor(done * sum(share[: i + 1])))) for i, le in enumerate(PROMPT_LE)]
    ttft_share = (0.5, 0.3, 0.1, 0.06, 0.03, 0.01)
    ttft_buckets = [(le, float(math.floor(done * sum(ttft_share[: i + 1])))) for i, le in enumerate(TTFT_LE)]
    return {
        "prompt_tokens_total": 900.0 * done, "generation_tokens_total": 180.0 * done + 7 * since,
        "num_requests_running": float(4 + rid + int(t) % 5), "num_requests_waiting": float(int(t / 30) % 4 * rid),
        "kv_cache_usage_perc": 0.2 + 0.1 * rid + 0.001 * (int(t) % 50),
        "prefix_cache_queries": 900.0 * done, "prefix_cache_hits": 300.0 * done,
        "request_prompt_tokens_sum": 900.0 * done, "request_prompt_tokens_count": float(done),
        "request_generation_tokens_sum": 180.0 * done, "request_generation_tokens_count": float(done),
        "request_prompt_tokens_bucket": prompt_buckets, "time_to_first_token_seconds_bucket": ttft_buckets,
        "num_gpu_blocks": 4000 + 500 * rid, "block_size": 16,
    }


def simulate_scrapes() -> tuple[dict[float, Signals | None], list[tuple[int, float, dict[str, float]]],
                               list[tuple[float, float]]]:
    """Feed the simulator's Prometheus on its 1 s tick, reading its Signals at each ``EVAL_AT`` as the
    simulated scaler would (then, not afterwards: it keeps only the history a query needs); return them,
    what it scraped and the gateway samples."""
    observer = Observer(ObserveConfig(scrape_interval_s=15, rate_window_s=60))
    taken: list[tuple[int, float, dict[str, float]]] = []
    signals: dict[float, Signals | None] = {}

    def target(rid: int, t: float):
        def read() -> dict[str, Any]:
            snap = snapshot(rid, t)
            taken.append((rid, t, metrics_of(snap)))
            return snap
        return read

    gateway: list[tuple[float, float]] = []
    for second in range(SPAN_S + 1):
        t = float(second)
        observer.scrape(t, {rid: target(rid, t) for rid in range(REPLICAS)}, gateway_waiting=float(second // 40 % 3))
        if observer.gateway_samples and (not gateway or observer.gateway_samples[-1] != gateway[-1]):
            gateway.append(observer.gateway_samples[-1])
        for at in EVAL_AT:
            if second <= at < second + 1:
                signals[at] = observer.signals(at, ready_replicas=REPLICAS, starting_replicas=0,
                                               lead_time_auto=False)
    return signals, taken, gateway


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, dict[float, Signals | None]]]:
    require(shutil.which("promtool") is not None, "promtool (apt-get install prometheus)")
    simulated, taken, gateway = simulate_scrapes()
    root = tmp_path_factory.mktemp("parity")
    start = (int(time.time()) // 3600 - 3) * 3600
    (root / "samples.om").write_text(openmetrics(start, taken, gateway))
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(root / "samples.om"),
                    str(root / "data")], check=True, capture_output=True, timeout=300)
    with PrometheusServer(scrape_interval_s=15, data_dir=root / "data", ready_timeout_s=90) as prom:
        yield prom.url, start, simulated


def _live(url: str, start: int, at: float) -> Signals:
    source = PrometheusSource(url, timeout_s=10, evaluation_time=start + at)
    target = Target(model=MODEL, activation_query=ACTIVATION, rate_window_s=60)
    result = source.fetch([target], now=at)[target]
    assert isinstance(result, Signals), result
    return result


@pytest.mark.parametrize("at", EVAL_AT)
def test_simulated_and_real_prometheus_give_the_same_signals(
        backfilled: tuple[str, int, dict[float, Signals | None]], at: float) -> None:
    url, start, simulated_at = backfilled
    live = _live(url, start, at)
    simulated = simulated_at[at]
    assert simulated is not None
    for field in dataclasses.fields(Signals):
        mine, theirs = getattr(simulated, field.name), getattr(live, field.name)
        if isinstance(mine, tuple):
            assert [le for le, _ in mine] == [le for le, _ in theirs], field.name
            assert [r for _, r in mine] == pytest.approx([r for _, r in theirs], rel=1e-9), field.name
        elif isinstance(mine, float):
            assert mine == pytest.approx(theirs, rel=1e-9, abs=1e-9), (field.name, mine, theirs)
        else:
            assert mine == theirs, (field.name, mine, theirs)
    # the comparison is not vacuous: every optional signal was measured on both sides
    for name in ("mean_prompt_tokens", "mean_output_tokens", "prompt_tokens_weighted_mean", "ttft_buckets",
                 "kv_cache_usage", "kv_cache_tokens", "prefix_cache_hit_share", "activation_value"):
        assert getattr(live, name) is not None, name


def test_the_restart_is_inside_a_compared_window(
        backfilled: tuple[str, int, dict[float, Signals | None]]) -> None:
    """The 181.5 s instant's rate window holds replica 1's reset: both sides add the restarted counter."""
    url, start, _ = backfilled
    at = 181.5
    assert at - 60 < RESTART[1] < at
    before, after = _live(url, start, 125.5), _live(url, start, at)
    assert after.prompt_tokens_per_s > 0.5 * before.prompt_tokens_per_s  # a reset read as a fall would halve it


def test_a_range_read_of_history_equals_instant_reads_at_every_instant(
        backfilled: tuple[str, int, dict[float, Signals | None]]) -> None:
    """``PrometheusSource.history`` (one range query per signal, what a restarted scaler replays) answers
    at every instant exactly what an instant ``fetch`` there answers: values, errors and the reset."""
    url, start, _ = backfilled
    target = Target(model=MODEL, activation_query=ACTIVATION, rate_window_s=60)
    other = Target(model="no-such-model", rate_window_s=60)  # no series: the same error both ways
    history = PrometheusSource(url, timeout_s=10).history([target, other], start + 0.5, start + 399.5, 15.0)
    assert [at - start for at, _ in history] == [0.5 + 15 * k for k in range(27)]
    measured = 0
    for at, answers in history:
        instant = PrometheusSource(url, timeout_s=10, evaluation_time=at).fetch([target, other], now=at)
        for t in (target, other):
            mine, theirs = answers[t], instant[t]
            assert type(mine) is type(theirs), (at - start, t.model, mine, theirs)
            if isinstance(mine, Signals):
                # equal to the last bits but for sums Prometheus adds in its own series order (an avg of avgs)
                assert isinstance(theirs, Signals)
                assert _fields(mine) == pytest.approx(_fields(theirs), rel=1e-12, abs=1e-12), at - start
                assert [le for le, _ in mine.ttft_buckets] == [le for le, _ in theirs.ttft_buckets]
                measured += 1
            else:
                assert str(mine) == str(theirs)
    assert measured >= 20  # most instants measured something: the comparison is not of errors alone


def _fields(signals: Signals) -> list[float]:
    """Every number in a snapshot, flattened (None as -1), for an approximate comparison."""
    out: list[float] = []
    for field in dataclasses.fields(Signals):
        value = getattr(signals, field.name)
        if isinstance(value, tuple):
            out += [float(x) for pair in value for x in (pair if isinstance(pair, tuple) else (pair,))]
        else:
            out.append(-1.0 if value is None else float(value))
    return out
