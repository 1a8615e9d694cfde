"""The oracle's schedule: per-bucket need, level intervals with bridged gaps, early provisioning."""

from __future__ import annotations

import numpy as np
import pytest

from scaler.capacity import ReplicaCapacity
from simulator.oracle import (
    bucket_need,
    level_intervals,
    plan_pods,
    replica_seconds,
    replicas_per_bucket,
    request_work,
    search_alpha,
)

CAP = ReplicaCapacity(prefill_tokens_per_s=1000.0, decode_tokens_per_s=100.0, max_num_seqs=64, kv_cache_tokens=10**5)


def test_need_counts_prefill_and_decode_work_per_bucket() -> None:
    arrival = np.array([1.0, 2.0, 40.0])
    work = request_work(np.array([15000, 15000, 1]), np.array([1500, 1500, 1]), CAP)
    assert work[0] == pytest.approx(15.0 + 15.0)  # 15000 / 1000 prefill + 1500 / 100 decode
    need = bucket_need(arrival, work, 90.0)
    # bucket 0: 60 replica-seconds / 30 s = 2; bucket 1 carries bucket 0 over (requests keep running)
    assert need[0] == pytest.approx(2.0)
    assert need[1] == pytest.approx(2.0)
    assert need[2] == pytest.approx((1 / 1000 + 1 / 100) / 30)


def test_work_uses_the_step_time_model_when_the_profile_has_one() -> None:
    class StepTime:
        per_token_s = 1e-4
        prefill_attention_s = 1e-8

    class Profile:
        step_time = StepTime()

    work = request_work(np.array([1000, 10000]), np.array([0, 0]), CAP, Profile())
    assert work[0] == pytest.approx(0.1 + 0.005)
    assert work[1] == pytest.approx(1.0 + 0.5)   # ten times the tokens, more than ten times the work


def test_levels_bridge_short_gaps_only() -> None:
    replicas = np.array([1, 2, 1, 2, 1, 1, 1, 1, 2, 2])
    intervals = level_intervals(replicas, 30.0, bridge_s=60.0)
    assert (0.0, 300.0) in intervals                   # level 1: always on
    assert (30.0, 120.0) in intervals                  # level 2: the 30 s gap at 60-90 bridged
    assert (240.0, 300.0) in intervals                 # the 120 s gap is not
    assert len(intervals) == 3


def test_pods_are_ready_exactly_when_needed() -> None:
    replicas = np.array([1, 1, 3, 3, 1])
    draws = iter([50.0, 70.0])
    plans = plan_pods(replicas, 30.0, lambda: next(draws), bridge_s=100.0)
    warm = sorted((p for p in plans if p.warm), key=lambda p: p.delete_at)
    cold = [p for p in plans if not p.warm]
    # the 70 s pod would have to start before t = 0: it joins the warm fleet instead
    assert [(p.create_at, p.ready_at, p.delete_at) for p in warm] == [(0.0, 0.0, 120.0), (0.0, 0.0, 150.0)]
    assert [(p.create_at, p.ready_at, p.delete_at) for p in cold] == [(10.0, 60.0, 120.0)]
    assert replica_seconds(plans, 150.0) == pytest.approx(150 + 120 + 110)


def test_alpha_bisection_finds_the_threshold() -> None:
    assert search_alpha(lambda a: a >= 1.3, steps=8) == pytest.approx(1.3, abs=0.01)
    assert search_alpha(lambda a: a >= 0.8, steps=8) == pytest.approx(0.8, abs=0.01)
    tried: list[float] = []
    assert search_alpha(lambda a: tried.append(a) or False) == 2.5
    assert tried[-1] == 2.5 and len(tried) == 6  # start, 4 halvings, then high itself
    tried.clear()
    assert search_alpha(lambda a: tried.append(a) or True) == pytest.approx(0.640625)  # 0.6 + 0.65 / 16
    assert len(tried) == 5
    with pytest.raises(ValueError, match="low=2"):
        search_alpha(lambda a: True, low=2.0)
    with pytest.raises(ValueError, match="alpha=0"):
        replicas_per_bucket(np.array([1.0]), 0)


def test_the_oracle_starts_no_more_warm_pods_than_every_policy() -> None:
    replicas = np.array([3, 3, 3, 3, 1])
    draws = iter([50.0, 70.0, 40.0])
    plans = plan_pods(replicas, 30.0, lambda: next(draws), bridge_s=100.0, warm_limit=1)
    warm = [p for p in plans if p.warm]
    late = sorted((p.create_at, p.ready_at, p.delete_at) for p in plans if not p.warm)
    # one pod warm (the shared fleet); the two others wanted at t = 0 are created then, ready a cold start later
    assert [(p.create_at, p.delete_at) for p in warm] == [(0.0, 150.0)]
    assert late == [(0.0, 50.0, 120.0), (0.0, 70.0, 120.0)]


# --- the feasible schedule's pods (simulator.oracle_plan) ---------------------------------------------

EDGES = np.arange(6) * 60.0  # five windows of 60 s


def test_level_runs_follow_the_path_and_the_last_run_never_ends() -> None:
    from simulator.oracle_plan import level_runs

    runs = level_runs(np.array([1, 2, 0, 2, 2]), EDGES)
    assert runs[0] == [[0.0, 120.0], [180.0, float("inf")]]
    assert runs[1] == [[60.0, 120.0], [180.0, float("inf")]]


def test_a_gap_is_bridged_only_when_shorter_than_the_restarting_pods_own_draw() -> None:
    from simulator.oracle_plan import place_pods

    path = np.array([1, 0, 1, 1, 1])  # level 1 off for one 60 s window
    long_draw = place_pods(path, EDGES, np.array([100.0, 30.0]), warm_limit=1)
    assert [(p.create_at, p.delete_at, p.warm) for p in long_draw] == [(0.0, float("inf"), True)]  # 60 < 100
    short_draw = place_pods(path, EDGES, np.array([30.0, 100.0]), warm_limit=1)
    assert sorted((p.create_at, p.ready_at, p.delete_at) for p in short_draw) == [
        (0.0, 0.0, 60.0), (90.0, 120.0, float("inf"))]  # 60 > 30: stop, restart 30 s early


def test_pods_take_draws_in_the_order_they_are_created() -> None:
    from simulator.oracle_plan import place_pods

    # two pods wanted at 120 s and 180 s; draws 20 s then 150 s
    path = np.array([0, 0, 1, 2, 2])
    plans = sorted(place_pods(path, EDGES, np.array([20.0, 150.0]), warm_limit=0), key=lambda p: p.create_at)
    # by start order the 120 s pod would take 20 s and be created at 100 s, the 180 s one at 30 s: not
    # creation order. Fixed point: the 180 s pod is created first (draw 20 -> 160 s), the 120 s pod takes 150
    # s and must start at 0, ready at 150 s (late: no warm pod left)
    assert [(p.create_at, p.ready_at, p.cold_start_s) for p in plans] == [(0.0, 150.0, 150.0), (160.0, 180.0, 20.0)]


def test_pods_wanted_before_their_draw_allows_come_from_the_warm_fleet() -> None:
    from simulator.oracle_plan import place_pods

    path = np.array([1, 2, 2, 2, 2])
    plans = place_pods(path, EDGES, np.array([100.0]), warm_limit=2)
    assert sorted((p.create_at, p.ready_at, p.warm) for p in plans) == [(0.0, 0.0, True), (0.0, 0.0, True)]
    plans = place_pods(path, EDGES, np.array([100.0]), warm_limit=1)
    assert sorted((p.create_at, p.ready_at, p.warm) for p in plans) == [(0.0, 0.0, True), (0.0, 100.0, False)]


def test_repair_never_asks_for_more_than_one_and_a_half_budgets(monkeypatch) -> None:
    """A run far under budget must not scale the next target without limit (a near-empty fleet)."""
    from types import SimpleNamespace

    from simulator.oracle_plan import Repair, repair

    table = np.array([[1000, 900, 5, 0]] * 5)
    spec = Repair(table.copy(), np.full(5, 60.0), EDGES, np.zeros(0, dtype=np.int64), 2, 1, np.full(5, 3),
                  np.array([50.0] * 20), 50.0)
    targets: list[int] = []

    def simulate(plans):
        return SimpleNamespace(summary={"gpu_hours": len(plans)}, ttft_s=np.zeros(0))

    def judge(result):
        return True, 1, 100

    import simulator.oracle_plan as op

    real = op.budget_path

    def spy(misses, lengths, budget, *args, **kwargs):
        targets.append(budget)
        return real(misses, lengths, budget, *args, **kwargs)

    monkeypatch.setattr(op, "budget_path", spy)
    repair(spec, 100, simulate, judge, 2.0, runs=3)
    assert len(targets) >= 2 and max(targets) <= 150
