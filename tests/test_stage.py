"""The production path's first steps (one replica, a fixed stage) and the gateway's queue-limit advice."""

from __future__ import annotations

import numpy as np
import pytest

from scaler.profiles import get_profile
from simulator import queue_limit
from simulator.queue_limit import LimitRun, recommend
from simulator.stage import fixed_stage, one_replica
from simulator.workload import Workload
from tests.test_engine import poisson

H100 = get_profile("h100-llama3-8b")


def test_one_replica_knee_agrees_with_the_capacity_model() -> None:
    workload = poisson(2000, 10, seed=1)
    one = one_replica(workload, H100, 2.0)
    capacity = H100.capacity(2.0)
    assert (one.prefill_tokens_per_s, one.kv_cache_tokens) == (capacity.prefill_tokens_per_s, capacity.kv_cache_tokens)
    assert one.knee_requests_per_s is not None and one.knee_ttft_p95_s is not None and one.knee_ttft_p95_s <= 2.0
    # the model's requests/s within the sweep's resolution (docs/policy.md: 0.88-1.07 across length mixes)
    from simulator.oracle import request_work

    model = 1.0 / float(np.mean(request_work(workload.input_tokens, workload.output_tokens, capacity, H100)))
    assert 0.6 * model <= one.knee_requests_per_s <= 1.6 * model


def test_a_fixed_stage_reports_what_it_served_and_its_headroom() -> None:
    light = fixed_stage(poisson(3000, 20, seed=2), H100, 2.0)
    assert light.replicas == 2 and light.meets_slo and light.slo_attainment > 0.99
    assert light.headroom_at_peak == pytest.approx(1 - light.peak_demand_replicas / 2)
    assert 0 < light.headroom_at_peak < light.headroom_median + 1e-9 <= 1
    assert light.load_multiple == pytest.approx(2 / light.peak_demand_replicas)
    heavy = fixed_stage(poisson(4000, 90, seed=2), H100, 2.0)  # about twice what two replicas carry
    assert not heavy.meets_slo and heavy.headroom_at_peak < 0 and heavy.load_multiple < 1
    with pytest.raises(ValueError, match="replicas"):
        fixed_stage(poisson(10, 1), H100, 2.0, replicas=0)


def run(limit: float | None, share: float, starting: float | None, accepted: float = 0.99) -> LimitRun:
    return LimitRun(limit, share, accepted, starting, 500, 1.0, 1.0)


@pytest.mark.parametrize(("runs", "pick", "meets", "needed"), [
    ([run(1e3, 0.2, 0.999), run(1e4, 0.05, 0.995), run(1e5, 0.0, 0.9), run(None, 0.0, 0.8)], 1e4, True, True),
    ([run(1e3, 0.2, 0.9), run(1e4, 0.05, 0.8), run(None, 0.0, 0.7)], 1e3, False, True),
    ([run(1e3, 0.2, 1.0), run(1e4, 0.0, 1.0), run(None, 0.0, 0.999)], 1e4, True, False),
], ids=["largest-on-time", "none-on-time", "not-needed"])
def test_recommend_the_largest_limit_that_keeps_accepted_requests_on_time(runs: list[LimitRun], pick: float,
                                                                          meets: bool, needed: bool) -> None:
    advice = recommend(runs, poisson(100, 5), H100, 2.0, 0.99)
    assert (advice.limit_tokens_per_replica, advice.meets, advice.needed) == (pick, meets, needed)
    assert advice.limit_requests_per_replica == pytest.approx(pick / np.mean(poisson(100, 5).input_tokens))
    assert any(line.startswith("Recommended gateway limit") for line in advice.lines())


def test_candidates_span_the_prefill_a_replica_does_within_the_wait_budget() -> None:
    workload = Workload(np.arange(10.0), np.full(10, 1000), np.full(10, 100))
    capacity = H100.capacity(2.0)
    factor = capacity.prefill_cost_factor(1000.0)
    own = 1000 * factor / capacity.prefill_tokens_per_s
    assert queue_limit.natural_limit(workload, H100, 2.0) == pytest.approx(
        (2.0 - own) * capacity.prefill_tokens_per_s / factor)
    values = queue_limit.candidates(workload, H100, 2.0)
    assert values == sorted(values) and len(values) == len(queue_limit.FACTORS)


def test_judge_reads_rejections_and_the_starting_window_from_a_run() -> None:
    from simulator.autoscale import run_autoscaled

    workload = poisson(4000, 80, seed=5)
    strict = run_autoscaled(workload, H100, "leadscale", "fixed:60", 2.0, 0, initial_replicas=1, max_replicas=10,
                            backend_options={"waiting_tokens_limit": 10_000})
    loose = run_autoscaled(workload, H100, "leadscale", "fixed:60", 2.0, 0, initial_replicas=1, max_replicas=10)
    a, b = queue_limit.judge(10_000, strict, 2.0), queue_limit.judge(None, loose, 2.0)
    assert a.rejected_share > 0 == b.rejected_share
    assert a.requests_while_starting > 0 and b.requests_while_starting > a.requests_while_starting
    assert a.attainment_while_starting > b.attainment_while_starting  # 429s keep the accepted ones on time
