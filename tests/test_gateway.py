"""The gateway in front of the replicas: 429s at a waiting-token limit, and pools behind one route."""

from __future__ import annotations

import numpy as np
import pytest

from scaler.profiles import get_profile
from simulator.engine import Engine, EngineConfig, simulate
from simulator.results import FINISHED, REJECTED
from tests.test_engine import poisson

H100 = get_profile("h100-llama3-8b")


def test_waiting_token_counter_matches_the_queues_it_summarises() -> None:
    """The O(1) counter the limit reads equals the queue it stands for, preemptions included."""
    engine = Engine(poisson(3000, 60, seed=7, inp=3000, out=600), H100, EngineConfig(), initial_replicas=1)
    seen: list[int] = []

    def check(now: float) -> None:
        for rep in engine.replicas.values():
            log = engine.log
            exact = sum(int(log.input_tokens[r] + log.generated[r]) for r in rep.waiting)
            assert rep.waiting_tokens == exact
            seen.append(exact)

    engine.every(3.0, check)
    result = engine.run()
    assert max(seen) > 100_000 and result.preemptions > 0  # overloaded: long queues and preemptions exercised


def test_overload_limit_answers_429_and_keeps_accepted_requests_on_time() -> None:
    workload = poisson(3000, 80, seed=3)  # about twice what two replicas serve
    unlimited = simulate(workload, H100, replicas=2).summary()
    limited = simulate(workload, H100, replicas=2, waiting_tokens_limit=20_000).summary()
    assert unlimited["overload_rejected"] == 0 and unlimited["ttft_p95"] > 10
    assert limited["overload_rejected"] > 100
    assert limited["rejected"] == limited["overload_rejected"]  # nothing else was rejected
    assert limited["rejected_share"] == pytest.approx(limited["rejected"] / 3000)
    # rejected requests are counted apart from misses: the accepted ones mostly met the SLO
    assert limited["slo_attainment_accepted"] > 0.9 > unlimited["slo_attainment_accepted"]
    accepted = 3000 - limited["rejected"]
    assert limited["slo_missed"] == round(accepted * (1 - limited["slo_attainment_accepted"]))
    assert limited["ttft_p95"] < 3.0


def test_a_lower_limit_rejects_more() -> None:
    workload = poisson(2000, 80, seed=4)
    shares = [simulate(workload, H100, replicas=2, waiting_tokens_limit=limit).summary()["rejected_share"]
              for limit in (5_000, 20_000, 80_000)]
    assert shares[0] > shares[1] > shares[2] >= 0


@pytest.mark.parametrize("limit", [0, -1.0, float("nan"), float("inf"), True])
def test_bad_limits_are_named(limit: object) -> None:
    with pytest.raises(ValueError, match="waiting_tokens_limit"):
        EngineConfig(waiting_tokens_limit=limit)  # type: ignore[arg-type]


def test_two_pools_split_by_the_route_and_hold_their_own_queues() -> None:
    workload = poisson(600, 20, seed=5)
    engine = Engine(workload, H100, EngineConfig(), initial_replicas=1)
    canary = engine.add_pool("canary")
    engine.route_by(lambda rid, now: canary if rid % 4 == 0 else engine.fleet)
    added: list[int] = []
    engine.at(10.0, lambda now: added.append(canary.add_replica(now)))
    result = engine.run()
    log = result.log
    to_canary = np.arange(len(log)) % 4 == 0
    assert set(log.replica[to_canary].tolist()) == set(added)  # the canary's share only on its replica
    assert not set(log.replica[~to_canary].tolist()) & set(added)
    early = to_canary & (log.arrival_s < 9.0)
    assert early.any() and (log.first_scheduled_s[early] >= 10.0).all()  # held at its gateway until ready
    assert (log.status == FINISHED).all() and not (log.status == REJECTED).any()
    with pytest.raises(ValueError, match="canary"):
        engine.add_pool("canary")
