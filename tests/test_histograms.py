"""vLLM's histograms: prompt lengths (long prompts cost more per token) and the TTFT tail (the SLO, measured)."""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaler.capacity import ReplicaCapacity
from scaler.histograms import TTFT_BUCKETS, share_above, token_weighted_mean, vllm_token_buckets
from scaler.policy import PolicyConfig, PolicyState, decide
from scaler.profiles import get_profile
from scaler.signals import Signals
from simulator.engine import Engine, EngineConfig
from simulator.observe import ObserveConfig, Observer
from simulator.workload import Workload


def cumulative_rates(lengths: list[int], bounds: tuple[float, ...], seconds: float = 1.0) -> dict[float, float]:
    """What ``rate(vllm:request_prompt_tokens_bucket[w])`` returns for these finished requests."""
    counts = [0] * (len(bounds) + 1)
    for n in lengths:
        counts[bisect.bisect_left(bounds, n)] += 1
    running = np.cumsum(counts) / seconds
    return dict(zip((*bounds, math.inf), running.tolist(), strict=True))


def test_buckets_are_vllms_1_2_5_series() -> None:
    assert vllm_token_buckets(4096) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
    assert vllm_token_buckets(5000)[-1] == 5000 and vllm_token_buckets(131072)[-1] == 100000


def test_one_bucket_is_read_as_uniform_inside_it() -> None:
    # 10 requests in (200, 500]: mean 350, mean square (200² + 200·500 + 500²) / 3
    estimate = token_weighted_mean(cumulative_rates([300] * 10, vllm_token_buckets(4096)))
    assert estimate == pytest.approx((200**2 + 200 * 500 + 500**2) / 3 / 350)


def test_the_overflow_bucket_takes_the_mean_the_sum_leaves() -> None:
    bounds = vllm_token_buckets(4096)
    rates = cumulative_rates([100, 3000, 3000, 6000], bounds)  # three requests above the last bound (2000)
    assert rates[2000.0] == 1 and rates[math.inf] == 4
    estimate = token_weighted_mean(rates, mean_length=(100 + 3000 + 3000 + 6000) / 4)
    # (50, 100] is read as uniform (mean 75), and the overflow's three requests sit at the mean the sum leaves
    m = (12100 - 75) / 3
    assert estimate == pytest.approx((3 * m * m + (50**2 + 50 * 100 + 100**2) / 3) / (3 * m + 75))
    without = token_weighted_mean(rates)  # no mean known: the overflow sits at the last bound, a lower bound
    assert without == pytest.approx((3 * 2000**2 + (50**2 + 50 * 100 + 100**2) / 3) / (3 * 2000 + 75))
    assert without < estimate


@pytest.mark.parametrize("rates", [{}, {1.0: 0.0, math.inf: 0.0}, {1.0: 2.0, 10.0: 1.0, math.inf: 2.0},
                                   {1.0: float("nan"), math.inf: 1.0}, {10.0: -1.0, math.inf: 1.0}],
                         ids=["empty", "no-requests", "decreasing", "nan", "negative"])
def test_malformed_or_empty_histograms_give_no_estimate(rates: dict[float, float]) -> None:
    assert token_weighted_mean(rates) is None


@given(st.lists(st.integers(1, 131072), min_size=1, max_size=200))
def test_estimate_is_finite_and_within_the_bucket_resolution(lengths: list[int]) -> None:
    n = np.asarray(lengths, dtype=float)
    truth = float((n * n).sum() / n.sum())
    estimate = token_weighted_mean(cumulative_rates(lengths, vllm_token_buckets(131072)), float(n.mean()))
    assert estimate is not None and math.isfinite(estimate)
    assert truth / 3 <= estimate <= truth * 3  # 1-2-5 buckets are at most 2.5 wide


def test_capacity_cost_factor_and_its_validation() -> None:
    cap = ReplicaCapacity(10_000.0, 5_000.0, 256, 100_000, prefill_attention_tokens=20_000.0)
    assert cap.prefill_cost_factor(None) == 1.0
    assert cap.prefill_cost_factor(40_000.0) == pytest.approx(2.0)
    assert ReplicaCapacity(10_000.0, 5_000.0, 256, 100_000).prefill_cost_factor(40_000.0) == 1.0
    with pytest.raises(ValueError, match=r"prefill_attention_tokens=-1\.0"):
        ReplicaCapacity(10_000.0, 5_000.0, 256, 100_000, prefill_attention_tokens=-1.0)


@pytest.mark.parametrize("n", [512, 8192, 32768])
def test_profile_capacity_prices_a_prompt_like_its_step_time_model(n: int) -> None:
    """n (1 + n / 2K) / P equals the step model's linear plus attention seconds, derated like P."""
    profile = get_profile("h100-llama3-8b")
    cap = profile.capacity(2.0)
    st_ = profile.step_time
    budget = profile.max_num_batched_tokens
    rho = cap.prefill_tokens_per_s * st_.step_time(budget, 1, 0.0, 0.0) / budget
    model_s = (st_.step_time(budget, 1, 0.0, 0.0) / budget * n + st_.prefill_attention_s * n * n / 2) / rho
    assert n * cap.prefill_cost_factor(n) / cap.prefill_tokens_per_s == pytest.approx(model_s, rel=1e-9)


def _signals(prompt_tps: float, weighted: float | None, mean: float | None = 1000.0) -> Signals:
    return Signals(at=0.0, prompt_tokens_per_s=prompt_tps, generation_tokens_per_s=0.0, requests_waiting=0.0,
                   requests_running=10.0, ready_replicas=4, mean_prompt_tokens=mean,
                   prompt_tokens_weighted_mean=weighted, kv_cache_usage=0.1)


def test_the_same_token_rate_in_longer_prompts_needs_more_replicas() -> None:
    cap = ReplicaCapacity(10_000.0, 5_000.0, 256, 10_000_000, prefill_attention_tokens=20_000.0)
    config = PolicyConfig(capacity=cap, lead_time_s=0.0, scale_down_delay_s=0.0)
    short = decide(_signals(20_000.0, 1_000.0), PolicyState(), config, 0.0)
    long = decide(_signals(20_000.0, 40_000.0), PolicyState(), config, 0.0)
    assert short.terms["prefill_cost_factor"] == pytest.approx(1.025)
    assert long.terms["prefill_cost_factor"] == pytest.approx(2.0)
    assert long.terms["served_replicas"] == pytest.approx(4.0) and short.terms["served_replicas"] < 2.1
    assert long.desired_replicas > short.desired_replicas
    # a prompt's own prefill eats into the TTFT SLO: less is left for waiting
    assert long.terms["wait_budget_s"] < short.terms["wait_budget_s"] <= config.ttft_slo_s


def test_without_the_histogram_the_request_mean_stands_in_and_says_so() -> None:
    cap = ReplicaCapacity(10_000.0, 5_000.0, 256, 10_000_000, prefill_attention_tokens=20_000.0)
    config = PolicyConfig(capacity=cap)
    d = decide(_signals(20_000.0, None, mean=4_000.0), PolicyState(), config, 0.0)
    assert d.terms["prompt_length_estimated"] == 1.0 and d.terms["prompt_tokens_weighted_mean"] == 4_000.0
    assert d.terms["prefill_cost_factor"] == pytest.approx(1.1)
    none = decide(_signals(20_000.0, None, mean=None), PolicyState(), config, 0.0)
    assert none.terms["prefill_cost_factor"] == 1.0 and none.terms["prompt_length_estimated"] == 0.0


def test_the_simulated_prometheus_reports_the_workloads_prompt_lengths() -> None:
    """Replicas' histograms, scraped and rated like Prometheus, give the live source's estimate."""
    bounds = vllm_token_buckets(131072)
    rng = np.random.default_rng(7)
    lengths = rng.lognormal(math.log(2000), 1.0, size=600).astype(int) + 1
    obs = Observer(ObserveConfig(scrape_interval_s=15, rate_window_s=60))
    for t in range(0, 121):
        done = lengths[: t * 5]  # five requests finish per second
        counts = np.cumsum(np.bincount([bisect.bisect_left(bounds, int(n)) for n in done],
                                       minlength=len(bounds) + 1))
        obs.scrape(float(t), {0: {
            "prompt_tokens_total": float(done.sum()), "generation_tokens_total": 10.0 * t,
            "num_requests_waiting": 0, "num_requests_running": 1, "kv_cache_usage_perc": 0.1,
            "request_prompt_tokens_sum": float(done.sum()), "request_prompt_tokens_count": float(done.size),
            "request_prompt_tokens_bucket": tuple(zip((*bounds, math.inf), counts.tolist(), strict=True)),
        }})
    s = obs.signals(120.0, ready_replicas=1, starting_replicas=0)
    assert s is not None and s.prompt_tokens_weighted_mean is not None
    recent = lengths[60 * 5: 120 * 5].astype(float)
    assert s.prompt_tokens_weighted_mean == pytest.approx((recent**2).sum() / recent.sum(), rel=0.35)


# --- the TTFT tail ---------------------------------------------------------------------------------------------


def test_share_above_takes_the_tail_inside_the_bucket_as_exponential() -> None:
    ttfts = [0.05] * 80 + [1.5] * 10 + [3.0] * 10  # 20 % above 1 s, 10 % above 2.5 s
    rates = cumulative_rates(ttfts, TTFT_BUCKETS)  # type: ignore[arg-type]
    assert share_above(rates, 1.0) == pytest.approx(0.2)
    assert share_above(rates, 2.5) == pytest.approx(0.1)
    # 2 s is 2/3 into (1, 2.5]: the share above it is 0.2^(1/3) 0.1^(2/3), between the bounds' shares and
    # below the uniform assumption's 0.1 + 0.1 / 3
    assert share_above(rates, 2.0) == pytest.approx(0.2 ** (1 / 3) * 0.1 ** (2 / 3))
    assert 0.1 < share_above(rates, 2.0) < 0.1 + 0.1 / 3  # type: ignore[operator]
    assert share_above(rates, 3000.0) == 0.0
    # nothing beyond the bucket: nothing inside it is taken as beyond the threshold
    near = cumulative_rates([0.05] * 90 + [1.2] * 10, TTFT_BUCKETS)  # type: ignore[arg-type]
    assert share_above(near, 1.0) == pytest.approx(0.1) and share_above(near, 2.0) == 0.0


def test_share_above_reads_an_exponential_tail_closer_than_the_uniform_assumption() -> None:
    """A queue's wait past a prefill: first tokens at 0.9 s plus an exponential wait. The share truly above
    2 s against the geometric interpolation and the uniform one (Prometheus' assumption)."""
    rng = np.random.default_rng(4)
    for mean_wait in (0.2, 0.4, 0.8, 1.6):
        ttfts = 0.9 + rng.exponential(mean_wait, 20_000)
        rates = cumulative_rates(ttfts.tolist(), TTFT_BUCKETS)  # type: ignore[arg-type]
        truth = float(np.mean(ttfts > 2.0))
        above_1, above_25 = float(np.mean(ttfts > 1.0)), float(np.mean(ttfts > 2.5))
        uniform = above_25 + (above_1 - above_25) / 3
        got = share_above(rates, 2.0)
        assert got is not None
        assert abs(got - truth) < abs(uniform - truth)
        assert abs(got - truth) <= 0.15 * truth + 0.002


@pytest.mark.parametrize("rates", [{}, {1.0: 0.0, math.inf: 0.0}, {1.0: 3.0, math.inf: 1.0}, {1.0: 1.0}],
                         ids=["empty", "nothing-observed", "decreasing", "no-inf-bucket"])
def test_share_above_refuses_what_it_cannot_read(rates: dict[float, float]) -> None:
    assert share_above(rates, 2.0) is None


@given(st.lists(st.floats(0.0001, 5000.0), min_size=1, max_size=100), st.floats(0.0, 3000.0),
       st.floats(0.0, 3000.0))
def test_share_above_is_a_share_and_falls_with_the_threshold(ttfts: list[float], a: float, b: float) -> None:
    rates = cumulative_rates(ttfts, TTFT_BUCKETS)  # type: ignore[arg-type]
    low, high = sorted((a, b))
    s_low, s_high = share_above(rates, low), share_above(rates, high)
    assert s_low is not None and s_high is not None
    assert 0.0 <= s_high <= s_low <= 1.0


def _snapshot(**fields: float) -> Signals:
    base = {"at": 0.0, "prompt_tokens_per_s": 1.0, "generation_tokens_per_s": 1.0, "requests_waiting": 0.0,
            "requests_running": 5.0, "ready_replicas": 4, "kv_cache_usage": 0.3}
    return Signals(**(base | fields))  # type: ignore[arg-type]


def _efficiency(late: tuple[tuple[float, float], ...] | None, waiting: float) -> float:
    """The policy's efficiency after ten minutes of the same busy snapshot (4 replicas, 0.8 units each)."""
    from scaler.policy import PolicyConfig, PolicyState, decide

    cap = ReplicaCapacity(10_000.0, 5_000.0, 256, 10_000_000)
    state, d = PolicyState(), None
    for t in range(0, 600, 5):
        snap = _snapshot(at=float(t), prompt_tokens_per_s=32_000.0, requests_waiting=waiting, ttft_buckets=late,
                         mean_prompt_tokens=1000.0, waiting_tokens=waiting * 1000.0)
        d = decide(snap, state, PolicyConfig(capacity=cap), float(t))
        state = d.state
    assert d is not None
    return d.terms["efficiency"]


ON_TIME = ((0.5, 5.0), (1.0, 10.0), (2.5, 10.0), (math.inf, 10.0))
LATE = ((0.5, 0.0), (1.0, 5.0), (2.5, 8.0), (math.inf, 10.0))  # 30 % after 2 s


def test_a_late_tail_at_a_real_load_lowers_the_efficiency_multiplicatively() -> None:
    assert _efficiency(LATE, waiting=1.0) < 0.9
    assert _efficiency(ON_TIME, waiting=1.0) == 1.0  # calm below the estimate: nothing learned


def test_a_measured_tail_overrules_the_queue_wait_estimate() -> None:
    # a queue whose mean wait (12.5 s of work per 3.2 units served) an exponential tail would call late,
    # yet every first token came in time: the histogram decides
    assert _efficiency(ON_TIME, waiting=40.0) == 1.0
    assert _efficiency(None, waiting=40.0) < 0.9  # without the histogram the estimate decides


def test_simulated_replicas_count_first_tokens_in_vllms_ttft_buckets() -> None:
    n = 400
    rng = np.random.default_rng(3)
    w = Workload(arrival_s=np.sort(rng.uniform(0, 20, n)), input_tokens=np.full(n, 2000, dtype=np.int64),
                 output_tokens=np.full(n, 50, dtype=np.int64), name="burst")
    engine = Engine(w, get_profile("h100-llama3-8b"), EngineConfig(), initial_replicas=1)
    snaps = []
    engine.every(5.0, lambda now: snaps.append(engine.fleet.metrics(0, now)))
    result = engine.run()
    last = engine.fleet.metrics(0, result.log.finish_s[~np.isnan(result.log.finish_s)].max() + 1.0)
    buckets = dict(last.time_to_first_token_seconds_bucket)
    ttft = result.log.first_token_s - result.log.arrival_s
    assert buckets[math.inf] == np.sum(~np.isnan(ttft)) == n
    for le in (0.1, 1.0, 2.5, 10.0):
        assert buckets[le] == np.sum(ttft <= le)
    assert share_above(buckets, 2.0) == pytest.approx(np.mean(ttft > 2.0), abs=0.1)
    for a, b in itertools.pairwise(snaps):  # counters: cumulative over time
        assert all(x[1] <= y[1] for x, y in zip(a.time_to_first_token_seconds_bucket,
                                                b.time_to_first_token_seconds_bucket, strict=True))
