"""The simulated Prometheus: scrape phases, staleness, rate() extrapolation, and the Signals it yields."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.observe import ObserveConfig, Observer, extrapolated_rate, metrics_of


def snapshot(t: float, prompt_rate: float = 100.0, gen_rate: float = 50.0, waiting: int = 2, running: int = 3,
             kv: float = 0.5) -> dict[str, float]:
    """A replica's counters at time ``t`` under constant rates (one request finishes per second)."""
    return {
        "prompt_tokens_total": prompt_rate * t, "generation_tokens_total": gen_rate * t,
        "num_requests_waiting": waiting, "num_requests_running": running, "kv_cache_usage_perc": kv,
        "request_prompt_tokens_sum": 800.0 * t, "request_prompt_tokens_count": 1.0 * t,
        "request_generation_tokens_sum": 200.0 * t, "request_generation_tokens_count": 1.0 * t,
    }


def test_rate_matches_prometheus_extrapolation() -> None:
    times = [15.0, 30.0, 45.0, 60.0]
    values = [150.0, 300.0, 450.0, 600.0]
    assert extrapolated_rate(times, values, 0.0, 60.0) == pytest.approx(10.0)
    # a counter that started at 0 recently: extrapolation stops at zero
    assert extrapolated_rate([45.0, 60.0], [0.0, 150.0], 0.0, 60.0) == pytest.approx(150.0 / 60.0)
    # far from the window start: extrapolate only half an interval
    assert extrapolated_rate([40.0, 55.0], [1000.0, 1150.0], 0.0, 60.0) == pytest.approx(150 * 27.5 / 15 / 60)
    assert extrapolated_rate([15.0], [1.0], 0.0, 60.0) is None


def test_rate_handles_counter_resets() -> None:
    assert extrapolated_rate([0.0, 10.0, 20.0], [100.0, 200.0, 50.0], 0.0, 20.0) == pytest.approx(150 / 20)


def test_new_targets_are_scraped_at_their_own_phase_and_vanish_when_gone() -> None:
    obs = Observer(ObserveConfig())
    first: dict[int, float] = {}
    for t in range(0, 40):
        obs.scrape(float(t), {0: snapshot(t), 1: snapshot(t)})
        for rid in obs.prometheus.series:
            if obs.prometheus.series[rid].times and rid not in first:
                first[rid] = obs.prometheus.series[rid].times[0]
    assert first[0] == 0.0
    assert first[1] == 10.0  # phase 0.618 x 15 s = 9.3 s, scraped at the next 1 s tick
    assert set(obs.gauge("vllm:num_requests_waiting", 39.0)) == {0, 1}
    for t in range(40, 60):
        obs.scrape(float(t), {0: snapshot(t)})
    assert set(obs.gauge("vllm:num_requests_waiting", 59.0)) == {0}


def test_signals_follow_the_live_source() -> None:
    obs = Observer(ObserveConfig(scrape_interval_s=15, rate_window_s=60))
    assert obs.signals(0.0, 0, 1) is None  # nothing scraped, no activation query answer: "no data"
    obs.scrape(0.0, {0: snapshot(0)}, gateway_waiting=4)
    assert obs.signals(0.0, 1, 0) is None  # one sample: rate() is empty
    for t in range(1, 121):
        obs.scrape(float(t), {0: snapshot(t)}, gateway_waiting=0)
    s = obs.signals(122.0, ready_replicas=1, starting_replicas=2)
    assert s is not None
    assert s.prompt_tokens_per_s == pytest.approx(100.0)
    assert s.generation_tokens_per_s == pytest.approx(50.0)
    assert (s.requests_waiting, s.requests_running, s.ready_replicas, s.starting_replicas) == (2, 3, 1, 2)
    assert s.mean_prompt_tokens == pytest.approx(800.0)
    assert s.mean_output_tokens == pytest.approx(200.0)
    assert s.kv_cache_usage == pytest.approx(0.5)
    assert s.waiting_tokens is None  # vLLM exports no waiting-token count
    assert s.data_age_s == pytest.approx(2.0)
    assert s.activation_value == 0.0


def test_signals_at_zero_ready_use_the_activation_value() -> None:
    obs = Observer()
    obs.scrape(0.0, {}, gateway_waiting=7)
    s = obs.signals(1.0, ready_replicas=0, starting_replicas=1)
    assert s is not None and s.ready_replicas == 0 and s.activation_value == 7.0


def test_rates_lag_a_step_in_load() -> None:
    """A load step shows up in rate() only gradually: the lag policies must live with."""
    obs = Observer()
    total = 0.0
    for t in range(0, 300):
        total += 100.0 if t < 200 else 300.0
        obs.scrape(float(t), {0: {**snapshot(t), "prompt_tokens_total": total}})
    just_after = obs.signals(215.0, 1, 0)
    settled = obs.signals(299.0, 1, 0)
    assert just_after is not None and settled is not None
    assert 100 < just_after.prompt_tokens_per_s < 200
    assert settled.prompt_tokens_per_s == pytest.approx(300.0, rel=0.05)


def test_lead_time_is_nearest_rank_p90_after_three_starts() -> None:
    obs = Observer()
    obs.record_cold_start(100)
    obs.record_cold_start(200)
    assert obs.lead_time_s() is None
    for value in (150, 120, 300, 110, 130, 140, 160, 170):
        obs.record_cold_start(value)
    assert obs.lead_time_s() == 200.0  # 10 samples: the 9th smallest


def test_metrics_of_reads_objects_and_mappings() -> None:
    class Snap:
        prompt_tokens_total = 5
        num_requests_waiting = 1
    assert metrics_of(Snap()) == {"vllm:prompt_tokens_total": 5.0, "vllm:num_requests_waiting": 1.0}
    assert metrics_of({"kv_cache_usage_perc": 0.25}) == {"vllm:kv_cache_usage_perc": 0.25}


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="scrape_interval_s=0"):
        ObserveConfig(scrape_interval_s=0)
    with pytest.raises(ValueError, match="rate_window_s=20"):
        ObserveConfig(scrape_interval_s=15, rate_window_s=20)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=2, max_size=20), st.floats(1, 100))
def test_rate_is_finite_and_non_negative(increments: list[float], step: float) -> None:
    values, total = [], 0.0
    for inc in increments:
        total += inc
        values.append(total)
    times = [i * step for i in range(len(values))]
    rate = extrapolated_rate(times, values, -step / 2, times[-1])
    assert rate is not None and math.isfinite(rate) and rate >= 0


def test_signals_carry_the_prefix_cache_hit_share() -> None:
    obs = Observer(ObserveConfig(scrape_interval_s=15, rate_window_s=60))
    for t in range(0, 121):
        snap = dict(snapshot(t), prefix_cache_queries=1000.0 * t, prefix_cache_hits=400.0 * t)
        obs.scrape(float(t), {0: snap})
    s = obs.signals(121.0, ready_replicas=1, starting_replicas=0)
    assert s is not None and s.prefix_cache_hit_share == pytest.approx(0.4)
    plain = Observer()
    for t in range(0, 121):
        plain.scrape(float(t), {0: snapshot(t)})
    quiet = plain.signals(121.0, ready_replicas=1, starting_replicas=0)
    assert quiet is not None and quiet.prefix_cache_hit_share is None  # no queries: not measured, never 0
