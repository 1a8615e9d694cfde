"""A simulated rollout: stable + canary behind one weighted route, each with its own leadscale trigger."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from scaler.profiles import get_profile
from simulator.rollout import RolloutConfig, WeightStep, parse_schedule, run_rollout, standard_schedules
from simulator.workload import Workload

H100 = get_profile("h100-llama3-8b")
SLO = 2.0
COLD = "lognormal:p50=60,p90=90"


@functools.cache
def steady(duration_s: float = 1000.0, rate: float = 60.0, seed: int = 3) -> Workload:
    """About 2.5 replicas of steady chat load."""
    rng = np.random.default_rng(seed)
    n = int(duration_s * rate)
    return Workload(np.sort(rng.uniform(0.0, duration_s, n)), rng.integers(500, 1500, n), rng.integers(100, 300, n),
                    name="steady")


@functools.cache
def rollout(schedule: str, gate: bool = True, route_aware: bool = True, max_wait_s: float = 150.0) -> object:
    config = RolloutConfig(parse_schedule(schedule), gate=gate, route_aware=route_aware, max_wait_s=max_wait_s)
    return run_rollout(steady(), H100, config, COLD, SLO, seed=1, max_replicas=20)


FORWARD = "0:0,200:10,400:50,600:100"
ROLLBACK = "0:0,200:10,400:50,600:0"


def test_schedules_parse_and_bad_ones_are_named() -> None:
    assert parse_schedule("0:0, 600:10,1200:50") == (WeightStep(0, 0), WeightStep(600, 0.1), WeightStep(1200, 0.5))
    for bad in ("600", "600:150", "a:10", "600:10,300:50", "", "-5:10"):
        with pytest.raises(ValueError, match="rollout schedule"):
            parse_schedule(bad)
    both = standard_schedules(1000.0)
    assert [s.canary for s in both["rollout 0-10-50-100 %"]] == [0, 0.1, 0.5, 1.0]
    assert [s.canary for s in both["rollout 0-10-50 %, rollback"]] == [0, 0.1, 0.5, 0.0]


@pytest.mark.parametrize("schedule", [FORWARD, ROLLBACK], ids=["forward", "rollback"])
def test_a_gated_rollout_breaches_no_slo_and_reports_gpu_hours_per_phase(schedule: str) -> None:
    result = rollout(schedule)
    assert result.summary["phases_meeting_slo"] == result.summary["phases"] == 4, result.phases
    assert sum(p["gpu_hours"] for p in result.phases) == pytest.approx(result.summary["gpu_hours"])
    assert result.summary["gpu_hours"] == pytest.approx(result.summary["gpu_hours_stable"]
                                                        + result.summary["gpu_hours_canary"])
    moves = result.route_weight[1:]
    assert [w for _, w in moves] == [s.canary for s in parse_schedule(schedule)[1:]]
    for (moved, _), step in zip(moves, parse_schedule(schedule)[1:], strict=True):
        assert step.at_s + 30 <= moved < step.at_s + 200  # after the settle time, once the gaining side was ready
    share = result.version[(result.arrival_s > moves[1][0]) & (result.arrival_s < 600)].mean()
    assert share == pytest.approx(0.5, abs=0.03)  # the route's weight, request by request
    last = result.phases[-1]
    gone = "gpu_hours_stable" if schedule == FORWARD else "gpu_hours_canary"
    assert last[gone] < last["gpu_hours"] / 2  # the version that lost its traffic went away


def test_the_canary_starts_for_its_share_before_traffic_reaches_it() -> None:
    result = rollout(FORWARD)
    canary = result.timeline["canary"]
    moved = result.route_weight[1][0]
    before = (canary["t"] >= 200) & (canary["t"] < moved)
    assert (canary["ready"][before] + canary["starting"][before]).max() >= 1  # scaled from its share, not traffic
    assert canary["ready"][np.searchsorted(canary["t"], moved)] >= 1


def test_without_the_route_the_canary_never_gets_ready_and_its_users_wait() -> None:
    plain = rollout(FORWARD, route_aware=False)
    aware = rollout(FORWARD)
    # nothing sizes the canary before it has traffic: the controller waits out max_wait, then moves
    assert plain.route_weight[1][0] >= 200 + 150
    assert plain.summary["phases_meeting_slo"] < aware.summary["phases_meeting_slo"]
    assert plain.summary["slo_attainment"] < aware.summary["slo_attainment"]


def test_traffic_that_moved_to_a_canary_not_ready_never_shrinks_the_stable() -> None:
    result = rollout(FORWARD, gate=False)  # the route moves at once: 10 % of requests to a canary with no pod
    stable, canary = result.timeline["stable"], result.timeline["canary"]
    first_ready = canary["t"][np.argmax(canary["ready"] > 0)]
    assert first_ready > 200
    dark = (stable["t"] >= 200) & (stable["t"] < first_ready)
    k = np.searchsorted(stable["t"], 200)
    at_shift = stable["ready"][k] + stable["starting"][k]
    assert (stable["ready"][dark] + stable["starting"][dark]).min() >= at_shift
    decisions = [d for d in result.decisions["stable"] if 200 < d[0] < first_ready]
    assert decisions and all(terms["route_held"] == 1 for _, _, terms in decisions)
